// StatusBoard: where the ranks of one group publish the collective each last entered, so any rank
// can name the ranks that did not arrive, spot two ranks in different collectives at the same
// sequence number, and learn that a rank failed. FailureFlag: the first failure of a set of ranks.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "lattice/comm/trace.hpp"

namespace lattice::comm {

// Set once by the first rank that fails; every waiting rank of the same world reads it and stops.
class FailureFlag {
 public:
  // Keeps the first reason only.
  void set(int rank, const std::string& reason);
  bool is_set() const { return set_.load(std::memory_order_acquire); }
  std::string reason() const;
  int rank() const;

 private:
  std::atomic<bool> set_{false};
  mutable std::mutex mutex_;
  std::string reason_;
  int rank_ = -1;
};

class StatusBoard {
 public:
  virtual ~StatusBoard() = default;
  virtual int size() const = 0;
  virtual void publish(int rank, const CollectiveRecord& record) = 0;
  // The ring of `rank`'s records when this board shows each rank the newest record of a trace it
  // keeps for it (ranks in one address space): that rank's watchdog records there once instead of
  // into a trace of its own and then here. nullptr: records are published here one by one.
  virtual CollectiveTrace* rank_trace(int rank) { return nullptr; }
  // The newest record of `rank`; nullopt when it has entered none or is not visible from here.
  virtual std::optional<CollectiveRecord> last(int rank) const = 0;
  // False when `rank`'s state cannot be seen from this process (e.g. it runs on another node).
  virtual bool visible(int rank) const { return true; }
  // A one-line reason when a rank of the group has failed or died; empty otherwise.
  virtual std::string failure() const = 0;
};

// The board of ranks that are threads of one process: each rank's trace lives here, and a peer
// reads its newest record.
class InProcessStatusBoard : public StatusBoard {
 public:
  InProcessStatusBoard(int size, std::shared_ptr<FailureFlag> failure_flag);
  int size() const override { return static_cast<int>(traces_.size()); }
  void publish(int rank, const CollectiveRecord& record) override;
  std::optional<CollectiveRecord> last(int rank) const override;
  std::string failure() const override;
  CollectiveTrace* rank_trace(int rank) override;

 private:
  // One per rank, written only by that rank (every collective, twice), without a lock.
  std::vector<std::unique_ptr<CollectiveTrace>> traces_;
  std::shared_ptr<FailureFlag> failure_flag_;
};

}  // namespace lattice::comm
