// NcclCommunicator: NCCL collectives on a private CUDA stream, completion polled through the
// watchdog (a hang aborts the NCCL communicator and reports), split with ncclCommSplit,
// point-to-point with ncclSend / ncclRecv (NCCL has no tags: messages between two ranks match in
// order).
#include "lattice/comm/backends/nccl.hpp"

#include "lattice/core/error.hpp"

#if LATTICE_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "lattice/comm/transport.hpp"
#endif

namespace lattice::comm {

#if LATTICE_HAVE_NCCL

namespace {

void check_cuda(cudaError_t code, const char* what) {
  if (code != cudaSuccess) {
    throw Error(std::string("comm (nccl) ") + what + ": " + cudaGetErrorString(code));
  }
}

void check_nccl(ncclResult_t code, const char* what) {
  if (code != ncclSuccess && code != ncclInProgress) {
    throw Error(std::string("comm (nccl) ") + what + ": " + ncclGetErrorString(code));
  }
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return ncclFloat32;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::u8:
      return ncclUint8;
  }
  return ncclFloat32;
}

// On one rank every reduction is a copy, and `avg` is sent as `sum`: NCCL before 2.29.7 leaves the
// last count % 32 elements of a one-rank avg unwritten when count / blocks is a whole number of
// 16-byte packs (NVIDIA/nccl#1950; our GPU check caught it on 2.28.9 with 131,075 fp32 elements).
ncclRedOp_t nccl_op(ReduceOp op, int ranks) {
  if (op == ReduceOp::avg && ranks == 1) return ncclSum;
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::avg:
      return ncclAvg;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
  }
  return ncclSum;
}

// Only this rank's own records are visible: NCCL ranks share no host memory.
class OwnRecordBoard : public StatusBoard {
 public:
  OwnRecordBoard(int size, int rank) : size_(size), rank_(rank) {}
  int size() const override { return size_; }
  void publish(int rank, const CollectiveRecord& record) override {
    if (rank == rank_) record_ = record;
  }
  std::optional<CollectiveRecord> last(int rank) const override {
    if (rank != rank_ || record_.seq == 0) return std::nullopt;
    return record_;
  }
  bool visible(int rank) const override { return rank == rank_; }
  std::string failure() const override { return {}; }

 private:
  int size_;
  int rank_;
  CollectiveRecord record_;
};

