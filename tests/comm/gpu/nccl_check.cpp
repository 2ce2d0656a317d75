// GPU check of the nccl backend (run by run_nccl_check.sh where a GPU is lent): the collective
// suite on one rank per visible GPU, with managed memory, bootstrapped over a local world and
// through a file; under mpirun (one process per GPU) bootstrapped over MPI; then a split
// communicator and asynchronous allreduces in flight together. Prints "nccl check ok".
#include <cuda_runtime.h>

#include <unistd.h>

#include <cstdio>
#include <mutex>
#include <string>

#include "collective_suite.hpp"
#include "lattice/comm/backends/local.hpp"
#include "lattice/comm/backends/mpi.hpp"
#include "lattice/comm/backends/nccl.hpp"
#include "lattice/comm/launch.hpp"
#include "lattice/core/error.hpp"

namespace lattice::comm {
namespace {

testing::BufferMemory managed_memory() {
  testing::BufferMemory memory;
  memory.allocate = [](size_t bytes) {
    void* pointer = nullptr;
    if (cudaMallocManaged(&pointer, bytes) != cudaSuccess) throw Error("cudaMallocManaged failed");
    return pointer;
  };
  memory.release = [](void* pointer) { cudaFree(pointer); };
  return memory;
}

int check(Communicator& nccl, const char* how) {
  testing::Failures failures;
  testing::BufferMemory memory = managed_memory();
  testing::run_collective_suite(nccl, {0, 1, 7, 1023, 1000003}, testing::all_dtypes(), failures,
                                memory);
  for (const auto& line : failures.lines) std::printf("FAIL (%s) %s\n", how, line.c_str());
  int status = failures.ok() ? 0 : 1;
  // Two asynchronous allreduces in flight at once on this communicator (in flight together on two
  // communicators they could deadlock across GPUs, as NCCL warns), then one on a communicator split
  // from it with the ranks in reverse order: every element must be the sum over ranks of rank + 1.
  auto reversed = nccl.split(0, nccl.size() - nccl.rank());
  constexpr int64_t kCount = 1 << 20;
  testing::Buffer first(kCount, DType::f32, memory), second(kCount, DType::f32, memory);
  auto* a = static_cast<float*>(first.data());
  auto* b = static_cast<float*>(second.data());
  for (int64_t i = 0; i < kCount; ++i) a[i] = b[i] = static_cast<float>(nccl.rank() + 1);
  CommHandle on_first = nccl.allreduce_async(a, kCount, DType::f32, ReduceOp::sum);
  CommHandle on_second = nccl.allreduce_async(b, kCount / 2, DType::f32, ReduceOp::sum);
  on_first.wait();
  on_second.wait();
  reversed->allreduce_async(b + kCount / 2, kCount - kCount / 2, DType::f32, ReduceOp::sum).wait();
  const float expected = static_cast<float>(nccl.size() * (nccl.size() + 1) / 2);
  int64_t wrong = 0;
  for (int64_t i = 0; i < kCount; ++i) wrong += (a[i] != expected) + (b[i] != expected);
  if (reversed->size() != nccl.size() || reversed->rank() != nccl.size() - 1 - nccl.rank() ||
      wrong != 0) {
    std::printf("FAIL (%s) split/async: split rank %d of %d, %lld wrong elements\n", how,
                reversed->rank(), reversed->size(), static_cast<long long>(wrong));
    status = 1;
  }
  return status;
}

int run() {
  if (detect_launch().launcher == Launcher::open_mpi) {
    MpiSession session;
    int status = 0;
    {
      auto world = session.world();
      int devices = 0;
      cudaGetDeviceCount(&devices);
      auto nccl = nccl_communicator(*world, world->local_rank() % std::max(devices, 1));
      status = check(*nccl, "mpi bootstrap");
      if (world->rank() == 0 && status == 0)
        std::printf("nccl check ok: %d processes, MPI bootstrap\n", world->size());
    }
    return status;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no GPU visible\n");
    return 2;
  }
  std::mutex mutex;
  int status = 0;
  LocalWorld world(devices);
  world.run([&](Communicator& bootstrap) {
    auto nccl = nccl_communicator(bootstrap, bootstrap.rank());
    int result = check(*nccl, "local bootstrap");
    std::lock_guard lock(mutex);
    status |= result;
  });
  std::string id_file = "/tmp/lattice_nccl_check_id_" + std::to_string(getpid());
  LocalWorld file_world(devices);
  file_world.run([&](Communicator& rank) {
    auto nccl = nccl_communicator_from_file(id_file, rank.rank(), rank.size(), rank.rank());
    int result = check(*nccl, "file bootstrap");
    std::lock_guard lock(mutex);
    status |= result;
  });
  std::remove(id_file.c_str());
  if (status == 0) std::printf("nccl check ok: %d GPUs, local and file bootstrap\n", devices);
  return status;
}

}  // namespace
}  // namespace lattice::comm

int main() {
  try {
    return lattice::comm::run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 3;
  }
}
