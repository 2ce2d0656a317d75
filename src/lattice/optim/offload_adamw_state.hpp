// OffloadedAdamWState: the AdamW moments (exp_avg, exp_avg_sq) -- and optionally the fp32 master
// weights -- of one contiguous range of the flat parameter buffer (a ZeRO shard, or a whole model)
// kept in files instead of memory (ZeRO-Infinity's optimizer offload). A step streams the state
// through a few chunk buffers with asynchronous read-ahead and write-back and runs the same AdamW
// kernel as AdamWOptimizer on each chunk, so results are bit-identical to the in-memory optimizer.
//
// Files in `directory` (one directory per instance; a lock refuses a second user):
//   adamw_state.header   which slot is valid, generation, last step, one CRC-32C per chunk
//   adamw_state.0 / .1   two slots, each holding the whole state chunk after chunk
//   adamw_state.lock     the lock
// Crash safety: every update (a step or a write_*) reads the valid slot, writes the other one,
// syncs it and then commits by renaming a new header into place. A crash at any point leaves the
// header naming the old, complete slot; a half-written slot is never treated as valid. Cost: twice
// the disk space, no extra I/O.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "lattice/core/memory.hpp"
#include "lattice/kernels/ops.hpp"
#include "lattice/model/parameter_store.hpp"
#include "lattice/optim/offload_file.hpp"
#include "lattice/optim/offload_header.hpp"

namespace lattice::optim {

struct OffloadSettings {
  std::string directory;
  int64_t chunk_elements = 1 << 20;  // elements per streamed chunk
  int read_ahead = 2;                // chunks read ahead of the one being updated
  // Also keep the fp32 master weights of the range in the files. step() then takes them from the
  // file and hands the updated values to the caller. Saves memory only when the caller does not
  // hold the fp32 range between steps (see docs/parallelism.md, "Offload").
  bool master = false;
  // Continue from the committed state already in `directory` (same numel and master setting)
  // instead of starting from zero moments.
  bool resume = false;
  // fdatasync the new slot and the header before each commit (survives power loss, not only a
  // process crash).
  bool durable = true;
};

// Receives each updated chunk of master weights during a master-offload step: elements
// [offset, offset + count) of the range (e.g. to round them into the caller's bf16 copy).
using MasterSink = std::function<void(int64_t offset, const float* master, int64_t count)>;

// Elements [offset, offset + count) of the range take weight decay; all others do not.
struct DecayRange {
  int64_t offset = 0;
  int64_t count = 0;
};

// The decay layout of elements [begin, end) of `store`'s flat buffer (a shard): the parameters
// that take weight decay (AdamWOptimizer's rule), as ranges relative to `begin`.
std::vector<DecayRange> decay_ranges(const model::ParameterStore& store, int64_t begin,
                                     int64_t end);

class OffloadedAdamWState {
 public:
  // Creates `settings.directory` when missing and reserves the disk space of both slots (a full
  // disk fails here), or with `resume` opens and validates the state there. Each step's update
  // runs on `ops` (its chunk buffers are host memory: a host backend's).
  OffloadedAdamWState(kernels::Ops& ops, OffloadSettings settings, int64_t numel,
                      MemoryTracker* tracker);

  // One AdamW update of the range, as kernels::Ops::adamw_update with step number `step_number`
  // (1-based) and gradient scale `grad_scale`; `hyper.weight_decay` applies inside `decay` (sorted,
  // disjoint, within the range), 0 elsewhere. Without `master`, `params` is updated in place. With
  // `master`, the file's master weights are updated and copied to `params` (its old values are
  // not read; nullptr: not copied) and handed chunk by chunk to `sink` when given.
  void step(float* params, const float* grads, std::span<const DecayRange> decay,
            const kernels::AdamWHyper& hyper, int64_t step_number, float grad_scale = 1.0f,
            const MasterSink& sink = {});

  // Checkpoint support: elements [offset, offset + count) of the range. Each write_* is one
  // committed transaction that passes once over the whole state: restore with one call per range,
  // not per parameter.
  void read_moments(int64_t offset, int64_t count, float* exp_avg, float* exp_avg_sq) const;
  void write_moments(int64_t offset, int64_t count, const float* exp_avg, const float* exp_avg_sq);
  // Only with `master`.
  void read_master(int64_t offset, int64_t count, float* master) const;
  void write_master(int64_t offset, int64_t count, const float* master);

  int64_t numel() const { return header_.numel; }
  const OffloadSettings& settings() const { return settings_; }
  uint64_t generation() const { return header_.generation; }
  int64_t last_step() const { return header_.last_step; }
  // Disk bytes of both slots, and the chunk-buffer bytes a step holds in memory (the tracked peak).
  int64_t disk_bytes() const { return 2 * header_.slot_bytes(); }
  int64_t step_buffer_bytes() const;

 private:
  std::string file_path(const std::string& suffix) const;
  void create_fresh();
  void open_existing();
  void read_streams(int64_t offset, int64_t count, float* const* outputs) const;
  void write_streams(int64_t offset, int64_t count, const float* const* inputs);
  // Streams every chunk from the valid slot through `visit` into the other slot and commits it.
  template <class Visit>
  void update_all(Visit&& visit, int64_t last_step);
  void commit(std::vector<uint32_t> crcs, int64_t last_step);

  kernels::Ops& ops_;
  OffloadSettings settings_;
  MemoryTracker* tracker_;
  OffloadHeader header_;
  OffloadFile lock_;
  OffloadFile slots_[2];
};

}  // namespace lattice::optim
