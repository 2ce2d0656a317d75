// Membership: one replica group's side of the quorum, held by the group's first rank. The group
// keeps a key alive in the store under a lease (renewed by a thread of its own: a group killed
// with -9 leaves the quorum when the lease runs out, replica.lease_seconds); at every outer step
// it posts itself, and the first group to see every live group posted (or to wait out the timeout)
// writes the step's QuorumRecord, create-if-absent, so that every group reads the same one. After
// the members' exchange each group posts whether it succeeded; the step commits only if every
// member did, and is otherwise agreed on again without the groups that failed or died. Keys live
// under /lattice/<job>/diloco/; a job that starts with no group alive clears what a job of the
// same name left there, and every group of a job must run the same model, layout and settings
// (a fingerprint the first group writes).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "lattice/parallel/replica/etcd_client.hpp"
#include "lattice/parallel/replica/quorum_record.hpp"

namespace lattice::replica {

struct MembershipSettings {
  std::string store;   // etcd's "host:port"
  std::string job;     // names the job's keys
  int group = 0;       // this group's id, in [0, groups)
  int groups = 1;      // how many the job is meant to have (the start waits for them)
  int min_groups = 1;  // fewer live groups than this: an error, not an outer step
  std::chrono::milliseconds timeout{60000};  // how long a live but silent group is waited for
  int64_t lease_seconds = 5;  // a killed group is gone when its lease runs out (etcd's least: 2)
  uint64_t fingerprint = 0;   // what every group must share
};

class Membership {
 public:
  // Joins the job's store (an Error line when it cannot be reached, when another group with this
  // id is alive, or when the job's groups run another fingerprint).
  explicit Membership(MembershipSettings settings);
  // Leaves: the lease is revoked, so the others see this group gone at once.
  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  // The job's last committed record; none before its first outer step (or after a restart of
  // the whole job, whose groups bring theirs from their checkpoints).
  std::optional<QuorumRecord> latest();

  // Takes part in outer step `round`: `contributor` when this group trained the block that
  // `committed` (its last committed record, or the store's newer one) gave it. The agreed record,
  // or none when it was agreed on without this group (it came too late or too slowly: it joins
  // the next outer step instead). Errors: fewer than min_groups live groups after the timeout;
  // no live group left that holds the job's state.
  std::optional<QuorumRecord> agree(int64_t round, bool contributor,
                                    const std::optional<QuorumRecord>& committed);
  // After this group's exchange of `record`: whether every member's succeeded (the outer step
  // commits and becomes the job's latest) or not (agree on `round` again).
  bool settle(const QuorumRecord& record, bool succeeded);

  // The key prefix of this job's links (e.g. for GlooLink).
  const std::string& base() const { return base_; }
  int group() const { return settings_.group; }

 private:
  std::string round_key(int64_t round, int attempt) const;
  // Waits for the outcome of an attempt agreed on without this group: whether it committed (this
  // group then joins the next outer step) or failed (it takes part in the next attempt).
  bool committed_without_me(const std::string& at, const QuorumRecord& record);
  // The groups whose lease is alive.
  std::vector<int> alive_groups();
  // Renews the lease until stopped; a lost lease (the store restarted, or this process stalled
  // past it) is replaced and the group's key put again.
  void heartbeat();

  MembershipSettings settings_;
  std::string base_;
  EtcdClient store_;
  int64_t lease_ = 0;
  std::mutex mutex_;  // lease_ and stop_ between the heartbeat thread and the destructor
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread heartbeat_;
};

}  // namespace lattice::replica
