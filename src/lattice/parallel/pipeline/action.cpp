// Names and one-line descriptions of pipeline actions.
#include "lattice/parallel/pipeline/action.hpp"

namespace lattice::pipeline {

std::string action_kind_name(ActionKind kind) {
  switch (kind) {
    case ActionKind::kForward:
      return "F";
    case ActionKind::kBackward:
      return "B";
    case ActionKind::kBackwardWeight:
      return "W";
    case ActionKind::kSendForward:
      return "SEND_F";
    case ActionKind::kRecvForward:
      return "RECV_F";
    case ActionKind::kSendBackward:
      return "SEND_B";
    case ActionKind::kRecvBackward:
      return "RECV_B";
  }
  return "?";
}

std::string describe(const Action& action) {
  std::string text = action_kind_name(action.kind) + "(stage " + std::to_string(action.stage) +
                     ", mb " + std::to_string(action.microbatch);
  if (action.kind == ActionKind::kSendForward || action.kind == ActionKind::kSendBackward)
    text += " -> rank " + std::to_string(action.peer);
  if (action.kind == ActionKind::kRecvForward || action.kind == ActionKind::kRecvBackward)
    text += " <- rank " + std::to_string(action.peer);
  return text + ")";
}

}  // namespace lattice::pipeline
