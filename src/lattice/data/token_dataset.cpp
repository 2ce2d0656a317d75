// TokenDataset: see token_dataset.hpp.
#include "lattice/data/token_dataset.hpp"

#include <algorithm>
#include <filesystem>

#include "lattice/core/error.hpp"
#include "lattice/data/byte_corpus.hpp"
#include "lattice/data/llmc_shard.hpp"
#include "lattice/data/megatron_dataset.hpp"

namespace lattice::data {

namespace fs = std::filesystem;

ConcatenatedTokens::ConcatenatedTokens(std::vector<std::unique_ptr<TokenSource>> parts)
    : parts_(std::move(parts)) {
  check(!parts_.empty(), "a token stream needs at least one file");
  starts_.push_back(0);
  for (const auto& p : parts_) {
    starts_.push_back(starts_.back() + p->size());
    vocab_size_ = std::max(vocab_size_, p->vocab_size());
  }
}

void ConcatenatedTokens::read(int64_t offset, int64_t count, int32_t* out) const {
  check(offset >= 0 && count >= 0 && offset + count <= size(),
        "read of tokens [" + std::to_string(offset) + ", " + std::to_string(offset + count) +
            ") outside a token stream of " + std::to_string(size()));
  auto part = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), offset) -
                                  starts_.begin() - 1);
  while (count > 0) {
    const int64_t local = offset - starts_[part];
    const int64_t n = std::min(count, starts_[part + 1] - offset);
    parts_[part]->read(local, n, out);
    out += n;
    offset += n;
    count -= n;
    ++part;
  }
}

TokenFormat parse_token_format(const std::string& name) {
  if (name == "auto") return TokenFormat::automatic;
  if (name == "prepared") return TokenFormat::prepared;
  if (name == "llmc") return TokenFormat::llmc;
  if (name == "megatron") return TokenFormat::megatron;
  throw Error("data.format '" + name +
              "' is not a token-file format: use \"auto\", \"prepared\", \"llmc\" or \"megatron\"");
}

namespace {

std::string megatron_prefix(const std::string& spec) {
  for (const char* ext : {".idx", ".bin"})
    if (spec.size() > 4 && spec.ends_with(ext) &&
        fs::exists(spec.substr(0, spec.size() - 4) + (ext[1] == 'i' ? ".bin" : ".idx")))
      return spec.substr(0, spec.size() - 4);
  return spec;
}

std::unique_ptr<TokenSource> open_llmc_files(const std::vector<std::string>& files,
                                             int64_t vocab_size) {
  std::vector<std::unique_ptr<TokenSource>> parts;
  for (const auto& f : files) parts.push_back(std::make_unique<LlmcShard>(f, vocab_size));
  if (parts.size() == 1) return std::move(parts.front());
  return std::make_unique<ConcatenatedTokens>(std::move(parts));
}

// One split of `spec` in a format other than prepared.
std::unique_ptr<TokenSource> open_split(const std::string& spec, TokenFormat format,
                                        int64_t vocab_size, bool validation_files) {
  if (format == TokenFormat::megatron)
    return std::make_unique<MegatronDataset>(megatron_prefix(spec), vocab_size);
  std::vector<std::string> files;
  for (const auto& f : expand_file_patterns({spec}, {}, "data.dataset")) {
    const bool is_val = fs::path(f).filename().string().find("val") != std::string::npos;
    if (is_val == validation_files) files.push_back(f);
  }
  if (files.empty()) return nullptr;
  return open_llmc_files(files, vocab_size);
}

}  // namespace

TokenFormat detect_token_format(const std::string& spec) {
  if (fs::is_directory(spec)) return TokenFormat::prepared;
  const std::string prefix = megatron_prefix(spec);
  if (fs::exists(prefix + ".idx")) return TokenFormat::megatron;
  return TokenFormat::llmc;
}

TokenDataset open_token_dataset(const std::string& spec, TokenFormat format, int64_t vocab_size,
                                const std::string& val_spec) {
  check(!spec.empty(),
        "data.dataset is empty: name a prepared directory, llm.c shards or a "
        "Megatron prefix");
  if (format == TokenFormat::automatic) format = detect_token_format(spec);
  TokenDataset d;
  if (format == TokenFormat::prepared) {
    check(fs::is_directory(spec), "data.dataset '" + spec +
                                      "' is not a directory: run `lattice data prepare --out " +
                                      spec + "` first");
    d.manifest = read_manifest(spec);
    const auto& m = *d.manifest;
    check(m.vocab_size <= vocab_size,
          "token dataset " + spec + " was prepared with a vocabulary of " +
              std::to_string(m.vocab_size) + " (" + m.tokenizer_name +
              "), larger than model.vocab_size = " + std::to_string(vocab_size) +
              ": set model.vocab_size >= " + std::to_string(m.vocab_size));
    auto open = [&](const std::string& split) -> std::unique_ptr<TokenSource> {
      std::vector<std::string> files;
      for (const auto& f : m.files(split)) files.push_back((fs::path(spec) / f).string());
      if (files.empty()) return nullptr;
      auto source = open_llmc_files(files, m.vocab_size);
      const int64_t expected = split == "train" ? m.train_tokens : m.val_tokens;
      check(source->size() == expected, "token dataset " + spec + ": the " + split +
                                            " shards hold " + std::to_string(source->size()) +
                                            " tokens but manifest.json says " +
                                            std::to_string(expected) + "; regenerate the dataset");
      return source;
    };
    d.train = open("train");
    d.validation = open("val");
    d.description = "prepared dataset " + spec + " (" + m.tokenizer_name + ", " +
                    std::to_string(m.train_tokens) + " train / " + std::to_string(m.val_tokens) +
                    " validation tokens)";
  } else {
    d.train = open_split(spec, format, vocab_size, false);
    check(d.train != nullptr, "data.dataset '" + spec +
                                  "' matches only validation shards (names containing \"val\"): "
                                  "add the training shards");
    if (!val_spec.empty()) {
      const TokenFormat val_format =
          format == TokenFormat::megatron ? format : detect_token_format(val_spec);
      d.validation = val_format == TokenFormat::megatron
                         ? open_split(val_spec, val_format, vocab_size, false)
                         : open_llmc_files(expand_file_patterns({val_spec}, {}, "data.val_dataset"),
                                           vocab_size);
    } else if (format == TokenFormat::llmc) {
      d.validation = open_split(spec, format, vocab_size, true);
    }
    d.description =
        std::string(format == TokenFormat::megatron ? "Megatron dataset " : "llm.c shards ") +
        spec + " (" + std::to_string(d.train->size()) + " train tokens)";
  }
  check(d.train != nullptr && d.train->size() > 0,
        "token dataset " + spec + " has no training tokens: prepare it from non-empty input");
  return d;
}

}  // namespace lattice::data
