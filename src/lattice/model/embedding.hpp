// Embedding: the first stage's input layer. Token embedding [vocab, d_model] (Hugging Face
// "transformer.wte.weight" / "model.embed_tokens.weight") plus, for GPT-2, learned positions
// [max_seq_len, d_model] ("transformer.wpe.weight"); Llama's positions come from RoPE in the
// blocks. Its forward writes the stage's first residual; its backward is a weight gradient only
// (the scatter-add of the residual's gradient), which a split backward runs in its W half.
// Under tensor parallelism the token table is split by vocabulary rows (padded: see
// ModelConfig::padded_vocab_size): each rank looks up the tokens of its slice, zero for the rest,
// and one all-reduce over tp sums the slices (the positions are added once, by tp rank 0).
#pragma once

#include <cstdint>

#include "lattice/model/layer_context.hpp"
#include "lattice/model/model_config.hpp"
#include "lattice/model/parameter_store.hpp"
#include "lattice/parallel/tensor/sequence_layout.hpp"

namespace lattice::model {

class Embedding {
 public:
  Embedding(ParameterStore& store, const ModelConfig& config, const TensorParallelGroup& tp = {});

  // x[B·T, d_model] = wte[tokens] (+ wpe[start + t]) for tokens [B, T] at positions start + t.
  // Token ids must be in [0, vocab) (check_tokens). Under sequence parallelism x (and backward's
  // d_x) holds this rank's sequence rows only (parallel/tensor/sequence_layout.hpp).
  void forward(const LayerContext& ctx, float* x, const int32_t* tokens, int64_t B, int64_t T,
               int64_t start = 0) const;
  // Accumulates the gradients of wte (and wpe) from d_x [B·T, d_model].
  void backward(const LayerContext& ctx, const float* d_x, const int32_t* tokens, int64_t B,
                int64_t T);
  // Throws naming the first id outside the vocabulary (`what`: "token", for the message).
  void check_tokens(const int32_t* tokens, int64_t n, const char* what) const;

  // The token embedding's parameter index (a tied head reads it).
  int token_weight() const { return token_weight_; }

 private:
  ParameterStore& store_;
  TensorParallelGroup tp_;
  parallel::SequenceLayout layout_;  // the residual rows over tp_ and its collectives
  int64_t vocab_, d_model_;
  kernels::VocabRange slice_;  // the vocabulary rows this rank's table holds (all at tp = 1)
  int token_weight_ = -1, position_weight_ = -1;
};

}  // namespace lattice::model
