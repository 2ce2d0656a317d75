// A measured upper bound on a training step's MFU (issue #26): what the step would take if it did
// nothing but its Linear layers' GEMMs, each at the rate the backend (kernels::Ops) reaches on that
// very shape when run alone, its attention products at the 1024^3 GEMM peak, and the optimizer's
// unavoidable memory traffic (the clip's norm and AdamW over every parameter, timed alone on one
// buffer of the model's size: the bandwidth this host gives that traffic, which a plain copy
// of some other size does not measure). A step can only be slower than this, so model FLOPs over
// it, against the peak, caps the MFU any kernel tuning of the rest could reach with these GEMMs on
// this host.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lattice/kernels/ops.hpp"
#include "lattice/kernels/precision.hpp"
#include "lattice/model/model_config.hpp"

namespace lattice::train {

// One Linear shape of the step (out[M,N] = in[M,K] · W[N,K]^T), `count` times per step, and the
// best seconds of its forward and of its backward (input and weight gradients) over the timed runs
// (a bf16 LM head the backend runs in blocks of the vocabulary, e.g. on AMX: forward, loss and
// backward in one, as the step runs it, all in forward_seconds).
struct BoundGemm {
  std::string name;
  int64_t M = 0, K = 0, N = 0, count = 0;
  bool lm_head = false;  // the LM head: no bias, and in bf16 (vocabulary-blocked) its fused kernel
  double forward_seconds = 0, backward_seconds = 0;
  double flops() const { return 6.0 * static_cast<double>(M * K) * static_cast<double>(N); }
  double seconds() const { return forward_seconds + backward_seconds; }
};

// The Linear shapes of one step of a dense model at M = the step's tokens (untimed): qkv,
// attention out, the MLP's (gate and up together for a gated MLP, count 2 per layer), mlp out, the
// LM head.
std::vector<BoundGemm> step_linears(const model::ModelConfig& model, int64_t M);

struct StepBound {
  std::vector<BoundGemm> gemms;
  double gemm_seconds = 0;       // sum over gemms of count · seconds()
  double attention_flops = 0;    // 12·L·T·d per token (the MFU formula's term), all tokens
  double attention_seconds = 0;  // attention_flops at peak_flops
  // Not part of the bound: Lattice's attention kernels, forward and backward, timed alone at the
  // step's shape, times the layers (what the step's attention really costs, against the bound's
  // attention_seconds).
  double attention_kernel_seconds = 0;
  double optimizer_bytes = 0;    // AdamW and the clip's norm: 32 bytes per parameter (bf16: 34)
  double optimizer_seconds = 0;  // the clip's norm and AdamW over every parameter, timed alone
  double peak_flops = 0;         // the 1024^3 GEMM rate the MFU is measured against
  double model_flops = 0;        // flops_per_token · tokens
  double seconds() const { return gemm_seconds + attention_seconds + optimizer_seconds; }
  // The memory bandwidth the timed optimizer reached (its bytes over its seconds).
  double optimizer_bandwidth() const { return optimizer_bytes / optimizer_seconds; }
  double mfu() const { return model_flops / seconds() / peak_flops; }
};

// Times the step's GEMMs of a dense model (GPT-2 or Llama; throws Error for a MoE model) for
// `batch` sequences of `seq_len` tokens on `ops` with all OpenMP threads, bf16 operands
// rounded beforehand as the parameter store and the activations keep them. `peak_flops` is the
// caller's 1024^3 calibration.
StepBound measure_step_bound(const model::ModelConfig& model, int64_t batch, int64_t seq_len,
                             kernels::Precision precision, kernels::Ops& ops, double peak_flops);

// Seconds of one layer's attention forward and backward (the backend's kernels, all OpenMP threads,
// the best of a few runs) on `batch` sequences of `seq_len` tokens of the model's heads: bf16 q,
// k, v with bf16 gradients (and, for biased projections, the column sums the bias takes), or fp32.
double time_attention_kernels(const model::ModelConfig& model, int64_t batch, int64_t seq_len,
                              kernels::Precision precision, kernels::Ops& ops);

// Seconds of the optimizer's memory-bound work on `parameters` fp32 parameters, the best of a few
// runs with all OpenMP threads: the clip's gradient norm, then AdamW on the parameters, their
// gradients and moments in one tensor (with the bf16 copy written when `bf16_copy`) — the work a
// step's optimizer does, without its per-tensor bookkeeping.
double time_optimizer(kernels::Ops& ops, int64_t parameters, bool bf16_copy);

}  // namespace lattice::train
