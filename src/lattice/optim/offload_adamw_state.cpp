// Offloaded AdamW state: see offload_adamw_state.hpp.
#include "lattice/optim/offload_adamw_state.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/optim/offload_stream.hpp"

namespace lattice::optim {
namespace {

constexpr int kMomentStreams = 2;
constexpr int kMasterStream = 2;

std::vector<uint8_t> read_whole(const std::string& path) {
  OffloadFile file(path, OffloadFile::Mode::open_existing);
  std::vector<uint8_t> bytes(static_cast<size_t>(file.size()));
  file.read_exact(bytes.data(), bytes.size(), 0);
  return bytes;
}

// CRC-32C of `nbytes` zero bytes (a freshly reserved chunk).
uint32_t zero_crc(int64_t nbytes) {
  static constexpr size_t kBlock = 4096;
  const std::vector<uint8_t> zeros(kBlock, 0);
  uint32_t crc = 0;
  for (int64_t done = 0; done < nbytes; done += kBlock) {
    crc = crc32c(zeros.data(), static_cast<size_t>(std::min<int64_t>(kBlock, nbytes - done)), crc);
  }
  return crc;
}

void check_decay_ranges(std::span<const DecayRange> decay, int64_t numel) {
  int64_t end = 0;
  for (const DecayRange& r : decay) {
    check(r.offset >= end && r.count >= 0 && r.offset + r.count <= numel,
          "offloaded AdamW: decay ranges must be sorted, disjoint and inside the range of " +
              std::to_string(numel) + " elements (got [" + std::to_string(r.offset) + ", " +
              std::to_string(r.offset + r.count) +
              ")); pass each parameter's offset within the "
              "offloaded range in increasing order");
    end = r.offset + r.count;
  }
}

}  // namespace

std::vector<DecayRange> decay_ranges(const model::ParameterStore& store, int64_t begin,
                                     int64_t end) {
  std::vector<DecayRange> ranges;
  for (const auto& p : store.parameters()) {  // declaration order = increasing offsets
    if (!p.weight_decay) continue;
    const int64_t from = std::max(begin, p.offset), to = std::min(end, p.offset + p.numel);
    if (from >= to) continue;
    if (!ranges.empty() && ranges.back().offset + ranges.back().count == from - begin) {
      ranges.back().count += to - from;  // adjacent decayed parameters make one range
    } else {
      ranges.push_back({from - begin, to - from});
    }
  }
  return ranges;
}

OffloadedAdamWState::OffloadedAdamWState(kernels::Ops& ops, OffloadSettings settings, int64_t numel,
                                         MemoryTracker* tracker)
    : ops_(ops), settings_(std::move(settings)), tracker_(tracker) {
  check(!settings_.directory.empty(),
        "offloaded AdamW: no offload directory given; set one (a folder on a local disk)");
  check(numel >= 0, "offloaded AdamW: the range has " + std::to_string(numel) +
                        " elements; pass the shard's element count (>= 0)");
  check(settings_.chunk_elements > 0, "offloaded AdamW: chunk_elements is " +
                                          std::to_string(settings_.chunk_elements) +
                                          "; set it to a positive element count (e.g. 1048576)");
  check(settings_.read_ahead >= 0, "offloaded AdamW: read_ahead is " +
                                       std::to_string(settings_.read_ahead) +
                                       "; set it to 0 or more chunks");
  std::error_code ec;
  std::filesystem::create_directories(settings_.directory, ec);
  if (ec || !std::filesystem::is_directory(settings_.directory)) {
    throw Error("cannot create offload directory " + settings_.directory + ": " +
                (ec ? ec.message() : std::string("a file of that name exists")) +
                "; set the offload directory to a writable folder on a local disk");
  }
  lock_ = OffloadFile(file_path("lock"), OffloadFile::Mode::open_or_create);
  lock_.lock_exclusive("offloaded optimizer state");
  header_.numel = numel;
  header_.streams = settings_.master ? 3 : kMomentStreams;
  header_.chunk_elements = settings_.chunk_elements;
  if (settings_.resume) {
    open_existing();
  } else {
    create_fresh();
  }
}

std::string OffloadedAdamWState::file_path(const std::string& suffix) const {
  return (std::filesystem::path(settings_.directory) / ("adamw_state." + suffix)).string();
}

void OffloadedAdamWState::create_fresh() {
  for (int slot = 0; slot < 2; ++slot) {
    slots_[slot] =
        OffloadFile(file_path(std::to_string(slot)), OffloadFile::Mode::create_or_truncate);
    slots_[slot].reserve(header_.slot_bytes());
  }
  const int64_t chunks = header_.chunk_count();
  header_.chunk_crcs.resize(static_cast<size_t>(chunks));
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t count =
        std::min(header_.chunk_elements, header_.numel - c * header_.chunk_elements);
    header_.chunk_crcs[static_cast<size_t>(c)] =
        zero_crc(count * header_.streams * static_cast<int64_t>(sizeof(float)));
  }
  header_.generation = 0;
  header_.last_step = 0;
  header_.active_slot = 0;
  const std::vector<uint8_t> bytes = header_.encode();
  offload_write_atomically(file_path("header"), bytes.data(), bytes.size(), settings_.durable);
}

