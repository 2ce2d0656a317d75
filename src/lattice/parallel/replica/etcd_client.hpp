// EtcdClient: the membership store of replica groups, etcd (Debian's etcd-server, the store
// TorchElastic's rendezvous uses) through its v3 JSON gateway (HTTP POST of JSON bodies, keys and
// values base64-encoded): put, get, prefix ranges, delete, create-if-absent, and leases (a key put
// under a lease vanishes when its holder stops renewing it: how a dead group leaves the quorum).
// Every call opens one connection with a deadline; a store that cannot be reached, or answers
// with an error, is an Error naming the endpoint and the fix.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace lattice::replica {

struct KeyValue {
  std::string key, value;
  int64_t lease = 0;
};

class EtcdClient {
 public:
  // `endpoint`: "host:port" of etcd's client URL (e.g. 127.0.0.1:2379). `timeout`: each request's
  // deadline (connect, send and answer).
  explicit EtcdClient(std::string endpoint,
                      std::chrono::milliseconds timeout = std::chrono::seconds(5));

  const std::string& endpoint() const { return endpoint_; }

  // Sets `key` (under `lease` when not 0: the key goes when the lease expires).
  void put(const std::string& key, const std::string& value, int64_t lease = 0);
  // The value of `key`, or nullopt.
  std::optional<std::string> get(const std::string& key);
  // Every key starting with `prefix`, in key order.
  std::vector<KeyValue> get_prefix(const std::string& prefix);
  // Removes `key` (no error when absent).
  void remove(const std::string& key);
  // Removes every key starting with `prefix`.
  void remove_prefix(const std::string& prefix);
  // Puts `key` only if it does not exist; true when this call created it.
  bool create(const std::string& key, const std::string& value, int64_t lease = 0);

  // A lease of `ttl_seconds`; its id.
  int64_t grant_lease(int64_t ttl_seconds);
  // Renews `lease`; false when it has already expired (its keys are gone).
  bool keep_alive(int64_t lease);
  void revoke_lease(int64_t lease);

 private:
  // POSTs `body` to `path`; the answer's JSON text.
  std::string post(const std::string& path, const std::string& body);

  std::string endpoint_, host_;
  int port_ = 0;
  std::chrono::milliseconds timeout_;
};

std::string base64_encode(const std::string& bytes);
// Throws Error on a character outside the alphabet.
std::string base64_decode(const std::string& text);

}  // namespace lattice::replica
