// `lattice train --help-config` and `--help` through the binary: every config key by section, the
// markdown table, a bad format refused with one line, the sections in the verb's help.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "cli_runner.hpp"
#include "lattice/train/config_help.hpp"
#include "lattice/train/config_schema.hpp"

namespace lattice::train {
namespace {

using lattice::testing::CliResult;
using lattice::testing::expect_one_error_line;
using lattice::testing::run_lattice;
using lattice::testing::slurp;
using lattice::testing::TemporaryDirectory;

TEST(ConfigHelpCli, HelpConfigPrintsEveryKeyBySection) {
  TemporaryDirectory dir("help-config");
  const CliResult r = run_lattice("train --help-config", dir.path());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.out, config_help_text());
  // Spot checks of the binary's own output: a section header, a key line with type and default.
  EXPECT_NE(r.out.find("\n[parallelism]  "), std::string::npos);
  EXPECT_NE(r.out.find("  steps  "), std::string::npos);
  EXPECT_NE(r.out.find(" integer "), std::string::npos);
  EXPECT_NE(r.out.find(" \"runs/default\" "), std::string::npos);
  // Nothing was trained: no run directory appeared.
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "runs"));
}

TEST(ConfigHelpCli, HelpConfigMarkdownPrintsTheTable) {
  TemporaryDirectory dir("help-config-markdown");
  const CliResult r = run_lattice("train --help-config=markdown", dir.path());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, config_help_markdown());
  EXPECT_EQ(r.out.rfind("| section | key | type | default | meaning |\n", 0), 0u);
}

TEST(ConfigHelpCli, AnUnknownHelpFormatIsOneErrorLine) {
  TemporaryDirectory dir("help-config-bad");
  expect_one_error_line(run_lattice("train --help-config=yaml", dir.path()),
                        "--help-config=yaml is not a format: use --help-config (text) or "
                        "--help-config=markdown");
}

TEST(ConfigHelpCli, TrainHelpNamesHelpConfigAndTheSections) {
  TemporaryDirectory dir("train-help");
  const CliResult r = run_lattice("train --help", dir.path());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("--help-config"), std::string::npos) << r.out;
  for (const ConfigSection& s : config_sections())
    EXPECT_NE(r.out.find("  " + s.name + " "), std::string::npos) << s.name << " in " << r.out;
}

}  // namespace
}  // namespace lattice::train
