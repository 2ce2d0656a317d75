// LocalGroup construction.
#include "lattice/comm/backends/local_group.hpp"

namespace lattice::comm {

LocalGroup::LocalGroup(int group_size, std::shared_ptr<FailureFlag> flag)
    : size(group_size),
      failure_flag(std::move(flag)),
      board(std::make_shared<InProcessStatusBoard>(group_size, failure_flag)),
      slots(static_cast<size_t>(group_size)),
      channels(static_cast<size_t>(group_size) * static_cast<size_t>(group_size)),
      mailboxes(static_cast<size_t>(group_size)) {}

}  // namespace lattice::comm
