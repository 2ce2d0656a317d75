// PipelineRank: see pipeline_rank.hpp.
#include "lattice/train/pipeline_rank.hpp"

#include <algorithm>
#include <cstring>

#include "lattice/core/error.hpp"
#include "lattice/parallel/expert_parallel_state.hpp"
#include "lattice/parallel/pipeline/schedule_file.hpp"
#include "lattice/parallel/tensor_parallel_state.hpp"

namespace lattice::train {

namespace {

constexpr int kWholeStateTag = (1 << 30) + (1 << 28);  // apart from the executor's tags

}  // namespace

pipeline::Schedule pipeline_schedule_of(const TrainConfig& config) {
  const int p = static_cast<int>(config.parallelism.pp),
            v = static_cast<int>(config.parallelism.virtual_stages);
  const int m = static_cast<int>(config.training.gradient_accumulation_steps);
  if (config.parallelism.pipeline_schedule_file.empty())
    return pipeline::make_schedule(
        pipeline::parse_schedule_kind(config.parallelism.pipeline_schedule), p, m, v);
  pipeline::Schedule s = pipeline::load_schedule(config.parallelism.pipeline_schedule_file);
  const std::string file =
      "parallelism.pipeline_schedule_file " + config.parallelism.pipeline_schedule_file;
  check(s.num_ranks == p, file + " is for " + std::to_string(s.num_ranks) +
                              " pipeline ranks, the run has pp = " + std::to_string(p) +
                              ": set parallelism.pp = " + std::to_string(s.num_ranks));
  check(s.num_microbatches == m,
        file + " runs " + std::to_string(s.num_microbatches) + " microbatches, the step has " +
            std::to_string(m) +
            ": set training.gradient_accumulation_steps = " + std::to_string(s.num_microbatches));
  check(
      s.num_stages() == p * v,
      file + " has " + std::to_string(s.num_stages()) +
          " virtual stages, the run pp x virtual_stages = " + std::to_string(p * v) +
          ": set parallelism.virtual_stages = " + std::to_string(s.num_stages() / std::max(1, p)));
  return s;
}

pipeline::StagePartition pipeline_partition_of(const TrainConfig& config) {
  const int stages = static_cast<int>(config.parallelism.pp * config.parallelism.virtual_stages);
  const model::ModelConfig& m = config.model;
  if (!config.parallelism.pipeline_layers.empty())
    return pipeline::listed_partition(config.parallelism.pipeline_layers, m.n_layers);
  if (config.parallelism.pipeline_partition == "balanced") {
    // Costs in training FLOPs per token: a block's 6 x its parameters plus its attention's
    // 12 T d, the head's 6 x d x vocab (its GEMM; the final norm is negligible); the embedding is
    // a lookup, counted as free.
    const auto whole = model::Transformer::declared_only(m);
    const model::ParameterUnit& block = whole->units().at(1);
    const double block_cost = 6.0 * static_cast<double>(block.end - block.begin) +
                              12.0 * static_cast<double>(config.training.seq_len * m.d_model);
    const double head_cost = 6.0 * static_cast<double>(m.d_model * m.vocab_size);
    return pipeline::balanced_partition(m.n_layers, stages, block_cost, 0.0, head_cost);
  }
  return pipeline::even_partition(m.n_layers, stages);
}

PipelineRank::PipelineRank(const TrainConfig& config, mesh::Mesh& mesh, kernels::Ops& ops,
                           MemoryTracker* tracker, const model::TensorParallelGroup& tp,
                           const parallel::DataParallelSettings& settings,
                           const model::ExpertParallelGroup& ep)
    : config_(config), mesh_(mesh), ops_(ops), partition_(pipeline_partition_of(config)) {
  pipeline::Schedule schedule = pipeline_schedule_of(config);
  comm::Communicator& pp = mesh.group(mesh::Axis::pp);
  check(partition_.stages() == schedule.num_stages(),
        "the stage partition has " + std::to_string(partition_.stages()) +
            " stages, the schedule " + std::to_string(schedule.num_stages()) + " (internal error)");
  std::vector<pipeline::PipelineStage> stages;
  for (int s = 0; s < schedule.num_stages(); ++s) {
    if (schedule.stage_owner[static_cast<size_t>(s)] != pp.rank()) continue;
    const model::StageRange range{partition_.first[static_cast<size_t>(s)],
                                  partition_.first[static_cast<size_t>(s) + 1]};
    auto model =
        std::make_unique<model::Transformer>(config.model, tracker, range, tp, ep, ops.memory());
    model->set_activation_checkpointing(config.activation_checkpoint);
    model->initialize(config.training.seed);  // per-parameter streams: the one-rank model's values
    auto dp = std::make_unique<parallel::DataParallel>(ops, *model, mesh, settings,
                                                       config.optimizer.adamw, tracker);
    stages.push_back({model.get(), dp.get()});
    step_.data_parallel[s] = dp.get();
    stage_ids_.push_back(s);
    models_.push_back(std::move(model));
    dps_.push_back(std::move(dp));
  }
  check(!models_.empty(), "pipeline rank " + std::to_string(pp.rank()) +
                              " holds no stage of the schedule (its stage_owner lists no stage "
                              "for it): every pipeline rank needs one");
  if (config.training.precision == kernels::Precision::bf16)
    for (auto& model : models_) model->parameters().keep_bf16_copies(tracker);
  const int last = schedule.num_stages() - 1;
  model::Transformer* first_model = stage_ids_.front() == 0 ? models_.front().get() : nullptr;
  model::Transformer* last_model = stage_ids_.back() == last ? models_.back().get() : nullptr;
  tied_ = std::make_unique<pipeline::TiedEmbedding>(schedule, pp, first_model, last_model);
  if (tied_->active()) {
    // The tied gradients are summed after the backward, so their buckets reduce after it too.
    if (first_model) dps_.front()->hold_reduction(tied_->first_stage_unit());
    if (last_model) dps_.back()->hold_reduction(tied_->last_stage_unit());
    step_.tied = tied_.get();
  }
  executor_ = std::make_unique<pipeline::PipelineExecutor>(std::move(schedule), pp, stages);
  step_.executor = executor_.get();
  step_.pp = &pp;
}

PipelineRank::~PipelineRank() = default;

StepOutcome PipelineRank::step(const model::LayerContext& ctx, const StepShape& shape,
                               const MicroBatchSource& next_micro_batch, float lr, int64_t step) {
  return pipeline_training_step(step_, ctx, shape, next_micro_batch, lr, step);
}

double PipelineRank::evaluate(const model::LayerContext& ctx, const int32_t* tokens,
                              const int32_t* targets, int64_t B, int64_t T) {
  return executor_->evaluate(ctx, tokens, targets, B, T);
}

void PipelineRank::settle_parameters() {
  for (auto& dp : dps_) dp->settle_parameters(true);
}

std::vector<float> PipelineRank::gather_whole() {
  settle_parameters();
  comm::Communicator& batch = mesh_.dp_cp();
  comm::Communicator& tp = mesh_.group(mesh::Axis::tp);
  comm::Communicator& pp = mesh_.group(mesh::Axis::pp);
  const bool batch_root = batch.rank() == 0;
  const bool stage_root = batch_root && tp.rank() == 0;  // holds its stages' logical values
  // Expert parallelism: the ranks of the batch root's expert-data-parallel index gather the
  // tensor-parallel slices and every expert onto it.
  comm::Communicator& ep = mesh_.group(mesh::Axis::ep);
  const bool expert_gather = ep.size() > 1 && mesh_.expert_data_parallel_index() == 0;
  // Each stage's logical tensors (tp gathered) on its stage root.
  std::vector<std::vector<float>> logical(models_.size());
  for (size_t i = 0; i < models_.size(); ++i) {
    if (!batch_root && !expert_gather) continue;
    model::Transformer& model = *models_[i];
    const auto logical_model =
        model::Transformer::declared_only(config_.model, model.stage_range());
    const model::ParameterStore& local = model.parameters();
    const model::ParameterStore& whole = logical_model->parameters();
    std::vector<float>& out = logical[i];
    out.resize(stage_root ? static_cast<size_t>(whole.size()) : 0);
    if (expert_gather)
      parallel::gather_model_state(local, local.values(),
                                   model::Transformer::declared_only(
                                       config_.model, model.stage_range(), {},
                                       model::ExpertParallelGroup{nullptr, ep.rank(), ep.size()})
                                       ->parameters(),
                                   whole, stage_root ? out.data() : nullptr, tp, ep);
    else if (tp.size() == 1)
      out.assign(local.values(), local.values() + local.size());
    else
      parallel::gather_logical(local, local.values(), whole, stage_root ? out.data() : nullptr, tp);
  }
  if (!stage_root) return {};
  // The stage roots (one pipeline group) send their stages to pipeline rank 0, which lays them
  // out as the one-rank model.
  const pipeline::Schedule& schedule = executor_->schedule();
  if (pp.rank() != 0) {
    for (size_t i = 0; i < models_.size(); ++i)
      pp.send(logical[i].data(), static_cast<int64_t>(logical[i].size()), DType::f32, 0,
              kWholeStateTag + stage_ids_[i]);
    return {};
  }
  const auto whole = model::Transformer::declared_only(config_.model);
  const model::ParameterStore& target = whole->parameters();
  std::vector<float> values(static_cast<size_t>(target.size()), 0.0f);
  for (int s = 0; s < schedule.num_stages(); ++s) {
    const int owner = schedule.stage_owner[static_cast<size_t>(s)];
    const model::StageRange range{partition_.first[static_cast<size_t>(s)],
                                  partition_.first[static_cast<size_t>(s) + 1]};
    const auto stage_model = model::Transformer::declared_only(config_.model, range);
    const model::ParameterStore& stage = stage_model->parameters();
    const size_t mine = static_cast<size_t>(std::find(stage_ids_.begin(), stage_ids_.end(), s) -
                                            stage_ids_.begin());
    std::vector<float> received;
    const float* data = nullptr;
    if (owner == 0) {
      data = logical[mine].data();
    } else {
      received.resize(static_cast<size_t>(stage.size()));
      pp.recv(received.data(), stage.size(), DType::f32, owner, kWholeStateTag + s);
      data = received.data();
    }
    for (const model::ParameterInfo& p : stage.parameters()) {
      if (p.is_copy()) continue;  // the tied head's copy: the embedding is the parameter
      const model::ParameterInfo& to = target.info(target.index_of(p.name));
      std::memcpy(values.data() + to.offset, data + p.offset,
                  static_cast<size_t>(p.numel) * sizeof(float));
    }
  }
  return values;
}

TrainerState PipelineRank::load(const std::string& checkpoint_dir) {
  CheckpointReader reader(checkpoint_dir);  // one index for every stage of this rank
  TrainerState state;
  for (size_t i = 0; i < models_.size(); ++i) {
    optim::AdamWOptimizer full(ops_, models_[i]->parameters(), config_.optimizer.adamw, nullptr);
    state = load_checkpoint(reader, models_[i]->config(), models_[i]->parameters(), &full);
    dps_[i]->import_state(full);
  }
  return state;
}

}  // namespace lattice::train
