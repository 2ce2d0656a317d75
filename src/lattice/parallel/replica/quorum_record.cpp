// QuorumRecord: see quorum_record.hpp.
#include "lattice/parallel/replica/quorum_record.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "lattice/core/error.hpp"

namespace lattice::replica {

namespace {

using json = nlohmann::json;

template <typename T>
bool contains(const std::vector<T>& values, T value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

}  // namespace

bool QuorumRecord::has(int group) const {
  return contains(members, group);
}

bool QuorumRecord::contributes(int group) const {
  return contains(contributors, group);
}

int64_t QuorumRecord::block_of(int group) const {
  const auto at = std::find(members.begin(), members.end(), group);
  check(at != members.end(), "replica group " + std::to_string(group) +
                                 " is not a member of outer step " + std::to_string(round) +
                                 " (internal error)");
  return blocks[static_cast<size_t>(at - members.begin())];
}

std::string QuorumRecord::to_json() const {
  return json{{"round", round},           {"attempt", attempt},
              {"members", members},       {"contributors", contributors},
              {"source", source},         {"blocks", blocks},
              {"next_block", next_block}, {"pending", pending},
              {"completed", completed}}
      .dump();
}

QuorumRecord QuorumRecord::from_json(const std::string& text, const std::string& what) {
  try {
    const json j = json::parse(text);
    QuorumRecord r;
    r.round = j.at("round").get<int64_t>();
    r.attempt = j.at("attempt").get<int>();
    r.members = j.at("members").get<std::vector<int>>();
    r.contributors = j.at("contributors").get<std::vector<int>>();
    r.source = j.at("source").get<int>();
    r.blocks = j.at("blocks").get<std::vector<int64_t>>();
    r.next_block = j.at("next_block").get<int64_t>();
    r.pending = j.at("pending").get<std::vector<int64_t>>();
    r.completed = j.at("completed").get<std::vector<int64_t>>();
    check(r.blocks.size() == r.members.size(), "a block per member");
    return r;
  } catch (const std::exception& e) {
    throw Error(what + " is not a replica quorum record (" + e.what() +
                "): it was written by another program or damaged; start the job under a new "
                "replica.job");
  }
}

QuorumRecord next_record(const std::optional<QuorumRecord>& previous, int64_t round, int attempt,
                         std::vector<int> members, std::vector<int> contributors) {
  std::sort(members.begin(), members.end());
  members.erase(std::unique(members.begin(), members.end()), members.end());
  check(!members.empty(), "an outer step needs at least one replica group (internal error)");
  QuorumRecord r;
  r.round = round;
  r.attempt = attempt;
  r.members = members;
  if (previous) {
    r.next_block = previous->next_block;
    r.pending = previous->pending;
    // What the previous members trained: brought back by the contributors among them, pending
    // again for everyone else (a group that died, or was dropped, with its block).
    for (size_t i = 0; i < previous->members.size(); ++i) {
      const int group = previous->members[i];
      const int64_t block = previous->blocks[i];
      if (contains(contributors, group) && contains(members, group)) {
        r.contributors.push_back(group);
        r.completed.push_back(block);
      } else {
        r.pending.push_back(block);
      }
    }
  }
  std::sort(r.pending.begin(), r.pending.end());
  r.source = r.contributors.empty() ? members.front() : r.contributors.front();
  size_t next_pending = 0;
  for (size_t i = 0; i < members.size(); ++i)
    r.blocks.push_back(next_pending < r.pending.size() ? r.pending[next_pending++]
                                                       : r.next_block++);
  r.pending.erase(r.pending.begin(), r.pending.begin() + static_cast<std::ptrdiff_t>(next_pending));
  return r;
}

}  // namespace lattice::replica
