// CheckpointReader: see checkpoint_reader.hpp.
#include "lattice/train/checkpoint_reader.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "lattice/core/crc32c.hpp"
#include "lattice/core/error.hpp"
#include "lattice/io/atomic_file.hpp"
#include "lattice/model/model_config_json.hpp"
#include "lattice/parallel/tensor_parallel_state.hpp"

namespace lattice::train {

namespace fs = std::filesystem;

namespace {

// One whole piece per tensor of a whole-format file (no checksum: that format had none).
void add_whole_file(CheckpointIndex& index, const SafetensorsFile& file,
                    const std::string& relative) {
  for (const std::string& name : file.names()) {
    const SafetensorsEntry& entry = file.entry(name);
    CheckpointPiece piece;
    piece.file = relative;
    piece.key = name;
    piece.slice_shape = entry.shape;
    piece.end = shape_numel(entry.shape);
    index[name] = CheckpointTensor{entry.shape, {piece}};
  }
}

}  // namespace

CheckpointReader::CheckpointReader(std::string dir) : dir_(std::move(dir)) {
  const fs::path folder(dir_);
  const std::string state_path = (folder / "state.json").string();
  check(fs::exists(state_path), "checkpoint " + dir_ +
                                    " has no state.json: it is not a complete checkpoint; "
                                    "resume from an earlier one");
  try {
    const nlohmann::json j = nlohmann::json::parse(read_file_text(state_path));
    state_.step = j.at("step").get<int64_t>();
    state_.samples_consumed = j.at("samples_consumed").get<int64_t>();
    state_.seed = j.at("seed").get<uint64_t>();
    if (j.contains("replica_quorum")) state_.replica_quorum = j.at("replica_quorum").dump();
    optimizer_steps_ = j.value("optimizer_steps", int64_t{0});
  } catch (const nlohmann::json::exception& e) {
    throw Error("checkpoint state " + state_path + " is damaged (" + e.what() +
                "): resume from an earlier checkpoint");
  }
  const fs::path index_path = folder / "index.json";
  sharded_ = fs::exists(index_path);
  std::string model_json;
  if (sharded_) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_file_text(index_path.string()));
      check(j.at("format").get<std::string>() == "lattice.sharded_checkpoint",
            "checkpoint index " + index_path.string() +
                " is not a Lattice sharded checkpoint index (its format field differs)");
      model_json = j.at("model").dump();
      index_ = checkpoint_index_from_json(j.at("tensors"), index_path.string());
    } catch (const nlohmann::json::exception& e) {
      throw Error("checkpoint index " + index_path.string() + " is damaged (" + e.what() +
                  "): resume from an earlier checkpoint");
    }
    check_checkpoint_coverage(index_, dir_);
    std::set<std::string> files;
    for (const auto& [name, tensor] : index_)
      for (const CheckpointPiece& p : tensor.pieces) files.insert(p.file);
    for (const std::string& f : files)
      check(fs::exists(folder / f), "checkpoint " + dir_ + " lacks " + f +
                                        ", which its index lists: a rank's shard file is "
                                        "missing; resume from an earlier checkpoint");
  } else {
    const std::string weights = (folder / "model.safetensors").string();
    check(fs::exists(weights), "checkpoint " + dir_ +
                                   " has neither index.json nor model.safetensors: it is not a "
                                   "Lattice checkpoint; point at a checkpoint directory");
    const SafetensorsFile& model_file = file("model.safetensors");
    add_whole_file(index_, model_file, "model.safetensors");
    auto it = model_file.metadata().find("lattice.model");
    check(it != model_file.metadata().end(),
          "checkpoint " + weights +
              " has no model configuration in its metadata: it was not written by lattice, so "
              "give the model configuration explicitly");
    model_json = it->second;
    if (fs::exists(folder / "optimizer.safetensors"))
      add_whole_file(index_, file("optimizer.safetensors"), "optimizer.safetensors");
  }
  try {
    config_ = model::model_config_from_json(model_json);
  } catch (const Error& e) {
    throw Error("checkpoint " + dir_ + ": " + e.what() + "; resume from an earlier checkpoint");
  }
}

CheckpointReader::~CheckpointReader() = default;

std::vector<std::string> CheckpointReader::names() const {
  std::vector<std::string> names;
  for (const auto& [name, tensor] : index_) names.push_back(name);
  return names;
}

bool CheckpointReader::contains(const std::string& name) const {
  return index_.count(name) != 0;
}

const Shape& CheckpointReader::global_shape(const std::string& name) const {
  auto it = index_.find(name);
  check(it != index_.end(), "checkpoint " + dir_ + " has no tensor '" + name +
                                "': it holds a different model; use the same [model] settings "
                                "or a new job.run_dir");
  return it->second.global_shape;
}

const SafetensorsFile& CheckpointReader::file(const std::string& relative) {
  auto& slot = files_[relative];
  if (!slot) slot = std::make_unique<SafetensorsFile>((fs::path(dir_) / relative).string());
  return *slot;
}

void CheckpointReader::read(const std::string& name, const Shape& global_shape, float* out) {
  const Shape& stored = this->global_shape(name);  // (Error when absent)
  check(stored == global_shape, "checkpoint " + dir_ + " holds '" + name + "' with logical shape " +
                                    shape_string(stored) + ", this model's is " +
                                    shape_string(global_shape) +
                                    ": use the same [model] settings or a new job.run_dir");
  const CheckpointTensor& tensor = index_.at(name);
  const model::TensorShard& split = tensor.pieces.front().shard;
  std::vector<float> slice;
  for (int s = 0; s < split.count; ++s) {
    const CheckpointPiece* any = nullptr;
    for (const CheckpointPiece& p : tensor.pieces) {
      if (p.shard.index != s) continue;
      any = &p;
      const SafetensorsFile& f = file(p.file);
      const SafetensorsEntry& entry = f.entry(p.key);
      if (sharded_) {
        const uint32_t crc = crc32c(entry.data, entry.nbytes);
        check(entry.dtype == DType::f32 && crc == p.crc32c,
              "checkpoint " + dir_ + ": tensor '" + p.key + "' in " + p.file +
                  " fails its checksum (crc32c " + std::to_string(crc) + ", the index says " +
                  std::to_string(p.crc32c) +
                  "): the file is damaged; resume from an earlier checkpoint");
      }
      const int64_t n = p.end - p.begin;
      if (split.count == 1) {
        f.read_f32(p.key, out + p.begin, n);
      } else {
        slice.resize(static_cast<size_t>(shape_numel(p.slice_shape)));
        f.read_f32(p.key, slice.data() + p.begin, n);
      }
    }
    if (split.count > 1) parallel::place_slice(slice_info(name, tensor, *any), slice.data(), out);
  }
}

}  // namespace lattice::train
