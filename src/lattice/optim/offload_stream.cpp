// Chunk streaming: see offload_stream.hpp.
#include "lattice/optim/offload_stream.hpp"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

#include "lattice/core/error.hpp"
#include "lattice/core/tensor.hpp"

namespace lattice::optim {
namespace {

struct PendingChunk {
  int64_t chunk = 0;
  int buffer = 0;
};

// What the calling thread and the I/O thread share, guarded by `mutex`.
struct StreamState {
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<int> free_buffers;
  std::deque<PendingChunk> ready;     // read and verified, in chunk order
  std::deque<PendingChunk> to_write;  // visited, waiting for the write-back
  int64_t next_read = 0;
  int64_t written = 0;
  bool stop = false;
  std::exception_ptr error;
};

int64_t chunk_begin(const ChunkStreamPlan& plan, int64_t chunk) {
  return chunk * plan.chunk_elements;
}
int64_t chunk_count_of(const ChunkStreamPlan& plan, int64_t chunk) {
  return std::min(plan.chunk_elements, plan.numel - chunk_begin(plan, chunk));
}
int64_t chunk_file_offset(const ChunkStreamPlan& plan, int64_t chunk) {
  return chunk_begin(plan, chunk) * plan.streams * static_cast<int64_t>(sizeof(float));
}
size_t chunk_bytes(const ChunkStreamPlan& plan, int64_t chunk) {
  return static_cast<size_t>(chunk_count_of(plan, chunk) * plan.streams) * sizeof(float);
}

int buffer_count(const ChunkStreamPlan& plan) {
  const int64_t chunks = plan.end_chunk - plan.first_chunk;
  // One in use, `read_ahead` being read, one being written back.
  const int64_t wanted = std::max(0, plan.read_ahead) + 1 + (plan.destination ? 1 : 0);
  return static_cast<int>(std::max<int64_t>(1, std::min(wanted, chunks)));
}

void read_chunk(const ChunkStreamPlan& plan, int64_t chunk, float* data) {
  const size_t nbytes = chunk_bytes(plan, chunk);
  plan.source->read_exact(data, nbytes, chunk_file_offset(plan, chunk));
  if (plan.source_crcs && crc32c(data, nbytes) != (*plan.source_crcs)[static_cast<size_t>(chunk)]) {
    throw Error("offload state file " + plan.source->path() + ": chunk " + std::to_string(chunk) +
                " fails its checksum (the file was changed or damaged outside Lattice); delete "
                "the offload directory and restore the optimizer state from a checkpoint");
  }
}

void write_chunk(const ChunkStreamPlan& plan, int64_t chunk, const float* data) {
  const size_t nbytes = chunk_bytes(plan, chunk);
  if (plan.destination_crcs) {
    (*plan.destination_crcs)[static_cast<size_t>(chunk)] = crc32c(data, nbytes);
  }
  plan.destination->write_exact(data, nbytes, chunk_file_offset(plan, chunk));
}

// The I/O thread: write-backs first (they free buffers), else the next read while a buffer is
// free; exits when every chunk is read (and written back) or the stream stops.
void run_io(const ChunkStreamPlan& plan, StreamState& s, std::vector<Tensor>& buffers) {
  const int64_t total = plan.end_chunk - plan.first_chunk;
  try {
    std::unique_lock lock(s.mutex);
    for (;;) {
      const bool reads_left = s.next_read < plan.end_chunk;
      const bool writes_left = plan.destination && s.written < total;
      if (s.stop || (!reads_left && !writes_left)) return;
      if (!s.to_write.empty()) {
        const PendingChunk item = s.to_write.front();
        s.to_write.pop_front();
        lock.unlock();
        write_chunk(plan, item.chunk, buffers[static_cast<size_t>(item.buffer)].f32());
        lock.lock();
        s.free_buffers.push_back(item.buffer);
        ++s.written;
        s.changed.notify_all();
      } else if (reads_left && !s.free_buffers.empty()) {
        const PendingChunk item{s.next_read++, s.free_buffers.front()};
        s.free_buffers.pop_front();
        lock.unlock();
        read_chunk(plan, item.chunk, buffers[static_cast<size_t>(item.buffer)].f32());
        lock.lock();
        s.ready.push_back(item);
        s.changed.notify_all();
      } else {
        s.changed.wait(lock);
      }
    }
  } catch (...) {
    std::lock_guard guard(s.mutex);
    s.error = std::current_exception();
    s.changed.notify_all();
  }
}

}  // namespace

int64_t chunk_stream_buffer_bytes(const ChunkStreamPlan& plan) {
  if (plan.end_chunk <= plan.first_chunk) return 0;
  const int64_t elements = std::min(plan.chunk_elements, plan.numel);
  return buffer_count(plan) * elements * plan.streams * static_cast<int64_t>(sizeof(float));
}

void stream_chunks(const ChunkStreamPlan& plan,
                   const std::function<void(int64_t, float*, int64_t, int64_t)>& visit) {
  const int64_t total = plan.end_chunk - plan.first_chunk;
  if (total <= 0) return;
  check(plan.source != nullptr && plan.chunk_elements > 0 && plan.first_chunk >= 0 &&
            chunk_begin(plan, plan.end_chunk - 1) < plan.numel,
        "stream_chunks: the plan's chunks lie outside the state (internal error)");
  const int64_t elements = std::min(plan.chunk_elements, plan.numel);
  std::vector<Tensor> buffers;
  StreamState s;
  for (int i = 0; i < buffer_count(plan); ++i) {
    buffers.emplace_back(Shape{elements * plan.streams}, DType::f32, plan.tracker,
                         MemoryCategory::optimizer_state);
    s.free_buffers.push_back(i);
  }
  s.next_read = plan.first_chunk;

  std::thread io([&] { run_io(plan, s, buffers); });
  // Stops and joins the I/O thread on every way out, exceptions included.
  struct Joiner {
    StreamState& s;
    std::thread& io;
    ~Joiner() {
      {
        std::lock_guard guard(s.mutex);
        s.stop = true;
        s.changed.notify_all();
      }
      io.join();
    }
  } joiner{s, io};

  for (int64_t chunk = plan.first_chunk; chunk < plan.end_chunk; ++chunk) {
    PendingChunk item;
    {
      std::unique_lock lock(s.mutex);
      s.changed.wait(lock, [&] { return s.error || !s.ready.empty(); });
      if (s.error) std::rethrow_exception(s.error);
      item = s.ready.front();
      s.ready.pop_front();
    }
    visit(item.chunk, buffers[static_cast<size_t>(item.buffer)].f32(),
          chunk_begin(plan, item.chunk), chunk_count_of(plan, item.chunk));
    std::lock_guard guard(s.mutex);
    if (plan.destination) {
      s.to_write.push_back(item);
    } else {
      s.free_buffers.push_back(item.buffer);
    }
    s.changed.notify_all();
  }
  if (plan.destination) {
    std::unique_lock lock(s.mutex);
    s.changed.wait(lock, [&] { return s.error || s.written == total; });
  }
  std::lock_guard guard(s.mutex);
  if (s.error) std::rethrow_exception(s.error);
}

}  // namespace lattice::optim
