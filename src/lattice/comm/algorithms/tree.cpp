// Reduce and broadcast: a pipelined binary tree in heap order over virtual ranks (rank - root) mod
// n: parent (v-1)/2, children 2v+1 and 2v+2. Chunks are processed in order, so a parent reduces
// chunk c while its children already send chunk c+1.
// Allreduce: the double binary tree, on a periodic schedule every rank computes identically from
// (n, chunk counts): the trees' directed edges are colored so that no rank sends or receives two
// edges of one color (4 colors from n = 4 on: a rank sends and receives at most 4), and chunk c
// crosses edge e in slot 4 x (c + lag(e)) + color(e), the lag keeping each transfer after the ones
// its data comes from. So each rank moves one chunk in and one out per slot, 4 slots per chunk
// round after a fill of about two tree depths.
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

namespace {

// Tree 0: in-order binary tree. A rank r > 0 with lowest set bit b sits at level log2(b); its
// parent is r with bit b cleared and bit 2b set, or, when that is not a rank, r with bit b cleared.
int in_order_parent(int n, int rank) {
  if (rank == 0) return -1;
  int bit = rank & -rank;
  int parent = (rank ^ bit) | (bit << 1);
  return parent < n ? parent : rank ^ bit;
}

// Position of `rank` in tree 1 (whose shape is tree 0's over positions) and back.
int tree1_position(int n, int rank) {
  return n % 2 == 0 ? n - 1 - rank : (rank - 1 + n) % n;
}
int tree1_rank(int n, int position) {
  return n % 2 == 0 ? n - 1 - position : (position + 1) % n;
}

}  // namespace

TreeNode double_tree_node(int n, int rank, int tree) {
  auto to_rank = [&](int position) { return tree == 0 ? position : tree1_rank(n, position); };
  const int position = tree == 0 ? rank : tree1_position(n, rank);
  TreeNode node;
  int parent = in_order_parent(n, position);
  node.parent = parent < 0 ? -1 : to_rank(parent);
  for (int other = 0; other < n; ++other) {
    if (other != position && in_order_parent(n, other) == position)
      node.children[node.child_count++] = to_rank(other);  // at most two, ascending positions
  }
  return node;
}

namespace {

struct TreeShape {
  std::vector<TreeNode> nodes;
  std::vector<int> bottom_up;  // non-root ranks, deepest first
  int root = 0;
};

TreeShape tree_shape(int n, int tree) {
  TreeShape shape;
  shape.nodes.resize(static_cast<size_t>(n));
  std::vector<int> depth(static_cast<size_t>(n), 0);
  for (int position = 0; position < n; ++position) {  // children in ascending position, as above
    int r = tree == 0 ? position : tree1_rank(n, position);
    int parent = in_order_parent(n, position);
    if (parent < 0) {
      shape.root = r;
      continue;
    }
    int parent_rank = tree == 0 ? parent : tree1_rank(n, parent);
    shape.nodes[static_cast<size_t>(r)].parent = parent_rank;
    TreeNode& up = shape.nodes[static_cast<size_t>(parent_rank)];
    up.children[up.child_count++] = r;
  }
  for (int r = 0; r < n; ++r) {
    for (int v = r; shape.nodes[static_cast<size_t>(v)].parent >= 0;
         v = shape.nodes[static_cast<size_t>(v)].parent)
      ++depth[static_cast<size_t>(r)];
  }
  for (int r = 0; r < n; ++r) {
    if (r != shape.root) shape.bottom_up.push_back(r);
  }
  std::stable_sort(shape.bottom_up.begin(), shape.bottom_up.end(), [&](int a, int b) {
    return depth[static_cast<size_t>(a)] > depth[static_cast<size_t>(b)];
  });
  return shape;
}

// One directed tree edge: chunks of `tree` move over it from `from` to `to`, toward the root (up)
// or away from it (down). Chunk c crosses it in slot period x (c + lag) + color.
struct TreeEdge {
  int tree;
  bool up;
  int from, to;
  int color = -1;
  int64_t lag = 0;
};

// Colors the edges so that no rank sends two edges, or receives two, of one color, with as many
// colors as the largest number of edges a rank sends or receives (Koenig's theorem for bipartite
// graphs: senders on one side, receivers on the other). Returns that number, the period.
int color_edges(int n, std::vector<TreeEdge>& edges) {
  std::vector<int> sends(static_cast<size_t>(n), 0), receives(static_cast<size_t>(n), 0);
  for (const TreeEdge& e : edges) {
    ++sends[static_cast<size_t>(e.from)];
    ++receives[static_cast<size_t>(e.to)];
  }
  const int period = std::max(*std::max_element(sends.begin(), sends.end()),
                              *std::max_element(receives.begin(), receives.end()));
  // edge_at_sender[r * period + color]: the edge of that color rank r sends (-1: none); likewise
  // for receivers.
  std::vector<int> at_sender(static_cast<size_t>(n * period), -1);
  std::vector<int> at_receiver(static_cast<size_t>(n * period), -1);
  auto slot = [&](std::vector<int>& table, int r, int color) -> int& {
    return table[static_cast<size_t>(r * period + color)];
  };
  auto free_color = [&](std::vector<int>& table, int r) {
    int color = 0;
    while (slot(table, r, color) >= 0) ++color;
    return color;
  };
  for (size_t i = 0; i < edges.size(); ++i) {
    const int u = edges[i].from, v = edges[i].to;
    const int a = free_color(at_sender, u), b = free_color(at_receiver, v);
    if (slot(at_receiver, v, a) >= 0) {
      // a is taken at v: swap a and b along the path from v alternating a, b edges. The path never
      // reaches u (senders are entered through a-edges and u has none), so a becomes free at v.
      std::vector<int> path;
      bool at_receiver_side = true;
      int node = v, color = a;
      while (true) {
        int edge = slot(at_receiver_side ? at_receiver : at_sender, node, color);
        if (edge < 0) break;
        path.push_back(edge);
        node = at_receiver_side ? edges[static_cast<size_t>(edge)].from
                                : edges[static_cast<size_t>(edge)].to;
        at_receiver_side = !at_receiver_side;
        color = color == a ? b : a;
      }
      for (int edge : path) {
        const TreeEdge& e = edges[static_cast<size_t>(edge)];
        slot(at_sender, e.from, e.color) = -1;
        slot(at_receiver, e.to, e.color) = -1;
      }
      for (int edge : path) {
        TreeEdge& e = edges[static_cast<size_t>(edge)];
        e.color = e.color == a ? b : a;
        slot(at_sender, e.from, e.color) = edge;
        slot(at_receiver, e.to, e.color) = edge;
      }
    }
    edges[i].color = a;
    slot(at_sender, u, a) = static_cast<int>(i);
    slot(at_receiver, v, a) = static_cast<int>(i);
  }
  return period;
}

}  // namespace

