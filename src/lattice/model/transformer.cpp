// Transformer model: see transformer.hpp.
#include "lattice/model/transformer.hpp"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/convert.hpp"
#include "lattice/kernels/cpu/cross_entropy.hpp"
#include "lattice/kernels/cpu/elementwise.hpp"
#include "lattice/kernels/cpu/embedding.hpp"
#include "lattice/kernels/cpu/layernorm.hpp"
#include "lattice/kernels/cpu/rmsnorm.hpp"
#include "lattice/kernels/cpu/row_chunks.hpp"
#include "lattice/model/gpt2_block.hpp"
#include "lattice/model/llama_block.hpp"

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
                         TensorParallelGroup tp)
    : Transformer(config, range, tp, DeclareOnly{}) {
  tracker_ = tracker;
  params_.allocate(tracker_);
}

int64_t Transformer::parameter_count(const ModelConfig& config, StageRange range) {
  const Transformer declared(config, range, {}, DeclareOnly{});
  int64_t count = 0;  // the elements themselves, not the flat buffer's alignment padding
  for (const ParameterInfo& info : declared.parameters().parameters()) count += info.numel;
  return count;
}

Transformer::Transformer(const ModelConfig& config, StageRange range, TensorParallelGroup tp,
                         DeclareOnly)
    : config_(config), range_(range), tracker_(nullptr) {
  config_.validate();
  if (range_.last_block < 0) range_.last_block = config_.n_layers;
  check(range_.first_block >= 0 && range_.first_block < range_.last_block &&
            range_.last_block <= config_.n_layers,
        "stage block range [" + std::to_string(range_.first_block) + ", " +
            std::to_string(range_.last_block) + ") does not fit a model of " +
            std::to_string(config_.n_layers) + " layers");
  const bool gpt2 = config_.family == Family::gpt2;
  const int64_t C = config_.d_model, V = config_.vocab_size;
  if (has_embedding()) {
    token_embedding_ =
        params_.declare(gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight", {V, C},
                        InitKind::normal, true);
    if (gpt2)
      position_embedding_ = params_.declare("transformer.wpe.weight", {config_.max_seq_len, C},
                                            InitKind::normal, true);
  }
  // Units are contiguous ranges of the flat buffer: parameters are laid out in declaration order.
  auto close_unit = [&](bool outer) {
    const int64_t begin = units_.empty() ? 0 : units_.back().end;
    units_.push_back({begin, params_.size(), outer});
    return static_cast<int>(units_.size()) - 1;
  };
  if (has_embedding()) embedding_unit_ = close_unit(true);
  if (!gpt2) rope_.emplace(config_.max_seq_len, config_.head_dim(), config_.rope_theta);
  first_block_unit_ = static_cast<int>(units_.size());
  for (int64_t i = range_.first_block; i < range_.last_block; ++i) {
    if (gpt2)
      blocks_.push_back(std::make_unique<Gpt2Block>(params_, config_, i, tp));
    else
      blocks_.push_back(std::make_unique<LlamaBlock>(params_, config_, i, tp, *rope_));
    close_unit(false);
  }
  if (has_head()) {
    final_norm_weight_ = params_.declare(gpt2 ? "transformer.ln_f.weight" : "model.norm.weight",
                                         {C}, InitKind::ones, false);
    if (gpt2)
      final_norm_bias_ = params_.declare("transformer.ln_f.bias", {C}, InitKind::zeros, false);
    // A tied head shares the token embedding when this stage holds both.
    const std::string embedding_name =
        gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight";
    if (config_.tied_embeddings && has_embedding())
      head_weight_ = token_embedding_;
    else  // an untied copy of a tied head starts equal to the embedding
      head_weight_ = params_.declare("lm_head.weight", {V, C}, InitKind::normal, true,
                                     config_.tied_embeddings ? embedding_name : "");
    head_unit_ = close_unit(true);
  }
}

Transformer::~Transformer() = default;

void Transformer::initialize(uint64_t seed) {
  params_.initialize(seed, config_.init_std, config_.n_layers);
}

