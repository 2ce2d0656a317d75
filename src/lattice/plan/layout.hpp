// The planner's view of a parallel layout: the one layout type and its validation live in
// lattice/parallel/parallel_layout.hpp (the trainer uses the same); this header names them in
// lattice::plan and checks a layout against a ModelSpec at its sequence length.
#pragma once

#include <string>

#include "lattice/model/activation_checkpoint.hpp"
#include "lattice/parallel/parallel_layout.hpp"
#include "lattice/plan/model_spec.hpp"

namespace lattice::plan {

using model::parse_recompute;
using model::Recompute;
using model::recompute_name;
using parallel::ParallelLayout;

// parallel::validate_layout at the model's planned sequence length.
inline void validate_layout(const ModelSpec& model, const ParallelLayout& layout,
                            int devices_per_node = 0) {
  parallel::validate_layout(model, model.seq_len, layout, devices_per_node);
}

}  // namespace lattice::plan
