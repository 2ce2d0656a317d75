// The sharded checkpoint writer: see sharded_checkpoint.hpp.
#include "lattice/train/sharded_checkpoint.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "lattice/comm/communicator.hpp"
#include "lattice/core/crc32c.hpp"
#include "lattice/core/error.hpp"
#include "lattice/io/atomic_file.hpp"
#include "lattice/io/safetensors.hpp"
#include "lattice/model/model_config_json.hpp"
#include "lattice/parallel/tensor_parallel_state.hpp"
#include "lattice/train/checkpoint_index.hpp"

namespace lattice::train {

namespace fs = std::filesystem;

namespace {

std::string rank_file(const char* kind, int rank, int ranks) {
  if (ranks == 1) return std::string(kind) + ".safetensors";
  char buffer[96];
  std::snprintf(buffer, sizeof buffer, "%s-rank-%05d-of-%05d.safetensors", kind, rank, ranks);
  return buffer;
}

std::string pieces_file(int rank) {
  char buffer[48];
  std::snprintf(buffer, sizeof buffer, "pieces-rank-%05d.json", rank);
  return buffer;
}

// Broadcasts `text` from `root`: its length, then its bytes in 32-bit words (the collectives
// move numeric types).
void broadcast_text(comm::Communicator& world, std::string& text, int root) {
  int64_t length = static_cast<int64_t>(text.size());
  world.broadcast(&length, 1, DType::i64, root);
  std::vector<int32_t> words(static_cast<size_t>((length + 3) / 4), 0);
  std::memcpy(words.data(), text.data(), text.size());
  if (!words.empty())
    world.broadcast(words.data(), static_cast<int64_t>(words.size()), DType::i32, root);
  text.assign(reinterpret_cast<const char*>(words.data()), static_cast<size_t>(length));
}

// True on every rank when `ok` is true on every rank.
bool all_ok(comm::Communicator& world, bool ok) {
  int32_t flag = ok ? 1 : 0;
  world.allreduce(&flag, 1, DType::i32, comm::ReduceOp::min);
  return flag == 1;
}

// One of a rank's two files: its entries, and for each the piece of the index it is (tensor,
// position), whose checksum the writer fills in (off the training thread when it writes in the
// background).
struct RankFile {
  std::string name;
  std::vector<SafetensorsEntry> entries;
  std::vector<std::pair<std::string, size_t>> pieces;
};

// What one rank writes: its weights and moments files over copies of their data (the snapshot),
// and the index entries for its pieces.
struct RankShard {
  RankFile weights, moments;
  std::vector<std::unique_ptr<float[]>> buffers;
  CheckpointIndex index;

