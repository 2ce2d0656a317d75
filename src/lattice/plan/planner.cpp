// Layout planner (see planner.hpp).
#include "lattice/plan/planner.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>

#include "lattice/core/error.hpp"
#include "lattice/plan/memory_estimate.hpp"
#include "lattice/plan/simulator.hpp"

namespace lattice::plan {
namespace {

std::vector<int> divisors(int n) {
  std::vector<int> result;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) result.push_back(d);
  return result;
}

std::vector<int> powers_of_two_up_to(int limit) {
  std::vector<int> result;
  for (int v = 1; v <= limit; v *= 2) result.push_back(v);
  return result;
}

// The family a layout belongs to, for the one-line comparison with the obvious alternatives.
enum class Family { kZero3DataParallel, kNoTensorParallel, kNoPipeline, kOther };

struct Alternative {
  const char* label;
  Family family;
  std::optional<PlannedLayout> best;
  bool valid = false;  // some layout of the family is valid for this batch and device count
};

bool in_family(Family family, const ParallelLayout& l) {
  switch (family) {
    case Family::kZero3DataParallel:
      return l.tp == 1 && l.pp == 1 && l.cp == 1 && l.zero_stage == 3;
    case Family::kNoTensorParallel:
      return l.tp == 1;
    case Family::kNoPipeline:
      return l.pp == 1;
    case Family::kOther:
      return false;
  }
  return false;
}

std::string fmt(const char* format, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), format, value);
  return buffer;
}

}  // namespace