// The nccl backend runs NCCL's own collectives only (its buffers live on the GPU).
class RefusingTransport : public Transport {
 public:
  RefusingTransport(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void send(const void*, size_t, int) override { refuse(); }
  void recv(void*, size_t, int) override { refuse(); }
  void sendrecv(const void*, size_t, int, void*, size_t, int) override { refuse(); }

 private:
  [[noreturn]] static void refuse() {
    throw Error("the nccl backend runs NCCL's collectives only; use algorithm native or auto");
  }
  int rank_;
  int size_;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, int device, CommOptions options)
      : Communicator(rank, size, options, std::make_shared<OwnRecordBoard>(size, rank), "nccl"),
        comm_(comm),
        device_(device),
        transport_(rank, size) {
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaMalloc(&scratch_, 64), "cudaMalloc");
  }
  ~NcclCommunicator() override {
    stop_async();
    if (scratch_) cudaFree(scratch_);
    if (stream_) cudaStreamDestroy(stream_);
    if (comm_) ncclCommDestroy(comm_);
  }
  std::string_view backend() const override { return "nccl"; }

 protected:
  Transport& transport() override { return transport_; }
  bool has_native() const override { return true; }
  bool prefers_native() const override { return true; }

  void run_native(const CollectiveCall& call) override {
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    const CollectiveDescriptor& d = call.descriptor;
    const ncclDataType_t type = nccl_type(d.dtype);
    const size_t element = dtype_size(d.dtype);
    const auto count = static_cast<size_t>(d.count);
    const int n = size();
    switch (d.op) {
      case CollectiveOp::allreduce:
        check_nccl(
            ncclAllReduce(call.in, call.out, count, type, nccl_op(d.reduce_op, n), comm_, stream_),
            "ncclAllReduce");
        break;
      case CollectiveOp::reduce_scatter:
        check_nccl(ncclReduceScatter(call.in, call.out, count, type, nccl_op(d.reduce_op, n), comm_,
                                     stream_),
                   "ncclReduceScatter");
        break;
      case CollectiveOp::all_gather:
        check_nccl(ncclAllGather(call.in, call.out, count, type, comm_, stream_), "ncclAllGather");
        break;
      case CollectiveOp::all_gather_v: {
        check_nccl(ncclGroupStart(), "ncclGroupStart");
        size_t offset = 0;
        for (int r = 0; r < n; ++r) {
          auto block = static_cast<size_t>(call.counts[r]);
          check_nccl(ncclBroadcast(call.in, static_cast<char*>(call.out) + offset * element, block,
                                   type, r, comm_, stream_),
                     "ncclBroadcast");
          offset += block;
        }
        check_nccl(ncclGroupEnd(), "ncclGroupEnd");
        break;
      }
      case CollectiveOp::all_to_all:
      case CollectiveOp::all_to_all_v: {
        check_nccl(ncclGroupStart(), "ncclGroupStart");
        size_t send_offset = 0, recv_offset = 0;
        for (int r = 0; r < n; ++r) {
          size_t send =
              d.op == CollectiveOp::all_to_all ? count : static_cast<size_t>(call.counts[r]);
          size_t recv =
              d.op == CollectiveOp::all_to_all ? count : static_cast<size_t>(call.recv_counts[r]);
          check_nccl(ncclSend(static_cast<const char*>(call.in) + send_offset * element, send, type,
                              r, comm_, stream_),
                     "ncclSend");
          check_nccl(ncclRecv(static_cast<char*>(call.out) + recv_offset * element, recv, type, r,
                              comm_, stream_),
                     "ncclRecv");
          send_offset += send;
          recv_offset += recv;
        }
        check_nccl(ncclGroupEnd(), "ncclGroupEnd");
        break;
      }
      case CollectiveOp::broadcast:
        check_nccl(ncclBroadcast(call.out, call.out, count, type, d.root, comm_, stream_),
                   "ncclBroadcast");
        break;
      case CollectiveOp::reduce:
        check_nccl(ncclReduce(call.in, call.out, count, type, nccl_op(d.reduce_op, n), d.root,
                              comm_, stream_),
                   "ncclReduce");
        break;
      case CollectiveOp::barrier:
      case CollectiveOp::split:
        check_nccl(ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_),
                   "ncclAllReduce (barrier)");
        break;
    }
    synchronize();
  }

  std::unique_ptr<Communicator> make_split(std::span<const int> members, int new_rank,
                                           int color) override {
    ncclComm_t child = nullptr;
    check_nccl(
        ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, new_rank, &child, nullptr),
        "ncclCommSplit");
    if (!child) return nullptr;
    return std::make_unique<NcclCommunicator>(child, new_rank, static_cast<int>(members.size()),
                                              device_, options());
  }

  void point_send(const void* data, size_t bytes, int peer, int) override {
    check_nccl(ncclSend(data, bytes, ncclUint8, peer, comm_, stream_), "ncclSend");
    synchronize();
  }
  void point_recv(void* data, size_t bytes, int peer, int) override {
    check_nccl(ncclRecv(data, bytes, ncclUint8, peer, comm_, stream_), "ncclRecv");
    synchronize();
  }
  // NCCL point-to-point completes only when both sides are posted; the handle forms run on the same
  // stream and complete at wait().
  CommHandle point_isend(const void* data, size_t bytes, int peer, int tag) override {
    check_nccl(ncclSend(data, bytes, ncclUint8, peer, comm_, stream_), "ncclSend");
    return stream_handle();
  }
  CommHandle point_irecv(void* data, size_t bytes, int peer, int tag) override {
    check_nccl(ncclRecv(data, bytes, ncclUint8, peer, comm_, stream_), "ncclRecv");
    return stream_handle();
  }

 private:
  class StreamHandle : public CommHandle::State {
   public:
    explicit StreamHandle(NcclCommunicator& owner) : owner_(owner) {}
    void wait() override { owner_.synchronize(); }
    bool test() override { return cudaStreamQuery(owner_.stream_) == cudaSuccess; }

   private:
    NcclCommunicator& owner_;
  };
  CommHandle stream_handle() { return CommHandle(std::make_shared<StreamHandle>(*this)); }

  // Polls the stream through the watchdog; on a hang the NCCL communicator is aborted.
  void synchronize() {
    try {
      watchdog().wait([&] {
        cudaError_t state = cudaStreamQuery(stream_);
        if (state == cudaErrorNotReady) return false;
        check_cuda(state, "cudaStreamQuery");
        ncclResult_t async_error = ncclSuccess;
        check_nccl(ncclCommGetAsyncError(comm_, &async_error), "ncclCommGetAsyncError");
        check_nccl(async_error, "asynchronous NCCL error");
        return true;
      });
    } catch (...) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
      throw;
    }
  }

  ncclComm_t comm_ = nullptr;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
  RefusingTransport transport_;
};

