// How one Linear's weight is split over the ranks of a tensor-parallel group (Shoeybi et al.,
// Megatron-LM), as a parallelize plan (parallelize_plan.hpp) assigns it:
//   none:   whole on every rank.
//   column: each rank holds out_features / size of the output rows (and their bias): its output is
//           this rank's columns of the whole output, from the whole input, and its input gradient
//           is this rank's partial sum, which the sequence layout reduces once per sub-layer.
//   row:    each rank holds in_features / size of the input columns: its input is this rank's
//           columns of the whole input, its output a partial sum the layout reduces; the bias is
//           whole and added by rank 0 only, so the reduced sum holds it once.
// The layer computes on its local shapes with the same code as one rank.
#pragma once

namespace lattice::parallel {

enum class TensorSplit { none, column, row };

struct LinearSplit {
  TensorSplit kind = TensorSplit::none;
  int rank = 0, size = 1;
  // > 1 (column only): the output rows are that many equal blocks (q | k | v), each split over the
  // ranks (TensorShard::blocks).
  int blocks = 1;

  bool splits() const { return kind != TensorSplit::none && size > 1; }
};

}  // namespace lattice::parallel