void Transformer::set_activation_checkpointing(ActivationCheckpointing checkpointing) {
  check(checkpointing.interval >= 1,
        "activation_checkpoint.interval must be at least 1 (recompute every interval-th block), "
        "got " +
            std::to_string(checkpointing.interval));
  checkpointing_ = checkpointing;
}

bool Transformer::recomputes_block(size_t i) const {
  const int64_t global = range_.first_block + static_cast<int64_t>(i);
  return checkpointing_.mode == ActivationCheckpointing::Mode::full &&
         global % checkpointing_.interval == 0;
}

StageActivations Transformer::make_activations() const {
  StageActivations a;
  for (const auto& block : blocks_) a.blocks.push_back(block->make_activations());
  return a;
}

void Transformer::check_tokens(const int32_t* tokens, int64_t n, const char* what) const {
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= config_.vocab_size)
      throw Error(std::string(what) + " id " + std::to_string(tokens[i]) +
                  " is outside the vocabulary [0, " + std::to_string(config_.vocab_size) +
                  "): the data does not match model.vocab_size");
  }
}

void Transformer::embed(StageActivations& a, const int32_t* tokens, int64_t B, int64_t T) {
  check_tokens(tokens, B * T, "token");
  if (a.tokens.numel() != B * T) a.tokens = Tensor({B * T}, DType::i32);
  std::memcpy(a.tokens.raw(), tokens, sizeof(int32_t) * static_cast<size_t>(B * T));
  const float* wpe = position_embedding_ >= 0 ? params_.value(position_embedding_) : nullptr;
  k::embedding_forward(a.residual[0].f32(), tokens, params_.value(token_embedding_), wpe, B, T,
                       config_.d_model);
}

void Transformer::trunk_forward(const LayerContext& ctx, StageActivations& a, const int32_t* tokens,
                                const float* hidden_in, int64_t B, int64_t T) {
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
  const int64_t rows = B * T, C = config_.d_model;
  a.B = B;
  a.T = T;
  a.gradient_ready = false;
  a.residual.resize(blocks_.size() + 1);
  for (auto& r : a.residual) ensure_activation(r, {rows, C}, tracker_);
  if (has_embedding()) {
    hook_before_forward(ctx, embedding_unit_);
    embed(a, tokens, B, T);
    hook_after_forward(ctx, embedding_unit_);
  } else {
    k::copy(a.residual[0].f32(), hidden_in, rows * C);
  }
  const bool selective = checkpointing_.mode == ActivationCheckpointing::Mode::selective;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const int unit = first_block_unit_ + static_cast<int>(i);
    hook_before_forward(ctx, unit);
    a.blocks[i]->recompute_attention = selective;
    blocks_[i]->forward(ctx, *a.blocks[i], a.residual[i + 1].f32(), a.residual[i].f32(), B, T);
    // Full checkpointing: only the block's input (a.residual[i]) is kept.
    if (recomputes_block(i)) a.blocks[i]->release();
    hook_after_forward(ctx, unit);
  }
}

float Transformer::forward_stage(const LayerContext& ctx, StageActivations& a,
                                 const int32_t* tokens, const float* hidden_in,
                                 const int32_t* targets, int64_t B, int64_t T, float loss_scale) {
  const int64_t rows = B * T;
  trunk_forward(ctx, a, tokens, hidden_in, B, T);
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
  HeadActivations& h = a.head;
  double loss_sum;
  if (ctx.precision == k::Precision::bf16) {
    loss_sum = head_loss_in_row_chunks(ctx, a, targets, grad_scale);
    h.logits_grad_bf16 = loss_scale != 0.0f;
  } else {
    head_forward(ctx, a);
    h.logits_grad_bf16 = false;
    h.backward_in_forward = false;
    if (loss_scale != 0.0f)
      loss_sum = k::cross_entropy_forward_backward(h.logits.f32(), h.logits.f32(), targets, rows, V,
                                                   grad_scale);
    else
      loss_sum = k::cross_entropy_forward(h.logits.f32(), targets, rows, V);
  }
  a.gradient_ready = loss_scale != 0.0f;
  return static_cast<float>(loss_sum / static_cast<double>(counted));
}

