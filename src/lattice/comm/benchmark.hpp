// Collective benchmark in the nccl-tests convention: algbw = bytes / time, busbw = algbw x the op's
// bus factor (2(n-1)/n for allreduce; (n-1)/n for reduce-scatter, all-gather, all-to-all; 1 for
// broadcast and reduce). `bytes` is the allreduce/broadcast/reduce buffer, the whole reduce-scatter
// or all-to-all input, or the whole all-gather output.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lattice/comm/communicator.hpp"

namespace lattice::comm {

struct BenchResult {
  CollectiveOp op = CollectiveOp::allreduce;
  Algorithm algorithm = Algorithm::automatic;  // as resolved for this size
  int64_t bytes = 0;
  double seconds = 0;  // per call
  int iterations = 0;  // calls per timed run
  int trials = 1;      // timed runs; `seconds` is the median run's
  double algbw() const { return seconds > 0 ? static_cast<double>(bytes) / seconds : 0; }
};

double bus_factor(CollectiveOp op, int ranks);
// Parses "allreduce", "reduce_scatter", ... (the collective_op_name spelling).
CollectiveOp parse_collective_op(const std::string& name);

// Collective over `comm`: times `op` on `bytes` of fp32 (rounded down to whole elements per rank),
// after two warm-up calls, in `trials` runs of about `min_seconds` each (at least 3 calls), and
// reports the median run (one descheduled rank spoils a run of sub-microsecond calls, not the
// result). Every rank returns the same.
BenchResult time_collective(Communicator& comm, CollectiveOp op, int64_t bytes, double min_seconds,
                            int trials = 1);

// The memory-copy bound of a data-moving collective (all_gather, all_to_all, broadcast): every
// rank copies, at the same time as the others, as many bytes as `op` on `bytes` must write into
// its output, to a private buffer (the faster of comm's copy_bytes and memcpy), timed as
// time_collective times `op`. The sources are private too, unless `shared_source` (holding at
// least the output's bytes) is given: then every rank reads it, as every rank reads the same
// inputs in an all_gather or a broadcast among ranks that share an address space. No
// implementation that writes its output once can beat it. Returns seconds per call (the slowest
// rank; every rank returns the same), or 0 for an op without such a bound.
double time_output_copy(Communicator& comm, CollectiveOp op, int64_t bytes, double min_seconds,
                        int trials = 1, const void* shared_source = nullptr);

}  // namespace lattice::comm
