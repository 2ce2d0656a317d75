// ShardedAdamW: see sharded_adamw.hpp.
#include "lattice/parallel/sharded_adamw.hpp"

#include <algorithm>

#include "lattice/core/error.hpp"

namespace lattice::parallel {

ShardedAdamW::ShardedAdamW(kernels::Ops& ops, const model::ParameterStore& store,
                           const BucketLayout& layout, int zero_stage, int shard_rank,
                           int expert_rank, optim::AdamWSettings settings,
                           const std::string& offload_directory, MemoryTracker* tracker)
    : layout_(layout),
      zero_stage_(zero_stage),
      shard_rank_(shard_rank),
      expert_rank_(expert_rank),
      settings_(settings),
      tracker_(tracker),
      ops_(ops) {
  const int64_t elements = state_elements();
  if (offload_directory.empty()) {
    m_ = Tensor({elements}, DType::f32, ops_.memory(), tracker, MemoryCategory::optimizer_state);
    v_ = Tensor({elements}, DType::f32, ops_.memory(), tracker, MemoryCategory::optimizer_state);
    return;
  }
  optim::OffloadSettings offload;
  offload.directory = offload_directory;
  offload_ = std::make_unique<optim::OffloadedAdamWState>(ops_, offload, elements, tracker);
  // Weight decay ranges in state offsets (sorted, disjoint).
  if (zero_stage_ == 0) {
    for (const auto& p : store.parameters())
      if (p.weight_decay) decay_.push_back({p.offset, p.numel});
    return;
  }
  for (const Bucket& bucket : layout_.buckets()) {
    const int rank = rank_in(bucket);
    const int64_t lo = bucket.shard_begin(rank), hi = bucket.shard_end(rank);
    const int64_t base = bucket.begin + bucket.shard * rank;
    for (const auto& p : store.parameters()) {
      const int64_t a = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
      if (p.weight_decay && a < e) decay_.push_back({bucket.shard_offset + a - base, e - a});
    }
  }
  std::sort(decay_.begin(), decay_.end(),
            [](const auto& x, const auto& y) { return x.offset < y.offset; });
}

int64_t ShardedAdamW::state_elements() const {
  return zero_stage_ == 0 ? layout_.total_elements() : layout_.shard_elements();
}

void ShardedAdamW::step(model::ParameterStore& store, ZeroParameters& parameters,
                        const float* shard_grads, float lr, float clip) {
  ++step_;
  const optim::AdamWSettings& s = settings_;
  if (offload_) {
    const kernels::AdamWHyper hyper{lr, s.beta1, s.beta2, s.eps, s.weight_decay};
    if (zero_stage_ == 0) {
      offload_->step(store.mutable_values(), store.grads(), decay_, hyper, step_, clip);
    } else if (zero_stage_ == 3) {
      offload_->step(parameters.master_shards(), shard_grads, decay_, hyper, step_, clip);
    } else {
      // The shards' parameters side by side for the streamed update, then back in place.
      Tensor shard({layout_.shard_elements()}, DType::f32, ops_.memory(), tracker_,
                   MemoryCategory::other);
      for (const Bucket& bucket : layout_.buckets()) {
        const int rank = rank_in(bucket);
        ops_.copy(shard.f32() + bucket.shard_offset, store.values() + bucket.shard_begin(rank),
                  bucket.shard_end(rank) - bucket.shard_begin(rank));
      }
      offload_->step(shard.f32(), shard_grads, decay_, hyper, step_, clip);
      for (const Bucket& bucket : layout_.buckets()) {
        const int rank = rank_in(bucket);
        const int64_t n = bucket.shard_end(rank) - bucket.shard_begin(rank);
        ops_.copy(store.mutable_values() + bucket.shard_begin(rank),
                  shard.f32() + bucket.shard_offset, n);
      }
    }
    return;
  }
  if (zero_stage_ == 0) {
    optim::adamw_update_store(ops_, store, m_.f32(), v_.f32(), lr, s, step_, clip);
    return;
  }
  // This rank's shard of each bucket, parameter by parameter (the kernel is elementwise).
  for (const Bucket& bucket : layout_.buckets()) {
    const int rank = rank_in(bucket);
    const int64_t lo = bucket.shard_begin(rank), hi = bucket.shard_end(rank);
    const int64_t base = bucket.begin + bucket.shard * rank;
    float* params = parameters.shard_values(bucket);
    for (const auto& p : store.parameters()) {
      const int64_t a = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
      if (a >= e) continue;
      const int64_t local = a - base;  // position inside this rank's shard of the bucket
      const int64_t at = bucket.shard_offset + local;
      const kernels::AdamWHyper hyper{lr, s.beta1, s.beta2, s.eps,
                                      p.weight_decay ? s.weight_decay : 0.0f};
      kernels::AdamWTensor t;
      t.param = params + local;
      t.grad = shard_grads + at;
      t.m = m_.f32() + at;
      t.v = v_.f32() + at;
      t.n = e - a;
      t.hyper = hyper;
      ops_.adamw_update({&t, 1}, step_, clip);
    }
  }
}

void ShardedAdamW::import_state(const optim::AdamWOptimizer& full) {
  step_ = full.steps_taken();
  const int64_t elements = state_elements();
  Tensor staged_m, staged_v;  // offload: the state to write into the files
  if (offload_) {
    staged_m = Tensor({elements}, DType::f32);
    staged_v = Tensor({elements}, DType::f32);
  }
  float* m = offload_ ? staged_m.f32() : m_.f32();
  float* v = offload_ ? staged_v.f32() : v_.f32();
  // The full optimizer's moments are the backend's; the offload's staging is host memory.
  auto copy = [&](float* to, const float* from, int64_t n) {
    if (offload_)
      ops_.memory().copy(to, from, static_cast<size_t>(n) * sizeof(float),
                         CopyKind::device_to_host);
    else
      ops_.copy(to, from, n);
  };
  if (zero_stage_ == 0) {
    copy(m, full.exp_avg(), elements);
    copy(v, full.exp_avg_sq(), elements);
  } else {
    for (const Bucket& bucket : layout_.buckets()) {
      const int64_t lo = bucket.shard_begin(rank_in(bucket)),
                    hi = bucket.shard_end(rank_in(bucket));
      copy(m + bucket.shard_offset, full.exp_avg() + lo, hi - lo);
      copy(v + bucket.shard_offset, full.exp_avg_sq() + lo, hi - lo);
    }
  }
  if (offload_) offload_->write_moments(0, elements, m, v);
}

void ShardedAdamW::read_moments(int64_t begin, int64_t end, float* exp_avg,
                                float* exp_avg_sq) const {
  int64_t at = begin;  // the state offset of `begin`
  if (zero_stage_ > 0) {
    const auto& buckets = layout_.buckets();
    auto holds = [&](const Bucket& b) {
      return begin >= b.shard_begin(rank_in(b)) && end <= b.shard_end(rank_in(b));
    };
    auto it = std::find_if(buckets.begin(), buckets.end(), holds);
    check(it != buckets.end(), "optimizer state: elements [" + std::to_string(begin) + ", " +
                                   std::to_string(end) +
                                   ") are not inside this rank's shard of one bucket (internal "
                                   "error)");
    at = it->shard_offset + begin - (it->begin + it->shard * rank_in(*it));
  }
  if (offload_) {
    offload_->read_moments(at, end - begin, exp_avg, exp_avg_sq);
    return;
  }
  // Into the caller's host buffers (the checkpoint's).
  const size_t bytes = static_cast<size_t>(end - begin) * sizeof(float);
  ops_.memory().copy(exp_avg, m_.f32() + at, bytes, CopyKind::device_to_host);
  ops_.memory().copy(exp_avg_sq, v_.f32() + at, bytes, CopyKind::device_to_host);
}

void ShardedAdamW::copy_state(float* exp_avg, float* exp_avg_sq) const {
  check(!offload_,
        "a replica group's optimizer state is handed over from memory: run the groups without "
        "parallelism.offload_dir");
  const size_t bytes = static_cast<size_t>(state_elements()) * sizeof(float);
  ops_.memory().copy(exp_avg, m_.f32(), bytes, CopyKind::device_to_host);
  ops_.memory().copy(exp_avg_sq, v_.f32(), bytes, CopyKind::device_to_host);
}

void ShardedAdamW::load_state(const float* exp_avg, const float* exp_avg_sq, int64_t steps_taken) {
  check(!offload_,
        "a replica group's optimizer state is handed over from memory: run the groups without "
        "parallelism.offload_dir");
  const size_t bytes = static_cast<size_t>(state_elements()) * sizeof(float);
  ops_.memory().copy(m_.f32(), exp_avg, bytes, CopyKind::host_to_device);
  ops_.memory().copy(v_.f32(), exp_avg_sq, bytes, CopyKind::host_to_device);
  step_ = steps_taken;
}

}  // namespace lattice::parallel
