// The AMX weight gradient: see amx_weight_gradient.hpp. The tokens are swept in blocks (of 256, or
// all of them: token_block). Per block, X's rows are packed once into 32-column panels of token
// pairs ([tokens/2][32][2], as tdpbf16ps reads B; a few hundred KiB that stay in L2), and for each
// 32-row strip of dW the strip's 32 columns of D are transposed into A tiles ([32][tokens], 16 KiB
// for 256 tokens, L1); the strip's 32 x 32 blocks then run the block's tokens through four
// accumulator tiles. Between token blocks the running sums wait in dW itself, or in an fp32 scratch
// block when adding (exact either way), so every element is one in-order sum over all tokens. A
// last strip of fewer than 32 rows (a vocabulary's) is computed whole and only its rows are
// written. Memory, not the tiles, bounds these products in the training step (their operands were
// written long before, or by the other core): the next block's rows of D and X are prefetched into
// L2 a few lines per 32 x 32 product, the next strip's columns of D when there is a single block,
// and a block of dW before it is added to or started from.
#include "lattice/kernels/cpu/amx_weight_gradient.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/amx_tiles.hpp"
#include "lattice/kernels/cpu/register_transpose.hpp"

namespace lattice::kernels {

namespace {

// Tokens per block when adding: X's panels for 256 tokens are 16 KiB per 32 columns (blocks of 128
// or 512 tokens, or all 2,048 of a batch, were slower stand-alone: the more tokens, the longer each
// strip of D waits on memory).
constexpr int64_t kTokenBlock = 256;
// X's panels for one block of all the tokens, at most (they stay in L2 with the strip).
constexpr int64_t kOneBlockPanelBytes = int64_t{5} << 18;  // 1.25 MiB
constexpr size_t kAlign = 64;

size_t aligned_size(size_t bytes) {
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

// Tokens per block for M tokens: when the sums wait in dW (not adding) and X's panels for all of
// them take at most kOneBlockPanelBytes, all of them (rounded up to 32): each sum then passes
// through dW once (the LM head's row chunks, whose dW is a partial too large for any cache);
// else kTokenBlock, or all of them when fewer.
int64_t token_block(int64_t M, int64_t columns, WeightGradientUpdate update) {
  const int64_t all = std::max<int64_t>(32, (M + 31) / 32 * 32);
  if (update != WeightGradientUpdate::add && all * columns * 2 <= kOneBlockPanelBytes) return all;
  return std::min(all, kTokenBlock);
}

size_t strip_bytes(int64_t block_tokens) {
  return static_cast<size_t>(32 * block_tokens) * sizeof(uint16_t);
}

// The running sums between token blocks, when adding: none when the tokens fit in one block.
size_t sums_bytes(int64_t M, int64_t rows, int64_t columns, WeightGradientUpdate update) {
  const int64_t padded_rows = (rows + 31) / 32 * 32;
  return update == WeightGradientUpdate::add && M > token_block(M, columns, update)
             ? aligned_size(static_cast<size_t>(padded_rows * columns) * sizeof(float))
             : 0;
}

// The last strip's sums when rows is not a multiple of 32.
size_t tail_bytes(int64_t rows, int64_t columns) {
  return rows % 32 != 0 ? aligned_size(static_cast<size_t>(32 * columns) * sizeof(float)) : 0;
}

size_t panels_bytes(int64_t block_tokens, int64_t columns) {
  return static_cast<size_t>(block_tokens * columns) * sizeof(uint16_t);
}

#if defined(LATTICE_HAS_AMX)
inline u16x16 load_row16(const lattice::bf16* p) {
  u16x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// X's rows [t0, t0 + tokens) (zeros past row M), columns [0, columns), as 32-column panels of
// token pairs: panel p is [block_tokens/2][32][2], pair q of column j at (q·32 + j)·2.
void pack_token_pair_panels(uint16_t* panels, const lattice::bf16* X, int64_t ldx, int64_t t0,
                            int64_t tokens, int64_t M, int64_t columns, int64_t block_tokens) {
  const u16x16 zero{};
  // Panel by panel, so that the writes are sequential (panels are 16 KiB apart: writing all of
  // them row pair by row pair conflicts in L1's sets).
  for (int64_t p = 0; p < columns / 32; ++p) {
    uint16_t* panel = panels + p * block_tokens * 32;
    for (int64_t q = 0; q < tokens / 2; ++q) {
      const int64_t even = t0 + 2 * q, odd = even + 1;
      for (int64_t h = 0; h < 32; h += 16) {
        const int64_t column = p * 32 + h;
        const u16x16 a = even < M ? load_row16(X + even * ldx + column) : zero;
        const u16x16 b = odd < M ? load_row16(X + odd * ldx + column) : zero;
        const u16x32 mixed = interleave_pairs(a, b);
        std::memcpy(panel + q * 64 + h * 2, &mixed, sizeof mixed);
      }
    }
  }
}

// D's columns [n0, n0 + 32) over rows [t0, t0 + tokens) (zeros past row M), transposed: row i of
// the strip holds column n0 + i's tokens, block_tokens apart. 32 tokens x 16 columns at a time:
// their row pairs interleaved make 16 rows of 16 words (a word = one column's token pair), which
// a 16 x 16 transpose turns into 16 tile rows.
void pack_transposed_strip(uint16_t* strip, const lattice::bf16* D, int64_t ldd, int64_t n0,
                           int64_t t0, int64_t tokens, int64_t M, int64_t block_tokens) {
  const u16x16 zero{};
  for (int64_t g = 0; g < tokens; g += 32) {
    for (int64_t h = 0; h < 32; h += 16) {
      u32x16 r[16];
      for (int j = 0; j < 16; ++j) {
        const int64_t even = t0 + g + 2 * j, odd = even + 1;
        const u16x16 a = even < M ? load_row16(D + even * ldd + n0 + h) : zero;
        const u16x16 b = odd < M ? load_row16(D + odd * ldd + n0 + h) : zero;
        const u16x32 mixed = interleave_pairs(a, b);
        std::memcpy(&r[j], &mixed, sizeof mixed);
      }
      transpose_16x16(r);
      for (int i = 0; i < 16; ++i) std::memcpy(strip + (h + i) * block_tokens + g, &r[i], 64);
    }
  }
}

// Asks for `rows` rows of a 32-float block of dW (row stride ldw) to come into L1.
inline void prefetch_block(const float* block, int64_t ldw, int64_t rows) {
  for (int64_t i = 0; i < rows; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(block + i * ldw), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(block + i * ldw + 16), _MM_HINT_T0);
  }
}

// Walks rows [begin, end) of a row-major bf16 matrix (`bytes` of each) line by line, asking for
// `count` lines at a time to come into L2: the next token block's operands, spread over this
// block's tile products (a thread's rows of D and X are strided, and the hardware prefetchers stop
// at page boundaries).
class LinePrefetcher {
 public:
  LinePrefetcher(const lattice::bf16* matrix, int64_t ld, int64_t begin, int64_t end, int64_t bytes)
      : row_(reinterpret_cast<const char*>(matrix + begin * ld)),
        row_stride_(ld * 2),
        rows_left_(std::max<int64_t>(0, end - begin)),
        bytes_(bytes) {}
  int64_t lines() const { return rows_left_ * ((bytes_ + 63) / 64); }
  void issue(int64_t count) {
    for (; count > 0 && rows_left_ > 0; --count) {
      _mm_prefetch(row_ + offset_, _MM_HINT_T1);
      offset_ += 64;
      if (offset_ >= bytes_) offset_ = 0, row_ += row_stride_, --rows_left_;
    }
  }

 private:
  const char* row_;
  int64_t row_stride_, rows_left_, bytes_, offset_ = 0;
};

#endif

}  // namespace

size_t amx_weight_gradient_scratch_bytes(int64_t M, int64_t rows, int64_t columns,
                                         WeightGradientUpdate update) {
  // The largest block of any call with at most M tokens (token_block is not monotonic in M: fewer
  // tokens may fit in one block where more are swept in blocks of kTokenBlock), so that a caller
  // may size the scratch once for its longest call.
  int64_t block_tokens = token_block(M, columns, update);
  if (update != WeightGradientUpdate::add) {
    const int64_t one_block_limit = kOneBlockPanelBytes / (2 * columns) / 32 * 32;
    block_tokens = std::max(block_tokens, std::min((M + 31) / 32 * 32, one_block_limit));
  }
  return sums_bytes(M, rows, columns, update) + tail_bytes(rows, columns) +
         strip_bytes(block_tokens) + panels_bytes(block_tokens, columns) +
         aligned_size(32 * 32 * sizeof(float));
}

void amx_weight_gradient_block(float* dW, int64_t ldw, const lattice::bf16* D, int64_t ldd,
                               const lattice::bf16* X, int64_t ldx, int64_t M, int64_t rows,
                               int64_t columns, WeightGradientUpdate update, void* scratch) {
  const int64_t padded_rows = (rows + 31) / 32 * 32;
  check(rows > 0 && columns > 0 && columns % 32 == 0 && M >= 0 && ldw >= columns &&
            ldd >= padded_rows && ldx >= columns,
        "amx_weight_gradient_block: needs rows > 0, columns a positive multiple of 32, M >= 0, "
        "ldw >= columns, ldd >= rows rounded up to 32, ldx >= columns; got rows=" +
            std::to_string(rows) + " columns=" + std::to_string(columns) +
            " ldd=" + std::to_string(ldd));
#if defined(LATTICE_HAS_AMX)
  if (M == 0) {
    if (update == WeightGradientUpdate::overwrite)
      for (int64_t i = 0; i < rows; ++i) std::fill(dW + i * ldw, dW + i * ldw + columns, 0.0f);
    return;
  }
  check(amx_tile_state_granted(),
        "amx_weight_gradient_block: the process has no AMX tile state (check "
        "amx_tile_state_granted first)");
  const bool adding = update == WeightGradientUpdate::add;
  const int64_t block_tokens = token_block(M, columns, update);
  const bool one_block = M <= block_tokens;
  auto* bytes = static_cast<char*>(scratch);
  // Running sums between token blocks when adding (else they wait in dW), [padded_rows][columns].
  auto* sums = reinterpret_cast<float*>(bytes);
  bytes += sums_bytes(M, rows, columns, update);
  // The last strip's sums when rows is not a multiple of 32 (dW has no room for the padding).
  auto* tail = reinterpret_cast<float*>(bytes);
  bytes += tail_bytes(rows, columns);
  auto* strip = reinterpret_cast<uint16_t*>(bytes);  // [32][block_tokens]
  bytes += strip_bytes(block_tokens);
  auto* panels = reinterpret_cast<uint16_t*>(bytes);  // [columns/32][block_tokens/2][32][2]
  bytes += panels_bytes(block_tokens, columns);
  auto* block = reinterpret_cast<float*>(bytes);  // [32][32]: a finished block to add to dW

  const AmxTileScope tiles;
  const int64_t strip_stride = block_tokens * 2, panel_stride = 128;
  const int64_t products_per_strip = columns / 32;
  for (int64_t t0 = 0; t0 < M; t0 += block_tokens) {
    const bool first = t0 == 0, last = t0 + block_tokens >= M;
    const int64_t tokens = (std::min(block_tokens, M - t0) + 31) / 32 * 32;
    pack_token_pair_panels(panels, X, ldx, t0, tokens, M, columns, block_tokens);
    // What the next token block reads (its rows of X and D), spread over this block's products;
    // with one block for all tokens, the next strip's columns of D instead.
    const int64_t next = std::min(M, t0 + block_tokens);
    const int64_t next_end = std::min(M, next + block_tokens);
    LinePrefetcher next_x(X, ldx, next, next_end, columns * 2);
    LinePrefetcher next_d(D, ldd, next, next_end, rows * 2);
    const int64_t products = (padded_rows / 32) * products_per_strip;
    const int64_t x_per_product = (next_x.lines() + products - 1) / products;
    const int64_t d_per_product = (next_d.lines() + products - 1) / products;
    for (int64_t n0 = 0; n0 < rows; n0 += 32) {
      const int64_t valid_rows = std::min<int64_t>(32, rows - n0);
      const bool in_tail = valid_rows < 32;
      pack_transposed_strip(strip, D, ldd, n0, t0, tokens, M, block_tokens);
      LinePrefetcher next_strip(D + n0 + 32, ldd, t0, n0 + 32 < rows && one_block ? M : t0, 64);
      const int64_t strip_per_product =
          (next_strip.lines() + products_per_strip - 1) / products_per_strip;
      // Where this strip's sums wait between token blocks.
      float* running = in_tail ? tail : adding ? sums + n0 * columns : dW + n0 * ldw;
      const int64_t running_stride = in_tail || adding ? columns : ldw;
      if (in_tail && first && update == WeightGradientUpdate::accumulate) {
        for (int64_t i = 0; i < 32; ++i)
          for (int64_t k = 0; k < columns; ++k)
            tail[i * columns + k] = i < valid_rows ? dW[(n0 + i) * ldw + k] : 0.0f;
      }
      for (int64_t k0 = 0; k0 < columns; k0 += 32) {
        float* run = running + k0;
        if (!first || update == WeightGradientUpdate::accumulate)
          amx_block_load(run, running_stride * 4);
        else
          amx_block_zero();
        next_x.issue(x_per_product);
        next_d.issue(d_per_product);
        next_strip.issue(strip_per_product);
        float* out = dW + n0 * ldw + k0;
        if (last && adding) {  // the block of dW added to below, on its way while the tiles run
          prefetch_block(out, ldw, valid_rows);
        } else if (first && update == WeightGradientUpdate::accumulate) {
          // The next block of dW, which the next product starts from.
          const bool row_end = k0 + 32 == columns;
          const int64_t next_n0 = row_end ? n0 + 32 : n0;
          if (next_n0 + 32 <= rows)
            prefetch_block(dW + next_n0 * ldw + (row_end ? 0 : k0 + 32), ldw, 32);
        }
        const uint16_t* panel = panels + k0 * block_tokens;
        for (int64_t g = 0; g < tokens; g += 32)
          amx_block_multiply(strip + g, strip_stride, panel + g * 32, panel + g * 32 + 32,
                             panel_stride);
        if (!last || (!adding && !in_tail)) {
          amx_block_store(run, running_stride * 4);  // dW itself when not adding
          continue;
        }
        amx_block_store(block, 32 * 4);
        for (int64_t i = 0; i < valid_rows; ++i)
          for (int64_t j = 0; j < 32; ++j)
            out[i * ldw + j] = adding ? out[i * ldw + j] + block[i * 32 + j] : block[i * 32 + j];
      }
    }
  }
#else
  (void)dW, (void)D, (void)X, (void)update, (void)scratch;
  throw Error("amx_weight_gradient_block: this build does not target AMX");
#endif
}

}  // namespace lattice::kernels
