// Test helper: RecordingOps, a second implementation of kernels::Ops that counts every op by name
// and the bytes its memory hands out, then computes each on the CpuOps it holds: the tests of the
// kernel seam (tests/model/test_ops_interface.cpp and the optimizer's) run through it.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "lattice/kernels/cpu/cpu_ops.hpp"

namespace lattice::testing {

using OpCounts = std::map<std::string, int>;
using kernels::Precision;

// The backend's memory, counting the blocks and bytes it allocates, the bytes still live, and
// the copies and releases asked of it (host blocks underneath).
class CountingMemory final : public DeviceMemory {
 public:
  Device device() const override { return Device::cpu; }
  void* allocate(size_t bytes) override {
    ++blocks_;
    bytes_ += static_cast<int64_t>(bytes);
    void* block = host_memory().allocate(bytes);
    if (block) live_[block] = bytes;
    return block;
  }
  void free(void* block) noexcept override {
    live_.erase(block);
    host_memory().free(block);
  }
  void zero(void* data, size_t bytes) override { host_memory().zero(data, bytes); }
  void release(void* data, size_t bytes) override {
    ++releases_;
    host_memory().release(data, bytes);
  }
  void copy(void* destination, const void* source, size_t bytes, CopyKind kind) override {
    ++copies_;
    host_memory().copy(destination, source, bytes, kind);
  }
  void copy_rows(void* destination, size_t destination_pitch, const void* source,
                 size_t source_pitch, size_t row_bytes, size_t rows, CopyKind kind) override {
    ++row_copies_;
    host_memory().copy_rows(destination, destination_pitch, source, source_pitch, row_bytes, rows,
                            kind);
  }
  int blocks() const { return blocks_; }
  int64_t bytes() const { return bytes_; }
  // Bytes in blocks allocated and not yet freed.
  int64_t live_bytes() const {
    int64_t sum = 0;
    for (const auto& [block, bytes] : live_) sum += static_cast<int64_t>(bytes);
    return sum;
  }
  int copies() const { return copies_; }
  int row_copies() const { return row_copies_; }
  int releases() const { return releases_; }

 private:
  int blocks_ = 0, copies_ = 0, row_copies_ = 0, releases_ = 0;
  int64_t bytes_ = 0;
  std::map<void*, size_t> live_;
};

// A backend of its own: every op counted by name (rope's inverse, the backward, as
// "rope(inverse)"), then computed by the CpuOps it holds.
class RecordingOps final : public kernels::Ops {
 public:
  const OpCounts& calls() const { return calls_; }
  // The rows M of each linear_gelu_forward_bf16 call (CpuOps chunks M >= kChunkRows).
  const std::vector<int64_t>& linear_gelu_rows() const { return linear_gelu_rows_; }
  // Each plan plan_head_loss_bf16 returned (whether the head's backward runs in its forward).
  const std::vector<kernels::HeadLossPlan>& head_plans() const { return head_plans_; }

  Device device() const override { return inner_.device(); }
  std::string describe() const override { return "recording " + inner_.describe(); }
  std::string describe_bf16() const override { return inner_.describe_bf16(); }
  bool bf16_on_fp32_units() const override { return inner_.bf16_on_fp32_units(); }
  int64_t scratch_bytes() const override { return inner_.scratch_bytes(); }
  DeviceMemory& memory() override { return memory_; }
  const CountingMemory& counting_memory() const { return memory_; }

