// PyTorch parity of the single-rank engine: from the same initial weights and batch, Lattice's
// logits, loss, every parameter gradient and the losses of 10 AdamW steps (clipping, weight decay)
// equal those of the PyTorch models in tests/reference/lattice_torch.py, in fp32 and in bf16
// (against PyTorch's bf16 autocast). The committed references live in tests/reference/data
// (regenerated as tests/reference/README.md says); when /usr/bin/python3 has torch, a second test
// regenerates a reference from freshly initialised weights and compares again.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lattice/core/rng.hpp"
#include "lattice/io/safetensors.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/model/model_config_json.hpp"
#include "lattice/model/transformer.hpp"
#include "lattice/optim/adamw_optimizer.hpp"

using namespace lattice;
using namespace lattice::model;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kBatch = 2, kSeq = 16;
const char* const kPython = "/usr/bin/python3";

fs::path reference_dir() {
  return fs::path(LATTICE_REFERENCE_DIR);
}
fs::path committed_data_dir() {
  return reference_dir() / "data";
}

// ---- model config as the "lattice.model" JSON (the keys checkpoint.cpp writes) ----

// ---- the inputs: initial weights and one batch ----

struct Batch {
  std::vector<int32_t> tokens, targets;
};

Batch make_batch(int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  Batch b;
  for (int64_t i = 0; i < kBatch * kSeq; ++i) {
    b.tokens.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab))));
    b.targets.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab))));
  }
  b.targets[3] = -1;  // one ignored target: both sides average over the 31 counted ones
  return b;
}

std::string init_file(const fs::path& dir, const std::string& family) {
  return (dir / (family + "_init.safetensors")).string();
}
std::string batch_file(const fs::path& dir, const std::string& family) {
  return (dir / (family + "_batch.safetensors")).string();
}
std::string reference_file(const fs::path& dir, const std::string& family) {
  return (dir / (family + "_reference.safetensors")).string();
}

// Writes the engine's initial weights (Transformer::initialize(seed)) with the config as metadata,
// and a batch drawn from `seed`.
void write_inputs(const fs::path& dir, const std::string& family, const ModelConfig& config,
                  uint64_t seed) {
  fs::create_directories(dir);
  Transformer model(config, nullptr);
  model.initialize(seed);
  std::vector<SafetensorsEntry> weights;
  const auto& params = model.parameters();
  for (const auto& p : params.parameters()) {
    SafetensorsEntry e;
    e.name = p.name;
    e.dtype = DType::f32;
    e.shape = p.shape;
    e.data = params.values() + p.offset;
    e.nbytes = static_cast<size_t>(p.numel) * sizeof(float);
    weights.push_back(std::move(e));
  }
  write_safetensors(init_file(dir, family), weights,
                    {{"format", "lattice"},
                     {"lattice.model", model_config_to_json(config)},
                     {"lattice.init_seed", std::to_string(seed)}});
  const Batch b = make_batch(config.vocab_size, seed + 1);
  const Shape shape{kBatch, kSeq};
  write_safetensors(batch_file(dir, family),
                    {SafetensorsEntry{"tokens", DType::i32, shape, b.tokens.data(),
                                      b.tokens.size() * sizeof(int32_t), 0},
                     SafetensorsEntry{"targets", DType::i32, shape, b.targets.data(),
                                      b.targets.size() * sizeof(int32_t), 0}});
}

bool torch_available() {
  return std::system((std::string(kPython) + " -c 'import torch' > /dev/null 2>&1").c_str()) == 0;
}

// Runs make_reference.py on the inputs in `dir`; returns its exit status (output in <family>.log).
int run_make_reference(const fs::path& dir, const std::string& family) {
  const std::string command = std::string(kPython) + " " +
                              (reference_dir() / "make_reference.py").string() + " --weights " +
                              init_file(dir, family) + " --batch " + batch_file(dir, family) +
                              " --out " + reference_file(dir, family) + " > " +
                              (dir / (family + "_make_reference.log")).string() + " 2>&1";
  return std::system(command.c_str());
}

// ---- comparison ----

