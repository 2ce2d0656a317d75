// CpuOps' fused bf16 ops: Linears whose fp32 output is consumed chunk by chunk while in L2 (bf16
// rounding, GELU, GELU's backward, the LM head's loss), and the attention backward that adds up a
// packed projection's bias gradient. Every partial sum is added in an order fixed by the shape, so
// the results do not depend on the thread count.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "lattice/kernels/cpu/activations.hpp"
#include "lattice/kernels/cpu/attention.hpp"
#include "lattice/kernels/cpu/convert.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/kernels/cpu/cross_entropy.hpp"
#include "lattice/kernels/cpu/row_chunks.hpp"

namespace lattice::kernels {

namespace {

// bias_grad[j] += the sum over parts p (in order, in double) of sums[p * width + j]: a bias
// gradient from per-part column sums (per batch, per row chunk) in an order that does not depend on
// the thread count.
void add_column_sums_in_order(float* bias_grad, const std::vector<double>& sums, int64_t parts,
                              int64_t width) {
  for (int64_t j = 0; j < width; ++j) {
    double total = 0.0;
    for (int64_t p = 0; p < parts; ++p) total += sums[static_cast<size_t>(p * width + j)];
    bias_grad[j] += static_cast<float>(total);
  }
}

// The LM head's kernels (HeadLossPlan::kernel).
enum HeadKernel : int { kHeadChunks = 0, kHeadChunksWithBackward = 1, kHeadVocabBlocked = 2 };

}  // namespace

void CpuOps::linear_forward_to_bf16(lattice::bf16* out16, const lattice::bf16* in16,
                                    WeightOperand weight, const float* bias, int64_t M, int64_t K,
                                    int64_t N) {
  // In row chunks (bias included), each chunk rounded to bf16 while in cache: the same values a
  // rounding of linear_forward's whole output gives.
  engine_->multiply_in_row_chunks(
      in16, weight, /*weight_transposed=*/true, M, K, N, kChunkRows,
      [&](int64_t begin, int64_t n, const float* chunk) {
        convert_to_bf16_on_this_thread(out16 + begin * N, chunk, n * N);
      },
      bias);
}

void CpuOps::linear_gelu_forward_bf16(lattice::bf16* gelu16, lattice::bf16* slope16,
                                      const lattice::bf16* in16, WeightOperand weight,
                                      const float* bias, int64_t M, int64_t K, int64_t N) {
  if (M >= kChunkRows) {
    // Each chunk of the pre-activation goes through the GELU while it is in cache.
    engine_->multiply_in_row_chunks(
        in16, weight, /*weight_transposed=*/true, M, K, N, kChunkRows,
        [&](int64_t begin, int64_t n, const float* chunk) {
          gelu_forward_bf16_with_slope_on_this_thread(gelu16 + begin * N, slope16 + begin * N,
                                                      chunk, n * N);
        },
        bias);
    return;
  }
  // A few rows (cached inference, tiny batches): one multi-threaded GEMM into scratch.
  if (pre_activation_.numel() < M * N) pre_activation_ = Tensor({M * N}, DType::f32);
  Bf16Operands keep;
  keep.in = const_cast<lattice::bf16*>(in16);  // read only: forward's in is null
  keep.weight = weight.rounded;
  engine_->forward(pre_activation_.f32(), nullptr, weight.f32, bias, M, K, N, Precision::bf16,
                   keep);
  gelu_forward_bf16_with_slope(gelu16, slope16, pre_activation_.f32(), M * N);
}

void CpuOps::linear_backward_input_through_gelu_bf16(lattice::bf16* d_pre16, float* pre_bias_grad,
                                                     const lattice::bf16* d_out16,
                                                     WeightOperand weight,
                                                     const lattice::bf16* slope16, int64_t M,
                                                     int64_t K, int64_t N) {
  // d_gelu = d_out16 · W in row chunks (W [N, K] read as stored); each chunk goes through the
  // GELU backward on the thread that computed it, while in cache. The bias gradient: per-chunk
  // column sums (double, row by row), added in chunk order.
  const RowChunks chunks = row_chunks_of(M, kChunkRows);  // the GEMM's chunks
  column_sums_.assign(pre_bias_grad != nullptr ? static_cast<size_t>(chunks.count * K) : 0, 0.0);
  engine_->multiply_in_row_chunks(
      d_out16, weight, /*weight_transposed=*/false, M, N, K, kChunkRows,
      [&](int64_t begin, int64_t n, const float* d_gelu) {
        double* sums = pre_bias_grad != nullptr
                           ? column_sums_.data() + begin / chunks.rows_per_chunk * K
                           : nullptr;
        gelu_backward_from_slope_bf16_rows(d_pre16 + begin * K, sums, d_gelu, slope16 + begin * K,
                                           n, K);
      });
  if (pre_bias_grad != nullptr)
    add_column_sums_in_order(pre_bias_grad, column_sums_, chunks.count, K);
}

void CpuOps::attention_backward_bf16(lattice::bf16* dq, lattice::bf16* dk, lattice::bf16* dv,
                                     float* qkv_bias_grad, const float* d_out,
                                     const lattice::bf16* q, const lattice::bf16* k,
                                     const lattice::bf16* v, const float* out, const float* lse,
                                     const AttentionShape& shape, const AttentionOptions& options) {
  AttentionGradientsBf16 grads{dq, dk, dv};
  const int64_t q_width = shape.q_heads * shape.head_dim,
                kv_width = shape.kv_heads * shape.head_dim;
  const int64_t width = q_width + 2 * kv_width;
  if (qkv_bias_grad != nullptr) {
    column_sums_.assign(static_cast<size_t>(shape.batch * width), 0.0);
    grads.dq_sums = column_sums_.data();
    grads.dk_sums = grads.dq_sums + q_width;
    grads.dv_sums = grads.dk_sums + kv_width;
    grads.sums_batch_stride = width;
  }
  kernels::attention_backward_bf16(grads, d_out, q, k, v, out, lse, shape, options);
  // The batches' column sums (each over its tokens in order), added in batch order.
  if (qkv_bias_grad != nullptr)
    add_column_sums_in_order(qkv_bias_grad, column_sums_, shape.batch, width);
}

HeadLossPlan CpuOps::plan_head_loss_bf16(int64_t rows, int64_t K, int64_t V, bool with_gradient,
                                         HeadFusion fusion) const {
  // Rows per chunk: each chunk's GEMM reads the whole head weight again (V·K bf16) and saves
  // writing and re-reading its rows' fp32 logits (8·V bytes per row), so chunks of at least K rows
  // re-read less than they save; 256 was fastest on the small bench shape (L4 d256 V8192: 64, 128,
  // 512 and 1024 rows were 2-8% slower); the chunks are split evenly between the threads.
  const int64_t chunk_rows = std::max<int64_t>(256, (K + 15) / 16 * 16);
  // The engine's choice: AMX on this CPU and its AMX kernels not turned off (MatmulOptions).
  const bool vocab_blocked = fusion != HeadFusion::always && engine_->uses_vocab_blocked_head(K);
  const int lanes = vocab_blocked ? MatmulEngine::vocab_blocked_lanes(rows)
                                  : MatmulEngine::gradient_lanes(rows, chunk_rows);
  HeadLossPlan plan;
  plan.backward_in_forward =
      with_gradient &&
      (fusion == HeadFusion::always || fusion == HeadFusion::vocab_blocked ||
       (fusion == HeadFusion::when_smaller && int64_t{lanes} * V * K * 4 <= rows * V * 2));
  plan.weight_gradient_partials = plan.backward_in_forward ? lanes : 0;
  plan.chunk_rows = chunk_rows;
  plan.vocab_blocked = plan.backward_in_forward && vocab_blocked;
  plan.kernel = !plan.backward_in_forward ? kHeadChunks
                : vocab_blocked           ? kHeadVocabBlocked
                                          : kHeadChunksWithBackward;
  return plan;
}

double CpuOps::head_loss_bf16(const HeadLossPlan& plan, const lattice::bf16* in16,
                              WeightOperand weight, int64_t rows, int64_t K, int64_t V,
                              const int32_t* targets, float grad_scale, float* d_in,
                              float* weight_grad_partials, lattice::bf16* d_logits16) {
  std::vector<double> row_losses(static_cast<size_t>(rows), 0.0);
  std::vector<std::vector<float>> work(static_cast<size_t>(omp_get_max_threads()));
  auto row_work = [&]() -> float* {  // each thread's scratch row of V floats
    auto& row = work[static_cast<size_t>(omp_get_thread_num())];
    if (row.empty()) row.resize(static_cast<size_t>(V));
    return row.data();
  };
  const int lanes = plan.weight_gradient_partials;
  if (plan.kernel == kHeadVocabBlocked) {
    // In blocks of the vocabulary: the logits are computed twice and neither they nor their
    // gradient leave the cache (MatmulEngine::head_cross_entropy_vocab_blocked).
    engine_->head_cross_entropy_vocab_blocked(in16, weight, rows, K, V, targets, grad_scale,
                                              row_losses.data(), d_in, weight_grad_partials, lanes);
  } else if (plan.kernel == kHeadChunksWithBackward) {
    // The head's whole backward chunk by chunk inside the forward: d_in and the weight gradient's
    // per-lane partials come out while each chunk's logits gradient is in cache.
    engine_->forward_backward_in_row_chunks(
        in16, weight, rows, K, V, plan.chunk_rows,
        [&](int64_t begin, int64_t n, const float* chunk, lattice::bf16* d_chunk16,
            int64_t stride) {
          cross_entropy_rows_bf16(d_chunk16, row_losses.data() + begin, chunk, targets + begin, n,
                                  V, grad_scale, row_work(), stride);
        },
        d_in, weight_grad_partials, lanes);
  } else {
    // The logits chunk by chunk, each chunk's loss (and bf16 gradient, when wanted) while in cache.
    engine_->multiply_in_row_chunks(
        in16, weight, /*weight_transposed=*/true, rows, K, V, plan.chunk_rows,
        [&](int64_t begin, int64_t n, const float* chunk) {
          cross_entropy_rows_bf16(d_logits16 != nullptr ? d_logits16 + begin * V : nullptr,
                                  row_losses.data() + begin, chunk, targets + begin, n, V,
                                  grad_scale, row_work(), V);
        });
  }
  double total = 0.0;  // row order: independent of the thread count
  for (double loss : row_losses) total += loss;
  return total;
}

}  // namespace lattice::kernels