  void linear_forward(float* out, const float* in, const float* weight, const float* bias,
                      int64_t M, int64_t K, int64_t N, Precision precision,
                      const kernels::Bf16Operands& keep) override {
    record("linear_forward");
    inner_.linear_forward(out, in, weight, bias, M, K, N, precision, keep);
  }
  void linear_backward(float* d_in, float* d_weight, float* d_bias, const float* d_out,
                       const float* in, const float* weight, int64_t M, int64_t K, int64_t N,
                       Precision precision, const kernels::Bf16Operands& rounded) override {
    record("linear_backward");
    inner_.linear_backward(d_in, d_weight, d_bias, d_out, in, weight, M, K, N, precision, rounded);
  }
  void linear_forward_to_bf16(lattice::bf16* out16, const lattice::bf16* in16,
                              kernels::WeightOperand weight, const float* bias, int64_t M,
                              int64_t K, int64_t N) override {
    record("linear_forward_to_bf16");
    inner_.linear_forward_to_bf16(out16, in16, weight, bias, M, K, N);
  }
  void linear_gelu_forward_bf16(lattice::bf16* gelu16, lattice::bf16* slope16,
                                const lattice::bf16* in16, kernels::WeightOperand weight,
                                const float* bias, int64_t M, int64_t K, int64_t N) override {
    record("linear_gelu_forward_bf16");
    linear_gelu_rows_.push_back(M);
    inner_.linear_gelu_forward_bf16(gelu16, slope16, in16, weight, bias, M, K, N);
  }
  void linear_backward_input_through_gelu_bf16(lattice::bf16* d_pre16, float* pre_bias_grad,
                                               const lattice::bf16* d_out16,
                                               kernels::WeightOperand weight,
                                               const lattice::bf16* slope16, int64_t M, int64_t K,
                                               int64_t N) override {
    record("linear_backward_input_through_gelu_bf16");
    inner_.linear_backward_input_through_gelu_bf16(d_pre16, pre_bias_grad, d_out16, weight, slope16,
                                                   M, K, N);
  }
  void round_with_column_sums(lattice::bf16* d_out16, float* d_bias, const float* d_out, int64_t M,
                              int64_t N) override {
    record("round_with_column_sums");
    inner_.round_with_column_sums(d_out16, d_bias, d_out, M, N);
  }

  double cross_entropy_forward(const float* logits, const int32_t* targets, int64_t rows,
                               int64_t V) override {
    record("cross_entropy_forward");
    return inner_.cross_entropy_forward(logits, targets, rows, V);
  }
  double cross_entropy_forward_backward(float* d_logits, const float* logits,
                                        const int32_t* targets, int64_t rows, int64_t V,
                                        float grad_scale) override {
    record("cross_entropy_forward_backward");
    return inner_.cross_entropy_forward_backward(d_logits, logits, targets, rows, V, grad_scale);
  }
  kernels::HeadLossPlan plan_head_loss_bf16(int64_t rows, int64_t K, int64_t V, bool with_gradient,
                                            kernels::HeadFusion fusion) const override {
    record("plan_head_loss_bf16");
    const kernels::HeadLossPlan plan =
        inner_.plan_head_loss_bf16(rows, K, V, with_gradient, fusion);
    head_plans_.push_back(plan);
    return plan;
  }
  double head_loss_bf16(const kernels::HeadLossPlan& plan, const lattice::bf16* in16,
                        kernels::WeightOperand weight, int64_t rows, int64_t K, int64_t V,
                        const int32_t* targets, float grad_scale, float* d_in,
                        float* weight_grad_partials, lattice::bf16* d_logits16) override {
    record("head_loss_bf16");
    return inner_.head_loss_bf16(plan, in16, weight, rows, K, V, targets, grad_scale, d_in,
                                 weight_grad_partials, d_logits16);
  }
  void vocab_slice_row_max(float* row_max, const float* logits, int64_t rows, int64_t V_local,
                           int64_t valid) override {
    record("vocab_slice_row_max");
    inner_.vocab_slice_row_max(row_max, logits, rows, V_local, valid);
  }
  void vocab_slice_row_sums(float* row_sum, float* target_logit, const float* logits,
                            const float* row_max, const int32_t* targets, int64_t rows,
                            int64_t V_local, int64_t valid, kernels::VocabRange vocab) override {
    record("vocab_slice_row_sums");
    inner_.vocab_slice_row_sums(row_sum, target_logit, logits, row_max, targets, rows, V_local,
                                valid, vocab);
  }
  double vocab_slice_loss(float* d_logits, const float* logits, const float* row_max,
                          const float* row_sum, const float* target_logit, const int32_t* targets,
                          int64_t rows, int64_t V_local, int64_t valid, kernels::VocabRange vocab,
                          float grad_scale) override {
    record("vocab_slice_loss");
    return inner_.vocab_slice_loss(d_logits, logits, row_max, row_sum, target_logit, targets, rows,
                                   V_local, valid, vocab, grad_scale);
  }
  void add_partials(float* accumulator, const float* partials, int64_t count, int64_t numel,
                    int64_t stride) override {
    record("add_partials");
    inner_.add_partials(accumulator, partials, count, numel, stride);
  }

