// attention_forward / attention_backward: the entry points on fp32 q, k, v. They validate the shape
// and choose the path: Precision::bf16 runs on AMX tiles where the CPU has AMX and Linux grants the
// tile state (attention_*_amx.cpp, chosen at run time), everything else on the portable tiles
// (attention_portable.cpp). The kernels themselves are FlashAttention-2: the forward streams key
// blocks through an online softmax and saves only the log-sum-exp per query; the backward
// recomputes each tile's probabilities from it. Extra memory is O(T * head_dim) per thread.
#include "lattice/kernels/cpu/attention.hpp"

#include "lattice/kernels/cpu/attention_paths.hpp"

namespace lattice::kernels {

namespace attention_detail {

bool use_amx(const AttentionOptions& options, const AttentionShape& shape) {
  return options.allow_amx && shape.window == 0 && shape.value_dim() == shape.head_dim &&
         shape.value_batch_stride() == shape.kv_batch_stride && amx_tile_state_granted();
}

}  // namespace attention_detail

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionShape& shape, Precision precision, MatmulEngine& /*matmul*/,
                       const AttentionOptions& options) {
  attention_detail::validate(shape, "attention_forward");
  if (precision == Precision::bf16 && attention_detail::use_amx(options, shape)) {
    attention_detail::attention_forward_amx(out, lse, q, k, v, shape);
    return;
  }
  attention_detail::attention_forward_portable(out, lse, q, k, v, shape, precision);
}

void attention_backward(float* dq, float* dk, float* dv, const float* d_out, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const AttentionShape& shape, Precision precision, MatmulEngine& /*matmul*/,
                        const AttentionOptions& options) {
  attention_detail::validate(shape, "attention_backward");
  if (precision == Precision::bf16 && attention_detail::use_amx(options, shape)) {
    attention_detail::attention_backward_amx(
        attention_detail::Fp32GradientRows{
            .dq = dq, .dk = dk, .dv = dv, .accumulate_dq = options.accumulate_dq},
        d_out, q, k, v, out, lse, shape);
    return;
  }
  attention_detail::attention_backward_portable(dq, dk, dv, d_out, q, k, v, out, lse, shape,
                                                precision, options.accumulate_dq);
}

}  // namespace lattice::kernels
