// MpiCommunicator: native collectives (blocking MPI calls after a polled agreement check), split
// via MPI_Comm_split, tagged messages with MPI_Isend / MPI_Irecv.
#if LATTICE_HAVE_MPI
#include "lattice/comm/backends/mpi_communicator.hpp"

#include <climits>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "lattice/comm/reduce_kernels.hpp"
#include "lattice/core/error.hpp"

namespace lattice::comm {
namespace {

MPI_Comm duplicate(MPI_Comm comm) {
  MPI_Comm copy = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(comm, &copy), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(copy, MPI_ERRORS_RETURN);
  return copy;
}

int rank_of(MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  return rank;
}
int size_of(MPI_Comm comm) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  return size;
}

int as_int(int64_t value, const char* what) {
  if (value > INT_MAX) {
    throw Error(std::string("comm (mpi) ") + what + ": " + std::to_string(value) +
                " elements exceed MPI's int count; split the collective");
  }
  return static_cast<int>(value);
}

// A hash of the fields ranks must agree on (see CollectiveDescriptor::agrees_with).
int64_t agreement_key(const CollectiveDescriptor& d) {
  bool counted = d.op != CollectiveOp::barrier && d.op != CollectiveOp::split &&
                 d.op != CollectiveOp::all_gather_v && d.op != CollectiveOp::all_to_all_v;
  bool reduced = d.op == CollectiveOp::allreduce || d.op == CollectiveOp::reduce_scatter ||
                 d.op == CollectiveOp::reduce;
  bool rooted = d.op == CollectiveOp::broadcast || d.op == CollectiveOp::reduce;
  uint64_t key = 1469598103934665603ull;
  auto mix = [&](uint64_t v) { key = (key ^ v) * 1099511628211ull; };
  mix(static_cast<uint64_t>(d.op));
  mix(d.op == CollectiveOp::barrier || d.op == CollectiveOp::split
          ? 0
          : static_cast<uint64_t>(d.dtype));
  mix(counted ? static_cast<uint64_t>(d.count) : 0);
  mix(reduced ? static_cast<uint64_t>(d.reduce_op) : 0);
  mix(rooted ? static_cast<uint64_t>(d.root) : 0);
  return static_cast<int64_t>(key >> 1);
}

// Non-blocking MPI requests of a user send or receive behind a CommHandle.
class MpiRequestHandle : public CommHandle::State {
 public:
  MpiRequestHandle(MPI_Request request, Watchdog& watchdog, std::string what)
      : request_(request), watchdog_(watchdog), what_(std::move(what)) {}
  void wait() override {
    if (request_ != MPI_REQUEST_NULL) wait_mpi(&request_, watchdog_, what_.c_str());
  }
  bool test() override {
    if (request_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    check_mpi(MPI_Test(&request_, &done, MPI_STATUS_IGNORE), "MPI_Test");
    return done != 0;
  }

 private:
  MPI_Request request_;
  Watchdog& watchdog_;
  std::string what_;
};

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, CommOptions options, bool thread_multiple)
    : MpiCommunicator(comm, options, thread_multiple, std::make_shared<MpiStatusBoard>(comm)) {}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, CommOptions options, bool thread_multiple,
                                 std::shared_ptr<MpiStatusBoard> board)
    : Communicator(rank_of(comm), size_of(comm), options, board, "mpi"),
      comm_(duplicate(comm)),
      algorithm_comm_(duplicate(comm)),
      user_comm_(duplicate(comm)),
      thread_multiple_(thread_multiple),
      board_(board),
      transport_(std::make_unique<MpiTransport>(algorithm_comm_, watchdog())) {
  set_node_layout(board_->node(), board_->local_rank(), board_->node_count());
}

MpiCommunicator::~MpiCommunicator() {
  stop_async();
  int finalized = 0;
  MPI_Finalized(&finalized);
  // Freeing is collective: while an error unwinds, peers may never join, so leave it to exit.
  if (finalized || std::uncaught_exceptions() > 0) return;
  for (MPI_Comm* comm : {&comm_, &algorithm_comm_, &user_comm_}) {
    if (*comm != MPI_COMM_NULL) MPI_Comm_free(comm);
  }
}

