// The run's banner: see run_banner.hpp.
#include "lattice/train/run_banner.hpp"

#include <omp.h>

#include <cstdio>
#include <string>

#include "lattice/parallel/context/context_parallel_mode.hpp"

namespace lattice::train {

void print_run_banner(const TrainConfig& config, mesh::Mesh& mesh, const RunRates& rates,
                      const parallel::DataParallel& data_parallel,
                      const PipelineRank* pipeline_rank, const kernels::Ops& ops) {
  const int ranks = mesh.dp_cp().size();  // the batch group: dp x cp ranks
  const int tp_size = mesh.size(mesh::Axis::tp), cp_size = mesh.size(mesh::Axis::cp);
  const int64_t B = config.training.micro_batch_size, T = config.training.seq_len;
  const int64_t accumulation = config.training.gradient_accumulation_steps;
  std::printf(
      "model %s: %lld parameters (%s), %lld layers, d_model %lld | %s | batch %lld x %lld "
      "tokens x %lld accumulation x %d ranks | %d threads per rank\n",
      config.model.name.c_str(), static_cast<long long>(config.model.parameter_count()),
      model::family_name(config.model.family).c_str(),
      static_cast<long long>(config.model.n_layers), static_cast<long long>(config.model.d_model),
      std::string(kernels::precision_name(config.training.precision)).c_str(),
      static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(accumulation),
      ranks / cp_size, omp_get_max_threads());
  // Under context parallelism the gradients and the loss are reduced over dp x cp.
  const std::string batch_ranks = cp_size > 1 ? "dp x cp = " + std::to_string(ranks / cp_size) +
                                                    " x " + std::to_string(cp_size) + " ranks"
                                              : std::to_string(ranks) + " ranks";
  if (ranks > 1)
    std::printf(
        "data parallel: %s (%s backend), ZeRO stage %lld%s, %zu gradient buckets%s\n",
        batch_ranks.c_str(), std::string(mesh.dp_cp().backend()).c_str(),
        static_cast<long long>(config.parallelism.zero),
        config.parallelism.hsdp_shard_size > 0
            ? (", HSDP shard groups of " + std::to_string(config.parallelism.hsdp_shard_size))
                  .c_str()
            : "",
        data_parallel.layout().buckets().size(),
        config.parallelism.offload_dir.empty() ? "" : ", AdamW state offloaded to files");
  if (cp_size > 1)
    std::printf(
        "context parallel: %d ranks per sequence (%s; each holds 2 of %d chunks, %lld tokens, "
        "load-balanced for the causal mask)\n",
        cp_size,
        config.context_parallel.mode == parallel::ContextParallelMode::ring
            ? "ring attention: key/value blocks passed around the ranks"
            : "Ulysses: all-to-all to head shards around attention",
        2 * cp_size, static_cast<long long>(T / cp_size));
  if (tp_size > 1)
    std::printf(
        "tensor parallel: %d ranks per replica (attention heads, key/value heads and MLP split; "
        "embedding, head and loss split by vocabulary), %s\n",
        tp_size,
        config.parallelism.sequence_parallel
            ? "sequence parallel (norms and residuals on 1/tp of the rows each; an all-gather "
              "and a reduce-scatter per sub-layer each way)"
            : "one all-reduce per sub-layer each way");
  if (pipeline_rank) {
    const pipeline::Schedule& s = pipeline_rank->schedule();
    std::string blocks;
    for (int stage = 0; stage < pipeline_rank->partition().stages(); ++stage)
      blocks += (stage ? "," : "") + std::to_string(pipeline_rank->partition().layers(stage));
    std::printf(
        "pipeline parallel: %d ranks, %s schedule%s, %d microbatches, %d virtual stages of "
        "[%s] blocks%s\n",
        s.num_ranks,
        config.parallelism.pipeline_schedule_file.empty()
            ? pipeline::schedule_kind_name(s.kind).c_str()
            : config.parallelism.pipeline_schedule_file.c_str(),
        s.splits_weight_gradient ? " (B and W split)" : "", s.num_microbatches, s.num_stages(),
        blocks.c_str(),
        config.model.tied_embeddings ? ", tied embedding summed between first and last stage" : "");
  }
  std::printf("FLOPs per token %.3g (6N + 12·L·T·d); peak %.3f TFLOP/s (%s)\n",
              rates.flops_per_token, rates.peak_flops / 1e12, rates.peak_source.c_str());
  if (config.training.precision == kernels::Precision::bf16)
    std::printf("%s\n", ops.describe_bf16().c_str());
}

}  // namespace lattice::train
