// `lattice bench train` through the CLI: it names the CPU and the ISA Lattice chose; --rounds
// alternates the measurements and reports the median of the rounds it prints; --ranks adds
// data-parallel layouts (Lattice's local backend and, when python3-torch is installed, PyTorch
// DDP, on the allocator it names) and the best-mode ratio covers them (PyTorch eager and, where
// its torch has torch.compile, compiled); bad values are refused. Speed itself is not asserted.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli_runner.hpp"

namespace lattice::testing {
namespace {

// A case row: "small (L4 d256 h4 V8192 T256 B8)  bf16  1x2  <lattice tok/s> <TFLOP/s> <peak
// TFLOP/s> <MFU>% <pytorch eager tok/s or -> <pytorch compiled tok/s or -> <ratio or ->".
struct CaseRow {
  std::string precision, layout, pytorch, compiled, ratio;
  double lattice = -1;
};

std::vector<CaseRow> case_rows(const std::string& out) {
  std::vector<CaseRow> rows;
  std::istringstream lines(out);
  std::string line, tflops, peak, mfu;
  while (std::getline(lines, line)) {
    if (line.rfind("small (", 0) != 0) continue;
    std::istringstream fields(line.substr(line.find(')') + 1));
    CaseRow row;
    fields >> row.precision >> row.layout >> row.lattice >> tflops >> peak >> mfu >> row.pytorch >>
        row.compiled >> row.ratio;
    // The MFU is the row's TFLOP/s over its own peak, both as printed.
    EXPECT_EQ(mfu.back(), '%') << line;
    EXPECT_NEAR(std::stod(mfu), 100.0 * std::stod(tflops) / std::stod(peak),
                0.05 + 100.0 * 0.0005 / std::stod(peak) * (1 + std::stod(tflops) / std::stod(peak)))
        << line;
    rows.push_back(row);
  }
  return rows;
}

struct BenchRun {
  CliResult result;
  std::vector<CaseRow> rows;
};

// `lattice bench train --shape small --precision bf16 --steps 1 --warmup 0 <args>` in a fresh
// directory, with its case rows.
BenchRun run_bench_train(const std::string& args, const std::string& directory) {
  BenchRun run;
  const TemporaryDirectory dir(directory);
  run.result = run_lattice(
      "bench train --shape small --precision bf16 --steps 1 --warmup 0 " + args, dir.path());
  run.rows = case_rows(run.result.out);
  return run;
}

bool python_has_torch() {
  return std::system("/usr/bin/python3 -c 'import torch' > /dev/null 2>&1") == 0;
}

TEST(BenchTrainCli, RoundsReportTheMedianOfEveryRound) {
  const BenchRun run = run_bench_train("--ranks 1 --rounds 3 --skip-pytorch", "bench-train-rounds");
  const CliResult& r = run.result;
  ASSERT_EQ(r.status, 0) << r.err;
  ASSERT_EQ(run.rows.size(), 1u) << r.out;
  EXPECT_EQ(run.rows[0].precision, "bf16");
  // The host: the CPU's model and the ISA tier Lattice's kernels run on.
  EXPECT_NE(r.out.find("CPU: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Lattice ISA: "), std::string::npos) << r.out;
  const double reported = run.rows[0].lattice;
  // Then the rounds line.
  std::istringstream lines(r.out);
  std::string line;
  std::vector<double> rounds;
  while (std::getline(lines, line)) {
    const auto at = line.find("3 rounds, medians above; lattice");
    if (at != std::string::npos) {
      std::istringstream values(
          line.substr(at + std::string("3 rounds, medians above; lattice").size()));
      double v;
      while (values >> v) rounds.push_back(v);
    }
  }
  ASSERT_EQ(rounds.size(), 3u) << r.out;
  std::sort(rounds.begin(), rounds.end());
  EXPECT_GT(rounds[0], 0.0);
  // Printed with %.0f on both lines: the row is the middle round.
  EXPECT_EQ(reported, rounds[1]) << r.out;
}

// One rank of every thread (T) and two data-parallel ranks of T/2 threads each, both timed on the
// same whole batch (the child inherits this process's OpenMP settings, hence the same T).
TEST(BenchTrainCli, RanksAddADataParallelLayout) {
  const int threads = omp_get_max_threads();
  if (threads < 2) GTEST_SKIP() << "a 2-rank layout needs 2 threads";
  const BenchRun run = run_bench_train("--ranks 1,2 --skip-pytorch", "bench-train-ranks");
  ASSERT_EQ(run.result.status, 0) << run.result.err;
  const std::vector<CaseRow>& rows = run.rows;
  ASSERT_EQ(rows.size(), 2u) << run.result.out;
  EXPECT_EQ(rows[0].layout, "1x" + std::to_string(threads));
  EXPECT_EQ(rows[1].layout, "2x" + std::to_string(threads / 2));
  for (const CaseRow& row : rows) {
    EXPECT_GT(row.lattice, 0.0) << row.layout;
    EXPECT_EQ(row.pytorch, "-") << row.layout;
    EXPECT_EQ(row.compiled, "-") << row.layout;
  }
}

// With python3-torch, PyTorch runs each layout too (2x1 under DistributedDataParallel over gloo)
// and the closing line divides the best mode of each side. Debian's torch 1.13 has no
// torch.compile: its compiled column stays "-" (a torch 2.x's is timed and counts as a mode).
TEST(BenchTrainCli, PytorchRunsEveryLayoutAndTheBestModesAreCompared) {
  if (!python_has_torch()) GTEST_SKIP() << "/usr/bin/python3 cannot import torch";
  if (omp_get_max_threads() < 2) GTEST_SKIP() << "a 2-rank layout needs 2 threads";
  const BenchRun run =
      run_bench_train("--ranks 1,2 --python /usr/bin/python3 --script '" LATTICE_SOURCE_DIR
                      "/bench/pytorch_train.py'",
                      "bench-train-ddp");
  const CliResult& r = run.result;
  ASSERT_EQ(r.status, 0) << r.err;
  const std::vector<CaseRow>& rows = run.rows;
  ASSERT_EQ(rows.size(), 2u) << r.out;
  double best_lattice = 0, best_pytorch = 0;
  for (const CaseRow& row : rows) {
    const double pytorch = std::stod(row.pytorch);
    EXPECT_GT(pytorch, 0.0) << row.layout;
    EXPECT_EQ(row.ratio.back(), 'x') << row.layout;
    best_lattice = std::max(best_lattice, row.lattice);
    best_pytorch = std::max(best_pytorch, pytorch);
    if (row.compiled != "-") best_pytorch = std::max(best_pytorch, std::stod(row.compiled));
  }
  EXPECT_NE(r.out.find("PyTorch: /usr/bin/python3, torch "), std::string::npos) << r.out;
  // The allocator PyTorch ran on is named; "auto" picks jemalloc where Debian's libjemalloc2 is.
  const bool have_jemalloc =
      std::filesystem::exists("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2") ||
      std::filesystem::exists("/usr/lib/aarch64-linux-gnu/libjemalloc.so.2");
  EXPECT_NE(r.out.find(have_jemalloc ? "PyTorch allocator: jemalloc ("
                                     : "PyTorch allocator: glibc malloc with GLIBC_TUNABLES"),
            std::string::npos)
      << r.out;
  // PyTorch's fp32 BLAS is named, and on a CPU with AVX-512 it runs OpenBLAS's AVX-512 kernels
  // even where Debian's OpenBLAS 0.3.21 falls back to its generic core (bench/pytorch_train.py).
  const auto blas_at = r.out.find("PyTorch BLAS: ");
  ASSERT_NE(blas_at, std::string::npos) << r.out;
  const std::string blas_line = r.out.substr(blas_at, r.out.find('\n', blas_at) - blas_at);
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512cd") && std::getenv("OPENBLAS_CORETYPE") == nullptr &&
      blas_line.find("PyTorch BLAS: OpenBLAS ") == 0) {
    const std::string core = blas_line.substr(23, blas_line.find(' ', 23) - 23);
    EXPECT_TRUE(core == "SkylakeX" || core == "Cooperlake" || core == "CooperLake" ||
                core == "SapphireRapids")
        << blas_line;
  }
  const auto at = r.out.find("-> best Lattice (");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string best_line = r.out.substr(at, r.out.find('\n', at) - at);
  const double ratio = std::stod(best_line.substr(best_line.rfind(": ") + 2));
  // The rows print %.0f tokens/s and the ratio %.2f: compare to within that rounding (each rate
  // off by up to half a token/s moves the quotient by that share of it: on the AMD host, PyTorch's
  // bf16 at 29 tokens/s made it 10.31 against the printed 10.29).
  const double quotient = best_lattice / best_pytorch;
  EXPECT_NEAR(ratio, quotient,
              0.01 + quotient * (0.5 / best_pytorch + 0.5 / std::max(best_lattice, 1.0)))
      << best_line;
}

TEST(BenchTrainCli, ImpossibleRoundsAreRefused) {
  const TemporaryDirectory dir("bench-train-bad-rounds");
  const CliResult r =
      run_lattice("bench train --shape small --rounds 0 --skip-pytorch", dir.path());
  EXPECT_NE(r.status, 0);
  EXPECT_NE((r.out + r.err).find("--rounds"), std::string::npos) << r.out << r.err;
}

TEST(BenchTrainCli, UnknownPytorchAllocatorIsRefused) {
  const TemporaryDirectory dir("bench-train-bad-allocator");
  const CliResult r =
      run_lattice("bench train --shape small --pytorch-allocator tcmalloc", dir.path());
  EXPECT_NE(r.status, 0);
  const std::string said = r.out + r.err;
  EXPECT_NE(said.find("--pytorch-allocator 'tcmalloc'"), std::string::npos) << said;
  EXPECT_NE(said.find("auto, jemalloc, glibc-thp or glibc"), std::string::npos) << said;
}

// A stand-in for the peer's python: an executable shell script whose probe (`--probe`) prints
// `probe` and whose run does `run`.
std::filesystem::path fake_python(const std::filesystem::path& dir, const std::string& probe,
                                  const std::string& run) {
  const std::filesystem::path path = dir / "fake-python";
  std::ofstream(path) << "#!/bin/sh\ncase \" $* \" in *\" --probe \"*) " << probe << ";; esac\n"
                      << run << "\n";
  std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  return path;
}

const char* const kProbeOk =
    "echo '{\"torch\": \"2.99\", \"blas\": \"fake\", \"sdpa\": true, \"fused_adamw\": true, "
    "\"compile\": false}'; exit 0";

// When the PyTorch side fails, the row names the cause: a crash by its signal (not "install the
// peer"), a python without torch by that, and the peer's own error line as it wrote it.
TEST(BenchTrainCli, APytorchFailureIsNamedByItsCause) {
  const TemporaryDirectory dir("bench-train-peer-failures");
  const std::string bench = "bench train --shape small --precision bf16 --steps 1 --warmup 0 ";
  auto run = [&](const std::string& probe, const std::string& body) {
    const std::filesystem::path python = fake_python(dir.path(), probe, body);
    return run_lattice(bench + "--python " + python.string() +
                           " --script '" LATTICE_SOURCE_DIR "/bench/pytorch_train.py'",
                       dir.path());
  };
  const CliResult crashed = run(kProbeOk, "kill -SEGV $$");
  ASSERT_EQ(crashed.status, 0) << crashed.out << crashed.err;
  EXPECT_NE(crashed.out.find("PyTorch crashed: killed by signal 11 (Segmentation fault)"),
            std::string::npos)
      << crashed.out;
  const size_t row = crashed.out.find("PyTorch crashed");
  ASSERT_NE(row, std::string::npos) << crashed.out;
  const std::string row_line = crashed.out.substr(row, crashed.out.find('\n', row) - row);
  EXPECT_EQ(row_line.find("install_peers"), std::string::npos) << row_line;

  const CliResult reported =
      run(kProbeOk,
          "echo '{\"error\": \"FloatingPointError: the loss is nan after 2 steps\"}'; "
          "exit 1");
  EXPECT_NE(reported.out.find("PyTorch failed: FloatingPointError: the loss is nan after 2 steps"),
            std::string::npos)
      << reported.out;

  const CliResult no_torch =
      run("echo \"ModuleNotFoundError: No module named 'torch'\" >&2; exit 1", "exit 1");
  EXPECT_NE(no_torch.out.find(
                "fake-python: no torch in this python (run `bash scripts/install_peers.sh`"),
            std::string::npos)
      << no_torch.out;

  const CliResult exited = run(kProbeOk, "echo 'something else went wrong' >&2; exit 3");
  EXPECT_NE(
      exited.out.find("PyTorch exited with status 3 and no result: something else went wrong"),
      std::string::npos)
      << exited.out;
}

// `lattice bench checkpoint` on a tiny model: the three runs, the per-checkpoint rows against the
// disk (and torch.save where /usr/bin/python3 has torch), and the ratios line.
TEST(BenchCheckpointCli, PrintsThePerCheckpointRowsAndRatios) {
  TemporaryDirectory dir("bench-checkpoint");
  const CliResult r =
      run_lattice("bench checkpoint --preset llama-tiny --seq-len 32 --steps 4 --rounds 1 --dir " +
                      (dir.path() / "runs").string(),
                  dir.path());
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  for (const char* row : {"lattice sync: training thread waits",
                          "lattice async: training thread waits", "disk: one file written"})
    EXPECT_NE(r.out.find(row), std::string::npos) << row << "\n" << r.out;
  EXPECT_NE(r.out.find("MB a checkpoint"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ratios: sync / disk "), std::string::npos) << r.out;
  if (python_has_torch())
    EXPECT_NE(r.out.find("pytorch torch.save + fsync"), std::string::npos) << r.out;
  expect_one_error_line(run_lattice("bench checkpoint --steps 3", dir.path()), "--steps even");
}

}  // namespace
}  // namespace lattice::testing
