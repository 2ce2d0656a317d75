// The `lattice bench gemm` target: a Linear's forward GEMM through Lattice's matmul engine against
// PyTorch's torch.nn.functional.linear at the same shapes (the 1024^3 product the MFU peak is
// calibrated on and the Linear shapes of `bench train`'s models), precision and threads, warm or
// with the caches flushed between runs; prints the host (CPU model, the ISA Lattice chose,
// PyTorch's version and BLAS) and a table of GFLOP/s with their ratio.
#include <omp.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench_host.hpp"
#include "lattice/core/cpu_features.hpp"
#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/train/gemm_benchmark.hpp"
#include "lattice/train/metrics.hpp"
#include "lattice/train/train_benchmark.hpp"
#include "verbs.hpp"

namespace lattice::cli {

void register_bench_gemm(CLI::App& bench) {
  struct Options {
    std::string shape = "small", python, script;
    std::vector<std::string> precisions{"fp32", "bf16"};
    bool skip_pytorch = false, cold = false;
  };
  auto o = std::make_shared<Options>();
  auto* target = bench.add_subcommand(
      "gemm",
      "A Linear's forward GEMM against PyTorch's F.linear (same shapes, precision, threads)");
  target
      ->add_option("--shape", o->shape,
                   "the Linear shapes of bench train's model: small, gpt2-124m or all (with the "
                   "1024^3 peak product)")
      ->capture_default_str();
  target->add_option("--precision", o->precisions, "fp32 and/or bf16")->capture_default_str();
  target->add_option("--python", o->python,
                     "python with torch (default: as bench train: the venv of "
                     "scripts/install_peers.sh where it exists, else /usr/bin/python3)");
  target->add_option("--script", o->script, "PyTorch side (default: bench/pytorch_gemm.py)");
  target->add_flag("--skip-pytorch", o->skip_pytorch, "measure Lattice only");
  target->add_flag("--cold", o->cold,
                   "read and write 256 MiB between timed runs (both sides), so that the operands "
                   "come from memory as in a training step, not from the cache");
  target->callback([o] {
    const auto models = train::benchmark_cases(o->shape);  // refuses an unknown shape first
    std::vector<kernels::Precision> precisions;
    for (const auto& name : o->precisions) precisions.push_back(kernels::parse_precision(name));
    const std::string script =
        o->script.empty() ? find_repository_file("bench/pytorch_gemm.py") : o->script;
    check(o->skip_pytorch || !script.empty(),
          "cannot find bench/pytorch_gemm.py: run from the repository or pass --script");
    const std::string python = o->python.empty() ? train::default_pytorch_python() : o->python;
    const int threads = omp_get_max_threads();
    kernels::CpuOps ops;
    std::printf("CPU: %s\n", cpu_model().c_str());
    std::printf("threads %d\n", threads);
    std::printf("Lattice ISA: %s\n", cpu_features().best_tier().c_str());
    std::printf("Lattice: %s\n", ops.describe_bf16().c_str());
    std::printf("operands: %s\n", o->cold ? "cold (256 MiB read and written between runs)"
                                          : "warm (each run after the previous one)");
    const auto cases = train::gemm_cases(models);
    std::printf("\n%-20s %-18s %5s %14s %14s %7s\n", "GEMM", "M x K x N", "prec", "lattice GF/s",
                "pytorch GF/s", "ratio");
    std::string blas, pytorch_off;
    for (const auto precision : precisions) {
      std::optional<std::vector<double>> torch_rates;
      if (!o->skip_pytorch && pytorch_off.empty()) {
        torch_rates = train::pytorch_linear_flops(cases, precision, threads, python, script,
                                                  o->cold, pytorch_off, blas);
        if (!torch_rates) std::printf("PyTorch not run: %s\n", pytorch_off.c_str());
      }
      for (size_t i = 0; i < cases.size(); ++i) {
        const auto& c = cases[i];
        const double lattice = train::linear_forward_flops(c.M, c.K, c.N, precision, ops, o->cold);
        const std::string shape =
            std::to_string(c.M) + "x" + std::to_string(c.K) + "x" + std::to_string(c.N);
        std::printf("%-20s %-18s %5s %14.0f", c.name.c_str(), shape.c_str(),
                    std::string(kernels::precision_name(precision)).c_str(), lattice / 1e9);
        if (torch_rates)
          std::printf(" %14.0f %6.2fx\n", (*torch_rates)[i] / 1e9, lattice / (*torch_rates)[i]);
        else
          std::printf(" %14s %7s\n", "-", "-");
        std::fflush(stdout);
      }
    }
    if (!blas.empty()) std::printf("PyTorch (%s): %s\n", python.c_str(), blas.c_str());
    std::printf(
        "\nLattice: MatmulEngine::forward on cache-line-aligned operands (bf16 rounded before the "
        "timing; the weight laid out for the kernel on every call, as a Linear's is); PyTorch: "
        "torch.nn.functional.linear on bf16 or fp32 tensors. Each the best of at least 8 timed "
        "runs "
        "over at least 0.2 s of them.\n");
  });
}

}  // namespace lattice::cli
