// Training benchmark: see train_benchmark.hpp.
#include "lattice/train/train_benchmark.hpp"

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/core/rng.hpp"
#include "lattice/kernels/cpu/matmul.hpp"
#include "lattice/model/transformer.hpp"
#include "lattice/optim/adamw_optimizer.hpp"

namespace lattice::train {

ThroughputResult benchmark_lattice_training(const BenchmarkCase& c, kernels::Precision precision,
                                            int64_t steps, int64_t warmup) {
  check(steps > 0, "the benchmark needs at least one timed step");
  MemoryTracker tracker;
  kernels::MatmulEngine matmul;
  model::Transformer model(c.model, &tracker);
  model.initialize(0);
  optim::AdamWOptimizer optimizer(model.parameters(), optim::AdamWSettings{}, &tracker);
  model::LayerContext ctx{matmul, precision, &tracker};
  Rng rng(1);
  const int64_t n = c.batch * c.seq_len;
  std::vector<int32_t> tokens(static_cast<size_t>(n)), targets(tokens.size());
  for (int64_t i = 0; i < n; ++i) {
    tokens[static_cast<size_t>(i)] =
        static_cast<int32_t>(rng.below(static_cast<uint64_t>(c.model.vocab_size)));
    targets[static_cast<size_t>(i)] =
        static_cast<int32_t>(rng.below(static_cast<uint64_t>(c.model.vocab_size)));
  }
  auto step = [&] {
    model.parameters().zero_grads();
    model.forward(ctx, tokens.data(), targets.data(), c.batch, c.seq_len, 1.0f);
    model.backward(ctx);
    optimizer.step(3e-4f);
  };
  for (int64_t i = 0; i < warmup; ++i) step();
  auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) step();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ThroughputResult r;
  r.seconds_per_step = seconds / static_cast<double>(steps);
  r.tokens_per_second = static_cast<double>(n) / r.seconds_per_step;
  return r;
}

std::optional<ThroughputResult> benchmark_pytorch_training(
    const BenchmarkCase& c, kernels::Precision precision, int64_t steps, int64_t warmup,
    int threads, const std::string& python, const std::string& script, std::string& why) {
  const auto& m = c.model;
  char command[1024];
  std::snprintf(command, sizeof command,
                "'%s' '%s' --family %s --layers %lld --d-model %lld --heads %lld --kv-heads %lld "
                "--ffn %lld --vocab %lld --seq %lld --batch %lld --precision %s --steps %lld "
                "--warmup %lld --threads %d 2>&1",
                python.c_str(), script.c_str(), model::family_name(m.family).c_str(),
                static_cast<long long>(m.n_layers), static_cast<long long>(m.d_model),
                static_cast<long long>(m.n_heads), static_cast<long long>(m.n_kv_heads),
                static_cast<long long>(m.ffn_hidden), static_cast<long long>(m.vocab_size),
                static_cast<long long>(c.seq_len), static_cast<long long>(c.batch),
                std::string(kernels::precision_name(precision)).c_str(),
                static_cast<long long>(steps), static_cast<long long>(warmup), threads);
  FILE* pipe = popen(command, "r");
  if (!pipe) {
    why = "cannot start " + python;
    return std::nullopt;
  }
  std::string output;
  char buffer[4096];
  while (size_t got = fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, got);
  const int status = pclose(pipe);
  const auto brace = output.rfind("{\"tokens_per_second\"");
  if (status != 0 || brace == std::string::npos) {
    why = "PyTorch run failed (is Debian's python3-torch installed?): " +
          output.substr(output.size() > 300 ? output.size() - 300 : 0);
    return std::nullopt;
  }
  auto j = nlohmann::json::parse(output.substr(brace));
  ThroughputResult r;
  r.tokens_per_second = j.at("tokens_per_second").get<double>();
  r.seconds_per_step = static_cast<double>(c.batch * c.seq_len) / r.tokens_per_second;
  return r;
}

}  // namespace lattice::train