// Error of `got` against `want`: max|got - want| / max|want| over the tensor (the figure the
// tolerances bound), and the worst relative error of one element among those at least 1% of the
// tensor's largest magnitude (reported; smaller elements have no meaningful relative error).
struct ErrorStats {
  double relative_to_max = 0;
  double worst_element = 0;
};

ErrorStats compare(const float* got, const float* want, int64_t n) {
  double max_want = 0, max_diff = 0;
  for (int64_t i = 0; i < n; ++i) {
    max_want = std::max(max_want, std::fabs(static_cast<double>(want[i])));
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(got[i]) - want[i]));
  }
  ErrorStats s;
  s.relative_to_max = max_want > 0 ? max_diff / max_want : max_diff;
  for (int64_t i = 0; i < n; ++i) {
    const double w = std::fabs(static_cast<double>(want[i]));
    if (w > 0 && w >= 0.01 * max_want)
      s.worst_element = std::max(s.worst_element, std::fabs(got[i] - want[i]) / w);
  }
  return s;
}

// Bounds on max|a - b| / max|b| per quantity; gradient_l2 bounds ||a - b|| / ||b|| over all
// gradients at once (a few flipped bf16 roundings move single elements, not the whole vector).
struct Tolerances {
  double logits, loss, gradient, gradient_l2, step_losses, grad_norms;
};

std::vector<float> read_tensor(const SafetensorsFile& file, const std::string& name) {
  const auto& e = file.entry(name);
  std::vector<float> values(static_cast<size_t>(shape_numel(e.shape)));
  file.read_f32(name, values.data(), static_cast<int64_t>(values.size()));
  return values;
}

Batch read_batch(const std::string& path) {
  SafetensorsFile file(path);
  Batch b;
  for (auto [name, dst] : {std::pair{"tokens", &b.tokens}, std::pair{"targets", &b.targets}}) {
    Tensor t = file.read(name);
    EXPECT_EQ(t.numel(), kBatch * kSeq) << name;
    dst->assign(t.data<int32_t>(), t.data<int32_t>() + t.numel());
  }
  return b;
}

void load_weights(Transformer& model, const std::string& path) {
  SafetensorsFile file(path);
  auto& params = model.parameters();
  for (const auto& p : params.parameters())
    file.read_f32(p.name, params.mutable_values() + p.offset, p.numel);
}

void print_stats(const std::string& what, const ErrorStats& s) {
  std::printf("  %-58s rel-to-max %.3e  worst element %.3e\n", what.c_str(), s.relative_to_max,
              s.worst_element);
}

// Which PyTorch run a Lattice run is compared with.
enum class TorchRun {
  fp32,
  bf16_autocast,
  lattice_bf16_emulation,  // lattice_torch.LATTICE_BF16_OPS: Lattice's bf16 rounding in PyTorch
};

std::string torch_run_name(TorchRun run) {
  switch (run) {
    case TorchRun::fp32:
      return "fp32";
    case TorchRun::bf16_autocast:
      return "bf16 autocast";
    case TorchRun::lattice_bf16_emulation:
      return "emulated lattice bf16";
  }
  return "?";
}

std::string torch_run_prefix(TorchRun run) {
  switch (run) {
    case TorchRun::fp32:
      return "";
    case TorchRun::bf16_autocast:
      return "bf16/";
    case TorchRun::lattice_bf16_emulation:
      return "lattice_bf16/";
  }
  return "?";
}

// A MoE model's routing is discontinuous: in bf16 a token whose top-k scores are close goes to
// another expert (or, with a capacity, another copy is dropped) as soon as the runs differ by a
// rounding, and from then on they part by more than rounding. Against the emulation that starts
// once the training steps have moved the weights and a bf16 rounding flips by summation order
// (measured on the committed data, init_std 0.2: step losses within 2e-4 up to step 3, then up to
// 5e-3 dropless and 6e-2 with drops by step 9); against fp32 with drops, in the first step already
// (step 2's loss 1.1e-2). So in bf16 only the first step — the initial weights' loss and gradient
// norm, with the logits and every gradient above — is held to the bounds; later steps are
// printed. fp32 holds every step.
constexpr int64_t kMoeBf16Steps = 1;

