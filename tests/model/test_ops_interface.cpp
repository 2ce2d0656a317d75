// Tests of the kernel seam (kernels/ops.hpp): a second implementation of kernels::Ops, one that
// records every call and forwards it to a CpuOps, runs GPT-2 and Llama through their stage forward
// and backward with no change to the model and gives the plain CpuOps run's loss and gradients
// bit for bit; and the ops it records are every op each model's layers must compute, called as
// often as its blocks require (a layer computing outside the interface would drop a call).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "lattice/core/rng.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/model/transformer.hpp"

using namespace lattice;
using namespace lattice::model;
using kernels::Precision;

namespace {

using OpCounts = std::map<std::string, int>;

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
  int64_t scratch_bytes() const override { return inner_.scratch_bytes(); }

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
  void fill_zero(float* x, int64_t n) override {
    record("fill_zero");
    inner_.fill_zero(x, n);
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
  mutable OpCounts calls_;
  std::vector<int64_t> linear_gelu_rows_;
  mutable std::vector<kernels::HeadLossPlan> head_plans_;
};

// Tiny models with three blocks: per-block counts (3 per block) differ from the embedding's and
// the head's single calls.
ModelConfig tiny(Family family) {
  ModelConfig c = model_preset(family == Family::gpt2 ? "gpt2-tiny" : "llama-tiny");
  c.n_layers = 3;
  c.init_std = 0.2f;  // weights large enough that every gradient term is visible
  return c;
}
constexpr int64_t kT = 32;  // the tiny presets' whole context

struct Batch {
  std::vector<int32_t> tokens, targets;
};

Batch random_batch(int64_t rows, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  Batch b;
  for (int64_t i = 0; i < rows; ++i) {
    b.tokens.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab))));
    b.targets.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab))));
  }
  b.targets[2] = -1;  // an ignored target
  return b;
}

// One whole-model forward_stage and backward_stage on `ops`: the loss and every gradient, and,
// when `recorder` is `ops`, the ops each half called.
struct StageRun {
  float loss = 0.0f;
  std::vector<float> grads;
  OpCounts forward_calls, backward_calls;
};

// The calls in `after` that were not yet in `before`.
OpCounts calls_since(const OpCounts& before, const OpCounts& after) {
  OpCounts d;
  for (const auto& [op, n] : after) {
    const auto it = before.find(op);
    const int delta = n - (it == before.end() ? 0 : it->second);
    if (delta > 0) d[op] = delta;
  }
  return d;
}

StageRun run_stage(kernels::Ops& ops, const RecordingOps* recorder, Family family,
                   Precision precision, int64_t B,
                   std::optional<HeadFusion> fusion = std::nullopt) {
  const ModelConfig config = tiny(family);
  const Batch batch = random_batch(B * kT, config.vocab_size, 11);
  const LayerContext ctx{ops, precision, nullptr};
  Transformer model(config, nullptr);
  if (fusion) model.set_head_fusion(*fusion);
  model.initialize(7);
  model.parameters().zero_grads();
  StageRun r;
  const OpCounts before = recorder ? recorder->calls() : OpCounts{};
  r.loss =
      model.forward_stage(ctx, batch.tokens.data(), nullptr, batch.targets.data(), B, kT, 0.5f);
  const OpCounts after_forward = recorder ? recorder->calls() : OpCounts{};
  model.backward_stage(ctx, nullptr);
  if (recorder) {
    r.forward_calls = calls_since(before, after_forward);
    r.backward_calls = calls_since(after_forward, recorder->calls());
  }
  const ParameterStore& params = model.parameters();
  r.grads.assign(params.grads(), params.grads() + params.size());
  return r;
}

void expect_same_bits(const StageRun& recorded, const StageRun& plain) {
  EXPECT_EQ(0, std::memcmp(&recorded.loss, &plain.loss, sizeof(float)))
      << recorded.loss << " vs " << plain.loss;
  ASSERT_EQ(recorded.grads.size(), plain.grads.size());
  EXPECT_EQ(0, std::memcmp(recorded.grads.data(), plain.grads.data(),
                           sizeof(float) * plain.grads.size()));
  int64_t nonzero = 0;
  for (float g : plain.grads) nonzero += g != 0.0f;
  EXPECT_GT(nonzero, static_cast<int64_t>(plain.grads.size()) / 2);  // a real backward ran
}

