// Giving memory back inside a live buffer: ZeRO-2/3 keep the model's flat gradient and parameter
// buffers at their full size as address space, but hand a bucket's pages back to the kernel once
// its contents are reduced or sharded (madvise MADV_DONTNEED: the pages read back as zeros and
// cost no memory until written again). Resident memory (RSS) really drops; the memory tracker is
// told the same bytes.
#pragma once

#include <cstdint>

namespace lattice::parallel {

// Sets floats [data, data + count) to zero, returning the whole pages inside the range to the
// kernel (the partial pages at either end are zeroed in place).
void release_floats(float* data, int64_t count);

}  // namespace lattice::parallel
