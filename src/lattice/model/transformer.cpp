// Transformer model: see transformer.hpp.
#include "lattice/model/transformer.hpp"

#include <algorithm>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/model/block_description.hpp"
#include "lattice/model/transformer_block.hpp"

namespace lattice::model {

namespace k = lattice::kernels;

namespace {
// Hook calls for unit `unit` (no-ops without hooks or for a unit this stage lacks).
void hook_before_forward(const LayerContext& ctx, int unit) {
  if (ctx.hooks && unit >= 0) ctx.hooks->before_forward(unit);
}
void hook_after_forward(const LayerContext& ctx, int unit) {
  if (ctx.hooks && unit >= 0) ctx.hooks->after_forward(unit);
}
void hook_before_backward(const LayerContext& ctx, int unit) {
  if (ctx.hooks && unit >= 0) ctx.hooks->before_backward(unit);
}
void hook_after_backward(const LayerContext& ctx, int unit) {
  if (ctx.hooks && unit >= 0) ctx.hooks->after_backward(unit);
}
}  // namespace

Transformer::Transformer(const ModelConfig& config, MemoryTracker* tracker, StageRange range,
                         TensorParallelGroup tp, ExpertParallelGroup ep, DeviceMemory& memory)
    : Transformer(config, range, tp, ep, DeclareOnly{}) {
  tracker_ = tracker;
  params_.allocate(tracker_, memory);
}

int64_t Transformer::parameter_count(const ModelConfig& config, StageRange range) {
  const Transformer declared(config, range, {}, {}, DeclareOnly{});
  int64_t count = 0;  // the elements themselves, not the flat buffer's alignment padding
  for (const ParameterInfo& info : declared.parameters().parameters()) count += info.numel;
  return count;
}

std::unique_ptr<Transformer> Transformer::declared_only(const ModelConfig& config, StageRange range,
                                                        TensorParallelGroup tp,
                                                        ExpertParallelGroup ep) {
  check(tp.size >= 1 && tp.rank >= 0 && tp.rank < tp.size,
        "tensor-parallel rank " + std::to_string(tp.rank) + " of " + std::to_string(tp.size) +
            " is not a rank of the group (internal error)");
  check(ep.size >= 1 && ep.rank >= 0 && ep.rank < ep.size,
        "expert-parallel rank " + std::to_string(ep.rank) + " of " + std::to_string(ep.size) +
            " is not a rank of the group (internal error)");
  return std::unique_ptr<Transformer>(new Transformer(config, range, tp, ep, DeclareOnly{}));
}

Transformer::Transformer(const ModelConfig& config, StageRange range, TensorParallelGroup tp,
                         ExpertParallelGroup ep, DeclareOnly)
    : config_(config), range_(range), tp_(tp), ep_(ep), tracker_(nullptr) {
  config_.validate();
  check(!tp.sequence_parallel || tp.size > 1,
        "sequence parallelism splits the sequence over the tensor-parallel ranks: set "
        "parallelism.tp > 1, or turn parallelism.sequence_parallel off");
  if (range_.last_block < 0) range_.last_block = config_.n_layers;
  check(range_.first_block >= 0 && range_.first_block < range_.last_block &&
            range_.last_block <= config_.n_layers,
        "stage block range [" + std::to_string(range_.first_block) + ", " +
            std::to_string(range_.last_block) + ") does not fit a model of " +
            std::to_string(config_.n_layers) + " layers");
  // Each block as its family describes it (block_description.hpp).
  std::vector<BlockDescription> descriptions;
  for (int64_t i = range_.first_block; i < range_.last_block; ++i)
    descriptions.push_back(describe_block(config_, i));
  const bool gpt2 = config_.family == Family::gpt2;
  if (has_embedding()) embedding_.emplace(params_, config_, tp);
  // Units are contiguous ranges of the flat buffer: parameters are laid out in declaration order
  // (expert-parallel experts excepted, below). unit_params: each unit's first parameter index.
  std::vector<size_t> unit_params;
  size_t first_param = 0;
  auto close_unit = [&](bool outer) {
    const int64_t begin = units_.empty() ? 0 : units_.back().end;
    units_.push_back({begin, params_.size(), outer});
    unit_params.push_back(first_param);
    first_param = params_.parameters().size();
    return static_cast<int>(units_.size()) - 1;
  };
  if (has_embedding()) embedding_unit_ = close_unit(true);
  if (descriptions.front().attention.rope)
    rope_.emplace(config_.max_seq_len, config_.rope_head_dim(), config_.rope_theta,
                  config_.rope_scaling);
  first_block_unit_ = static_cast<int>(units_.size());
  const parallel::SequenceLayout layout(tp);
  for (int64_t i = range_.first_block; i < range_.last_block; ++i) {
    const BlockDescription& d = descriptions[static_cast<size_t>(i - range_.first_block)];
    blocks_.push_back(
        std::make_unique<TransformerBlock>(params_, d, i, layout, rope_ ? &*rope_ : nullptr, ep));
    close_unit(false);
  }
  if (has_head()) {
    // A tied head shares the token embedding when this stage holds both; an untied copy of a tied
    // head (a last stage without the embedding) starts equal to the embedding.
    const bool shares = config_.tied_embeddings && has_embedding();
    const std::string embedding_name =
        gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight";
    head_.emplace(params_, config_, shares ? embedding_->token_weight() : -1,
                  config_.tied_embeddings ? embedding_name : "", tp);
    head_unit_ = close_unit(true);
  }
  if (ep.size > 1) place_experts_last(unit_params);
  // One pipeline stage of several: no other rank of the pp axis holds these parameters.
  if (!has_embedding() || !has_head()) params_.hold_along(mesh::Axis::pp);
}

void Transformer::place_experts_last(const std::vector<size_t>& unit_first_params) {
  params_.place_last(mesh::Axis::ep);
  const auto& params = params_.parameters();
  const int64_t trailing = params_.trailing_offset();
  int64_t dense = 0, experts = trailing;  // where the next unit's ranges begin
  for (size_t u = 0; u < units_.size(); ++u) {
    const size_t last = u + 1 < units_.size() ? unit_first_params[u + 1] : params.size();
    ParameterUnit& unit = units_[u];
    unit.begin = unit.end = dense;
    unit.expert_begin = unit.expert_end = experts;
    // Each range ends where the next parameter of its region begins (offsets are aligned).
    for (size_t i = unit_first_params[u]; i < last; ++i) {
      const bool expert = params[i].offset >= trailing;
      int64_t& end = expert ? unit.expert_end : unit.end;
      end = params[i].offset + ParameterStore::aligned_extent(params[i].numel);
    }
    dense = unit.end;
    experts = unit.expert_end;
  }
  check(dense == trailing && experts == params_.size(),
        "expert-parallel parameter layout: the units do not tile the store (internal error)");
}

Transformer::~Transformer() = default;

void Transformer::initialize(uint64_t seed) {
  params_.initialize(seed, config_.init_std, config_.n_layers);
}

void Transformer::set_activation_checkpointing(const ActivationCheckpoint& checkpointing) {
  checkpointing.validate();
  checkpointing_ = checkpointing;
}

bool Transformer::recomputes_block(size_t i) const {
  const int64_t global = range_.first_block + static_cast<int64_t>(i);
  return checkpointing_.recomputes_block(global);
}

StageActivations Transformer::make_activations() const {
  StageActivations a;
  for (const auto& block : blocks_) a.blocks.push_back(block->make_activations());
  return a;
}

void Transformer::trunk_forward(const LayerContext& ctx, StageActivations& a, const int32_t* tokens,
                                const float* hidden_in, int64_t B, int64_t T, float loss_scale) {
  check(params_.allocated(),
        "this model was made by Transformer::declared_only (no parameters allocated): it can "
        "be counted and estimated, not run");
  check(B > 0 && T > 0, "batch and sequence length must be positive");
  check(T <= config_.max_seq_len, "sequence length " + std::to_string(T) +
                                      " exceeds model.max_seq_len " +
                                      std::to_string(config_.max_seq_len) +
                                      ": lower training.seq_len or raise model.max_seq_len");
  check(a.blocks.size() == blocks_.size(),
        "the activation set was made for another stage: make it with this model's "
        "make_activations()");
  check(!a.weight_gradients_pending,
        "forward into an activation set whose weight gradients are still pending: run "
        "backward_stage_weight first");
  check(!tp_.sequence_parallel || (B * T) % tp_.size == 0,
        "sequence parallelism splits the " + std::to_string(B * T) +
            " tokens of a micro-batch over tp = " + std::to_string(tp_.size) +
            " ranks: make micro_batch_size x seq_len divisible by tp");
  const int64_t local = tp_.local_rows(B * T), C = config_.d_model;
  a.B = B;
  a.T = T;
  a.gradient_ready = false;
  a.residual.resize(blocks_.size() + 1);
  for (auto& r : a.residual) ensure_activation(r, {local, C}, ctx.ops.memory(), tracker_);
  if (has_embedding()) {
    hook_before_forward(ctx, embedding_unit_);
    embedding_->check_tokens(tokens, B * T, "token");
    embedding_->forward(ctx, a.residual[0].f32(),
                        stage_ids(a.tokens, tokens, B * T, ctx.ops.memory()), B, T);
    hook_after_forward(ctx, embedding_unit_);
  } else {
    ctx.ops.copy(a.residual[0].f32(), hidden_in, local * C);
  }
  const bool selective = checkpointing_.mode == Recompute::kSelective;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const int unit = first_block_unit_ + static_cast<int>(i);
    hook_before_forward(ctx, unit);
    a.blocks[i]->recompute_attention = selective;
    a.blocks[i]->loss_scale = loss_scale;
    blocks_[i]->forward(ctx, *a.blocks[i], a.residual[i + 1].f32(), a.residual[i].f32(), B, T);
    if (loss_scale != 0.0f)
      if (auto statistics = blocks_[i]->moe_statistics(*a.blocks[i]))
        add_moe_statistics(*statistics);
    // Full checkpointing: only the block's input (a.residual[i]) is kept.
    if (recomputes_block(i)) a.blocks[i]->release();
    hook_after_forward(ctx, unit);
  }
}

