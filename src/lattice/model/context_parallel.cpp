// Position helpers of the context-parallel seam: see context_parallel.hpp.
#include "lattice/model/context_parallel.hpp"

namespace lattice::model {

void rope_at_runs(kernels::Ops& ops, const ContextAttention* context,
                  const kernels::RopeTable& table, float* x, int64_t batch, int64_t local_len,
                  int64_t heads, int64_t row_stride, int64_t batch_stride, bool inverse) {
  if (context == nullptr) {
    ops.rope(table, x, batch, local_len, heads, row_stride, batch_stride, 0, inverse);
    return;
  }
  for (const PositionRun& run : context->runs(local_len))
    ops.rope(table, x + run.row * row_stride, batch, run.length, heads, row_stride, batch_stride,
             run.position, inverse);
}

}  // namespace lattice::model