  void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                         const kernels::AttentionShape& shape, Precision precision,
                         const kernels::AttentionOptions& options) override {
    record("attention_forward");
    inner_.attention_forward(out, lse, q, k, v, shape, precision, options);
  }
  void attention_backward(float* dq, float* dk, float* dv, const float* d_out, const float* q,
                          const float* k, const float* v, const float* out, const float* lse,
                          const kernels::AttentionShape& shape, Precision precision,
                          const kernels::AttentionOptions& options) override {
    record("attention_backward");
    inner_.attention_backward(dq, dk, dv, d_out, q, k, v, out, lse, shape, precision, options);
  }
  void attention_forward_bf16(float* out, float* lse, const lattice::bf16* q,
                              const lattice::bf16* k, const lattice::bf16* v,
                              const kernels::AttentionShape& shape,
                              const kernels::AttentionOptions& options) override {
    record("attention_forward_bf16");
    inner_.attention_forward_bf16(out, lse, q, k, v, shape, options);
  }
  void attention_backward_bf16(lattice::bf16* dq, lattice::bf16* dk, lattice::bf16* dv,
                               float* qkv_bias_grad, const float* d_out, const lattice::bf16* q,
                               const lattice::bf16* k, const lattice::bf16* v, const float* out,
                               const float* lse, const kernels::AttentionShape& shape,
                               const kernels::AttentionOptions& options) override {
    record("attention_backward_bf16");
    inner_.attention_backward_bf16(dq, dk, dv, qkv_bias_grad, d_out, q, k, v, out, lse, shape,
                                   options);
  }
  void attention_merge_partial(float* out, float* lse, const float* part_out, const float* part_lse,
                               int64_t batch, int64_t q_len, int64_t q_heads,
                               int64_t head_dim) override {
    record("attention_merge_partial");
    inner_.attention_merge_partial(out, lse, part_out, part_lse, batch, q_len, q_heads, head_dim);
  }

