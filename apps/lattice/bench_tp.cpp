// `lattice bench tp`: tensor parallelism on this machine, measured in one invocation: tp = 2 (2
// local ranks x 1 kernel thread, the blocks' matrices split between them) against 1 rank x 2
// threads on the same model and global batch, through the training step of
// train/training_step.hpp (train/train_benchmark.hpp). Rounds alternate the two layouts and the
// medians are reported: tokens/s of each, their ratio, and the exposed tensor-parallel
// communication per step (the blocking all-reduces, four per block per step) against the step.
#include <omp.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench_host.hpp"
#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/train/train_benchmark.hpp"
#include "verbs.hpp"

namespace lattice::cli {
namespace {

struct Options {
  std::vector<std::string> shapes = {"small", "demo"};
  std::string model;  // a preset instead of the shapes (with --seq-len and --batch)
  int64_t seq_len = 32, batch = 4;
  int64_t steps = 3, warmup = 1, rounds = 3;
  std::vector<std::string> precisions = {"fp32"};
  bool sequence_parallel = false;  // the tp2 runs with sequence parallelism
};

// (a) bench train's small shape (L4 d256 h4 V8192 T256 B8), whose head (kept whole on every tp
// rank) is about a third of the FLOPs; (b) gpt2-demo (L4 d192 h6 V256 T128 B8), whose head is
// negligible: the blocks' split alone.
train::BenchmarkCase shape_case(const std::string& name) {
  if (name == "small")
    return {"small (L4 d256 h4 V8192 T256 B8)", model::model_preset("gpt2-small-test"), 8, 256};
  if (name == "demo")
    return {"demo (L4 d192 h6 V256 T128 B8)", model::model_preset("gpt2-demo"), 8, 128};
  throw Error("unknown tp benchmark shape '" + name + "': use small or demo (or --model PRESET)");
}

void run_bench(const Options& o) {
  std::vector<train::BenchmarkCase> cases;
  if (!o.model.empty()) {
    cases.push_back(
        {o.model + " (T" + std::to_string(o.seq_len) + " B" + std::to_string(o.batch) + ")",
         model::model_preset(o.model), o.batch, o.seq_len});
  } else {
    for (const auto& name : o.shapes) cases.push_back(shape_case(name));
  }
  for (const auto& c : cases)
    check(c.model.n_heads % 2 == 0,
          "model " + c.model.name + " has " + std::to_string(c.model.n_heads) +
              " attention heads, which tp 2 cannot split: choose a preset with an even head count");
  const int threads = 2;  // this machine's cores: 1 rank x 2 threads against 2 ranks x 1
  omp_set_num_threads(threads);
  std::printf("lattice bench tp: %s\n", cpu_description().c_str());
  std::printf("load average at start: %s\n", load_average().c_str());
  bool any_bf16 = false;
  for (const auto& name : o.precisions)  // refuses an unknown precision before any run
    any_bf16 |= kernels::parse_precision(name) == kernels::Precision::bf16;
  if (any_bf16) std::printf("Lattice: %s\n", kernels::CpuOps().describe_bf16().c_str());
  std::printf(
      "%lld timed steps after %lld warm-up per run, %lld rounds alternating the layouts "
      "(medians)\n\n",
      static_cast<long long>(o.steps), static_cast<long long>(o.warmup),
      static_cast<long long>(o.rounds));
  const char* tp_label = o.sequence_parallel ? "tp2sp tok/s" : "tp2 tok/s";
  std::printf("%-36s %-5s %11s %11s %7s %10s %10s %7s %12s %10s\n", "model", "prec", "1x2 tok/s",
              tp_label, "ratio", "tp2 step", "tp comm", "share", "no-overlap", "tp comm");
  for (const auto& c : cases) {
    for (const auto& name : o.precisions) {
      const auto precision = kernels::parse_precision(name);
      std::vector<double> one_rates, tp_rates, tp_steps, tp_comms, ratios, blocking_rates,
          blocking_comms;
      for (int64_t round = 0; round < o.rounds; ++round) {
        const auto one =
            train::benchmark_lattice_training(c, precision, o.steps, o.warmup, /*ranks=*/1);
        const auto two =
            train::benchmark_lattice_training(c, precision, o.steps, o.warmup, /*ranks=*/2,
                                              /*tp=*/2, /*tp_overlap=*/true, o.sequence_parallel);
        const auto blocking =
            train::benchmark_lattice_training(c, precision, o.steps, o.warmup, /*ranks=*/2,
                                              /*tp=*/2, /*tp_overlap=*/false, o.sequence_parallel);
        blocking_rates.push_back(blocking.tokens_per_second);
        blocking_comms.push_back(blocking.tp_comm_seconds_per_step);
        one_rates.push_back(one.tokens_per_second);
        tp_rates.push_back(two.tokens_per_second);
        tp_steps.push_back(two.seconds_per_step);
        tp_comms.push_back(two.tp_comm_seconds_per_step);
        ratios.push_back(two.tokens_per_second / one.tokens_per_second);
      }
      const double step = median(tp_steps), comm = median(tp_comms);
      std::printf("%-36s %-5s %11.0f %11.0f %6.2fx %7.1f ms %7.1f ms %6.1f%% %8.0f t/s %7.1f ms\n",
                  c.label.c_str(), name.c_str(), median(one_rates), median(tp_rates),
                  median(ratios), 1e3 * step, 1e3 * comm, 100.0 * comm / step,
                  median(blocking_rates), 1e3 * median(blocking_comms));
      if (o.rounds > 1) {
        std::ostringstream detail;
        detail << "    rounds: 1x2";
        for (double r : one_rates) detail << " " << static_cast<long long>(r);
        detail << "; tp2";
        for (double r : tp_rates) detail << " " << static_cast<long long>(r);
        detail << " tok/s; ratios";
        for (double r : ratios) {
          char buffer[16];
          std::snprintf(buffer, sizeof buffer, " %.2f", r);
          detail << buffer;
        }
        std::printf("%s\n", detail.str().c_str());
      }
      std::fflush(stdout);
    }
  }
  std::printf(
      "\nratio: tp2 tokens/s over 1x2 tokens/s (median of the rounds' ratios; target >= 0.85x on "
      "2 cores). tp comm: rank 0's exposed tensor-parallel communication per step (the blocking "
      "collectives, and the waits for the overlapped ones: the input-gradient reductions during "
      "the weight gradients and, with sequence parallelism, the re-gathers of the column layers' "
      "inputs during the input gradients); share: of the tp2 step; no-overlap: tp2 with every "
      "collective blocking, its tokens/s and tp comm. The embedding, head and loss are "
      "vocabulary-parallel; %s.\n",
      o.sequence_parallel
          ? "sequence parallel (--sp): the norms and residuals run on half the rows of each rank"
          : "the norms are computed on every tp rank (--sp: sequence parallelism)");
}

}  // namespace

void register_bench_tp(CLI::App& bench) {
  CLI::App* target = bench.add_subcommand(
      "tp", "Tensor parallelism: tp 2 (2 ranks x 1 thread) vs 1 rank x 2 threads, exposed comm");
  auto o = std::make_shared<Options>();
  target->add_option("--shape", o->shapes, "small and/or demo")
      ->delimiter(',')
      ->capture_default_str();
  target->add_option("--model", o->model,
                     "a model preset instead of the shapes (with --seq-len and --batch)");
  target->add_option("--seq-len", o->seq_len, "tokens per sequence (with --model)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  target->add_option("--batch", o->batch, "global batch in sequences (with --model)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  target->add_option("--steps", o->steps, "timed steps per run")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  target->add_option("--warmup", o->warmup, "untimed steps first")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  target->add_option("--rounds", o->rounds, "alternations of the two layouts (medians)")
      ->check(CLI::Range(int64_t{1}, int64_t{100}))
      ->capture_default_str();
  target->add_option("--precision", o->precisions, "fp32 and/or bf16")
      ->delimiter(',')
      ->capture_default_str();
  target->add_flag("--sp", o->sequence_parallel,
                   "run tp 2 with sequence parallelism (all-gather / reduce-scatter)");
  target->callback([o] { run_bench(*o); });
}

}  // namespace lattice::cli
