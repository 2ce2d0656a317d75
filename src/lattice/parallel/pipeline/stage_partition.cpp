// Pipeline stage partitions: see stage_partition.hpp.
#include "lattice/parallel/pipeline/stage_partition.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "lattice/core/error.hpp"

namespace lattice::pipeline {

namespace {

void check_stages(int64_t n_layers, int stages) {
  check(stages >= 1, "a pipeline needs at least one stage, got " + std::to_string(stages));
  check(n_layers >= stages, "parallelism.pp: " + std::to_string(stages) +
                                " pipeline stages need at least one block each, but the model "
                                "has " +
                                std::to_string(n_layers) + " layers: lower pp (or the chunks)");
}

StagePartition from_counts(const std::vector<int64_t>& counts) {
  StagePartition p;
  p.first.push_back(0);
  for (int64_t c : counts) p.first.push_back(p.first.back() + c);
  return p;
}

}  // namespace

StagePartition even_partition(int64_t n_layers, int stages) {
  check_stages(n_layers, stages);
  std::vector<int64_t> counts(static_cast<size_t>(stages), n_layers / stages);
  // The remainder to the stages nearest the middle: order the stages by their distance from it.
  std::vector<int> order(static_cast<size_t>(stages));
  std::iota(order.begin(), order.end(), 0);
  const double middle = (stages - 1) / 2.0;
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return std::abs(a - middle) < std::abs(b - middle); });
  for (int64_t i = 0; i < n_layers % stages; ++i) ++counts[static_cast<size_t>(order[i])];
  return from_counts(counts);
}

StagePartition listed_partition(const std::vector<int64_t>& layers_per_stage, int64_t n_layers) {
  check(!layers_per_stage.empty(),
        "parallelism.pipeline_layers is empty: list the blocks of "
        "every pipeline stage");
  int64_t sum = 0;
  for (size_t s = 0; s < layers_per_stage.size(); ++s) {
    check(layers_per_stage[s] >= 1, "parallelism.pipeline_layers gives stage " + std::to_string(s) +
                                        " " + std::to_string(layers_per_stage[s]) +
                                        " blocks: every stage needs at least one");
    sum += layers_per_stage[s];
  }
  check(sum == n_layers, "parallelism.pipeline_layers sums to " + std::to_string(sum) +
                             " blocks but the model has " + std::to_string(n_layers) +
                             " layers: make the stages add up to model.n_layers");
  return from_counts(layers_per_stage);
}

StagePartition balanced_partition(int64_t n_layers, int stages, double block_cost,
                                  double embedding_cost, double head_cost) {
  check_stages(n_layers, stages);
  check(block_cost > 0 && embedding_cost >= 0 && head_cost >= 0,
        "stage costs must be positive (blocks) and non-negative (embedding, head)");
  // The cost of stage s holding `blocks` blocks.
  auto cost = [&](int s, int64_t blocks) {
    return static_cast<double>(blocks) * block_cost + (s == 0 ? embedding_cost : 0) +
           (s == stages - 1 ? head_cost : 0);
  };
  // Whether every stage fits under `limit`: fill stages front to back, each as full as it may be
  // while leaving at least one block for each stage after it.
  auto fill = [&](double limit, std::vector<int64_t>& counts) {
    counts.assign(static_cast<size_t>(stages), 0);
    int64_t left = n_layers;
    for (int s = 0; s < stages; ++s) {
      const int64_t reserve = stages - 1 - s;
      int64_t take = s == stages - 1 ? left : left - reserve;
      while (take > 1 && cost(s, take) > limit) --take;
      if (cost(s, take) > limit || (s == stages - 1 && take != left)) return false;
      counts[static_cast<size_t>(s)] = take;
      left -= take;
    }
    return left == 0;
  };
  // The smallest feasible limit is one of the stages' possible costs: search them.
  std::vector<double> limits;
  for (int s = 0; s < stages; ++s)
    for (int64_t b = 1; b <= n_layers - stages + 1; ++b) limits.push_back(cost(s, b));
  std::sort(limits.begin(), limits.end());
  limits.erase(std::unique(limits.begin(), limits.end()), limits.end());
  std::vector<int64_t> counts;
  size_t lo = 0, hi = limits.size() - 1;
  while (lo < hi) {  // the last limit always fits (every block on one stage fits under it)
    const size_t mid = (lo + hi) / 2;
    if (fill(limits[mid], counts))
      hi = mid;
    else
      lo = mid + 1;
  }
  check(fill(limits[lo], counts), "no balanced pipeline partition found (internal error)");
  return from_counts(counts);
}

}  // namespace lattice::pipeline
