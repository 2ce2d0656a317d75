// The index of a sharded checkpoint: see checkpoint_index.hpp.
#include "lattice/train/checkpoint_index.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "lattice/core/error.hpp"

namespace lattice::train {

nlohmann::json checkpoint_index_to_json(const CheckpointIndex& index) {
  nlohmann::json tensors = nlohmann::json::object();
  for (const auto& [name, tensor] : index) {
    nlohmann::json pieces = nlohmann::json::array();
    for (const CheckpointPiece& p : tensor.pieces) {
      nlohmann::json shard = {
          {"dim", p.shard.dim}, {"index", p.shard.index}, {"count", p.shard.count}};
      if (p.shard.blocks > 1) shard["blocks"] = p.shard.blocks;
      if (p.shard.padded > 0) shard["padded"] = p.shard.padded;
      pieces.push_back({{"file", p.file},
                        {"key", p.key},
                        {"shard", shard},
                        {"slice_shape", p.slice_shape},
                        {"begin", p.begin},
                        {"end", p.end},
                        {"crc32c", p.crc32c}});
    }
    tensors[name] = {{"global_shape", tensor.global_shape}, {"pieces", pieces}};
  }
  return tensors;
}

CheckpointIndex checkpoint_index_from_json(const nlohmann::json& tensors,
                                           const std::string& source) {
  CheckpointIndex index;
  try {
    for (const auto& [name, entry] : tensors.items()) {
      CheckpointTensor& tensor = index[name];
      tensor.global_shape = entry.at("global_shape").get<Shape>();
      for (const nlohmann::json& p : entry.at("pieces")) {
        CheckpointPiece piece;
        piece.file = p.at("file").get<std::string>();
        piece.key = p.at("key").get<std::string>();
        const nlohmann::json& shard = p.at("shard");
        piece.shard.dim = shard.at("dim").get<int>();
        piece.shard.index = shard.at("index").get<int>();
        piece.shard.count = shard.at("count").get<int>();
        piece.shard.blocks = shard.value("blocks", 1);
        piece.shard.padded = shard.value("padded", int64_t{0});
        piece.slice_shape = p.at("slice_shape").get<Shape>();
        piece.begin = p.at("begin").get<int64_t>();
        piece.end = p.at("end").get<int64_t>();
        piece.crc32c = p.at("crc32c").get<uint32_t>();
        tensor.pieces.push_back(std::move(piece));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error("checkpoint index " + source + " is damaged (" + e.what() +
                "): resume from an earlier checkpoint");
  }
  return index;
}

void merge_checkpoint_index(CheckpointIndex& index, const CheckpointIndex& more) {
  for (const auto& [name, tensor] : more) {
    auto [it, added] = index.try_emplace(name, CheckpointTensor{tensor.global_shape, {}});
    if (it->second.global_shape != tensor.global_shape)
      throw Error("checkpoint: ranks disagree on the shape of '" + name + "' (" +
                  shape_string(it->second.global_shape) + " and " +
                  shape_string(tensor.global_shape) + "): their models differ (internal error)");
    it->second.pieces.insert(it->second.pieces.end(), tensor.pieces.begin(), tensor.pieces.end());
  }
}

void check_checkpoint_coverage(const CheckpointIndex& index, const std::string& source) {
  for (const auto& [name, tensor] : index) {
    check(!tensor.pieces.empty(), "checkpoint " + source + " lists '" + name +
                                      "' without pieces: resume from an earlier checkpoint");
    const model::TensorShard& first = tensor.pieces.front().shard;
    std::vector<std::vector<const CheckpointPiece*>> slices(
        static_cast<size_t>(std::max(first.count, 1)));
    for (const CheckpointPiece& p : tensor.pieces) {
      // (The messages are built only on failure: this runs for every piece of every tensor.)
      if (p.shard.count != first.count || p.shard.dim != first.dim ||
          p.shard.blocks != first.blocks || p.shard.index < 0 || p.shard.index >= p.shard.count)
        throw Error("checkpoint " + source + ": the pieces of '" + name +
                    "' disagree on how it is split (damaged index): resume from an earlier "
                    "checkpoint");
      slices[static_cast<size_t>(p.shard.index)].push_back(&p);
    }
    for (size_t s = 0; s < slices.size(); ++s) {
      auto& runs = slices[s];
      const auto what = [&] {
        return "'" + name + "'" +
               (slices.size() > 1
                    ? " (slice " + std::to_string(s) + " of " + std::to_string(slices.size()) + ")"
                    : "");
      };
      if (runs.empty())
        throw Error("checkpoint " + source + " has no piece of " + what() +
                    ": a rank's file is missing from the index; resume from an earlier "
                    "checkpoint");
      const int64_t numel = shape_numel(runs.front()->slice_shape);
      std::sort(runs.begin(), runs.end(), [](const CheckpointPiece* a, const CheckpointPiece* b) {
        return a->begin < b->begin;
      });
      int64_t covered = 0;
      for (const CheckpointPiece* p : runs) {
        if (p->slice_shape != runs.front()->slice_shape || p->begin >= p->end)
          throw Error("checkpoint " + source + ": a piece of " + what() +
                      " is malformed (damaged index): resume from an earlier checkpoint");
        if (p->begin != covered)
          throw Error("checkpoint " + source + " " +
                      (p->begin > covered ? "is missing" : "holds twice") + " elements [" +
                      std::to_string(std::min(p->begin, covered)) + ", " +
                      std::to_string(std::max(p->begin, covered)) + ") of " + what() +
                      ": a rank's shard is lost or the index is damaged; resume from an earlier "
                      "checkpoint");
        covered = p->end;
      }
      if (covered != numel)
        throw Error("checkpoint " + source + " is missing elements [" + std::to_string(covered) +
                    ", " + std::to_string(numel) + ") of " + what() +
                    ": a rank's shard is lost or the index is damaged; resume from an earlier "
                    "checkpoint");
    }
  }
}

model::ParameterInfo slice_info(const std::string& name, const CheckpointTensor& tensor,
                                const CheckpointPiece& piece) {
  model::ParameterInfo info;
  info.name = name;
  info.shape = piece.slice_shape;
  info.global_shape = tensor.global_shape;
  info.shard = piece.shard;
  info.numel = shape_numel(piece.slice_shape);
  info.init_stream = name;
  return info;
}

}  // namespace lattice::train
