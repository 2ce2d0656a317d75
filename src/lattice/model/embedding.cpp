// Embedding: see embedding.hpp.
#include "lattice/model/embedding.hpp"

#include <string>

#include "lattice/core/error.hpp"
#include "lattice/model/block.hpp"

namespace lattice::model {

Embedding::Embedding(ParameterStore& store, const ModelConfig& config,
                     const TensorParallelGroup& tp)
    : store_(store), tp_(tp), vocab_(config.vocab_size), d_model_(config.d_model) {
  const bool gpt2 = config.family == Family::gpt2;
  const std::string name = gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight";
  if (tp.size == 1) {
    token_weight_ = store.declare(name, {vocab_, d_model_}, InitKind::normal, true);
  } else {
    const TensorShard shard{0, tp.rank, tp.size, 1, config.padded_vocab_size(tp.size)};
    token_weight_ =
        store.declare_shard(name, {vocab_, d_model_}, shard,
                            mesh::AxisSet::all().without(mesh::Axis::tp), InitKind::normal, true);
    slice_ = config.vocab_slice(tp.rank, tp.size);
  }
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
  // The positions once: tp rank 0 adds them before the slices are summed.
  const float* wpe =
      position_weight_ >= 0 && tp_.rank == 0 ? store_.value(position_weight_) : nullptr;
  ctx.ops.embedding_forward(x, tokens, store_.value(token_weight_), wpe, B, T, d_model_, start,
                            slice_);
  all_reduce_over_tp(tp_, x, B * T * d_model_);
}

void Embedding::backward(const LayerContext& ctx, const float* d_x, const int32_t* tokens,
                         int64_t B, int64_t T) {
  float* d_wpe = position_weight_ >= 0 ? store_.grad(position_weight_) : nullptr;
  // Every tp rank has the whole d_x: its slice's rows, and the (replicated) positions' gradient.
  ctx.ops.embedding_backward(store_.grad(token_weight_), d_wpe, d_x, tokens, B, T, d_model_,
                             slice_);
}

}  // namespace lattice::model
