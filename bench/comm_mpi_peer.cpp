// The Open MPI side of `lattice bench comm`: times MPI's own collectives (MPI_Allreduce,
// MPI_Reduce_scatter_block, MPI_Allgather, MPI_Alltoall, MPI_Bcast, MPI_Reduce on floats) with the
// same sizes and timing rule as Lattice's side (the median of `trials` timed runs), and prints one
// "RESULT <op> <bytes> <seconds> <iterations>" line per case from rank 0.
//   mpirun -n <ranks> lattice_comm_mpi_peer <ops,...> <bytes,...> <min_seconds> [trials]
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) items.push_back(item);
  return items;
}

// `bytes` follows nccl-tests: the buffer of allreduce / broadcast / reduce, the whole input of
// reduce_scatter and all_to_all, the whole output of all_gather.
struct Case {
  std::string op;
  long long bytes;
};

void run_once(const Case& c, std::vector<float>& in, std::vector<float>& out, int n) {
  int count = static_cast<int>(c.bytes / 4);
  if (c.op == "allreduce") {
    MPI_Allreduce(MPI_IN_PLACE, in.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  } else if (c.op == "reduce_scatter") {
    MPI_Reduce_scatter_block(in.data(), out.data(), count / n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  } else if (c.op == "all_gather") {
    MPI_Allgather(in.data(), count / n, MPI_FLOAT, out.data(), count / n, MPI_FLOAT,
                  MPI_COMM_WORLD);
  } else if (c.op == "all_to_all") {
    MPI_Alltoall(in.data(), count / n, MPI_FLOAT, out.data(), count / n, MPI_FLOAT, MPI_COMM_WORLD);
  } else if (c.op == "broadcast") {
    MPI_Bcast(in.data(), count, MPI_FLOAT, 0, MPI_COMM_WORLD);
  } else if (c.op == "reduce") {
    MPI_Reduce(in.data(), out.data(), count, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (argc < 4) {
    if (rank == 0)
      std::fprintf(stderr, "usage: lattice_comm_mpi_peer <ops> <bytes> <min_seconds> [trials]\n");
    MPI_Finalize();
    return 2;
  }
  std::vector<std::string> ops = split_list(argv[1]);
  std::vector<long long> sizes;
  for (const auto& s : split_list(argv[2])) sizes.push_back(std::atoll(s.c_str()));
  double min_seconds = std::atof(argv[3]);
  const int trials = argc > 4 ? std::max(1, std::atoi(argv[4])) : 1;
  for (const auto& op : ops) {
    for (long long bytes : sizes) {
      Case c{op, bytes};
      size_t elements = static_cast<size_t>(std::max(1LL, bytes / 4));
      std::vector<float> in(elements, 1.0f), out(elements, 0.0f);
      for (int i = 0; i < 2; ++i) run_once(c, in, out, n);
      // Calibrate on one timed run, agree on the iteration count, then time them all.
      MPI_Barrier(MPI_COMM_WORLD);
      double start = MPI_Wtime();
      run_once(c, in, out, n);
      double once = MPI_Wtime() - start;
      MPI_Allreduce(MPI_IN_PLACE, &once, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      int iterations =
          static_cast<int>(std::min(100000.0, std::max(3.0, min_seconds / std::max(once, 1e-7))));
      std::vector<double> per_call;
      for (int trial = 0; trial < trials; ++trial) {
        MPI_Barrier(MPI_COMM_WORLD);
        start = MPI_Wtime();
        for (int i = 0; i < iterations; ++i) run_once(c, in, out, n);
        MPI_Barrier(MPI_COMM_WORLD);
        per_call.push_back((MPI_Wtime() - start) / iterations);
      }
      std::sort(per_call.begin(), per_call.end());  // the median run, as Lattice's side reports
      const size_t middle = per_call.size() / 2;
      double seconds = per_call.size() % 2 == 1 ? per_call[middle]
                                                : 0.5 * (per_call[middle - 1] + per_call[middle]);
      if (rank == 0) {
        std::printf("RESULT %s %lld %.9g %d\n", op.c_str(), bytes, seconds, iterations);
        std::fflush(stdout);
      }
    }
  }
  MPI_Finalize();
  return 0;
}
