// The CPU backend of the kernel interface (kernels/ops.hpp): GEMMs on oneDNN and Lattice's AMX
// kernels through a MatmulEngine, everything else on Lattice's own kernels, each choosing AVX2,
// AVX-512 or AMX code at run time from CPUID (core/cpu_features.hpp). Its execution strategy is
// its own: OpenMP thread lanes, row chunks of kChunkRows that keep a GEMM's output in L2 while the
// fused epilogue (bf16 rounding, GELU, the loss) reads it, and the order of every partial sum,
// fixed so that results do not depend on the thread count. One instance per rank (it holds the
// engine's primitive cache and scratch); cpu_ops.cpp forwards the plain ops, cpu_fused_ops.cpp
// holds the fused bf16 ones.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lattice/kernels/cpu/matmul.hpp"
#include "lattice/kernels/ops.hpp"

namespace lattice::kernels {

class CpuOps final : public Ops {
 public:
  // Rows per chunk of the fused bf16 Linears: a chunk's fp32 output stays in L2 while its epilogue
  // reads it (256 rows of GPT-2 124M's 2,304-wide qkv are 2.3 MB).
  static constexpr int64_t kChunkRows = 256;

  explicit CpuOps(const MatmulOptions& options);
  // The environment's documented settings (MatmulOptions::from_environment), with `bf16_fallback`
  // instead where it is not automatic: how the command line and the tests build backends.
  explicit CpuOps(Bf16FallbackGemm bf16_fallback = Bf16FallbackGemm::automatic);
  ~CpuOps() override;
  CpuOps(const CpuOps&) = delete;
  CpuOps& operator=(const CpuOps&) = delete;

  // The GEMM engine (for the CPU-only questions: where bf16 products run, the peak calibration).
  MatmulEngine& engine() { return *engine_; }
  const MatmulEngine& engine() const { return *engine_; }

  Device device() const override { return Device::cpu; }
  std::string describe() const override;
  std::string describe_bf16() const override;
  bool bf16_on_fp32_units() const override;
  int64_t scratch_bytes() const override;
  // Host memory: aligned_allocation.hpp's 64-byte-aligned blocks.
  DeviceMemory& memory() override { return host_memory(); }

  void linear_forward(float* out, const float* in, const float* weight, const float* bias,
                      int64_t M, int64_t K, int64_t N, Precision precision,
                      const Bf16Operands& keep) override;
  void linear_backward(float* d_in, float* d_weight, float* d_bias, const float* d_out,
                       const float* in, const float* weight, int64_t M, int64_t K, int64_t N,
                       Precision precision, const Bf16Operands& rounded) override;
  void linear_forward_to_bf16(lattice::bf16* out16, const lattice::bf16* in16, WeightOperand weight,
                              const float* bias, int64_t M, int64_t K, int64_t N) override;
  void linear_gelu_forward_bf16(lattice::bf16* gelu16, lattice::bf16* slope16,
                                const lattice::bf16* in16, WeightOperand weight, const float* bias,
                                int64_t M, int64_t K, int64_t N) override;
  void linear_backward_input_through_gelu_bf16(lattice::bf16* d_pre16, float* pre_bias_grad,
                                               const lattice::bf16* d_out16, WeightOperand weight,
                                               const lattice::bf16* slope16, int64_t M, int64_t K,
                                               int64_t N) override;
  void round_with_column_sums(lattice::bf16* d_out16, float* d_bias, const float* d_out, int64_t M,
                              int64_t N) override;

  double cross_entropy_forward(const float* logits, const int32_t* targets, int64_t rows,
                               int64_t V) override;
  double cross_entropy_forward_backward(float* d_logits, const float* logits,
                                        const int32_t* targets, int64_t rows, int64_t V,
                                        float grad_scale) override;
  HeadLossPlan plan_head_loss_bf16(int64_t rows, int64_t K, int64_t V, bool with_gradient,
                                   HeadFusion fusion) const override;
  double head_loss_bf16(const HeadLossPlan& plan, const lattice::bf16* in16, WeightOperand weight,
                        int64_t rows, int64_t K, int64_t V, const int32_t* targets,
                        float grad_scale, float* d_in, float* weight_grad_partials,
                        lattice::bf16* d_logits16) override;
  void vocab_slice_row_max(float* row_max, const float* logits, int64_t rows, int64_t V_local,
                           int64_t valid) override;
  void vocab_slice_row_sums(float* row_sum, float* target_logit, const float* logits,
                            const float* row_max, const int32_t* targets, int64_t rows,
                            int64_t V_local, int64_t valid, VocabRange vocab) override;
  double vocab_slice_loss(float* d_logits, const float* logits, const float* row_max,
                          const float* row_sum, const float* target_logit, const int32_t* targets,
                          int64_t rows, int64_t V_local, int64_t valid, VocabRange vocab,
                          float grad_scale) override;
  void add_partials(float* accumulator, const float* partials, int64_t count, int64_t numel,
                    int64_t stride) override;

