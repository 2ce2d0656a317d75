// Communicator: a group of ranks and everything they do together - tagged point-to-point messages,
// allreduce, reduce-scatter, all-gather, all-to-all, broadcast, reduce, barrier and split - in
// blocking and asynchronous forms, over any backend (local threads, MPI, NCCL). Counts are elements
// of `dtype`; every collective is checked (bad input, mismatched calls across ranks) and watched
// (no silent hangs).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "lattice/comm/algorithm.hpp"
#include "lattice/comm/collective_call.hpp"
#include "lattice/comm/comm_handle.hpp"
#include "lattice/comm/comm_options.hpp"
#include "lattice/comm/reduce_op.hpp"
#include "lattice/comm/trace.hpp"
#include "lattice/comm/watchdog.hpp"
#include "lattice/core/dtype.hpp"

namespace lattice::comm {

class AsyncExecutor;
class SharedAddressSpace;
class Transport;

class Communicator {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // "local", "mpi" or "nccl".
  virtual std::string_view backend() const = 0;
  // The node this rank runs on (0-based, dense) and its rank among the ranks of that node.
  int node() const { return node_; }
  int local_rank() const { return local_rank_; }
  int node_count() const { return node_count_; }

  // Collective over all ranks, as MPI_Comm_split: ranks with the same color form a new
  // communicator, ordered by (key, rank); a negative color returns nullptr for that rank.
  std::unique_ptr<Communicator> split(int color, int key);

  // --- point-to-point (tagged; messages from one rank with one tag arrive in order) ---
  void send(const void* data, int64_t count, DType dtype, int peer, int tag = 0);
  void recv(void* data, int64_t count, DType dtype, int peer, int tag = 0);
  CommHandle isend(const void* data, int64_t count, DType dtype, int peer, int tag = 0);
  CommHandle irecv(void* data, int64_t count, DType dtype, int peer, int tag = 0);

  // --- collectives (in: this rank's input; out: its result; in-place forms where it makes sense)
  // --- buffer = reduction over ranks of buffer (count elements).
  void allreduce(void* buffer, int64_t count, DType dtype, ReduceOp op);
  void allreduce(const void* in, void* out, int64_t count, DType dtype, ReduceOp op);
  // in: size() blocks of block_count; out: the reduction of block rank() (block_count elements).
  void reduce_scatter(const void* in, void* out, int64_t block_count, DType dtype, ReduceOp op);
  // in: block_count elements; out: size() blocks in rank order.
  void all_gather(const void* in, void* out, int64_t block_count, DType dtype);
  // in: counts[rank()] elements; out: counts[r] elements from each rank r in rank order.
  void all_gather_v(const void* in, void* out, std::span<const int64_t> counts, DType dtype);
  // in: block_count elements for each rank in rank order; out: block_count from each rank.
  void all_to_all(const void* in, void* out, int64_t block_count, DType dtype);
  // in: send_counts[r] elements for each rank r; out: recv_counts[r] elements from each rank r.
  void all_to_all_v(const void* in, std::span<const int64_t> send_counts, void* out,
                    std::span<const int64_t> recv_counts, DType dtype);
  // buffer on every rank receives root's buffer.
  void broadcast(void* buffer, int64_t count, DType dtype, int root);
  // out at root = reduction of every rank's in; out is ignored (may be null) on other ranks.
  void reduce(const void* in, void* out, int64_t count, DType dtype, ReduceOp op, int root);
  void barrier();

  // Asynchronous forms: the call is queued and run in order on this rank's communication thread;
  // the buffers must stay valid and untouched until the handle's wait() returns. A blocking
  // collective first waits for every queued one.
  CommHandle allreduce_async(void* buffer, int64_t count, DType dtype, ReduceOp op);
  CommHandle allreduce_async(const void* in, void* out, int64_t count, DType dtype, ReduceOp op);
  CommHandle reduce_scatter_async(const void* in, void* out, int64_t block_count, DType dtype,
                                  ReduceOp op);
  CommHandle all_gather_async(const void* in, void* out, int64_t block_count, DType dtype);
  CommHandle all_gather_v_async(const void* in, void* out, std::span<const int64_t> counts,
                                DType dtype);
  CommHandle all_to_all_async(const void* in, void* out, int64_t block_count, DType dtype);
  CommHandle all_to_all_v_async(const void* in, std::span<const int64_t> send_counts, void* out,
                                std::span<const int64_t> recv_counts, DType dtype);
  CommHandle broadcast_async(void* buffer, int64_t count, DType dtype, int root);
  CommHandle reduce_async(const void* in, void* out, int64_t count, DType dtype, ReduceOp op,
                          int root);
  CommHandle barrier_async();

