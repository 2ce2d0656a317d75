// Ring allreduce / reduce-scatter / all-gather: n-1 steps per phase, each rank sending to rank+1
// and receiving from rank-1, so every link carries 1/n of the data per step.
#include "lattice/comm/algorithms/ring.hpp"

#include <vector>

#include "lattice/comm/reduce_kernels.hpp"

namespace lattice::comm {
namespace {

int wrap(int value, int n) {
  return ((value % n) + n) % n;
}

}  // namespace

void ring_allreduce(Transport& transport, const void* in, void* out, int64_t count, DType dtype,
                    ReduceOp op) {
  const int n = transport.size();
  const int rank = transport.rank();
  const size_t element = dtype_size(dtype);
  if (n == 1) {
    copy_bytes(out, in, static_cast<size_t>(count) * element);
    return;
  }
  auto begin = [&](int chunk) { return count * chunk / n; };
  auto length = [&](int chunk) { return begin(chunk + 1) - begin(chunk); };
  auto at = [&](const void* base, int chunk) {
    return static_cast<const char*>(base) + static_cast<size_t>(begin(chunk)) * element;
  };
  auto at_out = [&](int chunk) {
    return static_cast<char*>(out) + static_cast<size_t>(begin(chunk)) * element;
  };
  const int right = wrap(rank + 1, n);
  const int left = wrap(rank - 1, n);
  const int divisor = op == ReduceOp::avg ? n : 0;
  // Reduce-scatter: after step s, chunk (rank - s - 1) holds the partial sum of s + 2 ranks.
  for (int step = 0; step < n - 1; ++step) {
    int send_chunk = wrap(rank - step, n);
    int recv_chunk = wrap(rank - step - 1, n);
    const void* send_from = step == 0 ? at(in, send_chunk) : at_out(send_chunk);
    transport.sendrecv_reduce(send_from, static_cast<size_t>(length(send_chunk)) * element, right,
                              at_out(recv_chunk), at(in, recv_chunk), length(recv_chunk), dtype, op,
                              left, step == n - 2 ? divisor : 0);
  }
  // All-gather: chunk (rank + 1) is complete here; pass complete chunks around the ring.
  for (int step = 0; step < n - 1; ++step) {
    int send_chunk = wrap(rank + 1 - step, n);
    int recv_chunk = wrap(rank - step, n);
    transport.sendrecv(at_out(send_chunk), static_cast<size_t>(length(send_chunk)) * element, right,
                       at_out(recv_chunk), static_cast<size_t>(length(recv_chunk)) * element, left);
  }
}

void ring_reduce_scatter(Transport& transport, const void* in, void* out, int64_t block_count,
                         DType dtype, ReduceOp op) {
  const int n = transport.size();
  const int rank = transport.rank();
  const size_t block_bytes = static_cast<size_t>(block_count) * dtype_size(dtype);
  auto block = [&](int b) {
    return static_cast<const char*>(in) + static_cast<size_t>(b) * block_bytes;
  };
  if (n == 1) {
    copy_bytes(out, in, block_bytes);
    return;
  }
  const int right = wrap(rank + 1, n);
  const int left = wrap(rank - 1, n);
  const int divisor = op == ReduceOp::avg ? n : 0;
  std::vector<unsigned char> partials(2 * block_bytes);
  void* partial[2] = {partials.data(), partials.data() + block_bytes};
  // Step s sends the partial of block (rank - s - 1) and folds block (rank - s - 2) into a partial;
  // the last step's block is this rank's own.
  for (int step = 0; step < n - 1; ++step) {
    int send_block = wrap(rank - step - 1, n);
    int recv_block = wrap(rank - step - 2, n);
    const void* send_from = step == 0 ? block(send_block) : partial[(step - 1) & 1];
    void* target = step == n - 2 ? out : partial[step & 1];
    transport.sendrecv_reduce(send_from, block_bytes, right, target, block(recv_block), block_count,
                              dtype, op, left, step == n - 2 ? divisor : 0);
  }
}

void ring_all_gather(Transport& transport, const void* in, void* out,
                     std::span<const int64_t> counts, DType dtype) {
  const int n = transport.size();
  const int rank = transport.rank();
  const size_t element = dtype_size(dtype);
  std::vector<size_t> offset(static_cast<size_t>(n) + 1, 0);
  for (int r = 0; r < n; ++r) offset[r + 1] = offset[r] + static_cast<size_t>(counts[r]) * element;
  auto at = [&](int r) { return static_cast<char*>(out) + offset[r]; };
  auto bytes = [&](int r) { return offset[r + 1] - offset[r]; };
  copy_bytes(at(rank), in, bytes(rank));
  const int right = wrap(rank + 1, n);
  const int left = wrap(rank - 1, n);
  for (int step = 0; step < n - 1; ++step) {
    int send_block = wrap(rank - step, n);
    int recv_block = wrap(rank - step - 1, n);
    transport.sendrecv(at(send_block), bytes(send_block), right, at(recv_block), bytes(recv_block),
                       left);
  }
}

}  // namespace lattice::comm
