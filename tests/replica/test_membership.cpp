// Tests of the replica groups' quorum (parallel/replica/membership.hpp) against a real etcd: the
// groups meet at the start and agree on one record; a group that leaves, or is killed with -9
// (its lease runs out), is left out of the next outer step; a joiner waits for the groups that
// hold the state and is named beside them; a failed exchange aborts the attempt and the next
// attempt agrees again; and the one-line refusals (another fingerprint, a group id that is
// already alive, fewer than replica.min_groups).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <thread>

#include "etcd_process.hpp"
#include "lattice/core/error.hpp"
#include "lattice/parallel/replica/membership.hpp"

using namespace lattice;
using replica::Membership;
using replica::MembershipSettings;
using replica::QuorumRecord;
using EtcdProcess = lattice::replica::test_support::EtcdProcess;
using lattice::replica::test_support::message_of;

namespace {

MembershipSettings settings_of(const EtcdProcess& etcd, const std::string& job, int group,
                               int groups, uint64_t fingerprint = 7) {
  MembershipSettings s;
  s.store = etcd.endpoint();
  s.job = job;
  s.group = group;
  s.groups = groups;
  s.timeout = std::chrono::milliseconds(2000);
  s.lease_seconds = 2;
  s.fingerprint = fingerprint;
  return s;
}

// Every group of `members` agrees on `round` at once (each in a thread) and settles it with
// `succeeded(g)`; the records, and whether each committed.
struct Agreed {
  std::vector<std::optional<QuorumRecord>> records;
  std::vector<bool> committed;
};
Agreed agree_all(
    std::vector<Membership*> members, int64_t round, std::vector<bool> contributor,
    const std::optional<QuorumRecord>& committed,
    const std::function<bool(int)>& succeeded = [](int) { return true; }) {
  Agreed out;
  out.records.resize(members.size());
  out.committed.resize(members.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < members.size(); ++i)
    threads.emplace_back([&, i] {
      out.records[i] = members[i]->agree(round, contributor[i], committed);
      if (out.records[i])
        out.committed[i] = members[i]->settle(*out.records[i], succeeded(members[i]->group()));
    });
  for (auto& t : threads) t.join();
  return out;
}

}  // namespace

TEST(Membership, GroupsMeetAtTheStartAndALeavingGroupIsLeftOut) {
  LATTICE_REQUIRE_ETCD();
  EtcdProcess etcd;
  auto a = std::make_unique<Membership>(settings_of(etcd, "meet", 0, 2));
  auto b = std::make_unique<Membership>(settings_of(etcd, "meet", 1, 2));
  EXPECT_FALSE(a->latest());
  const Agreed start = agree_all({a.get(), b.get()}, 0, {false, false}, std::nullopt);
  ASSERT_TRUE(start.records[0] && start.records[1]);
  EXPECT_EQ(*start.records[0], *start.records[1]);
  EXPECT_EQ(start.records[0]->members, (std::vector<int>{0, 1}));
  EXPECT_EQ(start.records[0]->blocks, (std::vector<int64_t>{0, 1}));
  EXPECT_TRUE(start.committed[0] && start.committed[1]);
  ASSERT_TRUE(a->latest());
  EXPECT_EQ(*a->latest(), *start.records[0]);

  b.reset();  // leaves: its lease is revoked
  const Agreed one = agree_all({a.get()}, 1, {true}, start.records[0]);
  ASSERT_TRUE(one.records[0]);
  EXPECT_EQ(one.records[0]->members, (std::vector<int>{0}));
  EXPECT_EQ(one.records[0]->completed, (std::vector<int64_t>{0}));
  EXPECT_EQ(one.records[0]->blocks, (std::vector<int64_t>{1}));  // group 1's, handed out again
  EXPECT_TRUE(one.committed[0]);

  // Group 1 comes back: it joins outer step 2 beside group 0, which holds the state.
  b = std::make_unique<Membership>(settings_of(etcd, "meet", 1, 2));
  const Agreed two = agree_all({a.get(), b.get()}, 2, {true, false}, one.records[0]);
  ASSERT_TRUE(two.records[0] && two.records[1]);
  EXPECT_EQ(two.records[1]->members, (std::vector<int>{0, 1}));
  EXPECT_EQ(two.records[1]->contributors, (std::vector<int>{0}));
  EXPECT_EQ(two.records[1]->source, 0);
  EXPECT_EQ(two.records[1]->blocks, (std::vector<int64_t>{2, 3}));
}

