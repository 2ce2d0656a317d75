// The `lattice bench train` target: Lattice's training throughput and MFU against PyTorch on the
// same model and batch, in fp32 and bf16, on one rank with every thread and data-parallel over
// ranks of fewer threads each (PyTorch under DDP), PyTorch eager and under torch.compile, measured
// in one invocation; prints the host (CPU model, the ISA Lattice chose, PyTorch's version and
// BLAS), a table and the ratio of each side's best mode.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "bench_host.hpp"
#include "lattice/core/cpu_features.hpp"
#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/train/metrics.hpp"
#include "lattice/train/step_bound.hpp"
#include "lattice/train/train_benchmark.hpp"
#include "verbs.hpp"

namespace lattice::cli {

namespace {

// PyTorch's tokens/s in one row: eager and under torch.compile (0 where not run).
struct TorchRates {
  double eager = 0, compiled = 0;
  double best() const { return std::max(eager, compiled); }
};

// The step's MFU bound (train/step_bound.hpp) for `precision` with every thread on one rank,
// against the tokens/s that 1.2x the best PyTorch mode (`best_torch`, 0: not run) would take.
void print_step_bound(const train::BenchmarkCase& c, kernels::Precision precision,
                      kernels::Ops& ops, double best_torch) {
  const double peak = train::calibrate_peak_flops(ops, precision);
  const auto bound = train::measure_step_bound(c.model, c.batch, c.seq_len, precision, ops, peak);
  const double tokens = static_cast<double>(c.batch * c.seq_len);
  std::printf("  bound (%s, 1 rank): Linear GEMMs each alone at its shape:",
              std::string(kernels::precision_name(precision)).c_str());
  for (const auto& g : bound.gemms) {
    std::printf(" %s %lldx%lldx%lld %.0f GFLOP/s x%lld;", g.name.c_str(),
                static_cast<long long>(g.M), static_cast<long long>(g.K),
                static_cast<long long>(g.N), g.flops() / g.seconds() / 1e9,
                static_cast<long long>(g.count));
  }
  std::printf(
      "\n    step >= %.4f s = GEMMs %.4f + attention %.4f (at the %.3f TFLOP/s peak) + optimizer "
      "%.4f (norm and AdamW alone: %.0f MB at %.1f GB/s) -> at most %.0f tok/s, MFU %.1f%%",
      bound.seconds(), bound.gemm_seconds, bound.attention_seconds, peak / 1e12,
      bound.optimizer_seconds, bound.optimizer_bytes / 1e6, bound.optimizer_bandwidth() / 1e9,
      tokens / bound.seconds(), 100.0 * bound.mfu());
  if (best_torch > 0) std::printf("; 1.2x best PyTorch = %.0f tok/s", 1.2 * best_torch);
  std::printf(
      "\n    not in the bound: Lattice's attention kernels alone at this shape take %.4f s a step "
      "(%.1fx the bound's attention)\n",
      bound.attention_kernel_seconds, bound.attention_kernel_seconds / bound.attention_seconds);
  std::fflush(stdout);
}

}  // namespace

void register_bench_train(CLI::App& bench) {
  CLI::App* target = bench.add_subcommand(
      "train", "Training tokens/s and MFU against PyTorch (same model, batch)");
  struct Options {
    std::string shape = "all", python, script, pytorch_allocator = "auto";
    int64_t steps = 3, warmup = 1, rounds = 1;
    bool skip_pytorch = false, pytorch_compile = true, bound = false;
    std::vector<std::string> precisions = {"fp32", "bf16"};
    std::vector<int> ranks = {1, 2};
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
  target
      ->add_option("--ranks", o->ranks,
                   "layouts: 1 = one rank with every thread; N = N data-parallel ranks of "
                   "threads/N threads (Lattice's local backend, PyTorch DDP over gloo); layouts "
                   "with more ranks than threads are skipped")
      ->delimiter(',')
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  target->add_option("--python", o->python,
                     "python with torch (default: $LATTICE_PEER_VENV/bin/python, else "
                     "/opt/lattice/peer-venv/bin/python, from scripts/install_peers.sh, where it "
                     "exists; else /usr/bin/python3)");
  target->add_option("--script", o->script, "PyTorch side (default: bench/pytorch_train.py)");
  target->add_flag("--skip-pytorch", o->skip_pytorch, "measure Lattice only");
  CLI::Option* compile_flag = target->add_flag(
      "--pytorch-compile,!--no-pytorch-compile", o->pytorch_compile,
      "also time PyTorch under torch.compile (inductor; tens of seconds of compile per row, in "
      "the warmup); default: on where the torch has it (2.x)");
  target->add_flag(
      "--bound", o->bound,
      "after each precision's rows, measure the step's MFU bound: its Linear GEMMs "
      "each timed alone on this host at its own shape, attention at the GEMM peak, "
      "the optimizer's memory traffic (norm and AdamW over every parameter) timed alone "
      "(train/step_bound.hpp)");
  target
      ->add_option("--pytorch-allocator", o->pytorch_allocator,
                   "PyTorch's malloc: auto (jemalloc if installed, else glibc-thp), jemalloc "
                   "(Intel's tuning-guide settings), glibc-thp (huge pages advised) or glibc")
      ->capture_default_str();
  target->callback([o, compile_flag] {
    const auto allocator = train::parse_pytorch_allocator(o->pytorch_allocator);
    const std::string script =
        o->script.empty() ? find_repository_file("bench/pytorch_train.py") : o->script;
    check(o->skip_pytorch || !script.empty(),
          "cannot find bench/pytorch_train.py: run from the repository or pass --script");
    const auto shapes =
        train::benchmark_cases(o->shape);  // refuses an unknown shape before any output
    const std::string python = o->python.empty() ? train::default_pytorch_python() : o->python;
    const int threads = omp_get_max_threads();
    kernels::CpuOps ops;  // each row's peak calibration (below)
    bool any_bf16 = false;
    for (const auto& name : o->precisions)  // refuses an unknown precision before any run
      any_bf16 |= kernels::parse_precision(name) == kernels::Precision::bf16;
    std::printf("CPU: %s\n", cpu_model().c_str());
    std::printf("threads %d\n", threads);
    std::printf("Lattice ISA: %s\n", cpu_features().best_tier().c_str());
    if (any_bf16) std::printf("Lattice: %s\n", ops.describe_bf16().c_str());
    // PyTorch: what its torch offers (one probe), then the modes it runs in each row.
    bool run_pytorch = !o->skip_pytorch, run_compiled = false;
    std::string compiled_off;  // why the compiled mode is not timed ("" when it is)
    if (run_pytorch) {
      std::string why;
      const auto peer = train::probe_pytorch(python, script, allocator, why);
      if (!peer) {
        run_pytorch = false;
        std::printf("PyTorch: not run: %s\n", why.c_str());
      } else {
        const bool asked = compile_flag->count() > 0;
        run_compiled = o->pytorch_compile && peer->compile;
        if (!o->pytorch_compile)
          compiled_off = "off (--no-pytorch-compile)";
        else if (!peer->compile)
          compiled_off = "torch " + peer->torch +
                         " has no torch.compile (torch 2.x has: run `bash " +
                         "scripts/install_peers.sh` and pass --python its venv's python)";
        check(!asked || !o->pytorch_compile || peer->compile, "--pytorch-compile: " + compiled_off);
        std::printf("PyTorch: %s, torch %s: attention %s, AdamW %s; modes eager%s\n",
                    python.c_str(), peer->torch.c_str(),
                    peer->sdpa ? "scaled_dot_product_attention" : "matmul + softmax (no SDPA)",
                    peer->fused_adamw ? "fused" : "foreach (no fused AdamW on CPU)",
                    run_compiled ? " and torch.compile (inductor)" : "");
        if (!compiled_off.empty()) std::printf("PyTorch compiled mode: %s\n", compiled_off.c_str());
        std::printf("PyTorch BLAS: %s\n", peer->blas.c_str());
        std::printf("PyTorch allocator: %s\n", train::pytorch_allocator_name(allocator).c_str());
      }
    }
    std::printf("\n");
    std::printf("%-44s %-5s %-6s %12s %9s %7s %7s %13s %13s %9s\n", "model", "prec", "layout",
                "lattice tok/s", "TFLOP/s", "peak", "MFU", "pytorch eager", "compiled", "ratio");
    std::set<std::string> pytorch_blas;  // what PyTorch's runs report (one line, in practice)
    for (const auto& c : shapes) {
      const double flops_per_token = c.model.flops_per_token(c.seq_len);
      // Best tokens/s of each side over its modes (precision, layout, eager or compiled), with
      // the mode's name.
      std::pair<double, std::string> best_mine{0, ""}, best_torch{0, ""};
      for (const auto& name : o->precisions) {
        const auto precision = kernels::parse_precision(name);
        // The same, over this precision's modes only.
        std::pair<double, std::string> precision_mine{0, ""}, precision_torch{0, ""};
        for (int ranks : o->ranks) {
          if (ranks > threads || c.batch % ranks != 0) continue;
          const std::string layout =
              std::to_string(ranks) + "x" + std::to_string(std::max(1, threads / ranks));
          // The peak measured again just before the row and just after it, the better of the two:
          // a shared host's GEMM rate moves by 20-30% between phases, and an MFU against a peak
          // from a slower phase read above 100% (once with the calibration before the row alone).
          const double peak_before = train::calibrate_peak_flops(ops, precision);
          // Rounds alternate the sides, so load changes on a shared machine reach all of them.
          std::vector<double> mine_rates, eager_rates, compiled_rates, compile_seconds;
          std::string why, why_compiled;
          for (int64_t round = 0; round < o->rounds; ++round) {
            mine_rates.push_back(
                train::benchmark_lattice_training(c, precision, o->steps, o->warmup, ranks)
                    .tokens_per_second);
            for (const bool compiled : {false, true}) {
              std::string& reason = compiled ? why_compiled : why;
              if (!run_pytorch || !why.empty() || !reason.empty()) continue;
              if (compiled && !run_compiled) continue;
              auto theirs = train::benchmark_pytorch_training(c, precision, o->steps, o->warmup,
                                                              threads, python, script, reason,
                                                              ranks, allocator, compiled);
              if (!theirs) continue;
              (compiled ? compiled_rates : eager_rates).push_back(theirs->tokens_per_second);
              if (compiled) compile_seconds.push_back(theirs->compile_seconds);
              if (!theirs->blas.empty()) pytorch_blas.insert(theirs->blas);
            }
          }
          const double row_peak =
              std::max(peak_before, train::calibrate_peak_flops(ops, precision));
          const double mine = median(mine_rates);
          const std::string mode = name + " " + layout;
          if (mine > best_mine.first) best_mine = {mine, mode};
          if (mine > precision_mine.first) precision_mine = {mine, layout};
          const double tflops = mine * flops_per_token / 1e12;
          std::printf("%-44s %-5s %-6s %12.0f %9.3f %7.3f %6.1f%%", c.label.c_str(), name.c_str(),
                      layout.c_str(), mine, tflops, row_peak / 1e12,
                      100.0 * tflops * 1e12 / row_peak);
          const TorchRates theirs{median(eager_rates), median(compiled_rates)};
          if (theirs.eager > best_torch.first) best_torch = {theirs.eager, mode + " eager"};
          if (theirs.compiled > best_torch.first)
            best_torch = {theirs.compiled, mode + " compiled"};
          if (theirs.eager > precision_torch.first)
            precision_torch = {theirs.eager, layout + " eager"};
          if (theirs.compiled > precision_torch.first)
            precision_torch = {theirs.compiled, layout + " compiled"};
          const auto rate = [](double r) { return r > 0 ? std::to_string(std::lround(r)) : "-"; };
          std::printf(" %13s %13s", rate(theirs.eager).c_str(), rate(theirs.compiled).c_str());
          if (theirs.best() > 0)
            std::printf(" %8.2fx", mine / theirs.best());
          else
            std::printf(" %9s", "-");
          if (!why.empty()) std::printf("  %s", why.c_str());
          if (why.empty() && !why_compiled.empty()) std::printf("  %s", why_compiled.c_str());
          if (!compile_seconds.empty()) std::printf("  (compile %.0f s)", median(compile_seconds));
          std::printf("\n");
          if (o->rounds > 1) {
            std::printf("    %lld rounds, medians above; lattice",
                        static_cast<long long>(o->rounds));
            for (double r : mine_rates) std::printf(" %.0f", r);
            if (!eager_rates.empty()) {
              std::printf("; pytorch");
              for (double r : eager_rates) std::printf(" %.0f", r);
            }
            if (!compiled_rates.empty()) {
              std::printf("; pytorch compiled");
              for (double r : compiled_rates) std::printf(" %.0f", r);
            }
            std::printf(" tok/s\n");
          }
          std::fflush(stdout);
        }
        if (precision_torch.first > 0 && o->precisions.size() > 1) {
          std::printf("  -> %s: best Lattice (%s) / best PyTorch (%s): %.2fx\n", name.c_str(),
                      precision_mine.second.c_str(), precision_torch.second.c_str(),
                      precision_mine.first / precision_torch.first);
        }
        if (o->bound) print_step_bound(c, precision, ops, precision_torch.first);
      }
      if (best_torch.first > 0) {
        std::printf("  -> best Lattice (%s) / best PyTorch (%s): %.2fx\n", best_mine.second.c_str(),
                    best_torch.second.c_str(), best_mine.first / best_torch.first);
      }
    }
    for (const auto& blas : pytorch_blas) std::printf("PyTorch BLAS: %s\n", blas.c_str());
    std::printf(
        "\nFLOPs per token = 6N + 12·L·T·d (N without position embeddings); MFU against the "
        "row's peak: the better of two 1024^3 GEMM calibrations (all threads), one just before "
        "the row and one just after it.\n"
        "layout RxT: R ranks of T threads each (R > 1: Lattice data parallelism on the local "
        "backend, PyTorch DistributedDataParallel over gloo). PyTorch: its best setup (SDPA "
        "attention, fused AdamW where its torch has them), eager and under torch.compile; ratio: "
        "Lattice against the better of the two.\n");
  });
}

}  // namespace lattice::cli
