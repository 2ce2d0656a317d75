// Linear layer y = x·Wᵀ + b over rows of tokens, with W stored [out, in] in the ParameterStore
// under "<prefix>.weight" (and "<prefix>.bias"). In bf16 precision it keeps the bf16 copy of its
// input that forward rounds (activation memory: 2 bytes per input element), and its backward reuses
// it for the weight gradient instead of rounding again. The weight's bf16 rounding comes from the
// ParameterStore's copy when it keeps one (rounded once per change of the weights, by the
// optimizer's pass); otherwise the engine rounds the fp32 weight at every use (ZeRO-3, whose
// sharded weights a whole bf16 copy would undo).
#pragma once

#include <cstdint>
#include <string>

#include "lattice/core/tensor.hpp"
#include "lattice/model/layer_context.hpp"
#include "lattice/model/parameter_store.hpp"

namespace lattice::model {

class Linear {
 public:
  Linear() = default;
  Linear(ParameterStore& store, const std::string& prefix, int64_t in_features,
         int64_t out_features, bool bias, InitKind init);

  void forward(const LayerContext& ctx, float* out, const float* in, int64_t rows);
  // bf16 precision only: a producer writes this layer's input directly in bf16 into the buffer
  // prepare_bf16_input returns ([rows, in_features]), then forward_prepared runs the layer on it;
  // the fp32 input never exists, and backward uses the bf16 one.
  lattice::bf16* prepare_bf16_input(const LayerContext& ctx, int64_t rows);
  void forward_prepared(const LayerContext& ctx, float* out, int64_t rows);
  // forward_prepared with the output (bias included) computed in row chunks into out [rows,
  // out_features], each chunk handed to consume(row_begin, rows, chunk) on the thread that computed
  // it while it is in cache (kernels::MatmulEngine::multiply_in_row_chunks).
  void forward_prepared_in_row_chunks(const LayerContext& ctx, float* out, int64_t rows,
                                      int64_t chunk_rows,
                                      const kernels::MatmulEngine::ChunkConsumer& consume);
  // d_in overwritten (skipped when null); weight and bias gradients accumulate. In bf16, when the
  // last forward saw this same `in` (or was forward_prepared) and row count, its bf16 input is used
  // (bit-identical); after forward_prepared, `in` is not read.
  void backward(const LayerContext& ctx, float* d_in, const float* d_out, const float* in,
                int64_t rows);
  // bf16 precision only: backward with d_out already rounded to bf16 by its producer (d_out16,
  // [rows, out_features]), which also accumulated the bias gradient into bias_grad(); no fp32
  // d_out is read. Same kept-input rules as backward.
  void backward_rounded(const LayerContext& ctx, float* d_in, const lattice::bf16* d_out16,
                        const float* in, int64_t rows);
  // bf16 precision only: this layer's input gradient d_in = d_out16 · W computed in row chunks,
  // each handed to consume(row_begin, rows, chunk) on the thread that computed it while it is in
  // cache (kernels::MatmulEngine::multiply_in_row_chunks), e.g. to fuse the previous activation's
  // backward; d_in is never stored whole. Weight and bias gradients are not touched: call
  // backward_rounded with a null d_in for them.
  void backward_input_in_row_chunks(const LayerContext& ctx, const lattice::bf16* d_out16,
                                    int64_t rows, int64_t chunk_rows,
                                    const kernels::MatmulEngine::ChunkConsumer& consume);
  // The bias gradient (null without a bias).
  float* bias_grad();
  // Frees the bf16 input kept from forward.
  void release_activations();

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

 private:
  ParameterStore* store_ = nullptr;
  int weight_ = -1, bias_ = -1;
  int64_t in_ = 0, out_ = 0;
  // The bf16 input of the last bf16 forward (activation memory), and what it was made from.
  Tensor in16_;
  const float* rounded_from_ = nullptr;
  bool prepared_ = false;
  int64_t rounded_rows_ = -1;
  void keep_bf16(const LayerContext& ctx, int64_t rows, kernels::Bf16Operands& keep);
  // The weight as the engine takes it: fp32, with the store's bf16 copy in bf16 precision.
  kernels::WeightOperand weight_operand(const LayerContext& ctx);
  // The kept bf16 input for backward from `in` (null when not kept); checks forward_prepared's.
  lattice::bf16* kept_input(const LayerContext& ctx, const float* in, int64_t rows);
};

}  // namespace lattice::model
