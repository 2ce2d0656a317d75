// Dissemination barrier: after round k every rank has heard, transitively, from 2^(k+1) ranks.
#include "lattice/comm/algorithms/dissemination_barrier.hpp"

namespace lattice::comm {

void dissemination_barrier(Transport& transport) {
  const int n = transport.size();
  const int rank = transport.rank();
  char token = 0, received = 0;
  for (int distance = 1; distance < n; distance *= 2) {
    transport.sendrecv(&token, 0, (rank + distance) % n, &received, 0, (rank - distance + n) % n);
  }
}

}  // namespace lattice::comm