  void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* weight,
                         const float* bias, int64_t rows, int64_t C, float eps) override {
    record("layernorm_forward");
    inner_.layernorm_forward(out, mean, rstd, in, weight, bias, rows, C, eps);
  }
  void layernorm_forward_bf16(lattice::bf16* out, float* mean, float* rstd, const float* in,
                              const float* weight, const float* bias, int64_t rows, int64_t C,
                              float eps) override {
    record("layernorm_forward_bf16");
    inner_.layernorm_forward_bf16(out, mean, rstd, in, weight, bias, rows, C, eps);
  }
  void layernorm_backward(float* d_in, float* d_weight, float* d_bias, const float* d_out,
                          const float* in, const float* weight, const float* mean,
                          const float* rstd, int64_t rows, int64_t C,
                          const float* residual_grad) override {
    record("layernorm_backward");
    inner_.layernorm_backward(d_in, d_weight, d_bias, d_out, in, weight, mean, rstd, rows, C,
                              residual_grad);
  }
  void rmsnorm_forward(float* out, float* rstd, const float* in, const float* weight, int64_t rows,
                       int64_t C, float eps) override {
    record("rmsnorm_forward");
    inner_.rmsnorm_forward(out, rstd, in, weight, rows, C, eps);
  }
  void rmsnorm_forward_bf16(lattice::bf16* out, float* rstd, const float* in, const float* weight,
                            int64_t rows, int64_t C, float eps) override {
    record("rmsnorm_forward_bf16");
    inner_.rmsnorm_forward_bf16(out, rstd, in, weight, rows, C, eps);
  }
  void rmsnorm_backward(float* d_in, float* d_weight, const float* d_out, const float* in,
                        const float* weight, const float* rstd, int64_t rows, int64_t C,
                        const float* residual_grad) override {
    record("rmsnorm_backward");
    inner_.rmsnorm_backward(d_in, d_weight, d_out, in, weight, rstd, rows, C, residual_grad);
  }

  void gelu_forward(float* out, const float* in, int64_t n) override {
    record("gelu_forward");
    inner_.gelu_forward(out, in, n);
  }
  void gelu_backward(float* d_in, const float* d_out, const float* in, int64_t n) override {
    record("gelu_backward");
    inner_.gelu_backward(d_in, d_out, in, n);
  }
  void swiglu_forward(float* out, const float* gate, const float* up, int64_t n) override {
    record("swiglu_forward");
    inner_.swiglu_forward(out, gate, up, n);
  }
  void swiglu_backward(float* d_gate, float* d_up, const float* d_out, const float* gate,
                       const float* up, int64_t n) override {
    record("swiglu_backward");
    inner_.swiglu_backward(d_gate, d_up, d_out, gate, up, n);
  }
  void rope(const kernels::RopeTable& table, float* x, int64_t batch, int64_t seq, int64_t heads,
            int64_t row_stride, int64_t batch_stride, int64_t pos_offset, bool inverse) override {
    record(inverse ? "rope(inverse)" : "rope");
    inner_.rope(table, x, batch, seq, heads, row_stride, batch_stride, pos_offset, inverse);
  }

  void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                         int64_t B, int64_t T, int64_t C, int64_t pos_offset,
                         kernels::VocabRange vocab) override {
    record("embedding_forward");
    inner_.embedding_forward(out, tokens, wte, wpe, B, T, C, pos_offset, vocab);
  }
  void embedding_backward(float* d_wte, float* d_wpe, const float* d_out, const int32_t* tokens,
                          int64_t B, int64_t T, int64_t C, kernels::VocabRange vocab) override {
    record("embedding_backward");
    inner_.embedding_backward(d_wte, d_wpe, d_out, tokens, B, T, C, vocab);
  }

  void add_inplace(float* accumulator, const float* x, int64_t n) override {
    record("add_inplace");
    inner_.add_inplace(accumulator, x, n);
  }
  void copy(float* out, const float* in, int64_t n) override {
    record("copy");
    inner_.copy(out, in, n);
  }
  void scale_copy(float* out, const float* in, int64_t n, float factor) override {
    record("scale_copy");
    inner_.scale_copy(out, in, n, factor);
  }
  void fill_zero(float* x, int64_t n) override {
    record("fill_zero");
    inner_.fill_zero(x, n);
  }
  void fill(float* x, int64_t n, float value) override {
    record("fill");
    inner_.fill(x, n, value);
  }
  void convert_to_bf16(lattice::bf16* out, const float* in, int64_t n) override {
    record("convert_to_bf16");
    inner_.convert_to_bf16(out, in, n);
  }
  void moe_router_forward(int32_t* experts, float* weights, float* scores, const float* logits,
                          const float* bias, const kernels::RouterShape& shape,
                          const kernels::RouterStatistics& stats) override {
    record("moe_router_forward");
    inner_.moe_router_forward(experts, weights, scores, logits, bias, shape, stats);
  }
  void moe_router_backward(float* d_logits, const float* d_weights, const int32_t* experts,
                           const float* scores, const float* logits,
                           const kernels::RouterShape& shape,
                           const kernels::RouterLossGradients& losses) override {
    record("moe_router_backward");
    inner_.moe_router_backward(d_logits, d_weights, experts, scores, logits, shape, losses);
  }
  void moe_gather(float* out, const float* x, const int32_t* slot_token, int64_t slots,
                  int64_t C) override {
    record("moe_gather");
    inner_.moe_gather(out, x, slot_token, slots, C);
  }
  void moe_gather_backward(float* d_x, const float* d_out, const int32_t* slot_of, int64_t tokens,
                           int64_t top_k, int64_t C) override {
    record("moe_gather_backward");
    inner_.moe_gather_backward(d_x, d_out, slot_of, tokens, top_k, C);
  }
  void moe_combine(float* y, const float* expert_out, const float* weights, const int32_t* slot_of,
                   int64_t tokens, int64_t top_k, int64_t C) override {
    record("moe_combine");
    inner_.moe_combine(y, expert_out, weights, slot_of, tokens, top_k, C);
  }
  void moe_combine_backward(float* d_expert_out, float* d_weights, const float* dy,
                            const float* expert_out, const float* weights, const int32_t* slot_of,
                            int64_t tokens, int64_t top_k, int64_t C) override {
    record("moe_combine_backward");
    inner_.moe_combine_backward(d_expert_out, d_weights, dy, expert_out, weights, slot_of, tokens,
                                top_k, C);
  }
  void convert_to_f32(float* out, const lattice::bf16* in, int64_t n) override {
    record("convert_to_f32");
    inner_.convert_to_f32(out, in, n);
  }

  void adamw_update(std::span<const kernels::AdamWTensor> tensors, int64_t step,
                    float grad_scale) override {
    record("adamw_update");
    inner_.adamw_update(tensors, step, grad_scale);
  }
  double sum_of_squares(std::span<const kernels::FloatRun> runs) override {
    record("sum_of_squares");
    return inner_.sum_of_squares(runs);
  }
  void sum_of_squares_each(std::span<const kernels::FloatRun> runs, double* sums) override {
    record("sum_of_squares_each");
    inner_.sum_of_squares_each(runs, sums);
  }

 private:
  void record(const char* op) const { ++calls_[op]; }

  kernels::CpuOps inner_;
  CountingMemory memory_;
  mutable OpCounts calls_;
  std::vector<int64_t> linear_gelu_rows_;
  mutable std::vector<kernels::HeadLossPlan> head_plans_;
};

}  // namespace lattice::testing
