// Linear layer y = x·Wᵀ + b over rows of tokens, with W stored [out, in] in the ParameterStore
// under "<prefix>.weight" (and "<prefix>.bias"). The layer holds no activations: what a forward
// saves goes into the caller's LinearActivations. In bf16 precision that is the bf16 copy of its
// input that forward rounds (activation memory: 2 bytes per input element), and its backward reuses
// it for the weight gradient instead of rounding again. The weight's bf16 rounding comes from the
// ParameterStore's copy when it keeps one (rounded once per change of the weights, by the
// optimizer's pass); otherwise the backend rounds the fp32 weight at every use (ZeRO-3, whose
// sharded weights a whole bf16 copy would undo).
#pragma once

#include <cstdint>
#include <string>

#include "lattice/core/tensor.hpp"
#include "lattice/model/layer_context.hpp"
#include "lattice/model/parameter_store.hpp"
#include "lattice/parallel/tensor/linear_split.hpp"

namespace lattice::model {

// What one forward of a Linear saves for its backward (one per microbatch in flight, owned by the
// caller through its block's activations): in bf16 precision the input rounded to bf16, and what
// it was rounded from so that a backward handed the same fp32 input reuses it.
struct LinearActivations {
  Tensor in16;                          // bf16 [rows, in_features]
  const float* rounded_from = nullptr;  // the fp32 input in16 was rounded from (forward)
  bool prepared = false;                // in16 was written by a producer (forward_prepared)
  bool shared = false;                  // forward_shared_rows: the input is the caller's
  int64_t rounded_rows = -1;
  void release();
};

// How the weight is split over a tensor-parallel group: parallel/tensor/linear_split.hpp (a
// column- or row-split layer computes on its local shapes with the same code as one rank).
using parallel::LinearSplit;
using parallel::TensorSplit;

class Linear {
 public:
  Linear() = default;
  // Declares this rank's slice of the [out_features, in_features] weight (and bias) as `split`
  // says (whole by default).
  Linear(ParameterStore& store, const std::string& prefix, int64_t in_features,
         int64_t out_features, bool bias, InitKind init, const LinearSplit& split = {});

