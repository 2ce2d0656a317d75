// Learning-rate schedules: see lr_schedule.hpp.
#include "lattice/optim/lr_schedule.hpp"

#include <algorithm>
#include <cmath>

#include "lattice/core/error.hpp"

namespace lattice::optim {

DecayKind parse_decay(const std::string& name) {
  if (name == "cosine") return DecayKind::cosine;
  if (name == "linear") return DecayKind::linear;
  if (name == "constant") return DecayKind::constant;
  throw Error("unknown lr_scheduler.decay '" + name +
              "': use \"cosine\", \"linear\" or \"constant\"");
}

std::string decay_name(DecayKind kind) {
  switch (kind) {
    case DecayKind::cosine:
      return "cosine";
    case DecayKind::linear:
      return "linear";
    case DecayKind::constant:
      return "constant";
  }
  return "?";
}

float LrSchedule::at(int64_t step) const {
  if (warmup_steps > 0 && step <= warmup_steps)
    return peak_lr * static_cast<float>(step) / static_cast<float>(warmup_steps);
  if (decay == DecayKind::constant) return peak_lr;
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup_steps);
  const double progress = std::clamp(
      static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps), 0.0, 1.0);
  const double floor = static_cast<double>(peak_lr) * min_lr_ratio;
  double factor =
      decay == DecayKind::cosine ? 0.5 * (1.0 + std::cos(M_PI * progress)) : 1.0 - progress;
  return static_cast<float>(floor + (peak_lr - floor) * factor);
}

}  // namespace lattice::optim
