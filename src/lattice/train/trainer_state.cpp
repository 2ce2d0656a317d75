// The trainer's whole-model state (Trainer, trainer.hpp): the parameters gathered into the
// one-rank model's layout for `lattice parity`, and the checkpoints, which every rank writes its
// part of (sharded_checkpoint.hpp).
#include <cstdio>
#include <memory>
#include <utility>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/parallel/expert_parallel_state.hpp"
#include "lattice/parallel/tensor_parallel_state.hpp"
#include "lattice/train/checkpoint.hpp"
#include "lattice/train/diloco_sync.hpp"
#include "lattice/train/sharded_checkpoint.hpp"
#include "lattice/train/trainer.hpp"

namespace lattice::train {

const model::ParameterStore& Trainer::full_parameters() {
  if (pipeline_) {
    pipeline_->settle_parameters();
    return pipeline_->model(0).parameters();
  }
  dp_->settle_parameters(true);
  return model_->parameters();
}

std::vector<float> Trainer::logical_parameters() {
  if (pipeline_) {
    std::vector<float> values = pipeline_->gather_whole();
    return printing_ ? values : std::vector<float>{};
  }
  const model::ParameterStore& mine = full_parameters();
  comm::Communicator& ep = mesh_->group(mesh::Axis::ep);
  if (ep.size() > 1) {  // collective over the tp and ep groups: gathered on world rank 0
    if (mesh_->expert_data_parallel_index() != 0) return {};
    comm::Communicator& tp = mesh_->group(mesh::Axis::tp);
    const auto whole = model::Transformer::declared_only(config_.model);
    const auto tp_logical = model::Transformer::declared_only(
        config_.model, {}, {}, model::ExpertParallelGroup{nullptr, ep.rank(), ep.size()});
    std::vector<float> out(printing_ ? static_cast<size_t>(whole->parameters().size()) : 0);
    parallel::gather_model_state(mine, mine.values(), tp_logical->parameters(), whole->parameters(),
                                 out.data(), tp, ep);
    return out;
  }
  if (!writer_) return {};
  comm::Communicator& tp = mesh_->group(mesh::Axis::tp);
  std::vector<float> out;
  if (tp.size() == 1) {
    out.assign(mine.values(), mine.values() + mine.size());
    return out;
  }
  const auto logical = model::Transformer::declared_only(config_.model, model_->stage_range());
  if (tp.rank() == 0) out.resize(static_cast<size_t>(logical->parameters().size()));
  parallel::gather_logical(mine, mine.values(), logical->parameters(),
                           tp.rank() == 0 ? out.data() : nullptr, tp);
  return printing_ ? out : std::vector<float>{};
}

void Trainer::save(int64_t step, const std::string& config_toml, bool final) {
  publish_checkpoint(true);  // one save at a time
  // Sharded: every rank writes what it owns of each of its stores (its ZeRO shards, its tensor-
  // parallel slices, its stages and experts); nothing is gathered.
  const int tp_rank = mesh_->group(mesh::Axis::tp).rank();
  std::vector<CheckpointSource> sources;
  auto add = [&](model::Transformer& model, parallel::DataParallel& dp) {
    dp.settle_parameters(true);  // ZeRO-3: every parameter whole on this rank until the next step
    CheckpointSource source;
    source.store = &model.parameters();
    source.values = model.parameters().values();
    source.ranges = dp.checkpoint_ranges();
    source.moments = [&dp](int64_t begin, int64_t end, float* m, float* v) {
      dp.read_moments(begin, end, m, v);
    };
    source.tp_rank = tp_rank;
    sources.push_back(std::move(source));
  };
  for (int i = 0; i < runner_->stage_count(); ++i) {
    add(runner_->stage(i), runner_->data_parallel(i));
    if (diloco_) sources.back().states = diloco_->checkpoint_states(i);
  }
  const mesh::MeshShape shape = config_.layout().mesh_shape();
  CheckpointContents contents;
  contents.run_dir = config_.job.run_dir;
  contents.config = config_.model;
  contents.state = TrainerState{step, batches_->position(), config_.training.seed,
                                diloco_ ? diloco_->checkpoint_quorum() : std::string()};
  contents.optimizer_steps = data_parallel().steps_taken();
  contents.config_toml = config_toml;
  contents.keep_latest = config_.checkpoint.keep_latest;
  contents.layout = "pp" + std::to_string(shape.pp) + " dp" + std::to_string(shape.dp) + " cp" +
                    std::to_string(shape.cp) + " tp" + std::to_string(shape.tp) + " ep" +
                    std::to_string(shape.ep) + " zero" + std::to_string(config_.parallelism.zero);
  if (faults_.kill_during_save.hits(mesh_->world().rank(), step))
    checkpoints_->kill_while_writing();
  background_save_ = config_.checkpoint.async && !final;
  checkpoints_->start(contents, sources, background_save_);
  if (!background_save_) publish_checkpoint(true);
}

void Trainer::publish_checkpoint(bool wait) {
  const std::string dir = checkpoints_->finish(wait);
  if (dir.empty() || !printing_) return;
  if (background_save_)
    std::printf("checkpoint %s (snapshot %.1f ms; files written in the background in %.1f ms)\n",
                dir.c_str(), checkpoints_->snapshot_seconds() * 1e3,
                checkpoints_->write_seconds() * 1e3);
  else
    std::printf("checkpoint %s\n", dir.c_str());
}

void Trainer::resume() {
  // An explicit checkpoint is the only candidate; the run's own are tried newest first.
  std::vector<std::string> candidates;
  if (!config_.checkpoint.resume_from.empty())
    candidates.push_back(resolve_checkpoint(config_.checkpoint.resume_from));
  else if (config_.checkpoint.resume && config_.checkpoint.enable)
    candidates = checkpoint_candidates(config_.job.run_dir);
  // Fine-tuning: without a checkpoint of its own the run starts from init_from's (step 0).
  if (candidates.empty() && !config_.checkpoint.init_from.empty())
    candidates.push_back(resolve_checkpoint(config_.checkpoint.init_from));
  comm::Communicator& world = mesh_->world();
  // Staging directories of saves a kill interrupted are never published: removed here.
  if (printing_) remove_unpublished_checkpoints(config_.job.run_dir);
  world.barrier();
  std::string newest_problem;  // what was wrong with the first candidate, on this rank
  for (size_t i = 0; i < candidates.size(); ++i) {
    const std::string& dir = candidates[i];
    // Every rank reads the logical tensors it needs and keeps its part (any layout wrote them).
    TrainerState state;
    std::string problem;
    try {
      if (pipeline_) {
        state = pipeline_->load(dir);
      } else {
        optim::AdamWOptimizer full(*ops_, model_->parameters(), config_.optimizer.adamw, nullptr);
        state = load_checkpoint(dir, *model_, &full);
        dp_->import_state(full);
      }
    } catch (const Error& e) {
      problem = e.what();
    }
    int32_t loaded = problem.empty() ? 1 : 0;
    world.allreduce(&loaded, 1, DType::i32, comm::ReduceOp::min);
    if (loaded == 0) {
      if (i == 0) newest_problem = problem;
      if (i + 1 == candidates.size()) {  // none loads: the newest one's problem is the one to fix
        check(newest_problem.empty(), newest_problem);
        throw Error("another rank could not read checkpoint " + candidates[0] +
                    " (its error names the problem)");
      }
      if (printing_)
        std::fprintf(stderr, "warning: checkpoint %s is damaged (%s); resuming from %s instead\n",
                     dir.c_str(),
                     problem.empty() ? "another rank could not read it" : problem.c_str(),
                     candidates[i + 1].c_str());
      continue;
    }
    // The seed orders the data: a run continues with its own (an imported step-0 checkpoint has
    // consumed none, so any seed starts from it).
    check(state.seed == config_.training.seed || state.step == 0,
          "checkpoint " + dir + " was trained with training.seed = " + std::to_string(state.seed) +
              ": resume with the same seed or use a new job.run_dir");
    start_step_ = state.step;
    resumed_from_ = dir;
    resumed_quorum_ = state.replica_quorum;
    batches_->set_position(state.samples_consumed);
    if (printing_)
      std::printf("resumed from %s at step %lld\n", dir.c_str(),
                  static_cast<long long>(start_step_));
    return;
  }
}

}  // namespace lattice::train
