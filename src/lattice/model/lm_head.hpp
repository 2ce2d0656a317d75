// LmHead: the last stage's output layer — the final norm (LayerNorm for GPT-2, RMSNorm for
// Llama), the LM head [vocab, d_model] ("lm_head.weight", or the token embedding when tied in the
// same store) and the softmax cross-entropy. In bf16 training the head's GEMM and the loss are one
// op of the backend (Ops::head_loss_bf16: the logits are never stored whole), and its backward can
// run inside the forward (HeadFusion). Its saved tensors are the caller's HeadActivations.
#pragma once

#include <cstdint>
#include <string>

#include "lattice/model/layer_context.hpp"
#include "lattice/model/model_config.hpp"
#include "lattice/model/parameter_store.hpp"
#include "lattice/model/stage_activations.hpp"
#include "lattice/parallel/tensor/sequence_layout.hpp"

namespace lattice::model {

// bf16 training: when and how the LM head's backward runs inside its forward (kernels/ops.hpp).
using HeadFusion = kernels::HeadFusion;

// Which halves of a backward to run (a split backward's B, its W, or both).
enum class BackwardPart { both, input, weight };

class LmHead {
 public:
  // Declares the final norm and, unless `tied_weight` >= 0 (the token embedding's index in the
  // same store), "lm_head.weight"; `untied_copy_of` names the parameter an untied copy of a tied
  // head starts equal to (a last stage without the embedding).
  // Under tensor parallelism (tp.size > 1) the head weight is split by vocabulary rows as the
  // embedding is (a tied head is the embedding's slice), and the loss is vocabulary-parallel.
  LmHead(ParameterStore& store, const ModelConfig& config, int tied_weight,
         const std::string& untied_copy_of, const TensorParallelGroup& tp = {});

  void set_fusion(HeadFusion fusion) { fusion_ = fusion; }
  int weight() const { return weight_; }

  // The summed cross-entropy of rows x [rows, d_model] against targets (< 0 ignored), saving in h
  // what backward needs; grad_scale != 0 prepares the gradient of grad_scale · the summed loss.
  // Under sequence parallelism x (and backward's x and d_x) holds this rank's sequence rows,
  // rows / tp of them, and targets all rows.
  double forward_loss(const LayerContext& ctx, HeadActivations& h, const float* x,
                      const int32_t* targets, int64_t rows, float grad_scale,
                      MemoryTracker* tracker);
  // Logits [rows, vocab] in h.logits (no loss, no gradient).
  const float* logits(const LayerContext& ctx, HeadActivations& h, const float* x, int64_t rows,
                      MemoryTracker* tracker);
  // The bytes of HeadActivations a training forward and backward of `rows` rows leave allocated
  // on `ops` (the terms of activation_memory.hpp's estimate; the same plan forward_loss follows).
  int64_t saved_bytes(kernels::Precision precision, int64_t rows, const kernels::Ops& ops) const;

  // Incremental inference: logits [rows, vocab] in h.logits of rows x (each sequence's last
  // position), computed in the context's precision with no operand kept for a backward.
  const float* inference_logits(const LayerContext& ctx, HeadActivations& h, const float* x,
                                int64_t rows, MemoryTracker* tracker);
  // d_x [rows, d_model] (overwritten; part != weight) and the parameter gradients (part != input;
  // the final norm's come with d_x) from what forward_loss saved.
  void backward(const LayerContext& ctx, HeadActivations& h, float* d_x, const float* x,
                int64_t rows, BackwardPart part, MemoryTracker* tracker);

 private:
  void norm_forward(const LayerContext& ctx, HeadActivations& h, const float* x, int64_t rows,
                    MemoryTracker* tracker);
  double loss_in_row_chunks(const LayerContext& ctx, HeadActivations& h, const float* x,
                            const int32_t* targets, int64_t rows, float grad_scale,
                            MemoryTracker* tracker);
  // Tensor parallelism: this rank's logits of its vocabulary slice and the loss across the group.
  double vocab_parallel_loss(const LayerContext& ctx, HeadActivations& h, const float* x,
                             const int32_t* targets, int64_t rows, float grad_scale,
                             MemoryTracker* tracker);
  void backward_gemm(const LayerContext& ctx, HeadActivations& h, int64_t rows, BackwardPart part,
                     MemoryTracker* tracker);
  void norm_backward(const LayerContext& ctx, HeadActivations& h, float* d_x, const float* x,
                     int64_t rows);

  ParameterStore& store_;
  TensorParallelGroup tp_;
  parallel::SequenceLayout layout_;  // the residual rows over tp_ and its collectives
  Family family_;
  int64_t C_, V_;              // V_: the rows of this rank's head weight (the whole vocab at tp 1)
  kernels::VocabRange slice_;  // the vocabulary rows those are (all at tp = 1)
  float eps_;
  int norm_weight_ = -1, norm_bias_ = -1, weight_ = -1;
  HeadFusion fusion_ = HeadFusion::when_smaller;
};

}  // namespace lattice::model