// MoE in bf16 against autocast and against fp32: their roundings differ from Lattice's in other
// places, and a token whose top-k scores are that close goes to another expert already in the
// first forward (committed mixtral_gelu: one such token moves the logits by 0.1 and the layer-1
// router's gradient by 0.36 against autocast, while against the emulation of Lattice's rounding
// the logits agree exactly). So for MoE models these two comparisons are printed, not held; the
// emulation (kBf16Emulated) is the bf16 check, and fp32 the exact one.
constexpr double kUnheld = 1e30;
constexpr Tolerances kMoeBf16Printed{kUnheld, kUnheld, kUnheld, kUnheld, kUnheld, kUnheld};

// kBf16 for dense models, kMoeBf16Printed for MoE ones.
const Tolerances& bf16_bounds(const std::string& family);

// Loads the inputs and the reference in `dir` and checks every quantity of Lattice at `precision`
// against the PyTorch run `against`.
void check_parity(const fs::path& dir, const std::string& family, kernels::Precision precision,
                  TorchRun against, const Tolerances& tol) {
  const std::string title = family + ": lattice " +
                            std::string(kernels::precision_name(precision)) + " vs torch " +
                            torch_run_name(against);
  SCOPED_TRACE(title + " in " + dir.string());
  SafetensorsFile ref(reference_file(dir, family));
  const ModelConfig config = model_config_from_json(ref.metadata().at("lattice.model"));
  const auto hyper = nlohmann::json::parse(ref.metadata().at("lattice.reference"));
  const std::string prefix = torch_run_prefix(against);
  const Batch batch = read_batch(batch_file(dir, family));
  const int64_t rows = kBatch * kSeq, V = config.vocab_size;

  Transformer model(config, nullptr);
  load_weights(model, init_file(dir, family));
  kernels::CpuOps ops;
  LayerContext ctx{ops, precision, nullptr};
  std::printf("%s\n", title.c_str());

  // Logits of the initial weights.
  const float* logits = model.logits(ctx, batch.tokens.data(), kBatch, kSeq);
  const auto want_logits = read_tensor(ref, prefix + "logits");
  ASSERT_EQ(static_cast<int64_t>(want_logits.size()), rows * V);
  const ErrorStats logit_err = compare(logits, want_logits.data(), rows * V);
  print_stats("logits", logit_err);
  EXPECT_LE(logit_err.relative_to_max, tol.logits) << "logits";

  // Loss and every parameter gradient.
  auto& params = model.parameters();
  params.zero_grads();
  const float loss =
      model.forward(ctx, batch.tokens.data(), batch.targets.data(), kBatch, kSeq, 1.0f);
  model.backward(ctx);
  const float want_loss = read_tensor(ref, prefix + "loss").at(0);
  const ErrorStats loss_err = compare(&loss, &want_loss, 1);
  print_stats("loss", loss_err);
  EXPECT_LE(loss_err.relative_to_max, tol.loss) << "loss " << loss << " vs " << want_loss;
  ErrorStats worst_grad;
  std::string worst_grad_name;
  double diff_sq = 0, want_sq = 0;
  for (const auto& p : params.parameters()) {
    const auto want = read_tensor(ref, prefix + "grad/" + p.name);
    ASSERT_EQ(static_cast<int64_t>(want.size()), p.numel) << p.name;
    const ErrorStats e = compare(params.grads() + p.offset, want.data(), p.numel);
    EXPECT_LE(e.relative_to_max, tol.gradient) << "gradient of " << p.name;
    if (std::getenv("LATTICE_PARITY_VERBOSE") != nullptr) print_stats("  grad " + p.name, e);
    if (e.relative_to_max >= worst_grad.relative_to_max) worst_grad_name = p.name;
    worst_grad.relative_to_max = std::max(worst_grad.relative_to_max, e.relative_to_max);
    worst_grad.worst_element = std::max(worst_grad.worst_element, e.worst_element);
    for (int64_t i = 0; i < p.numel; ++i) {
      const double d = static_cast<double>(params.grad(params.index_of(p.name))[i]) - want[i];
      diff_sq += d * d;
      want_sq += static_cast<double>(want[i]) * want[i];
    }
  }
  print_stats("gradients (worst over parameters: " + worst_grad_name + ")", worst_grad);
  const double gradient_l2 = std::sqrt(diff_sq / want_sq);
  std::printf("  %-58s %.3e\n", "gradients, ||a - b|| / ||b|| over all", gradient_l2);
  EXPECT_LE(gradient_l2, tol.gradient_l2) << "all gradients together";

  // Training steps from the same initial weights with the reference's hyper-parameters.
  Transformer trained(config, nullptr);
  load_weights(trained, init_file(dir, family));
  optim::AdamWSettings settings;
  settings.beta1 = hyper.at("beta1").get<float>();
  settings.beta2 = hyper.at("beta2").get<float>();
  settings.eps = hyper.at("eps").get<float>();
  settings.weight_decay = hyper.at("weight_decay").get<float>();
  settings.max_grad_norm = hyper.at("max_grad_norm").get<float>();
  const float lr = hyper.at("lr").get<float>();
  const int64_t steps = hyper.at("steps").get<int64_t>();
  kernels::CpuOps adamw_ops;
  optim::AdamWOptimizer optimizer(adamw_ops, trained.parameters(), settings, nullptr);
  std::vector<float> losses, norms;
  for (int64_t s = 0; s < steps; ++s) {
    trained.parameters().zero_grads();
    losses.push_back(
        trained.forward(ctx, batch.tokens.data(), batch.targets.data(), kBatch, kSeq, 1.0f));
    trained.backward(ctx);
    norms.push_back(static_cast<float>(optimizer.step(lr)));
  }
  const auto want_losses = read_tensor(ref, prefix + "losses");
  const auto want_norms = read_tensor(ref, prefix + "grad_norms");
  ASSERT_EQ(static_cast<int64_t>(want_losses.size()), steps);
  ErrorStats worst_step;
  // MoE in bf16: only the first steps are held to the bounds (see kMoeBf16Steps).
  const int64_t held =
      config.is_moe() && precision == kernels::Precision::bf16 ? kMoeBf16Steps : steps;
  for (int64_t s = 0; s < steps; ++s) {
    if (s >= held) {
      std::printf("    loss before step %lld: %.6f vs %.6f (not held: routing may differ)\n",
                  static_cast<long long>(s + 1), losses[s], want_losses[s]);
      continue;
    }
    const ErrorStats e = compare(&losses[s], &want_losses[s], 1);
    EXPECT_LE(e.relative_to_max, tol.step_losses)
        << "loss before step " << s + 1 << ": " << losses[s] << " vs " << want_losses[s];
    worst_step.relative_to_max = std::max(worst_step.relative_to_max, e.relative_to_max);
    worst_step.worst_element = worst_step.relative_to_max;
  }
  print_stats("losses of " + std::to_string(steps) + " AdamW steps (worst step)", worst_step);
  std::printf("    first %.6f -> last %.6f (reference %.6f -> %.6f)\n", losses.front(),
              losses.back(), want_losses.front(), want_losses.back());
  const ErrorStats norm_err = compare(norms.data(), want_norms.data(), held);
  print_stats("pre-clip gradient norms", norm_err);
  EXPECT_LE(norm_err.relative_to_max, tol.grad_norms) << "gradient norms";
}