void Transformer::head_norm_forward(HeadActivations& h, const float* x, int64_t rows) {
  const int64_t C = config_.d_model;
  ensure_activation(h.normed, {rows, C}, tracker_);
  ensure_activation(h.norm_rstd, {rows}, tracker_);
  if (config_.family == Family::gpt2) {
    ensure_activation(h.norm_mean, {rows}, tracker_);
    k::layernorm_forward(h.normed.f32(), h.norm_mean.f32(), h.norm_rstd.f32(), x,
                         params_.value(final_norm_weight_), params_.value(final_norm_bias_), rows,
                         C, config_.norm_eps);
  } else {
    k::rmsnorm_forward(h.normed.f32(), h.norm_rstd.f32(), x, params_.value(final_norm_weight_),
                       rows, C, config_.norm_eps);
  }
}

double Transformer::head_loss_in_row_chunks(const LayerContext& ctx, StageActivations& a,
                                            const int32_t* targets, float grad_scale) {
  const int64_t rows = a.B * a.T, C = config_.d_model, V = config_.vocab_size;
  HeadActivations& h = a.head;
  hook_before_forward(ctx, head_unit_);
  ensure_bf16_activation(h.normed16, {rows, C}, tracker_);  // kept for the weight gradient
  if (config_.family == Family::gpt2) {  // the LayerNorm writes the GEMM's bf16 input directly
    ensure_activation(h.norm_mean, {rows}, tracker_);
    ensure_activation(h.norm_rstd, {rows}, tracker_);
    h.normed.reset();
    k::layernorm_forward_bf16(h.normed16.data<lattice::bf16>(), h.norm_mean.f32(),
                              h.norm_rstd.f32(), a.residual.back().f32(),
                              params_.value(final_norm_weight_), params_.value(final_norm_bias_),
                              rows, C, config_.norm_eps);
  } else {
    head_norm_forward(h, a.residual.back().f32(), rows);
    k::convert_to_bf16(h.normed16.data<lattice::bf16>(), h.normed.f32(), rows * C);
  }
  h.logits.reset();  // the whole [rows, V] logits never exist here
  std::vector<double> row_losses(static_cast<size_t>(rows), 0.0);
  std::vector<std::vector<float>> work(static_cast<size_t>(omp_get_max_threads()));
  auto row_work = [&]() -> float* {
    auto& row = work[static_cast<size_t>(omp_get_thread_num())];
    if (row.empty()) row.resize(static_cast<size_t>(V));
    return row.data();
  };
  // Rows per chunk: each chunk's GEMM reads the whole head weight again (V·C bf16) and saves
  // writing and re-reading its rows' fp32 logits (8·V bytes per row), so chunks of at least C rows
  // re-read less than they save; 256 was fastest on the small bench shape (L4 d256 V8192: 64, 128,
  // 512 and 1024 rows were 2-8% slower); the chunks are split evenly between the threads.
  const int64_t chunk_rows = std::max<int64_t>(256, (C + 15) / 16 * 16);
  const bool vocab_blocked =
      head_fusion_ != HeadFusion::always && k::MatmulEngine::vocab_blocked_head_applies(C);
  const int lanes = vocab_blocked ? k::MatmulEngine::vocab_blocked_lanes(rows)
                                  : k::MatmulEngine::gradient_lanes(rows, chunk_rows);
  h.backward_in_forward =
      grad_scale != 0.0f &&
      (head_fusion_ == HeadFusion::always || head_fusion_ == HeadFusion::vocab_blocked ||
       (head_fusion_ == HeadFusion::when_smaller && lanes * V * C * 4 <= rows * V * 2));
  // The head weight with the store's bf16 copy (when it keeps one): this path is bf16 only.
  const k::WeightOperand head_weight{params_.value(head_weight_), params_.bf16_value(head_weight_)};
  if (h.backward_in_forward && vocab_blocked) {
    // The head and its cross-entropy in blocks of the vocabulary: the logits are computed twice
    // and neither they nor their gradient leave the cache (MatmulEngine's
    // head_cross_entropy_vocab_blocked); d_normed and per-lane partials as below.
    h.d_logits16.reset();
    ensure_activation(h.d_normed, {rows, C}, tracker_);
    ensure_activation(h.grad_partials, {lanes, V, C}, tracker_);
    ctx.matmul.head_cross_entropy_vocab_blocked(h.normed16.data<lattice::bf16>(), head_weight, rows,
                                                C, V, targets, grad_scale, row_losses.data(),
                                                h.d_normed.f32(), h.grad_partials.f32(), lanes);
  } else if (h.backward_in_forward) {
    // The head's whole backward runs chunk by chunk inside the forward: d_normed and the weight
    // gradient's per-lane partials (added to the parameter gradient in head_backward) come out
    // while each chunk's logits gradient is in cache, and that gradient is never stored.
    h.d_logits16.reset();
    ensure_activation(h.d_normed, {rows, C}, tracker_);
    ensure_activation(h.grad_partials, {lanes, V, C}, tracker_);
    ctx.matmul.forward_backward_in_row_chunks(
        h.normed16.data<lattice::bf16>(), head_weight, rows, C, V, chunk_rows,
        [&](int64_t begin, int64_t n, const float* chunk, lattice::bf16* d_chunk16,
            int64_t stride) {
          k::cross_entropy_rows_bf16(d_chunk16, row_losses.data() + begin, chunk, targets + begin,
                                     n, V, grad_scale, row_work(), stride);
        },
        h.d_normed.f32(), h.grad_partials.f32(), lanes);
  } else {
    h.grad_partials.reset();
    lattice::bf16* d_logits16 = nullptr;
    if (grad_scale != 0.0f) {
      ensure_bf16_activation(h.d_logits16, {rows, V}, tracker_);
      d_logits16 = h.d_logits16.data<lattice::bf16>();
    }
    ctx.matmul.multiply_in_row_chunks(
        h.normed16.data<lattice::bf16>(), head_weight, /*weight_transposed=*/true, rows, C, V,
        chunk_rows, [&](int64_t begin, int64_t n, const float* chunk) {
          k::cross_entropy_rows_bf16(d_logits16 != nullptr ? d_logits16 + begin * V : nullptr,
                                     row_losses.data() + begin, chunk, targets + begin, n, V,
                                     grad_scale, row_work(), V);
        });
  }
  hook_after_forward(ctx, head_unit_);
  double total = 0.0;  // row order: independent of the thread count
  for (double loss : row_losses) total += loss;
  return total;
}

