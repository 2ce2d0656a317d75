// Communicator: validation, sequence numbers and watchdog bookkeeping, the asynchronous queue,
// split, and the dispatch of each collective to its algorithm.
#include "lattice/comm/communicator.hpp"

#include <algorithm>
#include <exception>
#include <map>
#include <numeric>
#include <tuple>
#include <vector>

#include "lattice/comm/algorithms/direct.hpp"
#include "lattice/comm/algorithms/dissemination_barrier.hpp"
#include "lattice/comm/algorithms/halving_doubling.hpp"
#include "lattice/comm/algorithms/pairwise.hpp"
#include "lattice/comm/algorithms/ring.hpp"
#include "lattice/comm/algorithms/tree.hpp"
#include "lattice/comm/async_executor.hpp"
#include "lattice/comm/reduce_kernels.hpp"
#include "lattice/comm/transport.hpp"
#include "lattice/core/error.hpp"

namespace lattice::comm {
namespace {

// A handle whose operation already failed; wait() rethrows.
class FailedHandle : public CommHandle::State {
 public:
  explicit FailedHandle(std::exception_ptr error) : error_(std::move(error)) {}
  void wait() override { std::rethrow_exception(error_); }
  bool test() override { return true; }

 private:
  std::exception_ptr error_;
};

int64_t sum_counts(std::span<const int64_t> counts) {
  return std::accumulate(counts.begin(), counts.end(), int64_t{0});
}

}  // namespace

Communicator::Communicator(int rank, int size, CommOptions options,
                           std::shared_ptr<StatusBoard> board, std::string label)
    : rank_(rank),
      size_(size),
      options_(options),
      watchdog_(std::move(board), rank, options.timeout, std::move(label)) {
  set_node_layout(0, rank, 1);
}

Communicator::~Communicator() = default;

void Communicator::stop_async() {
  async_.reset();
}

void Communicator::set_node_layout(int node, int local_rank, int node_count) {
  if (options_.ranks_per_node > 0) {
    node_ = rank_ / options_.ranks_per_node;
    local_rank_ = rank_ % options_.ranks_per_node;
    node_count_ = (size_ + options_.ranks_per_node - 1) / options_.ranks_per_node;
    return;
  }
  node_ = node;
  local_rank_ = local_rank;
  node_count_ = node_count;
}

void Communicator::set_timeout(std::chrono::milliseconds timeout) {
  options_.timeout = timeout;
  watchdog_.set_timeout(timeout);
}

void Communicator::set_algorithm(CollectiveOp op, Algorithm algorithm) {
  if (!algorithm_supports(algorithm, op)) {
    throw Error("algorithm " + std::string(algorithm_name(algorithm)) + " does not implement " +
                std::string(collective_op_name(op)) + "; choose another or auto");
  }
  options_.force(op, algorithm);
}

Algorithm Communicator::algorithm_for(CollectiveOp op, int64_t bytes) const {
  Algorithm forced = options_.forced(op);
  if (forced != Algorithm::automatic) return forced;
  AlgorithmCapabilities capabilities;
  capabilities.shared_address_space = const_cast<Communicator*>(this)->shared_address_space();
  capabilities.native = has_native();
  capabilities.prefer_native = prefers_native();
  return select_algorithm(op, bytes, size_, capabilities);
}

void Communicator::check_peer(const char* what, int peer) const {
  if (peer < 0 || peer >= size_) {
    throw Error(std::string(what) + ": rank " + std::to_string(peer) + " is out of range on rank " +
                std::to_string(rank_) + " of a " + std::to_string(size_) + "-rank communicator");
  }
}

CollectiveCall Communicator::make_call(CollectiveOp op, const void* in, void* out, int64_t count,
                                       DType dtype, ReduceOp reduce_op, int root) const {
  // Names are built on the error paths only (this runs on every collective).
  auto name = [op] { return std::string(collective_op_name(op)); };
  if (count < 0) {
    throw Error(name() + ": negative count " + std::to_string(count) + " on rank " +
                std::to_string(rank_));
  }
  if (!is_collective_dtype(dtype)) {
    throw Error(name() + ": element type " + std::string(dtype_name(dtype)) +
                " is not supported; use f32, bf16, f16, i32 or i64");
  }
  if (op == CollectiveOp::broadcast || op == CollectiveOp::reduce) check_peer(name().c_str(), root);
  CollectiveCall call;
  call.descriptor.op = op;
  call.descriptor.dtype = dtype;
  call.descriptor.reduce_op = reduce_op;
  call.descriptor.root = root;
  call.descriptor.count = count;
  call.in = in;
  call.out = out;
  return call;
}

// --- point-to-point ---

void Communicator::send(const void* data, int64_t count, DType dtype, int peer, int tag) {
  check_peer("send", peer);
  check(count >= 0,
        "send: negative count " + std::to_string(count) + " on rank " + std::to_string(rank_));
  point_send(data, static_cast<size_t>(count) * dtype_size(dtype), peer, tag);
}

void Communicator::recv(void* data, int64_t count, DType dtype, int peer, int tag) {
  check_peer("recv", peer);
  check(count >= 0,
        "recv: negative count " + std::to_string(count) + " on rank " + std::to_string(rank_));
  point_recv(data, static_cast<size_t>(count) * dtype_size(dtype), peer, tag);
}

CommHandle Communicator::isend(const void* data, int64_t count, DType dtype, int peer, int tag) {
  check_peer("isend", peer);
  check(count >= 0,
        "isend: negative count " + std::to_string(count) + " on rank " + std::to_string(rank_));
  return point_isend(data, static_cast<size_t>(count) * dtype_size(dtype), peer, tag);
}

CommHandle Communicator::irecv(void* data, int64_t count, DType dtype, int peer, int tag) {
  check_peer("irecv", peer);
  check(count >= 0,
        "irecv: negative count " + std::to_string(count) + " on rank " + std::to_string(rank_));
  return point_irecv(data, static_cast<size_t>(count) * dtype_size(dtype), peer, tag);
}

// --- collectives ---

void Communicator::allreduce(void* buffer, int64_t count, DType dtype, ReduceOp op) {
  allreduce(buffer, buffer, count, dtype, op);
}
void Communicator::allreduce(const void* in, void* out, int64_t count, DType dtype, ReduceOp op) {
  submit(make_call(CollectiveOp::allreduce, in, out, count, dtype, op, 0), false);
}
void Communicator::reduce_scatter(const void* in, void* out, int64_t block_count, DType dtype,
                                  ReduceOp op) {
  submit(make_call(CollectiveOp::reduce_scatter, in, out, block_count, dtype, op, 0), false);
}
void Communicator::all_gather(const void* in, void* out, int64_t block_count, DType dtype) {
  submit(make_call(CollectiveOp::all_gather, in, out, block_count, dtype, ReduceOp::sum, 0), false);
}
void Communicator::all_gather_v(const void* in, void* out, std::span<const int64_t> counts,
                                DType dtype) {
  submit(make_gather_v_call(in, out, counts, dtype), false);
}
void Communicator::all_to_all(const void* in, void* out, int64_t block_count, DType dtype) {
  submit(make_call(CollectiveOp::all_to_all, in, out, block_count, dtype, ReduceOp::sum, 0), false);
}
void Communicator::all_to_all_v(const void* in, std::span<const int64_t> send_counts, void* out,
                                std::span<const int64_t> recv_counts, DType dtype) {
  submit(make_all_to_all_v_call(in, send_counts, out, recv_counts, dtype), false);
}
void Communicator::broadcast(void* buffer, int64_t count, DType dtype, int root) {
  submit(make_call(CollectiveOp::broadcast, buffer, buffer, count, dtype, ReduceOp::sum, root),
         false);
}
void Communicator::reduce(const void* in, void* out, int64_t count, DType dtype, ReduceOp op,
                          int root) {
  submit(make_call(CollectiveOp::reduce, in, out, count, dtype, op, root), false);
}
void Communicator::barrier() {
  submit(make_call(CollectiveOp::barrier, nullptr, nullptr, 0, DType::i32, ReduceOp::sum, 0),
         false);
}

CommHandle Communicator::allreduce_async(void* buffer, int64_t count, DType dtype, ReduceOp op) {
  return allreduce_async(buffer, buffer, count, dtype, op);
}
CommHandle Communicator::allreduce_async(const void* in, void* out, int64_t count, DType dtype,
                                         ReduceOp op) {
  return submit(make_call(CollectiveOp::allreduce, in, out, count, dtype, op, 0), true);
}
CommHandle Communicator::reduce_scatter_async(const void* in, void* out, int64_t block_count,
                                              DType dtype, ReduceOp op) {
  return submit(make_call(CollectiveOp::reduce_scatter, in, out, block_count, dtype, op, 0), true);
}
CommHandle Communicator::all_gather_async(const void* in, void* out, int64_t block_count,
                                          DType dtype) {
  return submit(make_call(CollectiveOp::all_gather, in, out, block_count, dtype, ReduceOp::sum, 0),
                true);
}
CommHandle Communicator::all_gather_v_async(const void* in, void* out,
                                            std::span<const int64_t> counts, DType dtype) {
  return submit(make_gather_v_call(in, out, counts, dtype), true);
}

CollectiveCall Communicator::make_gather_v_call(const void* in, void* out,
                                                std::span<const int64_t> counts,
                                                DType dtype) const {
  if (static_cast<int>(counts.size()) != size_) {
    throw Error("all_gather_v: " + std::to_string(counts.size()) + " counts given on rank " +
                std::to_string(rank_) + ", expected one per rank (" + std::to_string(size_) + ")");
  }
  for (int64_t c : counts) {
    if (c < 0) {
      throw Error("all_gather_v: negative count " + std::to_string(c) + " on rank " +
                  std::to_string(rank_));
    }
  }
  CollectiveCall call =
      make_call(CollectiveOp::all_gather_v, in, out, counts[rank_], dtype, ReduceOp::sum, 0);
  call.counts.assign(counts.begin(), counts.end());
  return call;
}
CommHandle Communicator::all_to_all_async(const void* in, void* out, int64_t block_count,
                                          DType dtype) {
  return submit(make_call(CollectiveOp::all_to_all, in, out, block_count, dtype, ReduceOp::sum, 0),
                true);
}
CommHandle Communicator::all_to_all_v_async(const void* in, std::span<const int64_t> send_counts,
                                            void* out, std::span<const int64_t> recv_counts,
                                            DType dtype) {
  return submit(make_all_to_all_v_call(in, send_counts, out, recv_counts, dtype), true);
}

CollectiveCall Communicator::make_all_to_all_v_call(const void* in,
                                                    std::span<const int64_t> send_counts, void* out,
                                                    std::span<const int64_t> recv_counts,
                                                    DType dtype) const {
  if (static_cast<int>(send_counts.size()) != size_ ||
      static_cast<int>(recv_counts.size()) != size_) {
    throw Error("all_to_all_v: send and receive counts need one entry per rank (" +
                std::to_string(size_) + ") on rank " + std::to_string(rank_));
  }
  for (int64_t c : send_counts)
    check(c >= 0, "all_to_all_v: negative send count on rank " + std::to_string(rank_));
  for (int64_t c : recv_counts)
    check(c >= 0, "all_to_all_v: negative receive count on rank " + std::to_string(rank_));
  CollectiveCall call = make_call(CollectiveOp::all_to_all_v, in, out, sum_counts(send_counts),
                                  dtype, ReduceOp::sum, 0);
  call.counts.assign(send_counts.begin(), send_counts.end());
  call.recv_counts.assign(recv_counts.begin(), recv_counts.end());
  return call;
}
CommHandle Communicator::broadcast_async(void* buffer, int64_t count, DType dtype, int root) {
  return submit(
      make_call(CollectiveOp::broadcast, buffer, buffer, count, dtype, ReduceOp::sum, root), true);
}
CommHandle Communicator::reduce_async(const void* in, void* out, int64_t count, DType dtype,
                                      ReduceOp op, int root) {
  return submit(make_call(CollectiveOp::reduce, in, out, count, dtype, op, root), true);
}
CommHandle Communicator::barrier_async() {
  return submit(make_call(CollectiveOp::barrier, nullptr, nullptr, 0, DType::i32, ReduceOp::sum, 0),
                true);
}

// --- execution ---

CommHandle Communicator::submit(CollectiveCall call, bool asynchronous) {
  const CollectiveOp op = call.descriptor.op;
  int64_t bytes = call.count() * static_cast<int64_t>(dtype_size(call.dtype()));
  if (op == CollectiveOp::all_gather || op == CollectiveOp::all_to_all ||
      op == CollectiveOp::reduce_scatter)
    bytes *= size_;
  if (op == CollectiveOp::all_gather_v) bytes = sum_counts(call.counts) * dtype_size(call.dtype());
  call.algorithm = algorithm_for(op, bytes);
  auto name = [op] { return std::string(collective_op_name(op)); };  // error paths only
  if (!algorithm_supports(call.algorithm, op)) {
    throw Error(name() + ": algorithm " + std::string(algorithm_name(call.algorithm)) +
                " does not implement it; choose another or auto");
  }
  if (call.algorithm == Algorithm::direct && !shared_address_space()) {
    throw Error(name() + ": the direct algorithm needs ranks that share an address space; the " +
                std::string(backend()) + " backend has none");
  }
  if (call.algorithm == Algorithm::native && !has_native()) {
    throw Error(name() + ": the " + std::string(backend()) +
                " backend has no native collectives; choose ring, tree, ... or auto");
  }
  if (call.algorithm == Algorithm::hierarchical && !hierarchy_ready_) prepare_hierarchy();
  if (asynchronous && !supports_async_thread()) {
    try {
      execute(call, next_seq_++);
    } catch (...) {
      return CommHandle(std::make_shared<FailedHandle>(std::current_exception()));
    }
    return {};
  }
  if (asynchronous) {
    uint64_t seq = next_seq_++;
    if (!async_) async_ = std::make_unique<AsyncExecutor>();
    return async_->enqueue([this, call = std::move(call), seq] { execute(call, seq); });
  }
  if (async_) async_->drain();
  execute(call, next_seq_++);
  return {};
}

void Communicator::execute(const CollectiveCall& call, uint64_t seq) {
  int64_t bytes = call.count() * static_cast<int64_t>(dtype_size(call.dtype()));
  watchdog_.begin(seq, call.descriptor, call.algorithm, bytes);
  try {
    before_collective(call);
    run_algorithm(call);
  } catch (...) {
    watchdog_.end(false);
    throw;
  }
  watchdog_.end(true);
}

void Communicator::run_algorithm(const CollectiveCall& call) {
  switch (call.algorithm) {
    case Algorithm::native:
      run_native(call);
      return;
    case Algorithm::direct:
      run_direct(*shared_address_space(), call);
      return;
    case Algorithm::hierarchical:
      run_hierarchical(call);
      return;
    default:
      break;
  }
  Transport& link = transport();
  const CollectiveDescriptor& d = call.descriptor;
  switch (d.op) {
    case CollectiveOp::allreduce:
      if (call.algorithm == Algorithm::ring) {
        ring_allreduce(link, call.in, call.out, d.count, d.dtype, d.reduce_op);
      } else if (call.algorithm == Algorithm::tree) {
        tree_allreduce(link, call.in, call.out, d.count, d.dtype, d.reduce_op,
                       options_.tree_chunk_bytes);
      } else {
        halving_doubling_allreduce(link, call.in, call.out, d.count, d.dtype, d.reduce_op);
      }
      return;
    case CollectiveOp::reduce_scatter:
      ring_reduce_scatter(link, call.in, call.out, d.count, d.dtype, d.reduce_op);
      return;
    case CollectiveOp::all_gather: {
      std::vector<int64_t> counts(static_cast<size_t>(size_), d.count);
      ring_all_gather(link, call.in, call.out, counts, d.dtype);
      return;
    }
    case CollectiveOp::all_gather_v:
      ring_all_gather(link, call.in, call.out, call.counts, d.dtype);
      return;
    case CollectiveOp::all_to_all: {
      std::vector<int64_t> counts(static_cast<size_t>(size_), d.count);
      pairwise_all_to_all(link, call.in, counts, call.out, counts, d.dtype);
      return;
    }
    case CollectiveOp::all_to_all_v:
      pairwise_all_to_all(link, call.in, call.counts, call.out, call.recv_counts, d.dtype);
      return;
    case CollectiveOp::broadcast:
      tree_broadcast(link, call.out, d.count, d.dtype, d.root, options_.tree_chunk_bytes);
      return;
    case CollectiveOp::reduce:
      tree_reduce(link, call.in, rank_ == d.root ? call.out : nullptr, d.count, d.dtype,
                  d.reduce_op, d.root, options_.tree_chunk_bytes);
      return;
    case CollectiveOp::barrier:
    case CollectiveOp::split:
      dissemination_barrier(link);
      return;
  }
}

void Communicator::run_native(const CollectiveCall& call) {
  throw Error(std::string(collective_op_name(call.descriptor.op)) + ": the " +
              std::string(backend()) + " backend has no native collectives");
}

void Communicator::prepare_hierarchy() {
  node_group_ = split(node_, rank_);
  leader_group_ = split(local_rank_ == 0 ? 0 : -1, rank_);
  hierarchy_ready_ = true;
}

void Communicator::run_hierarchical(const CollectiveCall& call) {
  const CollectiveDescriptor& d = call.descriptor;
  ReduceOp inner = d.reduce_op == ReduceOp::avg ? ReduceOp::sum : d.reduce_op;
  node_group_->reduce(call.in, call.out, d.count, d.dtype, inner, 0);
  if (leader_group_) leader_group_->allreduce(call.out, d.count, d.dtype, inner);
  node_group_->broadcast(call.out, d.count, d.dtype, 0);
  if (d.reduce_op == ReduceOp::avg) divide_in_place(call.out, d.count, d.dtype, size_);
}

std::unique_ptr<Communicator> Communicator::split(int color, int key) {
  // Every rank learns every rank's (color, key, node).
  int64_t mine[3] = {color, key, node_};
  std::vector<int64_t> all(static_cast<size_t>(3 * size_));
  all_gather(mine, all.data(), 3, DType::i64);
  std::vector<int> members;
  for (int r = 0; r < size_; ++r) {
    if (color >= 0 && all[3 * r] == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    return std::tie(all[3 * a + 1], a) < std::tie(all[3 * b + 1], b);
  });
  int new_rank = -1;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] == rank_) new_rank = static_cast<int>(i);
  }
  std::unique_ptr<Communicator> child = make_split(members, new_rank, color);
  if (!child) return nullptr;
  // Node layout of the child, derived from the members' nodes.
  std::map<int64_t, int> dense_node;
  for (int m : members) dense_node.emplace(all[3 * m + 2], 0);
  int index = 0;
  for (auto& [node, dense] : dense_node) dense = index++;
  int local = 0;
  for (int i = 0; i < new_rank; ++i) {
    if (all[3 * members[i] + 2] == node_) ++local;
  }
  child->options_.ranks_per_node = 0;
  for (Algorithm& forced : child->options_.algorithms) {
    if (forced == Algorithm::hierarchical) forced = Algorithm::automatic;  // no nesting of levels
  }
  child->set_node_layout(dense_node[node_], local, static_cast<int>(dense_node.size()));
  return child;
}

}  // namespace lattice::comm