// fp32: both sides compute in fp32 and differ only in summation order (oneDNN's vs MKL's GEMM
// blocking, attention tiling, norm and loss reductions), i.e. a few fp32 ulps (6e-8) per operation,
// grown through two layers and the backward pass. Measured (committed data, this machine): logits
// 9e-7, loss 2e-7, gradients 2e-6, step losses 2e-7, norms 2e-7; the bounds keep a 10x margin for
// other thread counts and GEMM kernels, inside the targets (1e-5 losses, 1e-4 gradients).
constexpr Tolerances kFp32{/*logits=*/1e-5,      /*loss=*/2e-6,
                           /*gradient=*/2e-5,    /*gradient_l2=*/2e-5,
                           /*step_losses=*/5e-6, /*grad_norms=*/5e-6};

// bf16: both round GEMM inputs to bf16 (8 significant bits, unit roundoff 2^-9 = 2e-3), but
// autocast also returns bf16 GEMM outputs (and computes GELU/SwiGLU in bf16) while Lattice keeps
// them fp32, and Lattice rounds the attention probabilities inside its tiles where PyTorch rounds
// its fp32 softmax; the runs differ by a few bf16 roundings per layer, amplified by softmax. That
// is the size of autocast's own distance from fp32 (committed llama: logits 2.0e-2,
// gradients 4.0e-2, step losses 1.6e-3). Measured, Lattice bf16 vs autocast (worst family,
// committed data): logits 1.6e-2, loss 4.3e-4, gradients 4.2e-2, step losses 2.0e-3, norms 4.4e-3;
// vs torch fp32: logits 1.5e-2, loss 7.4e-4, gradients 3.1e-2, step losses 1.7e-3, norms 4.8e-3.
// Bounds: about 2.5x above those.
constexpr Tolerances kBf16{/*logits=*/5e-2,      /*loss=*/5e-3,
                           /*gradient=*/1e-1,    /*gradient_l2=*/5e-2,
                           /*step_losses=*/1e-2, /*grad_norms=*/2e-2};

