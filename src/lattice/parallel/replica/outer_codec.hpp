// OuterCodec: how Streaming DiLoCo sends the outer gradients (the pseudo-gradients Δ = θ_anchor −
// θ_local) between the replica groups in fewer bits (Douillard et al. 2025): bf16 (round to
// nearest even, 2 bytes a value) or a 4-bit float — E2M1 (the values ±{0, 0.5, 1, 1.5, 2, 3, 4, 6})
// with one power-of-two scale (an E8M0 byte) per block of 32, as the OCP Microscaling format lays
// them out, 17 bytes per 32 values (4.25 bits a value). The scale is rounded up, so no value of a
// block clips; each value is rounded to the nearest grid point. Members send their encoded Δ to
// each other (an all-gather) and each decodes and sums them in fp32 in member order, so every
// member gets the same bits; the optimizer's state stays fp32.
#pragma once

#include <cstdint>
#include <string>

namespace lattice::replica {

enum class OuterPrecision { fp32, bf16, fp4 };

// "fp32", "bf16", "fp4"; parse throws Error naming diloco.exchange for anything else.
std::string precision_name(OuterPrecision precision);
OuterPrecision parse_outer_precision(const std::string& name);

constexpr int64_t kFp4Block = 32;  // values per scale

// Bytes `count` values take encoded.
int64_t encoded_bytes(OuterPrecision precision, int64_t count);
// out (encoded_bytes(precision, count) bytes) = `values` encoded.
void encode(OuterPrecision precision, const float* values, int64_t count, uint8_t* out);
// sum[i] += the i-th value decoded from `in`.
void decode_add(OuterPrecision precision, const uint8_t* in, int64_t count, float* sum);

}  // namespace lattice::replica
