// The measured MFU bound of a training step: see step_bound.hpp.
#include "lattice/train/step_bound.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "lattice/core/aligned_allocation.hpp"
#include "lattice/core/dtype.hpp"
#include "lattice/core/error.hpp"
#include "lattice/train/metrics.hpp"

namespace lattice::train {

std::vector<BoundGemm> step_linears(const model::ModelConfig& m, int64_t M) {
  const int64_t d = m.d_model, L = m.n_layers;
  const int64_t a = m.attention_width(), qkv = a + 2 * m.n_kv_heads * m.head_dim();
  std::vector<BoundGemm> gemms;
  gemms.push_back({"qkv", M, d, qkv, L});
  gemms.push_back({"attention out", M, a, d, L});
  if (m.gated_mlp()) {
    gemms.push_back({"mlp gate, up", M, d, m.ffn_hidden, 2 * L});
  } else {
    gemms.push_back({"mlp in", M, d, m.ffn_hidden, L});
  }
  gemms.push_back({"mlp out", M, m.ffn_hidden, d, L});
  gemms.push_back({"lm head", M, d, m.vocab_size, 1, /*lm_head=*/true});
  return gemms;
}

namespace {

AlignedVector<float> filled(int64_t n, float scale) {
  AlignedVector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] = scale * static_cast<float>(i % 97 - 48);
  return v;
}

AlignedVector<lattice::bf16> rounded(kernels::Ops& ops, const AlignedVector<float>& v) {
  AlignedVector<lattice::bf16> out(v.size());
  ops.convert_to_bf16(out.data(), v.data(), static_cast<int64_t>(v.size()));
  return out;
}

// Each part's time: its best over at least 3 runs spread over at least 0.2 s (metrics.hpp), so a
// moment when the other core is taken does not halve a small shape's rates.
template <class Run>
double part_seconds(Run&& run) {
  return best_seconds(std::forward<Run>(run), 3, 0.2);
}

void time_linear(BoundGemm& g, const model::ModelConfig& m, kernels::Precision precision,
                 kernels::Ops& ops) {
  const int64_t M = g.M, K = g.K, N = g.N;
  auto in = filled(M * K, 1e-2f), weight = filled(N * K, 1e-3f), d_out = filled(M * N, 1e-4f);
  AlignedVector<float> out(static_cast<size_t>(M * N)), d_in(static_cast<size_t>(M * K));
  AlignedVector<float> d_weight(static_cast<size_t>(N * K)), bias(static_cast<size_t>(N), 0.5f);
  AlignedVector<float> d_bias(static_cast<size_t>(N));
  const bool with_bias = m.linear_bias() && !g.lm_head;
  const bool bf16 = precision == kernels::Precision::bf16;
  AlignedVector<lattice::bf16> in16, weight16, d_out16;
  if (bf16) in16 = rounded(ops, in), weight16 = rounded(ops, weight), d_out16 = rounded(ops, d_out);
  const kernels::HeadLossPlan head =
      bf16 && g.lm_head ? ops.plan_head_loss_bf16(M, K, N, /*with_gradient=*/true,
                                                  kernels::HeadFusion::vocab_blocked)
                        : kernels::HeadLossPlan{};
  if (head.vocab_blocked) {
    // As the step runs such a head (AMX): its forward, cross-entropy and backward in one kernel,
    // timed as the head's whole cost.
    AlignedVector<int32_t> targets(static_cast<size_t>(M));
    for (int64_t r = 0; r < M; ++r) targets[static_cast<size_t>(r)] = static_cast<int32_t>(r % N);
    AlignedVector<float> partials(static_cast<size_t>(head.weight_gradient_partials * N * K));
    g.forward_seconds = part_seconds([&] {
      ops.head_loss_bf16(head, in16.data(), kernels::WeightOperand(weight.data(), weight16.data()),
                         M, K, N, targets.data(), 1.0f / static_cast<float>(M), d_in.data(),
                         partials.data(), nullptr);
    });
    return;
  }
  g.forward_seconds = part_seconds([&] {
    // bf16: the input already rounded (no fp32 input: forward would round it again into keep.in),
    // as the step's Linears take their bf16 rows.
    kernels::Bf16Operands keep;
    if (bf16) keep.in = in16.data(), keep.weight = weight16.data();
    ops.linear_forward(out.data(), bf16 ? nullptr : in.data(), weight.data(),
                       with_bias ? bias.data() : nullptr, M, K, N, precision, keep);
  });
  g.backward_seconds = part_seconds([&] {
    kernels::Bf16Operands given;
    if (bf16) given.in = in16.data(), given.weight = weight16.data(), given.d_out = d_out16.data();
    ops.linear_backward(d_in.data(), d_weight.data(), with_bias ? d_bias.data() : nullptr,
                        d_out.data(), in.data(), weight.data(), M, K, N, precision, given);
  });
}

}  // namespace

