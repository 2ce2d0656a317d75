// Transformer: a GPT-2 or Llama model, or one pipeline stage of it — a container of a contiguous
// run of its modules (the Embedding on the first stage, a range of blocks, the LmHead with the
// final norm and the loss on the last) — with hand-written forward and backward over flat
// parameter and gradient buffers and caller-owned activations (StageActivations).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "lattice/kernels/rope_table.hpp"
#include "lattice/model/activation_checkpoint.hpp"
#include "lattice/model/block.hpp"
#include "lattice/model/embedding.hpp"
#include "lattice/model/expert_parallel_comm.hpp"
#include "lattice/model/kv_cache.hpp"
#include "lattice/model/lm_head.hpp"
#include "lattice/model/model_config.hpp"
#include "lattice/model/parameter_store.hpp"
#include "lattice/model/stage_activations.hpp"

namespace lattice::model {

// Which part of the model this instance holds: blocks [first_block, last_block).
struct StageRange {
  int64_t first_block = 0;
  int64_t last_block = -1;  // -1: up to n_layers
};

// A parameter unit: the parameters one hook call covers, a contiguous range [begin, end) of the
// flat buffers (element offsets). Units are in forward order: the embedding (first stage), each
// block, the head (final norm and, unless tied to the embedding in this store, the head weight).
// Under expert parallelism (ep > 1) a MoE block's experts are laid out after every other parameter
// of the store (ParameterStore::place_last): the block's unit also covers [expert_begin,
// expert_end) there, and the units' dense ranges tile [0, trailing_offset), their expert ranges the
// rest, each in forward order.
struct ParameterUnit {
  int64_t begin = 0, end = 0;
  bool outer = false;                        // the embedding or the head
  int64_t expert_begin = 0, expert_end = 0;  // empty: no expert-parallel parameters

  bool has_experts() const { return expert_end > expert_begin; }
};

class Transformer {
 public:
  // `ep`: the expert-parallel group a MoE model's experts are split over (each rank holds
  // n_experts / ep.size of every MoE layer's experts). The parameters and their gradients are
  // allocated from `memory`: the backend's (kernels::Ops::memory()) the model will run on.
  Transformer(const ModelConfig& config, MemoryTracker* tracker, StageRange range = {},
              TensorParallelGroup tp = {}, ExpertParallelGroup ep = {},
              DeviceMemory& memory = host_memory());
  ~Transformer();
  // The number of parameter elements a model (or stage) of `config` holds (a tied head counted
  // once), from the same declarations the constructor makes, without allocating them (any preset,
  // 405B included).
  static int64_t parameter_count(const ModelConfig& config, StageRange range = {});
  // A model whose parameters are declared but not allocated (no values, no gradients): its
  // structure for counts and estimates (activation_memory.hpp) of any size; it cannot run. With a
  // tensor-parallel group, tp rank `tp.rank`'s shards of `tp.size` (tp.comm may be null: the
  // declarations read only the size and rank).
  static std::unique_ptr<Transformer> declared_only(const ModelConfig& config,
                                                    StageRange range = {},
                                                    TensorParallelGroup tp = {},
                                                    ExpertParallelGroup ep = {});
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  const ModelConfig& config() const { return config_; }
  ParameterStore& parameters() { return params_; }
  const ParameterStore& parameters() const { return params_; }
  bool has_embedding() const { return range_.first_block == 0; }
  bool has_head() const { return range_.last_block == config_.n_layers; }
  const StageRange& stage_range() const { return range_; }
  // The stage's modules (block(i) is global block stage_range().first_block + i; head() only
  // where has_head()).
  int64_t block_count() const { return static_cast<int64_t>(blocks_.size()); }
  const Block& block(int64_t i) const { return *blocks_.at(static_cast<size_t>(i)); }
  const LmHead& head() const { return *head_; }
  // The token embedding's parameter index (on the first stage; -1 elsewhere).
  int token_embedding_weight() const { return embedding_ ? embedding_->token_weight() : -1; }
  // The tensor-parallel group the layers were built with (size 1 without tensor parallelism).
  const TensorParallelGroup& tensor_parallel() const { return tp_; }
  const ExpertParallelGroup& expert_parallel() const { return ep_; }

