// A norm over the last dimension of rows: LayerNorm (weight and bias; GPT-2) or RMSNorm (weight
// only; Llama), with its parameters in the ParameterStore ("<name>.weight", "<name>.bias"). Its
// saved state is the caller's NormActivations. Run on the residual stream it sees the sequence
// layout's own rows; its weight gradient is then a partial sum over the layout's ranks
// (ReplicatedGradients), which backward takes care of.
#pragma once

#include <cstdint>
#include <string>

#include "lattice/core/tensor.hpp"
#include "lattice/model/layer_context.hpp"
#include "lattice/model/parameter_store.hpp"
#include "lattice/parallel/tensor/sequence_layout.hpp"

namespace lattice::model {

enum class NormKind { layer_norm, rms_norm };

// What a norm's forward saves (local = the rows it ran on, C its width).
struct NormActivations {
  Tensor out;         // [local, C] fp32 output (when its reader takes fp32)
  Tensor out16;       // [local, C] bf16 output kept on its own (a gathered bf16 reader's own rows)
  Tensor mean, rstd;  // [local] (mean: LayerNorm only)
  void release();
};

class Norm {
 public:
  Norm() = default;
  Norm(ParameterStore& store, const std::string& name, NormKind kind, int64_t width, float eps);

  NormKind kind() const { return kind_; }
  int64_t width() const { return width_; }
  // Whether the fused bf16 paths of GPT-2's packed attention and GELU MLP take this norm (they are
  // written for its LayerNorm); forward_bf16 itself runs for either kind.
  bool writes_bf16() const { return kind_ == NormKind::layer_norm; }
  // Bytes of its statistics per row (mean and rstd, or rstd).
  int64_t stats_bytes_per_row() const { return kind_ == NormKind::layer_norm ? 8 : 4; }

  // Allocates the statistics for `rows` rows and, as asked, the fp32 and the bf16 output (each
  // freed when not asked for).
  void prepare(const LayerContext& ctx, NormActivations& a, int64_t rows, bool fp32_out,
               bool bf16_out) const;
  // out = norm(x) over `rows` rows, its statistics into `a` (out may be a.out or another buffer).
  void forward(const LayerContext& ctx, NormActivations& a, float* out, const float* x,
               int64_t rows) const;
  // The same with the output rounded to bf16 (bit for bit the rounding of forward's): no fp32
  // output.
  void forward_bf16(const LayerContext& ctx, NormActivations& a, lattice::bf16* out16,
                    const float* x, int64_t rows) const;
  // d_x = ∂loss/∂x given d_out (+ residual_grad when given, in the same pass); the weight (and
  // bias) gradients accumulate — summed over the layout's ranks when it is sharded, through
  // `partials` (2 · width floats of scratch; unused on a whole layout). `over_split_heads`: the
  // rows are this rank's heads (a per-head q/k norm), summed over the ranks on every layout.
  void backward(const LayerContext& ctx, const parallel::SequenceLayout& layout,
                const NormActivations& a, float* d_x, const float* d_out, const float* x,
                int64_t rows, const float* residual_grad, float* partials,
                bool over_split_heads = false) const;

 private:
  ParameterStore* store_ = nullptr;
  NormKind kind_ = NormKind::layer_norm;
  int64_t width_ = 0;
  float eps_ = 1e-5f;
  int weight_ = -1, bias_ = -1;
};

}  // namespace lattice::model
