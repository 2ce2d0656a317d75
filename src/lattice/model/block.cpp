// Block helpers: the shared backward scratch and activation allocation (see block.hpp).
#include "lattice/model/block.hpp"

namespace lattice::model {

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
