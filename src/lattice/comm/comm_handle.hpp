// CommHandle: the result of an asynchronous send, receive or collective; wait() blocks until it is
// done and rethrows its error, test() polls. A default-constructed handle is already complete.
#pragma once

#include <memory>

namespace lattice::comm {

class CommHandle {
 public:
  // What a backend implements behind a handle.
  class State {
   public:
    virtual ~State() = default;
    virtual void wait() = 0;
    virtual bool test() = 0;
  };

  CommHandle() = default;
  explicit CommHandle(std::shared_ptr<State> state) : state_(std::move(state)) {}

  // Blocks until the operation is complete; throws its Error if it failed. Waiting twice is fine.
  void wait() {
    if (state_) state_->wait();
  }
  // True once the operation is complete (wait() then returns at once, or throws its error).
  bool test() { return !state_ || state_->test(); }

 private:
  std::shared_ptr<State> state_;
};

}  // namespace lattice::comm
