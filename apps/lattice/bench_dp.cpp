// `lattice bench dp`: data parallelism on this machine, measured in one invocation.
//  1. Scaling: 2 ranks x 1 kernel thread against 1 rank x 2 threads on the same global batch
//     (local backend), tokens/s and their ratio.
//  2. Overlap: on the 2-rank run, communication the training thread waited for (exposed) against
//     the time the collectives ran (total); the share hidden behind backward.
//  3. Memory: per-rank model-state bytes (parameters, gradients, AdamW moments) for ZeRO 0-3 on 4
//     ranks against ZeRO's formulas for fp32 parameters and gradients (4Ψ+4Ψ+8Ψ, 4Ψ+4Ψ+8Ψ/N
//     (+4Ψ/N reduced shard), 4Ψ+12Ψ/N, 16Ψ/N), and the peak tracked bytes.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench_host.hpp"
#include "lattice/comm/backends/local.hpp"
#include "lattice/core/error.hpp"
#include "lattice/train/metrics.hpp"
#include "lattice/train/trainer.hpp"
#include "verbs.hpp"

namespace lattice::cli {
namespace {

struct Options {
  std::string model = "gpt2-demo";
  int64_t steps = 6, seq_len = 128, global_batch = 8;
  double bucket_mb = 1;
};

struct RankReport {
  train::TrainResult result;
  int64_t parameters = 0, gradients = 0, optimizer = 0, peak = 0;
};

train::TrainConfig bench_config(const Options& o, const std::filesystem::path& dir, int dp,
                                int zero, int64_t threads, int64_t steps) {
  return train::load_train_config(
      "", {"job.run_dir=" + (dir / "run").string(), "model.preset=" + o.model,
           "training.seq_len=" + std::to_string(o.seq_len),
           "training.global_batch_size=" + std::to_string(o.global_batch),
           "training.gradient_accumulation_steps=1", "training.steps=" + std::to_string(steps),
           "training.threads=" + std::to_string(threads), "training.precision=fp32",
           "data.train_files=" + (dir / "corpus.txt").string(), "data.val_fraction=0.05",
           "validation.freq=0", "metrics.log_freq=1000", "metrics.jsonl=false",
           "metrics.peak_tflops=1", "checkpoint.enable=false",
           "parallelism.dp=" + std::to_string(dp), "parallelism.zero=" + std::to_string(zero),
           "parallelism.bucket_mb=" + std::to_string(o.bucket_mb)});
}

// Runs on config.dp local rank threads; returns every rank's report.
std::vector<RankReport> run_ranks(const train::TrainConfig& config, int threads_per_rank) {
  std::vector<RankReport> reports(static_cast<size_t>(config.parallelism.dp));
  auto body = [&](comm::Communicator* group) {
    omp_set_num_threads(threads_per_rank);
    train::Trainer trainer(config, group);
    RankReport& r = reports[group ? static_cast<size_t>(group->rank()) : 0];
    r.result = trainer.run();
    const MemoryTracker& m = trainer.memory();
    r.parameters = m.current(MemoryCategory::parameters);
    r.gradients = m.current(MemoryCategory::gradients);
    r.optimizer = m.current(MemoryCategory::optimizer_state);
    r.peak = m.peak_total();
  };
  comm::run_local_ranks_or_inline(static_cast<int>(config.parallelism.dp), body);
  return reports;
}

void run_bench(const Options& o) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("lattice-bench-dp-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream out(dir / "corpus.txt");
    for (int i = 0; i < 4000; ++i)
      out << "Data parallelism splits each global batch across ranks; sample " << i << ".\n";
  }
  std::printf(
      "lattice bench dp: model %s, seq %lld, global batch %lld, %lld steps, buckets %.1f MiB\n",
      o.model.c_str(), static_cast<long long>(o.seq_len), static_cast<long long>(o.global_batch),
      static_cast<long long>(o.steps), o.bucket_mb);
  std::printf("load average at start: %s\n", load_average().c_str());