void Transformer::head_forward(const LayerContext& ctx, StageActivations& a) {
  const int64_t rows = a.B * a.T, C = config_.d_model, V = config_.vocab_size;
  HeadActivations& h = a.head;
  hook_before_forward(ctx, head_unit_);
  head_norm_forward(h, a.residual.back().f32(), rows);
  ensure_activation(h.logits, {rows, V}, tracker_);
  k::Bf16Operands keep;  // bf16: the rounded normed is kept for the weight gradient
  if (ctx.precision == k::Precision::bf16) {
    ensure_bf16_activation(h.normed16, {rows, C}, tracker_);
    keep.in = h.normed16.data<lattice::bf16>();
    keep.weight = params_.bf16_value(head_weight_);
  }
  ctx.matmul.forward(h.logits.f32(), h.normed.f32(), params_.value(head_weight_), nullptr, rows, C,
                     V, ctx.precision, keep);
  hook_after_forward(ctx, head_unit_);
}

void Transformer::head_backward(const LayerContext& ctx, StageActivations& a, BackwardPart part) {
  const int64_t C = config_.d_model, V = config_.vocab_size;
  HeadActivations& h = a.head;
  if (part != BackwardPart::weight) hook_before_backward(ctx, head_unit_);
  if (h.backward_in_forward) {  // d_normed is there; the weight gradient is in lanes
    if (part != BackwardPart::input) {
      const int64_t lanes = h.grad_partials.shape()[0];
      k::add_chunk_partials(params_.grad(head_weight_), h.grad_partials.f32(), lanes, V * C, V * C);
    }
  } else {
    head_backward_gemm(ctx, a, part);
  }
  if (part != BackwardPart::weight) final_norm_backward(a);
  if (part != BackwardPart::input) hook_after_backward(ctx, head_unit_);
}

