// OffloadHeader: the small committed record of an offloaded optimizer state -- its shape (elements,
// streams, chunk size), which of the two slot files holds the valid state, its generation and one
// CRC-32C per chunk -- with a binary encoding guarded by its own checksum.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lattice::optim {

struct OffloadHeader {
  int64_t numel = 0;                 // elements of the offloaded range
  int32_t streams = 2;               // exp_avg, exp_avg_sq (+ master weights when 3)
  int64_t chunk_elements = 0;        // elements per chunk (the last chunk may be shorter)
  uint64_t generation = 0;           // committed transactions (steps and restores) so far
  int64_t last_step = 0;             // the AdamW step number of the last committed step (0: none)
  int32_t active_slot = 0;           // 0 or 1: the slot file holding the valid state
  std::vector<uint32_t> chunk_crcs;  // CRC-32C of each chunk's bytes in the active slot

  int64_t chunk_count() const {
    return chunk_elements > 0 ? (numel + chunk_elements - 1) / chunk_elements : 0;
  }
  // Bytes of one slot file: every element's streams, chunk after chunk.
  int64_t slot_bytes() const { return numel * streams * 4; }

  std::vector<uint8_t> encode() const;
  // Parses and validates an encoded header read from `path` (named in errors).
  static OffloadHeader decode(const std::vector<uint8_t>& bytes, const std::string& path);
};

}  // namespace lattice::optim
