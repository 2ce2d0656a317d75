// Learning-rate schedules: linear warmup, then cosine, linear or constant decay to a floor.
#pragma once

#include <cstdint>
#include <string>

namespace lattice::optim {

enum class DecayKind { cosine, linear, constant };

DecayKind parse_decay(const std::string& name);
std::string decay_name(DecayKind kind);

struct LrSchedule {
  float peak_lr = 3e-4f;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  DecayKind decay = DecayKind::cosine;
  float min_lr_ratio = 0.1f;  // the floor is peak_lr · min_lr_ratio

  // Learning rate for 1-based step s: warmup rises linearly to peak over warmup_steps (s/warmup),
  // then decays from peak to the floor over the remaining steps.
  float at(int64_t step) const;
};

}  // namespace lattice::optim
