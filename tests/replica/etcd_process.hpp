// EtcdProcess: a real etcd (Debian's etcd-server) for the replica tests, on free local ports with
// its data in a fresh temporary directory; ready when a put and a get go through; stopped (SIGKILL)
// and removed when the object goes. `available()` is false when no etcd binary is installed.
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>

#include "lattice/core/error.hpp"
#include "lattice/parallel/replica/etcd_client.hpp"

namespace lattice::replica::test_support {

// A TCP port nobody listens on now (the kernel's choice for port 0).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

// The message of the lattice::Error `run` throws ("" when it throws none).
inline std::string message_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

inline std::string etcd_binary() {
  for (const char* path : {"/usr/bin/etcd", "/usr/local/bin/etcd"})
    if (::access(path, X_OK) == 0) return path;
  return "";
}

class EtcdProcess {
 public:
  static bool available() { return !etcd_binary().empty(); }

  EtcdProcess() {
    directory_ = std::filesystem::temp_directory_path() /
                 ("lattice_etcd_" + std::to_string(::getpid()) + "_" +
                  std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
    std::filesystem::create_directories(directory_);
    const int client = free_port(), peer = free_port();
    endpoint_ = "127.0.0.1:" + std::to_string(client);
    const std::string client_url = "http://" + endpoint_;
    const std::string peer_url = "http://127.0.0.1:" + std::to_string(peer);
    const std::string data = (directory_ / "data").string();
    const std::string log = (directory_ / "etcd.log").string();
    const std::string binary = etcd_binary();
    pid_ = ::fork();
    if (pid_ == 0) {
      std::freopen(log.c_str(), "w", stdout);
      std::freopen(log.c_str(), "a", stderr);
      ::execl(binary.c_str(), binary.c_str(), "--data-dir", data.c_str(), "--listen-client-urls",
              client_url.c_str(), "--advertise-client-urls", client_url.c_str(),
              "--listen-peer-urls", peer_url.c_str(), "--initial-advertise-peer-urls",
              peer_url.c_str(), "--initial-cluster", ("default=" + peer_url).c_str(),
              static_cast<char*>(nullptr));
      std::_Exit(127);
    }
    EtcdClient probe(endpoint_, std::chrono::milliseconds(500));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (true) {
      try {
        probe.put("/lattice_test/ready", "1");
        if (probe.get("/lattice_test/ready")) break;
      } catch (const Error&) {
      }
      check(std::chrono::steady_clock::now() < deadline,
            "etcd did not start within 20 s: see " + log);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  ~EtcdProcess() {
    stop();
    std::error_code ignored;
    std::filesystem::remove_all(directory_, ignored);
  }

  // Kills etcd now (the store disappears).
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  const std::string& endpoint() const { return endpoint_; }

 private:
  std::filesystem::path directory_;
  std::string endpoint_;
  pid_t pid_ = -1;
};

}  // namespace lattice::replica::test_support

// Skips the test (with how to install it) where no etcd binary is installed.
#define LATTICE_REQUIRE_ETCD()                                     \
  if (!::lattice::replica::test_support::EtcdProcess::available()) \
  GTEST_SKIP() << "no etcd binary (scripts/install_deps.sh installs Debian's etcd-server)"
