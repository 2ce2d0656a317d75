// The vocabulary-blocked LM head: see amx_vocab_blocked_head.hpp. Per pass of R rows (padded to
// Rp, a multiple of 32) the thread's scratch holds the rows as A tiles ([Rp][K] bf16), their
// transpose ([K][Rp], the A operand of the weight gradient), the fp32 input gradient [Rp][K], the
// rows' softmax statistics, and per vocabulary block the logits of a group of kGroupRows rows
// [kGroupRows][kVocabBlock] (fp32), their gradient as rows ([kGroupRows][kVocabBlock] bf16, the A
// operand of the input gradient) and as token pairs for all Rp rows ([Rp/2][kVocabBlock][2], the B
// operand of the weight gradient). All products are the 2 x 2-tile micro-GEMM of amx_tiles.hpp:
//   logits      [group, block] = rows · forward panels           (K swept in order)
//   d_in        [group, K]    += d rows · backward block panels   (the block's columns in order)
//   weight grad [K, block]     = in^T · d pairs                   (the pass's rows in order)
// and the weight gradient's 32 x 32 blocks are transposed into the [V, K] rows on the way out.
#include "lattice/kernels/cpu/amx_vocab_blocked_head.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/amx_packed_gemm.hpp"
#include "lattice/kernels/cpu/amx_tiles.hpp"
#include "lattice/kernels/cpu/convert.hpp"
#include "lattice/kernels/cpu/fast_exp.hpp"
#include "lattice/kernels/cpu/register_transpose.hpp"

namespace lattice::kernels {

namespace {

// Rows whose logits for one vocabulary block are formed and consumed together (128 KiB of fp32).
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

// The scratch of a pass of up to `rows` rows, carved in order.
struct PassScratch {
  uint16_t* rows16;     // [Rp][K]
  uint16_t* columns16;  // [K][Rp]
  float* d_in;          // [Rp][K]
  float* row_max;       // [Rp]
  double* row_sum;      // [Rp]
  float* target_logit;  // [Rp]
  float* logits;        // [kGroupRows][kVocabBlock]
  uint16_t* d_rows;     // [kGroupRows][kVocabBlock]
  uint16_t* d_pairs;    // [Rp/2][kVocabBlock][2]
  float* staging;       // [32][32]