  void fill_checksums() {
    for (const RankFile* file : {&weights, &moments})
      for (size_t k = 0; k < file->entries.size(); ++k) {
        const SafetensorsEntry& e = file->entries[k];
        const auto& [name, at] = file->pieces[k];
        index.at(name).pieces[at].crc32c = crc32c(e.data, e.nbytes);
      }
  }
};

// Adds `data`, elements [begin, end) of `p`'s slice, as the logical tensor `logical`'s piece in
// `file`.
void add_piece(CheckpointIndex& index, RankFile& file, const std::string& logical,
               const model::ParameterInfo& p, int64_t begin, int64_t end, const float* data) {
  const bool whole_slice = begin == 0 && end == p.numel;
  SafetensorsEntry e;
  e.name = whole_slice ? logical : logical + "#" + std::to_string(begin);
  e.dtype = DType::f32;
  e.shape = whole_slice ? p.shape : Shape{end - begin};
  e.data = data;
  e.nbytes = static_cast<size_t>(end - begin) * sizeof(float);
  CheckpointPiece piece;
  piece.file = file.name;
  piece.key = e.name;
  piece.shard = p.shard;
  piece.slice_shape = p.shape;
  piece.begin = begin;
  piece.end = end;
  auto [it, added] = index.try_emplace(logical, CheckpointTensor{p.global_shape, {}});
  it->second.pieces.push_back(std::move(piece));
  file.pieces.emplace_back(logical, it->second.pieces.size() - 1);
  file.entries.push_back(std::move(e));
}

RankShard collect(std::span<const CheckpointSource> sources, const std::string& weights_file,
                  const std::string& moments_file) {
  RankShard shard;
  shard.weights.name = weights_file;
  shard.moments.name = moments_file;
  for (const CheckpointSource& source : sources) {
    for (const model::ParameterInfo& p : source.store->parameters()) {
      if (p.is_copy()) continue;  // a tied head's copy: its original is written
      if (!parallel::is_tensor_parallel_slice(p) && source.tp_rank != 0) continue;
      for (auto [lo, hi] : source.ranges) {
        const int64_t a = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
        if (a >= e) continue;
        const int64_t begin = a - p.offset, end = e - p.offset;
        const auto n = static_cast<size_t>(e - a);
        auto w = std::make_unique_for_overwrite<float[]>(n),
             m = std::make_unique_for_overwrite<float[]>(n),
             v = std::make_unique_for_overwrite<float[]>(n);
        source.store->memory().copy(w.get(), source.values + a, n * sizeof(float),
                                    CopyKind::device_to_host);
        source.moments(a, e, m.get(), v.get());
        add_piece(shard.index, shard.weights, p.name, p, begin, end, w.get());
        add_piece(shard.index, shard.moments, "exp_avg/" + p.name, p, begin, end, m.get());
        add_piece(shard.index, shard.moments, "exp_avg_sq/" + p.name, p, begin, end, v.get());
        for (auto* buffer : {&w, &m, &v}) shard.buffers.push_back(std::move(*buffer));
        for (const auto& [prefix, data] : source.states) {
          auto s = std::make_unique_for_overwrite<float[]>(n);
          std::copy_n(data + a, n, s.get());
          add_piece(shard.index, shard.moments, prefix + p.name, p, begin, end, s.get());
          shard.buffers.push_back(std::move(s));
        }
      }
    }
  }
  return shard;
}

void prune_checkpoints(const fs::path& folder, int64_t keep_latest) {
  const std::vector<std::string> steps = published_checkpoints(folder.parent_path().string());
  for (size_t i = 0; i + static_cast<size_t>(keep_latest) < steps.size(); ++i)
    fs::remove_all(steps[i]);
}

// A rank's piece list, written by this writer (damage is an Error naming the file).
nlohmann::json parse_json_file(const std::string& path) {
  try {
    return nlohmann::json::parse(read_file_text(path));
  } catch (const nlohmann::json::exception& e) {
    throw Error("checkpoint piece list " + path + " is damaged (" + e.what() +
                "): the save fails; the previous checkpoint stays the latest");
  }
}

// Rank 0, once every rank's files are in the stage: the index from the ranks' piece lists
// (checked for coverage), the state and the config; then the publish.
void publish(StagedDirectory& stage, const CheckpointContents& c, int ranks) {
  CheckpointIndex index;
  for (int r = 0; r < ranks; ++r) {
    const std::string path = stage.file_path(pieces_file(r));
    merge_checkpoint_index(index, checkpoint_index_from_json(parse_json_file(path), path));
    fs::remove(path);
  }
  check_checkpoint_coverage(index, stage.final_path() + " (being written)");
  const nlohmann::json top = {
      {"format", "lattice.sharded_checkpoint"},
      {"version", 1},
      {"model", nlohmann::json::parse(model::model_config_to_json(c.config))},
      {"written_by", {{"ranks", ranks}, {"layout", c.layout}}},
      {"weight_layout", "[out, in] for every Linear weight"},
      {"tensors", checkpoint_index_to_json(index)}};
  write_text_atomic(stage.file_path("index.json"), top.dump(1) + "\n");
  nlohmann::json state = {
      {"step", c.state.step},
      {"samples_consumed", c.state.samples_consumed},
      {"seed", c.state.seed},
      {"optimizer_steps", c.optimizer_steps},
      {"rng",
       "no random stream advances during training: initialisation and the data order are "
       "functions of the seed and samples_consumed"}};
  if (!c.state.replica_quorum.empty())
    state["replica_quorum"] = nlohmann::json::parse(c.state.replica_quorum);
  write_text_atomic(stage.file_path("state.json"), state.dump(2) + "\n");
  write_text_atomic(stage.file_path("config.toml"), c.config_toml);
  stage.commit();
  const fs::path folder = fs::path(stage.final_path()).parent_path();
  write_text_atomic((folder / "latest").string(),
                    fs::path(stage.final_path()).filename().string() + "\n");
  prune_checkpoints(folder, c.keep_latest);
}

}  // namespace

std::vector<std::string> published_checkpoints(const std::string& run_dir) {
  const fs::path folder = fs::path(run_dir) / "checkpoints";
  std::vector<std::string> steps;
  if (!fs::is_directory(folder)) return steps;
  for (const auto& entry : fs::directory_iterator(folder)) {
    const std::string name = entry.path().filename().string();
    // (Staging folders carry a '.' suffix: step_N.tmp-<pid>, step_N.old-<pid>.)
    if (entry.is_directory() && name.rfind("step_", 0) == 0 && name.find('.') == std::string::npos)
      steps.push_back(entry.path().string());
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::string checkpoint_step_name(int64_t step) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "step_%08lld", static_cast<long long>(step));
  return buffer;
}

// A save in flight: the stage (rank 0), the snapshot and where its files go, the writing thread.
struct ShardedCheckpointWriter::Pending {
  CheckpointContents contents;
  std::unique_ptr<StagedDirectory> stage;  // rank 0
  std::string staging;
  RankShard shard;
  std::thread writer;
  std::atomic<bool> written{false};
  std::exception_ptr failure;
};

ShardedCheckpointWriter::ShardedCheckpointWriter(comm::Communicator& world) : world_(world) {}

ShardedCheckpointWriter::~ShardedCheckpointWriter() {
  if (state_ && state_->writer.joinable()) state_->writer.join();
}

void ShardedCheckpointWriter::start(const CheckpointContents& contents,
                                    std::span<const CheckpointSource> sources, bool in_background) {
  check(!pending_,
        "checkpoint: a save is still pending; finish it before starting another "
        "(internal error)");
  const auto started = std::chrono::steady_clock::now();
  const int rank = world_.rank(), ranks = world_.size();
  auto state = std::make_unique<Pending>();
  state->contents = contents;
  const fs::path final_dir =
      fs::path(contents.run_dir) / "checkpoints" / checkpoint_step_name(contents.state.step);
  // Rank 0 opens the stage and tells every rank where it is ("" when it could not).
  std::exception_ptr failure;
  if (rank == 0) {
    try {
      fs::create_directories(final_dir.parent_path());
      state->stage = std::make_unique<StagedDirectory>(final_dir.string());
      state->staging = state->stage->staging_path();
    } catch (...) {
      failure = std::current_exception();
    }
  }
  broadcast_text(world_, state->staging, 0);
  if (failure) std::rethrow_exception(failure);
  check(!state->staging.empty(), "rank 0 could not create the checkpoint directory " +
                                     final_dir.string() + " (its error names the problem)");
  // A rank that cannot take its snapshot fails the save at finish(), with every rank there.
  try {
    state->shard =
        collect(sources, rank_file("model", rank, ranks), rank_file("optimizer", rank, ranks));
  } catch (...) {
    state->failure = std::current_exception();
  }
  snapshot_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  // The files, from the snapshot: no communication, so a thread of its own may write them.
  auto write = [this, p = state.get(), rank, kill = kill_while_writing_] {
    const auto begun = std::chrono::steady_clock::now();
    try {
      const fs::path dir(p->staging);
      p->shard.fill_checksums();
      write_safetensors((dir / p->shard.weights.name).string(), p->shard.weights.entries,
                        {{"format", "lattice"},
                         {"lattice.model", model::model_config_to_json(p->contents.config)},
                         {"lattice.index", "index.json"},
                         {"lattice.weight_layout", "[out, in] for every Linear weight"}});
      if (kill) std::raise(SIGKILL);  // tests: a process killed in the middle of a save
      write_safetensors((dir / p->shard.moments.name).string(), p->shard.moments.entries,
                        {{"optimizer", "AdamW"},
                         {"steps_taken", std::to_string(p->contents.optimizer_steps)},
                         {"lattice.index", "index.json"}});
      write_text_atomic((dir / pieces_file(rank)).string(),
                        checkpoint_index_to_json(p->shard.index).dump());
    } catch (...) {
      p->failure = std::current_exception();
    }
    write_seconds_ =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begun).count();
    p->written = true;
  };
  state_ = std::move(state);
  pending_ = true;
  if (state_->failure)
    state_->written = true;
  else if (in_background)
    state_->writer = std::thread(write);
  else
    write();
}

