// GlooLink: the communicator between replica groups — Gloo's TCP transport and collectives
// (Debian's libgloo), its ranks rendezvousing through the membership store (EtcdStore: Gloo's Store
// interface over etcd) under a key prefix of their own, so that each quorum makes a fresh link of
// its current members. Unlike MPI it survives a peer's death: a collective whose peer died or timed
// out throws an Error (the link is then spent; the survivors make a new one without the dead
// member), and nothing else in the process is affected.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lattice/parallel/replica/etcd_client.hpp"

namespace gloo {
class Context;
namespace transport {
class Device;
}
}  // namespace gloo

namespace lattice::replica {

class GlooLink {
 public:
  // Collective over the `size` members that name the same `prefix` in `store`: each publishes its
  // address (a TCP listener on `hostname`, e.g. 127.0.0.1 or the node's address on the link) and
  // connects to every other. `timeout`: the rendezvous and every later collective.
  GlooLink(const std::string& store_endpoint, const std::string& prefix, int rank, int size,
           const std::string& hostname, std::chrono::milliseconds timeout);
  ~GlooLink();
  GlooLink(const GlooLink&) = delete;
  GlooLink& operator=(const GlooLink&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // buffer = the sum over members of `count` floats (Gloo's ring: every member gets the same bits).
  void allreduce_sum(float* buffer, int64_t count);
  // Every member's `bytes` at root's.
  void broadcast(void* buffer, int64_t bytes, int root);
  // out: size() blocks of `bytes`, member r's input at block r.
  void all_gather(const void* in, void* out, int64_t bytes);

  // Bytes this member has sent over the link so far (by the algorithms' counts: a ring allreduce
  // of n bytes sends 2·(size-1)/size·n, a broadcast's root (size-1)·n).
  int64_t bytes_sent() const { return bytes_sent_; }

 private:
  // Runs a Gloo collective, turning its failure into one Error line naming `what`.
  template <typename Run>
  void guarded(const char* what, Run&& run);

  int rank_, size_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  int64_t bytes_sent_ = 0;
  uint32_t tag_ = 0;
  std::string store_endpoint_;
  int64_t lease_ = 0;  // the rendezvous keys'
};

}  // namespace lattice::replica
