// ZeroParameters: see zero_parameters.hpp.
#include "lattice/parallel/zero_parameters.hpp"

#include <algorithm>

#include "lattice/core/error.hpp"

namespace lattice::parallel {

struct ZeroParameters::BucketState {
  Tensor gather_in, gather_out;  // parameter all-gather: this rank's shard, then N·shard
  comm::CommHandle gather;
  bool gathering = false;
  bool params_resident = true;  // stage 3: the model's parameter pages hold this bucket
};

ZeroParameters::ZeroParameters(kernels::Ops& ops, model::ParameterStore& store,
                               const BucketLayout& layout, int zero_stage,
                               comm::Communicator& shard_group, comm::Communicator* expert_group,
                               MemoryTracker* tracker, CommunicationClock& clock)
    : ops_(ops),
      store_(store),
      layout_(layout),
      zero_stage_(zero_stage),
      shard_(shard_group),
      expert_(expert_group),
      tracker_(tracker),
      clock_(clock) {
  for (size_t b = 0; b < layout_.buckets().size(); ++b) {
    check(!layout_.buckets()[b].expert || expert_ != nullptr,
          "ZeRO: expert buckets without an expert group (internal error)");
    state_.push_back(std::make_unique<BucketState>());
  }
  if (zero_stage_ == 3) {
    shard_params_ = Tensor({layout_.shard_elements()}, DType::f32, ops_.memory(), tracker,
                           MemoryCategory::parameters);
    const float* values = store_.values();
    for (size_t b = 0; b < layout_.buckets().size(); ++b) {
      const Bucket& bucket = layout_.buckets()[b];
      const int64_t lo = bucket.shard_begin(rank_in(bucket)),
                    hi = bucket.shard_end(rank_in(bucket));
      ops_.copy(shard_params_.f32() + bucket.shard_offset, values + lo, hi - lo);
      if (!bucket.outer) release(static_cast<int>(b));
    }
  }
}

ZeroParameters::~ZeroParameters() {
  for (size_t b = 0; b < state_.size(); ++b) {
    BucketState& s = *state_[b];
    try {
      s.gather.wait();
    } catch (...) {
    }
    const int64_t bytes = layout_.buckets()[b].size() * int64_t{sizeof(float)};
    if (tracker_ && !s.params_resident) tracker_->add(MemoryCategory::parameters, bytes);
  }
}

float* ZeroParameters::shard_values(const Bucket& bucket) {
  return zero_stage_ == 3 ? shard_params_.f32() + bucket.shard_offset
                          : store_.mutable_values() + bucket.shard_begin(rank_in(bucket));
}

comm::Communicator& ZeroParameters::group_of(const Bucket& bucket) const {
  return bucket.expert ? *expert_ : shard_;
}

bool ZeroParameters::resident(int b) const {
  return state_[static_cast<size_t>(b)]->params_resident;
}

void ZeroParameters::gather_updated() {
  if (zero_stage_ == 0) return;
  for (size_t b = 0; b < state_.size(); ++b)
    if (zero_stage_ < 3 || layout_.buckets()[b].outer) start_gather(static_cast<int>(b));
}

void ZeroParameters::start_gather(int b) {
  BucketState& s = *state_[static_cast<size_t>(b)];
  if (s.gathering) return;
  const Bucket& bucket = layout_.buckets()[static_cast<size_t>(b)];
  const int64_t real = bucket.shard_end(rank_in(bucket)) - bucket.shard_begin(rank_in(bucket));
  s.gather_in = Tensor({bucket.shard}, DType::f32, ops_.memory(), tracker_, MemoryCategory::other);
  ops_.copy(s.gather_in.f32(), shard_values(bucket), real);
  comm::Communicator& group = group_of(bucket);
  s.gather_out = Tensor({bucket.shard * group.size()}, DType::f32, ops_.memory(), tracker_,
                        MemoryCategory::other);
  s.gather =
      group.all_gather_async(s.gather_in.f32(), s.gather_out.f32(), bucket.shard, DType::f32);
  s.gathering = true;
}

void ZeroParameters::finish_gather(int b) {
  BucketState& s = *state_[static_cast<size_t>(b)];
  if (!s.gathering) return;
  clock_.wait(s.gather);
  s.gathering = false;
  const Bucket& bucket = layout_.buckets()[static_cast<size_t>(b)];
  ops_.copy(store_.mutable_values() + bucket.begin, s.gather_out.f32(), bucket.size());
  if (tracker_ && !s.params_resident)
    tracker_->add(MemoryCategory::parameters, bucket.size() * int64_t{sizeof(float)});
  s.params_resident = true;
  s.gather_in.reset();
  s.gather_out.reset();
}

void ZeroParameters::release(int b) {
  BucketState& s = *state_[static_cast<size_t>(b)];
  if (!s.params_resident) return;
  const Bucket& bucket = layout_.buckets()[static_cast<size_t>(b)];
  ops_.memory().release(store_.mutable_values() + bucket.begin,
                        static_cast<size_t>(bucket.size()) * sizeof(float));
  if (tracker_)
    tracker_->remove(MemoryCategory::parameters, bucket.size() * int64_t{sizeof(float)});
  s.params_resident = false;
}

void ZeroParameters::settle(bool full) {
  for (size_t b = 0; b < state_.size(); ++b) {
    const int bucket = static_cast<int>(b);
    if (full && zero_stage_ == 3 && !state_[b]->params_resident) start_gather(bucket);
    finish_gather(bucket);
  }
}

void ZeroParameters::take_whole_values() {
  if (zero_stage_ != 3) return;
  const float* values = store_.values();
  for (size_t b = 0; b < layout_.buckets().size(); ++b) {
    const Bucket& bucket = layout_.buckets()[b];
    const int64_t lo = bucket.shard_begin(rank_in(bucket)), hi = bucket.shard_end(rank_in(bucket));
    if (tracker_ && !state_[b]->params_resident)
      tracker_->add(MemoryCategory::parameters, bucket.size() * int64_t{sizeof(float)});
    state_[b]->params_resident = true;
    ops_.copy(shard_params_.f32() + bucket.shard_offset, values + lo, hi - lo);
    if (!bucket.outer) release(static_cast<int>(b));
  }
}

void ZeroParameters::before_forward(int unit) {
  for (int b : layout_.buckets_of_unit(unit)) before_forward(unit, b);
}

void ZeroParameters::after_forward(int unit) {
  for (int b : layout_.buckets_of_unit(unit)) after_forward(unit, b);
}

void ZeroParameters::before_backward(int unit) {
  for (int b : layout_.buckets_of_unit(unit)) before_backward(unit, b);
}

void ZeroParameters::after_backward(int unit) {
  for (int b : layout_.buckets_of_unit(unit)) after_backward(unit, b);
}

void ZeroParameters::before_forward(int unit, int b) {
  const Bucket& bucket = layout_.buckets()[static_cast<size_t>(b)];
  if (unit != bucket.first_unit) return;
  BucketState& s = *state_[static_cast<size_t>(b)];
  if (zero_stage_ == 3 && !s.params_resident) start_gather(b);
  finish_gather(b);
  // ZeRO-3: prefetch the next bucket of its kind in forward order (buckets are stored in backward
  // order, the dense ones, then the expert ones).
  if (zero_stage_ == 3 && b > 0) {
    const Bucket& next = layout_.buckets()[static_cast<size_t>(b - 1)];
    if (!next.outer && next.expert == bucket.expert &&
        !state_[static_cast<size_t>(b - 1)]->params_resident)
      start_gather(b - 1);
  }
}

void ZeroParameters::after_forward(int unit, int b) {
  const Bucket& bucket = layout_.buckets()[static_cast<size_t>(b)];
  if (zero_stage_ == 3 && !bucket.outer && unit == bucket.last_unit) release(b);
}

void ZeroParameters::before_backward(int unit, int b) {
  const Bucket& bucket = layout_.buckets()[static_cast<size_t>(b)];
  if (unit != bucket.last_unit || zero_stage_ != 3) return;
  BucketState& s = *state_[static_cast<size_t>(b)];
  if (!s.params_resident) start_gather(b);
  finish_gather(b);
  const int next = b + 1;  // next of its kind in backward order
  if (next < static_cast<int>(state_.size())) {
    const Bucket& following = layout_.buckets()[static_cast<size_t>(next)];
    if (!following.outer && following.expert == bucket.expert &&
        !state_[static_cast<size_t>(next)]->params_resident)
      start_gather(next);
  }
}

void ZeroParameters::after_backward(int unit, int b) {
  const Bucket& bucket = layout_.buckets()[static_cast<size_t>(b)];
  if (unit == bucket.first_unit && zero_stage_ == 3 && !bucket.outer) release(b);
}

}  // namespace lattice::parallel
