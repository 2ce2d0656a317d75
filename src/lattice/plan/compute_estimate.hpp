// FLOP counts and training-time estimates: the published closed forms (6ND, PaLM's 6N + 12LHQT,
// Korthikanti eq. 7 and 8, Megatron eq. 3 and eq. 4) and a per-operation count that generalises
// them to GQA, gated MLPs and MoE and reduces to eq. 7 for GPT models.
#pragma once

#include "lattice/plan/layout.hpp"
#include "lattice/plan/model_spec.hpp"

namespace lattice::plan {

// Forward FLOPs of one sequence of model.seq_len tokens, split by where they are spent.
struct ForwardFlops {
  double dense_gemms = 0;     // QKV, output projection, MLP (active experts), router, all layers
  double attention_core = 0;  // QK^T and attention x V, all layers (full s x s, as Megatron counts)
  double logits = 0;          // output head
  double total() const { return dense_gemms + attention_core + logits; }
};
ForwardFlops forward_flops_per_sequence(const ModelSpec& model);

// Model FLOPs of one training sequence (forward + backward = 3 x forward) and hardware FLOPs
// including recomputation (full: one more forward of the layers; selective: one more attention
// core).
double model_flops_per_sequence(const ModelSpec& model);
double hardware_flops_per_sequence(const ModelSpec& model, Recompute recompute);

// Published closed forms, per iteration of `batch` sequences (GPT models, 4h MLP):
// Korthikanti eq. 7: 72 B L s h^2 (1 + s/(6h) + V/(12 h L)).
double korthikanti_model_flops(const ModelSpec& model, double batch);
// Korthikanti eq. 8 (selective recompute): 72 B L s h^2 (1 + s/(3h) + V/(12 h L)).
double korthikanti_selective_hardware_flops(const ModelSpec& model, double batch);
// Megatron-LM eq. 3 (full recompute): 96 B s l h^2 (1 + s/(6h) + V/(16 l h)).
double megatron_flops_with_recompute(const ModelSpec& model, double batch);
// PaLM: FLOPs per token 6N + 12 L H Q T (N = non-embedding parameters of active experts).
double palm_flops_per_token(const ModelSpec& model);
// Megatron eq. 4 training time in seconds: 8 T P / (n X), T tokens, P parameters, X FLOP/s per
// device.
double megatron_training_seconds(double tokens, double parameters, int devices,
                                 double flops_per_device);

struct ComputeEstimate {
  double flops_per_token = 0;          // model FLOPs (6N-style, with attention)
  double flops_per_step = 0;           // model FLOPs of one global batch
  double hardware_flops_per_step = 0;  // with recomputation
  double total_flops = 0;              // for the token budget
  double total_flops_6nd = 0;  // 6 N D with N the active parameters (the GPT-3 paper's convention)
  double steps = 0;
  double seconds = 0;  // at the given per-device throughput
  double days() const { return seconds / 86400.0; }
};

// Total model FLOPs for `tokens` training tokens and the time on `devices` devices that each
// sustain `model_flops_per_device` (model FLOP/s, e.g. MFU x peak).
ComputeEstimate estimate_compute(const ModelSpec& model, const ParallelLayout& layout,
                                 double tokens, int devices, double model_flops_per_device);

}  // namespace lattice::plan
