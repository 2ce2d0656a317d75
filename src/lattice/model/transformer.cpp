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
    : config_(config), range_(range), tracker_(tracker) {
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
  params_.allocate(tracker_);
}

Transformer::~Transformer() = default;

void Transformer::initialize(uint64_t seed) {
  params_.initialize(seed, config_.init_std, config_.n_layers);
}

void Transformer::check_tokens(const int32_t* tokens, int64_t n, const char* what) const {
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= config_.vocab_size)
      throw Error(std::string(what) + " id " + std::to_string(tokens[i]) +
                  " is outside the vocabulary [0, " + std::to_string(config_.vocab_size) +
                  "): the data does not match model.vocab_size");
  }
}

void Transformer::embed(const LayerContext& ctx, const int32_t* tokens, int64_t B, int64_t T) {
  check_tokens(tokens, B * T, "token");
  if (tokens_.numel() != B * T) tokens_ = Tensor({B * T}, DType::i32);
  std::memcpy(tokens_.raw(), tokens, sizeof(int32_t) * static_cast<size_t>(B * T));
  const float* wpe = position_embedding_ >= 0 ? params_.value(position_embedding_) : nullptr;
  k::embedding_forward(residual_[0].f32(), tokens, params_.value(token_embedding_), wpe, B, T,
                       config_.d_model);
}

void Transformer::trunk_forward(const LayerContext& ctx, const int32_t* tokens,
                                const float* hidden_in, int64_t B, int64_t T) {
  check(B > 0 && T > 0, "batch and sequence length must be positive");
  check(T <= config_.max_seq_len, "sequence length " + std::to_string(T) +
                                      " exceeds model.max_seq_len " +
                                      std::to_string(config_.max_seq_len) +
                                      ": lower training.seq_len or raise model.max_seq_len");
  const int64_t rows = B * T, C = config_.d_model;
  B_ = B;
  T_ = T;
  gradient_ready_ = false;
  residual_.resize(blocks_.size() + 1);
  for (auto& r : residual_) ensure_activation(r, {rows, C}, tracker_);
  if (has_embedding()) {
    hook_before_forward(ctx, embedding_unit_);
    embed(ctx, tokens, B, T);
    hook_after_forward(ctx, embedding_unit_);
  } else {
    k::copy(residual_[0].f32(), hidden_in, rows * C);
  }
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const int unit = first_block_unit_ + static_cast<int>(i);
    hook_before_forward(ctx, unit);
    blocks_[i]->forward(ctx, residual_[i + 1].f32(), residual_[i].f32(), B, T);
    hook_after_forward(ctx, unit);
  }
}

