// Embedding: see embedding.hpp.
#include "lattice/model/embedding.hpp"

#include <string>

#include "lattice/core/error.hpp"
#include "lattice/model/context_parallel.hpp"
#include "lattice/parallel/tensor/sequence_layout.hpp"

namespace lattice::model {

Embedding::Embedding(ParameterStore& store, const ModelConfig& config,
                     const TensorParallelGroup& tp)
    : store_(store), tp_(tp), layout_(tp), vocab_(config.vocab_size), d_model_(config.d_model) {
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
  const int64_t rows = B * T;
  // Each rank's vocabulary slice gives a partial sum over all rows, summed over tp: in place, or
  // reduce-scattered onto this rank's sequence rows of x from a transient under sequence
  // parallelism.
  Tensor partial;
  if (tp_.sequence_parallel)
    partial = Tensor({rows, d_model_}, DType::f32, ctx.ops.memory(), ctx.tracker,
                     MemoryCategory::activations);
  float* lookup = tp_.sequence_parallel ? partial.f32() : x;
  if (ctx.context == nullptr) {
    ctx.ops.embedding_forward(lookup, tokens, store_.value(token_weight_), wpe, B, T, d_model_,
                              start, slice_);
  } else {  // this rank's runs of each sequence, each at its positions
    for (int64_t b = 0; b < B; ++b)
      for (const PositionRun& run : ctx.context->runs(T)) {
        const int64_t row = b * T + run.row;
        ctx.ops.embedding_forward(lookup + row * d_model_, tokens + row,
                                  store_.value(token_weight_), wpe, 1, run.length, d_model_,
                                  run.position, slice_);
      }
  }
  layout_.reduce(x, lookup, rows, d_model_);
}

void Embedding::backward(const LayerContext& ctx, const float* d_x, const int32_t* tokens,
                         int64_t B, int64_t T) {
  float* d_wpe = position_weight_ >= 0 ? store_.grad(position_weight_) : nullptr;
  // Every tp rank needs the whole d_x (gathered from the sequence rows under sequence
  // parallelism): its slice's rows, and the (replicated) positions' gradient.
  Tensor gathered;
  if (tp_.sequence_parallel) {
    gathered = Tensor({B * T, d_model_}, DType::f32, ctx.ops.memory(), ctx.tracker,
                      MemoryCategory::activations);
    layout_.gather(gathered.f32(), d_x, B * T, d_model_);
    d_x = gathered.f32();
  }
  if (ctx.context == nullptr) {
    ctx.ops.embedding_backward(store_.grad(token_weight_), d_wpe, d_x, tokens, B, T, d_model_,
                               slice_);
    return;
  }
  // Context parallelism: run by run, the position table's gradient offset to the run's positions.
  for (int64_t b = 0; b < B; ++b)
    for (const PositionRun& run : ctx.context->runs(T)) {
      const int64_t row = b * T + run.row;
      ctx.ops.embedding_backward(
          store_.grad(token_weight_), d_wpe ? d_wpe + run.position * d_model_ : nullptr,
          d_x + row * d_model_, tokens + row, 1, run.length, d_model_, slice_);
    }
}

}  // namespace lattice::model