  void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                         const AttentionShape& shape, Precision precision,
                         const AttentionOptions& options) override;
  void attention_backward(float* dq, float* dk, float* dv, const float* d_out, const float* q,
                          const float* k, const float* v, const float* out, const float* lse,
                          const AttentionShape& shape, Precision precision,
                          const AttentionOptions& options) override;
  void attention_forward_bf16(float* out, float* lse, const lattice::bf16* q,
                              const lattice::bf16* k, const lattice::bf16* v,
                              const AttentionShape& shape,
                              const AttentionOptions& options) override;
  void attention_backward_bf16(lattice::bf16* dq, lattice::bf16* dk, lattice::bf16* dv,
                               float* qkv_bias_grad, const float* d_out, const lattice::bf16* q,
                               const lattice::bf16* k, const lattice::bf16* v, const float* out,
                               const float* lse, const AttentionShape& shape,
                               const AttentionOptions& options) override;
  void attention_merge_partial(float* out, float* lse, const float* part_out, const float* part_lse,
                               int64_t batch, int64_t q_len, int64_t q_heads,
                               int64_t head_dim) override;

  void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* weight,
                         const float* bias, int64_t rows, int64_t C, float eps) override;
  void layernorm_forward_bf16(lattice::bf16* out, float* mean, float* rstd, const float* in,
                              const float* weight, const float* bias, int64_t rows, int64_t C,
                              float eps) override;
  void layernorm_backward(float* d_in, float* d_weight, float* d_bias, const float* d_out,
                          const float* in, const float* weight, const float* mean,
                          const float* rstd, int64_t rows, int64_t C,
                          const float* residual_grad) override;
  void rmsnorm_forward(float* out, float* rstd, const float* in, const float* weight, int64_t rows,
                       int64_t C, float eps) override;
  void rmsnorm_forward_bf16(lattice::bf16* out, float* rstd, const float* in, const float* weight,
                            int64_t rows, int64_t C, float eps) override;
  void rmsnorm_backward(float* d_in, float* d_weight, const float* d_out, const float* in,
                        const float* weight, const float* rstd, int64_t rows, int64_t C,
                        const float* residual_grad) override;

  void gelu_forward(float* out, const float* in, int64_t n) override;
  void gelu_backward(float* d_in, const float* d_out, const float* in, int64_t n) override;
  void swiglu_forward(float* out, const float* gate, const float* up, int64_t n) override;
  void swiglu_backward(float* d_gate, float* d_up, const float* d_out, const float* gate,
                       const float* up, int64_t n) override;
  void rope(const RopeTable& table, float* x, int64_t batch, int64_t seq, int64_t heads,
            int64_t row_stride, int64_t batch_stride, int64_t pos_offset, bool inverse) override;

  void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                         int64_t B, int64_t T, int64_t C, int64_t pos_offset,
                         VocabRange vocab) override;
  void embedding_backward(float* d_wte, float* d_wpe, const float* d_out, const int32_t* tokens,
                          int64_t B, int64_t T, int64_t C, VocabRange vocab) override;

  void add_inplace(float* accumulator, const float* x, int64_t n) override;
  void copy(float* out, const float* in, int64_t n) override;
  void scale_copy(float* out, const float* in, int64_t n, float factor) override;
  void fill_zero(float* x, int64_t n) override;
  void fill(float* x, int64_t n, float value) override;
  void convert_to_bf16(lattice::bf16* out, const float* in, int64_t n) override;
  void convert_to_f32(float* out, const lattice::bf16* in, int64_t n) override;
  void moe_router_forward(int32_t* experts, float* weights, float* scores, const float* logits,
                          const float* bias, const RouterShape& shape,
                          const RouterStatistics& stats) override;
  void moe_router_backward(float* d_logits, const float* d_weights, const int32_t* experts,
                           const float* scores, const float* logits, const RouterShape& shape,
                           const RouterLossGradients& losses) override;
  void moe_gather(float* out, const float* x, const int32_t* slot_token, int64_t slots,
                  int64_t C) override;
  void moe_gather_backward(float* d_x, const float* d_out, const int32_t* slot_of, int64_t tokens,
                           int64_t top_k, int64_t C) override;
  void moe_combine(float* y, const float* expert_out, const float* weights, const int32_t* slot_of,
                   int64_t tokens, int64_t top_k, int64_t C) override;
  void moe_combine_backward(float* d_expert_out, float* d_weights, const float* dy,
                            const float* expert_out, const float* weights, const int32_t* slot_of,
                            int64_t tokens, int64_t top_k, int64_t C) override;

  void adamw_update(std::span<const AdamWTensor> tensors, int64_t step, float grad_scale) override;
  double sum_of_squares(std::span<const FloatRun> runs) override;
  void sum_of_squares_each(std::span<const FloatRun> runs, double* sums) override;

 private:
  std::unique_ptr<MatmulEngine> engine_;
  // Fused ops' scratch: the fp32 pre-activation of a GELU Linear too small to chunk (fewer than
  // kChunkRows rows: one multi-threaded GEMM), and the per-part column sums (double) a bias
  // gradient is added up from in a fixed order.
  Tensor pre_activation_;  // fp32, 64-byte aligned
  std::vector<double> column_sums_;
};

}  // namespace lattice::kernels