void Transformer::head_backward_gemm(const LayerContext& ctx, StageActivations& a,
                                     BackwardPart part) {
  const int64_t rows = a.B * a.T, C = config_.d_model, V = config_.vocab_size;
  HeadActivations& h = a.head;
  if (part != BackwardPart::weight) ensure_activation(h.d_normed, {rows, C}, tracker_);
  k::Bf16Operands rounded;  // bf16: the gradient and input rounded in forward_stage / head_forward
  const float* d_logits = h.logits.f32();
  if (ctx.precision == k::Precision::bf16 && h.logits_grad_bf16 &&
      h.normed16.shape() == Shape{rows, C}) {
    rounded.d_out = h.d_logits16.data<lattice::bf16>();
    rounded.in = h.normed16.data<lattice::bf16>();
    rounded.weight = params_.bf16_value(head_weight_);
    d_logits = nullptr;
  }
  float* d_in = part != BackwardPart::weight ? h.d_normed.f32() : nullptr;
  float* d_weight = part != BackwardPart::input ? params_.grad(head_weight_) : nullptr;
  ctx.matmul.backward(d_in, d_weight, nullptr, d_logits, h.normed.f32(),
                      params_.value(head_weight_), rows, C, V, ctx.precision, rounded);
}

void Transformer::final_norm_backward(StageActivations& a) {
  const int64_t rows = a.B * a.T, C = config_.d_model;
  HeadActivations& h = a.head;
  const float* x = a.residual.back().f32();
  if (config_.family == Family::gpt2) {
    k::layernorm_backward(a.d_residual.f32(), params_.grad(final_norm_weight_),
                          params_.grad(final_norm_bias_), h.d_normed.f32(), x,
                          params_.value(final_norm_weight_), h.norm_mean.f32(), h.norm_rstd.f32(),
                          rows, C);
  } else {
    k::rmsnorm_backward(a.d_residual.f32(), params_.grad(final_norm_weight_), h.d_normed.f32(), x,
                        params_.value(final_norm_weight_), h.norm_rstd.f32(), rows, C);
  }
}

void Transformer::embedding_backward(const LayerContext& ctx, StageActivations& a) {
  float* d_wpe = position_embedding_ >= 0 ? params_.grad(position_embedding_) : nullptr;
  k::embedding_backward(params_.grad(token_embedding_), d_wpe, a.d_residual.f32(),
                        a.tokens.data<int32_t>(), a.B, a.T, config_.d_model);
}

void Transformer::backward_parts(const LayerContext& ctx, StageActivations& a,
                                 const float* d_hidden_out, BackwardPart part) {
  const int64_t B = a.B, T = a.T, rows = B * T, C = config_.d_model;
  if (part != BackwardPart::weight) {
    check(a.gradient_ready, "backward() needs a preceding training forward (loss_scale != 0)");
    a.gradient_ready = false;
    ensure_activation(a.d_residual, {rows, C}, tracker_);
    if (has_head())
      head_backward(ctx, a, part);
    else
      k::copy(a.d_residual.f32(), d_hidden_out, rows * C);
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
        embedding_backward(ctx, a);
        hook_after_backward(ctx, embedding_unit_);
      }
    }
    a.weight_gradients_pending = part == BackwardPart::input;
    return;
  }
  // The weight half, in the same unit order as the whole backward.
  check(a.weight_gradients_pending,
        "backward_stage_weight needs a preceding backward_stage_input on the same activations");
  if (has_head()) head_backward(ctx, a, BackwardPart::weight);
  for (size_t i = blocks_.size(); i-- > 0;) {
    blocks_[i]->backward_weight(ctx, *a.blocks[i], a.residual[i].f32(), B, T);
    if (recomputes_block(i)) a.blocks[i]->release();
    hook_after_backward(ctx, first_block_unit_ + static_cast<int>(i));
  }
  if (has_embedding()) {
    embedding_backward(ctx, a);
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
  trunk_forward(ctx, own_, tokens, nullptr, B, T);
  head_forward(ctx, own_);
  return own_.head.logits.f32();
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

}  // namespace lattice::model
