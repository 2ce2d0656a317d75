// Local backend API: point-to-point messages, split, asynchronous collectives, the trace, bad
// input, and the watchdog: hangs, mismatched collectives and failed ranks end in an Error that
// explains them.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <numeric>
#include <thread>
#include <vector>

#include "lattice/comm/backends/local.hpp"
#include "lattice/core/error.hpp"

namespace lattice::comm {
namespace {

CommOptions options_with_timeout(std::chrono::milliseconds timeout) {
  CommOptions options;
  options.timeout = timeout;
  return options;
}

// Runs fn on n ranks and returns the error run() reports ("" when none).
std::string error_of(int n, const std::function<void(Communicator&)>& fn,
                     CommOptions options = options_with_timeout(std::chrono::seconds(60))) {
  try {
    run_local_ranks(n, fn, options);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(LocalPointToPoint, TaggedMessagesArriveByTagAndOrder) {
  run_local_ranks(3, [](Communicator& comm) {
    int next = (comm.rank() + 1) % 3, prev = (comm.rank() + 2) % 3;
    std::vector<int32_t> a = {comm.rank(), 1}, b = {comm.rank(), 2, 3};
    comm.send(a.data(), 2, DType::i32, next, /*tag=*/7);
    comm.send(b.data(), 3, DType::i32, next, /*tag=*/9);
    std::vector<int32_t> got_b(3), got_a(2);
    comm.recv(got_b.data(), 3, DType::i32, prev, 9);  // out of send order, matched by tag
    comm.recv(got_a.data(), 2, DType::i32, prev, 7);
    EXPECT_EQ(got_a, (std::vector<int32_t>{prev, 1}));
    EXPECT_EQ(got_b, (std::vector<int32_t>{prev, 2, 3}));
  });
}

TEST(LocalPointToPoint, NonBlockingFormsComplete) {
  run_local_ranks(2, [](Communicator& comm) {
    int peer = 1 - comm.rank();
    std::vector<float> out(1000), in(1000);
    std::iota(out.begin(), out.end(), static_cast<float>(comm.rank() * 1000));
    CommHandle receive = comm.irecv(in.data(), 1000, DType::f32, peer);
    CommHandle send = comm.isend(out.data(), 1000, DType::f32, peer);
    send.wait();
    receive.wait();
    EXPECT_TRUE(receive.test());
    EXPECT_EQ(in[0], static_cast<float>(peer * 1000));
    EXPECT_EQ(in[999], static_cast<float>(peer * 1000 + 999));
  });
}

TEST(LocalPointToPoint, SizeMismatchIsReported) {
  std::string error = error_of(2, [](Communicator& comm) {
    std::vector<float> data(8);
    if (comm.rank() == 0) comm.send(data.data(), 8, DType::f32, 1);
    if (comm.rank() == 1) comm.recv(data.data(), 4, DType::f32, 0);
  });
  EXPECT_NE(error.find("expected 16 bytes from rank 0"), std::string::npos) << error;
}

TEST(LocalSplit, GroupsByColorOrderedByKey) {
  run_local_ranks(5, [](Communicator& comm) {
    int color = comm.rank() % 2;
    auto group = comm.split(color, -comm.rank());  // reverse order inside each color
    ASSERT_TRUE(group);
    EXPECT_EQ(group->size(), color == 0 ? 3 : 2);
    int32_t value = comm.rank();
    std::vector<int32_t> gathered(static_cast<size_t>(group->size()));
    group->all_gather(&value, gathered.data(), 1, DType::i32);
    std::vector<int32_t> expected =
        color == 0 ? std::vector<int32_t>{4, 2, 0} : std::vector<int32_t>{3, 1};
    EXPECT_EQ(gathered, expected);
    auto none = comm.split(comm.rank() == 0 ? 0 : -1, 0);
    EXPECT_EQ(static_cast<bool>(none), comm.rank() == 0);
  });
}

TEST(LocalAsync, QueuedCollectivesCompleteInOrder) {
  run_local_ranks(3, [](Communicator& comm) {
    std::vector<std::vector<float>> buffers(4, std::vector<float>(10000, 1.0f + comm.rank()));
    std::vector<CommHandle> handles;
    for (auto& buffer : buffers)
      handles.push_back(comm.allreduce_async(buffer.data(), 10000, DType::f32, ReduceOp::sum));
    int32_t token = comm.rank(), tokens[3] = {};
    CommHandle gather = comm.all_gather_async(&token, tokens, 1, DType::i32);
    comm.barrier();  // blocking after queued ones: waits for them first
    for (auto& handle : handles) handle.wait();
    gather.wait();
    for (auto& buffer : buffers) EXPECT_EQ(buffer[9999], 6.0f);
    EXPECT_EQ(tokens[2], 2);
    EXPECT_EQ(comm.collectives_issued(), 6u);
  });
}

TEST(LocalTrace, RecordsRecentCollectivesInOrder) {
  run_local_ranks(2, [](Communicator& comm) {
    float x = 1;
    for (int i = 0; i < 100; ++i) comm.allreduce(&x, 1, DType::f32, ReduceOp::max);
    comm.barrier();
    auto records = comm.trace().recent();
    ASSERT_EQ(records.size(), comm.trace().capacity());
    EXPECT_EQ(records.back().seq, 101u);
    EXPECT_EQ(records.back().descriptor.op, CollectiveOp::barrier);
    EXPECT_EQ(records.back().state, RecordState::completed);
    EXPECT_EQ(records.front().seq, 101u - records.size() + 1);
    EXPECT_EQ(records.front().descriptor.describe(), "allreduce(f32 x 1, max)");
  });
}

// Every path records the same way: the direct algorithm (and its staged form), and the ring over
// the transport; each record ends completed with its two times in order.
TEST(LocalTrace, RecordsAreCompletedWithOrderedTimesOnEveryPath) {
  run_local_ranks(2, [](Communicator& comm) {
    std::vector<float> x(1000, 1.0f);
    comm.allreduce(x.data(), 1000, DType::f32, ReduceOp::sum);  // direct
    comm.barrier();  // direct, staged when oversubscribed
    comm.set_algorithm(CollectiveOp::allreduce, Algorithm::ring);
    comm.allreduce(x.data(), 1000, DType::f32, ReduceOp::sum);  // ring over the transport
    const auto records = comm.trace().recent();
    ASSERT_EQ(records.size(), 3u);
    EXPECT_EQ(records[0].algorithm, Algorithm::direct);
    EXPECT_EQ(records[2].algorithm, Algorithm::ring);
    for (const CollectiveRecord& r : records) {
      EXPECT_EQ(r.state, RecordState::completed) << describe_record(r);
      EXPECT_GT(r.entered_ns, 0) << describe_record(r);
      EXPECT_LE(r.entered_ns, r.finished_ns) << describe_record(r);
    }
    EXPECT_EQ(x[0], 4.0f);  // summed twice over two ranks
  });
}

TEST(LocalBadInput, ErrorsNameTheOpAndRank) {
  run_local_ranks(2, [](Communicator& comm) {
    float x = 0;
    auto message = [&](auto&& call) {
      try {
        call();
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return std::string();
    };
    EXPECT_NE(message([&] {
                comm.allreduce(&x, -3, DType::f32, ReduceOp::sum);
              }).find("allreduce: negative count -3 on rank"),
              std::string::npos);
    EXPECT_NE(message([&] {
                comm.broadcast(&x, 1, DType::f32, 2);
              }).find("broadcast: rank 2 is out of range"),
              std::string::npos);
    EXPECT_NE(
        message([&] { comm.send(&x, 1, DType::f32, -1); }).find("send: rank -1 is out of range"),
        std::string::npos);
    EXPECT_NE(message([&] {
                comm.allreduce(&x, 1, DType::u8, ReduceOp::sum);
              }).find("element type u8 is not supported"),
              std::string::npos);
    int64_t counts[1] = {1};
    EXPECT_NE(message([&] {
                comm.all_gather_v(&x, &x, counts, DType::f32);
              }).find("expected one per rank"),
              std::string::npos);
    EXPECT_NE(message([&] {
                comm.set_algorithm(CollectiveOp::broadcast, Algorithm::ring);
              }).find("does not implement broadcast"),
              std::string::npos);
    comm.barrier();  // the group still works after rejected calls
  });
}

// Variable counts that disagree between ranks (the descriptors of the _v forms agree on op and type
// only): the direct algorithm names the rank that expects and the rank that sends, also when a rank
// disagrees with itself in an all_to_all_v, and the other ranks stop instead of hanging.
TEST(LocalBadInput, DisagreeingVariableCountsNameBothRanks) {
  std::string gather = error_of(2, [](Communicator& comm) {
    comm.set_algorithm(CollectiveOp::all_gather_v, Algorithm::direct);
    std::vector<float> in(2, 1.0f), out(3);
    // Rank 0 expects two elements from rank 1, which contributes one.
    std::vector<int64_t> counts =
        comm.rank() == 0 ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{1, 1};
    comm.all_gather_v(in.data(), out.data(), counts, DType::f32);
  });
  EXPECT_NE(gather.find("all_gather_v: rank 0 expects 2 elements from rank 1 but rank 1 "
                        "contributes 1"),
            std::string::npos)
      << gather;
  std::string self = error_of(2, [](Communicator& comm) {
    comm.set_algorithm(CollectiveOp::all_to_all_v, Algorithm::direct);
    std::vector<float> in(2, 1.0f), out(3);
    const std::vector<int64_t> send{1, 1};
    // Rank 1 sends itself one element but expects two from itself.
    const std::vector<int64_t> receive =
        comm.rank() == 1 ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{1, 1};
    comm.all_to_all_v(in.data(), send, out.data(), receive, DType::f32);
  });
  EXPECT_NE(self.find("all_to_all_v: rank 1 expects 2 elements from rank 1 but rank 1 sends it 1"),
            std::string::npos)
      << self;
}

// The watchdog turns a rank that never arrives into an error naming it and what each rank entered.
TEST(LocalWatchdog, MissingRankIsNamedInsteadOfHanging) {
  std::string error = error_of(
      3,
      [](Communicator& comm) {
        float x = 1;
        comm.allreduce(&x, 1, DType::f32, ReduceOp::sum);  // #1: everyone
        if (comm.rank() == 2) return;                      // rank 2 leaves
        comm.allreduce(&x, 1, DType::f32, ReduceOp::sum);  // #2: ranks 0 and 1 wait
      },
      options_with_timeout(std::chrono::milliseconds(300)));
  EXPECT_NE(error.find("watchdog"), std::string::npos) << error;
  EXPECT_NE(error.find("ranks that did not arrive: 2"), std::string::npos) << error;
  EXPECT_NE(error.find("rank 2: #1 allreduce(f32 x 1, sum)"), std::string::npos) << error;
  EXPECT_NE(error.find("#2 allreduce(f32 x 1, sum)"), std::string::npos) << error;
}

TEST(LocalWatchdog, BlockedReceiveTimesOut) {
  std::string error = error_of(
      2,
      [](Communicator& comm) {
        float x = 0;
        if (comm.rank() == 0) comm.recv(&x, 1, DType::f32, 1, 5);
      },
      options_with_timeout(std::chrono::milliseconds(200)));
  EXPECT_NE(error.find("recv from rank 1 (tag 5) without progress"), std::string::npos) << error;
}

struct MismatchCase {
  Algorithm algorithm;
  const char* expected_first;
  const char* expected_second;
};

// Two ranks entering different collectives at the same sequence number: both descriptions reported.
TEST(LocalWatchdog, MismatchedCountTypeOrOpIsReported) {
  for (Algorithm algorithm : {Algorithm::direct, Algorithm::ring, Algorithm::tree}) {
    std::string count_error = error_of(2, [&](Communicator& comm) {
      comm.set_algorithm(CollectiveOp::allreduce, algorithm);
      std::vector<float> data(12);
      comm.allreduce(data.data(), comm.rank() == 0 ? 10 : 12, DType::f32, ReduceOp::sum);
    });
    EXPECT_NE(count_error.find("mismatch"), std::string::npos) << count_error;
    EXPECT_NE(count_error.find("allreduce(f32 x 10, sum)"), std::string::npos) << count_error;
    EXPECT_NE(count_error.find("allreduce(f32 x 12, sum)"), std::string::npos) << count_error;

    std::string type_error = error_of(2, [&](Communicator& comm) {
      comm.set_algorithm(CollectiveOp::allreduce, algorithm);
      std::vector<float> data(4);
      comm.allreduce(data.data(), 4, comm.rank() == 0 ? DType::f32 : DType::i32, ReduceOp::sum);
    });
    EXPECT_NE(type_error.find("allreduce(f32 x 4, sum)"), std::string::npos) << type_error;
    EXPECT_NE(type_error.find("allreduce(i32 x 4, sum)"), std::string::npos) << type_error;
  }
  std::string op_error = error_of(3, [](Communicator& comm) {
    std::vector<float> data(8);
    if (comm.rank() == 1) {
      comm.broadcast(data.data(), 2, DType::f32, 0);
    } else {
      comm.allreduce(data.data(), 2, DType::f32, ReduceOp::sum);
    }
  });
  EXPECT_NE(op_error.find("allreduce(f32 x 2, sum)"), std::string::npos) << op_error;
  EXPECT_NE(op_error.find("broadcast(f32 x 2, root 0)"), std::string::npos) << op_error;
}

// With more ranks than cores, a small collective takes the staged path and a large one the direct
// path: ranks that disagree on the size at the same sequence number end up on different paths, and
// the report still gives both descriptions (the staged rank reads the direct rank's published line,
// the direct rank the staged rank's staging header).
TEST(LocalWatchdog, MismatchAcrossTheStagedAndDirectPathsGivesBothDescriptions) {
  const int ranks = static_cast<int>(std::max(2u, std::thread::hardware_concurrency())) + 1;
  std::string staged_rank_error;  // rank 0's own report: it arrives last, so it checks at once
  std::string error = error_of(ranks, [&](Communicator& comm) {
    if (comm.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const int64_t count = comm.rank() == 0 ? 1 : 8192;  // 4 B per rank staged, 32 KiB direct
    std::vector<float> in(static_cast<size_t>(count), 1.0f);
    std::vector<float> out(static_cast<size_t>(count * comm.size()));
    try {
      comm.all_gather(in.data(), out.data(), count, DType::f32);
    } catch (const Error& e) {
      if (comm.rank() == 0) staged_rank_error = e.what();
      throw;
    }
  });
  for (const std::string& report : {error, staged_rank_error}) {
    EXPECT_NE(report.find("mismatch at #1"), std::string::npos) << report;
    EXPECT_NE(report.find("all_gather(f32 x 1)"), std::string::npos) << report;
    EXPECT_NE(report.find("all_gather(f32 x 8192)"), std::string::npos) << report;
  }
}

// A rank that fails makes the others stop with an error that names it, long before the timeout.
TEST(LocalWatchdog, FailedRankStopsThePeers) {
  std::atomic<int> stopped{0};
  std::string error = error_of(4, [&](Communicator& comm) {
    float x = 1;
    if (comm.rank() == 3) throw Error("rank three ran out of data");
    try {
      comm.allreduce(&x, 1, DType::f32, ReduceOp::sum);
    } catch (const Error& e) {
      if (std::string(e.what()).find("rank 3 failed: rank three ran out of data") !=
          std::string::npos)
        ++stopped;
      throw;
    }
  });
  EXPECT_EQ(error, "rank three ran out of data");
  EXPECT_EQ(stopped.load(), 3);
}

// bf16 reductions accumulate in fp32: 256 + 1 + 1 + 1 = 259 rounds once to 260, where adding in
// bf16 would stay at 256 (each +1 is below half a bf16 step at 256).
TEST(LocalReduction, Bf16AccumulatesInFp32) {
  run_local_ranks(4, [](Communicator& comm) {
    bf16 value = to_bf16(comm.rank() == 0 ? 256.0f : 1.0f);
    comm.allreduce(&value, 1, DType::bf16, ReduceOp::sum);
    EXPECT_EQ(to_float(value), 260.0f);
  });
}

TEST(LocalWorld, TakeGivesEachRankOnce) {
  LocalWorld world(2);
  auto zero = world.take(0);
  EXPECT_EQ(zero->rank(), 0);
  EXPECT_EQ(zero->size(), 2);
  EXPECT_EQ(zero->backend(), "local");
  EXPECT_THROW(world.take(0), Error);
  EXPECT_THROW(world.take(2), Error);
}

}  // namespace
}  // namespace lattice::comm
