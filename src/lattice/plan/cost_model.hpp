// The simulator's cost model: how long the pieces of a training step take on given hardware. GEMMs
// run at peak x an efficiency that depends on their shape, memory-bound kernels at HBM bandwidth,
// collectives on NVLink or the network with ring costs. Its free parameters are the few named
// fields of CostParameters (documented in docs/planner.md); everything else is counted from the
// model and layout.
#pragma once

#include "lattice/plan/hardware.hpp"
#include "lattice/plan/layout.hpp"
#include "lattice/plan/model_spec.hpp"

namespace lattice::plan {

struct CostParameters {
  // Fraction of peak dense FLOP/s that a large bf16 GEMM reaches.
  double gemm_peak_fraction = 0.78;
  // Each GEMM dimension d scales efficiency by d / (d + gemm_half_dimension): small dimensions
  // (head size, h/t) leave tensor cores idle.
  double gemm_half_dimension = 128;
  // Fraction of HBM bandwidth that memory-bound kernels (norms, softmax, dropout, optimizer) reach.
  double memory_bandwidth_fraction = 0.85;
  // Bus bandwidth of NCCL collectives as a fraction of the one-direction NVLink bandwidth.
  double nvlink_efficiency = 0.6;
  // Bus bandwidth of collectives and point-to-point across nodes as a fraction of the NIC
  // bandwidth.
  double network_efficiency = 0.9;
  // Fixed cost of one collective or point-to-point transfer, seconds.
  double collective_latency = 10e-6;
};

// Seconds of one GEMM of m x k x n (times `batch` independent ones).
double gemm_seconds(double m, double k, double n, const HardwareSpec& hw,
                    const CostParameters& cost, double batch = 1);

// Bus bandwidth (bytes/s) of a collective over `group` ranks of which `per_node` share a node.
double collective_bus_bandwidth(int group, int per_node, const HardwareSpec& hw,
                                const CostParameters& cost);

enum class Collective { kAllReduce, kReduceScatter, kAllGather, kAllToAll };
// Ring time of a collective moving a buffer of `bytes` (the full, unsharded size) over `group`
// ranks: factor(op, n) x bytes / bus bandwidth + latency, with factor 2(n-1)/n for allreduce,
// (n-1)/n otherwise.
double collective_seconds(Collective op, double bytes, int group, int per_node,
                          const HardwareSpec& hw, const CostParameters& cost);

// Durations of the pieces of one microbatch through one transformer layer on one rank.
struct LayerCosts {
  double forward_compute = 0;  // GEMMs + attention core + memory-bound kernels
  double forward_comm = 0;     // TP (and EP, CP exposed) collectives, not overlapped
  double backward_input = 0;   // input-gradient GEMMs, memory-bound backward, its collectives
  double backward_weight = 0;  // weight-gradient GEMMs
  double recompute = 0;        // extra forward work for selective/full recomputation
  double forward() const { return forward_compute + forward_comm; }
  double backward() const { return backward_input + backward_weight + recompute; }
  double comm_forward = 0;   // of forward(): collectives
  double comm_backward = 0;  // of backward(): collectives (including recomputation's)
};

LayerCosts layer_costs(const ModelSpec& model, const ParallelLayout& layout, const HardwareSpec& hw,
                       const CostParameters& cost);

// The embedding (first stage) and output head with loss (last stage), one microbatch.
struct EdgeCosts {
  double embedding_forward = 0;
  double embedding_backward = 0;
  double head_forward = 0;
  double head_backward = 0;
};
EdgeCosts edge_costs(const ModelSpec& model, const ParallelLayout& layout, const HardwareSpec& hw,
                     const CostParameters& cost);

// Point-to-point activation transfer between neighbouring pipeline stages, one microbatch.
double pipeline_transfer_seconds(const ModelSpec& model, const ParallelLayout& layout,
                                 const HardwareSpec& hw, const CostParameters& cost);

// Memory-bound optimizer step (AdamW with fp32 master weights, gradient norm) over `local_params`.
double optimizer_seconds(double local_params, const ParallelLayout& layout, const HardwareSpec& hw,
                         const CostParameters& cost);

}  // namespace lattice::plan
