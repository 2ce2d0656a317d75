// The program the comm tests start under mpirun: runs the collective suite (or a failure scenario)
// on the MPI backend and prints "suite ok" or the failures; errors print "error: ..." and abort the
// job.
//   mpi_worker suite <counts,...> <dtypes: all|f32,...> <algorithms: native,ring,...>
//   mpi_worker missing | mismatch | exit
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "collective_suite.hpp"
#include "lattice/comm/backends/mpi.hpp"
#include "lattice/core/error.hpp"

namespace lattice::comm {
namespace {

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) items.push_back(item);
  return items;
}

DType parse_dtype(const std::string& name) {
  for (DType t : testing::all_dtypes()) {
    if (dtype_name(t) == name) return t;
  }
  throw Error("unknown dtype " + name);
}

int run_suite(Communicator& comm, int argc, char** argv) {
  std::vector<int64_t> counts;
  for (const auto& c : split_list(argc > 2 ? argv[2] : "0,1,7,1023"))
    counts.push_back(std::stoll(c));
  std::vector<DType> dtypes;
  std::string dtype_list = argc > 3 ? argv[3] : "all";
  if (dtype_list == "all") {
    dtypes = testing::all_dtypes();
  } else {
    for (const auto& d : split_list(dtype_list)) dtypes.push_back(parse_dtype(d));
  }
  testing::Failures failures;
  for (const auto& name : split_list(argc > 4 ? argv[4] : "native")) {
    testing::force_algorithm(comm, parse_algorithm(name));
    testing::run_collective_suite(comm, counts, dtypes, failures);
  }
  // Point-to-point ring and split.
  int next = (comm.rank() + 1) % comm.size(), prev = (comm.rank() + comm.size() - 1) % comm.size();
  int32_t token = comm.rank(), got = -1;
  CommHandle receive = comm.irecv(&got, 1, DType::i32, prev, 3);
  comm.send(&token, 1, DType::i32, next, 3);
  receive.wait();
  if (got != prev)
    failures.add("p2p: rank " + std::to_string(comm.rank()) + " got " + std::to_string(got));
  auto half = comm.split(comm.rank() % 2, comm.rank());
  int64_t one = 1, members = 0;
  half->allreduce(&one, &members, 1, DType::i64, ReduceOp::sum);
  if (members != (comm.size() + (comm.rank() % 2 == 0 ? 1 : 0)) / 2)
    failures.add("split: wrong group size " + std::to_string(members));
  // In-place all_gather: this rank's block already sits at its place in the output.
  std::vector<int32_t> blocks(static_cast<size_t>(comm.size()), -1);
  blocks[static_cast<size_t>(comm.rank())] = 100 + comm.rank();
  comm.all_gather(&blocks[static_cast<size_t>(comm.rank())], blocks.data(), 1, DType::i32);
  for (int r = 0; r < comm.size(); ++r) {
    if (blocks[static_cast<size_t>(r)] != 100 + r)
      failures.add("in-place all_gather: block " + std::to_string(r));
  }
  CommHandle async = comm.allreduce_async(&one, 1, DType::i64, ReduceOp::sum);
  async.wait();
  if (one != comm.size()) failures.add("async allreduce: got " + std::to_string(one));
  for (const auto& line : failures.lines) std::printf("FAIL %s\n", line.c_str());
  int ok = failures.ok() ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (comm.rank() == 0 && all_ok)
    std::printf("suite ok on %d ranks, node count %d\n", comm.size(), comm.node_count());
  std::fflush(stdout);
  return all_ok ? 0 : 1;
}

int run(int argc, char** argv) {
  std::string scenario = argc > 1 ? argv[1] : "suite";
  MpiSession session;
  int status = 0;
  {
    CommOptions options = options_from_environment();
    if (scenario != "suite") options.timeout = std::chrono::milliseconds(1500);
    auto comm = session.world(options);
    float x = 1;
    if (scenario == "suite") {
      status = run_suite(*comm, argc, argv);
    } else if (scenario == "missing") {
      comm->allreduce(&x, 1, DType::f32, ReduceOp::sum);
      if (comm->rank() == comm->size() - 1) {
        std::this_thread::sleep_for(std::chrono::seconds(10));  // never joins #2
      } else {
        comm->allreduce(&x, 1, DType::f32, ReduceOp::sum);
      }
    } else if (scenario == "mismatch") {
      std::vector<float> data(12);
      comm->allreduce(data.data(), comm->rank() == 0 ? 10 : 12, DType::f32, ReduceOp::sum);
    } else if (scenario == "exit") {
      comm->barrier();
      if (comm->rank() == 1) _exit(0);  // dies without a word
      comm->allreduce(&x, 1, DType::f32, ReduceOp::sum);
    }
  }
  return status;
}

}  // namespace
}  // namespace lattice::comm

int main(int argc, char** argv) {
  try {
    return lattice::comm::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 3;
  }
}
