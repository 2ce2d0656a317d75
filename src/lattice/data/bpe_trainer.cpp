// BpeTrainer: see bpe_trainer.hpp.
#include "lattice/data/bpe_trainer.hpp"

#include <algorithm>
#include <fstream>
#include <queue>
#include <sstream>
#include <unordered_set>

#include "lattice/core/error.hpp"
#include "lattice/data/pretokenizer.hpp"

namespace lattice::data {
namespace {

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}
int32_t key_left(uint64_t key) {
  return static_cast<int32_t>(key >> 32);
}
int32_t key_right(uint64_t key) {
  return static_cast<int32_t>(key & 0xFFFFFFFFu);
}

// Max-heap order: larger count first, then smaller pair key.
struct Candidate {
  int64_t count;
  uint64_t key;
  bool operator<(const Candidate& o) const {
    return count != o.count ? count < o.count : key > o.key;
  }
};

}  // namespace

BpeTrainer::BpeTrainer(BpeTrainerOptions options) : options_(std::move(options)) {
  const int64_t fixed = 256 + static_cast<int64_t>(options_.special_tokens.size());
  check(options_.vocab_size >= fixed,
        "tokenizer vocabulary size " + std::to_string(options_.vocab_size) +
            " cannot hold the 256 bytes and " + std::to_string(options_.special_tokens.size()) +
            " special tokens: use at least " + std::to_string(fixed));
  check(options_.vocab_size <= (int64_t{1} << 31) - 1, "tokenizer vocabulary size too large");
  std::unordered_set<std::string> seen;
  for (const auto& special : options_.special_tokens)
    check(!special.empty() && seen.insert(special).second,
          "special token '" + special + "' is empty or listed twice: give each once");
  pretokenizer_ = std::make_unique<Pretokenizer>(options_.pattern);
}

void BpeTrainer::add_text(std::string_view text) {
  pretokenizer_->split(text, [&](std::string_view piece) {
    auto it = piece_counts_.find(std::string(piece));
    if (it == piece_counts_.end())
      piece_counts_.emplace(std::string(piece), 1);
    else
      ++it->second;
    ++pieces_counted_;
  });
}

void BpeTrainer::add_files(const std::vector<std::filesystem::path>& files) {
  for (const auto& file : files) {
    std::ifstream in(file, std::ios::binary);
    check(in.good(), "cannot read tokenizer training text '" + file.string() + "': check the path");
    std::ostringstream buffer;
    buffer << in.rdbuf();
    add_text(buffer.view());
  }
}

BpeModel BpeTrainer::train(const std::function<void(int64_t, int64_t)>& on_progress) const {
  BpeModel model;
  model.pattern = options_.pattern;
  model.name = "trained";
  std::vector<std::string> token_bytes;
  for (int b = 0; b < 256; ++b) token_bytes.emplace_back(1, static_cast<char>(b));
  std::unordered_map<std::string, int32_t> id_of;
  for (int b = 0; b < 256; ++b) id_of.emplace(token_bytes[b], b);

  // Words (distinct pieces) in byte order, so that ids do not depend on hash-map order.
  std::vector<const std::pair<const std::string, int64_t>*> sorted;
  sorted.reserve(piece_counts_.size());
  for (const auto& entry : piece_counts_) sorted.push_back(&entry);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->first < b->first; });
  std::vector<std::vector<int32_t>> words(sorted.size());
  std::vector<int64_t> counts(sorted.size());
  for (size_t w = 0; w < sorted.size(); ++w) {
    for (char c : sorted[w]->first) words[w].push_back(static_cast<uint8_t>(c));
    counts[w] = sorted[w]->second;
  }

  std::unordered_map<uint64_t, int64_t> pair_counts;
  std::unordered_map<uint64_t, std::vector<int32_t>> pair_words;  // may list a word twice
  for (size_t w = 0; w < words.size(); ++w) {
    for (size_t i = 0; i + 1 < words[w].size(); ++i) {
      const uint64_t key = pair_key(words[w][i], words[w][i + 1]);
      pair_counts[key] += counts[w];
      pair_words[key].push_back(static_cast<int32_t>(w));
    }
  }
  std::priority_queue<Candidate> heap;
  for (const auto& [key, count] : pair_counts) heap.push({count, key});

  const int64_t target_tokens =
      options_.vocab_size - static_cast<int64_t>(options_.special_tokens.size());
  const int64_t wanted = target_tokens - 256;
  std::vector<int64_t> word_stamp(words.size(), -1);
  std::unordered_set<uint64_t> changed;
  int64_t merges_done = 0;
  while (static_cast<int64_t>(token_bytes.size()) < target_tokens && !heap.empty()) {
    const Candidate best = heap.top();
    heap.pop();
    auto count_it = pair_counts.find(best.key);
    if (count_it == pair_counts.end() || count_it->second != best.count) continue;  // stale
    if (best.count < options_.min_frequency) break;
    const int32_t a = key_left(best.key), b = key_right(best.key);
    const std::string joined = token_bytes[a] + token_bytes[b];
    int32_t merged;
    if (auto it = id_of.find(joined); it != id_of.end()) {
      merged = it->second;  // the same bytes reached by another pair: reuse the token
    } else {
      merged = static_cast<int32_t>(token_bytes.size());
      token_bytes.push_back(joined);
      id_of.emplace(joined, merged);
    }
    model.merges.emplace_back(token_bytes[a], token_bytes[b]);
    ++merges_done;

    changed.clear();
    auto add = [&](int32_t left, int32_t right, int64_t delta, int32_t word) {
      const uint64_t key = pair_key(left, right);
      pair_counts[key] += delta;
      changed.insert(key);
      if (delta > 0) pair_words[key].push_back(word);
    };
    const std::vector<int32_t> occurrences = std::move(pair_words[best.key]);
    pair_words.erase(best.key);
    for (const int32_t w : occurrences) {
      if (word_stamp[w] == merges_done) continue;
      word_stamp[w] = merges_done;
      std::vector<int32_t>& s = words[w];
      const int64_t n = counts[w];
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        if (s[i] != a || s[i + 1] != b) continue;
        if (i > 0) add(s[i - 1], a, -n, w);
        if (i + 2 < s.size()) add(b, s[i + 2], -n, w);
        add(a, b, -n, w);
        s[i] = merged;
        s.erase(s.begin() + static_cast<std::ptrdiff_t>(i) + 1);
        if (i > 0) add(s[i - 1], merged, n, w);
        if (i + 1 < s.size()) add(merged, s[i + 1], n, w);
      }
    }
    for (const uint64_t key : changed) {
      auto it = pair_counts.find(key);
      if (it->second <= 0) {
        pair_counts.erase(it);
        pair_words.erase(key);
      } else {
        heap.push({it->second, key});
      }
    }
    if (on_progress && (merges_done % 256 == 0)) on_progress(merges_done, wanted);
  }
  if (on_progress) on_progress(merges_done, wanted);

  for (size_t id = 0; id < token_bytes.size(); ++id)
    model.tokens.push_back({token_bytes[id], static_cast<int32_t>(id)});
  int32_t next_id = static_cast<int32_t>(token_bytes.size());
  for (const auto& special : options_.special_tokens)
    model.special_tokens.push_back({special, next_id++});
  return model;
}

}  // namespace lattice::data
