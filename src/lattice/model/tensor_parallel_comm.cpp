// The tensor-parallel group's collectives: see tensor_parallel_comm.hpp.
#include "lattice/model/tensor_parallel_comm.hpp"

#include <chrono>
#include <string>

#include "lattice/comm/communicator.hpp"
#include "lattice/core/error.hpp"

namespace lattice::model {

namespace {

comm::Communicator& communicator(const TensorParallelGroup& tp) {
  check(tp.comm != nullptr, "tensor parallelism of size " + std::to_string(tp.size) +
                                " without a communicator (internal error)");
  return *tp.comm;
}

// Adds the wall time since `start` to *tp.comm_seconds (when set).
void add_exposed_time(const TensorParallelGroup& tp, std::chrono::steady_clock::time_point start) {
  if (tp.comm_seconds)
    *tp.comm_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Runs a blocking `collective`: all of its time is exposed.
template <typename Collective>
void timed(const TensorParallelGroup& tp, Collective&& collective) {
  const auto start = std::chrono::steady_clock::now();
  collective(communicator(tp));
  add_exposed_time(tp, start);
}

void check_sequence_rows(const TensorParallelGroup& tp, int64_t rows) {
  check(tp.sequence_parallel && rows % tp.size == 0,
        "sequence-parallel collective over " + std::to_string(rows) +
            " rows and tp = " + std::to_string(tp.size) +
            " without sequence parallelism, or rows not divisible by tp (internal error)");
}

}  // namespace

void all_reduce_over_tp(const TensorParallelGroup& tp, float* x, int64_t n, comm::ReduceOp op) {
  if (tp.size == 1) return;
  timed(tp, [&](comm::Communicator& c) { c.allreduce(x, n, DType::f32, op); });
}

void gather_sequence(const TensorParallelGroup& tp, void* full, const void* local, int64_t rows,
                     int64_t width, DType dtype) {
  check_sequence_rows(tp, rows);
  timed(tp,
        [&](comm::Communicator& c) { c.all_gather(local, full, rows / tp.size * width, dtype); });
}

void reduce_scatter_sequence(const TensorParallelGroup& tp, float* local, const float* partial,
                             int64_t rows, int64_t width) {
  check_sequence_rows(tp, rows);
  timed(tp, [&](comm::Communicator& c) {
    c.reduce_scatter(partial, local, rows / tp.size * width, DType::f32, comm::ReduceOp::sum);
  });
}

void reduce_over_tp(const TensorParallelGroup& tp, float* out, float* partial, int64_t rows,
                    int64_t width) {
  if (tp.sequence_parallel) {
    reduce_scatter_sequence(tp, out, partial, rows, width);
    return;
  }
  check(out == partial, "reduce_over_tp without sequence parallelism is in place (internal error)");
  all_reduce_over_tp(tp, partial, rows * width);
}

TpCollective TpCollective::all_reduce(const TensorParallelGroup& tp, float* x, int64_t n) {
  TpCollective c(tp);
  if (tp.size == 1 || n == 0) return c;
  c.handle_ = communicator(tp).allreduce_async(x, n, DType::f32, comm::ReduceOp::sum);
  c.pending_ = true;
  return c;
}

TpCollective TpCollective::reduce(const TensorParallelGroup& tp, float* out, float* partial,
                                  int64_t rows, int64_t width) {
  if (!tp.sequence_parallel) {
    check(out == partial,
          "TpCollective::reduce without sequence parallelism is in place (internal error)");
    return all_reduce(tp, partial, rows * width);
  }
  check_sequence_rows(tp, rows);
  TpCollective c(tp);
  c.handle_ = communicator(tp).reduce_scatter_async(partial, out, rows / tp.size * width,
                                                    DType::f32, comm::ReduceOp::sum);
  c.pending_ = true;
  return c;
}

TpCollective TpCollective::reduce_to(const TensorParallelGroup& tp, float* out, const float* in,
                                     int64_t n, int root) {
  TpCollective c(tp);
  if (n == 0) return c;
  c.handle_ = communicator(tp).reduce_async(in, out, n, DType::f32, comm::ReduceOp::sum, root);
  c.pending_ = true;
  return c;
}

void row_parallel_forward(const TensorParallelGroup& tp,
                          const std::function<void(int64_t first, int64_t count)>& gemm, float* out,
                          float* partial, int64_t rows, int64_t width) {
  if (!tp.sequence_parallel) {
    gemm(0, rows);
    reduce_over_tp(tp, out, partial, rows, width);
    return;
  }
  check_sequence_rows(tp, rows);
  const int64_t local = rows / tp.size;
  // Every rank runs the chunks, and starts their reduces, in the same order.
  std::vector<TpCollective> reduces;
  reduces.reserve(static_cast<size_t>(tp.size));
  for (int owner = 0; owner < tp.size; ++owner) {
    gemm(owner * local, local);
    reduces.push_back(TpCollective::reduce_to(tp, owner == tp.rank ? out : nullptr,
                                              partial + owner * local * width, local * width,
                                              owner));
    if (!tp.overlap) reduces.back().wait();
  }
  for (TpCollective& reduce : reduces) reduce.wait();
}

void column_parallel_forward(
    const TensorParallelGroup& tp, TpCollective& gather,
    const std::function<void(int64_t first, int64_t count, bool own)>& gemm, int64_t rows) {
  if (!tp.sequence_parallel) {
    gather.wait();
    gemm(0, rows, false);
    return;
  }
  check_sequence_rows(tp, rows);
  const int64_t local = rows / tp.size, first = tp.rank * local;
  if (!tp.overlap) gather.wait();
  gemm(first, local, true);
  gather.wait();
  if (first > 0) gemm(0, first, false);
  if (first + local < rows) gemm(first + local, rows - first - local, false);
}

TpCollective TpCollective::gather(const TensorParallelGroup& tp, void* full, const void* local,
                                  int64_t rows, int64_t width, DType dtype) {
  check_sequence_rows(tp, rows);
  TpCollective c(tp);
  c.handle_ = communicator(tp).all_gather_async(local, full, rows / tp.size * width, dtype);
  c.pending_ = true;
  return c;
}

TpCollective::TpCollective(TpCollective&& other) noexcept
    : tp_(other.tp_), handle_(std::move(other.handle_)), pending_(other.pending_) {
  other.pending_ = false;
}

TpCollective& TpCollective::operator=(TpCollective&& other) noexcept {
  if (this == &other) return *this;
  try {
    wait();
  } catch (...) {  // noexcept: the error surfaced (or will) through the collective's own wait()
  }
  tp_ = other.tp_;
  handle_ = std::move(other.handle_);
  pending_ = other.pending_;
  other.pending_ = false;
  return *this;
}

TpCollective::~TpCollective() {
  if (!pending_) return;
  try {
    wait();
  } catch (...) {  // a destructor may not throw: the error surfaced (or will) through wait()
  }
}

void TpCollective::wait() {
  if (!pending_) return;
  pending_ = false;
  const auto start = std::chrono::steady_clock::now();
  handle_.wait();
  add_exposed_time(*tp_, start);
}

ReplicatedGradients::ReplicatedGradients(const TensorParallelGroup& tp, kernels::Ops& ops,
                                         std::initializer_list<float*> grads, int64_t n,
                                         float* scratch)
    : tp_(tp), ops_(ops), grads_(grads), n_(n), scratch_(scratch) {
  const bool partial = tp.sequence_parallel && tp.size > 1;
  for (size_t i = 0; i < grads_.size(); ++i)
    targets_.push_back(grads_[i] == nullptr ? nullptr
                       : partial            ? scratch_ + static_cast<int64_t>(i) * n_
                                            : grads_[i]);
  if (partial) ops_.fill_zero(scratch_, static_cast<int64_t>(grads_.size()) * n_);
}

void ReplicatedGradients::finish() {
  if (!tp_.sequence_parallel || tp_.size == 1) return;
  // One all-reduce for all of them; then each partial sum of the whole batch onto its gradient.
  all_reduce_over_tp(tp_, scratch_, static_cast<int64_t>(grads_.size()) * n_);
  for (size_t i = 0; i < grads_.size(); ++i)
    if (grads_[i] != nullptr) ops_.add_inplace(grads_[i], targets_[i], n_);
}

}  // namespace lattice::model
