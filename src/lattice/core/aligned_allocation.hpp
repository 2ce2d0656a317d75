// Aligned heap blocks for tensors and kernel scratch: 64-byte aligned (a cache line, an AVX-512
// vector, an AMX tile row), and for large blocks 2 MiB aligned and marked for transparent huge
// pages (madvise), which Linux here grants only on request. With 4 KiB pages, kernels that stride
// across rows of wide matrices (an LM head's [rows, vocabulary] logits, written 32 KiB apart per
// row) spend their time on TLB misses.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace lattice {

// Blocks of at least this many bytes are 2 MiB aligned and asked to use huge pages.
inline constexpr size_t kHugePageThresholdBytes = size_t{2} << 20;

// A block of at least `bytes` bytes (rounded up to 64), 64-byte aligned, and 2 MiB aligned with
// huge pages advised from kHugePageThresholdBytes up; nullptr when out of memory. Free it with
// free_aligned. The contents are not initialised.
//
// Blocks from kHugePageThresholdBytes up are mapped directly (whole 2 MiB pages) and, once freed,
// kept (up to 8 GiB in all) for the next allocation of the same size, as PyTorch's caching
// allocator keeps GPU memory: glibc maps blocks of 32 MiB and more afresh every time and trims the
// smaller ones' pages off its heap, and a training step frees and reallocates the same activation
// blocks each step (the kernel's zeroing of the fresh pages took 4.5% of a GPT-2 124M step and
// 7.5% of the small shape's bf16 step). The process's resident size therefore stays at its peak.
void* allocate_aligned(size_t bytes);
void free_aligned(void* block) noexcept;

// A std::vector's allocator on allocate_aligned: buffers handed to the kernels outside tensors
// (benchmarks, calibrations) start on a cache line as tensors do. An AMX tile row that straddles
// two lines costs two loads or stores: with its output 16 bytes past a line (glibc's large
// blocks) a 1024^3 bf16 product ran at about 80% of its rate, and the AMX kernel alone with every
// operand so at half.
template <class T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U>& /*other*/) noexcept {}  // NOLINT: rebinding
  T* allocate(size_t n) {
    if (n > static_cast<size_t>(-1) / sizeof(T)) throw std::bad_array_new_length();
    void* block = allocate_aligned(n == 0 ? 1 : n * sizeof(T));
    if (block == nullptr) throw std::bad_alloc();
    return static_cast<T*>(block);
  }
  void deallocate(T* block, size_t /*n*/) noexcept { free_aligned(block); }
  template <class U>
  bool operator==(const AlignedAllocator<U>& /*other*/) const noexcept {
    return true;
  }
};

template <class T>
using AlignedVector = std::vector<T, AlignedAllocator<T>>;

}  // namespace lattice
