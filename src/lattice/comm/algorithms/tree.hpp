// Pipelined binary-tree algorithms over a Transport: the data is cut into chunks that flow up a
// binary tree rooted at `root` (reduce) and down it (broadcast), so all tree levels work at once.
// Allreduce is NCCL's double binary tree: two complementary binary trees (a rank that is an inner
// node of one is a leaf of the other) each reduce and broadcast half of the data, chunk by chunk,
// so every rank sends and receives about the same bytes (2x the buffer in all) instead of the inner
// nodes of one tree carrying twice the load.
#pragma once

#include <cstdint>
#include <vector>

#include "lattice/comm/transport.hpp"

namespace lattice::comm {

// out (significant at the root only) = reduction of every rank's `in`. Other ranks may pass
// nullptr; a non-null `out` on them is used as scratch.
void tree_reduce(Transport& transport, const void* in, void* out, int64_t count, DType dtype,
                 ReduceOp op, int root, int64_t chunk_bytes);
// Every rank's buffer receives the root's.
void tree_broadcast(Transport& transport, void* buffer, int64_t count, DType dtype, int root,
                    int64_t chunk_bytes);
// Double-binary-tree allreduce: elements [0, (count+1)/2) go through tree 0, the rest through
// tree 1, in chunks of chunk_bytes; reduction and broadcast of different chunks overlap. A buffer
// of less than two chunks goes through tree 0 alone (latency-bound: half the messages).
void tree_allreduce(Transport& transport, const void* in, void* out, int64_t count, DType dtype,
                    ReduceOp op, int64_t chunk_bytes);

// --- the double binary tree's structure and schedule (exposed for tests) ---

// A rank's links in one binary tree: parent (-1 at the root) and up to two children.
struct TreeNode {
  int parent = -1;
  int children[2] = {-1, -1};
  int child_count = 0;
};

// Tree 0 is an in-order binary tree over ranks 0..n-1 (odd ranks are leaves, rank 0 the root with
// one child); tree 1 is its mirror (rank n-1-r, even n) or its shift by one (rank r+1, odd n).
TreeNode double_tree_node(int n, int rank, int tree);

// One chunk moving along one tree edge. Every transfer has a global slot; a rank has at most one
// send and one receive per slot (run together as a sendrecv), a transfer's slot is after the
// slots of the transfers its data depends on, and each rank runs its transfers in slot order:
// together this makes the schedule deadlock-free over rendezvous transports.
struct TreeTransfer {
  int64_t slot = 0;
  int tree = 0;       // 0 or 1: which half of the buffer
  int64_t chunk = 0;  // chunk index within the tree's half
  bool up = true;     // toward the root (reduce) or away from it (broadcast)
  int from = 0, to = 0;
  bool first_contribution = false;  // up: the first child reduced into this chunk at `to`
  bool completes_root = false;      // up: the last contribution the root receives for this chunk
};

// The transfers of rank `rank` in slot order, for `chunks[t]` chunks in tree t.
std::vector<TreeTransfer> double_tree_schedule(int n, int rank, const int64_t chunks[2]);

}  // namespace lattice::comm
