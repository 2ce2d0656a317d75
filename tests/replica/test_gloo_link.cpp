// Tests of GlooLink, the communicator between replica groups, over real TCP on the loopback with a
// real etcd as its rendezvous: collectives against exact sums, a member that never comes, and a
// member process killed with SIGKILL mid-run (the survivor's collective fails with one line within
// the timeout, and the survivor goes on over a new link).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "etcd_process.hpp"
#include "lattice/core/error.hpp"
#include "lattice/parallel/replica/gloo_link.hpp"

using namespace lattice;
using namespace lattice::replica;

namespace {

constexpr std::chrono::milliseconds kTimeout{5000};

// Member r's values: small integers, so every order of summation gives the exact sum.
std::vector<float> values_of(int r, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] = static_cast<float>((r + 1) * (i % 97));
  return v;
}

}  // namespace

TEST(GlooLink, ThreeMembersReduceBroadcastAndGatherExactly) {
  LATTICE_REQUIRE_ETCD();
  test_support::EtcdProcess etcd;
  const int M = 3;
  const int64_t n = 300'001;  // more than one ring segment, not a multiple of M
  std::vector<std::vector<float>> reduced(M);
  std::vector<std::vector<int32_t>> gathered(M);
  std::vector<std::vector<char>> broadcast(M);
  std::vector<int64_t> bytes(M);
  std::vector<std::string> errors(M);
  std::vector<std::thread> members;
  for (int r = 0; r < M; ++r)
    members.emplace_back([&, r] {
      try {
        GlooLink link(etcd.endpoint(), "/test/link/", r, M, "127.0.0.1", kTimeout);
        reduced[r] = values_of(r, n);
        link.allreduce_sum(reduced[r].data(), n);
        broadcast[r].assign(1000, static_cast<char>(r));
        link.broadcast(broadcast[r].data(), 1000, 1);
        const int32_t mine = 10 * r + 7;
        gathered[r].resize(M);
        link.all_gather(&mine, gathered[r].data(), sizeof(mine));
        bytes[r] = link.bytes_sent();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : members) t.join();
  for (int r = 0; r < M; ++r) {
    ASSERT_EQ(errors[r], "") << "member " << r;
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(reduced[r][static_cast<size_t>(i)], static_cast<float>(6 * (i % 97))) << i;
    EXPECT_EQ(std::memcmp(reduced[r].data(), reduced[0].data(), n * sizeof(float)), 0);
    EXPECT_EQ(broadcast[r], std::vector<char>(1000, 1));
    EXPECT_EQ(gathered[r], (std::vector<int32_t>{7, 17, 27}));
  }
  // The ring's 2(M-1)/M of the buffer, the broadcast root's (M-1) copies, the gather's (M-1).
  const int64_t ring = 2 * (M - 1) * n * 4 / M;
  EXPECT_EQ(bytes[0], ring + (M - 1) * 4);
  EXPECT_EQ(bytes[1], ring + (M - 1) * 1000 + (M - 1) * 4);
}

TEST(GlooLink, AMemberThatNeverComesIsOneErrorLine) {
  LATTICE_REQUIRE_ETCD();
  test_support::EtcdProcess etcd;
  const auto start = std::chrono::steady_clock::now();
  try {
    GlooLink link(etcd.endpoint(), "/test/alone/", 0, 2, "127.0.0.1",
                  std::chrono::milliseconds(1000));
    FAIL() << "a link of 2 made with one member";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("did not arrive within 1000 ms"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// Member 1 is another process: it joins, takes part in one allreduce and is killed (SIGKILL) by
// the test. Member 0's next allreduce fails with one line well within the timeout (the peer's
// socket closes), and member 0 goes on: a new link of itself alone reduces.
TEST(GlooLink, AKilledMemberFailsTheCollectiveNotTheSurvivor) {
  LATTICE_REQUIRE_ETCD();
  test_support::EtcdProcess etcd;
  const int64_t n = 1000;
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // member 1: no gtest here
    ::close(ready[0]);
    try {
      GlooLink link(etcd.endpoint(), "/test/killed/", 1, 2, "127.0.0.1", kTimeout);
      std::vector<float> v = values_of(1, n);
      link.allreduce_sum(v.data(), n);
      const char done = 1;
      if (::write(ready[1], &done, 1) != 1) std::_Exit(3);
      ::pause();  // until killed
    } catch (...) {
      std::_Exit(2);
    }
    std::_Exit(0);
  }
  ::close(ready[1]);
  GlooLink link(etcd.endpoint(), "/test/killed/", 0, 2, "127.0.0.1", kTimeout);
  std::vector<float> v = values_of(0, n);
  link.allreduce_sum(v.data(), n);
  EXPECT_EQ(v[5], 15.0f);  // (1 + 2) * 5
  char done = 0;
  ASSERT_EQ(::read(ready[0], &done, 1), 1);
  ::close(ready[0]);
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status));

  const auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    link.allreduce_sum(v.data(), n);
  } catch (const Error& e) {
    message = e.what();
  }
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_NE(message.find("allreduce failed on member 0 of 2"), std::string::npos) << message;
  EXPECT_NE(message.find("a peer group died"), std::string::npos) << message;
  EXPECT_LE(waited, kTimeout + std::chrono::seconds(1));
  EXPECT_THROW(link.allreduce_sum(v.data(), n), Error);  // spent

  GlooLink alone(etcd.endpoint(), "/test/killed/after/", 0, 1, "127.0.0.1", kTimeout);
  std::vector<float> w = values_of(0, n);
  alone.allreduce_sum(w.data(), n);
  EXPECT_EQ(w, values_of(0, n));
}
