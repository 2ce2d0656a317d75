// Pairwise-exchange all-to-all over a Transport: in step s each rank sends to rank+s and receives
// from rank-s, for equal or variable block sizes.
#pragma once

#include <cstdint>
#include <span>

#include "lattice/comm/transport.hpp"

namespace lattice::comm {

// in holds send_counts[r] elements for each rank r in rank order; out receives recv_counts[r] from
// each rank r in rank order.
void pairwise_all_to_all(Transport& transport, const void* in, std::span<const int64_t> send_counts,
                         void* out, std::span<const int64_t> recv_counts, DType dtype);

}  // namespace lattice::comm
