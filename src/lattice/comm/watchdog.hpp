// Watchdog: every wait of a collective goes through it. It spins, then yields, then sleeps, and
// while waiting turns a hang into an Error: a peer's failure, two ranks in different collectives at
// the same sequence number (both descriptions), or no progress within the timeout (the ranks that
// did not arrive and the last collective each rank entered).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "lattice/comm/record_clock.hpp"
#include "lattice/comm/status_board.hpp"
#include "lattice/comm/trace.hpp"

namespace lattice::comm {

class Watchdog {
 public:
  // `label` names the communicator in messages (e.g. "local", "mpi").
  Watchdog(std::shared_ptr<StatusBoard> board, int rank, std::chrono::milliseconds timeout,
           std::string label);

  // Marks the start and end of collective `seq` on this rank (trace and board).
  void begin(uint64_t seq, const CollectiveDescriptor& descriptor, Algorithm algorithm,
             int64_t bytes);
  void end(bool succeeded);
  bool in_collective() const { return in_collective_; }
  const CollectiveRecord& current() const { return current_; }

  // Returns once ready() is true; throws Error on failure, mismatch or timeout. `what` names the
  // wait outside collectives (e.g. "recv from rank 2").
  template <class Ready>
  void wait(Ready&& ready, const char* what = nullptr) {
    for (int i = 0; i < spin_iterations_; ++i) {
      if (ready()) return;
      relax();
    }
    auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0;; ++i) {
      if (ready()) return;
      if (i < kYieldIterations) {
        yield();
      } else {
        nap();
      }
      if ((i & 31) == 31) check_progress(start, what);
    }
  }

  // Throws when a peer failed or a peer entered a different collective at the current sequence
  // number.
  void check_peers() const;
  // check_peers(), then the timeout measured from `wait_start`.
  void check_progress(std::chrono::steady_clock::time_point wait_start, const char* what) const;

  // The report a timeout produces (exposed for tests and for error messages of other waits).
  std::string hang_report(const char* what) const;

  const CollectiveTrace& trace() const { return *trace_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }
  StatusBoard& board() const { return *board_; }
  // Busy-wait iterations (pause instructions) before a wait starts yielding: long when every rank
  // has a core of its own (latency), short when ranks outnumber cores (they need the CPU).
  void set_spin_iterations(int iterations) { spin_iterations_ = iterations; }

 private:
  static constexpr int64_t kYieldIterations = 2000;
  static void relax();
  static void yield();
  static void nap();

  std::shared_ptr<StatusBoard> board_;
  int rank_;
  std::chrono::milliseconds timeout_;
  std::string label_;
  CollectiveTrace own_trace_;
  CollectiveTrace* trace_;  // the board's ring for this rank (it reads the records there), or
                            // own_trace_ (records are then also published to the board)
  RecordClock clock_;
  CollectiveRecord current_;
  bool in_collective_ = false;
  int spin_iterations_ = 4000;
};

}  // namespace lattice::comm
