// RunTrace: see run_trace.hpp.
#include "lattice/train/run_trace.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "lattice/core/error.hpp"
#include "lattice/io/atomic_file.hpp"

namespace lattice::train {

namespace {

constexpr int kTraceTag = (1 << 30) + (1 << 27);

// "4.0 KiB", "12 B", "1.5 MiB".
std::string size_text(int64_t bytes) {
  char text[32];
  if (bytes < 1024)
    std::snprintf(text, sizeof text, "%lld B", static_cast<long long>(bytes));
  else if (bytes < (int64_t{1} << 20))
    std::snprintf(text, sizeof text, "%.1f KiB", static_cast<double>(bytes) / 1024);
  else
    std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
}

// The operation of a record's description ("#12 allreduce(f32 x 1024, sum) [...]" -> "allreduce").
std::string operation(const std::string& description) {
  const size_t begin = description.find(' ') + 1, end = description.find('(');
  return end == std::string::npos ? description : description.substr(begin, end - begin);
}

}  // namespace

int64_t steady_clock_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

RunTrace::RunTrace(int world_rank, std::string label, std::vector<Group> groups)
    : world_rank_(world_rank), groups_(std::move(groups)) {
  for (const Group& g : groups_) {
    const auto recent = g.communicator->trace().recent();
    last_seq_.push_back(recent.empty() ? 0 : recent.back().seq);
  }
  add(nlohmann::json{{"ph", "M"},
                     {"name", "process_name"},
                     {"pid", world_rank},
                     {"args", {{"name", std::move(label)}}}}
          .dump());
  add(nlohmann::json{{"ph", "M"},
                     {"name", "process_sort_index"},
                     {"pid", world_rank},
                     {"args", {{"sort_index", world_rank}}}}
          .dump());
  track("steps");
}

void RunTrace::add(const std::string& event) {
  if (!events_.empty()) events_ += ",\n";
  events_ += event;
}

int RunTrace::track(const std::string& name) {
  for (size_t i = 0; i < tracks_.size(); ++i)
    if (tracks_[i] == name) return static_cast<int>(i);
  tracks_.push_back(name);
  const int id = static_cast<int>(tracks_.size()) - 1;
  add(nlohmann::json{{"ph", "M"},
                     {"name", "thread_name"},
                     {"pid", world_rank_},
                     {"tid", id},
                     {"args", {{"name", name}}}}
          .dump());
  add(nlohmann::json{{"ph", "M"},
                     {"name", "thread_sort_index"},
                     {"pid", world_rank_},
                     {"tid", id},
                     {"args", {{"sort_index", id}}}}
          .dump());
  return id;
}

void RunTrace::add_step(int64_t step, int64_t start_ns, int64_t end_ns,
                        const pipeline::StepTimeline* timeline) {
  add(nlohmann::json{{"ph", "X"},
                     {"name", "step " + std::to_string(step)},
                     {"cat", "step"},
                     {"pid", world_rank_},
                     {"tid", track("steps")},
                     {"ts", static_cast<double>(start_ns) * 1e-3},
                     {"dur", static_cast<double>(end_ns - start_ns) * 1e-3},
                     {"args", {{"step", step}}}}
          .dump());
  if (timeline) {
    const double base_us = static_cast<double>(timeline->start_ns) * 1e-3;
    for (const pipeline::TimedAction& t : timeline->actions) {
      const bool compute = pipeline::is_compute(t.action.kind);
      add(nlohmann::json{{"ph", "X"},
                         {"name", pipeline::action_kind_name(t.action.kind) + " s" +
                                      std::to_string(t.action.stage) + " mb" +
                                      std::to_string(t.action.microbatch)},
                         {"cat", compute ? "compute" : "p2p"},
                         {"pid", world_rank_},
                         {"tid", track(compute ? "compute" : "p2p")},
                         {"ts", base_us + t.start * 1e6},
                         {"dur", (t.end - t.start) * 1e6},
                         {"args",
                          {{"step", step},
                           {"stage", t.action.stage},
                           {"microbatch", t.action.microbatch},
                           {"what", pipeline::describe(t.action)}}}}
              .dump());
    }
  }
  spans_.push_back({step, start_ns, end_ns});
  add_collectives();
}

void RunTrace::add_collectives() {
  for (size_t g = 0; g < groups_.size(); ++g) {
    const auto recent = groups_[g].communicator->trace().recent();
    if (recent.empty()) continue;
    const uint64_t missing =
        recent.front().seq > last_seq_[g] + 1 ? recent.front().seq - last_seq_[g] - 1 : 0;
    for (const comm::CollectiveRecord& r : recent) {
      if (r.seq <= last_seq_[g]) continue;
      // One still running (an asynchronous bucket gather overlapping the next forward) waits for
      // a later call, and so does every newer one.
      if (r.state == comm::RecordState::entered) break;
      last_seq_[g] = r.seq;
      // The traced step it was entered in; none: validation, a checkpoint, an untraced step.
      auto span = std::find_if(spans_.begin(), spans_.end(), [&](const Span& s) {
        return r.entered_ns >= s.start_ns && r.entered_ns < s.end_ns;
      });
      if (span == spans_.end() || r.state != comm::RecordState::completed) continue;
      const std::string what = comm::describe_record(r);
      add(nlohmann::json{{"ph", "X"},
                         {"name", operation(what) + " " + size_text(r.bytes)},
                         {"cat", "collective"},
                         {"pid", world_rank_},
                         {"tid", track(groups_[g].name)},
                         {"ts", static_cast<double>(r.entered_ns) * 1e-3},
                         {"dur", static_cast<double>(r.finished_ns - r.entered_ns) * 1e-3},
                         {"args",
                          {{"step", span->step},
                           {"group", groups_[g].name},
                           {"ranks", r.group_size},
                           {"bytes", r.bytes},
                           {"what", what}}}}
              .dump());
    }
    if (missing > 0 && !spans_.empty())
      add(nlohmann::json{{"ph", "i"},
                         {"name", std::to_string(missing) + " collectives not recorded"},
                         {"s", "t"},
                         {"pid", world_rank_},
                         {"tid", track(groups_[g].name)},
                         {"ts", static_cast<double>(spans_.back().end_ns) * 1e-3},
                         {"args", {{"why", "a communicator keeps its last 64 records"}}}}
              .dump());
  }
}

void RunTrace::write(const std::string& path, comm::Communicator& world) {
  add_collectives();  // the last ones to complete
  int64_t mine = static_cast<int64_t>(events_.size());
  std::vector<int64_t> sizes(static_cast<size_t>(world.size()));
  world.all_gather(&mine, sizes.data(), 1, DType::i64);
  if (world.rank() != 0) {
    world.send(events_.data(), mine, DType::u8, 0, kTraceTag);
    return;
  }
  std::string text = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n" + events_;
  for (int r = 1; r < world.size(); ++r) {
    std::string theirs(static_cast<size_t>(sizes[static_cast<size_t>(r)]), '\0');
    world.recv(theirs.data(), sizes[static_cast<size_t>(r)], DType::u8, r, kTraceTag);
    if (!theirs.empty()) text += ",\n" + theirs;
  }
  text += "\n]}\n";
  write_text_atomic(path, text);
}

}  // namespace lattice::train