void OffloadedAdamWState::open_existing() {
  const std::string path = file_path("header");
  check(std::filesystem::exists(path),
        "cannot resume offloaded optimizer state: " + path +
            " does not exist; start without resume, or restore the optimizer state from a "
            "checkpoint");
  OffloadHeader found = OffloadHeader::decode(read_whole(path), path);
  check(found.numel == header_.numel && found.streams == header_.streams,
        "offload directory " + settings_.directory + " holds " + std::to_string(found.numel) +
            " elements" + (found.streams == 3 ? " with master weights" : "") +
            ", but this range has " + std::to_string(header_.numel) +
            (header_.streams == 3 ? " with master weights" : "") +
            "; use this rank's own offload directory with the same settings, or start without "
            "resume");
  header_ = std::move(found);  // its chunk size wins: it is how the slots are laid out
  const int active = header_.active_slot;
  slots_[active] = OffloadFile(file_path(std::to_string(active)), OffloadFile::Mode::open_existing);
  if (slots_[active].size() < header_.slot_bytes()) {
    throw Error(
        "offload state file " + slots_[active].path() + " is truncated (" +
        std::to_string(slots_[active].size()) + " bytes, expected " +
        std::to_string(header_.slot_bytes()) +
        "); delete the offload directory and restore the optimizer state from a checkpoint");
  }
  // The other slot is scratch: whatever a crash left there is overwritten by the next update.
  slots_[1 - active] =
      OffloadFile(file_path(std::to_string(1 - active)), OffloadFile::Mode::open_or_create);
  slots_[1 - active].reserve(header_.slot_bytes());
}

int64_t OffloadedAdamWState::step_buffer_bytes() const {
  ChunkStreamPlan plan;
  plan.destination = const_cast<OffloadFile*>(&slots_[0]);
  plan.numel = header_.numel;
  plan.chunk_elements = header_.chunk_elements;
  plan.streams = header_.streams;
  plan.end_chunk = header_.chunk_count();
  plan.read_ahead = settings_.read_ahead;
  return chunk_stream_buffer_bytes(plan);
}

void OffloadedAdamWState::commit(std::vector<uint32_t> crcs, int64_t last_step) {
  const int target = 1 - header_.active_slot;
  if (settings_.durable) slots_[target].sync();
  OffloadHeader next = header_;
  next.active_slot = target;
  next.generation = header_.generation + 1;
  next.last_step = last_step;
  next.chunk_crcs = std::move(crcs);
  const std::vector<uint8_t> bytes = next.encode();
  offload_write_atomically(file_path("header"), bytes.data(), bytes.size(), settings_.durable);
  header_ = std::move(next);
}

template <class Visit>
void OffloadedAdamWState::update_all(Visit&& visit, int64_t last_step) {
  std::vector<uint32_t> crcs(header_.chunk_crcs.size());
  ChunkStreamPlan plan;
  plan.source = &slots_[header_.active_slot];
  plan.destination = &slots_[1 - header_.active_slot];
  plan.numel = header_.numel;
  plan.chunk_elements = header_.chunk_elements;
  plan.streams = header_.streams;
  plan.end_chunk = header_.chunk_count();
  plan.source_crcs = &header_.chunk_crcs;
  plan.destination_crcs = &crcs;
  plan.read_ahead = settings_.read_ahead;
  plan.tracker = tracker_;
  stream_chunks(plan, visit);
  commit(std::move(crcs), last_step);
}

