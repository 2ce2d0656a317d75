// A parallel layout of one training step: DP/TP/PP/CP/EP degrees, ZeRO stage, sequence parallelism,
// recomputation, pipeline schedule, microbatch and global batch, and precision. validate_layout()
// rejects impossible combinations with one actionable line.
#pragma once

#include <string>

#include "lattice/parallel/pipeline/schedule.hpp"
#include "lattice/plan/model_spec.hpp"

namespace lattice::plan {

enum class Recompute { kNone, kSelective, kFull };
std::string recompute_name(Recompute recompute);  // "none", "selective", "full"
Recompute parse_recompute(const std::string& name);

struct ParallelLayout {
  int dp = 1;                      // data-parallel replicas
  int tp = 1;                      // tensor parallel (inside a node)
  int pp = 1;                      // pipeline stages (ranks)
  int cp = 1;                      // context parallel (sequence split across ranks, ring attention)
  int ep = 1;                      // expert parallel, carved out of dp * cp
  int zero_stage = 0;              // 0 (plain DP) .. 3
  bool sequence_parallel = false;  // Megatron SP: norms/dropout sharded over tp
  Recompute recompute = Recompute::kNone;
  pipeline::ScheduleKind schedule = pipeline::ScheduleKind::kOneFOneB;
  int virtual_stages = 1;  // chunks per pipeline rank (interleaved schedule)
  int micro_batch_size = 1;
  int global_batch_size = 1;         // sequences per optimizer step
  int param_bytes = 2;               // bf16 weights
  int grad_bytes = 2;                // bf16 gradients (communicated and stored)
  int optimizer_bytes = 12;          // fp32 master weights + Adam moments (ZeRO's K = 12)
  bool overlap_grad_reduce = false;  // DP gradient reduction overlapped with backward
  // Fused causal attention (FlashAttention): scores never reach memory, masked blocks are skipped,
  // the backward recomputes the scores. Off reproduces Megatron's unfused kernels of the published
  // tables.
  bool flash_attention = false;

  int world_size() const { return dp * tp * pp * cp; }
  // Microbatches each pipeline runs per step: global / (micro * dp).
  int num_microbatches() const { return global_batch_size / (micro_batch_size * dp); }
  std::string describe() const;  // "dp=32 tp=8 pp=2 zero=1 sp mb=1 1f1b recompute=full"
};

// Throws lattice::Error when the layout cannot run this model (heads not divisible by tp, layers
// not by pp * virtual stages, global batch not divisible by micro * dp, ep not dividing dp * cp or
// the experts, tp larger than a node when devices_per_node > 0, ...).
void validate_layout(const ModelSpec& model, const ParallelLayout& layout,
                     int devices_per_node = 0);

}  // namespace lattice::plan
