// LocalTransport: rendezvous channels with in-place copy / reduce by the receiver.
#include "lattice/comm/backends/local_transport.hpp"

#include <string>

#include "lattice/comm/reduce_kernels.hpp"
#include "lattice/core/error.hpp"

namespace lattice::comm {

LocalTransport::LocalTransport(std::shared_ptr<LocalGroup> group, int rank, Watchdog& watchdog)
    : group_(std::move(group)),
      rank_(rank),
      watchdog_(watchdog),
      sent_(static_cast<size_t>(group_->size), 0),
      received_(static_cast<size_t>(group_->size), 0) {}

uint64_t LocalTransport::post(const void* data, size_t bytes, int destination) {
  LocalGroup::Channel& channel = group_->channel(rank_, destination);
  channel.data = data;
  channel.bytes = bytes;
  channel.seq = watchdog_.current().seq;
  channel.descriptor = watchdog_.current().descriptor;
  uint64_t message = ++sent_[static_cast<size_t>(destination)];
  channel.posted.store(message, std::memory_order_release);
  return message;
}

void LocalTransport::await_consumed(int destination, uint64_t message) {
  LocalGroup::Channel& channel = group_->channel(rank_, destination);
  watchdog_.wait([&] { return channel.consumed.load(std::memory_order_acquire) >= message; });
}

const LocalGroup::Channel& LocalTransport::await_message(int source, size_t expected_bytes) {
  LocalGroup::Channel& channel = group_->channel(source, rank_);
  uint64_t message = ++received_[static_cast<size_t>(source)];
  watchdog_.wait([&] { return channel.posted.load(std::memory_order_acquire) >= message; });
  const CollectiveRecord& mine = watchdog_.current();
  if (channel.seq != mine.seq || !channel.descriptor.agrees_with(mine.descriptor)) {
    throw Error("comm (local) collective mismatch: rank " + std::to_string(rank_) + " is in #" +
                std::to_string(mine.seq) + " " + mine.descriptor.describe() + " but rank " +
                std::to_string(source) + " sent it data of #" + std::to_string(channel.seq) + " " +
                channel.descriptor.describe());
  }
  if (channel.bytes != expected_bytes) {
    throw Error("comm (local) " + mine.descriptor.describe() + ": rank " + std::to_string(rank_) +
                " expected " + std::to_string(expected_bytes) + " bytes from rank " +
                std::to_string(source) + " but rank " + std::to_string(source) + " sent " +
                std::to_string(channel.bytes) + "; buffer sizes differ between ranks");
  }
  return channel;
}

void LocalTransport::release(int source) {
  group_->channel(source, rank_)
      .consumed.store(received_[static_cast<size_t>(source)], std::memory_order_release);
}

void LocalTransport::send(const void* data, size_t bytes, int peer) {
  await_consumed(peer, post(data, bytes, peer));
}

void LocalTransport::recv(void* data, size_t bytes, int peer) {
  const LocalGroup::Channel& channel = await_message(peer, bytes);
  copy_bytes(data, channel.data, bytes);
  release(peer);
}

void LocalTransport::sendrecv(const void* send_data, size_t send_bytes, int destination,
                              void* recv_data, size_t recv_bytes, int source) {
  uint64_t message = post(send_data, send_bytes, destination);
  recv(recv_data, recv_bytes, source);
  await_consumed(destination, message);
}

void LocalTransport::recv_reduce(void* acc, const void* local, int64_t count, DType dtype,
                                 ReduceOp op, int source, int average_divisor) {
  const LocalGroup::Channel& channel =
      await_message(source, static_cast<size_t>(count) * dtype_size(dtype));
  reduce_pair(acc, local, channel.data, count, dtype, op, average_divisor);
  release(source);
}

void LocalTransport::sendrecv_reduce(const void* send_data, size_t send_bytes, int destination,
                                     void* acc, const void* local, int64_t count, DType dtype,
                                     ReduceOp op, int source, int average_divisor) {
  uint64_t message = post(send_data, send_bytes, destination);
  recv_reduce(acc, local, count, dtype, op, source, average_divisor);
  await_consumed(destination, message);
}

}  // namespace lattice::comm
