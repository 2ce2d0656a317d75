// CpuOps: the plain ops, each the CPU kernel of the same name (kernels/cpu/*.hpp); the fused bf16
// ops are in cpu_fused_ops.cpp.
#include "lattice/kernels/cpu/cpu_ops.hpp"

#include <algorithm>

#include "lattice/core/cpu_features.hpp"
#include "lattice/kernels/cpu/activations.hpp"
#include "lattice/kernels/cpu/adamw.hpp"
#include "lattice/kernels/cpu/attention.hpp"
#include "lattice/kernels/cpu/convert.hpp"
#include "lattice/kernels/cpu/cross_entropy.hpp"
#include "lattice/kernels/cpu/cross_entropy_vocab_slice.hpp"
#include "lattice/kernels/cpu/elementwise.hpp"
#include "lattice/kernels/cpu/embedding.hpp"
#include "lattice/kernels/cpu/layernorm.hpp"
#include "lattice/kernels/cpu/moe_router.hpp"
#include "lattice/kernels/cpu/moe_rows.hpp"
#include "lattice/kernels/cpu/reduce.hpp"
#include "lattice/kernels/cpu/rmsnorm.hpp"
#include "lattice/kernels/cpu/rope.hpp"
#include "lattice/kernels/cpu/row_chunks.hpp"