std::vector<TreeTransfer> double_tree_schedule(int n, int rank, const int64_t chunks[2]) {
  std::vector<TreeTransfer> mine;
  if (n < 2) return mine;
  const TreeShape shapes[2] = {tree_shape(n, 0), tree_shape(n, 1)};
  // Edges in dependency order per tree: up edges children first, then down edges parents first.
  std::vector<TreeEdge> edges;
  for (int tree = 0; tree < 2; ++tree) {
    const TreeShape& shape = shapes[tree];
    for (int r : shape.bottom_up)
      edges.push_back({tree, true, r, shape.nodes[static_cast<size_t>(r)].parent});
    for (auto it = shape.bottom_up.rbegin(); it != shape.bottom_up.rend(); ++it)
      edges.push_back({tree, false, shape.nodes[static_cast<size_t>(*it)].parent, *it});
  }
  const int period = color_edges(n, edges);
  // Lags: an edge's chunk c must cross after chunk c crossed every edge its data comes from (the
  // children's up edges into the sender; at the root for the way down too; else the down edge into
  // the sender). Slot(e, c) = period x (c + lag) + color, so the lag grows by one where the color
  // does not. The up edge leaving child r and the down edge entering r, per tree (indices into
  // edges).
  std::vector<size_t> up_from[2], down_into[2];
  for (int tree = 0; tree < 2; ++tree) {
    up_from[tree].assign(static_cast<size_t>(n), 0);
    down_into[tree].assign(static_cast<size_t>(n), 0);
  }
  for (size_t i = 0; i < edges.size(); ++i) {
    const TreeEdge& e = edges[i];
    (e.up ? up_from[e.tree][static_cast<size_t>(e.from)]
          : down_into[e.tree][static_cast<size_t>(e.to)]) = i;
  }
  for (TreeEdge& e : edges) {  // dependency order, so every input's lag is final
    const TreeShape& shape = shapes[e.tree];
    const TreeNode& sender = shape.nodes[static_cast<size_t>(e.from)];
    std::vector<const TreeEdge*> inputs;
    if (e.up || e.from == shape.root) {
      for (int c = 0; c < sender.child_count; ++c)
        inputs.push_back(&edges[up_from[e.tree][static_cast<size_t>(sender.children[c])]]);
    } else {
      inputs.push_back(&edges[down_into[e.tree][static_cast<size_t>(e.from)]]);
    }
    for (const TreeEdge* input : inputs)
      e.lag = std::max(e.lag, input->lag + (input->color >= e.color ? 1 : 0));
  }
  for (const TreeEdge& e : edges) {
    if (e.from != rank && e.to != rank) continue;
    // At a receiver of up edges: the earliest contribution is reduced onto its own input; at the
    // root the latest completes the chunk. The order of a rank's input edges is the same for
    // every chunk.
    bool first = false, completes = false;
    if (e.up && e.to == rank) {
      first = completes = true;
      for (const TreeEdge& other : edges) {
        if (other.tree != e.tree || !other.up || other.to != rank || &other == &e) continue;
        int64_t mine_at = e.lag * period + e.color, other_at = other.lag * period + other.color;
        if (other_at < mine_at) first = false;
        if (other_at > mine_at) completes = false;
      }
      completes = completes && rank == shapes[e.tree].root;
    }
    for (int64_t c = 0; c < chunks[e.tree]; ++c)
      mine.push_back(
          {period * (c + e.lag) + e.color, e.tree, c, e.up, e.from, e.to, first, completes});
  }
  std::sort(mine.begin(), mine.end(),
            [](const TreeTransfer& a, const TreeTransfer& b) { return a.slot < b.slot; });
  return mine;
}

