// LocalGroup: the state the ranks of one in-process communicator share - per-rank publication slots
// (direct algorithms, split), one rendezvous channel per ordered rank pair (algorithm messages,
// read in place by the receiver), one tagged mailbox per rank (user messages) and the status board.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "lattice/comm/algorithms/direct.hpp"
#include "lattice/comm/collective.hpp"
#include "lattice/comm/status_board.hpp"

namespace lattice::comm {

struct LocalGroup {
  LocalGroup(int size, std::shared_ptr<FailureFlag> failure_flag);

  // What one rank publishes for the direct algorithms and split.
  // Small collectives copy their input here instead of publishing pointers; one area per parity of
  // the sequence number, so a rank may write collective k+1's while peers still read collective
  // k's.
  static constexpr size_t kStagingBytes = 16 << 10;
  struct alignas(64) Staged {
    uint64_t seq = 0;
    CollectiveDescriptor descriptor;  // what this rank entered at seq (staged collectives)
    alignas(64) unsigned char data[kStagingBytes];
  };
  // What a direct (non-staged) collective publishes: read by every peer right after it sees this
  // rank's epoch move, so it shares the epoch's cache line and one transfer brings both (a
  // separate line per field cost a cross-core handoff each, ~160 ns here, on every collective).
  struct Published {
    uint64_t seq = 0;
    CollectiveDescriptor descriptor;
    DirectBuffers buffers;
  };
  static_assert(sizeof(Published) + sizeof(std::atomic<uint64_t>) <= 64,
                "a rank's epoch and its published collective must fit one cache line");
  struct alignas(64) RankSlot {
    std::atomic<uint64_t> epoch{0};
    Published published;
    alignas(64) std::shared_ptr<LocalGroup> split_group;
    Staged staged[2];
  };

  // One message at a time from `source` to `destination`, read in place by the receiver.
  struct alignas(64) Channel {
    alignas(64) std::atomic<uint64_t> posted{0};
    const void* data = nullptr;
    size_t bytes = 0;
    uint64_t seq = 0;
    CollectiveDescriptor descriptor;
    alignas(64) std::atomic<uint64_t> consumed{0};
  };

  // Tagged user messages to one rank (copied at send: sends never block).
  struct Mailbox {
    struct Message {
      int source = 0;
      int tag = 0;
      std::vector<unsigned char> payload;
    };
    std::mutex mutex;
    std::deque<Message> messages;
    std::atomic<uint64_t> arrivals{0};
  };

  int size;
  std::shared_ptr<FailureFlag> failure_flag;
  std::shared_ptr<InProcessStatusBoard> board;
  std::vector<RankSlot> slots;
  std::vector<Channel> channels;  // [source * size + destination]
  std::vector<Mailbox> mailboxes;

  Channel& channel(int source, int destination) {
    return channels[static_cast<size_t>(source) * static_cast<size_t>(size) +
                    static_cast<size_t>(destination)];
  }
};

}  // namespace lattice::comm
