// StageActivations: everything one forward of a Transformer stage saves for its backward, as plain
// data owned by the caller (llm.c's ActivationTensors idea): one set per microbatch in flight, so
// a pipeline schedule can run the forwards of several microbatches before their backwards, in any
// order. Shapes: rows = B·T, C = d_model, V = vocab_size.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "lattice/core/tensor.hpp"
#include "lattice/model/block.hpp"

namespace lattice::model {

// The final norm, the LM head and the loss.
struct HeadActivations {
  Tensor normed;                // [rows, C] the final norm's output (bf16 GPT-2: only normed16)
  Tensor norm_mean, norm_rstd;  // [rows] (the mean for LayerNorm only)
  Tensor normed16;              // [rows, C] bf16: the head GEMM's rounded input
  Tensor logits;                // [rows, V] fp32: the logits, then their gradient
  Tensor d_logits16;            // [rows, V] bf16: the logits' gradient rounded (unfused bf16 head)
  bool logits_grad_bf16 = false;
  // bf16: the head's backward ran inside the forward (HeadFusion), leaving d_normed and the
  // weight gradient's per-lane partials [lanes, V, C] for the backward to add.
  bool backward_in_forward = false;
  Tensor grad_partials;
  Tensor d_normed;  // [rows, C] ∂loss/∂normed
  // Sequence parallelism: the norm runs on this rank's rows (local = rows / tp; the statistics
  // above are [local] then; its output is gathered into normed): ∂loss/∂ its output [local, C]
  // after the reduce-scatter of d_normed.
  Tensor d_normed_local;
  void release();
};

struct StageActivations {
  int64_t B = 0, T = 0;
  Tensor tokens;   // [rows] i32: the first stage's tokens (for the embedding's backward)
  Tensor targets;  // [rows] i32: the last stage's targets, in the backend's memory
  // blocks + 1 of [local, C]: residual[i] is block i's input (local: this rank's sequence rows,
  // rows / tp under sequence parallelism, else rows); d_residual too.
  std::vector<Tensor> residual;
  std::vector<std::unique_ptr<BlockActivations>> blocks;  // one per block of the stage
  HeadActivations head;                                   // the last stage's
  Tensor d_residual;  // [local, C] backward: ∂loss/∂ the stage's input when it is done
  bool gradient_ready = false;            // a training forward ran; its backward has not
  bool weight_gradients_pending = false;  // backward_stage_input ran; backward_stage_weight has not

  // The stage's output (the next stage's input) and, after backward, ∂loss/∂ its input.
  const float* hidden_out() const { return residual.empty() ? nullptr : residual.back().f32(); }
  const float* d_hidden_in() const { return d_residual.f32(); }
  // Frees every saved tensor; the set can be filled again by another forward.
  void release();
};

// Copies `count` token or target ids from the host into `ids` (grown in `memory`, the
// backend's, when it is not that size there) and returns them there: what the embedding and the
// loss read.
const int32_t* stage_ids(Tensor& ids, const int32_t* host_ids, int64_t count, DeviceMemory& memory);

}  // namespace lattice::model
