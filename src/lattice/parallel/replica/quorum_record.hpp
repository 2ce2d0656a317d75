// QuorumRecord: what the replica groups agree on at one outer step — which groups take part (the
// members), which of them bring parameters trained since the last outer step (the contributors:
// their mean enters the outer step), which member the others take the job's state from (the
// source), and which block of the data each member trains next. The data is one stream cut into
// blocks of H steps of one group; each block is handed to exactly one member, and a block handed to
// a group that left before its next outer step goes back to the pending list and is handed out
// again first: across deaths and joins no sample is skipped and none is trained twice.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lattice::replica {

struct QuorumRecord {
  int64_t round = 0;  // the outer step it decides (after round·H inner steps; 0: the job's start)
  int attempt = 0;    // an outer step whose exchange failed is agreed on again, one attempt later
  std::vector<int> members;        // group ids, ascending
  std::vector<int> contributors;   // the members that trained blocks[i] of the record before
  int source = -1;                 // the member the others take the state from
  std::vector<int64_t> blocks;     // blocks[i]: the block members[i] trains next
  int64_t next_block = 0;          // the first block never handed out
  std::vector<int64_t> pending;    // handed out once, never brought back: handed out first
  std::vector<int64_t> completed;  // the blocks the contributors brought back at this step

  bool has(int group) const;
  bool contributes(int group) const;
  // The block `group` (a member) trains next.
  int64_t block_of(int group) const;

  std::string to_json() const;
  // Throws Error naming `what` when the text is not a record.
  static QuorumRecord from_json(const std::string& text, const std::string& what);
  bool operator==(const QuorumRecord&) const = default;
};

// The record of outer step `round` that follows `previous` (the last committed one; none at the
// job's start) for `members`, of which `contributors` bring back the blocks `previous` gave them
// (contributors outside previous's members are none). The source is the lowest contributor (the
// lowest member at the start, where every group holds the same initial state).
QuorumRecord next_record(const std::optional<QuorumRecord>& previous, int64_t round, int attempt,
                         std::vector<int> members, std::vector<int> contributors);

}  // namespace lattice::replica
