// GEMM benchmark (`lattice bench gemm`): a Linear's forward, out[M,N] = in[M,K] · W[N,K]^T, through
// Lattice's matmul engine and through PyTorch's torch.nn.functional.linear (bench/pytorch_gemm.py)
// at the same shapes, precision and thread count: the 1024^3 product the MFU peak is calibrated on
// and the Linear shapes of a training step. Warm (each run on the operands its previous run left
// in cache, as the peak and the step bound time them) or cold (the caches flushed between runs,
// untimed, as a training step mostly meets its operands).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lattice/kernels/precision.hpp"
#include "lattice/train/train_benchmark.hpp"

namespace lattice::train {

struct GemmCase {
  std::string name;
  int64_t M = 0, K = 0, N = 0;
  double flops() const { return 2.0 * static_cast<double>(M * K) * static_cast<double>(N); }
};

// The 1024^3 calibration product, then each distinct Linear shape of one training step of each
// dense model (at its batch · seq_len rows; step_bound.hpp's step_linears), in order. Lattice's
// rate on each: metrics.hpp's linear_forward_flops.
std::vector<GemmCase> gemm_cases(const std::vector<BenchmarkCase>& models);

// PyTorch's rates (FLOP/s) on the cases, in order, from `script` (bench/pytorch_gemm.py) through
// `python` with `threads` threads; nullopt with the reason and the fix in `why` when it cannot run.
// `blas` receives the BLAS and oneDNN it names.
std::optional<std::vector<double>> pytorch_linear_flops(const std::vector<GemmCase>& cases,
                                                        kernels::Precision precision, int threads,
                                                        const std::string& python,
                                                        const std::string& script, bool cold,
                                                        std::string& why, std::string& blas);

}  // namespace lattice::train