  static size_t bytes(int64_t Rp, int64_t K, PassScratch* carve, void* base) {
    size_t offset = 0;
    auto* p = static_cast<char*>(base);
    const auto take = [&](auto*& field, size_t size) {
      if (carve != nullptr)
        field = reinterpret_cast<std::remove_reference_t<decltype(field)>>(p + offset);
      offset += aligned_size(size);
    };
    PassScratch unused{};
    PassScratch& s = carve != nullptr ? *carve : unused;
    take(s.rows16, static_cast<size_t>(Rp * K) * 2);
    take(s.columns16, static_cast<size_t>(Rp * K) * 2);
    take(s.d_in, static_cast<size_t>(Rp * K) * 4);
    take(s.row_max, static_cast<size_t>(Rp) * 4);
    take(s.row_sum, static_cast<size_t>(Rp) * 8);
    take(s.target_logit, static_cast<size_t>(Rp) * 4);
    take(s.logits, static_cast<size_t>(kGroupRows * kVocabBlock) * 4);
    take(s.d_rows, static_cast<size_t>(kGroupRows * kVocabBlock) * 2);
    take(s.d_pairs, static_cast<size_t>(Rp * kVocabBlock) * 2);
    take(s.staging, 32 * 32 * 4);
    return offset;
  }
};

#if defined(LATTICE_HAS_AMX)

constexpr __mmask16 kAllLanes = 0xffff;

// Lanes [0, n) of 16 (n clamped to [0, 16]).
inline __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? kAllLanes : static_cast<__mmask16>(n > 0 ? (1u << n) - 1u : 0u);
}

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

// The largest of a row's first `valid` values.
inline float row_max(const float* x, int64_t valid) {
  const f32x16 lowest = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  f32x16 m = lowest;
  for (int64_t v = 0; v < valid; v += 16) {
    const f32x16 values = _mm512_mask_loadu_ps(lowest, first_lanes(valid - v), x + v);
    m = values > m ? values : m;
  }
  return horizontal_max(m);
}

// The sum of e^(x - max) over a row's first `valid` values, in fp32.
inline float row_exp_sum(const float* x, float max, int64_t valid) {
  f32x16 sum{};
  for (int64_t v = 0; v < valid; v += 16)
    sum += _mm512_maskz_mov_ps(first_lanes(valid - v), exp16(_mm512_loadu_ps(x + v) - max));
  return horizontal_sum(sum);
}

// x[v] = e^(x[v] - max) for v < valid, 0 for v in [valid, columns) (columns a multiple of 16).
inline void row_exp(float* x, float max, int64_t valid, int64_t columns) {
  for (int64_t v = 0; v < columns; v += 16)
    _mm512_storeu_ps(
        x + v, _mm512_maskz_mov_ps(first_lanes(valid - v), exp16(_mm512_loadu_ps(x + v) - max)));
}

// logits[rows, columns] (row stride kVocabBlock) = A[rows, K] · the block's forward panels.
void block_logits(float* logits, const uint16_t* a, int64_t rows, const uint16_t* panels,
                  int64_t columns, int64_t K) {
  for (int64_t n0 = 0; n0 < columns; n0 += 32) {
    const uint16_t* panel = panels + n0 * K;
    for (int64_t m0 = 0; m0 < rows; m0 += 32) {
      amx_block_zero();
      const uint16_t* a_rows = a + m0 * K;
      for (int64_t k0 = 0; k0 < K; k0 += 32)
        amx_block_multiply(a_rows + k0, K * 2, panel + k0 * 32, panel + k0 * 32 + 32, 128);
      amx_block_store(logits + m0 * kVocabBlock + n0, kVocabBlock * 4);
    }
  }
}

// d_in[rows, K] (row stride K) (+)= d_rows[rows, columns] · the block's backward panels.
void block_input_gradient(float* d_in, const uint16_t* d_rows, int64_t rows, const uint16_t* panels,
                          int64_t columns, int64_t K, bool first) {
  for (int64_t n0 = 0; n0 < K; n0 += 32) {
    const uint16_t* panel = panels + n0 * columns;
    for (int64_t m0 = 0; m0 < rows; m0 += 32) {
      float* c = d_in + m0 * K + n0;
      if (first)
        amx_block_zero();
      else
        amx_block_load(c, K * 4);
      const uint16_t* a_rows = d_rows + m0 * kVocabBlock;
      for (int64_t k0 = 0; k0 < columns; k0 += 32)
        amx_block_multiply(a_rows + k0, kVocabBlock * 2, panel + k0 * 32, panel + k0 * 32 + 32,
                           128);
      amx_block_store(c, K * 4);
    }
  }
}

// weight_grad[v0 + v, :] (= or +=) sum over the Rp rows of d[r, v] · in[r, :] for v < valid, from
// the transposed rows [K][Rp] and the gradient's token pairs [Rp/2][kVocabBlock][2].
void block_weight_gradient(float* weight_grad, bool overwrite, const uint16_t* columns16,
                           int64_t Rp, const uint16_t* d_pairs, int64_t columns, int64_t valid,
                           int64_t K, float* staging) {
  for (int64_t n0 = 0; n0 < columns; n0 += 32) {
    for (int64_t m0 = 0; m0 < K; m0 += 32) {
      amx_block_zero();
      const uint16_t* a_rows = columns16 + m0 * Rp;
      for (int64_t k0 = 0; k0 < Rp; k0 += 32) {
        const uint16_t* b = d_pairs + (k0 / 2) * 2 * kVocabBlock + n0 * 2;
        amx_block_multiply(a_rows + k0, Rp * 2, b, b + 32, kVocabBlock * 4);
      }
      amx_block_store(staging, 32 * 4);
      // staging[c][v] for c, v < 32: rows v of the weight gradient, columns m0 + c.
      for (int64_t v_half = 0; v_half < 32; v_half += 16) {
        for (int64_t c_half = 0; c_half < 32; c_half += 16) {
          f32x16 r[16];
          for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(staging + (c_half + i) * 32 + v_half);
          transpose_16x16(r);
          for (int i = 0; i < 16; ++i) {
            const int64_t v = n0 + v_half + i;
            if (v >= valid) break;
            float* out = weight_grad + v * K + m0 + c_half;
            _mm512_storeu_ps(out, overwrite ? r[i] : r[i] + _mm512_loadu_ps(out));
          }
        }
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

void pack_vocab_blocked_head(uint16_t* forward, uint16_t* backward, const lattice::bf16* weight16,
                             int64_t V, int64_t K) {
  check(V > 0 && K > 0 && K % 32 == 0,
        "pack_vocab_blocked_head: needs V > 0 and K a positive multiple of 32, got V=" +
            std::to_string(V) + " K=" + std::to_string(K));
  pack_b_panels(forward, weight16, /*weight_transposed=*/true, K, V);
  for (int64_t v0 = 0; v0 < V; v0 += kVocabBlock)
    pack_b_panels(backward + v0 * K, weight16 + v0 * K, /*weight_transposed=*/false,
                  std::min(kVocabBlock, V - v0), K);
}

size_t vocab_blocked_head_scratch_bytes(int64_t rows, int64_t K) {
  return PassScratch::bytes(round32(std::max<int64_t>(rows, 1)), K, nullptr, nullptr);
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
  PassScratch::bytes(Rp, K, &s, scratch);
  const auto* in_bits = reinterpret_cast<const uint16_t*>(in16);
  // The rows (zero past `rows`) and their transpose.
  std::memcpy(s.rows16, in_bits, static_cast<size_t>(rows * K) * 2);
  std::fill(s.rows16 + rows * K, s.rows16 + Rp * K, uint16_t{0});
  transpose_bf16(s.columns16, Rp, s.rows16, K, Rp, K);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::fill(s.row_max, s.row_max + Rp, neg_inf);
  std::fill(s.row_sum, s.row_sum + Rp, 0.0);
  std::fill(s.target_logit, s.target_logit + Rp, 0.0f);
  const auto live = [&](int64_t r) { return r < rows && targets[r] >= 0; };

  const AmxTileScope tiles;
  // Sweep 1: each row's max and sum of e^(logit - max), block by block.
  for (int64_t v0 = 0; v0 < V; v0 += kVocabBlock) {
    const int64_t valid = std::min(kVocabBlock, V - v0), columns = round32(valid);
    for (int64_t g0 = 0; g0 < Rp; g0 += kGroupRows) {
      const int64_t group = std::min(kGroupRows, Rp - g0);
      block_logits(s.logits, s.rows16 + g0 * K, group, forward + v0 * K, columns, K);
      for (int64_t i = 0; i < group; ++i) {
        const int64_t r = g0 + i;
        if (!live(r)) continue;
        const float* x = s.logits + i * kVocabBlock;
        const float block_max = row_max(x, valid);
        if (block_max > s.row_max[r]) {
          if (s.row_sum[r] != 0.0)
            s.row_sum[r] *= std::exp(static_cast<double>(s.row_max[r]) - block_max);
          s.row_max[r] = block_max;
        }
        s.row_sum[r] += static_cast<double>(row_exp_sum(x, s.row_max[r], valid));
        const int64_t t = targets[r] - v0;
        if (t >= 0 && t < valid) s.target_logit[r] = x[t];
      }
    }
  }
  // The losses, and each row's gradient scale (kept in row_sum's place as a float factor).
  for (int64_t r = 0; r < rows; ++r) {
    if (!live(r)) {
      row_losses[r] = 0.0;
      continue;
    }
    const double total = s.row_sum[r];
    row_losses[r] = static_cast<double>(s.row_max[r]) + std::log(total) -
                    static_cast<double>(s.target_logit[r]);
    s.row_sum[r] = static_cast<double>(static_cast<float>(static_cast<double>(grad_scale) / total));
  }
  // Sweep 2: the gradient of each block, its input- and weight-gradient products.
  for (int64_t v0 = 0; v0 < V; v0 += kVocabBlock) {
    const int64_t valid = std::min(kVocabBlock, V - v0), columns = round32(valid);
    for (int64_t g0 = 0; g0 < Rp; g0 += kGroupRows) {
      const int64_t group = std::min(kGroupRows, Rp - g0);
      block_logits(s.logits, s.rows16 + g0 * K, group, forward + v0 * K, columns, K);
      for (int64_t i = 0; i < group; ++i) {
        const int64_t r = g0 + i;
        auto* d = reinterpret_cast<lattice::bf16*>(s.d_rows + i * kVocabBlock);
        if (!live(r)) {
          std::fill(d, d + columns, lattice::bf16{0});
          continue;
        }
        float* x = s.logits + i * kVocabBlock;
        row_exp(x, s.row_max[r], valid, columns);
        const auto scale = static_cast<float>(s.row_sum[r]);
        convert_scaled_to_bf16_on_this_thread(d, x, scale, columns);
        const int64_t t = targets[r] - v0;
        if (t >= 0 && t < valid) {
          // volatile: the product is rounded to fp32 before the subtraction (as the row kernel).
          const volatile float scaled = x[t] * scale;
          d[t] = lattice::to_bf16(scaled - grad_scale);
        }
      }
      // The group's gradient rows as token pairs for the weight gradient.
      for (int64_t i = 0; i < group; i += 2) {
        const uint16_t* even = s.d_rows + i * kVocabBlock;
        const uint16_t* odd = even + kVocabBlock;
        uint16_t* pairs = s.d_pairs + (g0 + i) / 2 * 2 * kVocabBlock;
        for (int64_t v = 0; v < columns; v += 16) {
          u16x16 a, b;
          std::memcpy(&a, even + v, sizeof a);
          std::memcpy(&b, odd + v, sizeof b);
          const u16x32 mixed = interleave_pairs(a, b);
          std::memcpy(pairs + 2 * v, &mixed, sizeof mixed);
        }
      }
      block_input_gradient(s.d_in + g0 * K, s.d_rows, group, backward + v0 * K, columns, K,
                           v0 == 0);
    }
    block_weight_gradient(weight_grad + v0 * K, overwrite, s.columns16, Rp, s.d_pairs, columns,
                          valid, K, s.staging);
  }
  std::memcpy(d_in, s.d_in, static_cast<size_t>(rows * K) * 4);
#else
  (void)row_losses, (void)d_in, (void)weight_grad, (void)overwrite, (void)in16, (void)targets;
  (void)grad_scale, (void)forward, (void)backward, (void)scratch;
  throw Error("vocab_blocked_head_pass: this build does not target AMX");
#endif
}

}  // namespace lattice::kernels