  void forward(const LayerContext& ctx, LinearActivations& saved, float* out, const float* in,
               int64_t rows);
  // The forward of rows [first, first + count) of a `rows`-row input and output (`out` and `in`
  // point at row 0), for pieces that overlap communication with the GEMM. In bf16 the kept input
  // is sized for all rows and the piece's rounding written into its rows; pieces covering
  // [0, rows) leave what forward(rows) leaves. forward_prepared_rows is forward_prepared's.
  void forward_rows(const LayerContext& ctx, LinearActivations& saved, float* out, const float* in,
                    int64_t rows, int64_t first, int64_t count);
  // forward_rows with `out` and `in` pointing at the piece's rows (row `first`), which may come
  // from another buffer than the other pieces (a sequence-parallel rank's own rows, while the
  // others are still being gathered); a backward then rounds its input again (same bits).
  void forward_piece(const LayerContext& ctx, LinearActivations& saved, float* out, const float* in,
                     int64_t rows, int64_t first, int64_t count);
  void forward_prepared_rows(const LayerContext& ctx, LinearActivations& saved, float* out,
                             int64_t rows, int64_t first, int64_t count);
  // bf16 precision only: a producer writes this layer's input directly in bf16 into the buffer
  // prepare_bf16_input returns ([rows, in_features]), then forward_prepared runs the layer on it;
  // the fp32 input never exists, and backward uses the bf16 one.
  lattice::bf16* prepare_bf16_input(const LayerContext& ctx, LinearActivations& saved,
                                    int64_t rows);
  void forward_prepared(const LayerContext& ctx, LinearActivations& saved, float* out,
                        int64_t rows);
  // forward_prepared with the output (bias included) rounded to bf16 into out16 [rows,
  // out_features]: the fp32 output is never stored (Ops::linear_forward_to_bf16).
  void forward_prepared_to_bf16(const LayerContext& ctx, LinearActivations& saved,
                                lattice::bf16* out16, int64_t rows);
  // forward_prepared followed by the GELU: gelu16 and its slope16 [rows, out_features] in bf16, the
  // fp32 pre-activation never stored (Ops::linear_gelu_forward_bf16).
  void forward_prepared_gelu_bf16(const LayerContext& ctx, LinearActivations& saved,
                                  lattice::bf16* gelu16, lattice::bf16* slope16, int64_t rows);
  // The two above on rows [first, first + count) (outputs point at row 0), reading the prepared
  // input's rows or, when given, piece_in16 (that piece's rows from another buffer).
  void forward_prepared_to_bf16_rows(const LayerContext& ctx, LinearActivations& saved,
                                     lattice::bf16* out16, int64_t rows, int64_t first,
                                     int64_t count, const lattice::bf16* piece_in16);
  void forward_prepared_gelu_bf16_rows(const LayerContext& ctx, LinearActivations& saved,
                                       lattice::bf16* gelu16, lattice::bf16* slope16, int64_t rows,
                                       int64_t first, int64_t count,
                                       const lattice::bf16* piece_in16);
  // bf16 precision only: the forward on a bf16 input rounded once for several layers that read the
  // same rows (Llama's q, k and v; SwiGLU's gate and up): in16 [rows, in_features] (row 0), which
  // the caller holds (e.g. in another layer's prepare_bf16_input) and hands to backward_shared
  // again; this layer keeps nothing of it. Rows [first, first + count), read from piece_in16 when
  // given (that piece's rows from another buffer). Bit for bit forward_rows on the fp32 input that
  // in16 is the rounding of.
  void forward_shared_rows(const LayerContext& ctx, LinearActivations& saved, float* out,
                           const lattice::bf16* in16, int64_t rows, int64_t first, int64_t count,
                           const lattice::bf16* piece_in16 = nullptr);
  // backward after forward_shared_rows, in16 its input again: d_in overwritten (skipped when
  // null), the weight and bias gradients accumulated (skipped when in16 is null: the input half).
  // Bit for bit backward (or its halves) after forward_rows on the fp32 input.
  void backward_shared(const LayerContext& ctx, const LinearActivations& saved, float* d_in,
                       const float* d_out, const lattice::bf16* in16, int64_t rows);
  // d_in overwritten (skipped when null); weight and bias gradients accumulate. In bf16, when the
  // forward that filled `saved` saw this same `in` (or was forward_prepared) and row count, its
  // bf16 input is used (bit-identical); after forward_prepared, `in` is not read.
  void backward(const LayerContext& ctx, const LinearActivations& saved, float* d_in,
                const float* d_out, const float* in, int64_t rows);
  // The two halves of backward, for schedules that run them apart (zero-bubble pipelines): B, the
  // input gradient d_in (overwritten), and W, the weight and bias gradients (accumulated). B then W
  // gives backward's bits; each reads d_out, which must stay alive until W.
  void backward_input(const LayerContext& ctx, const LinearActivations& saved, float* d_in,
                      const float* d_out, int64_t rows);
  void backward_weight(const LayerContext& ctx, const LinearActivations& saved, const float* d_out,
                       const float* in, int64_t rows);
  // bf16 precision only: backward with d_out already rounded to bf16 by its producer (d_out16,
  // [rows, out_features]), which also accumulated the bias gradient into bias_grad(); no fp32
  // d_out is read. Same kept-input rules as backward. A null d_in makes it the weight half (W) and
  // backward_input_rounded is the input half (B).
  void backward_rounded(const LayerContext& ctx, const LinearActivations& saved, float* d_in,
                        const lattice::bf16* d_out16, const float* in, int64_t rows);
  void backward_input_rounded(const LayerContext& ctx, float* d_in, const lattice::bf16* d_out16,
                              int64_t rows);
  // bf16 precision only: this layer's input gradient d_in = d_out16 · W taken through the GELU
  // that produced its input (slope16, from forward_prepared_gelu_bf16 of the layer before):
  // d_pre16 = bf16(d_in · slope16), and pre_bias_grad (when given) += its column sums, the layer
  // before's bias gradient (Ops::linear_backward_input_through_gelu_bf16); d_in is never stored.
  // Weight and bias gradients are not touched: call backward_rounded with a null d_in for them.
  void backward_input_through_gelu_bf16(const LayerContext& ctx, lattice::bf16* d_pre16,
                                        float* pre_bias_grad, const lattice::bf16* d_out16,
                                        const lattice::bf16* slope16, int64_t rows);
  // Sequence parallelism: a prepared bf16 input holds every rank's rows (all-gathered into the
  // buffer by the block), so the block frees it after the forward (release_prepared_input) and
  // gathers it again into refill_prepared_input's buffer ([rows, in_features]) before the weight
  // gradient: what a rank keeps between forward and backward is its own rows.
  static void release_prepared_input(LinearActivations& saved) { saved.in16.reset(); }
  lattice::bf16* refill_prepared_input(const LayerContext& ctx, LinearActivations& saved,
                                       int64_t rows);
  // The bias gradient (null without a bias).
  float* bias_grad();

  // This rank's shapes (the whole layer's divided by tp along the split).
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

 private:
  ParameterStore* store_ = nullptr;
  int weight_ = -1, bias_ = -1;
  int64_t in_ = 0, out_ = 0;
  bool adds_bias_ = true;  // false on the ranks but 0 of a row-split layer
  // The bias the forward adds (null when none, or not on this rank).
  const float* forward_bias() const;
  // The kept bf16 input sized for `rows` rows, as the backend's operand from row `first` on.
  void keep_bf16(const LayerContext& ctx, LinearActivations& saved, int64_t rows, int64_t first,
                 kernels::Bf16Operands& keep);
  // forward_prepared's bookkeeping for a fused forward: the prepared bf16 input of `rows` rows.
  const lattice::bf16* prepared_input(const LayerContext& ctx, LinearActivations& saved,
                                      int64_t rows, const char* who);
  // The bf16 input of rows [first, first + count): piece_in16, or those rows of in16 (checked).
  const lattice::bf16* piece_rows(const lattice::bf16* in16, int64_t rows, int64_t first,
                                  int64_t count, const lattice::bf16* piece_in16) const;
  // The weight as the backend takes it: fp32, with the store's bf16 copy in bf16 precision.
  kernels::WeightOperand weight_operand(const LayerContext& ctx);
  // The kept bf16 input for backward from `in` (null when not kept); checks forward_prepared's.
  const lattice::bf16* kept_input(const LayerContext& ctx, const LinearActivations& saved,
                                  const float* in, int64_t rows);
};

}  // namespace lattice::model
