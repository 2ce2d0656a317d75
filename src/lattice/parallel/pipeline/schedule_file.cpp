// Pipeline schedules from files: see schedule_file.hpp.
#include "lattice/parallel/pipeline/schedule_file.hpp"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/parallel/pipeline/checker.hpp"

namespace lattice::pipeline {

namespace {

constexpr ActionKind kKinds[] = {ActionKind::kForward,        ActionKind::kBackward,
                                 ActionKind::kBackwardWeight, ActionKind::kSendForward,
                                 ActionKind::kRecvForward,    ActionKind::kSendBackward,
                                 ActionKind::kRecvBackward};

ActionKind parse_op(const std::string& op, const std::string& where) {
  for (ActionKind kind : kKinds)
    if (action_kind_name(kind) == op) return kind;
  throw Error(where + ": unknown op '" + op + "': use F, B, W, SEND_F, RECV_F, SEND_B or RECV_B");
}

// The schedule's derived fields from its lists: the number of stages (one past the largest stage
// any action names), whether W is split off, and (CSV) each stage's owner, the rank forwarding it.
void complete(Schedule& s, bool owners_from_forwards, const std::string& path) {
  int stages = 0;
  for (const auto& list : s.actions)
    for (const Action& a : list) stages = std::max(stages, a.stage + 1);
  s.splits_weight_gradient = false;
  for (const auto& list : s.actions)
    for (const Action& a : list) s.splits_weight_gradient |= a.kind == ActionKind::kBackwardWeight;
  if (owners_from_forwards) {
    s.stage_owner.assign(static_cast<size_t>(stages), -1);
    for (size_t r = 0; r < s.actions.size(); ++r)
      for (const Action& a : s.actions[r])
        if (a.kind == ActionKind::kForward)
          s.stage_owner[static_cast<size_t>(a.stage)] = static_cast<int>(r);
    for (int st = 0; st < stages; ++st)
      check(
          s.stage_owner[static_cast<size_t>(st)] >= 0,
          path + ": no rank forwards stage " + std::to_string(st) + ": the schedule is incomplete");
  }
  check(s.num_ranks >= 1 && static_cast<int>(s.actions.size()) == s.num_ranks,
        path + ": " + std::to_string(s.actions.size()) + " action lists for " +
            std::to_string(s.num_ranks) + " ranks");
  s.chunks_per_rank = std::max(1, s.num_stages() / std::max(1, s.num_ranks));
  const CheckReport report = check_schedule(s);
  check(report.ok, path + ": the schedule is not valid: " + report.problem);
}

Schedule parse_json(const std::string& text, const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + " is not valid JSON (" + e.what() + ")");
  }
  Schedule s;
  try {
    s.num_ranks = j.at("num_ranks").get<int>();
    s.num_microbatches = j.at("num_microbatches").get<int>();
    s.stage_owner = j.at("stage_owner").get<std::vector<int>>();
    if (j.contains("kind")) s.kind = parse_schedule_kind(j.at("kind").get<std::string>());
    const auto& lists = j.at("actions");
    for (size_t r = 0; r < lists.size(); ++r) {
      s.actions.emplace_back();
      for (const auto& a : lists[r]) {
        const std::string where = path + ": rank " + std::to_string(r) + " action " +
                                  std::to_string(s.actions.back().size());
        s.actions.back().push_back({parse_op(a.at("op").get<std::string>(), where),
                                    a.at("stage").get<int>(), a.at("mb").get<int>(),
                                    a.value("peer", -1)});
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": " + e.what() +
                " (expected num_ranks, num_microbatches, stage_owner and actions)");
  }
  complete(s, false, path);
  return s;
}

Schedule parse_csv(const std::string& text, const std::string& path) {
  std::istringstream in(text);
  std::string line;
  check(static_cast<bool>(std::getline(in, line)) && line.rfind("rank,op,stage,microbatch", 0) == 0,
        path + ": the first line must be the header rank,op,stage,microbatch,peer");
  Schedule s;
  int max_mb = -1, line_number = 1;
  while (std::getline(in, line)) {
    ++line_number;
    if (line.empty()) continue;
    std::vector<std::string> fields;
    std::stringstream cells(line);
    for (std::string cell; std::getline(cells, cell, ',');) fields.push_back(cell);
    const std::string where = path + ":" + std::to_string(line_number);
    check(fields.size() == 4 || fields.size() == 5,
          where + ": expected rank,op,stage,microbatch[,peer], got '" + line + "'");
    int rank = 0, stage = 0, mb = 0, peer = -1;
    try {
      rank = std::stoi(fields[0]);
      stage = std::stoi(fields[2]);
      mb = std::stoi(fields[3]);
      if (fields.size() == 5 && !fields[4].empty()) peer = std::stoi(fields[4]);
    } catch (const std::exception&) {
      throw Error(where + ": rank, stage, microbatch and peer must be integers, got '" + line +
                  "'");
    }
    check(rank >= 0 && rank < 4096 && stage >= 0 && mb >= 0,
          where + ": rank, stage and microbatch must be non-negative (rank below 4096)");
    if (static_cast<int>(s.actions.size()) <= rank) s.actions.resize(static_cast<size_t>(rank) + 1);
    s.actions[static_cast<size_t>(rank)].push_back({parse_op(fields[1], where), stage, mb, peer});
    max_mb = std::max(max_mb, mb);
  }
  check(!s.actions.empty(), path + " holds no actions");
  s.num_ranks = static_cast<int>(s.actions.size());
  s.num_microbatches = max_mb + 1;
  complete(s, true, path);
  return s;
}

}  // namespace

Schedule load_schedule(const std::string& path) {
  std::ifstream in(path);
  check(in.good(), "cannot read the pipeline schedule " + path + ": check the path");
  std::stringstream text;
  text << in.rdbuf();
  const bool csv = path.size() >= 4 && path.compare(path.size() - 4, 4, ".csv") == 0;
  const bool json = path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
  check(csv || json, "pipeline schedule " + path + ": name it .json or .csv");
  return csv ? parse_csv(text.str(), path) : parse_json(text.str(), path);
}

std::string schedule_json(const Schedule& schedule) {
  nlohmann::json j;
  j["kind"] = schedule_kind_name(schedule.kind);
  j["num_ranks"] = schedule.num_ranks;
  j["num_microbatches"] = schedule.num_microbatches;
  j["chunks_per_rank"] = schedule.chunks_per_rank;
  j["stage_owner"] = schedule.stage_owner;
  j["actions"] = nlohmann::json::array();
  for (const auto& list : schedule.actions) {
    nlohmann::json out = nlohmann::json::array();
    for (const Action& a : list) {
      nlohmann::json action = {
          {"op", action_kind_name(a.kind)}, {"stage", a.stage}, {"mb", a.microbatch}};
      if (a.peer >= 0) action["peer"] = a.peer;
      out.push_back(action);
    }
    j["actions"].push_back(out);
  }
  return j.dump(1);
}

}  // namespace lattice::pipeline
