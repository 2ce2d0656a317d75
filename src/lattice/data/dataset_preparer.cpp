// prepare_dataset: see dataset_preparer.hpp.
#include "lattice/data/dataset_preparer.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <mutex>
#include <string_view>
#include <thread>

#include "lattice/core/error.hpp"
#include "lattice/data/byte_corpus.hpp"
#include "lattice/data/llmc_shard.hpp"
#include "lattice/data/tokenizer.hpp"
#include "lattice/io/atomic_file.hpp"

namespace lattice::data {

namespace fs = std::filesystem;

namespace {

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The documents of one file's text, as views into it (empty documents dropped).
std::vector<std::string_view> split_documents(std::string_view text, const std::string& separator) {
  std::vector<std::string_view> docs;
  if (separator.empty()) {
    if (!text.empty()) docs.push_back(text);
    return docs;
  }
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find(separator, begin);
    if (end == std::string_view::npos) end = text.size();
    if (end > begin) docs.push_back(text.substr(begin, end - begin));
    begin = end + separator.size();
  }
  return docs;
}

// Token shards of one split: tokens accumulate and leave as shards of exactly shard_tokens (the
// last one shorter).
class ShardSink {
 public:
  ShardSink(std::string split, const StagedDirectory& stage, TokenType type, int64_t shard_tokens,
            DatasetManifest& manifest)
      : split_(std::move(split)),
        stage_(stage),
        type_(type),
        shard_tokens_(shard_tokens),
        manifest_(manifest) {}

  void add(const std::vector<int32_t>& tokens) {
    buffer_.insert(buffer_.end(), tokens.begin(), tokens.end());
    while (static_cast<int64_t>(buffer_.size()) >= shard_tokens_) {
      write(std::span<const int32_t>(buffer_.data(), static_cast<size_t>(shard_tokens_)));
      buffer_.erase(buffer_.begin(), buffer_.begin() + shard_tokens_);
    }
  }
  void finish() {
    if (!buffer_.empty()) write(buffer_);
    buffer_.clear();
  }

 private:
  void write(std::span<const int32_t> tokens) {
    char name[64];
    std::snprintf(name, sizeof(name), "%s_%06d.bin", split_.c_str(), shards_++);
    write_llmc_shard(stage_.file_path(name), tokens, type_);
    manifest_.shards.push_back({name, split_, static_cast<int64_t>(tokens.size())});
  }

