// ParallelLayout: how one training step is spread over ranks — the parallel degrees (dp, tp, pp,
// cp, with ep carved out of dp x cp), the ZeRO stage and HSDP shard groups, sequence parallelism,
// the pipeline schedule and its virtual stages, the microbatch and global batch, activation
// recomputation, and the bytes the model state takes. It is the one layout type of Lattice: the
// trainer derives it from [parallelism], [training] and [activation_checkpoint]
// (TrainConfig::layout()), the planner builds it from `--dp --tp ...` and searches over it, and
// validate_layout() is the one check of a layout against a model for both.
#pragma once

#include <cstdint>
#include <string>

#include "lattice/mesh/mesh_shape.hpp"
#include "lattice/model/activation_checkpoint.hpp"
#include "lattice/model/model_config.hpp"
#include "lattice/parallel/pipeline/schedule.hpp"

namespace lattice::parallel {

using model::Recompute;

struct ParallelLayout {
  int dp = 1;                      // data-parallel replicas
  int tp = 1;                      // tensor parallel (inside a node)
  int pp = 1;                      // pipeline stages (ranks)
  int cp = 1;                      // context parallel (sequence split across ranks, ring attention)
  int ep = 1;                      // expert parallel, carved out of dp * cp
  int zero_stage = 0;              // 0 (plain DP) .. 3
  int hsdp_shard_size = 0;         // HSDP: ZeRO shards within groups of this many dp ranks (0: all)
  bool sequence_parallel = false;  // Megatron SP: norms/dropout sharded over tp
  Recompute recompute = Recompute::kNone;
  int recompute_interval = 1;  // full: every recompute_interval-th block (activation_checkpoint)
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
  // Microbatches each pipeline runs per step (the gradient accumulation steps without a
  // pipeline): global / (micro * dp).
  int num_microbatches() const { return global_batch_size / (micro_batch_size * dp); }
  model::ActivationCheckpoint activation_checkpoint() const {
    return {recompute, recompute_interval};
  }
  // The rank grid (pp x dp x cp x tp, ep) the mesh is built from.
  mesh::MeshShape mesh_shape() const;
  std::string describe() const;  // "dp=32 tp=8 pp=2 zero=1 sp mb=1 1f1b recompute=full"
};

// Throws lattice::Error with one line naming the key and the fix when the layout cannot run this
// model at sequence length `seq_len`: a degree or the ZeRO stage out of range, heads or the MLP
// width not divisible by tp, layers not by pp x virtual stages, the sequence not by 2 x cp, ep not
// dividing dp x cp or the experts, HSDP groups not dividing dp, the global batch not divisible by
// micro x dp, a schedule its virtual stages do not fit, or tp larger than a node when
// devices_per_node > 0. Also checks the model itself (ModelConfig::validate) and the recompute
// setting.
void validate_layout(const model::ModelConfig& model, int64_t seq_len, const ParallelLayout& layout,
                     int devices_per_node = 0);

}  // namespace lattice::parallel