void tree_allreduce(Transport& transport, const void* in, void* out, int64_t count, DType dtype,
                    ReduceOp op, int64_t chunk_bytes) {
  const int n = transport.size();
  const int me = transport.rank();
  const size_t element = dtype_size(dtype);
  if (count == 0) return;
  if (n == 1) {
    if (in != out) copy_bytes(out, in, static_cast<size_t>(count) * element);
    return;
  }
  const int64_t step = chunk_elements(chunk_bytes, dtype);
  // Below two chunks there is nothing to pipeline and the time is latency: tree 0 alone carries
  // the buffer (half the messages of splitting it).
  const bool split = count >= 2 * step;
  const int64_t half[2] = {split ? (count + 1) / 2 : count, split ? count / 2 : 0};
  const int64_t offset[2] = {0, half[0]};
  const int64_t chunks[2] = {(half[0] + step - 1) / step, (half[1] + step - 1) / step};
  const bool is_leaf[2] = {double_tree_node(n, me, 0).child_count == 0,
                           double_tree_node(n, me, 1).child_count == 0};
  const int divisor = op == ReduceOp::avg ? n : 0;
  const char* input = static_cast<const char*>(in);
  char* output = static_cast<char*>(out);

  struct Range {
    size_t offset;
    int64_t length;
  };
  auto range_of = [&](const TreeTransfer& t) {
    int64_t first = offset[t.tree] + t.chunk * step;
    int64_t length = std::min(step, offset[t.tree] + half[t.tree] - first);
    return Range{static_cast<size_t>(first) * element, length};
  };
  // What this rank sends: a leaf's own input going up, otherwise its reduced or final chunk.
  auto send_data = [&](const TreeTransfer& t) -> const void* {
    Range r = range_of(t);
    return (t.up && is_leaf[t.tree] ? input : output) + r.offset;
  };

  std::vector<TreeTransfer> schedule = double_tree_schedule(n, me, chunks);
  for (size_t i = 0; i < schedule.size();) {
    const TreeTransfer* send = nullptr;
    const TreeTransfer* receive = nullptr;
    const int64_t slot = schedule[i].slot;
    for (; i < schedule.size() && schedule[i].slot == slot; ++i)
      (schedule[i].from == me ? send : receive) = &schedule[i];
    if (receive == nullptr) {
      transport.send(send_data(*send), static_cast<size_t>(range_of(*send).length) * element,
                     send->to);
      continue;
    }
    Range r = range_of(*receive);
    size_t bytes = static_cast<size_t>(r.length) * element;
    if (receive->up) {
      const void* local = (receive->first_contribution ? input : output) + r.offset;
      int average = receive->completes_root ? divisor : 0;
      if (send) {
        transport.sendrecv_reduce(
            send_data(*send), static_cast<size_t>(range_of(*send).length) * element, send->to,
            output + r.offset, local, r.length, dtype, op, receive->from, average);
      } else {
        transport.recv_reduce(output + r.offset, local, r.length, dtype, op, receive->from,
                              average);
      }
    } else if (send) {
      transport.sendrecv(send_data(*send), static_cast<size_t>(range_of(*send).length) * element,
                         send->to, output + r.offset, bytes, receive->from);
    } else {
      transport.recv(output + r.offset, bytes, receive->from);
    }
  }
}

}  // namespace lattice::comm
