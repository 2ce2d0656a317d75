// Recursive halving-doubling allreduce (Rabenseifner) over a Transport, for any rank count: ranks
// beyond the largest power of two fold their data into a partner first and get the result back
// last.
#pragma once

#include <cstdint>

#include "lattice/comm/transport.hpp"

namespace lattice::comm {

void halving_doubling_allreduce(Transport& transport, const void* in, void* out, int64_t count,
                                DType dtype, ReduceOp op);

}  // namespace lattice::comm
