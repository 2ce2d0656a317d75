// The vocabulary-blocked LM head: see amx_vocab_blocked_head.hpp. Everything runs transposed, with
// the vocabulary down the rows: per pass of R tokens (padded to Rp, a multiple of 32) the thread's
// scratch holds the tokens in two B layouts (their bf16 pairs along K as words, per 32 tokens; and
// pairs of tokens side by side, per 32 columns), the input gradient transposed [K][Rp] (fp32), the
// rows' softmax statistics, per vocabulary block the logits of a group of kGroupRows tokens
// [kVocabBlock][kGroupRows] (fp32), the block's gradient transposed [kVocabBlock][Rp] (bf16) and a
// group's gradient in pairs of vocabulary rows, and the first sweep's exponentials of every logit
// of the pass (fp32, with the running max each was taken against), which the second sweep turns
// into the gradient. All products are the 2 x 2-tile micro-GEMM of amx_tiles.hpp:
//   logits^T    [block, group] = weight rows · token words        (K swept in order)
//   d_in^T      [K, group]    += weight^T block · d pairs          (the block's rows in order)
//   weight grad [block, K]     = d^T · token pairs                 (the pass's tokens in order)
// so the weight gradient's blocks land in the [V, K] rows as they are, and the softmax statistics
// run down the columns of 16 tokens (a vector per vocabulary row, no reductions across lanes). The
// input gradient is transposed back into rows once per pass.
#include "lattice/kernels/cpu/amx_vocab_blocked_head.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/amx_packed_gemm.hpp"
#include "lattice/kernels/cpu/amx_tiles.hpp"
#include "lattice/kernels/cpu/bf16_vector.hpp"
#include "lattice/kernels/cpu/fast_exp.hpp"
#include "lattice/kernels/cpu/register_transpose.hpp"

