// The operands of a Linear's products as every backend takes them: a weight with its optional bf16
// rounding, and the caller-owned bf16 copies that let a backward reuse what its forward rounded.
#pragma once

#include "lattice/core/dtype.hpp"

namespace lattice::kernels {

// Caller-owned bf16 copies of a Linear's GEMM operands (bf16 precision only; ignored in fp32), so
// that what forward rounded is not rounded again in backward. In forward, a non-null `in`
// receives in[M,K] rounded to bf16 and the GEMM reads it; when forward's fp32 `in` is null, `in`
// must already hold the rounded input (e.g. written by gelu_forward_bf16). A non-null `weight`
// holds weight[N,K] already rounded (the parameter store's copy), in forward and backward. In
// backward, non-null pointers hold those copies (or d_out[M,N] rounded, e.g. by the cross-entropy)
// and are used instead of rounding the fp32 operand; results are bit-identical either way.
struct Bf16Operands {
  lattice::bf16* in = nullptr;
  const lattice::bf16* weight = nullptr;
  const lattice::bf16* d_out = nullptr;  // backward only
};

// A weight as the chunked products take it: its fp32 values and, when the caller keeps one, its
// bf16 rounding (lattice::to_bf16 of every element: the parameter store's copy), which the engine
// then reads instead of rounding the fp32 values again. Results are bit-identical either way.
struct WeightOperand {
  WeightOperand(const float* f32) : f32(f32) {}  // NOLINT(google-explicit-constructor): fp32 only
  WeightOperand(const float* f32, const lattice::bf16* rounded) : f32(f32), rounded(rounded) {}
  const float* f32 = nullptr;
  const lattice::bf16* rounded = nullptr;
};

}  // namespace lattice::kernels
