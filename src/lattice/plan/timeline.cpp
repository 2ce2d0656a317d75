// Chrome-trace and ASCII drawings of replayed pipelines (see timeline.hpp).
#include "lattice/plan/timeline.hpp"

#include <algorithm>
#include <fstream>

#include "lattice/core/error.hpp"

namespace lattice::plan {

nlohmann::json chrome_trace(const SimulationResult& result, const ParallelLayout& layout) {
  using nlohmann::json;
  json events = json::array();
  const double us = 1e6;
  const int ranks_per_stage = layout.world_size() / std::max(layout.pp, 1);
  for (size_t rank = 0; rank < result.replay.timeline.size(); ++rank) {
    const int pid = static_cast<int>(rank);
    events.push_back({{"name", "process_name"},
                      {"ph", "M"},
                      {"pid", pid},
                      {"args",
                       {{"name", "pp rank " + std::to_string(rank) + " (global rank " +
                                     std::to_string(rank * ranks_per_stage) + ")"}}}});
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", pid},
                      {"tid", 0},
                      {"args", {{"name", "compute"}}}});
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", pid},
                      {"tid", 1},
                      {"args", {{"name", "p2p and collectives"}}}});
    for (const auto& timed : result.replay.timeline[rank]) {
      const auto& a = timed.action;
      const bool compute = pipeline::is_compute(a.kind);
      const double duration = timed.end - timed.start;
      if (!compute && duration <= 0)
        continue;  // sends are instantaneous on the rank; skip free waits
      std::string name = pipeline::action_kind_name(a.kind) + std::to_string(a.microbatch);
      events.push_back(
          {{"name", name},
           {"cat", compute ? "compute" : "wait"},
           {"ph", "X"},
           {"pid", pid},
           {"tid", compute ? 0 : 1},
           {"ts", timed.start * us},
           {"dur", duration * us},
           {"args", {{"stage", a.stage}, {"microbatch", a.microbatch}, {"peer", a.peer}}}});
    }
    double clock = result.pipeline_seconds;
    if (result.dp_exposed_seconds > 0) {
      events.push_back({{"name", "data-parallel gradient reduction (exposed)"},
                        {"cat", "comm"},
                        {"ph", "X"},
                        {"pid", pid},
                        {"tid", 1},
                        {"ts", clock * us},
                        {"dur", result.dp_exposed_seconds * us}});
      clock += result.dp_exposed_seconds;
    }
    events.push_back({{"name", "optimizer step"},
                      {"cat", "compute"},
                      {"ph", "X"},
                      {"pid", pid},
                      {"tid", 0},
                      {"ts", clock * us},
                      {"dur", result.optimizer_seconds * us}});
  }
  return {{"traceEvents", events},
          {"displayTimeUnit", "ms"},
          {"otherData", {{"layout", layout.describe()}, {"step_seconds", result.step_seconds}}}};
}

void write_chrome_trace(const std::string& path, const SimulationResult& result,
                        const ParallelLayout& layout) {
  std::ofstream file(path);
  check(file.good(), "cannot write trace file '" + path + "'");
  file << chrome_trace(result, layout).dump() << "\n";
  check(file.good(), "failed writing trace file '" + path + "'");
}

std::string ascii_timeline(const pipeline::ReplayResult& replay, int width) {
  static const char kUpper[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
  static const char kLower[] = "abcdefghijklmnopqrstuvwxyz";
  constexpr int kSymbols = 26;
  std::string text;
  if (replay.makespan <= 0 || width < 1) return text;
  const double column = replay.makespan / width;
  for (size_t rank = 0; rank < replay.timeline.size(); ++rank) {
    std::string row(width, '.');
    std::vector<double> filled(width, 0.0);  // the action covering most of each column wins
    for (const auto& timed : replay.timeline[rank]) {
      const auto& a = timed.action;
      if (!pipeline::is_compute(a.kind) || timed.end <= timed.start) continue;
      const int first = std::clamp(static_cast<int>(timed.start / column), 0, width - 1);
      const int last = std::clamp(static_cast<int>((timed.end - 1e-12 * replay.makespan) / column),
                                  0, width - 1);
      for (int c = first; c <= last; ++c) {
        const double overlap =
            std::min(timed.end, (c + 1) * column) - std::max(timed.start, c * column);
        if (overlap <= filled[c]) continue;
        filled[c] = overlap;
        const int symbol = a.microbatch % kSymbols;
        row[c] = a.kind == pipeline::ActionKind::kForward    ? kUpper[symbol]
                 : a.kind == pipeline::ActionKind::kBackward ? kLower[symbol]
                                                             : '*';
      }
    }
    char label[32];
    std::snprintf(label, sizeof(label), "rank %2zu |", rank);
    text += label + row + "|\n";
  }
  text +=
      "legend: F of microbatch 0, 1, ... = A, B, ... (cycling), its B = a, b, ..., W = '*', idle = "
      "'.'\n";
  return text;
}

}  // namespace lattice::plan
