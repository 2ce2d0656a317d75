// The `lattice bench train` target: Lattice's training throughput and MFU against PyTorch on the
// same model and batch, in fp32 and bf16, measured in one invocation; prints a table and the
// ratios.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/matmul.hpp"
#include "lattice/train/metrics.hpp"
#include "lattice/train/train_benchmark.hpp"
#include "verbs.hpp"

namespace lattice::cli {

namespace {

std::vector<train::BenchmarkCase> cases(const std::string& which) {
  std::vector<train::BenchmarkCase> all;
  // (a) The PyTorch reference shape of shared/reference/machine.md: L4 d256 h4 V8192 T256 B8.
  model::ModelConfig small = model::model_preset("gpt2-small-test");
  all.push_back({"small (L4 d256 h4 V8192 T256 B8)", small, 8, 256});
  // (b) GPT-2 124M at T1024 B4.
  all.push_back(
      {"gpt2-124m (L12 d768 h12 V50257 T1024 B4)", model::model_preset("gpt2-124m"), 4, 1024});
  if (which == "all") return all;
  if (which == "small") return {all[0]};
  if (which == "gpt2-124m") return {all[1]};
  throw Error("unknown benchmark shape '" + which + "': use small, gpt2-124m or all");
}

// The median (the mean of the middle two for an even count).
double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace

void register_bench_train(CLI::App& bench) {
  CLI::App* target = bench.add_subcommand(
      "train", "Training tokens/s and MFU against PyTorch (same model, batch)");
  struct Options {
    std::string shape = "all", python = "/usr/bin/python3", script;
    int64_t steps = 3, warmup = 1, rounds = 1;
    bool skip_pytorch = false;
    std::vector<std::string> precisions = {"fp32", "bf16"};
  };
  auto o = std::make_shared<Options>();
  target->add_option("--shape", o->shape, "small, gpt2-124m or all")->capture_default_str();
  target->add_option("--steps", o->steps, "timed steps per run")->capture_default_str();
  target->add_option("--warmup", o->warmup, "untimed steps first")->capture_default_str();
  target
      ->add_option("--rounds", o->rounds,
                   "alternate Lattice and PyTorch this many times per case and report the "
                   "medians (steadier on a shared machine)")
      ->check(CLI::Range(int64_t{1}, int64_t{100}))
      ->capture_default_str();
  target->add_option("--precision", o->precisions, "fp32 and/or bf16")->capture_default_str();
  target->add_option("--python", o->python, "python with torch")->capture_default_str();
  target->add_option("--script", o->script, "PyTorch side (default: bench/pytorch_train.py)");
  target->add_flag("--skip-pytorch", o->skip_pytorch, "measure Lattice only");
  target->callback([o] {
    std::string script = o->script;
    if (script.empty()) {
      for (auto dir = std::filesystem::current_path(); !dir.empty(); dir = dir.parent_path()) {
        if (std::filesystem::exists(dir / "bench" / "pytorch_train.py")) {
          script = (dir / "bench" / "pytorch_train.py").string();
          break;
        }
        if (dir == dir.parent_path()) break;
      }
      check(o->skip_pytorch || !script.empty(),
            "cannot find bench/pytorch_train.py: run from the repository or pass --script");
    }
    const int threads = omp_get_max_threads();
    kernels::MatmulEngine matmul;
    std::map<std::string, double> peak;
    for (const auto& name : o->precisions)
      peak[name] = train::calibrate_peak_flops(matmul, kernels::parse_precision(name));
    std::printf("threads %d; measured GEMM peak:", threads);
    for (const auto& [name, flops] : peak)
      std::printf(" %s %.3f TFLOP/s", name.c_str(), flops / 1e12);
    std::printf(" (1024^3 oneDNN GEMM)\n\n");
    std::printf("%-44s %-5s %12s %9s %7s %12s %9s\n", "model", "prec", "lattice tok/s", "TFLOP/s",
                "MFU", "pytorch tok/s", "ratio");
    for (const auto& c : cases(o->shape)) {
      const double flops_per_token = c.model.flops_per_token(c.seq_len);
      std::map<std::string, double> lattice_rate, torch_rate;
      for (const auto& name : o->precisions) {
        const auto precision = kernels::parse_precision(name);
        // Rounds alternate the two sides, so load changes on a shared machine reach both.
        std::vector<double> mine_rates, their_rates;
        std::string why;
        for (int64_t round = 0; round < o->rounds; ++round) {
          mine_rates.push_back(train::benchmark_lattice_training(c, precision, o->steps, o->warmup)
                                   .tokens_per_second);
          if (o->skip_pytorch || !why.empty()) continue;
          auto theirs = train::benchmark_pytorch_training(c, precision, o->steps, o->warmup,
                                                          threads, o->python, script, why);
          if (theirs) their_rates.push_back(theirs->tokens_per_second);
        }
        train::ThroughputResult mine;
        mine.tokens_per_second = median(mine_rates);
        lattice_rate[name] = mine.tokens_per_second;
        std::optional<train::ThroughputResult> theirs;
        if (!their_rates.empty()) {
          theirs.emplace();
          theirs->tokens_per_second = median(their_rates);
        }
        const double tflops = mine.tokens_per_second * flops_per_token / 1e12;
        std::printf("%-44s %-5s %12.0f %9.3f %6.1f%%", c.label.c_str(), name.c_str(),
                    mine.tokens_per_second, tflops, 100.0 * tflops * 1e12 / peak[name]);
        if (theirs) {
          torch_rate[name] = theirs->tokens_per_second;
          std::printf(" %12.0f %8.2fx\n", theirs->tokens_per_second,
                      mine.tokens_per_second / theirs->tokens_per_second);
        } else {
          std::printf(" %12s %9s%s%s\n", "-", "-", why.empty() ? "" : "  ", why.c_str());
        }
        if (o->rounds > 1) {
          std::printf("    %lld rounds, medians above; lattice", static_cast<long long>(o->rounds));
          for (double r : mine_rates) std::printf(" %.0f", r);
          if (!their_rates.empty()) {
            std::printf("; pytorch");
            for (double r : their_rates) std::printf(" %.0f", r);
          }
          std::printf(" tok/s\n");
        }
        std::fflush(stdout);
      }
      if (!torch_rate.empty()) {
        auto best_torch = std::max_element(torch_rate.begin(), torch_rate.end(),
                                           [](auto& a, auto& b) { return a.second < b.second; });
        auto best_mine = std::max_element(lattice_rate.begin(), lattice_rate.end(),
                                          [](auto& a, auto& b) { return a.second < b.second; });
        std::printf("  -> best Lattice (%s) / best PyTorch (%s): %.2fx\n", best_mine->first.c_str(),
                    best_torch->first.c_str(), best_mine->second / best_torch->second);
      }
    }
    std::printf(
        "\nFLOPs per token = 6N + 12·L·T·d (N without position embeddings); MFU against the "
        "measured GEMM peak above.\n");
  });
}

}  // namespace lattice::cli