float Transformer::forward_stage(const LayerContext& ctx, StageActivations& a,
                                 const int32_t* tokens, const float* hidden_in,
                                 const int32_t* targets, int64_t B, int64_t T, float loss_scale) {
  const int64_t rows = B * T;
  trunk_forward(ctx, a, tokens, hidden_in, B, T, loss_scale);
  if (!has_head()) {
    a.gradient_ready = loss_scale != 0.0f;
    return 0.0f;
  }
  const int64_t V = config_.vocab_size;
  int64_t counted = 0;
  for (int64_t i = 0; i < rows; ++i) {
    if (targets[i] >= V)  // the message is built only on failure: this loop runs every step
      throw Error("target id " + std::to_string(targets[i]) + " is outside the vocabulary [0, " +
                  std::to_string(V) + "): the data does not match model.vocab_size");
    counted += targets[i] >= 0;
  }
  check(counted > 0, "the batch has no target to train on (every target is ignored)");
  const float grad_scale = loss_scale / static_cast<float>(counted);
  hook_before_forward(ctx, head_unit_);
  const int32_t* device_targets = stage_ids(a.targets, targets, rows, ctx.ops.memory());
  const double loss_sum =
      head_->forward_loss(ctx, a.head, a.residual.back().f32(), device_targets, rows,
                          loss_scale != 0.0f ? grad_scale : 0.0f, tracker_);
  hook_after_forward(ctx, head_unit_);
  a.gradient_ready = loss_scale != 0.0f;
  return static_cast<float>(loss_sum / static_cast<double>(counted));
}

