// A training config's activation estimate and its limit: see activation_estimate.hpp.
#include "lattice/train/activation_estimate.hpp"

#include <cstdio>
#include <string>

#include "lattice/core/error.hpp"
#include "lattice/kernels/make_ops.hpp"
#include "lattice/parallel/context/context_attention_memory.hpp"

namespace lattice::train {

model::ActivationMemory estimate_trainer_activations(const TrainConfig& config) {
  model::TensorParallelGroup tp{nullptr, 0, static_cast<int>(config.parallelism.tp)};
  tp.sequence_parallel = config.parallelism.sequence_parallel;
  auto declared = model::Transformer::declared_only(config.model, {}, tp);
  declared->set_activation_checkpointing(config.activation_checkpoint);
  // The backend the trainer would make (its plan chooses the LM head's path).
  const std::unique_ptr<kernels::Ops> ops = kernels::make_ops(Device::cpu);
  // Under context parallelism each rank holds seq_len / cp tokens of every sequence, and its
  // attention's buffers come on top of one block's.
  const int64_t local_len = config.training.seq_len / config.parallelism.cp;
  int64_t attention = 0;
  if (config.parallelism.cp > 1)
    attention = parallel::context_attention_transient_bytes(
        config.context_parallel.mode, config.training.micro_batch_size, local_len,
        config.model.n_heads / config.parallelism.tp,
        config.model.n_kv_heads / config.parallelism.tp, config.model.head_dim(),
        config.model.family == model::Family::gpt2 &&
            config.training.precision == kernels::Precision::bf16);
  return model::estimate_activation_memory(*declared, config.training.precision,
                                           config.training.micro_batch_size, local_len, *ops,
                                           attention);
}

void check_activation_memory_limit(const TrainConfig& config) {
  if (config.training.activation_memory_limit_mb <= 0) return;
  check(config.parallelism.pp == 1,
        "training.activation_memory_limit_mb is checked for runs without pipeline parallelism; "
        "with parallelism.pp > 1 see `lattice estimate memory --config` per pipeline rank and "
        "leave the limit at 0");
  const double mib = static_cast<double>(estimate_trainer_activations(config).total()) / (1 << 20);
  char text[64];
  std::snprintf(text, sizeof text, "%.1f MiB", mib);
  check(mib <= config.training.activation_memory_limit_mb,
        std::string("the estimated activation memory per rank, ") + text + " (micro-batch " +
            std::to_string(config.training.micro_batch_size) + " x " +
            std::to_string(config.training.seq_len / config.parallelism.cp) +
            " tokens per rank), exceeds "
            "training.activation_memory_limit_mb = " +
            std::to_string(static_cast<int64_t>(config.training.activation_memory_limit_mb)) +
            ": raise parallelism.cp (each rank then holds seq_len / cp tokens of every sequence), "
            "set activation_checkpoint.mode, or lower training.micro_batch_size");
}

}  // namespace lattice::train
