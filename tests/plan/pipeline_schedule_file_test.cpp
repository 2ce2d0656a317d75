// Pipeline schedules from files (issue #22 item 5): every generated schedule written as JSON reads
// back as the same action lists; CSV lists read back the same too; a deadlocking, an incomplete, a
// malformed or a missing file is refused with one line naming the problem (for a bad list: the
// checker's line naming the rank and action) before any work.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <tuple>
#include <utility>

#include "lattice/core/error.hpp"
#include "lattice/parallel/pipeline/schedule_file.hpp"

using namespace lattice;
using namespace lattice::pipeline;
namespace fs = std::filesystem;

namespace {

class ScheduleFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lattice-schedule-file-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const fs::path path = dir_ / name;
    std::ofstream(path) << text;
    return path.string();
  }
  // The error line load_schedule throws for `path` ("" when it loads).
  static std::string refusal(const std::string& path) {
    try {
      load_schedule(path);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  fs::path dir_;
};

std::string csv_of(const Schedule& s) {
  std::string text = "rank,op,stage,microbatch,peer\n";
  for (size_t r = 0; r < s.actions.size(); ++r)
    for (const Action& a : s.actions[r])
      text += std::to_string(r) + "," + action_kind_name(a.kind) + "," + std::to_string(a.stage) +
              "," + std::to_string(a.microbatch) + "," +
              (a.peer >= 0 ? std::to_string(a.peer) : "") + "\n";
  return text;
}

}  // namespace

TEST_F(ScheduleFile, GeneratedSchedulesReadBackFromJsonAndCsv) {
  for (const auto& [kind, ranks, chunks] :
       {std::tuple{ScheduleKind::kGPipe, 2, 1}, std::tuple{ScheduleKind::kOneFOneB, 4, 1},
        std::tuple{ScheduleKind::kInterleaved, 2, 2}, std::tuple{ScheduleKind::kZeroBubbleH1, 4, 1},
        std::tuple{ScheduleKind::kZeroBubbleV, 2, 2}}) {
    const Schedule s = make_schedule(kind, ranks, 4, chunks);
    SCOPED_TRACE(schedule_kind_name(kind));
    for (const std::string& path : {write("s.json", schedule_json(s)), write("s.csv", csv_of(s))}) {
      const Schedule back = load_schedule(path);
      EXPECT_EQ(back.actions, s.actions) << path;
      EXPECT_EQ(back.stage_owner, s.stage_owner) << path;
      EXPECT_EQ(back.num_ranks, s.num_ranks) << path;
      EXPECT_EQ(back.num_microbatches, s.num_microbatches) << path;
      EXPECT_EQ(back.splits_weight_gradient, s.splits_weight_gradient) << path;
    }
  }
}

TEST_F(ScheduleFile, DeadlockingAndIncompleteListsAreRefusedBeforeAnyWork) {
  const Schedule s = make_schedule(ScheduleKind::kOneFOneB, 2, 2);
  // Rank 1 waits for a gradient before it forwards anything: nobody can move.
  Schedule deadlock = s;
  auto& last = deadlock.actions[1];
  std::rotate(last.begin(), last.end() - 1, last.end());
  const std::string stalled = refusal(write("deadlock.json", schedule_json(deadlock)));
  EXPECT_NE(stalled.find("the schedule is not valid"), std::string::npos) << stalled;
  EXPECT_NE(stalled.find("rank"), std::string::npos) << stalled;
  EXPECT_EQ(stalled.find('\n'), std::string::npos) << stalled;
  // A backward dropped from rank 0's list.
  Schedule incomplete = s;
  auto& first = incomplete.actions[0];
  first.erase(std::find_if(first.begin(), first.end(),
                           [](const Action& a) { return a.kind == ActionKind::kBackward; }));
  const std::string missing = refusal(write("incomplete.csv", csv_of(incomplete)));
  EXPECT_NE(missing.find("the schedule is not valid"), std::string::npos) << missing;
}

TEST_F(ScheduleFile, MalformedFilesGetOneLineNamingTheFile) {
  EXPECT_NE(refusal((dir_ / "none.json").string()).find("cannot read"), std::string::npos);
  EXPECT_NE(refusal(write("s.txt", "x")).find("name it .json or .csv"), std::string::npos);
  EXPECT_NE(refusal(write("bad.json", "{\"num_ranks\": 2,")).find("is not valid JSON"),
            std::string::npos);
  EXPECT_NE(refusal(write("short.json", "{\"num_ranks\": 2}")).find("expected num_ranks"),
            std::string::npos);
  EXPECT_NE(
      refusal(write("op.csv", "rank,op,stage,microbatch,peer\n0,X,0,0,\n")).find("unknown op 'X'"),
      std::string::npos);
  EXPECT_NE(refusal(write("head.csv", "0,F,0,0,\n")).find("header"), std::string::npos);
  EXPECT_NE(refusal(write("num.csv", "rank,op,stage,microbatch,peer\na,F,0,0,\n")).find("integers"),
            std::string::npos);
}
