// LocalTransport: the algorithms' point-to-point channel between threads of one process. A send
// posts a pointer; the receiver copies or reduces straight out of the sender's buffer (one pass, no
// staging) and marks it consumed. Each message carries its collective's sequence number and
// descriptor, so a rank receiving data of a different collective reports the mismatch instead of
// corrupting data.
#pragma once

#include <memory>
#include <vector>

#include "lattice/comm/backends/local_group.hpp"
#include "lattice/comm/transport.hpp"
#include "lattice/comm/watchdog.hpp"

namespace lattice::comm {

class LocalTransport : public Transport {
 public:
  LocalTransport(std::shared_ptr<LocalGroup> group, int rank, Watchdog& watchdog);
  int rank() const override { return rank_; }
  int size() const override { return group_->size; }
  void send(const void* data, size_t bytes, int peer) override;
  void recv(void* data, size_t bytes, int peer) override;
  void sendrecv(const void* send_data, size_t send_bytes, int destination, void* recv_data,
                size_t recv_bytes, int source) override;
  void recv_reduce(void* acc, const void* local, int64_t count, DType dtype, ReduceOp op,
                   int source, int average_divisor) override;
  void sendrecv_reduce(const void* send_data, size_t send_bytes, int destination, void* acc,
                       const void* local, int64_t count, DType dtype, ReduceOp op, int source,
                       int average_divisor) override;

 private:
  uint64_t post(const void* data, size_t bytes, int destination);
  void await_consumed(int destination, uint64_t message);
  // Waits for the next message from `source`, checks it, returns it (still owned by the sender).
  const LocalGroup::Channel& await_message(int source, size_t expected_bytes);
  void release(int source);

  std::shared_ptr<LocalGroup> group_;
  int rank_;
  Watchdog& watchdog_;
  std::vector<uint64_t> sent_;      // messages posted to each rank
  std::vector<uint64_t> received_;  // messages taken from each rank
};

}  // namespace lattice::comm
