// What every MLP kind shares: see feed_forward.hpp.
#include "lattice/model/components/feed_forward.hpp"

#include "lattice/model/components/backward_slots.hpp"

namespace lattice::model {

void FeedForwardActivations::release() {
  norm.release();
  d_out.reset();
}

const float* mlp_output_gradient(const LayerContext& ctx, const parallel::SequenceLayout& layout,
                                 const SublayerBackward& g, Tensor& pending, const float* d_x_out,
                                 int64_t width, bool keep_fp32) {
  const bool keep = g.defer && keep_fp32;
  if (layout.sharded()) {
    float* all = keep ? g.kept(pending, slot::output_gradient_rows, g.rows * width)
                      : g.get(slot::output_gradient_rows, g.rows * width);
    layout.gather(all, d_x_out, g.rows, width);
    return all;
  }
  if (!keep) return d_x_out;
  float* copy = g.kept(pending, slot::output_gradient_rows, g.rows * width);
  ctx.ops.copy(copy, d_x_out, g.rows * width);
  return copy;
}

}  // namespace lattice::model
