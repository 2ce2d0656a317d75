// OuterOptimizer: DiLoCo's outer step (Douillard et al. 2023) on the parameters one rank holds.
// Every H inner steps the replica groups average their parameters θ̄ = mean_g θ_g; the
// pseudo-gradient is Δ = θ_anchor − θ̄ (the anchor: the parameters at the last outer step), and
// SGD with (Nesterov) momentum applies it to the anchor, as torch.optim.SGD(lr, momentum,
// nesterov, dampening 0) does to a parameter whose gradient is Δ:
//   m ← μ·m + Δ;   d = Δ + μ·m (Nesterov) or m;   θ ← θ_anchor − lr·d
// computed as θ ← θ̄ + (Δ − lr·d), the same value, which makes lr 1 without momentum the identity
// on θ̄ bit for bit (Δ − 1·Δ = 0 exactly): one group then trains exactly as without DiLoCo. The
// new θ becomes the next anchor. The anchor and the momentum are the outer state a checkpoint
// keeps.
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

class OuterOptimizer {
 public:
  // The outer state of `elements` parameters, anchored at `parameters`.
  OuterOptimizer(const float* parameters, int64_t elements, OuterSettings settings);

  int64_t elements() const { return static_cast<int64_t>(anchor_.size()); }
  int64_t steps_taken() const { return steps_; }
  const OuterSettings& settings() const { return settings_; }

  // `parameters`: θ̄, the groups' mean; replaced by the outer step's θ, which is the new anchor.
  void step(float* parameters);

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
