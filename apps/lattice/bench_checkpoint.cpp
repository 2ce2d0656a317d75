// `lattice bench checkpoint`: what checkpoints cost a training run on this machine, measured in one
// invocation. The same short run (a model preset on `--ranks` local ranks with ZeRO-1) three times:
// without checkpoints (its step time), with a synchronous checkpoint every 2 steps, and with
// asynchronous ones. Per checkpoint: the time the training thread spent on it (the trainer's own
// measurement, TrainResult::checkpoint_seconds: snapshot, writing when synchronous, publishing),
// the bytes written, and the same bytes against two peers measured in the same invocation: the
// disk (one file of that size written and fsynced) and PyTorch's torch.save of tensors of that
// size (with an fsync), the way a PyTorch user checkpoints. Rounds alternate the runs; medians are
// reported.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "bench_host.hpp"
#include "lattice/core/error.hpp"
#include "lattice/io/atomic_file.hpp"
#include "lattice/train/trainer.hpp"
#include "verbs.hpp"

namespace lattice::cli {
namespace {

namespace fs = std::filesystem;

struct Options {
  std::string preset = "llama-small-test", python = "/usr/bin/python3", dir;
  int ranks = 2;
  int64_t steps = 8, rounds = 3, seq_len = 256;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Sends stdout to /dev/null while it lives (an exception included).
class QuietStdout {
 public:
  QuietStdout() : saved_(dup(1)), null_(std::fopen("/dev/null", "w")) {
    std::fflush(stdout);
    dup2(fileno(null_), 1);
  }
  ~QuietStdout() {
    std::fflush(stdout);
    dup2(saved_, 1);
    close(saved_);
    std::fclose(null_);
  }
  QuietStdout(const QuietStdout&) = delete;
  QuietStdout& operator=(const QuietStdout&) = delete;

