// The local backend: n ranks as threads of one process sharing memory. LocalWorld creates the n
// communicators of one world (no global state: two worlds are independent) and runs a function on n
// threads, one per rank, turning a rank's failure into an error on every rank instead of a hang.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "lattice/comm/communicator.hpp"

namespace lattice::comm {

struct LocalGroup;

class LocalWorld {
 public:
  explicit LocalWorld(int size, CommOptions options = options_from_environment());
  ~LocalWorld();
  LocalWorld(const LocalWorld&) = delete;
  LocalWorld& operator=(const LocalWorld&) = delete;

  int size() const { return size_; }
  // The communicator of `rank`, to be used by exactly one thread; each can be taken once.
  std::unique_ptr<Communicator> take(int rank);
  // Runs fn(communicator) on size() threads, one per rank (each communicator not taken yet), and
  // returns when all are done. If a rank throws, the others stop waiting for it with an error, and
  // run() rethrows the first rank's exception.
  void run(const std::function<void(Communicator&)>& fn);
  // Tells every rank of the world that `rank` failed (for callers that run their own threads).
  void report_failure(int rank, const std::string& reason);

 private:
  int size_;
  std::shared_ptr<LocalGroup> group_;
  std::vector<std::unique_ptr<Communicator>> communicators_;
};

// Convenience: LocalWorld(size, options).run(fn).
void run_local_ranks(int size, const std::function<void(Communicator&)>& fn,
                     CommOptions options = options_from_environment());
// The same, except that size 1 runs fn(nullptr) on the calling thread: a single rank needs no
// communicator (callers treat null as "no data parallelism").
void run_local_ranks_or_inline(int size, const std::function<void(Communicator*)>& fn,
                               CommOptions options = options_from_environment());

}  // namespace lattice::comm
