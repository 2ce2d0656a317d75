// Google Benchmark of MatmulEngine on Linear shapes from training (GPT-2 small and 124M): forward,
// input gradient and weight gradient, fp32 and bf16, reported as FLOP/s. Not part of the CMake
// build:
//   g++ -std=c++20 -O3 -march=native -fopenmp -Isrc bench/bench_matmul.cpp \
//       build/liblattice_kernels.a build/liblattice_core.a -ldnnl -lbenchmark -lpthread -o
//       bench_matmul
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "lattice/core/aligned_allocation.hpp"
#include "lattice/core/rng.hpp"
#include "lattice/kernels/cpu/matmul.hpp"

namespace {

using lattice::kernels::MatmulEngine;
using lattice::kernels::Precision;

enum class Pass { forward, input_grad, weight_grad };

void bench_linear(benchmark::State& state, Pass pass, Precision precision) {
  const int64_t M = state.range(0), K = state.range(1), N = state.range(2);
  lattice::Rng rng(1);
  // Cache-line-aligned, as tensors are: AMX tile rows that straddle lines run at about half speed.
  lattice::AlignedVector<float> in(static_cast<size_t>(M * K)), weight(static_cast<size_t>(N * K)),
      out(static_cast<size_t>(M * N)), d_in(in.size()), d_weight(weight.size());
  for (auto& x : in) x = rng.normal();
  for (auto& x : weight) x = 0.02f * rng.normal();
  for (auto& x : out) x = rng.normal();
  MatmulEngine engine;
  for (auto _ : state) {
    switch (pass) {
      case Pass::forward:
        engine.forward(out.data(), in.data(), weight.data(), nullptr, M, K, N, precision);
        break;
      case Pass::input_grad:
        engine.backward(d_in.data(), nullptr, nullptr, out.data(), in.data(), weight.data(), M, K,
                        N, precision);
        break;
      case Pass::weight_grad:
        engine.backward(nullptr, d_weight.data(), nullptr, out.data(), in.data(), weight.data(), M,
                        K, N, precision);
        break;
    }
    benchmark::ClobberMemory();
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(M * K * N),
                                                benchmark::Counter::kIsIterationInvariantRate);
}

void shapes(benchmark::internal::Benchmark* b) {
  b->Args({2048, 256, 768})->Args({2048, 256, 1024})->Args({2048, 1024, 256});
  b->Args({4096, 768, 2304})->Args({4096, 768, 3072})->Args({4096, 3072, 768});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK_CAPTURE(bench_linear, fwd_fp32, Pass::forward, Precision::fp32)->Apply(shapes);
BENCHMARK_CAPTURE(bench_linear, fwd_bf16, Pass::forward, Precision::bf16)->Apply(shapes);
BENCHMARK_CAPTURE(bench_linear, dinput_fp32, Pass::input_grad, Precision::fp32)->Apply(shapes);
BENCHMARK_CAPTURE(bench_linear, dinput_bf16, Pass::input_grad, Precision::bf16)->Apply(shapes);
BENCHMARK_CAPTURE(bench_linear, dweight_fp32, Pass::weight_grad, Precision::fp32)->Apply(shapes);
BENCHMARK_CAPTURE(bench_linear, dweight_bf16, Pass::weight_grad, Precision::bf16)->Apply(shapes);

}  // namespace

BENCHMARK_MAIN();
