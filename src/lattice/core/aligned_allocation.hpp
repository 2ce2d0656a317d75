// Aligned heap blocks for tensors and kernel scratch: 64-byte aligned (a cache line, an AVX-512
// vector, an AMX tile row), and for large blocks 2 MiB aligned and marked for transparent huge
// pages (madvise), which Linux here grants only on request. With 4 KiB pages, kernels that stride
// across rows of wide matrices (an LM head's [rows, vocabulary] logits, written 32 KiB apart per
// row) spend their time on TLB misses.
#pragma once

#include <cstddef>

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

}  // namespace lattice
