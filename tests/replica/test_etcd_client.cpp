// Tests of EtcdClient against a real etcd (tests/replica/etcd_process.hpp): keys and prefixes,
// create-if-absent, leases that expire, and the one-line errors of a store that is not there or
// goes away. base64 against RFC 4648's test vectors.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "etcd_process.hpp"
#include "lattice/core/error.hpp"
#include "lattice/parallel/replica/etcd_client.hpp"

using namespace lattice;
using namespace lattice::replica;

using lattice::replica::test_support::message_of;

TEST(Base64, MatchesRfc4648) {
  const std::pair<const char*, const char*> vectors[] = {{"", ""},
                                                         {"f", "Zg=="},
                                                         {"fo", "Zm8="},
                                                         {"foo", "Zm9v"},
                                                         {"foob", "Zm9vYg=="},
                                                         {"fooba", "Zm9vYmE="},
                                                         {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, encoded] : vectors) {
    EXPECT_EQ(base64_encode(plain), encoded);
    EXPECT_EQ(base64_decode(encoded), plain);
  }
  const std::string binary("\0\xff\x10 x", 5);
  EXPECT_EQ(base64_decode(base64_encode(binary)), binary);
  EXPECT_THROW(base64_decode("Zm9v!"), Error);
}

TEST(EtcdClient, PutsGetsRangesAndRemoves) {
  LATTICE_REQUIRE_ETCD();
  test_support::EtcdProcess etcd;
  EtcdClient client(etcd.endpoint());
  const std::string binary("a\0b\xff", 4);
  client.put("/job/groups/1", "one");
  client.put("/job/groups/0", binary);
  client.put("/job/other", "x");
  EXPECT_EQ(client.get("/job/groups/0"), binary);
  EXPECT_EQ(client.get("/job/missing"), std::nullopt);
  const std::vector<KeyValue> groups = client.get_prefix("/job/groups/");
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].key, "/job/groups/0");  // in key order
  EXPECT_EQ(groups[1].value, "one");
  client.remove("/job/groups/0");
  client.remove("/job/groups/never");
  EXPECT_EQ(client.get_prefix("/job/groups/").size(), 1u);
  EXPECT_TRUE(client.create("/job/leader", "a"));
  EXPECT_FALSE(client.create("/job/leader", "b"));
  EXPECT_EQ(client.get("/job/leader"), "a");
}

TEST(EtcdClient, LeasedKeysGoWithTheirLease) {
  LATTICE_REQUIRE_ETCD();
  test_support::EtcdProcess etcd;
  EtcdClient client(etcd.endpoint());
  // Revoked: gone at once.
  const int64_t revoked = client.grant_lease(10);
  client.put("/job/alive/a", "1", revoked);
  EXPECT_TRUE(client.keep_alive(revoked));
  client.revoke_lease(revoked);
  EXPECT_EQ(client.get("/job/alive/a"), std::nullopt);
  EXPECT_FALSE(client.keep_alive(revoked));
  // Not renewed: gone once the time to live has passed (etcd's shortest is 2 s here).
  const int64_t lapsing = client.grant_lease(2);
  client.put("/job/alive/b", "1", lapsing);
  ASSERT_EQ(client.get_prefix("/job/alive/").size(), 1u);
  EXPECT_EQ(client.get_prefix("/job/alive/")[0].lease, lapsing);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (client.get("/job/alive/b") && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(client.get("/job/alive/b"), std::nullopt);
  EXPECT_FALSE(client.keep_alive(lapsing));
}

TEST(EtcdClient, AStoreThatIsNotThereOrGoesAwayIsOneErrorLine) {
  LATTICE_REQUIRE_ETCD();
  EXPECT_THROW(EtcdClient("localhost"), Error);
  EXPECT_THROW(EtcdClient("localhost:99999"), Error);
  const std::string nobody = "127.0.0.1:" + std::to_string(test_support::free_port());
  const auto start = std::chrono::steady_clock::now();
  const std::string refused =
      message_of([&] { EtcdClient(nobody, std::chrono::milliseconds(500)).put("/k", "v"); });
  EXPECT_NE(refused.find("cannot reach the replica store (etcd) at " + nobody), std::string::npos)
      << refused;
  EXPECT_NE(refused.find("replica.store"), std::string::npos) << refused;
  EXPECT_EQ(refused.find('\n'), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));

  test_support::EtcdProcess etcd;
  EtcdClient client(etcd.endpoint(), std::chrono::milliseconds(500));
  client.put("/k", "v");
  etcd.stop();
  const std::string gone = message_of([&] { client.get("/k"); });
  EXPECT_NE(gone.find("cannot reach the replica store"), std::string::npos) << gone;
}