std::unique_ptr<Communicator> join(const ncclUniqueId& id, int rank, int size, int device,
                                   CommOptions options) {
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  ncclComm_t comm = nullptr;
  check_nccl(ncclCommInitRank(&comm, size, id, rank), "ncclCommInitRank");
  return std::make_unique<NcclCommunicator>(comm, rank, size, device, options);
}

}  // namespace

bool nccl_backend_available() {
  return true;
}

std::unique_ptr<Communicator> nccl_communicator(Communicator& bootstrap, int device,
                                                CommOptions options) {
  static_assert(sizeof(ncclUniqueId) % 4 == 0, "ncclUniqueId travels as int32 words");
  ncclUniqueId id{};
  if (bootstrap.rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  bootstrap.broadcast(&id, sizeof(id) / 4, DType::i32, 0);
  return join(id, bootstrap.rank(), bootstrap.size(), device, options);
}

std::unique_ptr<Communicator> nccl_communicator_from_file(const std::string& id_file, int rank,
                                                          int size, int device,
                                                          CommOptions options) {
  ncclUniqueId id{};
  if (rank == 0) {
    check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    std::string temporary = id_file + ".tmp";
    {
      std::ofstream out(temporary, std::ios::binary);
      out.write(reinterpret_cast<const char*>(&id), sizeof(id));
      if (!out) throw Error("comm (nccl): cannot write the unique id to " + temporary);
    }
    std::filesystem::rename(temporary, id_file);
  } else {
    auto deadline = std::chrono::steady_clock::now() + options.timeout;
    for (;;) {
      std::ifstream in(id_file, std::ios::binary);
      if (in.read(reinterpret_cast<char*>(&id), sizeof(id))) break;
      if (std::chrono::steady_clock::now() > deadline) {
        throw Error("comm (nccl): rank " + std::to_string(rank) + " found no unique id in " +
                    id_file + " within the timeout; is rank 0 running with the same file?");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  return join(id, rank, size, device, options);
}

#else

bool nccl_backend_available() {
  return false;
}

std::unique_ptr<Communicator> nccl_communicator(Communicator&, int, CommOptions) {
  throw Error("this build of Lattice has no NCCL backend; build with the CUDA toolkit and NCCL");
}

std::unique_ptr<Communicator> nccl_communicator_from_file(const std::string&, int, int, int,
                                                          CommOptions) {
  throw Error("this build of Lattice has no NCCL backend; build with the CUDA toolkit and NCCL");
}

#endif

}  // namespace lattice::comm
