// Chrome traces of real runs in any layout (`metrics.trace_steps = "a:b"`, issue #25): one process
// per world rank, the traced steps and no others, one track per communication group with each
// collective named with its operation and size and entered during its step (dp x tp with ZeRO-1:
// the tp all-reduces, ZeRO's reduce-scatters and all-gathers; a MoE run with expert parallelism:
// the all-to-alls), valid JSON in the Trace Event format; a malformed range is one error line.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "../train/cli_runner.hpp"
#include "dp_fixture.hpp"

using namespace lattice::testing;
namespace fs = std::filesystem;

namespace {

std::string tiny_flags(const fs::path& dir, const std::string& preset) {
  return " --model.preset=" + preset +
         " --model.vocab_size=256 --model.max_seq_len=32 --training.seq_len=32"
         " --training.global_batch_size=8 --training.threads=1 --training.steps=4"
         " --data.train_files=" +
         (dir / "corpus.txt").string() +
         " --data.val_fraction=0.1 --validation.freq=0 --metrics.peak_tflops=1"
         " --checkpoint.enable=false --job.run_dir=" +
         (dir / "run").string();
}

struct Traced {
  std::set<int> processes;
  std::map<int, std::map<std::string, double>> step_start, step_end;  // pid -> step -> us
  // (pid, track name) -> event names
  std::map<std::pair<int, std::string>, std::multiset<std::string>> events;
};

// Reads the trace; checks every collective against its step's span on the way.
Traced read_trace(const fs::path& path) {
  const nlohmann::json j = nlohmann::json::parse(slurp(path));
  Traced t;
  std::map<std::pair<int, int>, std::string> track_names;
  for (const auto& e : j.at("traceEvents")) {
    if (e.at("ph") != "M") continue;
    const int pid = e.at("pid").get<int>();
    if (e.at("name") == "process_name") t.processes.insert(pid);
    if (e.at("name") == "thread_name")
      track_names[{pid, e.at("tid").get<int>()}] = e.at("args").at("name").get<std::string>();
  }
  for (const auto& e : j.at("traceEvents"))
    if (e.at("ph") == "X" && e.at("cat") == "step") {
      const int pid = e.at("pid").get<int>();
      const std::string name = e.at("name").get<std::string>();
      t.step_start[pid][name] = e.at("ts").get<double>();
      t.step_end[pid][name] = e.at("ts").get<double>() + e.at("dur").get<double>();
    }
  for (const auto& e : j.at("traceEvents")) {
    if (e.at("ph") == "M") continue;
    const int pid = e.at("pid").get<int>();
    const std::string track = track_names.at({pid, e.at("tid").get<int>()});
    t.events[{pid, track}].insert(e.at("name").get<std::string>());
    if (e.at("cat") != "collective") continue;
    const std::string step = "step " + std::to_string(e.at("args").at("step").get<int>());
    // Entered during its step (an asynchronous one, e.g. ZeRO's gather of the updated shards, may
    // end in the next step's forward).
    EXPECT_GE(e.at("ts").get<double>(), t.step_start[pid].at(step)) << e.dump();
    EXPECT_LE(e.at("ts").get<double>(), t.step_end[pid].at(step)) << e.dump();
    EXPECT_GT(e.at("args").at("bytes").get<int64_t>(), 0) << e.dump();
  }
  return t;
}

bool any_starts_with(const std::multiset<std::string>& names, const std::string& prefix) {
  for (const std::string& n : names)
    if (n.rfind(prefix, 0) == 0) return true;
  return false;
}

class TraceCli : public CorpusDirectoryTest {};

}  // namespace

TEST_F(TraceCli, TensorAndDataParallelStepsWithTheirCollectives) {
  const CliResult r = run_lattice("train" + tiny_flags(dir_, "llama-tiny") +
                                      " --dp 2 --tp 2 --zero 1 --metrics.trace_steps=2:3",
                                  dir_);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  const fs::path path = dir_ / "run" / "trace.json";  // the default path
  ASSERT_TRUE(fs::exists(path)) << r.out;
  const Traced t = read_trace(path);
  EXPECT_EQ(t.processes, (std::set<int>{0, 1, 2, 3}));
  for (int pid = 0; pid < 4; ++pid) {
    SCOPED_TRACE(pid);
    EXPECT_EQ(t.events.at({pid, "steps"}), (std::multiset<std::string>{"step 2", "step 3"}));
    const auto& tp = t.events.at({pid, "tp"});
    EXPECT_TRUE(any_starts_with(tp, "allreduce ")) << "no tp all-reduce";
    for (const std::string& name : tp)
      EXPECT_TRUE(name.find(" B") != std::string::npos || name.find(" KiB") != std::string::npos)
          << name;
    const auto& shard = t.events.at({pid, "zero shard"});
    EXPECT_TRUE(any_starts_with(shard, "reduce_scatter ")) << "no ZeRO reduce-scatter";
    EXPECT_TRUE(any_starts_with(shard, "all_gather ")) << "no ZeRO all-gather";
  }
}

TEST_F(TraceCli, ExpertParallelAllToAllsAndBadRanges) {
  const fs::path path = dir_ / "moe.json";
  const CliResult r = run_lattice("train" + tiny_flags(dir_, "mixtral-tiny") +
                                      " --dp 2 --parallelism.ep=2 --metrics.trace_steps=1:1"
                                      " --metrics.trace=" +
                                      path.string(),
                                  dir_);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  const Traced t = read_trace(path);
  for (int pid = 0; pid < 2; ++pid) {
    EXPECT_EQ(t.events.at({pid, "steps"}), (std::multiset<std::string>{"step 1"}));
    EXPECT_TRUE(any_starts_with(t.events.at({pid, "ep"}), "all_to_all")) << pid;
  }
  for (const char* bad : {"3:2", "0:4", "5:", "2:x"})
    expect_one_error_line(
        run_lattice("train" + tiny_flags(dir_, "llama-tiny") + " --metrics.trace_steps=" + bad,
                    dir_),
        "is not a:b with 1 <= a <= b");
}
