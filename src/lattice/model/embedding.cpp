// Embedding: see embedding.hpp.
#include "lattice/model/embedding.hpp"

#include <string>

#include "lattice/core/error.hpp"

namespace lattice::model {

Embedding::Embedding(ParameterStore& store, const ModelConfig& config)
    : store_(store), vocab_(config.vocab_size), d_model_(config.d_model) {
  const bool gpt2 = config.family == Family::gpt2;
  token_weight_ = store.declare(gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight",
                                {vocab_, d_model_}, InitKind::normal, true);
  if (gpt2)
    position_weight_ = store.declare("transformer.wpe.weight", {config.max_seq_len, d_model_},
                                     InitKind::normal, true);
}

void Embedding::check_tokens(const int32_t* tokens, int64_t n, const char* what) const {
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab_)
      throw Error(std::string(what) + " id " + std::to_string(tokens[i]) +
                  " is outside the vocabulary [0, " + std::to_string(vocab_) +
                  "): the data does not match model.vocab_size");
  }
}

void Embedding::forward(const LayerContext& ctx, float* x, const int32_t* tokens, int64_t B,
                        int64_t T, int64_t start) const {
  const float* wpe = position_weight_ >= 0 ? store_.value(position_weight_) : nullptr;
  ctx.ops.embedding_forward(x, tokens, store_.value(token_weight_), wpe, B, T, d_model_, start);
}

void Embedding::backward(const LayerContext& ctx, const float* d_x, const int32_t* tokens,
                         int64_t B, int64_t T) {
  float* d_wpe = position_weight_ >= 0 ? store_.grad(position_weight_) : nullptr;
  ctx.ops.embedding_backward(store_.grad(token_weight_), d_wpe, d_x, tokens, B, T, d_model_);
}

}  // namespace lattice::model
