// PipelineTrace: see pipeline_trace.hpp.
#include "lattice/train/pipeline_trace.hpp"

#include <nlohmann/json.hpp>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/io/atomic_file.hpp"

namespace lattice::train {

namespace {

constexpr int kTraceTag = (1 << 30) + (1 << 27);
constexpr int kComputeTrack = 0, kCommunicationTrack = 1;

void append(std::string& events, const nlohmann::json& event) {
  if (!events.empty()) events += ",\n";
  events += event.dump();
}

}  // namespace

PipelineTrace::PipelineTrace(int world_rank, std::string label) : world_rank_(world_rank) {
  append(events_, {{"ph", "M"},
                   {"name", "process_name"},
                   {"pid", world_rank},
                   {"args", {{"name", std::move(label)}}}});
  append(events_, {{"ph", "M"},
                   {"name", "process_sort_index"},
                   {"pid", world_rank},
                   {"args", {{"sort_index", world_rank}}}});
  for (auto [track, name] :
       {std::pair{kComputeTrack, "compute"}, std::pair{kCommunicationTrack, "communication"}})
    append(events_, {{"ph", "M"},
                     {"name", "thread_name"},
                     {"pid", world_rank},
                     {"tid", track},
                     {"args", {{"name", name}}}});
}

void PipelineTrace::add_step(const pipeline::StepTimeline& timeline, int64_t step) {
  if (steps_ >= max_steps) return;
  ++steps_;
  const double base_us = static_cast<double>(timeline.start_ns) * 1e-3;
  for (const pipeline::TimedAction& t : timeline.actions) {
    const bool compute = pipeline::is_compute(t.action.kind);
    append(events_, {{"ph", "X"},
                     {"name", pipeline::action_kind_name(t.action.kind) + " s" +
                                  std::to_string(t.action.stage) + " mb" +
                                  std::to_string(t.action.microbatch)},
                     {"cat", compute ? "compute" : "p2p"},
                     {"pid", world_rank_},
                     {"tid", compute ? kComputeTrack : kCommunicationTrack},
                     {"ts", base_us + t.start * 1e6},
                     {"dur", (t.end - t.start) * 1e6},
                     {"args",
                      {{"step", step},
                       {"stage", t.action.stage},
                       {"microbatch", t.action.microbatch},
                       {"what", pipeline::describe(t.action)}}}});
  }
}

void PipelineTrace::write(const std::string& path, comm::Communicator& world) const {
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
