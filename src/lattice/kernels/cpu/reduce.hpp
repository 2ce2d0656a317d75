// Deterministic reductions for gradient norms: the sum of squares accumulated in double over fixed
// chunks, so the result does not depend on the thread count.
#pragma once

#include <cstdint>
#include <span>

#include "lattice/kernels/optimizer_operands.hpp"

namespace lattice::kernels {

double sum_of_squares(const float* x, int64_t n);

// The sum over `runs`, in order, of sum_of_squares(run): bit for bit the same, with every run's
// chunks in one parallel loop (a model's many small parameters cost one OpenMP region, not one
// each).
double sum_of_squares_of_runs(std::span<const FloatRun> runs);

// sums[i] = sum_of_squares(runs[i]) for every run, bit for bit, with all the runs' chunks in one
// parallel loop: a gradient norm's many short per-chunk sums spread over the threads, where one
// call per run would leave them all to the calling thread.
void sum_of_squares_each(std::span<const FloatRun> runs, double* sums);

}  // namespace lattice::kernels
