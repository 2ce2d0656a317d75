// docs/training.md's key table is the binary's `lattice train --help-config=markdown`
// (scripts/update_config_docs.sh regenerates it between its two markers).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "cli_runner.hpp"

namespace lattice::train {
namespace {

using lattice::testing::CliResult;
using lattice::testing::run_lattice;
using lattice::testing::slurp;
using lattice::testing::TemporaryDirectory;

// docs/training.md carries the markdown table between its two markers; it must be the binary's.
TEST(ConfigDocs, TrainingDocsKeyTableIsUpToDate) {
  const std::string doc = slurp(std::filesystem::path(LATTICE_SOURCE_DIR) / "docs/training.md");
  const std::string begin = "<!-- config-keys:begin (scripts/update_config_docs.sh) -->\n";
  const std::string end = "<!-- config-keys:end -->";
  const size_t from = doc.find(begin), to = doc.find(end);
  ASSERT_NE(from, std::string::npos) << "docs/training.md lacks the line " << begin;
  ASSERT_NE(to, std::string::npos) << "docs/training.md lacks the line " << end;
  ASSERT_LT(from, to);
  TemporaryDirectory dir("config-docs");
  const CliResult r = run_lattice("train --help-config=markdown", dir.path());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(doc.substr(from + begin.size(), to - from - begin.size()), r.out)
      << "docs/training.md's key table is out of date: run scripts/update_config_docs.sh";
}

}  // namespace
}  // namespace lattice::train
