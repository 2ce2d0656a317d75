// The shared start and end of a pre-norm residual sub-layer: see normed_input.hpp.
#include "lattice/model/components/normed_input.hpp"

namespace lattice::model {

NormedRows normalize(const LayerContext& ctx, const parallel::SequenceLayout& layout,
                     const Norm& norm, NormActivations& a, const float* x, int64_t rows,
                     Tensor& gathered, Linear* fused, LinearActivations* fused_saved) {
  const int64_t local = layout.local_rows(rows), C = norm.width();
  NormedRows in;
  if (fused == nullptr) {
    norm.forward(ctx, a, a.out.f32(), x, local);
    in.own = in.all = a.out.f32();
    if (!layout.sharded()) return in;
    ensure_activation(gathered, {rows, C}, ctx);
    in.all = gathered.f32();
    in.gather = layout.start_gather(gathered.f32(), a.out.f32(), rows, C);
    return in;
  }
  // The norm writes the projection's bf16 input directly (this rank's rows of it, gathered).
  lattice::bf16* in16 = fused->prepare_bf16_input(ctx, *fused_saved, rows);
  lattice::bf16* own = layout.sharded() ? a.out16.data<lattice::bf16>() : in16;
  norm.forward_bf16(ctx, a, own, x, local);
  if (!layout.sharded()) return in;
  in.own16 = own;
  in.gather = layout.start_gather(in16, own, rows, C, DType::bf16);
  return in;
}

void output_projection_forward(
    const LayerContext& ctx, const parallel::SequenceLayout& layout, float* x_out, int64_t rows,
    int64_t width, Tensor& partial,
    const std::function<void(float* out, int64_t first, int64_t count)>& gemm) {
  if (layout.sharded()) ensure_activation(partial, {rows, width}, ctx);
  float* out = layout.sharded() ? partial.f32() : x_out;
  layout.forward_reduced([&](int64_t first, int64_t count) { gemm(out, first, count); }, x_out, out,
                         rows, width);
}

parallel::GroupCollective regather(const LayerContext& ctx, const parallel::SequenceLayout& layout,
                                   const NormActivations& a, float* gathered, int64_t rows,
                                   const float** input, Linear* fused,
                                   LinearActivations* fused_saved) {
  *input = fused != nullptr ? nullptr : a.out.f32();
  if (!layout.sharded()) return {};
  const int64_t C = fused != nullptr ? a.out16.shape()[1] : a.out.shape()[1];
  *input = fused != nullptr ? nullptr : gathered;
  parallel::GroupCollective gather =
      fused != nullptr ? layout.start_gather(fused->refill_prepared_input(ctx, *fused_saved, rows),
                                             a.out16.data<lattice::bf16>(), rows, C, DType::bf16)
                       : layout.start_gather(gathered, a.out.f32(), rows, C);
  if (!layout.overlaps()) gather.wait();  // measuring what the overlap hides: blocking
  return gather;
}

void finish_input_projections(const parallel::SequenceLayout& layout, const SublayerBackward& g,
                              int64_t width, parallel::GroupCollective& input_gather,
                              const std::function<void()>& weight_halves) {
  if (!g.split) return;
  parallel::GroupCollective reduction = layout.start_reduce(g.d_norm, g.d_rows, g.rows, width);
  if (!layout.overlaps()) reduction.wait();
  if (!g.defer) {
    input_gather.wait();
    weight_halves();
  }
  reduction.wait();
}

void input_projection_backward(const LayerContext& ctx, const SublayerBackward& g, Linear& layer,
                               const LinearActivations& saved, float* d_in, const float* d_out,
                               const float* in) {
  if (g.split)
    layer.backward_input(ctx, saved, d_in, d_out, g.rows);
  else
    layer.backward(ctx, saved, d_in, d_out, in, g.rows);
}

void output_projection_backward(const LayerContext& ctx, const SublayerBackward& g, Linear& layer,
                                const LinearActivations& saved, float* d_in, const float* d_out,
                                const float* in) {
  if (g.defer)
    layer.backward_input(ctx, saved, d_in, d_out, g.rows);
  else
    layer.backward(ctx, saved, d_in, d_out, in, g.rows);
}

}  // namespace lattice::model