float Transformer::forward_stage(const LayerContext& ctx, const int32_t* tokens,
                                 const float* hidden_in, const int32_t* targets, int64_t B,
                                 int64_t T, float loss_scale) {
  const int64_t rows = B * T;
  trunk_forward(ctx, tokens, hidden_in, B, T);
  if (!has_head()) {
    gradient_ready_ = loss_scale != 0.0f;
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
  double loss_sum;
  if (ctx.precision == k::Precision::bf16) {
    loss_sum = head_loss_in_row_chunks(ctx, targets, rows, grad_scale);
    logits_grad_bf16_ = loss_scale != 0.0f;
  } else {
    head_forward(ctx, B, T);
    logits_grad_bf16_ = false;
    head_backward_in_forward_ = false;
    if (loss_scale != 0.0f)
      loss_sum = k::cross_entropy_forward_backward(logits_.f32(), logits_.f32(), targets, rows, V,
                                                   grad_scale);
    else
      loss_sum = k::cross_entropy_forward(logits_.f32(), targets, rows, V);
  }
  gradient_ready_ = loss_scale != 0.0f;
  return static_cast<float>(loss_sum / static_cast<double>(counted));
}

void Transformer::head_norm_forward(const LayerContext& ctx, int64_t rows) {
  const int64_t C = config_.d_model;
  ensure_activation(normed_, {rows, C}, tracker_);
  ensure_activation(norm_rstd_, {rows}, tracker_);
  const float* x = residual_.back().f32();
  if (config_.family == Family::gpt2) {
    ensure_activation(norm_mean_, {rows}, tracker_);
    k::layernorm_forward(normed_.f32(), norm_mean_.f32(), norm_rstd_.f32(), x,
                         params_.value(final_norm_weight_), params_.value(final_norm_bias_), rows,
                         C, config_.norm_eps);
  } else {
    k::rmsnorm_forward(normed_.f32(), norm_rstd_.f32(), x, params_.value(final_norm_weight_), rows,
                       C, config_.norm_eps);
  }
}

double Transformer::head_loss_in_row_chunks(const LayerContext& ctx, const int32_t* targets,
                                            int64_t rows, float grad_scale) {
  const int64_t C = config_.d_model, V = config_.vocab_size;
  hook_before_forward(ctx, head_unit_);
  ensure_bf16_activation(normed16_, {rows, C}, tracker_);  // kept for the weight gradient
  if (config_.family == Family::gpt2) {  // the LayerNorm writes the GEMM's bf16 input directly
    ensure_activation(norm_mean_, {rows}, tracker_);
    ensure_activation(norm_rstd_, {rows}, tracker_);
    normed_.reset();
    k::layernorm_forward_bf16(normed16_.data<lattice::bf16>(), norm_mean_.f32(), norm_rstd_.f32(),
                              residual_.back().f32(), params_.value(final_norm_weight_),
                              params_.value(final_norm_bias_), rows, C, config_.norm_eps);
  } else {
    head_norm_forward(ctx, rows);
    k::convert_to_bf16(normed16_.data<lattice::bf16>(), normed_.f32(), rows * C);
  }
  logits_.reset();  // the whole [rows, V] logits never exist here
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
  head_backward_in_forward_ =
      grad_scale != 0.0f &&
      (head_fusion_ == HeadFusion::always || head_fusion_ == HeadFusion::vocab_blocked ||
       (head_fusion_ == HeadFusion::when_smaller && lanes * V * C * 4 <= rows * V * 2));
  // The head weight with the store's bf16 copy (when it keeps one): this path is bf16 only.
  const k::WeightOperand head_weight{params_.value(head_weight_), params_.bf16_value(head_weight_)};
  if (head_backward_in_forward_ && vocab_blocked) {
    // The head and its cross-entropy in blocks of the vocabulary: the logits are computed twice
    // and neither they nor their gradient leave the cache (MatmulEngine's
    // head_cross_entropy_vocab_blocked); d_normed_ and per-lane partials as below.
    d_logits16_.reset();
    ensure_activation(d_normed_, {rows, C}, tracker_);
    ensure_activation(head_grad_partials_, {lanes, V, C}, tracker_);
    ctx.matmul.head_cross_entropy_vocab_blocked(normed16_.data<lattice::bf16>(), head_weight, rows,
                                                C, V, targets, grad_scale, row_losses.data(),
                                                d_normed_.f32(), head_grad_partials_.f32(), lanes);
  } else if (head_backward_in_forward_) {
    // The head's whole backward runs chunk by chunk inside the forward: d_normed_ and the weight
    // gradient's per-lane partials (added to the parameter gradient in head_backward) come out
    // while each chunk's logits gradient is in cache, and that gradient is never stored.
    d_logits16_.reset();
    ensure_activation(d_normed_, {rows, C}, tracker_);
    ensure_activation(head_grad_partials_, {lanes, V, C}, tracker_);
    ctx.matmul.forward_backward_in_row_chunks(
        normed16_.data<lattice::bf16>(), head_weight, rows, C, V, chunk_rows,
        [&](int64_t begin, int64_t n, const float* chunk, lattice::bf16* d_chunk16,
            int64_t stride) {
          k::cross_entropy_rows_bf16(d_chunk16, row_losses.data() + begin, chunk, targets + begin,
                                     n, V, grad_scale, row_work(), stride);
        },
        d_normed_.f32(), head_grad_partials_.f32(), lanes);
  } else {
    head_grad_partials_.reset();
    lattice::bf16* d_logits16 = nullptr;
    if (grad_scale != 0.0f) {
      ensure_bf16_activation(d_logits16_, {rows, V}, tracker_);
      d_logits16 = d_logits16_.data<lattice::bf16>();
    }
    ctx.matmul.multiply_in_row_chunks(
        normed16_.data<lattice::bf16>(), head_weight, /*weight_transposed=*/true, rows, C, V,
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

void Transformer::head_forward(const LayerContext& ctx, int64_t B, int64_t T) {
  const int64_t rows = B * T, C = config_.d_model, V = config_.vocab_size;
  hook_before_forward(ctx, head_unit_);
  head_norm_forward(ctx, rows);
  ensure_activation(logits_, {rows, V}, tracker_);
  k::Bf16Operands keep;  // bf16: the rounded normed_ is kept for the weight gradient
  if (ctx.precision == k::Precision::bf16) {
    ensure_bf16_activation(normed16_, {rows, C}, tracker_);
    keep.in = normed16_.data<lattice::bf16>();
    keep.weight = params_.bf16_value(head_weight_);
  }
  ctx.matmul.forward(logits_.f32(), normed_.f32(), params_.value(head_weight_), nullptr, rows, C, V,
                     ctx.precision, keep);
  hook_after_forward(ctx, head_unit_);
}

void Transformer::head_backward(const LayerContext& ctx, int64_t rows) {
  const int64_t C = config_.d_model, V = config_.vocab_size;
  hook_before_backward(ctx, head_unit_);
  if (head_backward_in_forward_) {  // d_normed_ is there; the weight gradient is in lanes
    const int64_t lanes = head_grad_partials_.shape()[0];
    k::add_chunk_partials(params_.grad(head_weight_), head_grad_partials_.f32(), lanes, V * C,
                          V * C);
  } else {
    head_backward_gemm(ctx, rows);
  }
  final_norm_backward(rows);
  hook_after_backward(ctx, head_unit_);
}

void Transformer::head_backward_gemm(const LayerContext& ctx, int64_t rows) {
  const int64_t C = config_.d_model, V = config_.vocab_size;
  ensure_activation(d_normed_, {rows, C}, tracker_);
  k::Bf16Operands rounded;  // bf16: the gradient and input rounded in forward_stage / head_forward
  const float* d_logits = logits_.f32();
  if (ctx.precision == k::Precision::bf16 && logits_grad_bf16_ &&
      normed16_.shape() == Shape{rows, C}) {
    rounded.d_out = d_logits16_.data<lattice::bf16>();
    rounded.in = normed16_.data<lattice::bf16>();
    rounded.weight = params_.bf16_value(head_weight_);
    d_logits = nullptr;
  }
  ctx.matmul.backward(d_normed_.f32(), params_.grad(head_weight_), nullptr, d_logits, normed_.f32(),
                      params_.value(head_weight_), rows, C, V, ctx.precision, rounded);
}

void Transformer::final_norm_backward(int64_t rows) {
  const int64_t C = config_.d_model;
  const float* x = residual_.back().f32();
  if (config_.family == Family::gpt2) {
    k::layernorm_backward(d_residual_.f32(), params_.grad(final_norm_weight_),
                          params_.grad(final_norm_bias_), d_normed_.f32(), x,
                          params_.value(final_norm_weight_), norm_mean_.f32(), norm_rstd_.f32(),
                          rows, C);
  } else {
    k::rmsnorm_backward(d_residual_.f32(), params_.grad(final_norm_weight_), d_normed_.f32(), x,
                        params_.value(final_norm_weight_), norm_rstd_.f32(), rows, C);
  }
}

void Transformer::backward_stage(const LayerContext& ctx, const float* d_hidden_out) {
  check(gradient_ready_, "backward() needs a preceding training forward (loss_scale != 0)");
  gradient_ready_ = false;
  const int64_t rows = B_ * T_, C = config_.d_model;
  ensure_activation(d_residual_, {rows, C}, tracker_);
  if (has_head())
    head_backward(ctx, rows);
  else
    k::copy(d_residual_.f32(), d_hidden_out, rows * C);
  // Each block's d_x_in overwrites its d_x_out in place.
  for (size_t i = blocks_.size(); i-- > 0;) {
    const int unit = first_block_unit_ + static_cast<int>(i);
    hook_before_backward(ctx, unit);
    blocks_[i]->backward(ctx, d_residual_.f32(), d_residual_.f32(), residual_[i].f32(), B_, T_,
                         scratch_);
    hook_after_backward(ctx, unit);
  }
  if (has_embedding()) {
    hook_before_backward(ctx, embedding_unit_);
    float* d_wpe = position_embedding_ >= 0 ? params_.grad(position_embedding_) : nullptr;
    k::embedding_backward(params_.grad(token_embedding_), d_wpe, d_residual_.f32(),
                          tokens_.data<int32_t>(), B_, T_, C);
    hook_after_backward(ctx, embedding_unit_);
  }
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
  trunk_forward(ctx, tokens, nullptr, B, T);
  head_forward(ctx, B, T);
  return logits_.f32();
}

const float* Transformer::hidden_out() const {
  return residual_.back().f32();
}
const float* Transformer::d_hidden_in() const {
  return d_residual_.f32();
}

void Transformer::release_activations() {
  for (auto& b : blocks_) b->release_activations();
  residual_.clear();
  for (Tensor* t : {&normed_, &norm_mean_, &norm_rstd_, &logits_, &d_residual_, &d_normed_,
                    &normed16_, &d_logits16_, &head_grad_partials_})
    t->reset();
}

}  // namespace lattice::model
