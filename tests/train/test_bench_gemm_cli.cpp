// `lattice bench gemm` through the CLI: it names the CPU and the ISA, prints one row per GEMM (the
// 1024^3 peak product, then the small model's distinct Linear shapes at 2,048 rows) and precision
// with Lattice's GFLOP/s, and where /usr/bin/python3 has torch PyTorch's F.linear at the same
// shape with the ratio of the two as printed; --cold says so; bad values are refused. Speed itself
// is not asserted.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "cli_runner.hpp"

namespace lattice::testing {
namespace {

struct GemmRow {
  std::string name, shape, precision, pytorch, ratio;
  double lattice = -1;
};

// The table's rows: "<name>  MxKxN  prec  lattice  pytorch-or-  ratio-or-"; names may hold spaces
// ("attention out"), so the fields are read from the shape (the first token with two 'x') on.
std::vector<GemmRow> gemm_rows(const std::string& out) {
  std::vector<GemmRow> rows;
  std::istringstream lines(out);
  std::string line;
  bool table = false;
  while (std::getline(lines, line)) {
    if (line.rfind("GEMM ", 0) == 0) {
      table = true;
      continue;
    }
    if (!table || line.empty()) continue;
    std::istringstream words(line);
    std::string word, name;
    while (words >> word && std::count(word.begin(), word.end(), 'x') != 2)
      name += (name.empty() ? "" : " ") + word;
    if (std::count(word.begin(), word.end(), 'x') != 2) continue;  // not a row (the notes)
    GemmRow row;
    row.name = name, row.shape = word;
    words >> row.precision >> row.lattice >> row.pytorch >> row.ratio;
    rows.push_back(row);
  }
  return rows;
}

const std::vector<std::string> kSmallShapes{"1024x1024x1024", "2048x256x768",  "2048x256x256",
                                            "2048x256x1024",  "2048x1024x256", "2048x256x8192"};

TEST(BenchGemmCli, PrintsTheHostAndOneRowPerShapeAndPrecision) {
  const TemporaryDirectory dir("bench-gemm");
  const CliResult r =
      run_lattice("bench gemm --shape small --precision fp32 bf16 --skip-pytorch", dir.path());
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("CPU: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Lattice ISA: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("operands: warm"), std::string::npos) << r.out;
  const auto rows = gemm_rows(r.out);
  ASSERT_EQ(rows.size(), 2 * kSmallShapes.size()) << r.out;
  for (size_t i = 0; i < rows.size(); ++i) {
    SCOPED_TRACE(r.out);
    EXPECT_EQ(rows[i].shape, kSmallShapes[i % kSmallShapes.size()]);
    EXPECT_EQ(rows[i].precision, i < kSmallShapes.size() ? "fp32" : "bf16");
    EXPECT_GT(rows[i].lattice, 0.0);
    EXPECT_EQ(rows[i].pytorch, "-");
    EXPECT_EQ(rows[i].ratio, "-");
  }
  EXPECT_EQ(rows[0].name, "1024^3 (the peak)");
  EXPECT_EQ(rows[2].name, "attention out");
}

// With python3-torch, every row has PyTorch's rate and the ratio of the two printed rates.
TEST(BenchGemmCli, PytorchRunsEveryShapeColdToo) {
  if (std::system("/usr/bin/python3 -c 'import torch' > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch";
  const TemporaryDirectory dir("bench-gemm-pytorch");
  const CliResult r = run_lattice(
      "bench gemm --shape small --precision fp32 --cold --python /usr/bin/python3 --script "
      "'" LATTICE_SOURCE_DIR "/bench/pytorch_gemm.py'",
      dir.path());
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("operands: cold"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("PyTorch (/usr/bin/python3): "), std::string::npos) << r.out;
  const auto rows = gemm_rows(r.out);
  ASSERT_EQ(rows.size(), kSmallShapes.size()) << r.out;
  for (const auto& row : rows) {
    SCOPED_TRACE(row.shape);
    const double pytorch = std::stod(row.pytorch);
    ASSERT_GT(pytorch, 0.0);
    ASSERT_EQ(row.ratio.back(), 'x');
    // Printed to the GFLOP/s and to 0.01: the ratio of the printed rates within their rounding.
    const double quotient = row.lattice / pytorch;
    EXPECT_NEAR(std::stod(row.ratio), quotient,
                0.006 + quotient * (0.5 / pytorch + 0.5 / row.lattice));
  }
}

TEST(BenchGemmCli, UnknownShapeAndPrecisionAreRefused) {
  const TemporaryDirectory dir("bench-gemm-bad");
  const CliResult shape = run_lattice("bench gemm --shape tiny --skip-pytorch", dir.path());
  EXPECT_NE(shape.status, 0);
  EXPECT_NE((shape.out + shape.err).find("use small, gpt2-124m or all"), std::string::npos)
      << shape.out << shape.err;
  EXPECT_EQ(shape.out.find("GEMM "), std::string::npos) << shape.out;  // refused before any run
  const CliResult precision = run_lattice("bench gemm --precision fp16 --skip-pytorch", dir.path());
  EXPECT_NE(precision.status, 0);
  EXPECT_NE((precision.out + precision.err).find("fp16"), std::string::npos)
      << precision.out << precision.err;
}

}  // namespace
}  // namespace lattice::testing