 private:
  int saved_;
  FILE* null_;
};

// One training run (rank 0's result); `mode`: "none", "sync" or "async".
train::TrainResult time_run(const Options& o, const fs::path& dir, const std::string& mode) {
  fs::remove_all(dir / "run");
  std::vector<std::string> overrides = {
      "model.preset=" + o.preset,
      "training.seq_len=" + std::to_string(o.seq_len),
      "training.global_batch_size=" + std::to_string(4 * o.ranks),
      "training.steps=" + std::to_string(o.steps),
      "training.threads=" + std::to_string(o.ranks),
      "data.train_files=" + (dir / "corpus.txt").string(),
      "data.val_fraction=0.05",
      "validation.freq=0",
      "metrics.log_freq=1000",
      "metrics.jsonl=false",
      "metrics.tensorboard=false",
      "metrics.peak_tflops=1",
      "job.run_dir=" + (dir / "run").string(),
      "parallelism.dp=" + std::to_string(o.ranks),
      "parallelism.zero=1",
      "checkpoint.enable=" + std::string(mode == "none" ? "false" : "true"),
      "checkpoint.interval=2",
      "checkpoint.keep_latest=1",
      "checkpoint.async=" + std::string(mode == "async" ? "true" : "false")};
  // The corpus is read as bytes: a smaller vocabulary (a test preset) grows to 256.
  if (model::model_preset(o.preset).vocab_size < 256) overrides.push_back("model.vocab_size=256");
  const train::TrainConfig config = train::load_train_config("", overrides);
  // The run's own lines are not the benchmark's: stdout is quiet while it runs.
  const QuietStdout quiet;
  return train::train_on_ranks(config);
}

int64_t directory_bytes(const fs::path& dir) {
  int64_t bytes = 0;
  for (const auto& entry : fs::recursive_directory_iterator(dir))
    if (entry.is_regular_file()) bytes += static_cast<int64_t>(entry.file_size());
  return bytes;
}

// The disk: `bytes` written to one new file and fsynced (through write_file_atomic).
double time_disk(const fs::path& dir, int64_t bytes) {
  const std::string data(static_cast<size_t>(bytes), '\x5a');
  const auto start = std::chrono::steady_clock::now();
  write_file_atomic((dir / "disk.bin").string(), data.data(), data.size());
  const double seconds = seconds_since(start);
  fs::remove(dir / "disk.bin");
  return seconds;
}

// PyTorch: torch.save of fp32 tensors of `bytes` in all (one per 1 MiB) and an fsync; -1 when the
// interpreter has no torch. The time is the script's own measurement of the save.
double time_torch_save(const Options& o, const fs::path& dir, int64_t bytes) {
  const fs::path script = dir / "torch_save.py", out = dir / "torch_save.out";
  std::ofstream(script) << "import os, sys, time\n"
                           "import torch\n"
                           "n = int(sys.argv[1]) // 4\n"
                           "chunk = 1 << 18\n"
                           "state = {f't{i}': torch.randn(min(chunk, n - i * chunk))\n"
                           "         for i in range((n + chunk - 1) // chunk)}\n"
                           "path = sys.argv[2]\n"
                           "start = time.perf_counter()\n"
                           "with open(path, 'wb') as f:\n"
                           "    torch.save(state, f)\n"
                           "    f.flush()\n"
                           "    os.fsync(f.fileno())\n"
                           "print(time.perf_counter() - start)\n"
                           "os.remove(path)\n";
  const std::string command = o.python + " '" + script.string() + "' " + std::to_string(bytes) +
                              " '" + (dir / "torch.pt").string() + "' > '" + out.string() +
                              "' 2>/dev/null";
  if (std::system(command.c_str()) != 0) return -1;
  double seconds = -1;
  std::ifstream(out) >> seconds;
  return seconds;
}

}  // namespace

void register_bench_checkpoint(CLI::App& bench) {
  CLI::App* target = bench.add_subcommand(
      "checkpoint",
      "What sharded checkpoints (sync and async) cost a run, vs the disk and torch.save");
  auto o = std::make_shared<Options>();
  target->add_option("--preset", o->preset, "model preset")->capture_default_str();
  target->add_option("--ranks", o->ranks, "data-parallel ranks (threads, ZeRO-1)")
      ->capture_default_str();
  target->add_option("--steps", o->steps, "training steps per run (a checkpoint every 2)")
      ->capture_default_str();
  target->add_option("--seq-len", o->seq_len, "tokens per sequence")->capture_default_str();
  target->add_option("--rounds", o->rounds, "alternations of the three runs (medians reported)")
      ->capture_default_str();
  target->add_option("--python", o->python, "python with torch (the torch.save peer)")
      ->capture_default_str();
  target->add_option("--dir", o->dir, "where the runs write (default: a fresh temporary folder)");
  target->callback([o] {
    check(o->ranks >= 1 && o->steps >= 2 && o->steps % 2 == 0 && o->rounds >= 1 && o->seq_len >= 8,
          "bench checkpoint: --ranks >= 1, --steps even and >= 2, --rounds >= 1, --seq-len >= 8");
    const fs::path dir =
        o->dir.empty()
            ? fs::temp_directory_path() / ("lattice-bench-checkpoint-" + std::to_string(getpid()))
            : fs::path(o->dir);
    fs::create_directories(dir);
    {
      std::ofstream corpus(dir / "corpus.txt");
      for (int i = 0; i < 20000; ++i)
        corpus << "line " << i << ": the quick brown fox jumps over the lazy dog.\n";
    }
    std::printf("host: %s | load %s\n", cpu_description().c_str(), load_average().c_str());
    // Per checkpoint: synchronous (every one), asynchronous (the interval ones; the final one is
    // always waited for); the step time without checkpoints.
    std::vector<double> step, sync, async, disk, torch;
    int64_t bytes = 0;
    for (int64_t r = 0; r < o->rounds; ++r) {
      const train::TrainResult none = time_run(*o, dir, "none");
      step.push_back(static_cast<double>(4 * o->ranks * o->seq_len) / none.tokens_per_second);
      const train::TrainResult s = time_run(*o, dir, "sync");
      sync.push_back((s.checkpoint_seconds + s.final_checkpoint_seconds) /
                     static_cast<double>(s.checkpoints));
      bytes = directory_bytes(dir / "run" / "checkpoints" /
                              ("step_" + std::string(8 - std::to_string(o->steps).size(), '0') +
                               std::to_string(o->steps)));
      const train::TrainResult a = time_run(*o, dir, "async");
      check(a.checkpoints >= 2, "bench checkpoint: --steps must allow an interval checkpoint");
      async.push_back(a.checkpoint_seconds / static_cast<double>(a.checkpoints - 1));
      disk.push_back(time_disk(dir, bytes));
      const double t = time_torch_save(*o, dir, bytes);
      if (t > 0) torch.push_back(t);
    }
    std::printf(
        "%s on %d ranks (ZeRO-1), %lld steps of %d x %lld tokens, a checkpoint every 2 "
        "steps: %.1f MB a checkpoint; a step takes %.3f s without checkpoints\n",
        o->preset.c_str(), o->ranks, static_cast<long long>(o->steps), 4 * o->ranks,
        static_cast<long long>(o->seq_len), static_cast<double>(bytes) / 1e6, median(step));
    std::printf("%-40s %10s %10s\n", "per checkpoint", "seconds", "MB/s");
    auto row = [&](const char* what, double seconds) {
      std::printf("%-40s %10.4f %10.0f\n", what, seconds,
                  seconds > 0 ? static_cast<double>(bytes) / 1e6 / seconds : 0.0);
    };
    const double sync_each = median(sync), async_each = median(async);
    row("lattice sync: training thread waits", sync_each);
    row("lattice async: training thread waits", async_each);
    row("disk: one file written + fsync", median(disk));
    if (!torch.empty()) row("pytorch torch.save + fsync", median(torch));
    std::printf("ratios: sync / disk %.2f", sync_each / median(disk));
    if (!torch.empty()) std::printf(", sync / torch.save %.2f", sync_each / median(torch));
    std::printf(", async / sync %.3f\n", async_each / sync_each);
    if (torch.empty())
      std::printf("(no torch.save peer: %s cannot import torch)\n", o->python.c_str());
    if (o->dir.empty()) fs::remove_all(dir);
  });
}

}  // namespace lattice::cli
