// TensorBoard beside metrics.jsonl: a training run's event file, read back by TensorBoard's own
// reader (tests/reference/read_tensorboard.py), holds one event per JSONL record with every number
// of the record (losses, lr, throughput, memory, communication, MoE load) under its JSON path, as
// a 32-bit float; metrics.tensorboard = false writes none.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli_runner.hpp"

using namespace lattice::testing;
namespace fs = std::filesystem;

namespace {

class TensorBoardCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::system("/usr/bin/python3 -c 'import tensorboard' > /dev/null 2>&1") != 0)
      GTEST_SKIP() << "/usr/bin/python3 cannot import tensorboard (scripts/install_deps.sh "
                      "installs it from PyPI)";
    dir_ = fresh_directory(::testing::UnitTest::GetInstance()->current_test_info()->name());
    write_small_corpus(dir_ / "corpus.txt");
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

// A MoE model on two expert-parallel ranks: the record has communication and routing numbers too.
std::string moe_run(const std::string& extra) {
  return "train --job.run_dir=run --model.preset=mixtral-tiny --model.vocab_size=256"
         " --model.max_seq_len=32 --training.seq_len=32 --training.global_batch_size=8"
         " --training.threads=1 --training.steps=12 --parallelism.dp=2 --parallelism.ep=2"
         " --data.train_files=corpus.txt --data.val_fraction=0.1 --validation.freq=4"
         " --metrics.log_freq=4 --metrics.peak_tflops=1 --checkpoint.enable=false" +
         extra;
}

// Every number of a JSONL record but the step, by its path ("memory/rss"), arrays left out.
void numbers(const nlohmann::json& j, const std::string& prefix,
             std::vector<std::pair<std::string, double>>& out) {
  for (const auto& [key, value] : j.items()) {
    const std::string tag = prefix.empty() ? key : prefix + "/" + key;
    if (value.is_object())
      numbers(value, tag, out);
    else if (value.is_number() && tag != "step")
      out.emplace_back(tag, value.get<double>());
  }
}

}  // namespace

TEST_F(TensorBoardCli, EventsHoldEveryNumberOfTheJsonl) {
  const CliResult r = run_lattice(moe_run(""), dir_);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  const auto records = read_jsonl(dir_ / "run" / "metrics.jsonl");
  ASSERT_EQ(records.size(), 12u);
  const fs::path json = dir_ / "events.json";
  const std::string command = "/usr/bin/python3 '" + std::string(LATTICE_SOURCE_DIR) +
                              "/tests/reference/read_tensorboard.py' '" + (dir_ / "run").string() +
                              "' > '" + json.string() + "'";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  const nlohmann::json read = nlohmann::json::parse(slurp(json));
  EXPECT_EQ(read.at("file_version"), "brain.Event:2");
  const auto& events = read.at("events");
  ASSERT_EQ(events.size(), records.size());
  size_t validated = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    SCOPED_TRACE("record " + std::to_string(i));
    EXPECT_EQ(events[i].at("step"), records[i].at("step"));
    std::vector<std::pair<std::string, double>> expected;
    numbers(records[i], "", expected);
    const auto& scalars = events[i].at("scalars");
    EXPECT_EQ(scalars.size(), expected.size());
    for (const auto& [tag, value] : expected) {
      ASSERT_TRUE(scalars.contains(tag)) << tag;
      EXPECT_EQ(scalars.at(tag).get<float>(), static_cast<float>(value)) << tag;
    }
    validated += scalars.contains("val_loss");
  }
  // The scalars the issue names are among them.
  for (const char* tag : {"loss", "lr", "grad_norm", "tokens_per_second", "mfu", "memory/rss",
                          "exposed_comm_seconds", "ep_comm_seconds", "moe/max_mean_load"})
    EXPECT_TRUE(events.back().at("scalars").contains(tag)) << tag;
  EXPECT_EQ(validated, 3u);  // validation at steps 4, 8 and 12
}

TEST_F(TensorBoardCli, OffWritesNoEventFile) {
  const CliResult r = run_lattice(moe_run(" --metrics.tensorboard=false"), dir_);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_TRUE(fs::exists(dir_ / "run" / "metrics.jsonl"));
  for (const auto& e : fs::directory_iterator(dir_ / "run"))
    EXPECT_EQ(e.path().filename().string().find("events.out.tfevents."), std::string::npos)
        << e.path();
}