PlanResult plan_layouts(const PlanRequest& request) {
  const ModelSpec& model = request.model;
  const HardwareSpec& hw = request.hardware;
  validate(model);
  check(request.devices >= 1, "the device count must be at least 1");
  check(request.global_batch_size >= 1, "the global batch must be at least 1");
  const double capacity = hw.memory_bytes * request.usable_memory_fraction;

  std::vector<int> cp_options = {1};
  for (int cp = 2; cp <= 8 && model.seq_len / cp >= 4096; cp *= 2) cp_options.push_back(cp);
  const std::vector<int> ep_options =
      model.is_moe() ? divisors(static_cast<int>(model.n_experts)) : std::vector<int>{1};
  // With FlashAttention selective recompute saves nothing more: leave it out.
  const std::vector<Recompute> recomputes =
      request.flash_attention
          ? std::vector<Recompute>{Recompute::kNone, Recompute::kFull}
          : std::vector<Recompute>{Recompute::kNone, Recompute::kSelective, Recompute::kFull};

  PlanResult result;
  Alternative alternatives[] = {
      {"pure ZeRO-3 data parallelism", Family::kZero3DataParallel, {}},
      {"the best layout without tensor parallelism", Family::kNoTensorParallel, {}},
      {"the best layout without pipeline parallelism", Family::kNoPipeline, {}}};
  std::vector<PlannedLayout> fitting;
  double smallest_need = std::numeric_limits<double>::infinity();
  std::string last_error;
  for (int tp : powers_of_two_up_to(std::min(hw.devices_per_node, request.devices))) {
    // Any pp up to the layers: a layer count the stages do not divide splits unevenly
    // (pipeline::even_partition), as Llama 3 405B's 126 layers on 16 stages.
    for (int pp : divisors(request.devices)) {
      if (pp > model.n_layers) break;
      for (int cp : cp_options) {
        if (request.devices % (tp * pp * cp) != 0) continue;
        const int dp = request.devices / (tp * pp * cp);
        for (int ep : ep_options) {
          if ((dp * cp) % ep != 0) continue;
          for (int mb : powers_of_two_up_to(request.max_micro_batch_size)) {
            if (request.global_batch_size % (mb * dp) != 0) continue;
            const int microbatches = request.global_batch_size / (mb * dp);
            // Schedules: GPipe and 1F1B, ZB-H1, interleaved with 2 or 4 chunks where they divide.
            std::vector<std::pair<pipeline::ScheduleKind, int>> schedules = {
                {pipeline::ScheduleKind::kOneFOneB, 1}};
            if (pp > 1) {
              schedules.push_back({pipeline::ScheduleKind::kGPipe, 1});
              schedules.push_back({pipeline::ScheduleKind::kZeroBubbleH1, 1});
              if (model.n_layers >= 2 * pp)
                schedules.push_back({pipeline::ScheduleKind::kZeroBubbleV, 2});
              for (int v : {2, 4})
                if (model.n_layers >= pp * v && microbatches % pp == 0)
                  schedules.push_back({pipeline::ScheduleKind::kInterleaved, v});
            }
            for (auto [schedule, chunks] : schedules) {
              for (int zero = 0; zero <= 3; ++zero) {
                if (zero >= 2 && pp > 1)
                  continue;  // ZeRO-2/3 re-reduce per microbatch: not with PP
                if (zero > 0 && dp * cp == 1) continue;
                for (Recompute recompute : recomputes) {
                  ParallelLayout l;
                  l.dp = dp;
                  l.tp = tp;
                  l.pp = pp;
                  l.cp = cp;
                  l.ep = ep;
                  l.zero_stage = zero;
                  l.sequence_parallel = tp > 1;
                  l.recompute = recompute;
                  l.schedule = schedule;
                  l.virtual_stages = chunks;
                  l.micro_batch_size = mb;
                  l.global_batch_size = request.global_batch_size;
                  l.overlap_grad_reduce = true;
                  l.flash_attention = request.flash_attention;
                  ++result.considered;
                  try {
                    validate_layout(model, l, hw.devices_per_node);
                  } catch (const Error& e) {
                    last_error = e.what();
                    continue;
                  }
                  for (auto& alt : alternatives) alt.valid |= in_family(alt.family, l);
                  const double need = estimate_memory(model, l).peak().total();
                  smallest_need = std::min(smallest_need, need);
                  if (need > capacity) continue;
                  const SimulationResult sim = simulate(model, l, hw, request.cost);
                  PlannedLayout planned;
                  planned.layout = l;
                  planned.step_seconds = sim.step_seconds;
                  planned.mfu = sim.mfu;
                  planned.model_tflops_per_device = sim.model_tflops_per_device;
                  planned.tokens_per_second = sim.tokens_per_second;
                  planned.bubble_fraction = sim.bubble_fraction;
                  planned.exposed_comm_seconds = sim.exposed_comm_seconds;
                  planned.peak_memory_bytes = need;
                  fitting.push_back(planned);
                }
              }
            }
          }
        }
      }
    }
  }
  result.fitting = static_cast<int>(fitting.size());
  if (fitting.empty()) {
    if (!std::isfinite(smallest_need))
      throw Error("no valid layout of " + model.name + " on " + std::to_string(request.devices) +
                  " devices with global batch " + std::to_string(request.global_batch_size) +
                  (last_error.empty() ? "" : " (for example: " + last_error + ")") +
                  ": change the device count or the batch");
    throw Error("no layout of " + model.name + " fits on " + std::to_string(request.devices) + " " +
                hw.name + ": the smallest needs " + fmt("%.1f", smallest_need / 1e9) +
                " GB per device against " + fmt("%.1f", capacity / 1e9) +
                " GB usable; add devices");
  }
  std::stable_sort(fitting.begin(), fitting.end(),
                   [](const PlannedLayout& a, const PlannedLayout& b) {
                     // Equal to the microsecond: more memory headroom first.
                     const double a_us = std::round(a.step_seconds * 1e6);
                     const double b_us = std::round(b.step_seconds * 1e6);
                     if (a_us != b_us) return a_us < b_us;
                     return a.peak_memory_bytes < b.peak_memory_bytes;
                   });

  // One line on why the best beats the obvious alternatives.
  for (const PlannedLayout& p : fitting) {
    const ParallelLayout& l = p.layout;
    for (auto& alt : alternatives)
      if (in_family(alt.family, l) && !alt.best) alt.best = p;  // sorted: the first is the best
  }
  const PlannedLayout& best = fitting.front();
  std::string why =
      "best " + best.layout.describe() + " (" + fmt("%.1f%%", 100 * best.mfu) + " MFU)";
  for (const auto& alt : alternatives) {
    why += "; ";
    if (!alt.best) {
      why +=
          std::string(alt.label) + (alt.valid ? " does not fit in memory"
                                              : " is impossible with this batch and device count");
    } else if (alt.best->layout.describe() == best.layout.describe()) {
      why += "it is " + std::string(alt.label);
    } else if (alt.best->step_seconds <= best.step_seconds * (1 + 1e-9)) {
      why += "as fast as " + std::string(alt.label) + " (" + alt.best->layout.describe() + ")";
    } else {
      why += fmt("%.2fx", alt.best->step_seconds / best.step_seconds) + " faster than " + alt.label;
      const ParallelLayout& a = alt.best->layout;
      if (alt.best->bubble_fraction > best.bubble_fraction + 0.02)
        why += " (bubble " + fmt("%.0f%%", 100 * alt.best->bubble_fraction) + ")";
      else if (alt.best->exposed_comm_seconds > best.exposed_comm_seconds * 1.2)
        why += " (exposed communication " + fmt("%.2f s", alt.best->exposed_comm_seconds) + ")";
      else if (a.recompute != best.layout.recompute)
        why += " (needs recompute=" + recompute_name(a.recompute) + ")";
    }
  }
  result.rationale = why;
  const int keep = std::min<int>(request.top, static_cast<int>(fitting.size()));
  result.best.assign(fitting.begin(), fitting.begin() + keep);
  return result;
}

}  // namespace lattice::plan
