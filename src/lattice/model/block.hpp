// Block: the interface of one transformer block (TransformerBlock, the one type) with a
// hand-written forward and backward (whole, or split into input and weight halves) over
// caller-owned saved activations, and the scratch arena that backward passes share.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/core/tensor.hpp"
#include "lattice/model/layer_context.hpp"
#include "lattice/model/moe_statistics.hpp"
#include "lattice/parallel/tensor/sequence_layout.hpp"

namespace lattice::model {

class KvCache;

// Gradient buffers reused by every block's backward (only one block runs backward at a time).
class BackwardScratch {
 public:
  // Buffer `slot` holding at least `numel` floats (grown on demand in `memory`, counted by
  // `tracker` as activations; contents unspecified).
  float* get(int slot, int64_t numel, DeviceMemory& memory, MemoryTracker* tracker);

 private:
  std::vector<Tensor> buffers_;
};

// What one block's forward saves for its backward: a plain struct per block type (shapes in its
// comments), owned by the caller, one per microbatch in flight. The block itself holds none.
struct BlockActivations {
  virtual ~BlockActivations() = default;
  // Frees every saved tensor (the struct can be filled again by another forward).
  virtual void release() = 0;
  // Selective activation checkpointing: when set before forward, the attention core's output and
  // log-sum-exp are dropped at the end of the forward and recomputed from the saved q, k, v at the
  // start of the backward (Korthikanti et al.'s "selective recomputation"; same bits).
  bool recompute_attention = false;
  // Set by backward_input, cleared by backward_weight: the weight gradients are still to run.
  bool weight_gradients_pending = false;
  // Set by the Transformer before a forward: this micro-batch's weight in the step's loss
  // (1 / accumulation steps; 0 for a forward without backward). A MoE layer scales its balancing
  // losses' gradients by it.
  float loss_scale = 0.0f;
};

class Block {
 public:
  virtual ~Block() = default;
  // An empty set of this block type's saved activations.
  virtual std::unique_ptr<BlockActivations> make_activations() const = 0;
  // x_out = block(x_in) for B sequences of T tokens; saves into `saved` what backward needs (x_in
  // itself is not copied: the caller keeps it alive until backward).
  virtual void forward(const LayerContext& ctx, BlockActivations& saved, float* x_out,
                       const float* x_in, int64_t B, int64_t T) = 0;
  // d_x_in = ∂loss/∂x_in given d_x_out (d_x_in may alias d_x_out); parameter gradients accumulate.
  // `saved` is the set the matching forward filled.
  void backward(const LayerContext& ctx, BlockActivations& saved, float* d_x_in,
                const float* d_x_out, const float* x_in, int64_t B, int64_t T,
                BackwardScratch& scratch) {
    check_no_weight_half_pending(saved);
    backward_pass(ctx, saved, d_x_in, d_x_out, x_in, B, T, scratch, /*defer=*/false);
  }
  // The two halves of backward, for schedules that run them apart (zero-bubble pipelines).
  // backward_input (B) computes d_x_in and the gradients that come out of its own passes (norm
  // weights and biases); it keeps in `saved` the output gradient of every Linear.
  // backward_weight (W) then runs the Linears' weight-gradient GEMMs from them and frees them.
  // B then W accumulates exactly backward's bits.
  void backward_input(const LayerContext& ctx, BlockActivations& saved, float* d_x_in,
                      const float* d_x_out, const float* x_in, int64_t B, int64_t T,
                      BackwardScratch& scratch) {
    check_no_weight_half_pending(saved);
    backward_pass(ctx, saved, d_x_in, d_x_out, x_in, B, T, scratch, /*defer=*/true);
    saved.weight_gradients_pending = true;
  }
  void backward_weight(const LayerContext& ctx, BlockActivations& saved, const float* x_in,
                       int64_t B, int64_t T) {
    check(saved.weight_gradients_pending,
          "backward_weight without a preceding backward_input (internal error)");
    weight_pass(ctx, saved, x_in, B, T);
    saved.weight_gradients_pending = false;
  }
  // Bytes a training forward of B sequences of T tokens leaves in this block's activations (the
  // terms of the activation-memory estimate, activation_memory.hpp), of which the attention
  // output and log-sum-exp that selective checkpointing drops; and the backward scratch it uses.
  virtual int64_t saved_bytes(kernels::Precision precision, int64_t B, int64_t T) const = 0;
  virtual int64_t attention_output_bytes(int64_t B, int64_t T) const = 0;
  virtual int64_t scratch_bytes(kernels::Precision precision, int64_t B, int64_t T) const = 0;
  // The largest buffer set a forward or backward of this block allocates and frees again (under
  // sequence parallelism: the gathered rows and the partial sums before a reduce-scatter); one
  // block's at a time, on top of everything that stays allocated.
  virtual int64_t transient_bytes(kernels::Precision precision, int64_t B, int64_t T) const {
    (void)precision, (void)B, (void)T;
    return 0;
  }
  // Bytes a backward's input half (backward_input) keeps in the activations for the deferred
  // weight half: the Linears' output gradients (zero-bubble pipelines hold them until W).
  virtual int64_t pending_weight_bytes(kernels::Precision precision, int64_t B,
                                       int64_t T) const = 0;
  // A MoE layer's routing of the forward that filled `saved` (moe_statistics.hpp); none for a
  // dense block.
  virtual std::optional<MoeLayerStatistics> moe_statistics(const BlockActivations& saved) const {
    (void)saved;
    return std::nullopt;
  }
  // Auxiliary-loss-free balancing: a MoE layer with a choice bias moves it by `rate` towards
  // balance given its experts' load over the step (MoeMlp::update_choice_bias); false (nothing
  // done) for a block without one.
  virtual bool update_choice_bias(const std::vector<int64_t>& load, double rate) {
    (void)load, (void)rate;
    return false;
  }
  // Incremental inference: x_out = block(x_in) for n new tokens of each of B sequences at
  // positions [cache.length(), cache.length() + n), attending to the cached positions before them;
  // writes the new keys and values into layer `cache_layer` of `cache` (the caller advances the
  // cache once every block has run). `work` is overwritten: no backward may follow.
  virtual void forward_cached(const LayerContext& ctx, BlockActivations& work, float* x_out,
                              const float* x_in, int64_t B, int64_t n, KvCache& cache,
                              int64_t cache_layer) {
    (void)ctx, (void)work, (void)x_out, (void)x_in, (void)B, (void)n, (void)cache,
        (void)cache_layer;
    throw Error("this block type has no incremental (KV-cached) forward yet");
  }

