// Direct algorithms: one exchange of buffer pointers, the data movement split so that every rank
// does 1/n of it with slices aligned to 64 bytes (no false sharing), and one closing sync. Gathers
// and all-to-alls copy the rank's own block while its publication travels to the peers.
#include "lattice/comm/algorithms/direct.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "lattice/comm/reduce_kernels.hpp"
#include "lattice/core/error.hpp"

namespace lattice::comm {
namespace {

// One pointer per rank for a call: on the stack for groups of up to 16 ranks (the small collectives
// allocate nothing), on the heap beyond.
template <class T>
class PerRank {
 public:
  explicit PerRank(int n) {
    if (n > static_cast<int>(local_.size())) heap_.resize(static_cast<size_t>(n));
    data_ = heap_.empty() ? local_.data() : heap_.data();
  }
  T* data() { return data_; }
  T& operator[](int r) { return data_[r]; }

 private:
  std::array<T, 16> local_{};
  std::vector<T> heap_;
  T* data_ = nullptr;
};

struct Slice {
  int64_t begin = 0;
  int64_t end = 0;
};

// Rank `rank`'s share of `count` elements, cut at 64-byte boundaries.
Slice slice_of(int64_t count, int rank, int n, DType dtype) {
  int64_t unit = std::max<int64_t>(1, 64 / static_cast<int64_t>(dtype_size(dtype)));
  int64_t units = (count + unit - 1) / unit;
  int64_t per_rank = (units + n - 1) / n;
  Slice slice;
  slice.begin = std::min(count, per_rank * unit * rank);
  slice.end = std::min(count, per_rank * unit * (rank + 1));
  return slice;
}

const char* offset(const void* base, int64_t elements, size_t element) {
  return static_cast<const char*>(base) + static_cast<size_t>(elements) * element;
}
char* offset(void* base, int64_t elements, size_t element) {
  return static_cast<char*>(base) + static_cast<size_t>(elements) * element;
}

void direct_allreduce(SharedAddressSpace& space, const CollectiveCall& call, bool to_root_only) {
  const int n = space.size();
  const size_t element = dtype_size(call.dtype());
  Slice slice = slice_of(call.count(), space.rank(), n, call.dtype());
  int64_t length = slice.end - slice.begin;
  if (length > 0) {
    PerRank<const void*> sources(n);
    PerRank<void*> targets(n);
    int target_count = 0;
    for (int r = 0; r < n; ++r) sources[r] = offset(space.peer(r).in, slice.begin, element);
    if (to_root_only) {
      targets[target_count++] = offset(space.peer(call.descriptor.root).out, slice.begin, element);
    } else {
      for (int r = 0; r < n; ++r)
        targets[target_count++] = offset(space.peer(r).out, slice.begin, element);
    }
    int divisor = call.descriptor.reduce_op == ReduceOp::avg ? n : 0;
    reduce_into_targets(sources.data(), n, targets.data(), target_count, length, call.dtype(),
                        call.descriptor.reduce_op, divisor);
  }
}

void direct_reduce_scatter(SharedAddressSpace& space, const CollectiveCall& call) {
  const int n = space.size();
  const int rank = space.rank();
  const size_t element = dtype_size(call.dtype());
  PerRank<const void*> sources(n);
  for (int r = 0; r < n; ++r) sources[r] = offset(space.peer(r).in, call.count() * rank, element);
  void* targets[1] = {call.out};
  int divisor = call.descriptor.reduce_op == ReduceOp::avg ? n : 0;
  reduce_into_targets(sources.data(), n, targets, 1, call.count(), call.dtype(),
                      call.descriptor.reduce_op, divisor);
}

// Where rank `r`'s block starts in an all-gather's output.
int64_t gather_position(const CollectiveCall& call, int r) {
  if (call.counts.empty()) return call.count() * r;
  int64_t position = 0;
  for (int k = 0; k < r; ++k) position += call.counts[k];
  return position;
}

// An all_to_all_v's receive count from `sender` as `receiver` declared it against what `sender`
// declared it sends.
void check_sent_matches_expected(int receiver, int sender, int64_t expected, int64_t sent) {
  if (sent == expected) return;
  throw Error("all_to_all_v: rank " + std::to_string(receiver) + " expects " +
              std::to_string(expected) + " elements from rank " + std::to_string(sender) +
              " but rank " + std::to_string(sender) + " sends it " + std::to_string(sent));
}

// The part of an all-gather's or all-to-all's output that comes from this rank's own input: copied
// between publishing and awaiting the peers, while the publication travels (at 64 KiB the copy
// hides most of a cross-core handoff).
void copy_own_block(int rank, const CollectiveCall& call) {
  const size_t element = dtype_size(call.dtype());
  const CollectiveOp op = call.descriptor.op;
  if (op == CollectiveOp::all_gather || op == CollectiveOp::all_gather_v) {
    copy_bytes(offset(call.out, gather_position(call, rank), element), call.in,
               static_cast<size_t>(call.count()) * element);
    return;
  }
  int64_t send_offset = call.count() * rank, receive_offset = call.count() * rank;
  int64_t sent = call.count(), expected = call.count();
  if (!call.counts.empty()) {
    send_offset = receive_offset = 0;
    for (int k = 0; k < rank; ++k) {
      send_offset += call.counts[k];
      receive_offset += call.recv_counts[k];
    }
    sent = call.counts[rank];
    expected = call.recv_counts[rank];
  }
  check_sent_matches_expected(rank, rank, expected, sent);
  copy_bytes(offset(call.out, receive_offset, element), offset(call.in, send_offset, element),
             static_cast<size_t>(expected) * element);
}

// The peers' blocks (this rank's own was copied by copy_own_block).
void direct_all_gather(SharedAddressSpace& space, const CollectiveCall& call) {
  const int n = space.size();
  const size_t element = dtype_size(call.dtype());
  int64_t position = 0;
  for (int r = 0; r < n; ++r) {
    const int64_t expected = call.counts.empty() ? call.count() : call.counts[r];
    const int64_t block_begin = position;
    position += expected;
    if (r == space.rank()) continue;
    const DirectBuffers& peer = space.peer(r);
    if (peer.count != expected) {
      throw Error(std::string(collective_op_name(call.descriptor.op)) + ": rank " +
                  std::to_string(space.rank()) + " expects " + std::to_string(expected) +
                  " elements from rank " + std::to_string(r) + " but rank " + std::to_string(r) +
                  " contributes " + std::to_string(peer.count));
    }
    copy_bytes(offset(call.out, block_begin, element), peer.in,
               static_cast<size_t>(expected) * element);
  }
}

// The peers' blocks (this rank's own was copied by copy_own_block).
void direct_all_to_all(SharedAddressSpace& space, const CollectiveCall& call) {
  const int n = space.size();
  const int rank = space.rank();
  const size_t element = dtype_size(call.dtype());
  int64_t position = 0;
  for (int r = 0; r < n; ++r) {
    const int64_t expected = call.counts.empty() ? call.count() : call.recv_counts[r];
    const int64_t block_begin = position;
    position += expected;
    if (r == rank) continue;
    const DirectBuffers& peer = space.peer(r);
    int64_t peer_offset = call.count() * rank;
    int64_t sent = call.count();
    if (!call.counts.empty()) {
      peer_offset = 0;
      for (int k = 0; k < rank; ++k) peer_offset += peer.counts[k];
      sent = peer.counts[rank];
    }
    check_sent_matches_expected(rank, r, expected, sent);
    copy_bytes(offset(call.out, block_begin, element), offset(peer.in, peer_offset, element),
               static_cast<size_t>(expected) * element);
  }
}

}  // namespace

// Small collectives: one publication of staged input copies, then every rank reads what it needs
// (reductions in rank order, so every rank gets the same bits); no closing sync is needed.
bool run_staged(SharedAddressSpace& space, const CollectiveCall& call) {
  const CollectiveDescriptor& d = call.descriptor;
  const int n = space.size();
  const int rank = space.rank();
  const size_t element = dtype_size(call.dtype());
  const size_t count_bytes = static_cast<size_t>(call.count()) * element;
  size_t input_bytes = 0;
  switch (d.op) {
    case CollectiveOp::barrier:
      input_bytes = 0;
      break;
    case CollectiveOp::allreduce:
    case CollectiveOp::all_gather:
    case CollectiveOp::reduce:
      input_bytes = count_bytes;
      break;
    case CollectiveOp::broadcast:
      input_bytes = rank == d.root ? count_bytes : 0;
      break;
    case CollectiveOp::reduce_scatter:
    case CollectiveOp::all_to_all:
      input_bytes = count_bytes * static_cast<size_t>(n);
      break;
    default:
      return false;
  }
  if (count_bytes * static_cast<size_t>(n) > space.staging_capacity()) return false;
  space.exchange_staged(call.in, input_bytes);
  const int divisor = d.reduce_op == ReduceOp::avg ? n : 0;
  auto staged = [&](int r, size_t offset) {
    return static_cast<const char*>(space.peer_staged(r)) + offset;
  };
  if (count_bytes == 0) return true;
  PerRank<const void*> sources(n);
  switch (d.op) {
    case CollectiveOp::allreduce:
    case CollectiveOp::reduce: {
      if (d.op == CollectiveOp::reduce && rank != d.root) break;
      for (int r = 0; r < n; ++r) sources[r] = staged(r, 0);
      void* targets[1] = {call.out};
      reduce_into_targets(sources.data(), n, targets, 1, call.count(), call.dtype(), d.reduce_op,
                          divisor);
      break;
    }
    case CollectiveOp::reduce_scatter: {
      for (int r = 0; r < n; ++r) sources[r] = staged(r, count_bytes * static_cast<size_t>(rank));
      void* targets[1] = {call.out};
      reduce_into_targets(sources.data(), n, targets, 1, call.count(), call.dtype(), d.reduce_op,
                          divisor);
      break;
    }
    case CollectiveOp::all_gather:
      for (int r = 0; r < n; ++r)
        std::memcpy(offset(call.out, call.count() * r, element), staged(r, 0), count_bytes);
      break;
    case CollectiveOp::all_to_all:
      for (int r = 0; r < n; ++r) {
        std::memcpy(offset(call.out, call.count() * r, element),
                    staged(r, count_bytes * static_cast<size_t>(rank)), count_bytes);
      }
      break;
    case CollectiveOp::broadcast:
      if (rank != d.root) std::memcpy(call.out, staged(d.root, 0), count_bytes);
      break;
    default:
      break;
  }
  return true;
}

void run_direct(SharedAddressSpace& space, const CollectiveCall& call) {
  if (run_staged(space, call)) return;
  DirectBuffers mine;
  mine.in = call.in;
  mine.out = call.out;
  mine.count = call.count();
  mine.counts = call.counts.empty() ? nullptr : call.counts.data();
  space.publish(mine);
  const CollectiveOp op = call.descriptor.op;
  if (op == CollectiveOp::all_gather || op == CollectiveOp::all_gather_v ||
      op == CollectiveOp::all_to_all || op == CollectiveOp::all_to_all_v)
    copy_own_block(space.rank(), call);
  space.await_published();
  const size_t element = dtype_size(call.dtype());
  switch (call.descriptor.op) {
    case CollectiveOp::allreduce:
      direct_allreduce(space, call, false);
      break;
    case CollectiveOp::reduce:
      direct_allreduce(space, call, true);
      break;
    case CollectiveOp::reduce_scatter:
      direct_reduce_scatter(space, call);
      break;
    case CollectiveOp::all_gather:
    case CollectiveOp::all_gather_v:
      direct_all_gather(space, call);
      break;
    case CollectiveOp::all_to_all:
    case CollectiveOp::all_to_all_v:
      direct_all_to_all(space, call);
      break;
    case CollectiveOp::broadcast:
      if (space.rank() != call.descriptor.root) {
        copy_bytes(call.out, space.peer(call.descriptor.root).in,
                   static_cast<size_t>(call.count()) * element);
      }
      break;
    case CollectiveOp::barrier:
    case CollectiveOp::split:
      break;  // the exchange was the barrier; the sync keeps slots stable until all checked them
  }
  space.sync();
}

}  // namespace lattice::comm