// Lattice bf16 against the PyTorch emulation of its own rounding points (lattice_torch's
// LATTICE_BF16_OPS: GEMM inputs, q/k/v/dO, P and dS rounded to bf16, fp32 elsewhere): what is left
// is fp32 summation order, which now and then flips one bf16 rounding (a 2^-8 step in one element),
// most often in attention's dS = P (dP - delta), where dP - delta cancels. Measured: logits 2.5e-7,
// loss 1.1e-7, gradients 1e-6 where nothing flipped and up to 3.4e-3 (committed gpt2: layer 0 and
// the layer-1 attention inputs, below a flip in layer 1's attention backward), all gradients
// together 4.3e-4, step losses 4.9e-4 and norms 1.3e-3 (flips compound over the 10 steps). Bounds
// about 3x.
constexpr Tolerances kBf16Emulated{/*logits=*/1e-4,      /*loss=*/1e-5,
                                   /*gradient=*/1e-2,    /*gradient_l2=*/2e-3,
                                   /*step_losses=*/2e-3, /*grad_norms=*/5e-3};

// A family's model: its tiny preset ("deepseek_moe" is deepseek-moe-tiny) and, for the MoE ones,
// balancing coefficients large enough that their gradients move the result visibly (at the
// presets' own the router gradients would pass the bounds without them); mixtral_capacity also
// drops copies (capacity factor 1) and adds the router z-loss; mixtral_gelu has GELU experts.
ModelConfig config_of(const std::string& family) {
  std::string preset =
      family == "mixtral_capacity" || family == "mixtral_gelu" ? "mixtral" : family;
  std::replace(preset.begin(), preset.end(), '_', '-');
  ModelConfig config = model_preset(preset + "-tiny");
  if (config.is_moe()) config.moe_aux_loss_coef = 0.1;
  if (family == "mixtral_gelu") config.moe_activation = MoeActivation::gelu;
  if (family == "mixtral_capacity") {
    config.moe_capacity_factor = 1.0;
    config.moe_z_loss_coef = 0.01;
  }
  return config;
}

const Tolerances& bf16_bounds(const std::string& family) {
  return config_of(family).is_moe() ? kMoeBf16Printed : kBf16;
}

// A MoE model against the emulation: kBf16Emulated, but logits within 1e-3. An expert's GEMM input
// is its activation rounded to bf16, and an activation whose fp32 value differs by an ulp from
// PyTorch's (the GELU's tanh, SwiGLU's exp) lands on the other bf16 neighbour now and then:
// measured 2.0e-4 on fresh mixtral_gelu weights (worst logit 1.2e-2), 0 on the committed ones.
constexpr Tolerances kMoeBf16Emulated{/*logits=*/1e-3,      /*loss=*/1e-5,
                                      /*gradient=*/1e-2,    /*gradient_l2=*/2e-3,
                                      /*step_losses=*/2e-3, /*grad_norms=*/5e-3};

