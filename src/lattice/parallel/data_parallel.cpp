// DataParallel (plain DP and ZeRO-1/2/3): see data_parallel.hpp.
#include "lattice/parallel/data_parallel.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/adamw.hpp"
#include "lattice/parallel/global_norm.hpp"
#include "lattice/parallel/released_memory.hpp"

namespace lattice::parallel {

namespace {

using Clock = std::chrono::steady_clock;

uint64_t fnv1a(const void* data, size_t bytes, uint64_t hash = 1469598103934665603ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 1099511628211ull;
  return hash;
}

// Ranks that shard the state: all of them, or the HSDP group size (which must divide them).
int shard_size_of(const DataParallelSettings& settings, const comm::Communicator& group) {
  const int size = settings.shard_group_size > 0 ? settings.shard_group_size : group.size();
  check(group.size() % size == 0, "parallelism.hsdp_shard_size = " + std::to_string(size) +
                                      " does not divide the " + std::to_string(group.size()) +
                                      " data-parallel ranks: choose a divisor");
  return size;
}

}  // namespace

void validate(const DataParallelSettings& settings) {
  check(settings.zero_stage >= 0 && settings.zero_stage <= 3,
        "parallelism.zero = " + std::to_string(settings.zero_stage) +
            " is not a ZeRO stage: use 0 (plain data parallelism), 1, 2 or 3");
  check(settings.shard_group_size >= 0,
        "parallelism.hsdp_shard_size must not be negative (0 shards over every rank)");
  check(settings.shard_group_size == 0 || settings.zero_stage >= 1,
        "parallelism.hsdp_shard_size needs a ZeRO stage to shard with: set parallelism.zero to 1, "
        "2 or 3");
  check(settings.bucket_elements > 0,
        "parallelism.bucket_mb must be positive (25 is a good default)");
}

// What is in flight for one bucket.
struct DataParallel::BucketState {
  Tensor grad_staging;  // N·shard: the pre-scaled local gradients being reduced
  Tensor reduced;       // stage 0: this rank's reduced shard, gathered into the gradients
  std::vector<int64_t> gather_counts;  // stage 0: each rank's real elements of the bucket's shard
  comm::CommHandle reduction;
  bool reducing = false;
  Tensor gather_in, gather_out;  // parameter all-gather: this rank's shard, then N·shard
  comm::CommHandle gather;
  bool gathering = false;
  bool params_resident = true;  // stage 3: the model's parameter pages hold this bucket
  bool grads_resident = true;   // stages 2-3: the model's gradient pages hold this bucket
};

DataParallel::DataParallel(model::Transformer& model, comm::Communicator& group,
                           DataParallelSettings settings, optim::AdamWSettings adamw,
                           MemoryTracker* tracker)
    : model_(model),
      group_(group),
      settings_(settings),
      adamw_(adamw),
      tracker_(tracker),
      layout_((validate(settings), model.units()), settings.bucket_elements,
              shard_size_of(settings, group)) {
  if (layout_.ranks() < group.size()) {  // HSDP: consecutive ranks shard, groups replicate
    own_shard_ = group.split(group.rank() / layout_.ranks(), group.rank());
    replicate_ = group.split(group.rank() % layout_.ranks(), group.rank());
    shard_ = own_shard_.get();
  } else {
    shard_ = &group_;
  }
  check(layout_.total_elements() == model.parameters().size(),
        "data parallelism: the model's units do not cover its parameters (internal error)");
  // Placements: data parallelism averages and shards only what every batch rank holds alike.
  for (const auto& p : model.parameters().parameters())
    for (mesh::Axis axis : {mesh::Axis::dp, mesh::Axis::cp})
      check(p.replicated.contains(axis),
            "data parallelism: parameter '" + p.name + "' is not replicated over " +
                std::string(mesh::axis_name(axis)) +
                ", so its gradient cannot be averaged over the batch ranks (internal error: "
                "such parameters need their own reduction group)");
  norm_classes_ = NormClasses(model.parameters(), mesh::AxisGroups{});
  for (size_t b = 0; b < layout_.buckets().size(); ++b)
    state_.push_back(std::make_unique<BucketState>());
  const int stage = settings_.zero_stage;
  const int64_t state_elements = stage == 0 ? layout_.total_elements() : layout_.shard_elements();
  if (settings_.offload_dir.empty()) {
    m_ = Tensor({state_elements}, DType::f32, tracker, MemoryCategory::optimizer_state);
    v_ = Tensor({state_elements}, DType::f32, tracker, MemoryCategory::optimizer_state);
  } else {
    optim::OffloadSettings offload;
    offload.directory = settings_.offload_dir + "/rank" + std::to_string(group_.rank());
    offload_ = std::make_unique<optim::OffloadedAdamWState>(offload, state_elements, tracker);
    // Weight decay ranges in state offsets (sorted, disjoint).
    if (stage == 0) {
      for (const auto& p : model_.parameters().parameters())
        if (p.weight_decay) decay_.push_back({p.offset, p.numel});
    } else {
      for (const Bucket& bucket : layout_.buckets()) {
        const int64_t lo = bucket.shard_begin(shard_rank()), hi = bucket.shard_end(shard_rank());
        const int64_t base = bucket.begin + bucket.shard * shard_rank();
        for (const auto& p : model_.parameters().parameters()) {
          const int64_t a = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
          if (p.weight_decay && a < e) decay_.push_back({bucket.shard_offset + a - base, e - a});
        }
      }
      std::sort(decay_.begin(), decay_.end(),
                [](const auto& x, const auto& y) { return x.offset < y.offset; });
    }
  }
  if (stage >= 1)
    shard_grads_ =
        Tensor({layout_.shard_elements()}, DType::f32, tracker, MemoryCategory::gradients);
  if (stage == 3) {
    shard_params_ =
        Tensor({layout_.shard_elements()}, DType::f32, tracker, MemoryCategory::parameters);
    const float* values = model_.parameters().values();
    for (size_t b = 0; b < layout_.buckets().size(); ++b) {
      const Bucket& bucket = layout_.buckets()[b];
      const int64_t lo = bucket.shard_begin(shard_rank()), hi = bucket.shard_end(shard_rank());
      std::copy(values + lo, values + hi, shard_params_.f32() + bucket.shard_offset);
      if (!bucket.outer) release_parameters(static_cast<int>(b));
    }
  }
}

DataParallel::~DataParallel() {
  // Finish whatever is in flight (buffers must outlive it), then give the tracker back the bytes
  // it was told were released, so the model's buffers leave it balanced.
  for (size_t b = 0; b < state_.size(); ++b) {
    BucketState& s = *state_[b];
    try {
      s.reduction.wait();
      s.gather.wait();
    } catch (...) {
    }
    const int64_t bytes = layout_.buckets()[b].size() * int64_t{sizeof(float)};
    if (tracker_ && !s.params_resident) tracker_->add(MemoryCategory::parameters, bytes);
    if (tracker_ && !s.grads_resident) tracker_->add(MemoryCategory::gradients, bytes);
  }
}

void DataParallel::wait(comm::CommHandle& handle) {
  const auto start = Clock::now();
  handle.wait();
  exposed_seconds_ += std::chrono::duration<double>(Clock::now() - start).count();
}

float* DataParallel::shard_parameters(const Bucket& bucket) {
  return settings_.zero_stage == 3
             ? shard_params_.f32() + bucket.shard_offset
             : model_.parameters().mutable_values() + bucket.shard_begin(shard_rank());
}

void DataParallel::begin_micro_batch(bool first, bool last) {
  last_micro_ = last;
  // Stages 2-3 leave the gradient pages released (zero) after each reduction; 0-1 zero them here.
  if (first && settings_.zero_stage <= 1) model_.parameters().zero_grads();
}

// --- gradients ---

void DataParallel::launch_reduction(int b) {
  const Bucket& bucket = layout_.buckets()[static_cast<size_t>(b)];
  BucketState& s = *state_[static_cast<size_t>(b)];
  if (s.reducing) return;
  const int64_t padded = bucket.shard * shard_ranks();
  // Stage 0 keeps its reduction buffers from step to step (as DDP keeps its buckets): allocating
  // them anew each step cost a zeroing pass and, for blocks of 2 MiB and more, fresh page faults.
  // Stages 1-3 free them after each reduction (their point is memory). The padding past the
  // bucket's end is zero from allocation and nothing writes it.
  if (settings_.zero_stage != 0 || s.grad_staging.numel() != padded)
    s.grad_staging = Tensor({padded}, DType::f32, tracker_, MemoryCategory::other);
  // Averaging: every rank scales by 1/N before the sum (exact for powers of two).
  const float scale = 1.0f / static_cast<float>(ranks());
  float* grads = model_.parameters().grads() + bucket.begin;
  float* staging = s.grad_staging.f32();
  for (int64_t i = 0; i < bucket.size(); ++i) staging[i] = grads[i] * scale;
  if (settings_.zero_stage >= 2) {
    release_floats(grads, bucket.size());
    if (tracker_ && s.grads_resident)
      tracker_->remove(MemoryCategory::gradients, bucket.size() * int64_t{sizeof(float)});
    s.grads_resident = false;
  }
  if (settings_.zero_stage == 0) {
    if (s.reduced.numel() != bucket.shard)
      s.reduced = Tensor({bucket.shard}, DType::f32, tracker_, MemoryCategory::other);
    shard_->reduce_scatter_async(staging, s.reduced.f32(), bucket.shard, DType::f32,
                                 comm::ReduceOp::sum);
    // The reduced shards are gathered straight into the gradients (no copy back from staging):
    // each rank contributes the real elements of its shard, the padding past the bucket's end
    // stays behind.
    if (s.gather_counts.empty()) {
      for (int r = 0; r < shard_ranks(); ++r)
        s.gather_counts.push_back(bucket.shard_end(r) - bucket.shard_begin(r));
    }
    s.reduction = shard_->all_gather_v_async(s.reduced.f32(), grads, s.gather_counts, DType::f32);
  } else {
    s.reduction = shard_->reduce_scatter_async(staging, shard_grads_.f32() + bucket.shard_offset,
                                               bucket.shard, DType::f32, comm::ReduceOp::sum);
  }
  s.reducing = true;
}

double DataParallel::finish_gradients() {
  for (size_t b = 0; b < state_.size(); ++b) launch_reduction(static_cast<int>(b));
  for (size_t b = 0; b < state_.size(); ++b) {
    BucketState& s = *state_[b];
    wait(s.reduction);
    s.reducing = false;
    if (settings_.zero_stage != 0) s.grad_staging.reset();  // stage 0 keeps it for the next step
    // HSDP: the groups' shards are summed across the replicas.
    if (replicate_)
      s.reduction =
          replicate_->allreduce_async(shard_grads_.f32() + layout_.buckets()[b].shard_offset,
                                      layout_.buckets()[b].shard, DType::f32, comm::ReduceOp::sum);
  }
  if (replicate_)
    for (auto& s : state_) wait(s->reduction);
  if (settings_.zero_stage == 0)
    return replicated_gradient_norm(layout_, model_.parameters().grads(), norm_classes_);
  const auto start = Clock::now();
  const double norm = sharded_gradient_norm(layout_, shard_grads_.f32(), *shard_, norm_classes_);
  exposed_seconds_ += std::chrono::duration<double>(Clock::now() - start).count();
  return norm;
}

// --- update ---

void DataParallel::update(float lr, double norm) {
  float clip = 1.0f;
  if (adamw_.max_grad_norm > 0) {
    // As torch.nn.utils.clip_grad_norm_ (and AdamWOptimizer): fp32 coefficient capped at 1.
    const float coefficient = adamw_.max_grad_norm / (static_cast<float>(norm) + 1e-6f);
    clip = coefficient < 1.0f ? coefficient : 1.0f;
  }
  ++step_;
  model::ParameterStore& store = model_.parameters();
  auto hyper_for = [&](const model::ParameterInfo& p) {
    return kernels::AdamWHyper{lr, adamw_.beta1, adamw_.beta2, adamw_.eps,
                               p.weight_decay ? adamw_.weight_decay : 0.0f};
  };
  if (offload_) {
    const kernels::AdamWHyper hyper{lr, adamw_.beta1, adamw_.beta2, adamw_.eps,
                                    adamw_.weight_decay};
    if (settings_.zero_stage == 0) {
      offload_->step(store.mutable_values(), store.grads(), decay_, hyper, step_, clip);
    } else if (settings_.zero_stage == 3) {
      offload_->step(shard_params_.f32(), shard_grads_.f32(), decay_, hyper, step_, clip);
    } else {
      // The shards' parameters side by side for the streamed update, then back in place.
      Tensor shard({layout_.shard_elements()}, DType::f32, tracker_, MemoryCategory::other);
      for (const Bucket& bucket : layout_.buckets())
        std::copy(store.values() + bucket.shard_begin(shard_rank()),
                  store.values() + bucket.shard_end(shard_rank()),
                  shard.f32() + bucket.shard_offset);
      offload_->step(shard.f32(), shard_grads_.f32(), decay_, hyper, step_, clip);
      for (const Bucket& bucket : layout_.buckets()) {
        const int64_t n = bucket.shard_end(shard_rank()) - bucket.shard_begin(shard_rank());
        std::copy(shard.f32() + bucket.shard_offset, shard.f32() + bucket.shard_offset + n,
                  store.mutable_values() + bucket.shard_begin(shard_rank()));
      }
    }
    if (settings_.zero_stage >= 1)
      for (size_t b = 0; b < state_.size(); ++b)
        if (settings_.zero_stage < 3 || layout_.buckets()[b].outer)
          start_gather(static_cast<int>(b));
  } else if (settings_.zero_stage == 0) {
    optim::adamw_update_store(store, m_.f32(), v_.f32(), lr, adamw_, step_, clip);
  } else {
    // This rank's shard of each bucket, parameter by parameter (the kernel is elementwise).
    for (const Bucket& bucket : layout_.buckets()) {
      const int64_t lo = bucket.shard_begin(shard_rank()), hi = bucket.shard_end(shard_rank());
      const int64_t base = bucket.begin + bucket.shard * shard_rank();
      float* params = shard_parameters(bucket);
      for (const auto& p : store.parameters()) {
        const int64_t a = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
        if (a >= e) continue;
        const int64_t local = a - base;  // position inside this rank's shard of the bucket
        kernels::adamw_update(params + local, shard_grads_.f32() + bucket.shard_offset + local,
                              m_.f32() + bucket.shard_offset + local,
                              v_.f32() + bucket.shard_offset + local, e - a, hyper_for(p), step_,
                              clip);
      }
    }
    for (size_t b = 0; b < state_.size(); ++b) {
      const Bucket& bucket = layout_.buckets()[b];
      if (settings_.zero_stage < 3 || bucket.outer) start_gather(static_cast<int>(b));
    }
  }
  if (settings_.check_replicas) check_replicas();
}

// --- parameter gathers (stages 1-3) ---

void DataParallel::start_gather(int b) {
  BucketState& s = *state_[static_cast<size_t>(b)];
  if (s.gathering) return;
  const Bucket& bucket = layout_.buckets()[static_cast<size_t>(b)];
  const int64_t real = bucket.shard_end(shard_rank()) - bucket.shard_begin(shard_rank());
  s.gather_in = Tensor({bucket.shard}, DType::f32, tracker_, MemoryCategory::other);
  const float* shard = shard_parameters(bucket);
  std::copy(shard, shard + real, s.gather_in.f32());
  s.gather_out =
      Tensor({bucket.shard * shard_ranks()}, DType::f32, tracker_, MemoryCategory::other);
  s.gather =
      shard_->all_gather_async(s.gather_in.f32(), s.gather_out.f32(), bucket.shard, DType::f32);
  s.gathering = true;
}

void DataParallel::finish_gather(int b) {
  BucketState& s = *state_[static_cast<size_t>(b)];
  if (!s.gathering) return;
  wait(s.gather);
  s.gathering = false;
  const Bucket& bucket = layout_.buckets()[static_cast<size_t>(b)];
  std::copy(s.gather_out.f32(), s.gather_out.f32() + bucket.size(),
            model_.parameters().mutable_values() + bucket.begin);
  if (tracker_ && !s.params_resident)
    tracker_->add(MemoryCategory::parameters, bucket.size() * int64_t{sizeof(float)});
  s.params_resident = true;
  s.gather_in.reset();
  s.gather_out.reset();
}

void DataParallel::release_parameters(int b) {
  BucketState& s = *state_[static_cast<size_t>(b)];
  if (!s.params_resident) return;
  const Bucket& bucket = layout_.buckets()[static_cast<size_t>(b)];
  release_floats(model_.parameters().mutable_values() + bucket.begin, bucket.size());
  if (tracker_)
    tracker_->remove(MemoryCategory::parameters, bucket.size() * int64_t{sizeof(float)});
  s.params_resident = false;
}

void DataParallel::settle_parameters(bool full) {
  for (size_t b = 0; b < state_.size(); ++b) {
    const int bucket = static_cast<int>(b);
    if (full && settings_.zero_stage == 3 && !state_[b]->params_resident) start_gather(bucket);
    finish_gather(bucket);
  }
}

// --- hooks ---

void DataParallel::before_forward(int unit) {
  const int b = layout_.bucket_of_unit(unit);
  const Bucket& bucket = layout_.buckets()[static_cast<size_t>(b)];
  if (unit != bucket.first_unit) return;
  BucketState& s = *state_[static_cast<size_t>(b)];
  if (settings_.zero_stage == 3 && !s.params_resident) start_gather(b);
  finish_gather(b);
  // ZeRO-3: prefetch the next bucket in forward order (buckets are stored in backward order).
  if (settings_.zero_stage == 3 && b > 0) {
    const Bucket& next = layout_.buckets()[static_cast<size_t>(b - 1)];
    if (!next.outer && !state_[static_cast<size_t>(b - 1)]->params_resident) start_gather(b - 1);
  }
}

void DataParallel::after_forward(int unit) {
  const int b = layout_.bucket_of_unit(unit);
  const Bucket& bucket = layout_.buckets()[static_cast<size_t>(b)];
  if (settings_.zero_stage == 3 && !bucket.outer && unit == bucket.last_unit) release_parameters(b);
}

void DataParallel::before_backward(int unit) {
  const int b = layout_.bucket_of_unit(unit);
  const Bucket& bucket = layout_.buckets()[static_cast<size_t>(b)];
  if (unit != bucket.last_unit) return;
  BucketState& s = *state_[static_cast<size_t>(b)];
  if (settings_.zero_stage == 3) {
    if (!s.params_resident) start_gather(b);
    finish_gather(b);
    const int next = b + 1;  // next in backward order
    if (next < static_cast<int>(state_.size()) &&
        !layout_.buckets()[static_cast<size_t>(next)].outer &&
        !state_[static_cast<size_t>(next)]->params_resident)
      start_gather(next);
  }
  // The backward is about to write this bucket's gradient pages again.
  if (tracker_ && !s.grads_resident)
    tracker_->add(MemoryCategory::gradients, bucket.size() * int64_t{sizeof(float)});
  s.grads_resident = true;
}

void DataParallel::after_backward(int unit) {
  const int b = layout_.bucket_of_unit(unit);
  const Bucket& bucket = layout_.buckets()[static_cast<size_t>(b)];
  if (unit != bucket.first_unit) return;
  if (settings_.zero_stage == 3 && !bucket.outer) release_parameters(b);
  // Every gradient of the bucket is final once its lowest unit's backward is done (a tied head's
  // weight is the embedding's, whose unit comes last in backward).
  if (last_micro_) launch_reduction(b);
}

// --- metrics, checks, checkpoints ---

double DataParallel::average(double value) {
  std::vector<double> all(static_cast<size_t>(ranks()));
  const auto start = Clock::now();
  group_.all_gather(&value, all.data(), 1, DType::i64);  // doubles travel as 64-bit integers
  exposed_seconds_ += std::chrono::duration<double>(Clock::now() - start).count();
  double sum = 0;
  for (double v : all) sum += v;
  return sum / static_cast<double>(ranks());
}

void DataParallel::check_replicas() {
  settle_parameters();
  const model::ParameterStore& store = model_.parameters();
  uint64_t hash = 1469598103934665603ull;
  for (size_t b = 0; b < state_.size(); ++b) {
    const Bucket& bucket = layout_.buckets()[b];
    if (state_[b]->params_resident)  // ZeRO-3 shards are not replicated: hash what is whole
      hash = fnv1a(store.values() + bucket.begin, static_cast<size_t>(bucket.size()) * 4, hash);
  }
  std::vector<uint64_t> all(static_cast<size_t>(ranks()));
  group_.all_gather(&hash, all.data(), 1, DType::i64);
  for (int r = 1; r < ranks(); ++r)
    check(all[static_cast<size_t>(r)] == all[0],
          "replica check: the parameters of data-parallel rank " + std::to_string(r) +
              " differ from rank 0's after step " + std::to_string(step_) +
              ": the ranks diverged (non-deterministic kernel or corrupted reduction)");
}

void DataParallel::export_state(optim::AdamWOptimizer* full) {
  check(rank() != 0 || full != nullptr, "export_state: rank 0 needs a full optimizer state");
  if (full) full->set_steps_taken(step_);
  // The moments of this rank: in memory, or read back from the offload files.
  Tensor read_m, read_v;
  const float *m = m_.empty() ? nullptr : m_.f32(), *v = v_.empty() ? nullptr : v_.f32();
  if (offload_) {
    read_m = Tensor({offload_->numel()}, DType::f32);
    read_v = Tensor({offload_->numel()}, DType::f32);
    offload_->read_moments(0, offload_->numel(), read_m.f32(), read_v.f32());
    m = read_m.f32();
    v = read_v.f32();
  }
  if (settings_.zero_stage == 0) {
    if (full) {
      const int64_t n = layout_.total_elements();
      std::copy(m, m + n, full->exp_avg());
      std::copy(v, v + n, full->exp_avg_sq());
    }
    return;
  }
  // Rank 0 of the data-parallel group is rank 0 of its shard group, which holds every shard.
  for (const Bucket& bucket : layout_.buckets()) {
    Tensor gathered({bucket.shard * shard_ranks()}, DType::f32);
    for (auto [source, target] : {std::pair{m, full ? full->exp_avg() : nullptr},
                                  std::pair{v, full ? full->exp_avg_sq() : nullptr}}) {
      shard_->all_gather(source + bucket.shard_offset, gathered.f32(), bucket.shard, DType::f32);
      if (target) std::copy(gathered.f32(), gathered.f32() + bucket.size(), target + bucket.begin);
    }
  }
}

void DataParallel::import_state(const optim::AdamWOptimizer& full) {
  step_ = full.steps_taken();
  const int64_t state_elements =
      settings_.zero_stage == 0 ? layout_.total_elements() : layout_.shard_elements();
  Tensor staged_m, staged_v;  // offload: the state to write into the files
  if (offload_) {
    staged_m = Tensor({state_elements}, DType::f32);
    staged_v = Tensor({state_elements}, DType::f32);
  }
  float* m = offload_ ? staged_m.f32() : m_.f32();
  float* v = offload_ ? staged_v.f32() : v_.f32();
  if (settings_.zero_stage == 0) {
    std::copy(full.exp_avg(), full.exp_avg() + state_elements, m);
    std::copy(full.exp_avg_sq(), full.exp_avg_sq() + state_elements, v);
  }
  const float* values = model_.parameters().values();
  for (size_t b = 0; settings_.zero_stage > 0 && b < layout_.buckets().size(); ++b) {
    const Bucket& bucket = layout_.buckets()[b];
    const int64_t lo = bucket.shard_begin(shard_rank()), hi = bucket.shard_end(shard_rank());
    std::copy(full.exp_avg() + lo, full.exp_avg() + hi, m + bucket.shard_offset);
    std::copy(full.exp_avg_sq() + lo, full.exp_avg_sq() + hi, v + bucket.shard_offset);
    if (settings_.zero_stage == 3) {
      // The loaded weights are whole in the model: keep this rank's shard, release the rest.
      if (tracker_ && !state_[b]->params_resident)
        tracker_->add(MemoryCategory::parameters, bucket.size() * int64_t{sizeof(float)});
      state_[b]->params_resident = true;
      std::copy(values + lo, values + hi, shard_params_.f32() + bucket.shard_offset);
      if (!bucket.outer) release_parameters(static_cast<int>(b));
    }
  }
  if (offload_) offload_->write_moments(0, state_elements, m, v);
}

CommunicationTimes DataParallel::take_communication_times() {
  CommunicationTimes times;
  times.exposed_seconds = exposed_seconds_;
  exposed_seconds_ = 0;
  const comm::Communicator* groups[3] = {&group_, own_shard_.get(), replicate_.get()};
  for (int g = 0; g < 3; ++g) {
    if (!groups[g]) continue;
    uint64_t newest = traced_seq_[g];
    for (const comm::CollectiveRecord& r : groups[g]->trace().recent()) {
      if (r.seq <= traced_seq_[g] || r.state != comm::RecordState::completed) continue;
      times.total_seconds += static_cast<double>(r.finished_ns - r.entered_ns) * 1e-9;
      newest = std::max(newest, r.seq);
    }
    traced_seq_[g] = newest;
  }
  return times;
}

}  // namespace lattice::parallel
