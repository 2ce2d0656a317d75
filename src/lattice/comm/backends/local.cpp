// LocalWorld: builds the shared group and the per-rank communicators, and runs ranks on threads.
#include "lattice/comm/backends/local.hpp"

#include <exception>
#include <thread>

#include "lattice/comm/backends/local_communicator.hpp"
#include "lattice/comm/backends/local_group.hpp"
#include "lattice/core/error.hpp"

namespace lattice::comm {

LocalWorld::LocalWorld(int size, CommOptions options) : size_(size) {
  if (size < 1) throw Error("local world: size must be at least 1, got " + std::to_string(size));
  group_ = std::make_shared<LocalGroup>(size, std::make_shared<FailureFlag>());
  for (int r = 0; r < size; ++r) {
    communicators_.push_back(std::make_unique<LocalCommunicator>(group_, r, options));
  }
}

LocalWorld::~LocalWorld() = default;

std::unique_ptr<Communicator> LocalWorld::take(int rank) {
  if (rank < 0 || rank >= size_) {
    throw Error("local world: rank " + std::to_string(rank) + " is out of range for " +
                std::to_string(size_) + " ranks");
  }
  if (!communicators_[static_cast<size_t>(rank)]) {
    throw Error("local world: the communicator of rank " + std::to_string(rank) +
                " was already taken");
  }
  return std::move(communicators_[static_cast<size_t>(rank)]);
}

void LocalWorld::report_failure(int rank, const std::string& reason) {
  group_->failure_flag->set(rank, reason);
}

void LocalWorld::run(const std::function<void(Communicator&)>& fn) {
  std::vector<std::unique_ptr<Communicator>> ranks;
  for (int r = 0; r < size_; ++r) ranks.push_back(take(r));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size_));
  std::vector<std::thread> threads;
  for (int r = 0; r < size_; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(*ranks[static_cast<size_t>(r)]);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = std::current_exception();
        report_failure(r, e.what());
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
        report_failure(r, "unknown exception");
      }
      ranks[static_cast<size_t>(r)].reset();  // stops its asynchronous thread on this thread
    });
  }
  for (auto& thread : threads) thread.join();
  if (group_->failure_flag->is_set()) {
    int first = group_->failure_flag->rank();
    if (first >= 0 && first < size_ && errors[static_cast<size_t>(first)])
      std::rethrow_exception(errors[static_cast<size_t>(first)]);
    throw Error("rank " + std::to_string(first) + " failed: " + group_->failure_flag->reason());
  }
}

void run_local_ranks(int size, const std::function<void(Communicator&)>& fn, CommOptions options) {
  LocalWorld world(size, options);
  world.run(fn);
}

void run_local_ranks_or_inline(int size, const std::function<void(Communicator*)>& fn,
                               CommOptions options) {
  if (size == 1) return fn(nullptr);
  run_local_ranks(
      size, [&](Communicator& communicator) { fn(&communicator); }, options);
}

}  // namespace lattice::comm
