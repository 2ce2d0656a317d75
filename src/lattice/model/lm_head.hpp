// LmHead: the last stage's output layer — the final norm (LayerNorm for GPT-2, RMSNorm for
// Llama), the LM head [vocab, d_model] ("lm_head.weight", or the token embedding when tied in the
// same store) and the softmax cross-entropy. In bf16 training the head's GEMM and the loss run in
// row chunks that stay in cache (the logits are never stored whole), and its backward can run
// inside the forward (HeadFusion). Its saved tensors are the caller's HeadActivations.
#pragma once

#include <cstdint>
#include <string>

#include "lattice/model/layer_context.hpp"
#include "lattice/model/model_config.hpp"
#include "lattice/model/parameter_store.hpp"
#include "lattice/model/stage_activations.hpp"

namespace lattice::model {

// bf16 training: when and how the LM head's backward runs inside its forward, so that the logits'
// gradient [B·T, vocab] is never stored, at the cost of one weight-gradient partial [vocab,
// d_model] fp32 per thread:
//   always:        in row chunks (MatmulEngine::forward_backward_in_row_chunks)
//   vocab_blocked: in blocks of the vocabulary with the logits computed twice
//                  (MatmulEngine::head_cross_entropy_vocab_blocked; only where it applies, else
//                  as always)
//   never:         the backward reads the stored bf16 logits' gradient
//   when_smaller (the default): vocab_blocked where it applies, else always, when the partials
//                  take no more memory than the bf16 logits gradient they replace; else never.
enum class HeadFusion { when_smaller, always, vocab_blocked, never };

// Which halves of a backward to run (a split backward's B, its W, or both).
enum class BackwardPart { both, input, weight };

class LmHead {
 public:
  // Declares the final norm and, unless `tied_weight` >= 0 (the token embedding's index in the
  // same store), "lm_head.weight"; `untied_copy_of` names the parameter an untied copy of a tied
  // head starts equal to (a last stage without the embedding).
  LmHead(ParameterStore& store, const ModelConfig& config, int tied_weight,
         const std::string& untied_copy_of);

  void set_fusion(HeadFusion fusion) { fusion_ = fusion; }
  int weight() const { return weight_; }

  // The summed cross-entropy of rows x [rows, d_model] against targets (< 0 ignored), saving in h
  // what backward needs; grad_scale != 0 prepares the gradient of grad_scale · the summed loss.
  double forward_loss(const LayerContext& ctx, HeadActivations& h, const float* x,
                      const int32_t* targets, int64_t rows, float grad_scale,
                      MemoryTracker* tracker);
  // Logits [rows, vocab] in h.logits (no loss, no gradient).
  const float* logits(const LayerContext& ctx, HeadActivations& h, const float* x, int64_t rows,
                      MemoryTracker* tracker);
  // The bytes of HeadActivations a training forward and backward of `rows` rows leave allocated
  // on `engine` (the terms of activation_memory.hpp's estimate; the same decisions forward_loss
  // makes).
  int64_t saved_bytes(kernels::Precision precision, int64_t rows,
                      const kernels::MatmulEngine& engine) const;

  // Incremental inference: logits [rows, vocab] in h.logits of rows x (each sequence's last
  // position), computed in the engine's precision with no operand kept for a backward.
  const float* inference_logits(const LayerContext& ctx, HeadActivations& h, const float* x,
                                int64_t rows, MemoryTracker* tracker);
  // d_x [rows, d_model] (overwritten; part != weight) and the parameter gradients (part != input;
  // the final norm's come with d_x) from what forward_loss saved.
  void backward(const LayerContext& ctx, HeadActivations& h, float* d_x, const float* x,
                int64_t rows, BackwardPart part, MemoryTracker* tracker);

 private:
  // bf16 training: how the head's GEMM and loss run for `rows` rows.
  struct HeadPlan {
    int64_t chunk_rows = 0;
    bool vocab_blocked = false;  // on the AMX vocabulary-blocked kernel
    int lanes = 1;               // weight-gradient partials (one per thread)
    bool backward_in_forward = false;
  };
  HeadPlan plan_bf16(const kernels::MatmulEngine& engine, int64_t rows, bool with_gradient) const;
  void norm_forward(HeadActivations& h, const float* x, int64_t rows, MemoryTracker* tracker);
  double loss_in_row_chunks(const LayerContext& ctx, HeadActivations& h, const float* x,
                            const int32_t* targets, int64_t rows, float grad_scale,
                            MemoryTracker* tracker);
  void backward_gemm(const LayerContext& ctx, HeadActivations& h, int64_t rows, BackwardPart part,
                     MemoryTracker* tracker);
  void norm_backward(HeadActivations& h, float* d_x, const float* x, int64_t rows);

  ParameterStore& store_;
  Family family_;
  int64_t C_, V_;
  float eps_;
  int norm_weight_ = -1, norm_bias_ = -1, weight_ = -1;
  HeadFusion fusion_ = HeadFusion::when_smaller;
};

}  // namespace lattice::model
