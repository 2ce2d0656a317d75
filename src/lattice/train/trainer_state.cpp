// The trainer's whole-model state (Trainer, trainer.hpp): the parameters gathered into the
// one-rank model's layout for `lattice parity`, and the checkpoints — ZeRO's shards, the
// tensor-parallel slices and the experts of an expert-parallel run gathered onto one writer.
#include <cstdio>
#include <memory>
#include <utility>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/parallel/expert_parallel_state.hpp"
#include "lattice/parallel/tensor_parallel_state.hpp"
#include "lattice/train/checkpoint.hpp"
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
    WholeModelState state = pipeline_->gather_whole(false);
    return printing_ ? std::move(state.values) : std::vector<float>{};
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

void Trainer::save(int64_t step, const std::string& config_toml) {
  if (pipeline_) {
    // The stages' state gathered into the one-rank model's layout on world rank 0, which writes
    // it and tells every rank whether it could.
    const WholeModelState whole = pipeline_->gather_whole(true);
    const auto layout = model::Transformer::declared_only(config_.model);
    const TrainerState state{step, batches_->position(), config_.seed};
    const std::string dir = save_whole_checkpoint(
        config_.run_dir, config_.model, layout->parameters(), whole.values.data(),
        whole.exp_avg.data(), whole.exp_avg_sq.data(), pipeline_->optimizer_steps(), state,
        config_toml, config_.keep_latest, mesh_->world());
    if (printing_) std::printf("checkpoint %s\n", dir.c_str());
    return;
  }
  // Collective: gather what ZeRO shards over the batch group; the batch group's rank 0 of each tp
  // rank then holds its tensor-parallel slices, and those ranks (one tp group) gather them into
  // one whole, layout-independent checkpoint that tp rank 0 writes.
  dp_->settle_parameters(true);
  if (mesh_->size(mesh::Axis::ep) > 1) {
    save_expert_parallel(step, config_toml);
    return;
  }
  std::unique_ptr<optim::AdamWOptimizer> full;
  if (writer_)
    full = std::make_unique<optim::AdamWOptimizer>(*ops_, model_->parameters(), config_.adamw,
                                                   nullptr);
  dp_->export_state(full.get());
  if (!writer_) return;
  TrainerState state{step, batches_->position(), config_.seed};
  std::string dir = save_checkpoint(config_.run_dir, *model_, *full, state, config_toml,
                                    config_.keep_latest, mesh_->group(mesh::Axis::tp));
  if (printing_) std::printf("checkpoint %s\n", dir.c_str());
}

void Trainer::save_expert_parallel(int64_t step, const std::string& config_toml) {
  // ZeRO's shards are gathered first (collective over the shard and expert groups), so that each
  // rank of world rank 0's expert-data-parallel index holds its store's whole state: the dense
  // parameters' and its experts'. Those ranks then gather the tensor-parallel slices and the
  // experts into the one-rank model's layout on world rank 0, which writes; the other indices hold
  // copies of the same state.
  comm::Communicator& ep = mesh_->group(mesh::Axis::ep);
  comm::Communicator& tp = mesh_->group(mesh::Axis::tp);
  const bool gathers = mesh_->expert_data_parallel_index() == 0;
  std::unique_ptr<optim::AdamWOptimizer> mine;
  if (gathers)  // world rank 0 among them
    mine = std::make_unique<optim::AdamWOptimizer>(*ops_, model_->parameters(), config_.adamw,
                                                   nullptr);
  dp_->export_state(mine.get());
  if (!gathers) return;
  const auto whole = model::Transformer::declared_only(config_.model);
  const auto tp_logical = model::Transformer::declared_only(
      config_.model, {}, {}, model::ExpertParallelGroup{nullptr, ep.rank(), ep.size()});
  const int64_t n = printing_ ? whole->parameters().size() : 0;
  std::vector<float> values(static_cast<size_t>(n)), exp_avg(values.size()),
      exp_avg_sq(values.size());
  const model::ParameterStore& local = model_->parameters();
  for (auto [source, target] :
       {std::pair{local.values(), values.data()},
        std::pair<const float*, float*>{mine->exp_avg(), exp_avg.data()},
        std::pair<const float*, float*>{mine->exp_avg_sq(), exp_avg_sq.data()}})
    parallel::gather_model_state(local, source, tp_logical->parameters(), whole->parameters(),
                                 target, tp, ep);
  if (tp.rank() != 0) return;  // the writer's ep group (tp rank 0) waits for the files below
  const TrainerState state{step, batches_->position(), config_.seed};
  const std::string dir = save_whole_checkpoint(
      config_.run_dir, config_.model, whole->parameters(), values.data(), exp_avg.data(),
      exp_avg_sq.data(), mine->steps_taken(), state, config_toml, config_.keep_latest, ep);
  if (printing_) std::printf("checkpoint %s\n", dir.c_str());
}

}  // namespace lattice::train
