// LocalCommunicator: one thread-rank of the local backend (direct shared-memory algorithms by
// default, the point-to-point algorithms over LocalTransport when forced, eager tagged user
// messages).
#pragma once

#include <memory>

#include "lattice/comm/algorithms/direct.hpp"
#include "lattice/comm/backends/local_group.hpp"
#include "lattice/comm/backends/local_transport.hpp"
#include "lattice/comm/communicator.hpp"

namespace lattice::comm {

class LocalCommunicator : public Communicator, private SharedAddressSpace {
 public:
  LocalCommunicator(std::shared_ptr<LocalGroup> group, int rank, CommOptions options);
  ~LocalCommunicator() override;
  std::string_view backend() const override { return "local"; }

 protected:
  Transport& transport() override { return transport_; }
  SharedAddressSpace* shared_address_space() override { return this; }
  std::unique_ptr<Communicator> make_split(std::span<const int> members, int new_rank,
                                           int color) override;
  void point_send(const void* data, size_t bytes, int peer, int tag) override;
  void point_recv(void* data, size_t bytes, int peer, int tag) override;
  CommHandle point_isend(const void* data, size_t bytes, int peer, int tag) override;
  CommHandle point_irecv(void* data, size_t bytes, int peer, int tag) override;

 private:
  // SharedAddressSpace
  int rank() const override { return Communicator::rank(); }
  int size() const override { return Communicator::size(); }
  void publish(const DirectBuffers& mine) override;
  void await_published() override;
  const DirectBuffers& peer(int rank) const override;
  void sync() override;
  // Staging saves the direct algorithms' closing sync at the price of a copy: it pays only when the
  // ranks outnumber the cores, so that every sync may wait for a descheduled rank (4 ranks on 2
  // cores: 1 KiB all-gather 2.8 us staged, 4.8 us direct). With a core per rank the sync is cheap
  // and the copy is not (2 ranks on 2 cores: 16 KiB all-gather 3.1 us staged, 0.9 us direct; no
  // size measured faster staged).
  size_t staging_capacity() const override { return core_each_ ? 0 : LocalGroup::kStagingBytes; }
  void exchange_staged(const void* data, size_t bytes) override;
  const void* peer_staged(int rank) const override;
  // Publishes this rank's descriptor (and staged data) for the current collective, arrives, waits
  // for every rank and checks that all entered the same collective.
  void arrive_and_check(const void* data, size_t bytes);
  // Throws the mismatch report when what a rank entered at this sequence number (its staged
  // descriptor, or its published one if it took the direct path) differs from this rank's current
  // collective, or it is at another sequence number.
  void check_staged_descriptors();
  // Throws the mismatch report against rank r, which entered `entered` (nullptr: unknown).
  [[noreturn]] void throw_mismatch(int r, const CollectiveDescriptor* entered);
  void await_epoch(uint64_t epoch);

  // Takes the first message from `peer` with `tag` into data; false when there is none yet.
  bool try_take(void* data, size_t bytes, int peer, int tag);

  std::shared_ptr<LocalGroup> group_;
  bool core_each_ = true;  // no more ranks in the group than hardware threads
  LocalTransport transport_;
  uint64_t epoch_ = 0;
};

}  // namespace lattice::comm