  // The parameter units in forward order (see ParameterUnit); hooks receive indices into it.
  const std::vector<ParameterUnit>& units() const { return units_; }
  // True when the head reads the embedding's weight (tied embeddings in one store).
  bool head_uses_embedding() const {
    return has_head() && has_embedding() && head_->weight() == embedding_->token_weight();
  }

  void set_head_fusion(HeadFusion fusion) {
    if (head_) head_->set_fusion(fusion);
  }
  // Activation checkpointing (activation_checkpoint.hpp): full reruns the forward of every
  // interval-th block (global index) right before its backward, keeping only its input;
  // selective drops each block's attention output and log-sum-exp and recomputes them from the
  // saved q, k, v. Losses and gradients are bit-identical to none: the same arithmetic again.
  void set_activation_checkpointing(const ActivationCheckpoint& checkpointing);
  const ActivationCheckpoint& activation_checkpointing() const { return checkpointing_; }

  // Draws initial weights from `seed` (per-parameter generators: independent of the stage layout).
  void initialize(uint64_t seed);

  // Whole-model training forward: tokens and targets are [B, T] (targets < 0 are ignored). Returns
  // the mean cross-entropy over counted targets and prepares backward() to accumulate the gradient
  // of loss_scale · mean loss (loss_scale = 1/accumulation steps). Requires a model holding every
  // block.
  float forward(const LayerContext& ctx, const int32_t* tokens, const int32_t* targets, int64_t B,
                int64_t T, float loss_scale);
  void backward(const LayerContext& ctx);
  // Forward only: the mean loss (for validation); no gradient is prepared.
  float evaluate(const LayerContext& ctx, const int32_t* tokens, const int32_t* targets, int64_t B,
                 int64_t T);
  // Forward only: logits [B·T, vocab] (valid until the next call).
  const float* logits(const LayerContext& ctx, const int32_t* tokens, int64_t B, int64_t T);

  // Incremental inference (transformer_inference.cpp; whole model only). An empty KV cache for
  // `batch` sequences of up to max_seq_len positions (under a sliding window W, 2W slots that roll:
  // kv_cache.hpp).
  KvCache make_kv_cache(int64_t batch, DeviceMemory& memory,
                        MemoryTracker* tracker = nullptr) const;
  // Runs tokens [B, n] at positions [cache.length(), cache.length() + n) (absolute positions for
  // GPT-2's learned position embeddings and Llama's RoPE angles), appends their keys and values to
  // `cache` and returns the logits of each sequence's last new position, [B, vocab] (valid until
  // the next call). Prefill a prompt with one call (a windowed cache takes it in pieces), then
  // feed one token at a time. Throws when the positions would pass max_seq_len (clear the cache
  // and re-prefill a shorter window). Overwrites
  // the training activations: no backward may follow.
  const float* forward_cached(const LayerContext& ctx, KvCache& cache, const int32_t* tokens,
                              int64_t B, int64_t n);

  // An empty set of this stage's saved activations (one per microbatch in flight).
  StageActivations make_activations() const;

  // Stage-level forward/backward on caller-owned activations (the pipeline seam). The first stage
  // reads tokens, later stages read hidden_in [B·T, d_model] (under sequence parallelism this
  // rank's sequence rows, B·T / tp, as are hidden_out and the gradients); the last stage computes
  // the loss from targets, earlier ones leave their output in saved.hidden_out(). backward_stage
  // takes d_hidden_out (ignored on the last stage) and leaves ∂/∂hidden_in in saved.d_hidden_in()
  // on stages after the first. forward_stage returns the mean loss on the last stage. Any number of
  // sets may be between their forward and their backward, and backwards may run in any order.
  float forward_stage(const LayerContext& ctx, StageActivations& saved, const int32_t* tokens,
                      const float* hidden_in, const int32_t* targets, int64_t B, int64_t T,
                      float loss_scale);
  void backward_stage(const LayerContext& ctx, StageActivations& saved, const float* d_hidden_out);
  // backward_stage in two halves (zero-bubble schedules): the input half (B) leaves
  // saved.d_hidden_in() and keeps each Linear's output gradient; the weight half (W) then
  // accumulates the weight gradients (the embedding's among them). B then W gives
  // backward_stage's bits. Hooks: before_backward(unit) in B, after_backward(unit) in W.
  void backward_stage_input(const LayerContext& ctx, StageActivations& saved,
                            const float* d_hidden_out);
  void backward_stage_weight(const LayerContext& ctx, StageActivations& saved);

