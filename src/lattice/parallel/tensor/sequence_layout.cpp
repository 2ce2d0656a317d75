// The sequence layout's collectives: see sequence_layout.hpp.
#include "lattice/parallel/tensor/sequence_layout.hpp"

#include <chrono>
#include <string>

#include "lattice/comm/communicator.hpp"
#include "lattice/core/error.hpp"

namespace lattice::parallel {

namespace {

comm::Communicator& communicator(const TensorParallelGroup& group) {
  check(group.comm != nullptr, "tensor parallelism of size " + std::to_string(group.size) +
                                   " without a communicator (internal error)");
  return *group.comm;
}

// Adds the wall time since `start` to *comm_seconds (when set).
void add_exposed_time(double* comm_seconds, std::chrono::steady_clock::time_point start) {
  if (comm_seconds)
    *comm_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Runs a blocking `collective`: all of its time is exposed.
template <typename Collective>
void timed(const TensorParallelGroup& group, Collective&& collective) {
  const auto start = std::chrono::steady_clock::now();
  collective(communicator(group));
  add_exposed_time(group.comm_seconds, start);
}

}  // namespace

LinearSplit SequenceLayout::split(TensorSplit kind, int blocks) const {
  return {kind, group_.rank, group_.size, kind == TensorSplit::column ? blocks : 1};
}

void SequenceLayout::check_sharded_rows(int64_t rows) const {
  check(sharded() && rows % ranks() == 0,
        "sequence-parallel collective over " + std::to_string(rows) +
            " rows and tp = " + std::to_string(ranks()) +
            " without sequence parallelism, or rows not divisible by tp (internal error)");
}

void SequenceLayout::all_reduce(float* x, int64_t n, comm::ReduceOp op) const {
  if (ranks() == 1) return;
  timed(group_, [&](comm::Communicator& c) { c.allreduce(x, n, DType::f32, op); });
}

void SequenceLayout::gather(void* all, const void* own, int64_t rows, int64_t width,
                            DType dtype) const {
  check_sharded_rows(rows);
  timed(group_,
        [&](comm::Communicator& c) { c.all_gather(own, all, rows / ranks() * width, dtype); });
}

void SequenceLayout::reduce_scatter(float* own, const float* partial, int64_t rows,
                                    int64_t width) const {
  check_sharded_rows(rows);
  timed(group_, [&](comm::Communicator& c) {
    c.reduce_scatter(partial, own, rows / ranks() * width, DType::f32, comm::ReduceOp::sum);
  });
}

void SequenceLayout::reduce(float* out, float* partial, int64_t rows, int64_t width) const {
  if (sharded()) {
    reduce_scatter(out, partial, rows, width);
    return;
  }
  check(out == partial, "a whole layout's reduction is in place (internal error)");
  all_reduce(partial, rows * width);
}

GroupCollective::GroupCollective(comm::CommHandle handle, double* comm_seconds)
    : handle_(std::move(handle)), comm_seconds_(comm_seconds), pending_(true) {}

GroupCollective SequenceLayout::start_all_reduce(float* x, int64_t n) const {
  if (ranks() == 1 || n == 0) return {};
  return {communicator(group_).allreduce_async(x, n, DType::f32, comm::ReduceOp::sum),
          group_.comm_seconds};
}

GroupCollective SequenceLayout::start_reduce(float* out, float* partial, int64_t rows,
                                             int64_t width) const {
  if (!sharded()) {
    check(out == partial, "a whole layout's reduction is in place (internal error)");
    return start_all_reduce(partial, rows * width);
  }
  check_sharded_rows(rows);
  return {communicator(group_).reduce_scatter_async(partial, out, rows / ranks() * width,
                                                    DType::f32, comm::ReduceOp::sum),
          group_.comm_seconds};
}

GroupCollective SequenceLayout::start_reduce_to(float* out, const float* in, int64_t n,
                                                int root) const {
  if (n == 0) return {};
  return {communicator(group_).reduce_async(in, out, n, DType::f32, comm::ReduceOp::sum, root),
          group_.comm_seconds};
}

GroupCollective SequenceLayout::start_gather(void* all, const void* own, int64_t rows,
                                             int64_t width, DType dtype) const {
  check_sharded_rows(rows);
  return {communicator(group_).all_gather_async(own, all, rows / ranks() * width, dtype),
          group_.comm_seconds};
}

void SequenceLayout::forward_reduced(const std::function<void(int64_t first, int64_t count)>& gemm,
                                     float* out, float* partial, int64_t rows,
                                     int64_t width) const {
  if (!sharded()) {
    gemm(0, rows);
    reduce(out, partial, rows, width);
    return;
  }
  check_sharded_rows(rows);
  const int64_t local = rows / ranks();
  // Every rank runs the chunks, and starts their reduces, in the same order.
  std::vector<GroupCollective> reduces;
  reduces.reserve(static_cast<size_t>(ranks()));
  for (int owner = 0; owner < ranks(); ++owner) {
    gemm(owner * local, local);
    reduces.push_back(start_reduce_to(owner == rank() ? out : nullptr,
                                      partial + owner * local * width, local * width, owner));
    if (!overlaps()) reduces.back().wait();
  }
  for (GroupCollective& reduce : reduces) reduce.wait();
}

void SequenceLayout::forward_gathered(
    GroupCollective& gather,
    const std::function<void(int64_t first, int64_t count, bool own)>& gemm, int64_t rows) const {
  if (!sharded()) {
    gather.wait();
    gemm(0, rows, false);
    return;
  }
  check_sharded_rows(rows);
  const int64_t local = rows / ranks(), first = rank() * local;
  if (!overlaps()) gather.wait();
  gemm(first, local, true);
  gather.wait();
  if (first > 0) gemm(0, first, false);
  if (first + local < rows) gemm(first + local, rows - first - local, false);
}

GroupCollective::GroupCollective(GroupCollective&& other) noexcept
    : handle_(std::move(other.handle_)),
      comm_seconds_(other.comm_seconds_),
      pending_(other.pending_) {
  other.pending_ = false;
}

GroupCollective& GroupCollective::operator=(GroupCollective&& other) noexcept {
  if (this == &other) return *this;
  try {
    wait();
  } catch (...) {  // noexcept: the error surfaced (or will) through the collective's own wait()
  }
  handle_ = std::move(other.handle_);
  comm_seconds_ = other.comm_seconds_;
  pending_ = other.pending_;
  other.pending_ = false;
  return *this;
}

GroupCollective::~GroupCollective() {
  if (!pending_) return;
  try {
    wait();
  } catch (...) {  // a destructor may not throw: the error surfaced (or will) through wait()
  }
}

void GroupCollective::wait() {
  if (!pending_) return;
  pending_ = false;
  const auto start = std::chrono::steady_clock::now();
  handle_.wait();
  add_exposed_time(comm_seconds_, start);
}

ReplicatedGradients::ReplicatedGradients(const SequenceLayout& layout, kernels::Ops& ops,
                                         std::initializer_list<float*> grads, int64_t n,
                                         float* scratch, bool over_split_heads)
    : layout_(layout),
      ops_(ops),
      grads_(grads),
      n_(n),
      scratch_(scratch),
      partial_((layout.sharded() || over_split_heads) && layout.ranks() > 1) {
  check(!partial_ || scratch_ != nullptr,
        "ReplicatedGradients: a partial gradient without scratch (internal error)");
  for (size_t i = 0; i < grads_.size(); ++i)
    targets_.push_back(grads_[i] == nullptr ? nullptr
                       : partial_           ? scratch_ + static_cast<int64_t>(i) * n_
                                            : grads_[i]);
  if (partial_) ops_.fill_zero(scratch_, static_cast<int64_t>(grads_.size()) * n_);
}

void ReplicatedGradients::finish() {
  if (!partial_) return;
  // One all-reduce for all of them; then each partial sum of the whole batch onto its gradient.
  layout_.all_reduce(scratch_, static_cast<int64_t>(grads_.size()) * n_);
  for (size_t i = 0; i < grads_.size(); ++i)
    if (grads_[i] != nullptr) ops_.add_inplace(grads_[i], targets_[i], n_);
}

}  // namespace lattice::parallel
