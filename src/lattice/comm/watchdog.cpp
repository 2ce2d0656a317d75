// Watchdog: progress checks and the hang / mismatch reports.
#include "lattice/comm/watchdog.hpp"

#include <cstdio>
#include <thread>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "lattice/core/error.hpp"

namespace lattice::comm {

Watchdog::Watchdog(std::shared_ptr<StatusBoard> board, int rank, std::chrono::milliseconds timeout,
                   std::string label)
    : board_(std::move(board)),
      rank_(rank),
      timeout_(timeout),
      label_(std::move(label)),
      trace_(board_->rank_trace(rank)) {
  if (trace_ == nullptr) trace_ = &own_trace_;
}

void Watchdog::relax() {
#if defined(__SSE2__)
  _mm_pause();
#endif
}

void Watchdog::yield() {
  std::this_thread::yield();
}

void Watchdog::nap() {
  std::this_thread::sleep_for(std::chrono::microseconds(50));
}

void Watchdog::begin(uint64_t seq, const CollectiveDescriptor& descriptor, Algorithm algorithm,
                     int64_t bytes) {
  current_ = CollectiveRecord{};
  current_.seq = seq;
  current_.descriptor = descriptor;
  current_.algorithm = algorithm;
  current_.state = RecordState::entered;
  current_.group_size = board_->size();
  current_.bytes = bytes;
  current_.entered_ns = clock_.now();
  in_collective_ = true;
  trace_->record(current_);
  if (trace_ == &own_trace_) board_->publish(rank_, current_);
}

void Watchdog::end(bool succeeded) {
  current_.state = succeeded ? RecordState::completed : RecordState::failed;
  current_.finished_ns = clock_.now();
  in_collective_ = false;
  trace_->record(current_);
  if (trace_ == &own_trace_) board_->publish(rank_, current_);
}

void Watchdog::check_peers() const {
  std::string failure = board_->failure();
  if (!failure.empty()) {
    std::string doing = in_collective_ ? "collective " + describe_record(current_) : "a wait";
    throw Error("comm (" + label_ + ") rank " + std::to_string(rank_) + " stopped " + doing +
                " because " + failure);
  }
  if (!in_collective_) return;
  for (int peer = 0; peer < board_->size(); ++peer) {
    if (peer == rank_) continue;
    auto record = board_->last(peer);
    if (!record || record->seq != current_.seq) continue;
    if (!record->descriptor.agrees_with(current_.descriptor)) {
      throw Error("comm (" + label_ + ") collective mismatch at #" + std::to_string(current_.seq) +
                  ": rank " + std::to_string(rank_) + " entered " + current_.descriptor.describe() +
                  " but rank " + std::to_string(peer) + " entered " +
                  record->descriptor.describe() +
                  "; every rank must call the same collectives in "
                  "the same order with the same count, type and reduction");
    }
  }
}

void Watchdog::check_progress(std::chrono::steady_clock::time_point wait_start,
                              const char* what) const {
  check_peers();
  if (std::chrono::steady_clock::now() - wait_start > timeout_) throw Error(hang_report(what));
}

std::string Watchdog::hang_report(const char* what) const {
  double seconds = static_cast<double>(timeout_.count()) / 1000.0;
  char timeout_text[32];
  std::snprintf(timeout_text, sizeof(timeout_text), "%.3g s", seconds);
  std::string text = "comm (" + label_ + ") watchdog: rank " + std::to_string(rank_) + " waited " +
                     timeout_text + " in ";
  if (!in_collective_) return text + (what ? what : "a wait") + " without progress";
  text += describe_record(current_) + "; ranks that did not arrive:";
  std::string missing;
  std::string last_entered;
  for (int peer = 0; peer < board_->size(); ++peer) {
    auto record = peer == rank_ ? std::optional<CollectiveRecord>(current_) : board_->last(peer);
    if (!board_->visible(peer)) {
      last_entered.append(" rank ")
          .append(std::to_string(peer))
          .append(": not visible from this node;");
      continue;
    }
    if (!record || record->seq < current_.seq) missing.append(" ").append(std::to_string(peer));
    last_entered.append(" rank ")
        .append(std::to_string(peer))
        .append(": ")
        .append(record ? describe_record(*record) : std::string("none yet"))
        .append(";");
  }
  text += missing.empty() ? " none (all arrived; a peer is stuck inside it)" : missing;
  text += "; last collective per rank:" + last_entered;
  if (!text.empty() && text.back() == ';') text.pop_back();
  return text;
}

}  // namespace lattice::comm
