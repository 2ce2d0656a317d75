// GlooLink: see gloo_link.hpp. EtcdStore is Gloo's rendezvous Store over the membership store:
// set is a put, get and wait poll until the key exists or the timeout passes.
#include "lattice/parallel/replica/gloo_link.hpp"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <signal.h>

#include <algorithm>
#include <thread>

#include "lattice/core/error.hpp"

namespace lattice::replica {

namespace {

using Clock = std::chrono::steady_clock;

class EtcdStore : public gloo::rendezvous::Store {
 public:
  // Keys are put under `lease` (0: none).
  EtcdStore(const std::string& endpoint, std::string prefix, std::chrono::milliseconds timeout,
            int64_t lease)
      : client_(endpoint), prefix_(std::move(prefix)), timeout_(timeout), lease_(lease) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    client_.put(prefix_ + key, std::string(data.begin(), data.end()), lease_);
  }
  std::vector<char> get(const std::string& key) override {
    wait({key}, timeout_);
    const std::optional<std::string> value = client_.get(prefix_ + key);
    check(value.has_value(), "replica rendezvous: key " + prefix_ + key + " vanished");
    return std::vector<char>(value->begin(), value->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const auto deadline = Clock::now() + timeout;
    for (const std::string& key : keys)
      while (!client_.get(prefix_ + key).has_value()) {
        check(Clock::now() < deadline,
              "replica rendezvous under " + prefix_ + ": a member did not arrive within " +
                  std::to_string(timeout.count()) + " ms (no " + key +
                  "): start every group, or check that they name the same replica.store");
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
  }

 private:
  EtcdClient client_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
  int64_t lease_;
};

}  // namespace

GlooLink::GlooLink(const std::string& store_endpoint, const std::string& prefix, int rank, int size,
                   const std::string& hostname, std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), prefix_(prefix), timeout_(timeout) {
  check(size > 0 && rank >= 0 && rank < size, "a replica link needs 0 <= rank < size");
  // Gloo writes to its sockets without MSG_NOSIGNAL: a write to a dead peer must become the
  // collective's error, not a SIGPIPE that ends this process (Python, PyTorch's usual host,
  // ignores SIGPIPE for the same reason). Process-wide, and idempotent.
  ::signal(SIGPIPE, SIG_IGN);
  gloo::transport::tcp::attr attr;
  attr.hostname = hostname;
  try {
    device_ = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(timeout);
    // The addresses are put under a lease that outlives the rendezvous and is revoked with the
    // link: a later link under the same prefix never meets a dead member's address.
    EtcdClient client(store_endpoint);
    lease_ =
        client.grant_lease(std::chrono::duration_cast<std::chrono::seconds>(timeout).count() + 10);
    store_endpoint_ = store_endpoint;
    EtcdStore store(store_endpoint, prefix, timeout, lease_);
    context->connectFullMesh(store, device_);
    context_ = std::move(context);
  } catch (const gloo::Exception& e) {
    throw Error("replica link under " + prefix + ": connecting member " + std::to_string(rank) +
                " of " + std::to_string(size) + " failed (" + e.what() +
                "): check replica.host is an address the other groups can reach");
  }
}

GlooLink::~GlooLink() {
  if (lease_ == 0) return;
  try {
    EtcdClient(store_endpoint_, std::chrono::milliseconds(1000)).revoke_lease(lease_);
  } catch (const Error&) {  // the store is gone: the lease expires on its own
  }
}

template <typename Run>
void GlooLink::guarded(const char* what, Run&& run) {
  check(context_ != nullptr, "replica link under " + prefix_ + " is spent: make a new one");
  try {
    run();
  } catch (const gloo::Exception& e) {
    context_.reset();  // a failed Gloo context cannot be reused
    throw Error("replica link under " + prefix_ + ": " + what + " failed on member " +
                std::to_string(rank_) + " of " + std::to_string(size_) + " (" + e.what() +
                "): a peer group died or stalled past the timeout");
  }
}

void GlooLink::allreduce_sum(float* buffer, int64_t count) {
  if (size_ == 1 || count == 0) return;
  guarded("allreduce", [&] {
    gloo::AllreduceOptions options(context_);
    options.setOutput(buffer, static_cast<size_t>(count));
    options.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    options.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    options.setTag(tag_++);
    options.setTimeout(timeout_);
    gloo::allreduce(options);
  });
  bytes_sent_ += 2 * (size_ - 1) * count * static_cast<int64_t>(sizeof(float)) / size_;
}

void GlooLink::broadcast(void* buffer, int64_t bytes, int root) {
  check(root >= 0 && root < size_, "replica link broadcast: root outside the link");
  if (size_ == 1 || bytes == 0) return;
  guarded("broadcast", [&] {
    gloo::BroadcastOptions options(context_);
    options.setOutput(static_cast<char*>(buffer), static_cast<size_t>(bytes));
    options.setRoot(root);
    options.setTag(tag_++);
    options.setTimeout(timeout_);
    gloo::broadcast(options);
  });
  if (rank_ == root) bytes_sent_ += (size_ - 1) * bytes;
}

void GlooLink::all_gather(const void* in, void* out, int64_t bytes) {
  char* blocks = static_cast<char*>(out);
  if (size_ == 1 || bytes == 0) {
    std::copy_n(static_cast<const char*>(in), bytes, blocks);
    return;
  }
  guarded("all-gather", [&] {
    gloo::AllgatherOptions options(context_);
    // Gloo only reads the input (its API takes a mutable pointer).
    options.setInput(const_cast<char*>(static_cast<const char*>(in)), static_cast<size_t>(bytes));
    options.setOutput(blocks, static_cast<size_t>(bytes * size_));
    options.setTag(tag_++);
    options.setTimeout(timeout_);
    gloo::allgather(options);
  });
  bytes_sent_ += (size_ - 1) * bytes;
}

}  // namespace lattice::replica
