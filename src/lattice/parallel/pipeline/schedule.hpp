// A pipeline schedule as data: for each pipeline rank the ordered list of actions it runs, plus the
// map from virtual stage to rank. Generators for GPipe, 1F1B, interleaved 1F1B and zero-bubble
// ZB-H1 and ZB-V.
#pragma once

#include <string>
#include <vector>

#include "lattice/parallel/pipeline/action.hpp"

namespace lattice::pipeline {

enum class ScheduleKind { kGPipe, kOneFOneB, kInterleaved, kZeroBubbleH1, kZeroBubbleV };

std::string schedule_kind_name(
    ScheduleKind kind);  // "gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"
ScheduleKind parse_schedule_kind(
    const std::string& name);  // throws lattice::Error on unknown names

struct Schedule {
  ScheduleKind kind = ScheduleKind::kOneFOneB;
  int num_ranks = 1;                    // p: pipeline ranks
  int num_microbatches = 1;             // m
  int chunks_per_rank = 1;              // v: virtual stages per rank (interleaving)
  bool splits_weight_gradient = false;  // true when W actions exist (zero-bubble)
  std::vector<int> stage_owner;  // rank of each virtual stage; size num_ranks * chunks_per_rank
  std::vector<std::vector<Action>> actions;  // per rank, in execution order

  int num_stages() const { return static_cast<int>(stage_owner.size()); }
};

// Builds the schedule; throws lattice::Error for impossible inputs (m < 1, p < 1, interleaving with
// m not a multiple of p or v < 2, ...). `chunks_per_rank` is used only by the interleaved schedule.
Schedule make_schedule(ScheduleKind kind, int num_ranks, int num_microbatches,
                       int chunks_per_rank = 1);

Schedule make_gpipe(int num_ranks, int num_microbatches);
Schedule make_one_f_one_b(int num_ranks, int num_microbatches);
Schedule make_interleaved(int num_ranks, int num_microbatches, int chunks_per_rank);
Schedule make_zero_bubble_h1(int num_ranks, int num_microbatches);
// Two chunks per rank in a V: rank r owns stages r and 2p - 1 - r.
Schedule make_zero_bubble_v(int num_ranks, int num_microbatches);

}  // namespace lattice::pipeline
