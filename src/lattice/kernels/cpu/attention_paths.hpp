// The attention kernels' internal entry points (private to kernels/cpu): shape validation, the
// portable fp32 / bf16-rounding path (attention_portable.cpp) and the AMX tile path
// (attention_forward_amx.cpp, attention_backward_amx.cpp: compiled for AMX whatever the rest of the
// build targets, CMakeLists.txt). attention.cpp and attention_bf16.cpp choose between them at run
// time (use_amx: CPUID and Linux's tile-state grant).
#pragma once

#include <cstdint>

#include "lattice/core/dtype.hpp"
#include "lattice/kernels/cpu/amx_tiles.hpp"  // amx_tile_state_granted
#include "lattice/kernels/cpu/attention.hpp"
#include "lattice/kernels/precision.hpp"

namespace lattice::kernels::attention_detail {

// Throws lattice::Error naming `who` and the fix when the shape is impossible.
void validate(const AttentionShape& s, const char* who);

// Query i of a call (0-based) sees the keys j (0-based) with j <= causal_offset + i, clamped to
// [0, kv_len): its relative position under the causal mask, kv_len (every key) without a mask.
inline int64_t causal_offset(const AttentionShape& s) {
  return s.mask == AttentionMask::none ? s.kv_len : s.query_offset() - s.k_offset;
}

// The portable path: Precision::fp32, or Precision::bf16's rounding with fp32 products.
void attention_forward_portable(float* out, float* lse, const float* q, const float* k,
                                const float* v, const AttentionShape& shape, Precision precision);
// dq is overwritten, or added to with accumulate_dq.
void attention_backward_portable(float* dq, float* dk, float* dv, const float* d_out,
                                 const float* q, const float* k, const float* v, const float* out,
                                 const float* lse, const AttentionShape& shape, Precision precision,
                                 bool accumulate_dq);

// The first key (0-based, may be negative) that query i sees under the sliding window, relative
// to the call's keys: causal_offset + i - window + 1; below 0 (every earlier key) without a window.
inline int64_t window_start(const AttentionShape& s, int64_t causal_offset, int64_t i) {
  return s.window > 0 ? causal_offset + i - s.window + 1 : int64_t{-1} << 62;
}

// Whether Precision::bf16 runs on the AMX tiles: the options allow it, Linux granted the tile
// state, and the shape is one the tile kernels take (value heads as wide as the query-key heads,
// no sliding window; the others run on the portable path with the same rounding).
bool use_amx(const AttentionOptions& options, const AttentionShape& shape);

// Where the backward puts dQ, dK and dV: fp32 rows (the strides of q, k, v), or bf16 rows plus
// each batch's column sums of the unrounded values (AttentionGradientsBf16).
struct Fp32GradientRows {
  float* dq = nullptr;
  float* dk = nullptr;
  float* dv = nullptr;
  double* dq_sums = nullptr;  // always null: fp32 rows come without column sums
  double* dk_sums = nullptr;
  double* dv_sums = nullptr;
  int64_t sums_batch_stride = 0;
  bool accumulate_dq = false;  // dq += the call's dQ
};

// Precision::bf16 on AMX tiles, on fp32 q, k, v (rounded as they are packed) or bf16 ones.
void attention_forward_amx(float* out, float* lse, const float* q, const float* k, const float* v,
                           const AttentionShape& shape);
void attention_forward_amx(float* out, float* lse, const lattice::bf16* q, const lattice::bf16* k,
                           const lattice::bf16* v, const AttentionShape& shape);
void attention_backward_amx(const Fp32GradientRows& grads, const float* d_out, const float* q,
                            const float* k, const float* v, const float* out, const float* lse,
                            const AttentionShape& shape);
void attention_backward_amx(const AttentionGradientsBf16& grads, const float* d_out,
                            const lattice::bf16* q, const lattice::bf16* k, const lattice::bf16* v,
                            const float* out, const float* lse, const AttentionShape& shape);

}  // namespace lattice::kernels::attention_detail
