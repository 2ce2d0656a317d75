// One step of a pipeline schedule: compute (F, B, W) or point-to-point transfer (send/recv of
// forward activations or backward gradients) for one virtual stage and one microbatch. Schedules
// are lists of these.
#pragma once

#include <cstdint>
#include <string>

namespace lattice::pipeline {

enum class ActionKind : uint8_t {
  kForward,   // F: forward of one virtual stage for one microbatch
  kBackward,  // B: backward (input gradient; also the weight gradient when the schedule has no W)
  kBackwardWeight,  // W: weight gradient, split off B by zero-bubble schedules
  kSendForward,     // SEND_F: send stage `stage`'s output activations to `peer` (owner of stage+1)
  kRecvForward,  // RECV_F: receive stage `stage`'s input activations from `peer` (owner of stage-1)
  kSendBackward,  // SEND_B: send the gradient of stage `stage`'s input to `peer` (owner of stage-1)
  kRecvBackward,  // RECV_B: receive the gradient of stage `stage`'s output from `peer` (owner of
                  // stage+1)
};

struct Action {
  ActionKind kind = ActionKind::kForward;
  int stage = 0;  // virtual stage (global index 0..num_stages-1; a rank may own several: chunks)
  int microbatch = 0;  // 0..num_microbatches-1
  int peer = -1;       // the other rank of a send/recv; -1 for compute
  bool operator==(const Action&) const = default;
};

inline bool is_compute(ActionKind kind) {
  return kind == ActionKind::kForward || kind == ActionKind::kBackward ||
         kind == ActionKind::kBackwardWeight;
}

// Short names used in traces and messages: F, B, W, SEND_F, RECV_F, SEND_B, RECV_B.
std::string action_kind_name(ActionKind kind);
// "F(stage 3, mb 7)" or "SEND_F(stage 3, mb 7 -> rank 2)".
std::string describe(const Action& action);

}  // namespace lattice::pipeline