void Transformer::backward_parts(const LayerContext& ctx, StageActivations& a,
                                 const float* d_hidden_out, BackwardPart part) {
  const int64_t B = a.B, T = a.T, rows = B * T, local = tp_.local_rows(rows), C = config_.d_model;
  if (part != BackwardPart::weight) {
    check(a.gradient_ready, "backward() needs a preceding training forward (loss_scale != 0)");
    a.gradient_ready = false;
    ensure_activation(a.d_residual, {local, C}, ctx.ops.memory(), tracker_);
    if (has_head()) {
      hook_before_backward(ctx, head_unit_);
      head_->backward(ctx, a.head, a.d_residual.f32(), a.residual.back().f32(), rows, part,
                      tracker_);
      if (part == BackwardPart::both) hook_after_backward(ctx, head_unit_);
    } else
      ctx.ops.copy(a.d_residual.f32(), d_hidden_out, local * C);
    // Each block's d_x_in overwrites its d_x_out in place.
    for (size_t i = blocks_.size(); i-- > 0;) {
      const int unit = first_block_unit_ + static_cast<int>(i);
      BlockActivations& saved = *a.blocks[i];
      const float* x_in = a.residual[i].f32();
      hook_before_backward(ctx, unit);
      // Full checkpointing: the block's forward again, from its kept input, into the same output
      // buffer (the values it already holds: the blocks after it are done with it).
      if (recomputes_block(i)) blocks_[i]->forward(ctx, saved, a.residual[i + 1].f32(), x_in, B, T);
      if (part == BackwardPart::both) {
        blocks_[i]->backward(ctx, saved, a.d_residual.f32(), a.d_residual.f32(), x_in, B, T,
                             scratch_);
        if (recomputes_block(i)) saved.release();
        hook_after_backward(ctx, unit);
      } else {
        blocks_[i]->backward_input(ctx, saved, a.d_residual.f32(), a.d_residual.f32(), x_in, B, T,
                                   scratch_);
      }
    }
    if (has_embedding()) {
      hook_before_backward(ctx, embedding_unit_);
      if (part == BackwardPart::both) {
        embedding_->backward(ctx, a.d_residual.f32(), a.tokens.data<int32_t>(), B, T);
        hook_after_backward(ctx, embedding_unit_);
      }
    }
    a.weight_gradients_pending = part == BackwardPart::input;
    return;
  }
  // The weight half, in the same unit order as the whole backward.
  check(a.weight_gradients_pending,
        "backward_stage_weight needs a preceding backward_stage_input on the same activations");
  if (has_head()) {
    head_->backward(ctx, a.head, nullptr, a.residual.back().f32(), rows, BackwardPart::weight,
                    tracker_);
    hook_after_backward(ctx, head_unit_);
  }
  for (size_t i = blocks_.size(); i-- > 0;) {
    blocks_[i]->backward_weight(ctx, *a.blocks[i], a.residual[i].f32(), B, T);
    if (recomputes_block(i)) a.blocks[i]->release();
    hook_after_backward(ctx, first_block_unit_ + static_cast<int>(i));
  }
  if (has_embedding()) {
    embedding_->backward(ctx, a.d_residual.f32(), a.tokens.data<int32_t>(), B, T);
    hook_after_backward(ctx, embedding_unit_);
  }
  a.weight_gradients_pending = false;
}

