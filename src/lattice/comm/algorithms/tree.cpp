// Pipelined binary tree in heap order over virtual ranks (rank - root) mod n: parent (v-1)/2,
// children 2v+1 and 2v+2. Chunks are processed in order, so a parent reduces chunk c while its
// children already send chunk c+1.
#include "lattice/comm/algorithms/tree.hpp"

#include <algorithm>
#include <vector>

#include "lattice/comm/reduce_kernels.hpp"

namespace lattice::comm {
namespace {

struct TreeLinks {
  int parent = -1;
  int children[2] = {-1, -1};
  int child_count = 0;
};

TreeLinks links_of(int rank, int n, int root) {
  int v = (rank - root + n) % n;
  auto real = [&](int virtual_rank) { return (virtual_rank + root) % n; };
  TreeLinks links;
  if (v != 0) links.parent = real((v - 1) / 2);
  for (int c : {2 * v + 1, 2 * v + 2}) {
    if (c < n) links.children[links.child_count++] = real(c);
  }
  return links;
}

int64_t chunk_elements(int64_t chunk_bytes, DType dtype) {
  return std::max<int64_t>(1, chunk_bytes / static_cast<int64_t>(dtype_size(dtype)));
}

}  // namespace

void tree_reduce(Transport& transport, const void* in, void* out, int64_t count, DType dtype,
                 ReduceOp op, int root, int64_t chunk_bytes) {
  const int n = transport.size();
  const size_t element = dtype_size(dtype);
  TreeLinks links = links_of(transport.rank(), n, root);
  const bool is_root = links.parent < 0;
  std::vector<unsigned char> partial;
  void* acc = out;
  if (!is_root && links.child_count > 0 && out == nullptr) {
    partial.resize(static_cast<size_t>(count) * element);
    acc = partial.data();
  }
  const int divisor = op == ReduceOp::avg ? n : 0;
  const int64_t step = chunk_elements(chunk_bytes, dtype);
  for (int64_t base = 0; base < count || (base == 0 && count == 0); base += step) {
    int64_t length = std::min(step, count - base);
    size_t offset = static_cast<size_t>(base) * element;
    const char* local = static_cast<const char*>(in) + offset;
    char* target = acc ? static_cast<char*>(acc) + offset : nullptr;
    if (links.child_count == 0) {
      if (is_root) {
        copy_bytes(target, local, static_cast<size_t>(length) * element);
      } else {
        transport.send(local, static_cast<size_t>(length) * element, links.parent);
      }
      if (count == 0) break;
      continue;
    }
    for (int c = 0; c < links.child_count; ++c) {
      bool last = c == links.child_count - 1;
      transport.recv_reduce(target, c == 0 ? local : target, length, dtype, op, links.children[c],
                            is_root && last ? divisor : 0);
    }
    if (!is_root) transport.send(target, static_cast<size_t>(length) * element, links.parent);
    if (count == 0) break;
  }
}

void tree_broadcast(Transport& transport, void* buffer, int64_t count, DType dtype, int root,
                    int64_t chunk_bytes) {
  const int n = transport.size();
  const size_t element = dtype_size(dtype);
  TreeLinks links = links_of(transport.rank(), n, root);
  const int64_t step = chunk_elements(chunk_bytes, dtype);
  for (int64_t base = 0; base < count || (base == 0 && count == 0); base += step) {
    int64_t length = std::min(step, count - base);
    char* chunk = static_cast<char*>(buffer) + static_cast<size_t>(base) * element;
    size_t bytes = static_cast<size_t>(length) * element;
    if (links.parent >= 0) transport.recv(chunk, bytes, links.parent);
    for (int c = 0; c < links.child_count; ++c) transport.send(chunk, bytes, links.children[c]);
    if (count == 0) break;
  }
}

void tree_allreduce(Transport& transport, const void* in, void* out, int64_t count, DType dtype,
                    ReduceOp op, int64_t chunk_bytes) {
  tree_reduce(transport, in, out, count, dtype, op, 0, chunk_bytes);
  tree_broadcast(transport, out, count, dtype, 0, chunk_bytes);
}

}  // namespace lattice::comm
