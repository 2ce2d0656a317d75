// Dissemination barrier over a Transport: ceil(log2 n) rounds of empty messages to rank + 2^k.
#pragma once

#include "lattice/comm/transport.hpp"

namespace lattice::comm {

void dissemination_barrier(Transport& transport);

}  // namespace lattice::comm
