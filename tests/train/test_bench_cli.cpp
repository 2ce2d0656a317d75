// `lattice bench train` through the CLI: --rounds alternates the measurements and reports the
// median of the rounds it prints; bad values are refused. Speed itself is not asserted.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "cli_runner.hpp"

namespace lattice::testing {
namespace {

TEST(BenchTrainCli, RoundsReportTheMedianOfEveryRound) {
  const auto dir = fresh_directory("bench-train-rounds");
  const CliResult r = run_lattice(
      "bench train --shape small --precision bf16 --steps 1 --warmup 0 --rounds 3 --skip-pytorch",
      dir);
  ASSERT_EQ(r.status, 0) << r.err;
  // The case row: "small (L4 d256 h4 V8192 T256 B8)  bf16  <tok/s> ..."; then the rounds line.
  std::istringstream lines(r.out);
  std::string line;
  double reported = -1;
  std::vector<double> rounds;
  while (std::getline(lines, line)) {
    if (line.rfind("small (", 0) == 0) {
      std::istringstream fields(line.substr(line.find(')') + 1));
      std::string precision;
      fields >> precision >> reported;
      EXPECT_EQ(precision, "bf16");
    }
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

TEST(BenchTrainCli, ImpossibleRoundsAreRefused) {
  const auto dir = fresh_directory("bench-train-bad-rounds");
  const CliResult r = run_lattice("bench train --shape small --rounds 0 --skip-pytorch", dir);
  EXPECT_NE(r.status, 0);
  EXPECT_NE((r.out + r.err).find("--rounds"), std::string::npos) << r.out << r.err;
}

}  // namespace
}  // namespace lattice::testing