double time_optimizer(kernels::Ops& ops, int64_t parameters, bool bf16_copy) {
  check(parameters > 0, "the step bound's optimizer needs a positive parameter count, got " +
                            std::to_string(parameters));
  AlignedVector<float> param = filled(parameters, 1e-3f), grad = filled(parameters, 1e-4f);
  AlignedVector<float> m(static_cast<size_t>(parameters)), v(static_cast<size_t>(parameters));
  AlignedVector<lattice::bf16> param16(bf16_copy ? static_cast<size_t>(parameters) : 0);
  const kernels::AdamWTensor tensor{
      param.data(), grad.data(), m.data(), v.data(), bf16_copy ? param16.data() : nullptr,
      parameters,   {}};
  const kernels::FloatRun gradient{grad.data(), parameters};
  int64_t step = 0;
  return part_seconds([&] {
    const double norm = std::sqrt(ops.sum_of_squares({&gradient, 1}));
    // The clip's scale at max_norm 1, as the step computes it.
    const float scale = norm > 1.0 ? static_cast<float>(1.0 / (norm + 1e-6)) : 1.0f;
    ops.adamw_update({&tensor, 1}, ++step, scale);
  });
}

double time_attention_kernels(const model::ModelConfig& model, int64_t batch, int64_t seq_len,
                              kernels::Precision precision, kernels::Ops& ops) {
  const int64_t D = model.head_dim(), Hq = model.n_heads, Hkv = model.n_kv_heads;
  auto shape = kernels::AttentionShape::contiguous(batch, seq_len, Hq, Hkv, D);
  shape.window = model.sliding_window;
  const int64_t q_size = batch * seq_len * Hq * D, kv_size = batch * seq_len * Hkv * D;
  auto q = filled(q_size, 1e-2f), k = filled(kv_size, 2e-2f), v = filled(kv_size, 1e-2f);
  auto d_out = filled(q_size, 1e-4f);
  AlignedVector<float> out(static_cast<size_t>(q_size));
  AlignedVector<float> lse(static_cast<size_t>(batch * Hq * seq_len));
  if (precision == kernels::Precision::bf16) {
    const auto q16 = rounded(ops, q), k16 = rounded(ops, k), v16 = rounded(ops, v);
    AlignedVector<lattice::bf16> dq(q16.size()), dk(k16.size()), dv(v16.size());
    // With the bias gradient a biased projection (GPT-2's c_attn) takes from the kernel.
    AlignedVector<float> bias_grad(static_cast<size_t>((Hq + 2 * Hkv) * D));
    return part_seconds([&] {
      ops.attention_forward_bf16(out.data(), lse.data(), q16.data(), k16.data(), v16.data(), shape,
                                 {});
      ops.attention_backward_bf16(
          dq.data(), dk.data(), dv.data(), model.linear_bias() ? bias_grad.data() : nullptr,
          d_out.data(), q16.data(), k16.data(), v16.data(), out.data(), lse.data(), shape, {});
    });
  }
  AlignedVector<float> dq(q.size()), dk(k.size()), dv(v.size());
  return part_seconds([&] {
    ops.attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), shape, precision,
                          {});
    ops.attention_backward(dq.data(), dk.data(), dv.data(), d_out.data(), q.data(), k.data(),
                           v.data(), out.data(), lse.data(), shape, precision, {});
  });
}

StepBound measure_step_bound(const model::ModelConfig& model, int64_t batch, int64_t seq_len,
                             kernels::Precision precision, kernels::Ops& ops, double peak_flops) {
  check(model.n_experts == 1,
        "the step bound covers dense models only: use a model without experts (n_experts = 1)");
  check(peak_flops > 0, "the step bound needs the measured GEMM peak (> 0 FLOP/s)");
  StepBound bound;
  const int64_t tokens = batch * seq_len;
  bound.peak_flops = peak_flops;
  bound.model_flops = model.flops_per_token(seq_len) * static_cast<double>(tokens);
  bound.gemms = step_linears(model, tokens);
  for (auto& g : bound.gemms) {
    time_linear(g, model, precision, ops);
    bound.gemm_seconds += static_cast<double>(g.count) * g.seconds();
  }
  bound.attention_flops = 12.0 * static_cast<double>(model.n_layers * seq_len * model.d_model) *
                          static_cast<double>(tokens);
  bound.attention_seconds = bound.attention_flops / peak_flops;
  bound.attention_kernel_seconds = static_cast<double>(model.n_layers) *
                                   time_attention_kernels(model, batch, seq_len, precision, ops);
  // AdamW reads the parameter, its gradient and both moments and writes the parameter and the
  // moments (28 bytes in fp32); the clip reads the gradient once more (4); bf16 training also
  // writes the weights' bf16 copy (2).
  const bool bf16 = precision == kernels::Precision::bf16;
  const double per_parameter = bf16 ? 34.0 : 32.0;
  bound.optimizer_bytes = per_parameter * static_cast<double>(model.parameter_count());
  bound.optimizer_seconds = time_optimizer(ops, model.parameter_count(), bf16);
  return bound;
}

}  // namespace lattice::train
