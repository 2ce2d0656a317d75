// Reduction kernels: blocks of up to kBlock elements are accumulated in an L1-resident buffer (fp32
// for bf16/fp16), then stored to every target with plain or non-temporal stores; an fp32 sum of at
// most one block goes straight from the sources into the targets (AVX-512, same order and bits),
// and streaming stores are AVX-512's: both in reduce_kernels_avx512.cpp, taken where
// cpu_features() has AVX-512.
#include "lattice/comm/reduce_kernels.hpp"

#include <algorithm>
#include <cstring>
#include <type_traits>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "lattice/comm/half.hpp"
#include "lattice/comm/reduce_kernels_isa.hpp"
#include "lattice/core/cpu_features.hpp"
#include "lattice/core/error.hpp"

namespace lattice::comm {
namespace {

// Stores `bytes` from an L1 block to `target`, streaming when asked and the target can be aligned.
void store_block(void* target, const void* source, size_t bytes, bool streaming) {
  if (streaming && bytes >= 256 && cpu_features().avx512())
    return avx512::stream_block(target, source, bytes);
  std::memcpy(target, source, bytes);
}

void store_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// Per-type load (to the accumulator type) and store (from it).
template <class Stored>
struct Codec;
template <>
struct Codec<float> {
  using Acc = float;
  static Acc load(float v) { return v; }
  static float store(Acc v) { return v; }
};
template <>
struct Codec<bf16> {
  using Acc = float;
  static Acc load(bf16 v) { return to_float(v); }
  static bf16 store(Acc v) { return to_bf16(v); }
};
template <>
struct Codec<f16> {
  using Acc = float;
#if defined(__FLT16_MAX__)
  static Acc load(f16 v) {
    return static_cast<float>(std::bit_cast<_Float16>(v.bits));
  }
  static f16 store(Acc v) {
    return f16{std::bit_cast<uint16_t>(static_cast<_Float16>(v))};
  }
#else
  static Acc load(f16 v) {
    return f16_to_float(v.bits);
  }
  static f16 store(Acc v) {
    return f16{float_to_f16(v)};
  }
#endif
};
template <>
struct Codec<int32_t> {
  using Acc = int32_t;
  static Acc load(int32_t v) { return v; }
  static int32_t store(Acc v) { return v; }
};
template <>
struct Codec<int64_t> {
  using Acc = int64_t;
  static Acc load(int64_t v) { return v; }
  static int64_t store(Acc v) { return v; }
};

template <class Acc>
inline Acc combine_sum(Acc a, Acc b) {
  if constexpr (std::is_integral_v<Acc>) {  // wrap around instead of overflowing (no UB)
    using U = std::make_unsigned_t<Acc>;
    return static_cast<Acc>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}

template <class Stored, ReduceOp kOp>
void reduce_typed(const void* const* sources, int source_count, void* const* targets,
                  int target_count, int64_t count, int average_divisor) {
  using C = Codec<Stored>;
  using Acc = typename C::Acc;
  alignas(64) Acc acc[kBlock];
  alignas(64) Stored out[kBlock];
  bool streaming = static_cast<size_t>(count) * sizeof(Stored) >= kStreamingStoreBytes;
  for (int64_t base = 0; base < count; base += kBlock) {
    int64_t n = std::min(kBlock, count - base);
    const Stored* first = static_cast<const Stored*>(sources[0]) + base;
    for (int64_t i = 0; i < n; ++i) acc[i] = C::load(first[i]);
    for (int s = 1; s < source_count; ++s) {
      const Stored* src = static_cast<const Stored*>(sources[s]) + base;
      if constexpr (kOp == ReduceOp::max) {
        for (int64_t i = 0; i < n; ++i) {
          Acc v = C::load(src[i]);
          acc[i] = v > acc[i] ? v : acc[i];
        }
      } else if constexpr (kOp == ReduceOp::min) {
        for (int64_t i = 0; i < n; ++i) {
          Acc v = C::load(src[i]);
          acc[i] = v < acc[i] ? v : acc[i];
        }
      } else {
        for (int64_t i = 0; i < n; ++i) acc[i] = combine_sum(acc[i], C::load(src[i]));
      }
    }
    if (average_divisor > 0) {
      Acc d = static_cast<Acc>(average_divisor);
      for (int64_t i = 0; i < n; ++i) acc[i] = acc[i] / d;
    }
    const void* block;
    if constexpr (std::is_same_v<Stored, Acc>) {
      block = acc;
    } else {
      for (int64_t i = 0; i < n; ++i) out[i] = C::store(acc[i]);
      block = out;
    }
    for (int t = 0; t < target_count; ++t) {
      store_block(static_cast<Stored*>(targets[t]) + base, block,
                  static_cast<size_t>(n) * sizeof(Stored), streaming);
    }
  }
  if (streaming) store_fence();
}

// Whether sum_f32_block may run: one block, and every target either is a source or overlaps none
// (reduce_typed stages a whole block before storing, so it also takes overlaps at an offset).
bool sum_f32_block_applies(const void* const* sources, int source_count, void* const* targets,
                           int target_count, int64_t count) {
  if (count > kBlock) return false;
  const auto bytes = static_cast<uintptr_t>(count) * sizeof(float);
  for (int t = 0; t < target_count; ++t) {
    const auto target = reinterpret_cast<uintptr_t>(targets[t]);
    for (int s = 0; s < source_count; ++s) {
      const auto source = reinterpret_cast<uintptr_t>(sources[s]);
      if (source != target && source < target + bytes && target < source + bytes) return false;
    }
  }
  return true;
}

template <class Stored>
void reduce_dispatch_op(const void* const* sources, int source_count, void* const* targets,
                        int target_count, int64_t count, ReduceOp op, int average_divisor) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return reduce_typed<Stored, ReduceOp::sum>(sources, source_count, targets, target_count,
                                                 count, average_divisor);
    case ReduceOp::max:
      return reduce_typed<Stored, ReduceOp::max>(sources, source_count, targets, target_count,
                                                 count, 0);
    case ReduceOp::min:
      return reduce_typed<Stored, ReduceOp::min>(sources, source_count, targets, target_count,
                                                 count, 0);
  }
}

}  // namespace

