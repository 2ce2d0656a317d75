// Training benchmark: times Lattice's training step (train/training_step.hpp: forward, backward,
// gradient reduction, clipping, AdamW) on a fixed random batch, on one rank or data- and
// tensor-parallel over local ranks, and runs the PyTorch peer
// (bench/pytorch_train.py, alone or under DDP, eager or under torch.compile) on the same model and
// batch so the two are measured side by side in one invocation.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lattice/kernels/precision.hpp"
#include "lattice/model/model_config.hpp"

namespace lattice::train {

struct BenchmarkCase {
  std::string label;
  model::ModelConfig model;
  int64_t batch = 8, seq_len = 256;
};

// The benchmark's shapes: "small" (the PyTorch reference shape of docs/performance.md,
// L4 d256 h4 V8192 at T256 B8), "gpt2-124m" (at T1024 B4) or "all"; throws Error naming the
// choices for another name.
std::vector<BenchmarkCase> benchmark_cases(const std::string& which);

struct ThroughputResult {
  double tokens_per_second = 0;
  double seconds_per_step = 0;
  // Lattice under tensor parallelism: rank 0's exposed tp communication per timed step (the
  // blocking all-reduces and the waits for the overlapped ones).
  double tp_comm_seconds_per_step = 0;
  std::string blas;  // PyTorch only: the BLAS its fp32 GEMMs ran on, as its script names it
  // PyTorch under torch.compile only: its first step's time over a timed step's (the compile).
  double compile_seconds = 0;
};

// Lattice: `warmup` untimed steps, then `steps` timed ones. With ranks > 1, local ranks (threads,
// each with 1/ranks of the OpenMP threads) laid out as ranks / tp data-parallel replicas of `tp`
// tensor-parallel ranks; each replica takes 1/(ranks / tp) of the batch. tokens/s are of the
// whole batch. `tp_overlap` false makes every tp collective blocking
// (TensorParallelGroup::overlap); `sequence_parallel` runs tp > 1 with sequence parallelism.
ThroughputResult benchmark_lattice_training(const BenchmarkCase& c, kernels::Precision precision,
                                            int64_t steps, int64_t warmup, int ranks = 1,
                                            int tp = 1, bool tp_overlap = true,
                                            bool sequence_parallel = false);

// How the PyTorch peer allocates memory. PyTorch 1.13 on glibc malloc maps and faults in its
// large activation blocks afresh every step; Intel's CPU tuning guide for PyTorch preloads jemalloc
// with memory kept across steps, which measured here 1.2-1.3x faster than glibc (small shape, bf16,
// 1 x 2), and faster than glibc with its huge-page tunable.
enum class PytorchAllocator {
  jemalloc,   // LD_PRELOAD libjemalloc.so.2 with kPytorchJemallocConf
  glibc_thp,  // glibc malloc, GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (huge pages advised)
  glibc,      // PyTorch's default
};
inline constexpr const char* kPytorchJemallocConf =
    "oversize_threshold:1,background_thread:true,metadata_thp:auto,dirty_decay_ms:-1,"
    "muzzy_decay_ms:-1";
// "auto" (jemalloc when libjemalloc2 is installed, else glibc-thp), "jemalloc", "glibc-thp" or
// "glibc"; throws Error naming the fix for an unknown name or a missing jemalloc.
PytorchAllocator parse_pytorch_allocator(const std::string& name);
std::string pytorch_allocator_name(PytorchAllocator allocator);
// The environment assignments that select `allocator` for a shell command (ends with a space).
std::string pytorch_allocator_environment(PytorchAllocator allocator);

// The python the PyTorch peer runs on unless told otherwise: that of the venv
// scripts/install_peers.sh creates (the newest torch 2.x from PyPI) at $LATTICE_PEER_VENV, else
// /opt/lattice/peer-venv, where it exists; else Debian's /usr/bin/python3 (python3-torch).
std::string default_pytorch_python();

// What the torch of a python offers the peer (`script --probe`).
struct PytorchPeer {
  std::string torch;  // torch.__version__
  std::string blas;   // the BLAS and oneDNN its GEMMs run on, as the script names them
  // scaled_dot_product_attention (torch >= 2.0), AdamW(fused=True) on CPU (>= 2.4),
  // torch.compile (>= 2.0).
  bool sdpa = false, fused_adamw = false, compile = false;
};
// Runs `script --probe` through `python` (on `allocator`, as the runs will); nullopt (with the
// reason and the fix in `why`) when that python cannot run the peer.
std::optional<PytorchPeer> probe_pytorch(const std::string& python, const std::string& script,
                                         PytorchAllocator allocator, std::string& why);

// PyTorch peer through `python` running `script` with `threads` threads in all; with ranks > 1,
// DistributedDataParallel over gloo in `ranks` processes of threads / ranks threads each; with
// `compile`, the model and its loss under torch.compile (the warmup absorbs the compile, at least
// one step). The peer runs in its best setup otherwise (SDPA attention and fused AdamW where the
// torch has them). nullopt (with the reason in `why`, on one line) when PyTorch cannot run here or
// the compile fails.
std::optional<ThroughputResult> benchmark_pytorch_training(
    const BenchmarkCase& c, kernels::Precision precision, int64_t steps, int64_t warmup,
    int threads, const std::string& python, const std::string& script, std::string& why, int ranks,
    PytorchAllocator allocator, bool compile = false);

}  // namespace lattice::train
