// PublishedRecord: a CollectiveRecord written by one thread (the rank it describes) on every
// collective and read by others only for hang and mismatch reports. A sequence lock over atomic
// words: the writer never waits and takes no lock (a rank's own bookkeeping never contends with a
// reporting peer); a reader retries while a write is in flight. Address-free, so it also lives in
// memory that processes share (a writer that dies in mid-write leaves the record unreadable, not
// its readers stuck).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>

#include "lattice/comm/trace.hpp"

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace lattice::comm {

class PublishedRecord {
 public:
  static_assert(std::is_trivially_copyable_v<CollectiveRecord>,
                "records travel between threads as raw words");

  // Only the owning thread calls store().
  void store(const CollectiveRecord& record) {
    static_assert(sizeof(CollectiveRecord) % 8 == 0, "records are copied as whole words");
    const auto* bytes = reinterpret_cast<const unsigned char*>(&record);
    const uint64_t version = version_.load(std::memory_order_relaxed);
    version_.store(version + 1, std::memory_order_relaxed);  // odd: a write is in flight
    std::atomic_thread_fence(std::memory_order_release);
    // Word by word straight from the record (a staging copy cost ~5 ns in failed store-to-load
    // forwarding: the record's fields are stored just before, narrower than the copy's loads).
    for (size_t i = 0; i < kWords; ++i) {
      uint64_t word;
      std::memcpy(&word, bytes + 8 * i, 8);
      words_[i].store(word, std::memory_order_relaxed);
    }
    version_.store(version + 2, std::memory_order_release);
  }

  // The newest stored record; nullopt before the first store, or when no consistent copy could
  // be read within ~1 ms of retries (a writer descheduled or killed in mid-write).
  std::optional<CollectiveRecord> load() const {
    for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
      const uint64_t before = version_.load(std::memory_order_acquire);
      if (before == 0) return std::nullopt;
      if (before & 1) {
        relax();
        continue;
      }
      uint64_t words[kWords];
      for (size_t i = 0; i < kWords; ++i) words[i] = words_[i].load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (version_.load(std::memory_order_relaxed) != before) continue;
      CollectiveRecord record;
      std::memcpy(&record, words, sizeof(CollectiveRecord));
      return record;
    }
    return std::nullopt;
  }

 private:
  static constexpr size_t kWords = (sizeof(CollectiveRecord) + 7) / 8;
  static constexpr int kMaxAttempts = 100000;
  static void relax() {
#if defined(__SSE2__)
    _mm_pause();
#endif
  }

  std::atomic<uint64_t> version_{0};
  std::atomic<uint64_t> words_[kWords] = {};
};

}  // namespace lattice::comm
