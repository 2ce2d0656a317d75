// The LM head and its cross-entropy, forward and backward, on AMX in blocks of the vocabulary, for
// narrow models (d_model up to a few hundred). A thread takes a pass of rows whose bf16 input (in
// two tile layouts) and fp32 input gradient stay in L2, and sweeps the vocabulary twice in blocks
// of kVocabBlock rows: the first sweep computes each block's logits and folds them into every row's
// running max and sum of exponentials (online softmax), keeping the exponentials (fp32, streamed to
// memory past the caches with non-temporal stores); the second turns the kept exponentials into
// the logits' gradient, which feeds the input gradient and the block's weight gradient at once.
// The logits are computed transposed (vocabulary down the rows), so the weight gradient comes out
// in the weight's own [V, K] layout. Per pass the head weight is read twice (its row layout, then
// its transposed blocks), where the row-chunk head (MatmulEngine::forward_backward_in_row_chunks)
// writes and reads its fp32 logits through the caches and accumulates a whole-vocabulary
// weight-gradient partial through memory for every chunk. Computing the logits a second time
// instead of keeping them (Apple's Cut Cross-Entropy) was slower here: one more tile product of
// the pass and its exponentials against 8 bytes a logit through memory (25.8 against 22.2 ms for
// the small model's 2,048 rows on 2 cores of the AMX host).
#pragma once

#include <cstddef>
#include <cstdint>

#include "lattice/core/dtype.hpp"

namespace lattice::kernels {

// Vocabulary rows per block: the block's packed weight (both layouts) and its logits for a group of
// rows stay in L2 next to the pass's rows.
constexpr int64_t kVocabBlock = 256;

// Rows per pass for a head of input width K: the most (a multiple of 32, at most 512) whose bf16
// input (in its two tile layouts) and fp32 input gradient take at most 1 MiB; 0 when K is not a
// multiple of 32 or fewer than 256 rows fit (the kernel does not apply: use the row-chunk head).
int64_t vocab_blocked_head_rows_per_pass(int64_t K);

// Elements of each of the two packed weights for a vocabulary of V and width K.
int64_t vocab_blocked_head_packed_elements(int64_t V, int64_t K);

// The head weight [V, K] (bf16, row-major) laid out for the kernel. Returns the rows its logits
// read (vocab_blocked_head_pass's `forward`, [Vp][K] with Vp = V rounded up to 32): weight16 itself
// where V is a multiple of 32 (`forward` untouched, and it may be null), else `forward` (Vp·K
// elements), filled with the weight's rows and zero rows past V. `backward` receives, per
// vocabulary block, the block transposed, [K][columns] (block j at element j·kVocabBlock·K;
// columns kVocabBlock, the last block's its rows rounded up to 32; the input gradient's A
// operand). Multi-threaded: call outside parallel regions.
[[nodiscard]] const uint16_t* pack_vocab_blocked_head(uint16_t* forward, uint16_t* backward,
                                                      const lattice::bf16* weight16, int64_t V,
                                                      int64_t K);

// Bytes of 64-byte aligned scratch one thread needs for passes of up to `rows` rows over a
// vocabulary of V: about 4·V·rows for the kept exponentials (16 MiB for 512 rows of 8,192; never
// more than the fp32 logits of the rows the thread takes), plus the rows' layouts and a block's
// logits.
size_t vocab_blocked_head_scratch_bytes(int64_t rows, int64_t K, int64_t V);

// One pass over `rows` rows (at most vocab_blocked_head_rows_per_pass(K)) on the calling thread:
//   logits[r, v] = in16[r, :] · weight[v, :]              (fp32 sums over K in order, never stored)
//   row_losses[r] = max + log(sum e^(logit - max)) - logit[target]  (0 where targets[r] < 0)
//   d[r, v] = bf16(e^(logit - max) · grad_scale / sum), at the target minus grad_scale (the
//             gradient cross_entropy_rows_bf16 writes; 0 for ignored rows), never stored; away
//             from the target formed from the kept e^(logit - m) (m the running max at the
//             logit's block) times e^(m - max) · grad_scale / sum: the same fp32 value where m is
//             the row's max, within fp32 rounding of it elsewhere
//   d_in[r, :] = d[r, :] · weight                       (overwritten; row stride K)
//   weight_grad[v, :] (= or +=) sum over the rows of d[r, v] · in16[r, :] (row stride K; `=`
//             when overwrite)
// The max and the sum are formed block by block (the sum rescaled whenever a block raises the
// max), so losses and gradients agree with cross_entropy_rows_bf16 on the same logits to fp32
// rounding, not bit for bit. Every row's results depend on that row alone; the weight gradient is
// the pass's sum over its rows in order. `targets` in [0, V) or negative (ignored). Requires the
// tile state (amx_packed_gemm_enabled) and K a multiple of 32.
void vocab_blocked_head_pass(double* row_losses, float* d_in, float* weight_grad, bool overwrite,
                             const lattice::bf16* in16, const int32_t* targets, int64_t rows,
                             int64_t K, int64_t V, float grad_scale, const uint16_t* forward,
                             const uint16_t* backward, void* scratch);

}  // namespace lattice::kernels
