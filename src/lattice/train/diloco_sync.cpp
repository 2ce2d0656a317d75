// DilocoSync: see diloco_sync.hpp.
#include "lattice/train/diloco_sync.hpp"

#include <chrono>
#include <cstdio>
#include <set>
#include <sstream>

#include "lattice/core/error.hpp"
#include "lattice/train/checkpoint.hpp"
#include "lattice/train/checkpoint_reader.hpp"

namespace lattice::train {

namespace {

// FNV-1a over the text.
uint64_t fnv1a(const std::string& text) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return hash;
}

}  // namespace

uint64_t replica_fingerprint(const TrainConfig& config) {
  // The resolved config's sections that decide the arithmetic, less the keys a group sets for
  // itself (its kernel threads, its backend, its offload directory, its throughput baseline).
  static const std::set<std::string> shared = {"model",        "training",    "optimizer",
                                               "lr_scheduler", "parallelism", "context_parallel",
                                               "diloco"};
  std::istringstream lines(config.to_toml());
  std::string line, section, kept;
  while (std::getline(lines, line)) {
    if (!line.empty() && line[0] == '[') {  // [section] or [section.table]
      section = line.substr(1, line.find_first_of(".]") - 1);
      continue;
    }
    const auto own = [&line](const char* key) { return line.rfind(key, 0) == 0; };
    if (shared.count(section) && !own("threads") && !own("backend") && !own("offload_dir") &&
        !own("baseline_tokens_per_second"))
      kept += section + ": " + line + "\n";
  }
  kept += "groups=" + std::to_string(config.replica.groups);
  return fnv1a(kept);
}

DilocoSync::DilocoSync(const TrainConfig& config, StepRunner& runner, int world_rank)
    : config_(config), runner_(runner), groups_(static_cast<int>(config.replica.groups)) {
  const replica::OuterSettings settings{static_cast<float>(config.diloco.outer_lr),
                                        static_cast<float>(config.diloco.outer_momentum),
                                        config.diloco.nesterov};
  if (groups_ > 1) {
    const auto timeout =
        std::chrono::milliseconds(static_cast<int64_t>(config.replica.timeout_seconds * 1000));
    const std::string prefix =
        "/lattice/" + config.replica.job + "/diloco/rank" + std::to_string(world_rank) + "/";
    link_ = std::make_unique<replica::GlooLink>(config.replica.store, prefix,
                                                static_cast<int>(config.replica.group), groups_,
                                                config.replica.host, timeout);
    const uint64_t mine = replica_fingerprint(config);
    std::vector<uint64_t> all(static_cast<size_t>(groups_));
    link_->all_gather(&mine, all.data(), sizeof(mine));
    for (int g = 0; g < groups_; ++g)
      check(all[static_cast<size_t>(g)] == all[0],
            "replica group " + std::to_string(g) +
                " runs another model, layout, batch or optimizer than group 0: start every group "
                "with the same config (only [job], [replica], [checkpoint], [metrics], [data], "
                "training.threads and parallelism.backend / offload_dir may differ)");
  }
  settle_whole();
  for (int i = 0; i < runner_.stage_count(); ++i) {
    const model::ParameterStore& store = runner_.stage(i).parameters();
    std::vector<float>& host = host_values(store);
    outer_.push_back(
        std::make_unique<replica::OuterOptimizer>(host.data(), store.size(), settings));
  }
}

std::vector<float>& DilocoSync::host_values(const model::ParameterStore& store) {
  host_.resize(static_cast<size_t>(store.size()));
  store.memory().copy(host_.data(), store.values(), host_.size() * sizeof(float),
                      CopyKind::device_to_host);
  return host_;
}

DilocoSync::~DilocoSync() = default;

int64_t DilocoSync::outer_steps() const {
  return outer_.empty() ? 0 : outer_[0]->steps_taken();
}

void DilocoSync::settle_whole() {
  for (int i = 0; i < runner_.stage_count(); ++i) runner_.data_parallel(i).settle_parameters(true);
}

std::vector<std::pair<std::string, const float*>> DilocoSync::checkpoint_states(int stage) const {
  const replica::OuterOptimizer& outer = *outer_[static_cast<size_t>(stage)];
  return {{"diloco_anchor/", outer.anchor().data()}, {"diloco_momentum/", outer.momentum().data()}};
}

void DilocoSync::resume(const std::string& checkpoint_dir, int64_t step, bool printing) {
  CheckpointReader reader(checkpoint_dir);
  const int64_t outer_steps = step / config_.diloco.inner_steps;
  for (int i = 0; i < runner_.stage_count(); ++i) {
    const model::ParameterStore& store = runner_.stage(i).parameters();
    std::vector<float> anchor(static_cast<size_t>(store.size()), 0.0f), momentum(anchor.size());
    const bool has_anchor = read_parameter_state(reader, "diloco_anchor/", store, anchor.data());
    const bool has_momentum =
        read_parameter_state(reader, "diloco_momentum/", store, momentum.data());
    check(has_anchor == has_momentum, "checkpoint " + checkpoint_dir +
                                          " holds half of DiLoCo's outer state: it is damaged; "
                                          "resume from an earlier one (checkpoint.resume_from)");
    if (!has_anchor) {
      if (printing && i == 0)
        std::printf(
            "diloco: checkpoint %s has no outer state; the outer optimizer starts at the "
            "resumed parameters\n",
            checkpoint_dir.c_str());
      continue;  // anchored at the resumed parameters by the constructor
    }
    outer_[static_cast<size_t>(i)]->load(anchor.data(), momentum.data(), outer_steps);
  }
}

bool DilocoSync::after_step(int64_t step) {
  if (step % config_.diloco.inner_steps != 0) return false;
  settle_whole();
  for (int i = 0; i < runner_.stage_count(); ++i) {
    model::ParameterStore& store = runner_.stage(i).parameters();
    float* values = host_values(store).data();
    const int64_t n = store.size();
    if (link_) {  // θ̄: the groups' sum divided by M (one group: θ itself, untouched)
      link_->allreduce_sum(values, n);
      const float groups = static_cast<float>(groups_);
#pragma omp parallel for simd schedule(static)
      for (int64_t j = 0; j < n; ++j) values[j] /= groups;
    }
    outer_[static_cast<size_t>(i)]->step(values);
    store.memory().copy(store.mutable_values(), values, static_cast<size_t>(n) * sizeof(float),
                        CopyKind::host_to_device);
    runner_.data_parallel(i).take_whole_values();  // ZeRO-3: its shards of the new values
  }
  return true;
}

}  // namespace lattice::train
