// The MoE step metrics: see moe_metrics.hpp.
#include "lattice/train/moe_metrics.hpp"

#include <algorithm>

#include "lattice/comm/communicator.hpp"
#include "lattice/core/error.hpp"

namespace lattice::train {

MoeStepMetrics reduce_moe_metrics(const std::vector<model::MoeLayerStatistics>& local,
                                  const model::ModelConfig& config, comm::Communicator& world,
                                  int replicas) {
  MoeStepMetrics step;
  const int64_t E = config.n_experts;
  // Per MoE layer: integers (tokens, copies, dropped, forwards, then the E counts) and the two
  // losses (f32: for display).
  constexpr int64_t kFixed = 4;
  const int64_t width = kFixed + E;
  std::vector<int64_t> layers;
  for (int64_t i = 0; i < config.n_layers; ++i)
    if (config.is_moe_layer(i)) layers.push_back(i);
  if (layers.empty()) return step;
  std::vector<int64_t> counts(layers.size() * static_cast<size_t>(width), 0);
  std::vector<float> losses(layers.size() * 2, 0.0f);
  for (const model::MoeLayerStatistics& s : local) {
    const auto at = std::find(layers.begin(), layers.end(), s.layer);
    check(at != layers.end() && static_cast<int64_t>(s.counts.size()) == E,
          "MoE statistics of layer " + std::to_string(s.layer) +
              " do not match the model's MoE layers (internal error)");
    const auto l = static_cast<size_t>(at - layers.begin());
    int64_t* row = counts.data() + l * static_cast<size_t>(width);
    row[0] = s.tokens;
    row[1] = s.copies;
    row[2] = s.dropped;
    row[3] = s.forwards;
    for (int64_t e = 0; e < E; ++e) row[kFixed + e] = s.counts[e];
    losses[2 * l] = static_cast<float>(s.aux_loss);
    losses[2 * l + 1] = static_cast<float>(s.z_loss);
  }
  world.allreduce(counts.data(), static_cast<int64_t>(counts.size()), DType::i64,
                  comm::ReduceOp::sum);
  world.allreduce(losses.data(), static_cast<int64_t>(losses.size()), DType::f32,
                  comm::ReduceOp::sum);
  const double n_layers = static_cast<double>(layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    const int64_t* row = counts.data() + l * static_cast<size_t>(width);
    MoeLayerMetrics m;
    m.layer = layers[l];
    const double copies = static_cast<double>(row[1] / replicas);
    int64_t peak = 0;
    for (int64_t e = 0; e < E; ++e) {
      m.tokens_per_expert.push_back(row[kFixed + e] / replicas);
      peak = std::max(peak, m.tokens_per_expert.back());
    }
    const double mean = copies / static_cast<double>(E);
    m.max_mean_load = mean > 0 ? static_cast<double>(peak) / mean : 0;
    m.dropped_fraction = copies > 0 ? static_cast<double>(row[2] / replicas) / copies : 0;
    const double forwards = row[3] > 0 ? static_cast<double>(row[3]) : 1;  // replicas cancel
    m.aux_loss = losses[2 * l] / forwards;
    m.z_loss = losses[2 * l + 1] / forwards;
    step.aux_loss += m.aux_loss / n_layers;
    step.z_loss += m.z_loss / n_layers;
    step.max_mean_load = std::max(step.max_mean_load, m.max_mean_load);
    step.dropped_fraction += m.dropped_fraction / n_layers;
    step.layers.push_back(std::move(m));
  }
  return step;
}

}  // namespace lattice::train