TEST(Membership, AGroupKilledWithMinusNineIsLeftOutOnceItsLeaseRunsOut) {
  LATTICE_REQUIRE_ETCD();
  EtcdProcess etcd;
  // The other group in a child process: it meets group 0 at the start, then hangs until killed.
  const pid_t child = ::fork();
  if (child == 0) {
    try {
      Membership b(settings_of(etcd, "kill", 1, 2));
      const auto r = b.agree(0, false, std::nullopt);
      if (r) b.settle(*r, true);
    } catch (...) {
      ::_exit(3);
    }
    while (true) ::pause();
  }
  Membership a(settings_of(etcd, "kill", 0, 2));
  const auto start = a.agree(0, false, std::nullopt);
  ASSERT_TRUE(start);
  ASSERT_TRUE(a.settle(*start, true));
  ASSERT_EQ(start->members, (std::vector<int>{0, 1}));
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  const auto began = std::chrono::steady_clock::now();
  const auto one = a.agree(1, true, start);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  ASSERT_TRUE(one);
  EXPECT_EQ(one->members, (std::vector<int>{0}));
  EXPECT_EQ(one->pending, std::vector<int64_t>{});
  EXPECT_EQ(one->blocks, (std::vector<int64_t>{1}));  // the dead group's block
  // Within the timeout (2 s) plus the lease's life (2 s) and polling.
  EXPECT_LT(waited, 6.0);
}

TEST(Membership, AFailedExchangeAbortsAndTheNextAttemptAgreesAgain) {
  LATTICE_REQUIRE_ETCD();
  EtcdProcess etcd;
  Membership a(settings_of(etcd, "abort", 0, 2)), b(settings_of(etcd, "abort", 1, 2));
  const Agreed start = agree_all({&a, &b}, 0, {false, false}, std::nullopt);
  const Agreed failed = agree_all({&a, &b}, 1, {true, true}, start.records[0],
                                  [](int g) { return g == 0; });  // group 1's exchange failed
  EXPECT_FALSE(failed.committed[0]);
  EXPECT_FALSE(failed.committed[1]);
  EXPECT_EQ(a.latest()->round, 0);  // not committed
  const Agreed again = agree_all({&a, &b}, 1, {true, true}, start.records[0]);
  ASSERT_TRUE(again.records[0]);
  EXPECT_EQ(again.records[0]->attempt, 1);
  EXPECT_TRUE(again.committed[0] && again.committed[1]);
  EXPECT_EQ(a.latest()->round, 1);
}

TEST(Membership, RefusesAnotherFingerprintATwinAndTooFewGroupsInOneLine) {
  LATTICE_REQUIRE_ETCD();
  EtcdProcess etcd;
  Membership a(settings_of(etcd, "refuse", 0, 2));
  const std::string other =
      message_of([&] { Membership b(settings_of(etcd, "refuse", 1, 2, /*fingerprint=*/8)); });
  EXPECT_NE(other.find("replica group 1 runs another model, layout, batch or optimizer than "
                       "group 0"),
            std::string::npos)
      << other;
  const std::string twin = message_of([&] { Membership b(settings_of(etcd, "refuse", 0, 2)); });
  EXPECT_NE(twin.find("replica group 0 of job 'refuse' is already running"), std::string::npos)
      << twin;

  MembershipSettings few = settings_of(etcd, "few", 0, 2);
  few.min_groups = 2;
  few.timeout = std::chrono::milliseconds(500);
  Membership alone(few);
  const std::string too_few = message_of([&] { alone.agree(0, false, std::nullopt); });
  EXPECT_NE(too_few.find("only 1 of the 2 replica groups came within 500 ms"), std::string::npos)
      << too_few;
  EXPECT_NE(too_few.find("replica.min_groups = 2"), std::string::npos) << too_few;
  for (const std::string& line : {other, twin, too_few})
    EXPECT_EQ(line.find('\n'), std::string::npos);

  // A store that is not there: one line naming it.
  MembershipSettings nowhere = settings_of(etcd, "nowhere", 0, 2);
  nowhere.store = "127.0.0.1:" + std::to_string(replica::test_support::free_port());
  const std::string unreachable = message_of([&] { Membership m(nowhere); });
  EXPECT_NE(unreachable.find("cannot reach the replica store (etcd)"), std::string::npos)
      << unreachable;
}