void OffloadedAdamWState::step(float* params, const float* grads, std::span<const DecayRange> decay,
                               const kernels::AdamWHyper& hyper, int64_t step_number,
                               float grad_scale, const MasterSink& sink) {
  check(step_number >= 1, "offloaded AdamW: step number " + std::to_string(step_number) +
                              " is not 1-based; pass the number of updates including this one");
  check(grads != nullptr || header_.numel == 0, "offloaded AdamW: no gradients given");
  check(params != nullptr || settings_.master || header_.numel == 0,
        "offloaded AdamW: no parameters given; without the master option step() updates them in "
        "place");
  check_decay_ranges(decay, header_.numel);
  kernels::AdamWHyper no_decay = hyper;
  no_decay.weight_decay = 0.0;
  const bool master = settings_.master;
  update_all(
      [&](int64_t, float* data, int64_t begin, int64_t count) {
        float* m = data;
        float* v = data + count;
        float* p = master ? data + kMasterStream * count : params + begin;
        // Segments of this chunk alternate between no decay and a decay range.
        auto range =
            std::upper_bound(decay.begin(), decay.end(), begin,
                             [](int64_t x, const DecayRange& r) { return x < r.offset + r.count; });
        int64_t at = begin;
        const int64_t end = begin + count;
        while (at < end) {
          const bool inside = range != decay.end() && range->offset <= at;
          const int64_t until =
              range == decay.end()
                  ? end
                  : std::min(end, inside ? range->offset + range->count : range->offset);
          const kernels::AdamWTensor segment{p + (at - begin),         grads + at, m + (at - begin),
                                             v + (at - begin),         nullptr,    until - at,
                                             inside ? hyper : no_decay};
          ops_.adamw_update({&segment, 1}, step_number, grad_scale);
          at = until;
          if (inside && range != decay.end() && at == range->offset + range->count) ++range;
        }
        if (master && params) std::memcpy(params + begin, p, static_cast<size_t>(count) * 4);
        if (master && sink) sink(begin, p, count);
      },
      step_number);
}

void OffloadedAdamWState::read_streams(int64_t offset, int64_t count, float* const* outputs) const {
  check(offset >= 0 && count >= 0 && offset + count <= header_.numel,
        "offloaded AdamW: elements [" + std::to_string(offset) + ", " +
            std::to_string(offset + count) + ") lie outside the offloaded range of " +
            std::to_string(header_.numel) + "; pass offsets relative to the range's start");
  if (count == 0) return;
  ChunkStreamPlan plan;
  plan.source = &slots_[header_.active_slot];
  plan.numel = header_.numel;
  plan.chunk_elements = header_.chunk_elements;
  plan.streams = header_.streams;
  plan.first_chunk = offset / header_.chunk_elements;
  plan.end_chunk = (offset + count - 1) / header_.chunk_elements + 1;
  plan.source_crcs = &header_.chunk_crcs;
  plan.read_ahead = settings_.read_ahead;
  plan.tracker = tracker_;
  stream_chunks(plan, [&](int64_t, float* data, int64_t begin, int64_t n) {
    const int64_t from = std::max(begin, offset), to = std::min(begin + n, offset + count);
    for (int s = 0; s < header_.streams; ++s) {
      if (outputs[s] == nullptr) continue;
      std::memcpy(outputs[s] + (from - offset), data + s * n + (from - begin),
                  static_cast<size_t>(to - from) * sizeof(float));
    }
  });
}

void OffloadedAdamWState::write_streams(int64_t offset, int64_t count, const float* const* inputs) {
  check(offset >= 0 && count >= 0 && offset + count <= header_.numel,
        "offloaded AdamW: elements [" + std::to_string(offset) + ", " +
            std::to_string(offset + count) + ") lie outside the offloaded range of " +
            std::to_string(header_.numel) + "; pass offsets relative to the range's start");
  if (count == 0) return;
  update_all(
      [&](int64_t, float* data, int64_t begin, int64_t n) {
        const int64_t from = std::max(begin, offset), to = std::min(begin + n, offset + count);
        if (from >= to) return;
        for (int s = 0; s < header_.streams; ++s) {
          if (inputs[s] == nullptr) continue;
          std::memcpy(data + s * n + (from - begin), inputs[s] + (from - offset),
                      static_cast<size_t>(to - from) * sizeof(float));
        }
      },
      header_.last_step);
}

void OffloadedAdamWState::read_moments(int64_t offset, int64_t count, float* exp_avg,
                                       float* exp_avg_sq) const {
  float* outputs[3] = {exp_avg, exp_avg_sq, nullptr};
  read_streams(offset, count, outputs);
}

void OffloadedAdamWState::write_moments(int64_t offset, int64_t count, const float* exp_avg,
                                        const float* exp_avg_sq) {
  const float* inputs[3] = {exp_avg, exp_avg_sq, nullptr};
  write_streams(offset, count, inputs);
}

void OffloadedAdamWState::read_master(int64_t offset, int64_t count, float* master) const {
  check(settings_.master,
        "offloaded AdamW: read_master without the master option; enable master offload");
  float* outputs[3] = {nullptr, nullptr, master};
  read_streams(offset, count, outputs);
}

void OffloadedAdamWState::write_master(int64_t offset, int64_t count, const float* master) {
  check(settings_.master,
        "offloaded AdamW: write_master without the master option; enable master offload");
  const float* inputs[3] = {nullptr, nullptr, master};
  write_streams(offset, count, inputs);
}

}  // namespace lattice::optim
