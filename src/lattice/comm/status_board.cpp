// FailureFlag and the in-process StatusBoard.
#include "lattice/comm/status_board.hpp"

namespace lattice::comm {

void FailureFlag::set(int rank, const std::string& reason) {
  std::lock_guard lock(mutex_);
  if (set_.load(std::memory_order_relaxed)) return;
  reason_ = reason;
  rank_ = rank;
  set_.store(true, std::memory_order_release);
}

std::string FailureFlag::reason() const {
  std::lock_guard lock(mutex_);
  return reason_;
}

int FailureFlag::rank() const {
  std::lock_guard lock(mutex_);
  return rank_;
}

InProcessStatusBoard::InProcessStatusBoard(int size, std::shared_ptr<FailureFlag> failure_flag)
    : slots_(static_cast<size_t>(size)), failure_flag_(std::move(failure_flag)) {}

void InProcessStatusBoard::publish(int rank, const CollectiveRecord& record) {
  slots_[static_cast<size_t>(rank)].record.store(record);
}

std::optional<CollectiveRecord> InProcessStatusBoard::last(int rank) const {
  return slots_[static_cast<size_t>(rank)].record.load();
}

std::string InProcessStatusBoard::failure() const {
  if (!failure_flag_ || !failure_flag_->is_set()) return {};
  return "rank " + std::to_string(failure_flag_->rank()) + " failed: " + failure_flag_->reason();
}

}  // namespace lattice::comm
