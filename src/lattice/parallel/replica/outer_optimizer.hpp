// OuterOptimizer: DiLoCo's outer step (Douillard et al. 2023) on the parameters one rank holds.
// Every H inner steps the replica groups average their parameters θ̄ = mean_g θ_g; the
// pseudo-gradient is Δ = θ_anchor − θ̄ (the anchor: the parameters at the last outer step), and
// SGD with (Nesterov) momentum applies it to the anchor, as torch.optim.SGD(lr, momentum,
// nesterov, dampening 0) does to a parameter whose gradient is Δ:
//   m ← μ·m + Δ;   d = Δ + μ·m (Nesterov) or m;   θ ← θ_anchor − lr·d
// computed as θ ← θ̄ + (Δ − lr·d), the same value, which makes lr 1 without momentum the identity
// on θ̄ bit for bit (Δ − 1·Δ = 0 exactly): one group then trains exactly as without DiLoCo. The
// new θ becomes the next anchor. The anchor and the momentum are the outer state a checkpoint
// keeps. Streaming DiLoCo steps one fragment of the parameters at a time (element ranges of the
// rank's store, packed one after the other), and may bring the groups' mean Δ itself (decoded
// from a low-precision exchange) instead of θ̄: then θ ← θ_anchor − lr·d.
#pragma once

#include <cstdint>
#include <vector>

namespace lattice::replica {

struct OuterSettings {
  float lr = 0.7f;        // the paper's outer learning rate
  float momentum = 0.9f;  // and momentum, with Nesterov
  bool nesterov = true;
};

// Throws Error naming the key (diloco.outer_lr, diloco.outer_momentum) when a setting is invalid.
void validate(const OuterSettings& settings);

// Elements [begin, end) of the rank's parameters.
struct ElementRange {
  int64_t begin = 0, end = 0;
};

class OuterOptimizer {
 public:
  // The outer state of `elements` parameters, anchored at `parameters`.
  OuterOptimizer(const float* parameters, int64_t elements, OuterSettings settings);

  int64_t elements() const { return static_cast<int64_t>(anchor_.size()); }
  int64_t steps_taken() const { return steps_; }
  const OuterSettings& settings() const { return settings_; }

  // `parameters`: θ̄, the groups' mean; replaced by the outer step's θ, which is the new anchor.
  void step(float* parameters);
  // The same for the elements in `ranges` only: `packed` holds their θ̄ one range after another.
  void step(float* packed, const std::vector<ElementRange>& ranges);
  // The same from the groups' mean Δ (`packed`, replaced by θ).
  void step_delta(float* packed, const std::vector<ElementRange>& ranges);

  // The state (for checkpoints, and for a group that joins: it takes a live peer's).
  const std::vector<float>& anchor() const { return anchor_; }
  const std::vector<float>& momentum() const { return momentum_; }
  void load(const float* anchor, const float* momentum, int64_t steps_taken);

 private:
  OuterSettings settings_;
  std::vector<float> anchor_, momentum_;
  int64_t steps_ = 0;
};

}  // namespace lattice::replica