  std::string split_;
  const StagedDirectory& stage_;
  TokenType type_;
  int64_t shard_tokens_;
  DatasetManifest& manifest_;
  std::vector<int32_t> buffer_;
  int shards_ = 0;
};

// Encodes `docs` with `threads` threads; out[i] is end-of-text (when the tokenizer has one) and
// then the ids of docs[i]. `encoded_bytes` grows as documents finish.
void encode_documents(const Tokenizer& tokenizer, const std::vector<std::string_view>& docs,
                      int threads, std::vector<std::vector<int32_t>>& out,
                      std::atomic<int64_t>& encoded_bytes) {
  out.assign(docs.size(), {});
  std::atomic<size_t> next{0};
  const auto eot = tokenizer.end_of_text();
  std::exception_ptr failure;
  std::mutex failure_mutex;
  auto work = [&] {
    try {
      for (size_t i = next++; i < docs.size(); i = next++) {
        auto ids = tokenizer.encode(docs[i]);
        if (eot) out[i].push_back(*eot);
        out[i].insert(out[i].end(), ids.begin(), ids.end());
        encoded_bytes += static_cast<int64_t>(docs[i].size());
      }
    } catch (...) {
      std::lock_guard lock(failure_mutex);
      if (!failure) failure = std::current_exception();
      next = docs.size();
    }
  };
  const int n = std::max(1, std::min<int>(threads, static_cast<int>(docs.size())));
  std::vector<std::thread> pool;
  for (int t = 1; t < n; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace

std::vector<bool> validation_documents(int64_t documents, double fraction) {
  std::vector<bool> val(static_cast<size_t>(documents), false);
  int64_t count = std::llround(fraction * static_cast<double>(documents));
  if (fraction > 0 && documents >= 2) count = std::max<int64_t>(count, 1);
  count = std::min(count, documents - 1);  // training keeps at least one document
  if (count <= 0) return val;
  std::vector<std::pair<uint64_t, int64_t>> keyed(static_cast<size_t>(documents));
  for (int64_t i = 0; i < documents; ++i)
    keyed[static_cast<size_t>(i)] = {mix64(static_cast<uint64_t>(i) ^ 0x7a11d5ull), i};
  std::nth_element(keyed.begin(), keyed.begin() + count, keyed.end());
  for (int64_t k = 0; k < count; ++k)
    val[static_cast<size_t>(keyed[static_cast<size_t>(k)].second)] = true;
  return val;
}

std::string unescape_separator(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\\' || i + 1 == text.size()) {
      out += text[i];
      continue;
    }
    const char c = text[++i];
    if (c == 'n')
      out += '\n';
    else if (c == 't')
      out += '\t';
    else if (c == 'r')
      out += '\r';
    else if (c == '\\')
      out += '\\';
    else
      throw Error("separator escape '\\" + std::string(1, c) +
                  "' is not known: use \\n, \\t, \\r or \\\\");
  }
  return out;
}

DatasetManifest prepare_dataset(const PrepareOptions& o, const PrepareProgress& progress) {
  check(!o.out.empty(), "give the output directory with --out");
  check(o.val_fraction >= 0 && o.val_fraction < 1,
        "--val-fraction must be in [0, 1), got " + std::to_string(o.val_fraction));
  check(o.shard_tokens > 0, "--shard-tokens must be positive");
  check(o.shard_tokens <= INT32_MAX, "--shard-tokens must be below 2^31 (llm.c's header limit)");
  if (fs::exists(o.out))
    check(fs::is_directory(o.out) &&
              (fs::is_empty(o.out) || fs::exists(fs::path(o.out) / kManifestName)),
          "--out " + o.out +
              " exists and is not a dataset made by `lattice data prepare`: choose another "
              "directory (it would be replaced)");
  const auto files = expand_file_patterns(o.inputs, o.exclude, "--input");
  const auto tokenizer = load_tokenizer(o.tokenizer);
  const int threads = o.threads > 0
                          ? o.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));

  // Pass 1: the documents of every file (counts and sizes only), for the split and the progress.
  std::vector<int64_t> docs_per_file;
  int64_t documents = 0, total_bytes = 0;
  for (const auto& f : files) {
    const std::string text = read_file_text(f);
    const auto docs = split_documents(text, o.separator);
    docs_per_file.push_back(static_cast<int64_t>(docs.size()));
    documents += static_cast<int64_t>(docs.size());
    for (auto d : docs) total_bytes += static_cast<int64_t>(d.size());
  }
  check(documents > 0, "the input files hold no text: check --input (and --separator)");
  const auto is_val = validation_documents(documents, o.val_fraction);

  DatasetManifest m;
  m.tokenizer = absolute_tokenizer_spec(o.tokenizer);
  m.tokenizer_name = tokenizer->name();
  m.vocab_size = tokenizer->vocab_size();
  m.end_of_text = tokenizer->end_of_text();
  const TokenType type = llmc_token_type_for_vocab(m.vocab_size);
  m.token_type = token_type_name(type);

  fs::create_directories(fs::absolute(o.out).parent_path());
  StagedDirectory stage(fs::absolute(o.out).lexically_normal().string());
  ShardSink train(std::string("train"), stage, type, o.shard_tokens, m);
  ShardSink val(std::string("val"), stage, type, o.shard_tokens, m);

  // Pass 2: files in batches of about 16 MiB of text, each batch encoded by the thread pool.
  constexpr int64_t kBatchBytes = int64_t{16} << 20;
  std::atomic<int64_t> encoded{0};
  int64_t doc_index = 0;
  size_t next_file = 0;
  while (next_file < files.size()) {
    std::vector<std::string> texts;
    std::vector<std::string_view> docs;
    int64_t batch_bytes = 0;
    while (next_file < files.size() && (texts.empty() || batch_bytes < kBatchBytes)) {
      texts.push_back(read_file_text(files[next_file]));
      batch_bytes += static_cast<int64_t>(texts.back().size());
      ++next_file;
    }
    for (const auto& t : texts)
      for (auto d : split_documents(t, o.separator)) docs.push_back(d);
    std::vector<std::vector<int32_t>> ids;
    std::atomic<bool> batch_done{false};
    std::exception_ptr failure;
    std::thread encoder([&] {
      try {
        encode_documents(*tokenizer, docs, threads, ids, encoded);
      } catch (...) {
        failure = std::current_exception();
      }
      batch_done = true;
    });
    // Report while the batch encodes (the encoder's threads do the work).
    for (int tick = 0; !batch_done.load(); ++tick) {
      if (progress && tick % 10 == 0) progress(encoded.load(), total_bytes);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    encoder.join();
    if (failure) std::rethrow_exception(failure);
    for (size_t i = 0; i < docs.size(); ++i, ++doc_index) {
      const bool v = is_val[static_cast<size_t>(doc_index)];
      (v ? val : train).add(ids[i]);
      (v ? m.val_documents : m.train_documents) += 1;
      (v ? m.val_tokens : m.train_tokens) += static_cast<int64_t>(ids[i].size());
    }
    if (progress) progress(encoded.load(), total_bytes);
  }
  check(doc_index == documents,
        "input files changed while `lattice data prepare` read them: rerun");
  train.finish();
  val.finish();
  write_text_atomic(stage.file_path(kManifestName), m.to_json());
  stage.commit();
  return m;
}

}  // namespace lattice::data
