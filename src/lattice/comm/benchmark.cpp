// Collective benchmark: buffers per case, calibration on one call, iterations agreed through a
// broadcast, timed runs between barriers on rank 0's clock, the median run reported.
#include "lattice/comm/benchmark.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "lattice/comm/reduce_kernels.hpp"
#include "lattice/core/error.hpp"

namespace lattice::comm {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct TimedCalls {
  double seconds = 0;  // per call
  int64_t iterations = 0;
};

// The median of `values` (the mean of the middle two for an even count).
double median_of(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// Times `once` on every rank: two warm-up calls, one call that sizes the run (the slowest rank's
// time decides), then `trials` runs of enough calls for about min_seconds each (at least 3), each
// started together after a barrier; the result is the median run's time per call. A collective
// is timed on rank 0's clock up to a closing barrier; independent work (the copy bound) by the
// slowest rank's own clock. Every rank returns the same.
TimedCalls time_calls(Communicator& comm, double min_seconds, int trials,
                      const std::function<void()>& once, bool independent_work) {
  check(trials >= 1, "bench comm: trials must be at least 1, got " + std::to_string(trials));
  once();
  once();
  comm.barrier();
  double start = now_seconds();
  once();
  double single = now_seconds() - start;
  // Positive doubles order like their bit patterns read as int64.
  comm.allreduce(&single, 1, DType::i64, ReduceOp::max);
  TimedCalls timed;
  timed.iterations =
      static_cast<int64_t>(std::min(100000.0, std::max(3.0, min_seconds / std::max(single, 1e-7))));
  comm.broadcast(&timed.iterations, 1, DType::i64, 0);
  std::vector<double> per_call(static_cast<size_t>(trials));
  for (double& seconds : per_call) {
    comm.barrier();
    start = now_seconds();
    for (int64_t i = 0; i < timed.iterations; ++i) once();
    if (!independent_work) comm.barrier();
    seconds = (now_seconds() - start) / static_cast<double>(timed.iterations);
  }
  timed.seconds = median_of(per_call);
  if (independent_work)
    comm.allreduce(&timed.seconds, 1, DType::i64, ReduceOp::max);
  else
    comm.broadcast(&timed.seconds, 1, DType::i64, 0);
  return timed;
}

}  // namespace

double bus_factor(CollectiveOp op, int ranks) {
  double n = ranks;
  switch (op) {
    case CollectiveOp::allreduce:
      return ranks > 1 ? 2.0 * (n - 1) / n : 0.0;
    case CollectiveOp::reduce_scatter:
    case CollectiveOp::all_gather:
    case CollectiveOp::all_gather_v:
    case CollectiveOp::all_to_all:
    case CollectiveOp::all_to_all_v:
      return ranks > 1 ? (n - 1) / n : 0.0;
    default:
      return 1.0;
  }
}

CollectiveOp parse_collective_op(const std::string& name) {
  for (int i = 0; i < kCollectiveOpCount; ++i) {
    auto op = static_cast<CollectiveOp>(i);
    if (collective_op_name(op) == name) return op;
  }
  throw Error("unknown collective '" + name +
              "'; use allreduce, reduce_scatter, all_gather, all_to_all, broadcast or reduce");
}

BenchResult time_collective(Communicator& comm, CollectiveOp op, int64_t bytes, double min_seconds,
                            int trials) {
  const int n = comm.size();
  const int64_t elements = std::max<int64_t>(1, bytes / 4);
  const int64_t block = std::max<int64_t>(1, elements / n);  // per-rank block of the split ops
  std::vector<float> in(static_cast<size_t>(elements), 1.0f);
  std::vector<float> out(static_cast<size_t>(std::max(elements, block * n)), 0.0f);
  auto once = [&] {
    switch (op) {
      case CollectiveOp::allreduce:
        comm.allreduce(in.data(), elements, DType::f32, ReduceOp::sum);
        break;
      case CollectiveOp::reduce_scatter:
        comm.reduce_scatter(in.data(), out.data(), block, DType::f32, ReduceOp::sum);
        break;
      case CollectiveOp::all_gather:
        comm.all_gather(in.data(), out.data(), block, DType::f32);
        break;
      case CollectiveOp::all_to_all:
        comm.all_to_all(in.data(), out.data(), block, DType::f32);
        break;
      case CollectiveOp::broadcast:
        comm.broadcast(in.data(), elements, DType::f32, 0);
        break;
      case CollectiveOp::reduce:
        comm.reduce(in.data(), out.data(), elements, DType::f32, ReduceOp::sum, 0);
        break;
      default:
        throw Error("bench comm: " + std::string(collective_op_name(op)) + " is not benchmarked");
    }
  };
  const TimedCalls timed = time_calls(comm, min_seconds, trials, once, /*independent_work=*/false);
  BenchResult result;
  result.op = op;
  result.bytes = elements * 4;
  result.seconds = timed.seconds;
  result.iterations = static_cast<int>(timed.iterations);
  result.trials = trials;
  result.algorithm = comm.algorithm_for(op, result.bytes);
  return result;
}

double time_output_copy(Communicator& comm, CollectiveOp op, int64_t bytes, double min_seconds,
                        int trials, const void* shared_source) {
  const int n = comm.size();
  const int64_t elements = std::max<int64_t>(1, bytes / 4);
  const int64_t block = std::max<int64_t>(1, elements / n);
  int64_t output_elements = 0;
  switch (op) {  // what time_collective's call writes into this rank's output
    case CollectiveOp::all_gather:
    case CollectiveOp::all_to_all:
      output_elements = block * n;
      break;
    case CollectiveOp::broadcast:
      output_elements = comm.rank() == 0 ? 0 : elements;
      break;
    default:
      return 0.0;
  }
  const auto buffer_elements = static_cast<size_t>(std::max<int64_t>(1, output_elements));
  std::vector<float> private_source(shared_source != nullptr ? 0 : buffer_elements, 1.0f);
  const void* source = shared_source != nullptr ? shared_source : private_source.data();
  std::vector<float> target(buffer_elements, 0.0f);
  const size_t copy = static_cast<size_t>(output_elements) * sizeof(float);
  double best = 0.0;
  for (int routine = 0; routine < 2; ++routine) {
    auto once = [&] {
      if (routine == 0)
        copy_bytes(target.data(), source, copy);
      else
        std::memcpy(target.data(), source, copy);
    };
    const double seconds =
        time_calls(comm, min_seconds, trials, once, /*independent_work=*/true).seconds;
    best = routine == 0 ? seconds : std::min(best, seconds);
  }
  return best;
}

}  // namespace lattice::comm
