// Activation checkpointing: which saved activations a training step keeps and which it recomputes
// in backward. `none` keeps everything; `selective` recomputes the attention core (scores, softmax,
// their dropout; Korthikanti et al. 2023); `full` keeps only a block's input and reruns its
// forward, for every `interval`-th block (blocks 0, k, 2k, ... with interval k). The trainer reads
// it from [activation_checkpoint]; the planner (`lattice estimate memory --recompute`) describes
// the same setting with the same names.
#pragma once

#include <cstdint>
#include <string>

namespace lattice::model {

enum class Recompute { kNone, kSelective, kFull };

std::string recompute_name(Recompute recompute);  // "none", "selective", "full"
// Throws lattice::Error naming activation_checkpoint.mode and its choices.
Recompute parse_recompute(const std::string& name);

struct ActivationCheckpoint {
  Recompute mode = Recompute::kNone;
  int64_t interval = 1;  // full: every interval-th block is recomputed (1: all of them)

  // Whether block `layer` (0-based, counted over the whole model) is recomputed in full.
  bool recomputes_block(int64_t layer) const {
    return mode == Recompute::kFull && layer % interval == 0;
  }
  // Of the blocks [first, first + count), how many are recomputed in full.
  int64_t full_blocks_in(int64_t first, int64_t count) const;
  // Throws lattice::Error naming the [activation_checkpoint] key and the fix.
  void validate() const;
  // "none", "selective", "full", or "full every 2nd block".
  std::string describe() const;
};

}  // namespace lattice::model
