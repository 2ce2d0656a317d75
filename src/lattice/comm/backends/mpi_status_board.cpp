// MpiStatusBoard: one slot per rank in a node-wide MPI_Win_allocate_shared window, written with a
// seqlock so peers read whole records; liveness from kill(pid, 0).
#if LATTICE_HAVE_MPI
#include "lattice/comm/backends/mpi_status_board.hpp"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <exception>
#include <map>
#include <new>
#include <string>

namespace lattice::comm {

MpiStatusBoard::MpiStatusBoard(MPI_Comm comm) {
  MPI_Comm_size(comm, &size_);
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node_comm_);
  MPI_Comm_rank(node_comm_, &local_rank_);
  int node_size = 0;
  MPI_Comm_size(node_comm_, &node_size);
  Slot* mine = nullptr;
  MPI_Win_allocate_shared(static_cast<MPI_Aint>(sizeof(Slot)), 1, MPI_INFO_NULL, node_comm_, &mine,
                          &window_);
  new (mine) Slot{};
  mine->pid.store(static_cast<int64_t>(getpid()));
  // Which communicator rank each node-local rank is, and each rank's node key (the communicator
  // rank of its node's first rank).
  std::vector<int> node_members(static_cast<size_t>(node_size));
  MPI_Allgather(&rank_, 1, MPI_INT, node_members.data(), 1, MPI_INT, node_comm_);
  int key = node_members[0];
  std::vector<int> keys(static_cast<size_t>(size_));
  MPI_Allgather(&key, 1, MPI_INT, keys.data(), 1, MPI_INT, comm);
  std::map<int, int> dense;
  for (int k : keys) dense.emplace(k, 0);
  int index = 0;
  for (auto& [k, d] : dense) d = index++;
  node_ = dense[key];
  node_count_ = static_cast<int>(dense.size());
  MPI_Barrier(node_comm_);  // every slot is constructed before anyone reads
  slots_.assign(static_cast<size_t>(size_), nullptr);
  for (int local = 0; local < node_size; ++local) {
    MPI_Aint bytes = 0;
    int unit = 0;
    Slot* slot = nullptr;
    MPI_Win_shared_query(window_, local, &bytes, &unit, &slot);
    slots_[static_cast<size_t>(node_members[static_cast<size_t>(local)])] = slot;
  }
}

MpiStatusBoard::~MpiStatusBoard() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // Freeing is collective: while an error unwinds, peers may never join, so leave it to exit.
  if (finalized || std::uncaught_exceptions() > 0) return;
  if (window_ != MPI_WIN_NULL) MPI_Win_free(&window_);
  if (node_comm_ != MPI_COMM_NULL) MPI_Comm_free(&node_comm_);
}

MpiStatusBoard::Slot* MpiStatusBoard::slot_of(int rank) const {
  if (rank < 0 || rank >= size_) return nullptr;
  return slots_[static_cast<size_t>(rank)];
}

void MpiStatusBoard::publish(int rank, const CollectiveRecord& record) {
  Slot* slot = slot_of(rank);
  if (slot) slot->record.store(record);
}

std::optional<CollectiveRecord> MpiStatusBoard::last(int rank) const {
  Slot* slot = slot_of(rank);
  if (!slot) return std::nullopt;
  return slot->record.load();
}

bool MpiStatusBoard::visible(int rank) const {
  return slot_of(rank) != nullptr;
}

std::string MpiStatusBoard::failure() const {
  for (int r = 0; r < size_; ++r) {
    Slot* slot = slot_of(r);
    if (!slot || r == rank_) continue;
    auto pid = static_cast<pid_t>(slot->pid.load(std::memory_order_relaxed));
    if (kill(pid, 0) != 0 && errno == ESRCH) {
      return "rank " + std::to_string(r) + " (pid " + std::to_string(pid) + ") has exited";
    }
    auto record = last(r);
    if (record && record->state == RecordState::failed) {
      return "rank " + std::to_string(r) + " failed in " + describe_record(*record);
    }
  }
  return {};
}

}  // namespace lattice::comm
#endif
