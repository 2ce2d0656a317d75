// Activation checkpointing settings: names, checks, counts (see activation_checkpoint.hpp).
#include "lattice/model/activation_checkpoint.hpp"

#include "lattice/core/error.hpp"

namespace lattice::model {

std::string recompute_name(Recompute recompute) {
  switch (recompute) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}

Recompute parse_recompute(const std::string& name) {
  if (name == "none") return Recompute::kNone;
  if (name == "selective") return Recompute::kSelective;
  if (name == "full") return Recompute::kFull;
  throw Error("recompute mode '" + name +
              "' is unknown (activation_checkpoint.mode, --recompute): use \"none\", \"selective\" "
              "(the attention core) or \"full\" (whole blocks)");
}

int64_t ActivationCheckpoint::full_blocks_in(int64_t first, int64_t count) const {
  if (mode != Recompute::kFull || count <= 0) return 0;
  // Multiples of `interval` in [first, first + count).
  auto multiples_below = [this](int64_t n) { return (n + interval - 1) / interval; };
  return multiples_below(first + count) - multiples_below(first);
}

void ActivationCheckpoint::validate() const {
  check(interval >= 1, "activation_checkpoint.interval = " + std::to_string(interval) +
                           " is not a block interval: use 1 (every block) or more");
  check(interval == 1 || mode == Recompute::kFull,
        "activation_checkpoint.interval = " + std::to_string(interval) +
            " applies to mode = " + "\"full\" only, and mode is \"" + recompute_name(mode) +
            "\": set activation_checkpoint.mode = \"full\" or the interval to 1");
}

std::string ActivationCheckpoint::describe() const {
  if (mode != Recompute::kFull || interval == 1) return recompute_name(mode);
  const int64_t k = interval;
  const char* suffix = (k % 100 >= 11 && k % 100 <= 13) ? "th"
                       : k % 10 == 1                    ? "st"
                       : k % 10 == 2                    ? "nd"
                       : k % 10 == 3                    ? "rd"
                                                        : "th";
  return "full every " + std::to_string(k) + suffix + " block";
}

}  // namespace lattice::model
