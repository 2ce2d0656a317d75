// Block helpers: the tensor-parallel all-reduce, the shared backward scratch and activation
// allocation (see block.hpp).
#include "lattice/model/block.hpp"

#include <chrono>

#include "lattice/comm/communicator.hpp"

namespace lattice::model {

void all_reduce_over_tp(const TensorParallelGroup& tp, float* x, int64_t n, comm::ReduceOp op) {
  if (tp.size == 1) return;
  check(tp.comm != nullptr, "tensor parallelism of size " + std::to_string(tp.size) +
                                " without a communicator (internal error)");
  const auto start = std::chrono::steady_clock::now();
  tp.comm->allreduce(x, n, DType::f32, op);
  if (tp.comm_seconds)
    *tp.comm_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TpReduction::TpReduction(const TensorParallelGroup& tp, float* x, int64_t n) : tp_(tp) {
  if (tp.size == 1 || n == 0) return;
  check(tp.comm != nullptr, "tensor parallelism of size " + std::to_string(tp.size) +
                                " without a communicator (internal error)");
  handle_ = tp.comm->allreduce_async(x, n, DType::f32, comm::ReduceOp::sum);
  pending_ = true;
}

TpReduction::~TpReduction() {
  if (!pending_) return;
  try {
    wait();
  } catch (...) {  // a destructor may not throw: the error surfaced (or will) through wait()
  }
}

void TpReduction::wait() {
  if (!pending_) return;
  pending_ = false;
  const auto start = std::chrono::steady_clock::now();
  handle_.wait();
  if (tp_.comm_seconds)
    *tp_.comm_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

float* BackwardScratch::get(int slot, int64_t numel, MemoryTracker* tracker) {
  if (static_cast<int>(buffers_.size()) <= slot) buffers_.resize(static_cast<size_t>(slot) + 1);
  Tensor& buffer = buffers_[static_cast<size_t>(slot)];
  if (buffer.numel() < numel)
    buffer = Tensor({numel}, DType::f32, tracker, MemoryCategory::activations);
  return buffer.f32();
}

float* weight_gradient_operand(bool defer, Tensor& pending, BackwardScratch& scratch, int slot,
                               int64_t numel, MemoryTracker* tracker) {
  if (!defer) return scratch.get(slot, numel, tracker);
  ensure_activation(pending, {numel}, tracker);
  return pending.f32();
}

void drop_recomputed_attention(const BlockActivations& saved, Tensor& att, Tensor& lse) {
  if (!saved.recompute_attention) return;
  att.reset();
  lse.reset();
}

void ensure_activation(Tensor& tensor, Shape shape, MemoryTracker* tracker) {
  if (tensor.shape() == shape) return;
  tensor = Tensor(std::move(shape), DType::f32, tracker, MemoryCategory::activations);
}

void ensure_bf16_activation(Tensor& tensor, Shape shape, MemoryTracker* tracker) {
  if (tensor.shape() == shape && tensor.dtype() == DType::bf16) return;
  tensor = Tensor(std::move(shape), DType::bf16, tracker, MemoryCategory::activations);
}

}  // namespace lattice::model