bool is_collective_dtype(DType dtype) {
  return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16 ||
         dtype == DType::i32 || dtype == DType::i64;
}

void reduce_into_targets(const void* const* sources, int source_count, void* const* targets,
                         int target_count, int64_t count, DType dtype, ReduceOp op,
                         int average_divisor) {
  if (count <= 0 || source_count <= 0) return;
  switch (dtype) {
    case DType::f32:
      if ((op == ReduceOp::sum || op == ReduceOp::avg) && cpu_features().avx512() &&
          sum_f32_block_applies(sources, source_count, targets, target_count, count))
        return avx512::sum_f32_block(sources, source_count, targets, target_count, count,
                                     average_divisor);
      return reduce_dispatch_op<float>(sources, source_count, targets, target_count, count, op,
                                       average_divisor);
    case DType::bf16:
      return reduce_dispatch_op<bf16>(sources, source_count, targets, target_count, count, op,
                                      average_divisor);
    case DType::f16:
      return reduce_dispatch_op<f16>(sources, source_count, targets, target_count, count, op,
                                     average_divisor);
    case DType::i32:
      return reduce_dispatch_op<int32_t>(sources, source_count, targets, target_count, count, op,
                                         average_divisor);
    case DType::i64:
      return reduce_dispatch_op<int64_t>(sources, source_count, targets, target_count, count, op,
                                         average_divisor);
    case DType::u8:
      break;
  }
  throw Error("collective reductions support f32, bf16, f16, i32 and i64, not " +
              std::string(dtype_name(dtype)));
}

void reduce_pair(void* acc, const void* local, const void* other, int64_t count, DType dtype,
                 ReduceOp op, int average_divisor) {
  const void* sources[2] = {local, other};
  void* targets[1] = {acc};
  reduce_into_targets(sources, 2, targets, 1, count, dtype, op, average_divisor);
}

void divide_in_place(void* buffer, int64_t count, DType dtype, int divisor) {
  if (divisor <= 1) return;
  const void* sources[1] = {buffer};
  void* targets[1] = {buffer};
  reduce_into_targets(sources, 1, targets, 1, count, dtype, ReduceOp::sum, divisor);
}

void copy_bytes(void* target, const void* source, size_t bytes) {
  if (bytes == 0 || target == source) return;
  if (bytes < kStreamingCopyBytes) {
    std::memcpy(target, source, bytes);
    return;
  }
  store_block(target, source, bytes, true);
  store_fence();
}

}  // namespace lattice::comm
