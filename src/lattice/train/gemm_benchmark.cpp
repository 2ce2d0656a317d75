// GEMM benchmark: see gemm_benchmark.hpp.
#include "lattice/train/gemm_benchmark.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <tuple>

#include "lattice/core/aligned_allocation.hpp"
#include "lattice/core/dtype.hpp"
#include "lattice/kernels/cpu/convert.hpp"
#include "lattice/train/peer_process.hpp"
#include "lattice/train/step_bound.hpp"

namespace lattice::train {

std::vector<GemmCase> gemm_cases(const model::ModelConfig& model, int64_t tokens) {
  std::vector<GemmCase> cases{{"1024^3 (the peak)", 1024, 1024, 1024}};
  std::set<std::tuple<int64_t, int64_t, int64_t>> seen{{1024, 1024, 1024}};
  for (const auto& g : step_linears(model, tokens))
    if (seen.insert({g.M, g.K, g.N}).second) cases.push_back({g.name, g.M, g.K, g.N});
  return cases;
}

double lattice_linear_flops(const GemmCase& c, kernels::Precision precision,
                            kernels::MatmulEngine& matmul, bool cold) {
  const auto elements = [](int64_t rows, int64_t cols) { return static_cast<size_t>(rows * cols); };
  AlignedVector<float> in(elements(c.M, c.K)), weight(elements(c.N, c.K)), out(elements(c.M, c.N));
  for (size_t i = 0; i < in.size(); ++i) in[i] = 0.01f * static_cast<float>(i % 97) - 0.48f;
  for (size_t i = 0; i < weight.size(); ++i)
    weight[i] = 0.001f * static_cast<float>(i % 89) - 0.04f;
  const bool bf16 = precision == kernels::Precision::bf16 && !matmul.bf16_on_fp32_units();
  AlignedVector<lattice::bf16> in16, weight16;
  kernels::Bf16Operands rounded;
  if (bf16) {
    in16.resize(in.size()), weight16.resize(weight.size());
    kernels::convert_to_bf16(in16.data(), in.data(), static_cast<int64_t>(in.size()));
    kernels::convert_to_bf16(weight16.data(), weight.data(), static_cast<int64_t>(weight.size()));
    rounded.in = in16.data(), rounded.weight = weight16.data();
  }
  AlignedVector<int32_t> flush(cold ? static_cast<size_t>(kColdFlushBytes / 4) : 0);
  const auto run = [&] {
    matmul.forward(out.data(), bf16 ? nullptr : in.data(), weight.data(), nullptr, c.M, c.K, c.N,
                   precision, rounded);
  };
  run();  // the first call lays out the engine's buffers
  using Clock = std::chrono::steady_clock;
  double best = 1e300;
  const auto started = Clock::now();
  for (int runs = 0;
       runs < 8 || std::chrono::duration<double>(Clock::now() - started).count() < 0.2; ++runs) {
    if (cold) {
#pragma omp parallel for schedule(static)
      for (size_t i = 0; i < flush.size(); i += 16) flush[i] += 1;
    }
    const auto begin = Clock::now();
    run();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - begin).count());
  }
  return c.flops() / best;
}

std::optional<std::vector<double>> pytorch_linear_flops(const std::vector<GemmCase>& cases,
                                                        kernels::Precision precision, int threads,
                                                        const std::string& python,
                                                        const std::string& script, bool cold,
                                                        std::string& why, std::string& blas) {
  std::string shapes;
  for (const auto& c : cases) {
    if (!shapes.empty()) shapes += ';';
    shapes += std::to_string(c.M);
    shapes += ',';
    shapes += std::to_string(c.K);
    shapes += ',';
    shapes += std::to_string(c.N);
  }
  const std::string command = "'" + python + "' '" + script + "' --shapes '" + shapes +
                              "' --precision " + std::string(kernels::precision_name(precision)) +
                              " --threads " + std::to_string(threads) + (cold ? " --cold" : "");
  std::string output;
  const int status = run_captured(command, output);
  const auto j = last_json_line(output, "gflops");
  if (status != 0 || !j.is_object() || !j.at("gflops").is_array() ||
      j.at("gflops").size() != cases.size()) {
    const auto error = last_json_line(output, "error");
    why = error.is_object() && error.at("error").is_string()
              ? "PyTorch failed: " + error.at("error").get<std::string>()
              : "the PyTorch GEMM peer failed (run `bash scripts/install_peers.sh` for PyTorch's "
                "venv, or pass --python a python with torch): " +
                    tail_line(output);
    return std::nullopt;
  }
  std::vector<double> rates;
  for (const auto& gflops : j.at("gflops")) rates.push_back(gflops.get<double>() * 1e9);
  blas = j.value("blas", "");
  return rates;
}

}  // namespace lattice::train