  // 1-2. Scaling and overlap (fp32; two cores).
  const auto one = run_ranks(bench_config(o, dir, 1, 0, 2, o.steps), 2);
  const auto two = run_ranks(bench_config(o, dir, 2, 0, 1, o.steps), 1);
  const double tps1 = one[0].result.tokens_per_second, tps2 = two[0].result.tokens_per_second;
  std::printf("\n%-28s %12s\n", "layout (same global batch)", "tokens/s");
  std::printf("%-28s %12.0f\n", "1 rank x 2 threads", tps1);
  std::printf("%-28s %12.0f\n", "2 ranks x 1 thread (DP)", tps2);
  std::printf("ratio DP / threads: %.2f\n", tps2 / tps1);
  for (int zero : {1, 2}) {
    const auto z = run_ranks(bench_config(o, dir, 2, zero, 1, o.steps), 1);
    std::printf("2 ranks ZeRO-%d: %.0f tokens/s (%.2f of plain DP)\n", zero,
                z[0].result.tokens_per_second, z[0].result.tokens_per_second / tps2);
  }
  const train::CommunicationTimes& comm = two[0].result.communication;
  const double exposed = comm.dp_exposed_seconds, total = comm.dp_seconds;
  std::printf(
      "\ncommunication on 2 ranks (rank 0, %lld steps): %.1f ms ran, %.1f ms exposed -> "
      "%.0f%% hidden (target >= 80%%)\n",
      static_cast<long long>(o.steps), 1e3 * total, 1e3 * exposed,
      total > 0 ? 100.0 * std::max(0.0, 1.0 - exposed / total) : 0.0);

  // 3. Memory per rank on 4 ranks.
  const int N = 4;
  std::printf("\nmodel-state bytes per rank on %d ranks (after a step) vs ZeRO's formula\n", N);
  std::printf("%-7s %12s %12s %12s %12s %12s %12s\n", "stage", "params", "grads", "adam", "total",
              "formula", "peak tracked");
  for (int zero : {0, 1, 2, 3}) {
    const auto reports = run_ranks(bench_config(o, dir, N, zero, 1, 1), 1);
    model::Transformer probe(model::model_preset(o.model), nullptr);
    const double psi = static_cast<double>(probe.parameters().size());
    const double formula = zero == 0   ? 16 * psi
                           : zero == 1 ? 8 * psi + 12 * psi / N
                           : zero == 2 ? 4 * psi + 12 * psi / N
                                       : 16 * psi / N;
    int64_t worst_peak = 0;
    for (const auto& r : reports) worst_peak = std::max(worst_peak, r.peak);
    const RankReport& r = reports[0];
    std::printf("ZeRO-%d  %12s %12s %12s %12s %12s %12s\n", zero,
                train::format_bytes(r.parameters).c_str(), train::format_bytes(r.gradients).c_str(),
                train::format_bytes(r.optimizer).c_str(),
                train::format_bytes(r.parameters + r.gradients + r.optimizer).c_str(),
                train::format_bytes(static_cast<int64_t>(formula)).c_str(),
                train::format_bytes(worst_peak).c_str());
  }
  std::printf(
      "(ZeRO-3 keeps the embedding and head whole; shards are padded to 4 KiB; ZeRO-1's "
      "formula counts its reduced-gradient shard)\n");
  std::filesystem::remove_all(dir);
}

}  // namespace

void register_bench_dp(CLI::App& bench) {
  CLI::App* target = bench.add_subcommand(
      "dp", "Data parallelism: 2 ranks vs 2 threads, communication overlap, ZeRO memory per rank");
  auto o = std::make_shared<Options>();
  target->add_option("--model", o->model, "model preset")->capture_default_str();
  target->add_option("--steps", o->steps, "training steps per run")->capture_default_str();
  target->add_option("--seq-len", o->seq_len, "tokens per sequence")->capture_default_str();
  target->add_option("--global-batch", o->global_batch, "sequences per step")
      ->capture_default_str();
  target->add_option("--bucket-mb", o->bucket_mb, "gradient bucket size (MiB)")
      ->capture_default_str();
  target->callback([o] { run_bench(*o); });
}

}  // namespace lattice::cli