// The ops one forward (or one backward) of a whole model of L blocks calls, each as often as it
// must: per block, per norm, per Linear (GPT-2: c_attn, attn.c_proj, c_fc, mlp.c_proj; Llama: q,
// k, v, o, gate, up, down), once for the embedding and once for the head. bf16 training runs the
// LM head and its loss as head_loss_bf16; its backward then adds the weight-gradient partials
// (head_backward_in_forward, the backend's plan) or is the head's linear_backward.
OpCounts expected_calls(Family family, Precision precision, int L, bool forward,
                        bool head_backward_in_forward) {
  const bool bf16 = precision == Precision::bf16;
  OpCounts c;
  if (family == Family::gpt2) {
    if (forward) {
      c["embedding_forward"] = 1;
      c["add_inplace"] = 2 * L;  // the two residual adds
      if (bf16) {
        c["layernorm_forward_bf16"] = 2 * L + 1;  // ln_1, ln_2, ln_f write the GEMMs' bf16 input
        c["linear_forward_to_bf16"] = L;          // c_attn: q, k, v in bf16
        c["attention_forward_bf16"] = L;
        c["linear_forward"] = 2 * L;        // attn.c_proj, mlp.c_proj
        c["linear_gelu_forward_bf16"] = L;  // c_fc and the GELU
        c["plan_head_loss_bf16"] = 1;
        c["head_loss_bf16"] = 1;
      } else {
        c["layernorm_forward"] = 2 * L + 1;
        c["linear_forward"] = 4 * L + 1;
        c["attention_forward"] = L;
        c["gelu_forward"] = L;
        c["cross_entropy_forward_backward"] = 1;
      }
    } else {
      c["embedding_backward"] = 1;
      c["layernorm_backward"] = 2 * L + 1;  // the residual gradient added in the same pass
      if (bf16) {
        c["linear_backward"] = 4 * L + (head_backward_in_forward ? 0 : 1);
        if (head_backward_in_forward) c["add_partials"] = 1;
        c["linear_backward_input_through_gelu_bf16"] = L;  // mlp.c_proj's input through the GELU
        c["round_with_column_sums"] = L;                   // attn.c_proj's d_out and bias
        c["attention_backward_bf16"] = L;
      } else {
        c["linear_backward"] = 4 * L + 1;
        c["attention_backward"] = L;
        c["gelu_backward"] = L;
      }
    }
    return c;
  }
  // Llama: attention in bf16 is attention_forward / backward at Precision::bf16 (fp32 q, k, v
  // after RoPE), and SwiGLU is fp32 in both precisions.
  if (forward) {
    c["embedding_forward"] = 1;
    c["rmsnorm_forward"] = 2 * L + 1;
    c["linear_forward"] = 7 * L + (bf16 ? 0 : 1);
    c["rope"] = 2 * L;  // q and k
    c["attention_forward"] = L;
    c["swiglu_forward"] = L;
    c["add_inplace"] = 2 * L;
    if (bf16) {
      c["convert_to_bf16"] = 1;  // the final norm's output, the head's input
      c["plan_head_loss_bf16"] = 1;
      c["head_loss_bf16"] = 1;
    } else {
      c["cross_entropy_forward_backward"] = 1;
    }
  } else {
    c["embedding_backward"] = 1;
    c["rmsnorm_backward"] = 2 * L + 1;
    c["linear_backward"] = 7 * L + (bf16 && head_backward_in_forward ? 0 : 1);
    if (bf16 && head_backward_in_forward) c["add_partials"] = 1;
    c["rope(inverse)"] = 2 * L;
    c["attention_backward"] = L;
    c["swiglu_backward"] = L;
    c["add_inplace"] = 3 * L;  // the input gradients of q, k, v and of gate, up summed
  }
  return c;
}

std::string listing(const OpCounts& calls) {
  std::string s;
  for (const auto& [op, n] : calls) s += "  " + op + " x" + std::to_string(n) + "\n";
  return s;
}

void expect_calls(const OpCounts& recorded, const OpCounts& expected, const char* phase) {
  EXPECT_EQ(recorded, expected) << phase << " recorded:\n"
                                << listing(recorded) << "expected:\n"
                                << listing(expected);
}