  // The same on the model's own activation set (one microbatch at a time). The first stage reads
  // tokens, later stages read hidden_in [B·T, d_model]; the last stage computes the loss from
  // targets, earlier ones leave their output in hidden_out(). backward_stage takes d_hidden_out
  // (ignored on the last stage) and leaves ∂/∂hidden_in in d_hidden_in() on stages after the first.
  // Returns the mean loss on the last stage.
  float forward_stage(const LayerContext& ctx, const int32_t* tokens, const float* hidden_in,
                      const int32_t* targets, int64_t B, int64_t T, float loss_scale);
  void backward_stage(const LayerContext& ctx, const float* d_hidden_out);
  const float* hidden_out() const;
  const float* d_hidden_in() const;

  void release_activations();

  // This stage's MoE layers' routing, summed over the training forwards (loss_scale != 0) since
  // the last call (each entry's `forwards` of them; counts, tokens, drops and losses summed), in
  // block order; then starts again. Empty for a dense model.
  std::vector<MoeLayerStatistics> take_moe_statistics();
  // Auxiliary-loss-free balancing: moves the choice bias of global block `layer`, when this stage
  // holds it and it has one, by `rate` towards balance given its experts' load over the step
  // (summed over every rank that trained the step; the same on every rank, so the copies stay
  // equal). Between steps, with the parameters whole (not under ZeRO-3).
  void update_choice_bias(int64_t layer, const std::vector<int64_t>& load, double rate);

 private:
  struct DeclareOnly {};
  Transformer(const ModelConfig& config, StageRange range, TensorParallelGroup tp,
              ExpertParallelGroup ep, DeclareOnly);
  // Embedding (or hidden_in) then this stage's blocks; leaves the output in a.residual.back().
  // loss_scale: the micro-batch's weight in the step's loss (0: no backward follows).
  void trunk_forward(const LayerContext& ctx, StageActivations& a, const int32_t* tokens,
                     const float* hidden_in, int64_t B, int64_t T, float loss_scale);
  void add_moe_statistics(const MoeLayerStatistics& s);
  // Whether block i of this stage recomputes its forward in backward (full checkpointing).
  bool recomputes_block(size_t i) const;
  void backward_parts(const LayerContext& ctx, StageActivations& a, const float* d_hidden_out,
                      BackwardPart part);
  // ep > 1: the experts laid out after every other parameter, and the units' ranges to match
  // (each unit's first parameter index given).
  void place_experts_last(const std::vector<size_t>& unit_first_params);

  ModelConfig config_;
  StageRange range_;
  TensorParallelGroup tp_;
  ExpertParallelGroup ep_;
  MemoryTracker* tracker_;
  ParameterStore params_;
  std::optional<kernels::RopeTable> rope_;
  // The stage's modules in forward order: the embedding (first stage), its blocks, the head
  // (last stage).
  std::optional<Embedding> embedding_;
  std::vector<std::unique_ptr<Block>> blocks_;
  std::optional<LmHead> head_;

  ActivationCheckpoint checkpointing_;
  // The activations of the single-microbatch API (forward, backward, forward_stage without a set,
  // logits, forward_cached).
  StageActivations own_;
  BackwardScratch scratch_;
  // forward_cached on tokens [first, first + count) of each of the B sequences of n: one piece
  // that fits the cache's free slots (after make_room), through every block; no head.
  void forward_cached_piece(const LayerContext& ctx, KvCache& cache, const int32_t* tokens,
                            int64_t B, int64_t n, int64_t first, int64_t count);

  Tensor last_hidden_;  // forward_cached: each sequence's last hidden state [B, d_model]
  std::vector<ParameterUnit> units_;
  std::vector<MoeLayerStatistics> moe_statistics_;  // take_moe_statistics' running sums
  int embedding_unit_ = -1, first_block_unit_ = 0, head_unit_ = -1;
};

}  // namespace lattice::model