void MpiCommunicator::verify_agreement(const CollectiveDescriptor& descriptor) {
  int64_t key = agreement_key(descriptor);
  int64_t bounds[2] = {key, -key};  // max of both = (max key, -min key)
  MPI_Request request;
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, bounds, 2, MPI_INT64_T, MPI_MAX, comm_, &request),
            "MPI_Iallreduce");
  wait_mpi(&request, watchdog());
  if (bounds[0] == -bounds[1]) return;
  // Someone disagrees: gather every descriptor and name the first rank that differs from this one.
  std::vector<CollectiveDescriptor> all(static_cast<size_t>(size()));
  check_mpi(MPI_Allgather(&descriptor, sizeof(CollectiveDescriptor), MPI_BYTE, all.data(),
                          sizeof(CollectiveDescriptor), MPI_BYTE, comm_),
            "MPI_Allgather");
  for (int r = 0; r < size(); ++r) {
    if (!all[static_cast<size_t>(r)].agrees_with(descriptor)) {
      throw Error("comm (mpi) collective mismatch at #" + std::to_string(watchdog().current().seq) +
                  ": rank " + std::to_string(rank()) + " entered " + descriptor.describe() +
                  " but rank " + std::to_string(r) + " entered " +
                  all[static_cast<size_t>(r)].describe() +
                  "; every rank must call the same collectives in the same order with the same "
                  "count, type and reduction");
    }
  }
  // This rank agrees with everyone it sees; the mismatch is between others.
  throw Error("comm (mpi) collective mismatch at #" + std::to_string(watchdog().current().seq) +
              " among other ranks while rank " + std::to_string(rank()) + " entered " +
              descriptor.describe());
}

void MpiCommunicator::before_collective(const CollectiveCall& call) {
  if (options().verify_collectives && size() > 1) verify_agreement(call.descriptor);
}

void MpiCommunicator::run_native(const CollectiveCall& call) {
  const CollectiveDescriptor& d = call.descriptor;
  const MPI_Datatype type = mpi_datatype(d.dtype);
  const MPI_Op op = reduction_ops_.get(d.dtype, d.reduce_op);
  const int count = as_int(d.count, "count");
  const int n = size();
  switch (d.op) {
    case CollectiveOp::allreduce:
      check_mpi(MPI_Allreduce(call.in == call.out ? MPI_IN_PLACE : call.in, call.out, count, type,
                              op, comm_),
                "MPI_Allreduce");
      if (d.reduce_op == ReduceOp::avg) divide_in_place(call.out, d.count, d.dtype, n);
      return;
    case CollectiveOp::reduce_scatter:
      check_mpi(MPI_Reduce_scatter_block(call.in, call.out, count, type, op, comm_),
                "MPI_Reduce_scatter_block");
      if (d.reduce_op == ReduceOp::avg) divide_in_place(call.out, d.count, d.dtype, n);
      return;
    case CollectiveOp::all_gather: {
      // Input already at its place in the output (the usual in-place form): MPI wants MPI_IN_PLACE.
      const void* own_block =
          static_cast<const char*>(call.out) +
          static_cast<size_t>(rank()) * static_cast<size_t>(d.count) * dtype_size(d.dtype);
      check_mpi(MPI_Allgather(call.in == own_block ? MPI_IN_PLACE : call.in, count, type, call.out,
                              count, type, comm_),
                "MPI_Allgather");
      return;
    }
    case CollectiveOp::all_gather_v: {
      std::vector<int> counts(static_cast<size_t>(n)), displacements(static_cast<size_t>(n));
      int64_t position = 0;
      for (int r = 0; r < n; ++r) {
        counts[r] = as_int(call.counts[r], "all_gather_v count");
        displacements[r] = as_int(position, "all_gather_v displacement");
        position += call.counts[r];
      }
      check_mpi(MPI_Allgatherv(call.in, count, type, call.out, counts.data(), displacements.data(),
                               type, comm_),
                "MPI_Allgatherv");
      return;
    }
    case CollectiveOp::all_to_all:
      check_mpi(MPI_Alltoall(call.in, count, type, call.out, count, type, comm_), "MPI_Alltoall");
      return;
    case CollectiveOp::all_to_all_v: {
      std::vector<int> send(static_cast<size_t>(n)), send_at(send), recv(send), recv_at(send);
      int64_t send_position = 0, recv_position = 0;
      for (int r = 0; r < n; ++r) {
        send[r] = as_int(call.counts[r], "all_to_all_v count");
        recv[r] = as_int(call.recv_counts[r], "all_to_all_v count");
        send_at[r] = as_int(send_position, "all_to_all_v displacement");
        recv_at[r] = as_int(recv_position, "all_to_all_v displacement");
        send_position += call.counts[r];
        recv_position += call.recv_counts[r];
      }
      check_mpi(MPI_Alltoallv(call.in, send.data(), send_at.data(), type, call.out, recv.data(),
                              recv_at.data(), type, comm_),
                "MPI_Alltoallv");
      return;
    }
    case CollectiveOp::broadcast:
      check_mpi(MPI_Bcast(call.out, count, type, d.root, comm_), "MPI_Bcast");
      return;
    case CollectiveOp::reduce: {
      bool root = rank() == d.root;
      const void* in = root && call.in == call.out ? MPI_IN_PLACE : call.in;
      check_mpi(MPI_Reduce(in, root ? call.out : nullptr, count, type, op, d.root, comm_),
                "MPI_Reduce");
      if (root && d.reduce_op == ReduceOp::avg) divide_in_place(call.out, d.count, d.dtype, n);
      return;
    }
    case CollectiveOp::barrier:
    case CollectiveOp::split:
      check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
      return;
  }
}

