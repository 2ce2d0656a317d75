// GEMM benchmark: see gemm_benchmark.hpp.
#include "lattice/train/gemm_benchmark.hpp"

#include <set>
#include <tuple>

#include "lattice/train/peer_process.hpp"
#include "lattice/train/step_bound.hpp"

namespace lattice::train {

std::vector<GemmCase> gemm_cases(const std::vector<BenchmarkCase>& models) {
  std::vector<GemmCase> cases{{"1024^3 (the peak)", 1024, 1024, 1024}};
  std::set<std::tuple<int64_t, int64_t, int64_t>> seen{{1024, 1024, 1024}};
  for (const auto& m : models)
    for (const auto& g : step_linears(m.model, m.batch * m.seq_len))
      if (seen.insert({g.M, g.K, g.N}).second) cases.push_back({g.name, g.M, g.K, g.N});
  return cases;
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
    why = peer_failure("PyTorch's GEMM peer", status, output);
    return std::nullopt;
  }
  std::vector<double> rates;
  for (const auto& gflops : j.at("gflops")) rates.push_back(gflops.get<double>() * 1e9);
  blas = j.value("blas", "");
  return rates;
}

}  // namespace lattice::train