namespace lattice::kernels {

CpuOps::CpuOps(const MatmulOptions& options) : engine_(std::make_unique<MatmulEngine>(options)) {}

CpuOps::CpuOps(Bf16FallbackGemm bf16_fallback)
    : engine_(std::make_unique<MatmulEngine>(bf16_fallback)) {}

CpuOps::~CpuOps() = default;

std::string CpuOps::describe() const {
  return "cpu: " + cpu_features().best_tier() + " kernels; " + engine_->bf16_gemms();
}

std::string CpuOps::describe_bf16() const {
  return engine_->bf16_gemms();
}

bool CpuOps::bf16_on_fp32_units() const {
  return engine_->bf16_on_fp32_units();
}

int64_t CpuOps::scratch_bytes() const {
  return engine_->scratch_bytes() + static_cast<int64_t>(pre_activation_.nbytes()) +
         static_cast<int64_t>(column_sums_.capacity() * sizeof(double));
}

void CpuOps::linear_forward(float* out, const float* in, const float* weight, const float* bias,
                            int64_t M, int64_t K, int64_t N, Precision precision,
                            const Bf16Operands& keep) {
  engine_->forward(out, in, weight, bias, M, K, N, precision, keep);
}

void CpuOps::linear_backward(float* d_in, float* d_weight, float* d_bias, const float* d_out,
                             const float* in, const float* weight, int64_t M, int64_t K, int64_t N,
                             Precision precision, const Bf16Operands& rounded) {
  engine_->backward(d_in, d_weight, d_bias, d_out, in, weight, M, K, N, precision, rounded);
}

void CpuOps::round_with_column_sums(lattice::bf16* d_out16, float* d_bias, const float* d_out,
                                    int64_t M, int64_t N) {
  round_to_bf16_with_column_sums(d_out16, d_bias, d_out, M, N);
}

double CpuOps::cross_entropy_forward(const float* logits, const int32_t* targets, int64_t rows,
                                     int64_t V) {
  return kernels::cross_entropy_forward(logits, targets, rows, V);
}

double CpuOps::cross_entropy_forward_backward(float* d_logits, const float* logits,
                                              const int32_t* targets, int64_t rows, int64_t V,
                                              float grad_scale) {
  return kernels::cross_entropy_forward_backward(d_logits, logits, targets, rows, V, grad_scale);
}

void CpuOps::vocab_slice_row_max(float* row_max, const float* logits, int64_t rows, int64_t V_local,
                                 int64_t valid) {
  kernels::vocab_slice_row_max(row_max, logits, rows, V_local, valid);
}

void CpuOps::vocab_slice_row_sums(float* row_sum, float* target_logit, const float* logits,
                                  const float* row_max, const int32_t* targets, int64_t rows,
                                  int64_t V_local, int64_t valid, VocabRange vocab) {
  kernels::vocab_slice_row_sums(row_sum, target_logit, logits, row_max, targets, rows, V_local,
                                valid, vocab);
}

double CpuOps::vocab_slice_loss(float* d_logits, const float* logits, const float* row_max,
                                const float* row_sum, const float* target_logit,
                                const int32_t* targets, int64_t rows, int64_t V_local,
                                int64_t valid, VocabRange vocab, float grad_scale) {
  return kernels::vocab_slice_loss(d_logits, logits, row_max, row_sum, target_logit, targets, rows,
                                   V_local, valid, vocab, grad_scale);
}

void CpuOps::add_partials(float* accumulator, const float* partials, int64_t count, int64_t numel,
                          int64_t stride) {
  add_chunk_partials(accumulator, partials, count, numel, stride);
}

void CpuOps::attention_forward(float* out, float* lse, const float* q, const float* k,
                               const float* v, const AttentionShape& shape, Precision precision,
                               const AttentionOptions& options) {
  kernels::attention_forward(out, lse, q, k, v, shape, precision, *engine_, options);
}

void CpuOps::attention_backward(float* dq, float* dk, float* dv, const float* d_out, const float* q,
                                const float* k, const float* v, const float* out, const float* lse,
                                const AttentionShape& shape, Precision precision,
                                const AttentionOptions& options) {
  kernels::attention_backward(dq, dk, dv, d_out, q, k, v, out, lse, shape, precision, *engine_,
                              options);
}

void CpuOps::attention_forward_bf16(float* out, float* lse, const lattice::bf16* q,
                                    const lattice::bf16* k, const lattice::bf16* v,
                                    const AttentionShape& shape, const AttentionOptions& options) {
  kernels::attention_forward_bf16(out, lse, q, k, v, shape, options);
}

void CpuOps::attention_merge_partial(float* out, float* lse, const float* part_out,
                                     const float* part_lse, int64_t batch, int64_t q_len,
                                     int64_t q_heads, int64_t head_dim) {
  kernels::attention_merge_partial(out, lse, part_out, part_lse, batch, q_len, q_heads, head_dim);
}

void CpuOps::layernorm_forward(float* out, float* mean, float* rstd, const float* in,
                               const float* weight, const float* bias, int64_t rows, int64_t C,
                               float eps) {
  kernels::layernorm_forward(out, mean, rstd, in, weight, bias, rows, C, eps);
}

void CpuOps::layernorm_forward_bf16(lattice::bf16* out, float* mean, float* rstd, const float* in,
                                    const float* weight, const float* bias, int64_t rows, int64_t C,
                                    float eps) {
  kernels::layernorm_forward_bf16(out, mean, rstd, in, weight, bias, rows, C, eps);
}

void CpuOps::layernorm_backward(float* d_in, float* d_weight, float* d_bias, const float* d_out,
                                const float* in, const float* weight, const float* mean,
                                const float* rstd, int64_t rows, int64_t C,
                                const float* residual_grad) {
  kernels::layernorm_backward(d_in, d_weight, d_bias, d_out, in, weight, mean, rstd, rows, C,
                              residual_grad);
}

void CpuOps::rmsnorm_forward(float* out, float* rstd, const float* in, const float* weight,
                             int64_t rows, int64_t C, float eps) {
  kernels::rmsnorm_forward(out, rstd, in, weight, rows, C, eps);
}

void CpuOps::rmsnorm_forward_bf16(lattice::bf16* out, float* rstd, const float* in,
                                  const float* weight, int64_t rows, int64_t C, float eps) {
  kernels::rmsnorm_forward_bf16(out, rstd, in, weight, rows, C, eps);
}

void CpuOps::rmsnorm_backward(float* d_in, float* d_weight, const float* d_out, const float* in,
                              const float* weight, const float* rstd, int64_t rows, int64_t C,
                              const float* residual_grad) {
  kernels::rmsnorm_backward(d_in, d_weight, d_out, in, weight, rstd, rows, C, residual_grad);
}

void CpuOps::gelu_forward(float* out, const float* in, int64_t n) {
  kernels::gelu_forward(out, in, n);
}

void CpuOps::gelu_backward(float* d_in, const float* d_out, const float* in, int64_t n) {
  kernels::gelu_backward(d_in, d_out, in, n);
}

void CpuOps::swiglu_forward(float* out, const float* gate, const float* up, int64_t n) {
  kernels::swiglu_forward(out, gate, up, n);
}

void CpuOps::swiglu_backward(float* d_gate, float* d_up, const float* d_out, const float* gate,
                             const float* up, int64_t n) {
  kernels::swiglu_backward(d_gate, d_up, d_out, gate, up, n);
}

void CpuOps::rope(const RopeTable& table, float* x, int64_t batch, int64_t seq, int64_t heads,
                  int64_t row_stride, int64_t batch_stride, int64_t pos_offset, bool inverse) {
  rope_apply(table, x, batch, seq, heads, row_stride, batch_stride, pos_offset, inverse);
}

void CpuOps::embedding_forward(float* out, const int32_t* tokens, const float* wte,
                               const float* wpe, int64_t B, int64_t T, int64_t C,
                               int64_t pos_offset, VocabRange vocab) {
  kernels::embedding_forward(out, tokens, wte, wpe, B, T, C, pos_offset, vocab);
}

void CpuOps::embedding_backward(float* d_wte, float* d_wpe, const float* d_out,
                                const int32_t* tokens, int64_t B, int64_t T, int64_t C,
                                VocabRange vocab) {
  kernels::embedding_backward(d_wte, d_wpe, d_out, tokens, B, T, C, vocab);
}

void CpuOps::add_inplace(float* accumulator, const float* x, int64_t n) {
  kernels::add_inplace(accumulator, x, n);
}

void CpuOps::copy(float* out, const float* in, int64_t n) {
  kernels::copy(out, in, n);
}

void CpuOps::scale_copy(float* out, const float* in, int64_t n, float factor) {
  for (int64_t i = 0; i < n; ++i) out[i] = in[i] * factor;
}

void CpuOps::fill_zero(float* x, int64_t n) {
  zero_in_parallel(x, n);
}

void CpuOps::fill(float* x, int64_t n, float value) {
  std::fill(x, x + n, value);
}

void CpuOps::convert_to_bf16(lattice::bf16* out, const float* in, int64_t n) {
  kernels::convert_to_bf16(out, in, n);
}

void CpuOps::convert_to_f32(float* out, const lattice::bf16* in, int64_t n) {
  kernels::convert_to_f32(out, in, n);
}

void CpuOps::moe_router_forward(int32_t* experts, float* weights, float* scores,
                                const float* logits, const float* bias, const RouterShape& shape,
                                const RouterStatistics& stats) {
  kernels::moe_router_forward(experts, weights, scores, logits, bias, shape, stats);
}

void CpuOps::moe_router_backward(float* d_logits, const float* d_weights, const int32_t* experts,
                                 const float* scores, const float* logits, const RouterShape& shape,
                                 const RouterLossGradients& losses) {
  kernels::moe_router_backward(d_logits, d_weights, experts, scores, logits, shape, losses);
}

void CpuOps::moe_gather(float* out, const float* x, const int32_t* slot_token, int64_t slots,
                        int64_t C) {
  kernels::moe_gather(out, x, slot_token, slots, C);
}

void CpuOps::moe_gather_backward(float* d_x, const float* d_out, const int32_t* slot_of,
                                 int64_t tokens, int64_t top_k, int64_t C) {
  kernels::moe_gather_backward(d_x, d_out, slot_of, tokens, top_k, C);
}

void CpuOps::moe_combine(float* y, const float* expert_out, const float* weights,
                         const int32_t* slot_of, int64_t tokens, int64_t top_k, int64_t C) {
  kernels::moe_combine(y, expert_out, weights, slot_of, tokens, top_k, C);
}

void CpuOps::moe_combine_backward(float* d_expert_out, float* d_weights, const float* dy,
                                  const float* expert_out, const float* weights,
                                  const int32_t* slot_of, int64_t tokens, int64_t top_k,
                                  int64_t C) {
  kernels::moe_combine_backward(d_expert_out, d_weights, dy, expert_out, weights, slot_of, tokens,
                                top_k, C);
}

void CpuOps::adamw_update(std::span<const AdamWTensor> tensors, int64_t step, float grad_scale) {
  adamw_update_tensors(tensors, step, grad_scale);
}

double CpuOps::sum_of_squares(std::span<const FloatRun> runs) {
  // One run (the gradient norm's per-chunk sums): the single-run kernel, bit for bit the same
  // (reduce.hpp) without the multi-run bookkeeping's allocations.
  if (runs.size() == 1) return kernels::sum_of_squares(runs[0].data, runs[0].n);
  return sum_of_squares_of_runs(runs);
}

void CpuOps::sum_of_squares_each(std::span<const FloatRun> runs, double* sums) {
  kernels::sum_of_squares_each(runs, sums);
}

}  // namespace lattice::kernels