std::unique_ptr<Communicator> MpiCommunicator::make_split(std::span<const int> members,
                                                          int new_rank, int color) {
  MPI_Comm child = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, new_rank, &child),
            "MPI_Comm_split");
  if (child == MPI_COMM_NULL) return nullptr;
  auto communicator = std::make_unique<MpiCommunicator>(child, options(), thread_multiple_);
  MPI_Comm_free(&child);
  return communicator;
}

void MpiCommunicator::point_send(const void* data, size_t bytes, int peer, int tag) {
  point_isend(data, bytes, peer, tag).wait();
}

void MpiCommunicator::point_recv(void* data, size_t bytes, int peer, int tag) {
  MPI_Request request;
  check_mpi(MPI_Irecv(data, as_int(static_cast<int64_t>(bytes), "recv"), MPI_BYTE, peer, tag,
                      user_comm_, &request),
            "MPI_Irecv");
  MPI_Status status;
  std::string what =
      "recv from rank " + std::to_string(peer) + " (tag " + std::to_string(tag) + ")";
  watchdog().wait(
      [&] {
        int done = 0;
        check_mpi(MPI_Test(&request, &done, &status), "recv");
        return done != 0;
      },
      what.c_str());
  int received = 0;
  MPI_Get_count(&status, MPI_BYTE, &received);
  if (static_cast<size_t>(received) != bytes) {
    throw Error("recv: rank " + std::to_string(rank()) + " expected " + std::to_string(bytes) +
                " bytes from rank " + std::to_string(peer) + " (tag " + std::to_string(tag) +
                ") but the message has " + std::to_string(received));
  }
}

CommHandle MpiCommunicator::point_isend(const void* data, size_t bytes, int peer, int tag) {
  MPI_Request request;
  check_mpi(MPI_Isend(data, as_int(static_cast<int64_t>(bytes), "send"), MPI_BYTE, peer, tag,
                      user_comm_, &request),
            "MPI_Isend");
  return CommHandle(std::make_shared<MpiRequestHandle>(
      request, watchdog(),
      "send to rank " + std::to_string(peer) + " (tag " + std::to_string(tag) + ")"));
}

CommHandle MpiCommunicator::point_irecv(void* data, size_t bytes, int peer, int tag) {
  MPI_Request request;
  check_mpi(MPI_Irecv(data, as_int(static_cast<int64_t>(bytes), "irecv"), MPI_BYTE, peer, tag,
                      user_comm_, &request),
            "MPI_Irecv");
  return CommHandle(std::make_shared<MpiRequestHandle>(
      request, watchdog(),
      "recv from rank " + std::to_string(peer) + " (tag " + std::to_string(tag) + ")"));
}

}  // namespace lattice::comm
#endif
