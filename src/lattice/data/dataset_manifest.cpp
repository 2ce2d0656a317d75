// DatasetManifest: see dataset_manifest.hpp.
#include "lattice/data/dataset_manifest.hpp"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "lattice/core/error.hpp"
#include "lattice/io/atomic_file.hpp"

namespace lattice::data {

using nlohmann::json;

std::string DatasetManifest::to_json() const {
  json shard_list = json::array();
  for (const auto& s : shards)
    shard_list.push_back({{"file", s.file}, {"split", s.split}, {"tokens", s.tokens}});
  json j = {{"format", kManifestFormat},
            {"version", 1},
            {"tokenizer", tokenizer},
            {"tokenizer_name", tokenizer_name},
            {"vocab_size", vocab_size},
            {"end_of_text", end_of_text ? json(*end_of_text) : json(nullptr)},
            {"token_type", token_type},
            {"documents", {{"train", train_documents}, {"val", val_documents}}},
            {"tokens", {{"train", train_tokens}, {"val", val_tokens}}},
            {"shards", shard_list}};
  return j.dump(2) + "\n";
}

std::vector<std::string> DatasetManifest::files(const std::string& split) const {
  std::vector<std::string> out;
  for (const auto& s : shards)
    if (s.split == split) out.push_back(s.file);
  return out;
}

namespace {

[[noreturn]] void bad_field(const std::string& name, const std::string& field,
                            const std::string& what) {
  throw Error("dataset manifest " + name + ": field '" + field + "' " + what +
              "; regenerate the dataset with `lattice data prepare`");
}

const json& field(const json& object, const std::string& key, const std::string& name,
                  const std::string& path) {
  if (!object.is_object() || !object.contains(key)) bad_field(name, path, "is missing");
  return object.at(key);
}

int64_t count_field(const json& object, const std::string& key, const std::string& name,
                    const std::string& path) {
  const json& v = field(object, key, name, path);
  if (!v.is_number_integer() || v.get<int64_t>() < 0)
    bad_field(name, path, "must be a non-negative integer");
  return v.get<int64_t>();
}

std::string string_field(const json& object, const std::string& key, const std::string& name,
                         const std::string& path) {
  const json& v = field(object, key, name, path);
  if (!v.is_string()) bad_field(name, path, "must be a string");
  return v.get<std::string>();
}

}  // namespace

DatasetManifest parse_manifest(const std::string& text, const std::string& name) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a huge number
    throw Error("dataset manifest " + name + " is not valid JSON (" + e.what() +
                "); regenerate the dataset with `lattice data prepare`");
  }
  if (!j.is_object()) bad_field(name, "(top level)", "must be a JSON object");
  if (string_field(j, "format", name, "format") != kManifestFormat)
    bad_field(name, "format", std::string("must be \"") + kManifestFormat + "\"");
  if (count_field(j, "version", name, "version") != 1) bad_field(name, "version", "must be 1");
  DatasetManifest m;
  m.tokenizer = string_field(j, "tokenizer", name, "tokenizer");
  m.tokenizer_name = string_field(j, "tokenizer_name", name, "tokenizer_name");
  m.vocab_size = count_field(j, "vocab_size", name, "vocab_size");
  if (m.vocab_size < 1) bad_field(name, "vocab_size", "must be positive");
  const json& eot = field(j, "end_of_text", name, "end_of_text");
  if (!eot.is_null()) {
    if (!eot.is_number_integer() || eot.get<int64_t>() < 0 || eot.get<int64_t>() >= m.vocab_size)
      bad_field(name, "end_of_text", "must be null or an id below vocab_size");
    m.end_of_text = eot.get<int32_t>();
  }
  m.token_type = string_field(j, "token_type", name, "token_type");
  if (m.token_type != "uint16" && m.token_type != "uint32")
    bad_field(name, "token_type", "must be \"uint16\" or \"uint32\"");
  const json& docs = field(j, "documents", name, "documents");
  m.train_documents = count_field(docs, "train", name, "documents.train");
  m.val_documents = count_field(docs, "val", name, "documents.val");
  const json& tokens = field(j, "tokens", name, "tokens");
  m.train_tokens = count_field(tokens, "train", name, "tokens.train");
  m.val_tokens = count_field(tokens, "val", name, "tokens.val");
  const json& shards = field(j, "shards", name, "shards");
  if (!shards.is_array()) bad_field(name, "shards", "must be an array");
  int64_t sums[2] = {0, 0};
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string at = "shards[" + std::to_string(i) + "]";
    ManifestShard s;
    s.file = string_field(shards[i], "file", name, at + ".file");
    if (s.file.empty() || s.file.find('/') != std::string::npos || s.file[0] == '.')
      bad_field(name, at + ".file", "must be a plain file name inside the dataset directory");
    s.split = string_field(shards[i], "split", name, at + ".split");
    if (s.split != "train" && s.split != "val")
      bad_field(name, at + ".split", "must be \"train\" or \"val\"");
    s.tokens = count_field(shards[i], "tokens", name, at + ".tokens");
    sums[s.split == "val"] += s.tokens;
    m.shards.push_back(std::move(s));
  }
  if (sums[0] != m.train_tokens || sums[1] != m.val_tokens)
    bad_field(name, "tokens", "does not match the sum of the shards' tokens");
  if (m.train_tokens == 0) bad_field(name, "tokens.train", "is 0: the dataset is empty");
  return m;
}

std::string absolute_tokenizer_spec(const std::string& spec) {
  if (spec == "byte" || spec.empty()) return spec;
  const std::string prefix = "tiktoken:";
  if (spec.starts_with(prefix)) return prefix + absolute_tokenizer_spec(spec.substr(prefix.size()));
  return std::filesystem::absolute(spec).lexically_normal().string();
}

DatasetManifest read_manifest(const std::string& directory) {
  const std::string path = (std::filesystem::path(directory) / kManifestName).string();
  check(std::filesystem::exists(path),
        "token dataset " + directory + " has no " + kManifestName +
            ": point data.dataset to a directory made by `lattice data prepare` (or set "
            "data.format to \"llmc\" or \"megatron\")");
  return parse_manifest(read_file_text(path), path);
}

}  // namespace lattice::data
