// Block helpers: the shared backward scratch and activation allocation (see block.hpp).
#include "lattice/model/block.hpp"

namespace lattice::model {

float* BackwardScratch::get(int slot, int64_t numel, DeviceMemory& memory, MemoryTracker* tracker) {
  if (static_cast<int>(buffers_.size()) <= slot) buffers_.resize(static_cast<size_t>(slot) + 1);
  Tensor& buffer = buffers_[static_cast<size_t>(slot)];
  if (buffer.numel() < numel)
    buffer = Tensor({numel}, DType::f32, memory, tracker, MemoryCategory::activations);
  return buffer.f32();
}

float* weight_gradient_operand(bool defer, Tensor& pending, BackwardScratch& scratch, int slot,
                               int64_t numel, DeviceMemory& memory, MemoryTracker* tracker) {
  if (!defer) return scratch.get(slot, numel, memory, tracker);
  ensure_activation(pending, {numel}, memory, tracker);
  return pending.f32();
}

void drop_recomputed_attention(const BlockActivations& saved, Tensor& att, Tensor& lse) {
  if (!saved.recompute_attention) return;
  att.reset();
  lse.reset();
}

void ensure_activation(Tensor& tensor, Shape shape, DeviceMemory& memory, MemoryTracker* tracker) {
  if (tensor.shape() == shape && tensor.dtype() == DType::f32 && &tensor.memory() == &memory)
    return;
  tensor = Tensor(std::move(shape), DType::f32, memory, tracker, MemoryCategory::activations);
}

void ensure_activation(Tensor& tensor, Shape shape, const LayerContext& ctx) {
  ensure_activation(tensor, std::move(shape), ctx.ops.memory(), ctx.tracker);
}

void ensure_bf16_activation(Tensor& tensor, Shape shape, DeviceMemory& memory,
                            MemoryTracker* tracker) {
  if (tensor.shape() == shape && tensor.dtype() == DType::bf16 && &tensor.memory() == &memory)
    return;
  tensor = Tensor(std::move(shape), DType::bf16, memory, tracker, MemoryCategory::activations);
}

void ensure_bf16_activation(Tensor& tensor, Shape shape, const LayerContext& ctx) {
  ensure_bf16_activation(tensor, std::move(shape), ctx.ops.memory(), ctx.tracker);
}

}  // namespace lattice::model
