// MpiStatusBoard: the status board of an MPI communicator, kept in an MPI shared-memory window
// among the ranks of each node; a rank sees the records of the ranks on its node (others are "not
// visible") and notices a node-local peer whose process has exited.
#pragma once

#if LATTICE_HAVE_MPI
#include <mpi.h>

#include <atomic>
#include <vector>

#include "lattice/comm/published_record.hpp"
#include "lattice/comm/status_board.hpp"

namespace lattice::comm {

class MpiStatusBoard : public StatusBoard {
 public:
  // Collective over `comm`.
  explicit MpiStatusBoard(MPI_Comm comm);
  ~MpiStatusBoard() override;
  int size() const override { return size_; }
  void publish(int rank, const CollectiveRecord& record) override;
  std::optional<CollectiveRecord> last(int rank) const override;
  bool visible(int rank) const override;
  std::string failure() const override;

  // Node layout learned while building the board.
  int node() const { return node_; }
  int local_rank() const { return local_rank_; }
  int node_count() const { return node_count_; }

 private:
  struct Slot {
    std::atomic<int64_t> pid;
    PublishedRecord record;
  };
  Slot* slot_of(int rank) const;

  int size_ = 0;
  int rank_ = 0;
  MPI_Comm node_comm_ = MPI_COMM_NULL;
  MPI_Win window_ = MPI_WIN_NULL;
  std::vector<Slot*> slots_;  // by communicator rank; nullptr when on another node
  int node_ = 0;
  int local_rank_ = 0;
  int node_count_ = 1;
};

}  // namespace lattice::comm
#endif
