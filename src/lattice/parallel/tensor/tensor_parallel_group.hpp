// The tensor-parallel group a stage is built with: the communicator of the mesh's tp axis, this
// rank's place in it, whether the residual stream is split over it by sequence rows (sequence
// parallelism) and whether its collectives overlap the GEMMs. This is wiring data: the trainer
// fills it from the mesh, the Transformer turns it into the SequenceLayout (sequence_layout.hpp)
// and the LinearSplits (linear_split.hpp) its components compute with.
#pragma once

#include <cstdint>

namespace lattice::comm {
class Communicator;
}

namespace lattice::parallel {

struct TensorParallelGroup {
  comm::Communicator* comm = nullptr;  // null means size 1
  int rank = 0;
  int size = 1;
  // When set, every collective of the group adds the wall time it blocks (seconds) here: the
  // training line's "tp comm". Owned by the caller, one per rank.
  double* comm_seconds = nullptr;
  // Overlap a column-split layer's input-gradient reduction with its weight-gradient GEMMs, and the
  // sequence gathers and reduce-scatters with the GEMMs beside them (Megatron's asynchronous
  // tensor-parallel all-reduce). The same arithmetic either way: false is for measuring what the
  // overlap hides.
  bool overlap = true;
  // Sequence parallelism (Korthikanti et al.): the residual stream, the norms and the residual adds
  // run on this rank's rows / size of the rows (SequenceLayout's own rows); the column-split
  // layers' inputs are all-gathered and the row-split layers' outputs reduce-scattered instead of
  // all-reduced. Requires size > 1 and rows divisible by size.
  bool sequence_parallel = false;

  // The rows of the residual stream this rank holds out of `rows`.
  int64_t local_rows(int64_t rows) const { return sequence_parallel ? rows / size : rows; }
};

}  // namespace lattice::parallel
