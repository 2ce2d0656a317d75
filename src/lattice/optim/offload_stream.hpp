// Chunk streaming for the optimizer offload: the chunks of a slot file pass through a bounded pool
// of buffers -- a background I/O thread reads ahead (verifying each chunk's CRC-32C) and writes
// finished chunks to the destination slot (recording their CRCs), while the calling thread works
// on the current chunk. The pattern of ZeRO-Infinity's pipelined optimizer swapper.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "lattice/core/memory.hpp"
#include "lattice/optim/offload_file.hpp"

namespace lattice::optim {

struct ChunkStreamPlan {
  const OffloadFile* source = nullptr;
  OffloadFile* destination = nullptr;  // nullptr: read only
  int64_t numel = 0;
  int64_t chunk_elements = 0;
  int streams = 2;  // a chunk of n elements is stream 0's n floats, then stream 1's, ...
  int64_t first_chunk = 0, end_chunk = 0;              // chunks [first, end) in order
  const std::vector<uint32_t>* source_crcs = nullptr;  // checked on every read
  std::vector<uint32_t>* destination_crcs = nullptr;   // written chunks' CRCs, by chunk index
  int read_ahead = 2;                                  // chunks read beyond the one in use
  MemoryTracker* tracker = nullptr;  // the buffers count as optimizer_state while they live
};

// Bytes of chunk buffers stream_chunks holds at once for `plan` (all of it tracked).
int64_t chunk_stream_buffer_bytes(const ChunkStreamPlan& plan);

// Calls visit(chunk, data, begin, count) for every chunk of the plan, in order, on the calling
// thread: `data` holds the chunk's `streams` arrays of `count` floats (elements [begin,
// begin+count) of the range) and may be modified; with a destination it is written back there.
// Returns once every write has finished. I/O errors and checksum mismatches surface as the
// lattice::Error of the I/O thread.
void stream_chunks(
    const ChunkStreamPlan& plan,
    const std::function<void(int64_t chunk, float* data, int64_t begin, int64_t count)>& visit);

}  // namespace lattice::optim