const Tolerances& emulated_bounds(const std::string& family) {
  return config_of(family).is_moe() ? kMoeBf16Emulated : kBf16Emulated;
}

class PytorchParity : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(PytorchParity, CommittedReferenceFp32) {
  check_parity(committed_data_dir(), GetParam(), kernels::Precision::fp32, TorchRun::fp32, kFp32);
}

TEST_P(PytorchParity, CommittedReferenceBf16) {
  check_parity(committed_data_dir(), GetParam(), kernels::Precision::bf16, TorchRun::bf16_autocast,
               bf16_bounds(GetParam()));
  // The same rounding points as Lattice's bf16, emulated in PyTorch: much closer.
  check_parity(committed_data_dir(), GetParam(), kernels::Precision::bf16,
               TorchRun::lattice_bf16_emulation, emulated_bounds(GetParam()));
  // Lattice's bf16 is as far from exact fp32 as autocast is (the same bounds hold).
  check_parity(committed_data_dir(), GetParam(), kernels::Precision::bf16, TorchRun::fp32,
               bf16_bounds(GetParam()));
}

// Writes the engine's freshly initialised weights (the preset's own init_std, a new seed) and a
// batch, lets PyTorch compute the reference now, and compares both precisions again.
TEST_P(PytorchParity, RegeneratedReferenceFromFreshWeights) {
  if (!torch_available())
    GTEST_SKIP() << kPython << " cannot import torch (Debian package python3-torch): the "
                 << "regenerated-reference comparison needs it; the committed references are "
                 << "still checked";
  const std::string family = GetParam();
  const fs::path dir = fs::temp_directory_path() /
                       ("lattice_pytorch_parity_" + std::to_string(::getpid()) + "_" + family);
  fs::remove_all(dir);
  write_inputs(dir, family, config_of(family), 20261129);
  ASSERT_EQ(run_make_reference(dir, family), 0)
      << "make_reference.py failed; see " << (dir / (family + "_make_reference.log"));
  check_parity(dir, family, kernels::Precision::fp32, TorchRun::fp32, kFp32);
  check_parity(dir, family, kernels::Precision::bf16, TorchRun::bf16_autocast, bf16_bounds(family));
  check_parity(dir, family, kernels::Precision::bf16, TorchRun::lattice_bf16_emulation,
               emulated_bounds(family));
  if (!HasFailure()) fs::remove_all(dir);
}

// Rewrites tests/reference/data (the committed inputs and, with torch, the references). Run only on
// request: LATTICE_REGENERATE_REFERENCE=1 (see tests/reference/README.md).
TEST_P(PytorchParity, RegenerateCommittedData) {
  const char* flag = std::getenv("LATTICE_REGENERATE_REFERENCE");
  if (flag == nullptr || std::string(flag) != "1")
    GTEST_SKIP() << "set LATTICE_REGENERATE_REFERENCE=1 to rewrite " << committed_data_dir();
  const std::string family = GetParam();
  // init_std 0.2 instead of the preset's 0.02: attention scores and logits of order one, so every
  // path (RoPE, causal masking, GQA groups, the tied head) moves the result visibly.
  ModelConfig config = config_of(family);
  config.init_std = 0.2f;
  write_inputs(committed_data_dir(), family, config, 7);
  ASSERT_TRUE(torch_available()) << "inputs written, but " << kPython
                                 << " lacks torch: run make_reference.py by hand";
  ASSERT_EQ(run_make_reference(committed_data_dir(), family), 0);
  fs::remove(committed_data_dir() / (family + "_make_reference.log"));
}

INSTANTIATE_TEST_SUITE_P(Families, PytorchParity,
                         ::testing::Values(std::string("gpt2"), std::string("llama"),
                                           std::string("qwen2"), std::string("qwen3"),
                                           std::string("mistral"), std::string("qwen3_moe"),
                                           std::string("mixtral"), std::string("deepseek_moe"),
                                           std::string("mixtral_capacity"),
                                           std::string("mixtral_gelu"), std::string("deepseek_v3")),
                         [](const auto& info) { return info.param; });