std::string ShardedCheckpointWriter::finish(bool wait) {
  if (!pending_) return "";
  Pending& p = *state_;
  if (wait) {
    if (p.writer.joinable()) p.writer.join();
  } else if (!all_ok(world_, p.written.load())) {
    return "";  // some rank is still writing
  }
  if (p.writer.joinable()) p.writer.join();
  const std::string final_dir =
      (fs::path(p.contents.run_dir) / "checkpoints" / checkpoint_step_name(p.contents.state.step))
          .string();
  // Whatever happens next, this save is over (a failed stage is removed with `state_`).
  const std::unique_ptr<Pending> done = std::move(state_);
  pending_ = false;
  if (!all_ok(world_, p.failure == nullptr)) {
    if (p.failure) std::rethrow_exception(p.failure);
    throw Error("checkpoint " + final_dir +
                " was not written: another rank could not write its shard (its error names the "
                "problem); the previous checkpoint stays the latest");
  }
  // Rank 0 indexes and publishes.
  std::exception_ptr failure;
  if (world_.rank() == 0) {
    try {
      publish(*p.stage, p.contents, world_.size());
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (!all_ok(world_, failure == nullptr)) {
    if (failure) std::rethrow_exception(failure);
    throw Error("checkpoint " + final_dir +
                " was not published: rank 0 could not index it (its error names the problem); "
                "the previous checkpoint stays the latest");
  }
  return final_dir;
}

std::string save_sharded_checkpoint(const CheckpointContents& contents,
                                    std::span<const CheckpointSource> sources,
                                    comm::Communicator& world) {
  ShardedCheckpointWriter writer(world);
  writer.start(contents, sources, false);
  return writer.finish(true);
}

}  // namespace lattice::train
