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
#include "lattice/kernels/cpu/adamw.hpp"
#include "lattice/kernels/cpu/attention.hpp"
#include "lattice/kernels/cpu/convert.hpp"
#include "lattice/kernels/cpu/reduce.hpp"
#include "lattice/train/metrics.hpp"

namespace lattice::train {

std::vector<BoundGemm> step_linears(const model::ModelConfig& m, int64_t M) {
  const int64_t d = m.d_model, L = m.n_layers;
  const int64_t qkv = d + 2 * m.n_kv_heads * m.head_dim();
  std::vector<BoundGemm> gemms;
  gemms.push_back({"qkv", M, d, qkv, L});
  gemms.push_back({"attention out", M, d, d, L});
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

AlignedVector<lattice::bf16> rounded(const AlignedVector<float>& v) {
  AlignedVector<lattice::bf16> out(v.size());
  kernels::convert_to_bf16(out.data(), v.data(), static_cast<int64_t>(v.size()));
  return out;
}

// Each part's time: its best over at least 3 runs spread over at least 0.2 s (metrics.hpp), so a
// moment when the other core is taken does not halve a small shape's rates.
template <class Run>
double part_seconds(Run&& run) {
  return best_seconds(std::forward<Run>(run), 3, 0.2);
}

void time_linear(BoundGemm& g, const model::ModelConfig& m, kernels::Precision precision,
                 kernels::MatmulEngine& matmul) {
  const int64_t M = g.M, K = g.K, N = g.N;
  auto in = filled(M * K, 1e-2f), weight = filled(N * K, 1e-3f), d_out = filled(M * N, 1e-4f);
  AlignedVector<float> out(static_cast<size_t>(M * N)), d_in(static_cast<size_t>(M * K));
  AlignedVector<float> d_weight(static_cast<size_t>(N * K)), bias(static_cast<size_t>(N), 0.5f);
  AlignedVector<float> d_bias(static_cast<size_t>(N));
  const bool with_bias = m.linear_bias() && !g.lm_head;
  const bool bf16 = precision == kernels::Precision::bf16;
  AlignedVector<lattice::bf16> in16, weight16, d_out16;
  if (bf16) in16 = rounded(in), weight16 = rounded(weight), d_out16 = rounded(d_out);
  if (bf16 && g.lm_head && matmul.uses_vocab_blocked_head(K)) {
    // As the step runs the head on AMX: its forward, cross-entropy and backward in one kernel
    // (cpu_fused_ops.cpp's kHeadVocabBlocked), timed as the head's whole cost.
    AlignedVector<int32_t> targets(static_cast<size_t>(M));
    for (int64_t r = 0; r < M; ++r) targets[static_cast<size_t>(r)] = static_cast<int32_t>(r % N);
    const int lanes = kernels::MatmulEngine::vocab_blocked_lanes(M);
    AlignedVector<double> row_losses(static_cast<size_t>(M));
    AlignedVector<float> partials(static_cast<size_t>(lanes * N * K));
    g.forward_seconds = part_seconds([&] {
      matmul.head_cross_entropy_vocab_blocked(
          in16.data(), kernels::WeightOperand(weight.data(), weight16.data()), M, K, N,
          targets.data(), 1.0f / static_cast<float>(M), row_losses.data(), d_in.data(),
          partials.data(), lanes);
    });
    return;
  }
  g.forward_seconds = part_seconds([&] {
    // bf16: the input already rounded (no fp32 input: forward would round it again into keep.in),
    // as the step's Linears take their bf16 rows.
    kernels::Bf16Operands keep;
    if (bf16) keep.in = in16.data(), keep.weight = weight16.data();
    matmul.forward(out.data(), bf16 ? nullptr : in.data(), weight.data(),
                   with_bias ? bias.data() : nullptr, M, K, N, precision, keep);
  });
  g.backward_seconds = part_seconds([&] {
    kernels::Bf16Operands given;
    if (bf16) given.in = in16.data(), given.weight = weight16.data(), given.d_out = d_out16.data();
    matmul.backward(d_in.data(), d_weight.data(), with_bias ? d_bias.data() : nullptr, d_out.data(),
                    in.data(), weight.data(), M, K, N, precision, given);
  });
}

}  // namespace

double time_optimizer(int64_t parameters, bool bf16_copy) {
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
    const double norm = std::sqrt(kernels::sum_of_squares_of_runs({&gradient, 1}));
    // The clip's scale at max_norm 1, as the step computes it.
    const float scale = norm > 1.0 ? static_cast<float>(1.0 / (norm + 1e-6)) : 1.0f;
    kernels::adamw_update_tensors({&tensor, 1}, ++step, scale);
  });
}

