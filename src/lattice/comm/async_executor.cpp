// AsyncExecutor: a worker thread over a FIFO queue; handles wait on a per-task condition variable.
#include "lattice/comm/async_executor.hpp"

#include <exception>

namespace lattice::comm {

struct AsyncExecutor::Task : CommHandle::State {
  std::mutex mutex;
  std::condition_variable done_signal;
  bool done = false;
  std::exception_ptr error;

  void finish(std::exception_ptr failure) {
    std::lock_guard lock(mutex);
    error = failure;
    done = true;
    done_signal.notify_all();
  }
  void wait() override {
    std::unique_lock lock(mutex);
    done_signal.wait(lock, [&] { return done; });
    if (error) std::rethrow_exception(error);
  }
  bool test() override {
    std::lock_guard lock(mutex);
    return done;
  }
};

AsyncExecutor::AsyncExecutor() : thread_([this] { run(); }) {}

AsyncExecutor::~AsyncExecutor() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

CommHandle AsyncExecutor::enqueue(std::function<void()> work) {
  auto task = std::make_shared<Task>();
  {
    std::lock_guard lock(mutex_);
    queue_.emplace_back(std::move(work), task);
  }
  wake_.notify_one();
  return CommHandle(task);
}

void AsyncExecutor::drain() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

void AsyncExecutor::run() {
  for (;;) {
    std::function<void()> work;
    std::shared_ptr<Task> task;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping with nothing left
      work = std::move(queue_.front().first);
      task = std::move(queue_.front().second);
      queue_.pop_front();
      busy_ = true;
    }
    std::exception_ptr failure;
    try {
      work();
    } catch (...) {
      failure = std::current_exception();
    }
    task->finish(failure);
    {
      std::lock_guard lock(mutex_);
      busy_ = false;
      if (queue_.empty()) idle_.notify_all();
    }
  }
}

}  // namespace lattice::comm