// (family, precision, B): T = 32, so B = 9 gives 288 rows (CpuOps's fused bf16 Linears in
// 256-row chunks and a tail) and B = 2 gives 64 (fewer than a chunk: the unchunked path).
using Case = std::tuple<Family, Precision, int64_t>;

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const auto [family, precision, B] = info.param;
  return std::string(family == Family::gpt2 ? "gpt2" : "llama") + "_" +
         (precision == Precision::bf16 ? "bf16" : "fp32") + "_rows" + std::to_string(B * kT);
}

}  // namespace

class OpsInterface : public ::testing::TestWithParam<Case> {};

TEST_P(OpsInterface, ARecordingBackendGivesTheCpuBackendsLossAndGradientsBitForBit) {
  // The model sees only kernels::Ops: another class behind it computes the same bits, which
  // would not hold if a layer depended on the CPU backend's concrete type or state.
  const auto [family, precision, B] = GetParam();
  kernels::CpuOps plain_ops;
  RecordingOps recording;
  const StageRun plain = run_stage(plain_ops, nullptr, family, precision, B);
  const StageRun recorded = run_stage(recording, &recording, family, precision, B);
  expect_same_bits(recorded, plain);
}

TEST_P(OpsInterface, EveryLayerComputesThroughTheInterface) {
  const auto [family, precision, B] = GetParam();
  RecordingOps recording;
  const StageRun r = run_stage(recording, &recording, family, precision, B);
  const int L = static_cast<int>(tiny(family).n_layers);
  bool head_backward_in_forward = false;
  if (precision == Precision::bf16) {
    ASSERT_EQ(recording.head_plans().size(), 1u);
    head_backward_in_forward = recording.head_plans()[0].backward_in_forward;
  }
  expect_calls(r.forward_calls,
               expected_calls(family, precision, L, true, head_backward_in_forward), "forward");
  expect_calls(r.backward_calls,
               expected_calls(family, precision, L, false, head_backward_in_forward), "backward");
  // GPT-2's bf16 MLP hands the backend all its rows at once: chunked (>= kChunkRows rows) or
  // not is the backend's choice, and both cases run here.
  for (int64_t rows : recording.linear_gelu_rows()) EXPECT_EQ(rows, B * kT);
  if (family == Family::gpt2 && precision == Precision::bf16) {
    EXPECT_EQ(recording.linear_gelu_rows().size(), static_cast<size_t>(L));
    // The cases straddle CpuOps's chunk: B = 9 at least one chunk of rows, B = 2 fewer.
    EXPECT_EQ(B * kT >= kernels::CpuOps::kChunkRows, B == 9);
  }
}

INSTANTIATE_TEST_SUITE_P(FamiliesPrecisionsAndRows, OpsInterface,
                         ::testing::Combine(::testing::Values(Family::gpt2, Family::llama),
                                            ::testing::Values(Precision::fp32, Precision::bf16),
                                            ::testing::Values(int64_t{9}, int64_t{2})),
                         case_name);

TEST(OpsInterfaceBf16Head, BothPlansComputeThroughTheInterface) {
  // The LM head's backward inside its forward (add_partials in backward) and after it (the
  // head's linear_backward on the stored bf16 logits' gradient), each chosen explicitly.
  for (Family family : {Family::gpt2, Family::llama}) {
    for (HeadFusion fusion : {HeadFusion::always, HeadFusion::never}) {
      SCOPED_TRACE(std::string(family == Family::gpt2 ? "gpt2" : "llama") +
                   (fusion == HeadFusion::always ? " always" : " never"));
      kernels::CpuOps plain_ops;
      RecordingOps recording;
      const StageRun plain = run_stage(plain_ops, nullptr, family, Precision::bf16, 9, fusion);
      const StageRun recorded =
          run_stage(recording, &recording, family, Precision::bf16, 9, fusion);
      expect_same_bits(recorded, plain);
      ASSERT_EQ(recording.head_plans().size(), 1u);
      const bool in_forward = fusion == HeadFusion::always;
      EXPECT_EQ(recording.head_plans()[0].backward_in_forward, in_forward);
      const int L = static_cast<int>(tiny(family).n_layers);
      expect_calls(recorded.forward_calls,
                   expected_calls(family, Precision::bf16, L, true, in_forward), "forward");
      expect_calls(recorded.backward_calls,
                   expected_calls(family, Precision::bf16, L, false, in_forward), "backward");
    }
  }
}