 protected:
  // The whole backward, with the Linears' weight gradients run in place (defer = false) or left to
  // backward_weight with their output gradients kept in `saved` (defer = true).
  virtual void backward_pass(const LayerContext& ctx, BlockActivations& saved, float* d_x_in,
                             const float* d_x_out, const float* x_in, int64_t B, int64_t T,
                             BackwardScratch& scratch, bool defer) = 0;
  // backward_weight's GEMMs from the output gradients backward_pass(defer = true) kept; frees them.
  virtual void weight_pass(const LayerContext& ctx, BlockActivations& saved, const float* x_in,
                           int64_t B, int64_t T) = 0;

 private:
  static void check_no_weight_half_pending(const BlockActivations& saved) {
    check(!saved.weight_gradients_pending,
          "backward of a block whose weight gradients are still pending (internal error)");
  }
};

// The block type's own activations struct behind a BlockActivations reference (checked).
template <typename Saved>
Saved& saved_as(BlockActivations& saved) {
  auto* typed = dynamic_cast<Saved*>(&saved);
  check(typed != nullptr, "a block was handed another block type's activations (internal error)");
  return *typed;
}

// The output gradient a Linear's weight half reads: scratch slot `slot` when the weight half runs
// in the same backward, or `pending` (kept in the block's activations until backward_weight) when
// it is deferred. `numel` floats.
float* weight_gradient_operand(bool defer, Tensor& pending, BackwardScratch& scratch, int slot,
                               int64_t numel, DeviceMemory& memory, MemoryTracker* tracker);
// Selective checkpointing: frees the attention output and log-sum-exp at the end of the forward and
// again once the backward that recomputed them is done, so that at most one block holds them.
void drop_recomputed_attention(const BlockActivations& saved, Tensor& att, Tensor& lse);

// Saved activations are kept in tensors sized for the current B·T; this grows one if needed, in
// the backend's memory (ctx.ops.memory()), counted by ctx.tracker as activations.
void ensure_activation(Tensor& tensor, Shape shape, const LayerContext& ctx);
// The same in `memory` (a backend's: kernels::Ops::memory()) for callers without a LayerContext.
void ensure_activation(Tensor& tensor, Shape shape, DeviceMemory& memory, MemoryTracker* tracker);
// The same for a bf16 activation (bf16 GEMM operands and other values kept in bf16 between
// forward and backward).
void ensure_bf16_activation(Tensor& tensor, Shape shape, const LayerContext& ctx);
void ensure_bf16_activation(Tensor& tensor, Shape shape, DeviceMemory& memory,
                            MemoryTracker* tracker);

}  // namespace lattice::model
