// Block: the interface of one transformer block (GPT-2 or Llama) with a hand-written forward and
// backward, and the scratch arena that backward passes share.
#pragma once

#include <cstdint>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/core/tensor.hpp"
#include "lattice/model/layer_context.hpp"

namespace lattice::model {

class KvCache;

// Gradient buffers reused by every block's backward (only one block runs backward at a time).
class BackwardScratch {
 public:
  // Buffer `slot` holding at least `numel` floats (grown on demand; contents unspecified).
  float* get(int slot, int64_t numel, MemoryTracker* tracker);

 private:
  std::vector<Tensor> buffers_;
};

class Block {
 public:
  virtual ~Block() = default;
  // x_out = block(x_in) for B sequences of T tokens; saves the activations backward needs (x_in
  // itself is not copied: the caller keeps it alive until backward).
  virtual void forward(const LayerContext& ctx, float* x_out, const float* x_in, int64_t B,
                       int64_t T) = 0;
  // d_x_in = ∂loss/∂x_in given d_x_out (d_x_in may alias d_x_out); parameter gradients accumulate.
  virtual void backward(const LayerContext& ctx, float* d_x_in, const float* d_x_out,
                        const float* x_in, int64_t B, int64_t T, BackwardScratch& scratch) = 0;
  // Frees the saved activations.
  virtual void release_activations() = 0;
  // Incremental inference: x_out = block(x_in) for n new tokens of each of B sequences at
  // positions [cache.length(), cache.length() + n), attending to the cached positions before them;
  // writes the new keys and values into layer `cache_layer` of `cache` (the caller advances the
  // cache once every block has run). Overwrites the saved activations: no backward may follow.
  virtual void forward_cached(const LayerContext& ctx, float* x_out, const float* x_in, int64_t B,
                              int64_t n, KvCache& cache, int64_t cache_layer) {
    (void)ctx, (void)x_out, (void)x_in, (void)B, (void)n, (void)cache, (void)cache_layer;
    throw Error("this block type has no incremental (KV-cached) forward yet");
  }
};

// Saved activations are kept in tensors sized for the current B·T; this grows one if needed.
void ensure_activation(Tensor& tensor, Shape shape, MemoryTracker* tracker);
// The same for a bf16 activation (bf16 GEMM operands and other values kept in bf16 between
// forward and backward).
void ensure_bf16_activation(Tensor& tensor, Shape shape, MemoryTracker* tracker);

}  // namespace lattice::model