double time_attention_kernels(const model::ModelConfig& model, int64_t batch, int64_t seq_len,
                              kernels::Precision precision, kernels::MatmulEngine& matmul) {
  const int64_t D = model.head_dim(), Hq = model.n_heads, Hkv = model.n_kv_heads;
  const auto shape = kernels::AttentionShape::contiguous(batch, seq_len, Hq, Hkv, D);
  const int64_t q_size = batch * seq_len * Hq * D, kv_size = batch * seq_len * Hkv * D;
  auto q = filled(q_size, 1e-2f), k = filled(kv_size, 2e-2f), v = filled(kv_size, 1e-2f);
  auto d_out = filled(q_size, 1e-4f);
  AlignedVector<float> out(static_cast<size_t>(q_size));
  AlignedVector<float> lse(static_cast<size_t>(batch * Hq * seq_len));
  if (precision == kernels::Precision::bf16) {
    const auto q16 = rounded(q), k16 = rounded(k), v16 = rounded(v);
    AlignedVector<lattice::bf16> dq(q16.size()), dk(k16.size()), dv(v16.size());
    // With the column sums a biased projection (GPT-2's c_attn) takes from the kernel.
    AlignedVector<double> sums(static_cast<size_t>(batch * (Hq + 2 * Hkv) * D));
    kernels::AttentionGradientsBf16 grads{dq.data(), dk.data(), dv.data()};
    if (model.linear_bias()) {
      grads.dq_sums = sums.data();
      grads.dk_sums = grads.dq_sums + Hq * D;
      grads.dv_sums = grads.dk_sums + Hkv * D;
      grads.sums_batch_stride = (Hq + 2 * Hkv) * D;
    }
    return part_seconds([&] {
      kernels::attention_forward_bf16(out.data(), lse.data(), q16.data(), k16.data(), v16.data(),
                                      shape);
      kernels::attention_backward_bf16(grads, d_out.data(), q16.data(), k16.data(), v16.data(),
                                       out.data(), lse.data(), shape);
    });
  }
  AlignedVector<float> dq(q.size()), dk(k.size()), dv(v.size());
  return part_seconds([&] {
    kernels::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), shape,
                               precision, matmul);
    kernels::attention_backward(dq.data(), dk.data(), dv.data(), d_out.data(), q.data(), k.data(),
                                v.data(), out.data(), lse.data(), shape, precision, matmul);
  });
}

StepBound measure_step_bound(const model::ModelConfig& model, int64_t batch, int64_t seq_len,
                             kernels::Precision precision, kernels::MatmulEngine& matmul,
                             double peak_flops) {
  check(model.n_experts == 1,
        "the step bound covers dense models only: use a model without experts (n_experts = 1)");
  check(peak_flops > 0, "the step bound needs the measured GEMM peak (> 0 FLOP/s)");
  StepBound bound;
  const int64_t tokens = batch * seq_len;
  bound.peak_flops = peak_flops;
  bound.model_flops = model.flops_per_token(seq_len) * static_cast<double>(tokens);
  bound.gemms = step_linears(model, tokens);
  for (auto& g : bound.gemms) {
    time_linear(g, model, precision, matmul);
    bound.gemm_seconds += static_cast<double>(g.count) * g.seconds();
  }
  bound.attention_flops = 12.0 * static_cast<double>(model.n_layers * seq_len * model.d_model) *
                          static_cast<double>(tokens);
  bound.attention_seconds = bound.attention_flops / peak_flops;
  bound.attention_kernel_seconds = static_cast<double>(model.n_layers) *
                                   time_attention_kernels(model, batch, seq_len, precision, matmul);
  // AdamW reads the parameter, its gradient and both moments and writes the parameter and the
  // moments (28 bytes in fp32); the clip reads the gradient once more (4); bf16 training also
  // writes the weights' bf16 copy (2).
  const bool bf16 = precision == kernels::Precision::bf16;
  const double per_parameter = bf16 ? 34.0 : 32.0;
  bound.optimizer_bytes = per_parameter * static_cast<double>(model.parameter_count());
  bound.optimizer_seconds = time_optimizer(model.parameter_count(), bf16);
  return bound;
}

}  // namespace lattice::train
