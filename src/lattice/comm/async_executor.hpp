// AsyncExecutor: one rank's communication thread; runs queued work in submission order and
// completes a CommHandle per item (rethrowing the item's error from wait()).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "lattice/comm/comm_handle.hpp"

namespace lattice::comm {

class AsyncExecutor {
 public:
  AsyncExecutor();
  // Finishes the queued work, then joins the thread.
  ~AsyncExecutor();
  AsyncExecutor(const AsyncExecutor&) = delete;
  AsyncExecutor& operator=(const AsyncExecutor&) = delete;

  CommHandle enqueue(std::function<void()> work);
  // Returns once every queued item has finished.
  void drain();

 private:
  struct Task;
  void run();

  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  std::deque<std::pair<std::function<void()>, std::shared_ptr<Task>>> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace lattice::comm