namespace lattice::kernels {

namespace {

// Tokens whose logits for one vocabulary block are formed and consumed together (128 KiB of fp32).
constexpr int64_t kGroupRows = 128;
constexpr int64_t kMaxPassRows = 512;
// Fewer rows per pass re-read the head weight more often than the row-chunk head writes logits.
constexpr int64_t kMinPassRows = 256;
constexpr int64_t kPassBytes = int64_t{1} << 20;
constexpr size_t kAlign = 64;

size_t aligned_size(size_t bytes) {
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

int64_t round32(int64_t n) {
  return (n + 31) / 32 * 32;
}

// The scratch of a pass of up to `rows` rows (Rp = rows rounded up to 32), carved in order.
struct PassScratch {
  uint32_t* token_words;  // [Rp/32][K/2][32]: per 32 tokens, their bf16 pairs (k, k+1) as words
  uint16_t* token_pairs;  // [K/32][Rp/2][32][2]: per 32 columns, pairs of tokens side by side
  float* d_in_t;          // [K][Rp]: the input gradient, transposed
  float* row_max;         // [Rp]
  double* row_sum;        // [Rp]
  float* target_logit;    // [Rp]
  float* scale;           // [Rp]: each row's gradient scale (0 for ignored and padding rows)
  float* logits;          // [kVocabBlock][kGroupRows]: a group's logits, transposed
  float* exps;            // [blocks][Rp/16][kVocabBlock][16]: e^(logit - used_max)
  float* used_max;        // [blocks][Rp]: the running max each block's exps are taken against
  uint16_t* d_t;          // [kVocabBlock][Rp]: the block's logits gradient, transposed
  uint16_t* d_pairs;      // [kVocabBlock/2][kGroupRows][2]: a group's, in pairs of vocabulary rows
  float* staging;         // [32][32]

  static size_t bytes(int64_t Rp, int64_t K, int64_t V, PassScratch* carve, void* base) {
    const int64_t blocks = (V + kVocabBlock - 1) / kVocabBlock;
    size_t offset = 0;
    auto* p = static_cast<char*>(base);
    const auto take = [&](auto*& field, size_t size) {
      if (carve != nullptr)
        field = reinterpret_cast<std::remove_reference_t<decltype(field)>>(p + offset);
      offset += aligned_size(size);
    };
    PassScratch unused{};
    PassScratch& s = carve != nullptr ? *carve : unused;
    take(s.token_words, static_cast<size_t>(Rp * K) * 2);
    take(s.token_pairs, static_cast<size_t>(Rp * K) * 2);
    take(s.d_in_t, static_cast<size_t>(Rp * K) * 4);
    take(s.row_max, static_cast<size_t>(Rp) * 4);
    take(s.row_sum, static_cast<size_t>(Rp) * 8);
    take(s.target_logit, static_cast<size_t>(Rp) * 4);
    take(s.scale, static_cast<size_t>(Rp) * 4);
    take(s.logits, static_cast<size_t>(kVocabBlock * kGroupRows) * 4);
    take(s.exps, static_cast<size_t>(blocks * kVocabBlock * Rp) * 4);
    take(s.used_max, static_cast<size_t>(blocks * Rp) * 4);
    take(s.d_t, static_cast<size_t>(kVocabBlock * Rp) * 2);
    take(s.d_pairs, static_cast<size_t>(kVocabBlock * kGroupRows) * 2);
    take(s.staging, 32 * 32 * 4);
    return offset;
  }
};

#if defined(LATTICE_HAS_AMX)

constexpr __mmask16 kAllLanes = 0xffff;

// e^x for 16 lanes with fast_exp's reduction and polynomial (Cody-Waite, the same coefficients), n
// rounded by vroundscaleps and 2^n applied by vscalefps: within about an ulp of fast_exp, not bit
// for bit; lanes below -87 give 0. (The zero-masked forms with every lane selected: GCC 12 warns,
// falsely, on the unmasked forms' undefined pass-through operand.)
inline f32x16 exp16(f32x16 x) {
  const __mmask16 underflows = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
  x = _mm512_maskz_min_ps(kAllLanes, _mm512_maskz_max_ps(kAllLanes, x, _mm512_set1_ps(-87.0f)),
                          _mm512_set1_ps(88.0f));
  const __m512 n =
      _mm512_maskz_roundscale_ps(kAllLanes, _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  return _mm512_maskz_scalef_ps(static_cast<__mmask16>(~underflows), fast_exp_of_reduced(r), n);
}

inline f32x16 load16(const float* p) {
  return _mm512_loadu_ps(p);
}

// The kept exponentials of block `block_index` for the 16 tokens from `token` (a multiple of 16):
// [kVocabBlock][16], a vocabulary row's 16 lanes per cache line, written and read in order.
inline float* exp_chunk(const PassScratch& s, int64_t block_index, int64_t token, int64_t Rp) {
  return s.exps + (block_index * (Rp / 16) + token / 16) * kVocabBlock * 16;
}

inline f32x16 kept_exp(const float* p) {
  return _mm512_load_ps(p);
}

// logits_t[v, t] (row stride kGroupRows) = weight row v · token t, for the block's `columns`
// vocabulary rows (weight_rows: [columns][K]) and the group's `group` tokens (words: their
// token_words panels): A = the weight's rows, B = the tokens' pairs, so the logits come out
// transposed.
void block_logits_t(float* logits_t, const uint16_t* weight_rows, int64_t columns,
                    const uint32_t* words, int64_t group, int64_t K) {
  for (int64_t n0 = 0; n0 < group; n0 += 32) {
    const uint32_t* panel = words + n0 * K / 2;  // [K/2][32] words
    for (int64_t m0 = 0; m0 < columns; m0 += 32) {
      amx_block_zero();
      const uint16_t* a_rows = weight_rows + m0 * K;
      for (int64_t k0 = 0; k0 < K; k0 += 32)
        amx_block_multiply(a_rows + k0, K * 2, panel + k0 / 2 * 32, panel + k0 / 2 * 32 + 16, 128);
      amx_block_store(logits_t + m0 * kGroupRows + n0, kGroupRows * 4);
    }
  }
}

// d_in_t[K, group tokens] (row stride Rp) (+)= the block's weight transposed [K][columns] ·
// d_pairs (the group's gradient in pairs of vocabulary rows).
void block_input_gradient_t(float* d_in_t, int64_t Rp, const uint16_t* weight_t, int64_t columns,
                            const uint16_t* d_pairs, int64_t group, int64_t K, bool first) {
  for (int64_t m0 = 0; m0 < K; m0 += 32) {
    const uint16_t* a_rows = weight_t + m0 * columns;
    for (int64_t n0 = 0; n0 < group; n0 += 32) {
      float* c = d_in_t + m0 * Rp + n0;
      if (first)
        amx_block_zero();
      else
        amx_block_load(c, Rp * 4);
      for (int64_t v0 = 0; v0 < columns; v0 += 32) {
        const uint16_t* b = d_pairs + (v0 / 2 * kGroupRows + n0) * 2;
        amx_block_multiply(a_rows + v0, columns * 2, b, b + 32, kGroupRows * 4);
      }
      amx_block_store(c, Rp * 4);
    }
  }
}

// weight_grad[v0 + v, :] (= or +=) sum over the Rp tokens of d_t[v, t] · in[t, :] for v < valid:
// A = the gradient's transposed rows, B = the tokens in pairs; each 32 x 32 block lands in the
// [V, K] rows as it is (staged where the block passes `valid`).
void block_weight_gradient_t(float* weight_grad, bool overwrite, const uint16_t* d_t, int64_t Rp,
                             const uint16_t* token_pairs, int64_t columns, int64_t valid, int64_t K,
                             float* staging) {
  for (int64_t n0 = 0; n0 < columns; n0 += 32) {
    const int64_t rows = std::min<int64_t>(32, valid - n0);
    for (int64_t m0 = 0; m0 < K; m0 += 32) {
      float* out = weight_grad + n0 * K + m0;
      float* c = rows == 32 ? out : staging;
      const int64_t c_stride = rows == 32 ? K * 4 : 32 * 4;
      if (rows < 32) {
        for (int64_t v = 0; v < 32; ++v)
          for (int64_t j = 0; j < 32; ++j)
            staging[v * 32 + j] = v < rows && !overwrite ? out[v * K + j] : 0.0f;
      }
      if (overwrite && rows == 32)
        amx_block_zero();
      else
        amx_block_load(c, c_stride);
      const uint16_t* a_rows = d_t + n0 * Rp;
      const uint16_t* panel = token_pairs + m0 * Rp;  // [Rp/2][32][2]
      for (int64_t t0 = 0; t0 < Rp; t0 += 32) {
        const uint16_t* b = panel + t0 / 2 * 64;
        amx_block_multiply(a_rows + t0, Rp * 2, b, b + 32, 128);
      }
      amx_block_store(c, c_stride);
      if (rows < 32) {
        for (int64_t v = 0; v < rows; ++v)
          std::memcpy(out + v * K, staging + v * 32, 32 * sizeof(float));
      }
    }
  }
}

#endif

}  // namespace

int64_t vocab_blocked_head_rows_per_pass(int64_t K) {
  if (K <= 0 || K % 32 != 0) return 0;
  const int64_t rows = std::min<int64_t>(kMaxPassRows, kPassBytes / (8 * K) / 32 * 32);
  return rows >= kMinPassRows ? rows : 0;
}

int64_t vocab_blocked_head_packed_elements(int64_t V, int64_t K) {
  return amx_padded(V) * amx_padded(K);
}

const uint16_t* pack_vocab_blocked_head(uint16_t* forward, uint16_t* backward,
                                        const lattice::bf16* weight16, int64_t V, int64_t K) {
  check(V > 0 && K > 0 && K % 32 == 0,
        "pack_vocab_blocked_head: needs V > 0 and K a positive multiple of 32, got V=" +
            std::to_string(V) + " K=" + std::to_string(K));
  const auto* bits = reinterpret_cast<const uint16_t*>(weight16);
  const int64_t Vp = amx_padded(V);
  // The rows the logits read: the weight's own where V is a multiple of 32, else a copy with zero
  // rows past V. backward: per block of kVocabBlock rows (the last one's rounded up to 32), the
  // block transposed, [K][columns].
  const uint16_t* rows = V == Vp ? bits : forward;
  check(rows != nullptr, "pack_vocab_blocked_head: V=" + std::to_string(V) +
                             " is not a multiple of 32: pass a forward buffer of "
                             "vocab_blocked_head_packed_elements(V, K) elements");
#pragma omp parallel for schedule(static)
  for (int64_t v0 = 0; v0 < Vp; v0 += 32) {
    if (rows == forward) {
      for (int64_t v = v0; v < v0 + 32; ++v) {
        if (v < V)
          std::memcpy(forward + v * K, bits + v * K, static_cast<size_t>(K) * 2);
        else
          std::fill(forward + v * K, forward + (v + 1) * K, uint16_t{0});
      }
    }
    const int64_t block = v0 / kVocabBlock * kVocabBlock;
    const int64_t columns = std::min(kVocabBlock, Vp - block);
    transpose_bf16(backward + block * K + (v0 - block), columns, rows + v0 * K, K, 32, K);
  }
  return rows;
}

size_t vocab_blocked_head_scratch_bytes(int64_t rows, int64_t K, int64_t V) {
  return PassScratch::bytes(round32(std::max<int64_t>(rows, 1)), K, std::max<int64_t>(V, 1),
                            nullptr, nullptr);
}

void vocab_blocked_head_pass(double* row_losses, float* d_in, float* weight_grad, bool overwrite,
                             const lattice::bf16* in16, const int32_t* targets, int64_t rows,
                             int64_t K, int64_t V, float grad_scale, const uint16_t* forward,
                             const uint16_t* backward, void* scratch) {
  check(K > 0 && K % 32 == 0 && V > 0 && rows >= 0 &&
            rows <= std::max<int64_t>(vocab_blocked_head_rows_per_pass(K), 0),
        "vocab_blocked_head_pass: needs K a positive multiple of 32, V > 0 and at most "
        "vocab_blocked_head_rows_per_pass(K) rows, got K=" +
            std::to_string(K) + " V=" + std::to_string(V) + " rows=" + std::to_string(rows));
#if defined(LATTICE_HAS_AMX)
  if (rows == 0) return;
  check(amx_tile_state_granted(),
        "vocab_blocked_head_pass: the process has no AMX tile state (check "
        "amx_packed_gemm_enabled first)");
  const int64_t Rp = round32(rows);
  PassScratch s{};
  PassScratch::bytes(Rp, K, V, &s, scratch);
  const auto* in_bits = reinterpret_cast<const uint16_t*>(in16);
  const auto live = [&](int64_t r) { return r < rows && targets[r] >= 0; };
  const auto token_row = [&](int64_t r, int64_t k0) {  // 32 bf16 of row r from k0, zero past rows
    u16x32 v{};
    if (r < rows) std::memcpy(&v, in_bits + r * K + k0, sizeof v);
    return v;
  };
  // The tokens in both B layouts: words (k pairs) per 32 tokens, and token pairs per 32 columns.
  for (int64_t t0 = 0; t0 < Rp; t0 += 16) {
    for (int64_t w0 = 0; w0 < K / 2; w0 += 16) {
      u32x16 r[16];
      for (int i = 0; i < 16; ++i) r[i] = std::bit_cast<u32x16>(token_row(t0 + i, 2 * w0));
      transpose_16x16(r);
      uint32_t* panel = s.token_words + t0 / 32 * 32 * (K / 2);
      for (int i = 0; i < 16; ++i) std::memcpy(panel + (w0 + i) * 32 + t0 % 32, &r[i], sizeof r[i]);
    }
  }
  for (int64_t t = 0; t < Rp; t += 2) {
    for (int64_t k0 = 0; k0 < K; k0 += 32) {
      const u16x32 even = token_row(t, k0), odd = token_row(t + 1, k0);
      uint16_t* out = s.token_pairs + k0 * Rp + t / 2 * 64;
      const u16x32 low = interleave_pairs(
          __builtin_shufflevector(even, even, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
          __builtin_shufflevector(odd, odd, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
      const u16x32 high =
          interleave_pairs(__builtin_shufflevector(even, even, 16, 17, 18, 19, 20, 21, 22, 23, 24,
                                                   25, 26, 27, 28, 29, 30, 31),
                           __builtin_shufflevector(odd, odd, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25,
                                                   26, 27, 28, 29, 30, 31));
      std::memcpy(out, &low, sizeof low);
      std::memcpy(out + 32, &high, sizeof high);
    }
  }
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::fill(s.row_max, s.row_max + Rp, neg_inf);
  std::fill(s.row_sum, s.row_sum + Rp, 0.0);
  std::fill(s.target_logit, s.target_logit + Rp, 0.0f);

  const AmxTileScope tiles;
  // Sweep 1: each row's max and sum of e^(logit - max), block by block, 16 tokens at a time down
  // the transposed logits (fp32 sums over the block's vocabulary rows in order). The exponentials
  // are kept, with the max they were taken against, in place of computing the logits again in
  // sweep 2: streamed to memory past the caches (non-temporal stores, no reads for ownership) and
  // read back once.
  for (int64_t v0 = 0; v0 < V; v0 += kVocabBlock) {
    const int64_t block_index = v0 / kVocabBlock;
    const int64_t valid = std::min(kVocabBlock, V - v0), columns = round32(valid);
    for (int64_t g0 = 0; g0 < Rp; g0 += kGroupRows) {
      const int64_t group = std::min(kGroupRows, Rp - g0);
      block_logits_t(s.logits, forward + v0 * K, columns, s.token_words + g0 * K / 2, group, K);
      for (int64_t l0 = 0; l0 < group; l0 += 16) {
        const float* x = s.logits + l0;
        f32x16 block_max = load16(x);
        for (int64_t v = 1; v < valid; ++v) {
          const f32x16 value = load16(x + v * kGroupRows);
          block_max = value > block_max ? value : block_max;
        }
        float* running_max = s.row_max + g0 + l0;
        const f32x16 previous = load16(running_max);
        const f32x16 max = block_max > previous ? block_max : previous;
        f32x16 sum{};
        float* exps = exp_chunk(s, block_index, g0 + l0, Rp);
        for (int64_t v = 0; v < valid; ++v) {
          const f32x16 e = exp16(load16(x + v * kGroupRows) - max);
          sum += e;
          _mm512_stream_ps(exps + v * 16, e);
        }
        std::memcpy(s.used_max + block_index * Rp + g0 + l0, &max, sizeof max);
        for (int i = 0; i < 16; ++i) {
          const int64_t r = g0 + l0 + i;
          if (!live(r)) continue;
          if (max[i] > previous[i] && s.row_sum[r] != 0.0)
            s.row_sum[r] *= std::exp(static_cast<double>(previous[i]) - max[i]);
          running_max[i] = max[i];
          s.row_sum[r] += static_cast<double>(sum[i]);
          const int64_t t = targets[r] - v0;
          if (t >= 0 && t < valid) s.target_logit[r] = x[t * kGroupRows + i];
        }
      }
    }
  }
  _mm_sfence();
  // The losses, and each row's gradient scale (0, with a max of 0, for ignored and padding rows).
  for (int64_t r = 0; r < Rp; ++r) {
    if (!live(r)) {
      if (r < rows) row_losses[r] = 0.0;
      s.row_max[r] = 0.0f;
      s.scale[r] = 0.0f;
      continue;
    }
    const double total = s.row_sum[r];
    row_losses[r] = static_cast<double>(s.row_max[r]) + std::log(total) -
                    static_cast<double>(s.target_logit[r]);
    s.scale[r] = static_cast<float>(static_cast<double>(grad_scale) / total);
  }
  // Sweep 2: the gradient of each block, transposed, its input- and weight-gradient products.
  for (int64_t v0 = 0; v0 < V; v0 += kVocabBlock) {
    const int64_t valid = std::min(kVocabBlock, V - v0), columns = round32(valid);
    const int64_t block_index = v0 / kVocabBlock;
    const uint16_t* weight_t = backward + v0 * K;
    for (int64_t g0 = 0; g0 < Rp; g0 += kGroupRows) {
      const int64_t group = std::min(kGroupRows, Rp - g0);
      // Each vocabulary row's gradient for 16 tokens at a time, rounded: into the block's
      // transposed gradient (the weight gradient's A) and, two rows interleaved, into the group's
      // pairs (the input gradient's B). A kept exponential times e^(its max - the row's max) and
      // the scale (0, with a max of 0, for ignored and padding rows: at most e^88 times 0).
      for (int64_t l0 = 0; l0 < group; l0 += 16) {
        const f32x16 max = load16(s.row_max + g0 + l0), scale = load16(s.scale + g0 + l0);
        const f32x16 factor = exp16(load16(s.used_max + block_index * Rp + g0 + l0) - max) * scale;
        const float* exps = exp_chunk(s, block_index, g0 + l0, Rp);
        const auto gradient = [&](int64_t v) {
          const f32x16 d = v < valid ? kept_exp(exps + v * 16) * factor : f32x16{};
          const __m256i bits = to_bf16_bits(d);
          std::memcpy(s.d_t + v * Rp + g0 + l0, &bits, sizeof bits);
          return std::bit_cast<u16x16>(bits);
        };
        for (int64_t v = 0; v < columns; v += 2) {
          const u16x16 even = gradient(v), odd = gradient(v + 1);
          const u16x32 mixed = interleave_pairs(even, odd);
          std::memcpy(s.d_pairs + (v / 2 * kGroupRows + l0) * 2, &mixed, sizeof mixed);
        }
        for (int i = 0; i < 16; ++i) {
          const int64_t r = g0 + l0 + i;
          const int64_t t = live(r) ? targets[r] - v0 : -1;
          if (t < 0 || t >= valid) continue;
          // The target's e^(logit - max) from its fp32 logit, times the scale, rounded to fp32
          // before the subtraction (volatile), as the row kernel does.
          const f32x16 e = exp16(_mm512_set1_ps(s.target_logit[r] - max[i]));
          const volatile float scaled = e[0] * scale[i];
          const auto bits = std::bit_cast<uint16_t>(lattice::to_bf16(scaled - grad_scale));
          s.d_t[t * Rp + r] = bits;
          s.d_pairs[(t / 2 * kGroupRows + l0 + i) * 2 + t % 2] = bits;
        }
      }
      block_input_gradient_t(s.d_in_t + g0, Rp, weight_t, columns, s.d_pairs, group, K, v0 == 0);
    }
    block_weight_gradient_t(weight_grad + v0 * K, overwrite, s.d_t, Rp, s.token_pairs, columns,
                            valid, K, s.staging);
  }
  // The input gradient back in rows.
  for (int64_t t0 = 0; t0 < Rp; t0 += 16) {
    for (int64_t k0 = 0; k0 < K; k0 += 16) {
      f32x16 r[16];
      for (int i = 0; i < 16; ++i) r[i] = load16(s.d_in_t + (k0 + i) * Rp + t0);
      transpose_16x16(r);
      for (int i = 0; i < 16 && t0 + i < rows; ++i)
        std::memcpy(d_in + (t0 + i) * K + k0, &r[i], sizeof r[i]);
    }
  }
#else
  (void)row_losses, (void)d_in, (void)weight_grad, (void)overwrite, (void)in16, (void)targets;
  (void)grad_scale, (void)forward, (void)backward, (void)scratch;
  throw Error("vocab_blocked_head_pass: this build does not target AMX");
#endif
}

}  // namespace lattice::kernels
