// The double-binary-tree allreduce: the two trees' shape (spanning, complementary), its schedule
// (matched transfers, one send and one receive per rank and slot, data dependencies respected,
// balanced load and a pipelined length), and results against the serial reference on local ranks
// with chunks small enough that every buffer is pipelined through many chunks, and under mpirun.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include "collective_suite.hpp"
#include "lattice/comm/algorithms/tree.hpp"
#include "lattice/comm/backends/local.hpp"

namespace lattice::comm {
namespace {

// Depth of `rank` in `tree`, or -1 when the parent links do not reach a root within n steps.
int depth_of(int n, int rank, int tree) {
  int depth = 0;
  for (int v = rank; double_tree_node(n, v, tree).parent >= 0;
       v = double_tree_node(n, v, tree).parent) {
    if (++depth > n) return -1;
  }
  return depth;
}

TEST(DoubleBinaryTree, TwoSpanningTreesWhoseInnerNodesAreTheOthersLeaves) {
  for (int n = 1; n <= 40; ++n) {
    int inner_in_both = 0;
    for (int tree = 0; tree < 2; ++tree) {
      int roots = 0, max_depth = 0;
      for (int r = 0; r < n; ++r) {
        TreeNode node = double_tree_node(n, r, tree);
        if (node.parent < 0) ++roots;
        ASSERT_LE(node.child_count, 2);
        for (int c = 0; c < node.child_count; ++c)
          EXPECT_EQ(double_tree_node(n, node.children[c], tree).parent, r) << "n " << n;
        if (node.parent >= 0) {
          TreeNode parent = double_tree_node(n, node.parent, tree);
          EXPECT_TRUE(parent.children[0] == r || parent.children[1] == r) << "n " << n;
        }
        int depth = depth_of(n, r, tree);
        ASSERT_GE(depth, 0) << "n " << n << " rank " << r << " does not reach the root";
        max_depth = std::max(max_depth, depth);
      }
      EXPECT_EQ(roots, 1) << "n " << n;
      // Balanced: depth at most 1 + log2(n) (the root has one child).
      int log2n = 0;
      while ((2 << log2n) <= n) ++log2n;
      EXPECT_LE(max_depth, log2n + 1) << "n " << n;
    }
    for (int r = 0; r < n; ++r) {
      if (double_tree_node(n, r, 0).child_count > 0 && double_tree_node(n, r, 1).child_count > 0)
        ++inner_in_both;
    }
    // Even n: the mirror makes every inner node of one tree a leaf of the other. Odd n: the shift
    // leaves one rank inner in both.
    EXPECT_LE(inner_in_both, n % 2 == 0 ? 0 : 1) << "n " << n;
  }
}

// Checks the schedules of all n ranks together for `chunks` chunks per tree.
void check_schedule(int n, std::array<int64_t, 2> chunks) {
  SCOPED_TRACE("n " + std::to_string(n) + " chunks " + std::to_string(chunks[0]) + "," +
               std::to_string(chunks[1]));
  using Key = std::tuple<int, int64_t, bool, int, int>;  // tree, chunk, up, from, to
  std::map<Key, int64_t> sends, receives;
  int64_t last_slot = -1;
  std::vector<int64_t> received_transfers(static_cast<size_t>(n), 0);
  for (int r = 0; r < n; ++r) {
    std::vector<TreeTransfer> schedule = double_tree_schedule(n, r, chunks.data());
    std::set<int64_t> send_slots, receive_slots;
    // Per (tree, chunk): slot by which this rank holds its reduced / final chunk.
    std::map<std::pair<int, int64_t>, int64_t> reduced, final_at;
    std::map<std::pair<int, int64_t>, int> firsts, completions, contributions;
    for (size_t i = 0; i < schedule.size(); ++i) {
      const TreeTransfer& t = schedule[i];
      if (i > 0) {
        EXPECT_LE(schedule[i - 1].slot, t.slot) << "not in slot order";
      }
      last_slot = std::max(last_slot, t.slot);
      Key key{t.tree, t.chunk, t.up, t.from, t.to};
      auto id = std::make_pair(t.tree, t.chunk);
      TreeNode node = double_tree_node(n, r, t.tree);
      if (t.from == r) {
        EXPECT_TRUE(send_slots.insert(t.slot).second) << "two sends in slot " << t.slot;
        sends[key] = t.slot;
        if (t.up) {
          EXPECT_EQ(t.to, node.parent);
          // An inner node sends only after all its children's contributions arrived.
          if (node.child_count > 0) {
            EXPECT_EQ(contributions[id], node.child_count);
            EXPECT_LT(reduced[id], t.slot);
          }
        } else {
          EXPECT_TRUE(t.to == node.children[0] || t.to == node.children[1]);
          bool root = node.parent < 0;
          EXPECT_TRUE(root ? completions[id] == 1 : final_at.count(id) == 1)
              << "broadcast of data not yet final";
          EXPECT_LT(root ? reduced[id] : final_at[id], t.slot);
        }
      } else {
        ASSERT_EQ(t.to, r);
        EXPECT_TRUE(receive_slots.insert(t.slot).second) << "two receives in slot " << t.slot;
        receives[key] = t.slot;
        ++received_transfers[static_cast<size_t>(r)];
        if (t.up) {
          EXPECT_EQ(t.first_contribution, contributions[id] == 0);
          ++contributions[id];
          firsts[id] += t.first_contribution;
          completions[id] += t.completes_root;
          EXPECT_EQ(t.completes_root, node.parent < 0 && contributions[id] == node.child_count);
          reduced[id] = std::max(reduced.count(id) ? reduced[id] : -1, t.slot);
        } else {
          EXPECT_EQ(t.from, node.parent);
          final_at[id] = t.slot;
        }
      }
    }
    // Every non-root rank receives every chunk of both trees once on the way down.
    for (int tree = 0; tree < 2; ++tree) {
      bool root = double_tree_node(n, r, tree).parent < 0;
      for (int64_t c = 0; c < chunks[tree]; ++c)
        EXPECT_EQ(final_at.count({tree, c}), root ? 0u : 1u) << "rank " << r;
    }
  }
  EXPECT_EQ(sends, receives) << "a send without its matching receive in the same slot";
  // Load balance: with equal halves each rank receives at most 4 transfers per chunk round (2x
  // the buffer), where the inner nodes of one binary tree carrying the whole buffer in the same
  // chunks receive 6 (3x the buffer).
  if (chunks[0] == chunks[1]) {
    for (int r = 0; r < n; ++r)
      EXPECT_LE(received_transfers[static_cast<size_t>(r)], 4 * chunks[0]) << "rank " << r;
  }
  // Pipelined: at most 4 slots per chunk round plus a fill of about two tree depths of rounds,
  // not (rounds x depth).
  int64_t rounds = std::max(chunks[0], chunks[1]);
  int depth = 0;
  for (int r = 0; r < n; ++r) depth = std::max({depth, depth_of(n, r, 0), depth_of(n, r, 1)});
  EXPECT_LE(last_slot + 1, 4 * (rounds + 2 * depth + 1));
}

TEST(DoubleBinaryTree, ScheduleIsMatchedOrderedBalancedAndPipelined) {
  for (int n : {2, 3, 4, 5, 6, 7, 8, 12, 13, 16, 31, 64, 100}) {
    check_schedule(n, {1, 1});
    check_schedule(n, {1, 0});
    check_schedule(n, {3, 2});
    check_schedule(n, {64, 64});
  }
}

std::string join(const std::vector<std::string>& lines) {
  std::string text;
  for (const auto& line : lines) text += line + "\n";
  return text;
}

// Every reduction, in place and out of place, through chunks of `chunk_bytes`.
std::vector<std::string> run_tree_allreduce(int n, const std::vector<int64_t>& counts,
                                            const std::vector<DType>& dtypes, int64_t chunk_bytes) {
  CommOptions options;
  options.timeout = std::chrono::seconds(120);
  options.tree_chunk_bytes = chunk_bytes;
  options.force(CollectiveOp::allreduce, Algorithm::tree);
  std::mutex mutex;
  std::vector<std::string> all;
  run_local_ranks(
      n,
      [&](Communicator& comm) {
        testing::Failures failures;
        const testing::BufferMemory memory;  // Buffer keeps a reference to it
        for (int64_t count : counts) {
          for (DType dtype : dtypes) {
            for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
              testing::Buffer in(count, dtype, memory), out(count, dtype, memory);
              for (int64_t i = 0; i < count; ++i)
                testing::store_value(in.data(), dtype, i, testing::input_value(comm.rank(), i));
              bool in_place = op == ReduceOp::sum || op == ReduceOp::min;
              if (in_place) {
                comm.allreduce(in.data(), count, dtype, op);
              } else {
                comm.allreduce(in.data(), out.data(), count, dtype, op);
              }
              testing::expect_elements(
                  failures,
                  testing::case_name(
                      comm, "tree allreduce", dtype, count,
                      std::string(reduce_op_name(op)) + " chunk " + std::to_string(chunk_bytes)),
                  in_place ? in.data() : out.data(), dtype, 0, count,
                  [&](int64_t i) { return testing::reference_reduce(n, i, dtype, op); });
            }
          }
        }
        std::lock_guard lock(mutex);
        all.insert(all.end(), failures.lines.begin(), failures.lines.end());
      },
      options);
  return all;
}

class TreeAllreducePipelined : public ::testing::TestWithParam<int> {};

TEST_P(TreeAllreducePipelined, ManySmallChunksMatchReference) {
  const int n = GetParam();
  // 16-byte chunks: 1-4 elements per chunk, so 1023 elements run through hundreds of chunks.
  auto failures = run_tree_allreduce(n, {1, 2, 7, 33, 1023}, testing::all_dtypes(), 16);
  EXPECT_TRUE(failures.empty()) << join(failures);
  failures = run_tree_allreduce(n, {100003}, {DType::f32, DType::bf16}, 4096);
  EXPECT_TRUE(failures.empty()) << join(failures);
}

INSTANTIATE_TEST_SUITE_P(Ranks, TreeAllreducePipelined, ::testing::Values(1, 2, 3, 4, 5, 6, 7, 8));

#ifdef LATTICE_COMM_MPI_WORKER

// Under mpirun (5 processes, odd and not a power of two): a million elements are 16 chunks per
// tree at the default 128 KiB.
TEST(TreeAllreduceMpi, MillionElementsOnFiveProcessesMatchReference) {
  std::string command = "env OMPI_MCA_rmaps_base_oversubscribe=1 timeout 300 " LATTICE_MPIEXEC
                        " --allow-run-as-root --oversubscribe -n 5 " LATTICE_COMM_MPI_WORKER
                        " suite 1000003 f32 tree 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  std::array<char, 4096> chunk;
  while (size_t got = fread(chunk.data(), 1, chunk.size(), pipe)) output.append(chunk.data(), got);
  int status = pclose(pipe);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  EXPECT_NE(output.find("suite ok on 5 ranks"), std::string::npos) << output;
}

#endif

}  // namespace
}  // namespace lattice::comm