  // Forces `algorithm` for `op` on this rank (every rank must make the same choice); automatic
  // resets.
  void set_algorithm(CollectiveOp op, Algorithm algorithm);
  // The algorithm a call of `op` moving `bytes` per rank would run.
  Algorithm algorithm_for(CollectiveOp op, int64_t bytes) const;
  const CommOptions& options() const { return options_; }
  void set_timeout(std::chrono::milliseconds timeout);

  // This rank's ring buffer of recent collectives.
  const CollectiveTrace& trace() const { return watchdog_.trace(); }
  // Collectives issued so far (the sequence number of the newest).
  uint64_t collectives_issued() const { return next_seq_ - 1; }

 protected:
  Communicator(int rank, int size, CommOptions options, std::shared_ptr<StatusBoard> board,
               std::string label);

  // Node layout; backends call it from their constructor (emulated nodes from options override it).
  void set_node_layout(int node, int local_rank, int node_count);

  // --- what a backend provides ---
  virtual Transport& transport() = 0;
  virtual SharedAddressSpace* shared_address_space() { return nullptr; }
  virtual bool has_native() const { return false; }
  virtual bool prefers_native() const { return false; }
  // False when the backend cannot be driven from a second thread (MPI without
  // MPI_THREAD_MULTIPLE): asynchronous calls then run at submission and return a completed handle.
  virtual bool supports_async_thread() const { return true; }
  virtual void run_native(const CollectiveCall& call);
  // Called before a collective's algorithm runs (after the watchdog's begin); MPI verifies there.
  virtual void before_collective(const CollectiveCall& call) {}
  // split() once colors are known: members in new-rank order; this rank is members[new_rank].
  virtual std::unique_ptr<Communicator> make_split(std::span<const int> members, int new_rank,
                                                   int color) = 0;
  virtual void point_send(const void* data, size_t bytes, int peer, int tag) = 0;
  virtual void point_recv(void* data, size_t bytes, int peer, int tag) = 0;
  virtual CommHandle point_isend(const void* data, size_t bytes, int peer, int tag) = 0;
  virtual CommHandle point_irecv(void* data, size_t bytes, int peer, int tag) = 0;

  Watchdog& watchdog() { return watchdog_; }
  // Stops the asynchronous thread after finishing queued work; backend destructors call it first.
  void stop_async();

 private:
  CommHandle submit(CollectiveCall call, bool asynchronous);
  void execute(const CollectiveCall& call, uint64_t seq);
  void run_algorithm(const CollectiveCall& call);
  void run_hierarchical(const CollectiveCall& call);
  void prepare_hierarchy();
  CollectiveCall make_call(CollectiveOp op, const void* in, void* out, int64_t count, DType dtype,
                           ReduceOp reduce_op, int root) const;
  CollectiveCall make_gather_v_call(const void* in, void* out, std::span<const int64_t> counts,
                                    DType dtype) const;
  CollectiveCall make_all_to_all_v_call(const void* in, std::span<const int64_t> send_counts,
                                        void* out, std::span<const int64_t> recv_counts,
                                        DType dtype) const;
  void check_peer(const char* what, int peer) const;

  int rank_;
  int size_;
  int node_ = 0;
  int local_rank_ = 0;
  int node_count_ = 1;
  CommOptions options_;
  Watchdog watchdog_;
  uint64_t next_seq_ = 1;
  std::unique_ptr<AsyncExecutor> async_;
  std::unique_ptr<Communicator> node_group_;    // hierarchical: ranks of this node
  std::unique_ptr<Communicator> leader_group_;  // hierarchical: local rank 0 of every node
  bool hierarchy_ready_ = false;
};

}  // namespace lattice::comm