void Transformer::backward_stage(const LayerContext& ctx, StageActivations& a,
                                 const float* d_hidden_out) {
  backward_parts(ctx, a, d_hidden_out, BackwardPart::both);
}

void Transformer::backward_stage_input(const LayerContext& ctx, StageActivations& a,
                                       const float* d_hidden_out) {
  backward_parts(ctx, a, d_hidden_out, BackwardPart::input);
}

void Transformer::backward_stage_weight(const LayerContext& ctx, StageActivations& a) {
  backward_parts(ctx, a, nullptr, BackwardPart::weight);
}

float Transformer::forward_stage(const LayerContext& ctx, const int32_t* tokens,
                                 const float* hidden_in, const int32_t* targets, int64_t B,
                                 int64_t T, float loss_scale) {
  if (own_.blocks.size() != blocks_.size()) own_ = make_activations();
  return forward_stage(ctx, own_, tokens, hidden_in, targets, B, T, loss_scale);
}

void Transformer::backward_stage(const LayerContext& ctx, const float* d_hidden_out) {
  backward_stage(ctx, own_, d_hidden_out);
}

float Transformer::forward(const LayerContext& ctx, const int32_t* tokens, const int32_t* targets,
                           int64_t B, int64_t T, float loss_scale) {
  check(has_embedding() && has_head(), "forward() needs the whole model; use forward_stage()");
  return forward_stage(ctx, tokens, nullptr, targets, B, T, loss_scale);
}

void Transformer::backward(const LayerContext& ctx) {
  backward_stage(ctx, nullptr);
}

float Transformer::evaluate(const LayerContext& ctx, const int32_t* tokens, const int32_t* targets,
                            int64_t B, int64_t T) {
  return forward(ctx, tokens, targets, B, T, 0.0f);
}

const float* Transformer::logits(const LayerContext& ctx, const int32_t* tokens, int64_t B,
                                 int64_t T) {
  check(has_embedding() && has_head(), "logits() needs the whole model");
  if (own_.blocks.size() != blocks_.size()) own_ = make_activations();
  trunk_forward(ctx, own_, tokens, nullptr, B, T, 0.0f);
  hook_before_forward(ctx, head_unit_);
  const float* logits = head_->logits(ctx, own_.head, own_.hidden_out(), B * T, tracker_);
  hook_after_forward(ctx, head_unit_);
  return logits;
}

const float* Transformer::hidden_out() const {
  return own_.hidden_out();
}
const float* Transformer::d_hidden_in() const {
  return own_.d_hidden_in();
}

void Transformer::release_activations() {
  own_.release();
}

void Transformer::add_moe_statistics(const MoeLayerStatistics& s) {
  for (MoeLayerStatistics& sum : moe_statistics_) {
    if (sum.layer != s.layer) continue;
    sum.tokens += s.tokens;
    sum.copies += s.copies;
    sum.dropped += s.dropped;
    for (size_t e = 0; e < sum.counts.size(); ++e) sum.counts[e] += s.counts[e];
    sum.aux_loss += s.aux_loss;
    sum.z_loss += s.z_loss;
    sum.forwards += s.forwards;
    return;
  }
  moe_statistics_.push_back(s);
}

void Transformer::update_choice_bias(int64_t layer, const std::vector<int64_t>& load, double rate) {
  if (layer < range_.first_block || layer >= range_.last_block) return;
  blocks_[static_cast<size_t>(layer - range_.first_block)]->update_choice_bias(load, rate);
}

std::vector<MoeLayerStatistics> Transformer::take_moe_statistics() {
  std::vector<MoeLayerStatistics> taken;
  taken.swap(moe_statistics_);
  return taken;
}

}  // namespace lattice::model
