// BpeTokenizer: see bpe_tokenizer.hpp.
#include "lattice/data/bpe_tokenizer.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <mutex>
#include <queue>
#include <unordered_map>

#include "lattice/core/error.hpp"

namespace lattice::data {
namespace {

constexpr uint32_t kNoRank = std::numeric_limits<uint32_t>::max();

uint64_t mix(uint64_t h) {
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  return h;
}

uint64_t hash_bytes(std::string_view s) {
  const char* p = s.data();
  size_t n = s.size();
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xFF51AFD7ED558CCDull);
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    h = mix(h ^ v) * 0x94D049BB133111EBull;
    p += 8;
    n -= 8;
  }
  if (n > 0) {
    uint64_t v = 0;
    std::memcpy(&v, p, n);
    h = mix(h ^ v) * 0x94D049BB133111EBull;
  }
  return mix(h);
}

size_t table_capacity(size_t entries) {
  size_t capacity = 16;
  while (capacity < entries * 2) capacity *= 2;
  return capacity;
}

// Byte string -> id, open addressing; the strings live in one buffer.
class TokenTable {
 public:
  void build(const std::vector<std::pair<std::string_view, int32_t>>& entries) {
    slots_.assign(table_capacity(entries.size()), Slot{});
    for (const auto& [bytes, id] : entries) {
      size_t i = hash_bytes(bytes) & (slots_.size() - 1);
      while (slots_[i].id >= 0) i = (i + 1) & (slots_.size() - 1);
      slots_[i] =
          Slot{static_cast<uint32_t>(storage_.size()), static_cast<uint32_t>(bytes.size()), id};
      storage_.append(bytes);
    }
  }
  int32_t find(std::string_view bytes) const {
    size_t i = hash_bytes(bytes) & (slots_.size() - 1);
    while (slots_[i].id >= 0) {
      const Slot& s = slots_[i];
      if (s.length == bytes.size() &&
          std::memcmp(storage_.data() + s.offset, bytes.data(), s.length) == 0)
        return s.id;
      i = (i + 1) & (slots_.size() - 1);
    }
    return -1;
  }

 private:
  struct Slot {
    uint32_t offset = 0, length = 0;
    int32_t id = -1;
  };
  std::vector<Slot> slots_;
  std::string storage_;
};

struct Merge {
  uint32_t rank = kNoRank;
  int32_t merged = -1;
};

// (left id, right id) -> merge, open addressing.
class PairTable {
 public:
  void reserve(size_t entries) { slots_.assign(table_capacity(entries), Slot{}); }
  // Keeps the first (highest-priority) merge of a pair.
  void insert(int32_t left, int32_t right, Merge merge) {
    const uint64_t key = pack(left, right);
    size_t i = mix(key) & (slots_.size() - 1);
    while (slots_[i].key != kEmpty) {
      if (slots_[i].key == key) {
        if (merge.rank < slots_[i].merge.rank) slots_[i].merge = merge;
        return;
      }
      i = (i + 1) & (slots_.size() - 1);
    }
    slots_[i] = Slot{key, merge};
  }
  Merge find(int32_t left, int32_t right) const {
    const uint64_t key = pack(left, right);
    size_t i = mix(key) & (slots_.size() - 1);
    while (slots_[i].key != kEmpty) {
      if (slots_[i].key == key) return slots_[i].merge;
      i = (i + 1) & (slots_.size() - 1);
    }
    return Merge{};
  }

 private:
  static constexpr uint64_t kEmpty = std::numeric_limits<uint64_t>::max();
  static uint64_t pack(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  struct Slot {
    uint64_t key = kEmpty;
    Merge merge;
  };
  std::vector<Slot> slots_;
};

std::string printable(std::string_view bytes) {
  std::string out;
  for (char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    if (b >= 0x20 && b < 0x7F) {
      out += c;
    } else {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02X", b);
      out += hex;
    }
  }
  return out;
}

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return hash_bytes(s); }
};

}  // namespace

struct BpeTokenizer::Tables {
  std::array<int32_t, 256> byte_ids{};
  TokenTable whole_pieces;  // tokens that BPE of their own bytes produces (direct lookup)
  PairTable merges;
  std::vector<std::string> id_bytes;  // decoding; specials hold their text
  std::vector<uint8_t> assigned;      // id_bytes[id] is a token
  std::array<bool, 256> special_first_byte{};
  std::vector<SpecialToken> specials_longest_first;
  std::optional<int32_t> end_of_text;
  std::unique_ptr<Pretokenizer> pretokenizer;
};

// Pieces already encoded; shards with their own lock so that threads rarely wait for each other.
struct BpeTokenizer::Cache {
  static constexpr size_t kShards = 16;
  static constexpr size_t kMaxEntriesPerShard = 1 << 15;
  struct Shard {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> entries;
  };
  std::array<Shard, kShards> shards;
};

namespace {

// BPE of `piece` into `out` by repeatedly merging the adjacent pair of lowest rank (leftmost on
// ties). Quadratic in the piece length, with all state on the stack: for pieces up to kSmall bytes.
constexpr size_t kSmall = 256;

template <typename Tables>
void merge_small(const Tables& t, std::string_view piece, std::vector<int32_t>& out) {
  const size_t n = piece.size();
  std::array<int32_t, kSmall> ids;
  std::array<Merge, kSmall> next;  // next[i]: merge of (ids[i], ids[i+1])
  for (size_t i = 0; i < n; ++i) ids[i] = t.byte_ids[static_cast<uint8_t>(piece[i])];
  size_t count = n;
  for (size_t i = 0; i + 1 < count; ++i) next[i] = t.merges.find(ids[i], ids[i + 1]);
  while (count > 1) {
    size_t best = 0;
    uint32_t best_rank = kNoRank;
    for (size_t i = 0; i + 1 < count; ++i) {
      if (next[i].rank < best_rank) {
        best_rank = next[i].rank;
        best = i;
      }
    }
    if (best_rank == kNoRank) break;
    ids[best] = next[best].merged;
    std::memmove(&ids[best + 1], &ids[best + 2], (count - best - 2) * sizeof(int32_t));
    std::memmove(&next[best], &next[best + 1], (count - best - 2) * sizeof(Merge));
    --count;
    if (best + 1 < count) next[best] = t.merges.find(ids[best], ids[best + 1]);
    if (best > 0) next[best - 1] = t.merges.find(ids[best - 1], ids[best]);
  }
  out.insert(out.end(), ids.begin(), ids.begin() + count);
}

// The same merges for long pieces: a doubly linked list of parts and a heap of candidate pairs
// ordered by (rank, position), O(n log n).
template <typename Tables>
void merge_long(const Tables& t, std::string_view piece, std::vector<int32_t>& out) {
  const size_t n = piece.size();
  std::vector<int32_t> ids(n), prev(n), next(n);
  for (size_t i = 0; i < n; ++i) {
    ids[i] = t.byte_ids[static_cast<uint8_t>(piece[i])];
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  struct Candidate {
    uint32_t rank;
    int32_t left, left_id, right_id, merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int32_t left) {
    if (left < 0 || next[left] < 0) return;
    const Merge m = t.merges.find(ids[left], ids[next[left]]);
    if (m.rank != kNoRank) heap.push({m.rank, left, ids[left], ids[next[left]], m.merged});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  std::vector<uint8_t> alive(n, 1);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const int32_t right = next[c.left];
    if (!alive[c.left] || right < 0 || ids[c.left] != c.left_id || ids[right] != c.right_id)
      continue;  // stale: one side has merged since
    ids[c.left] = c.merged;
    alive[right] = 0;
    next[c.left] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.left;
    push(prev[c.left]);
    push(c.left);
  }
  for (int32_t i = 0; i >= 0; i = next[i]) out.push_back(ids[i]);
}

}  // namespace

BpeTokenizer::BpeTokenizer(BpeModel model)
    : model_(std::move(model)), cache_(std::make_unique<Cache>()) {
  auto tables = std::make_unique<Tables>();
  Tables& t = *tables;
  t.byte_ids.fill(-1);
  t.pretokenizer = std::make_unique<Pretokenizer>(model_.pattern);

  int32_t max_id = -1;
  for (const auto& token : model_.tokens) {
    if (token.id < 0)
      throw Error("token '" + printable(token.bytes) + "' has negative id " +
                  std::to_string(token.id) + ": ids must be >= 0");
    if (token.bytes.empty())
      throw Error("token id " + std::to_string(token.id) +
                  " is empty: every token needs at least one byte");
    max_id = std::max(max_id, token.id);
  }
  for (const auto& special : model_.special_tokens) {
    if (special.id < 0)
      throw Error("special token '" + special.text + "' has negative id " +
                  std::to_string(special.id) + ": ids must be >= 0");
    if (special.text.empty())
      throw Error("special token id " + std::to_string(special.id) + " has empty text");
    max_id = std::max(max_id, special.id);
  }
  const size_t count = model_.tokens.size() + model_.special_tokens.size();
  if (!(static_cast<size_t>(max_id) < count + (size_t{1} << 20)))
    throw Error("the largest id, " + std::to_string(max_id) + ", is far beyond the " +
                std::to_string(count) + " tokens: ids must be dense (gaps below 2^20 in total)");
  t.id_bytes.assign(static_cast<size_t>(max_id + 1), std::string());
  t.assigned.assign(static_cast<size_t>(max_id + 1), 0);
  auto assign = [&](int32_t id, const std::string& bytes) {
    if (t.assigned[id])
      throw Error("id " + std::to_string(id) + " is given to both '" + printable(t.id_bytes[id]) +
                  "' and '" + printable(bytes) + "': every id must name one token");
    t.assigned[id] = 1;
    t.id_bytes[id] = bytes;
  };

  // Ordinary tokens: the full table (for merges) first.
  TokenTable all_tokens;
  std::vector<std::pair<std::string_view, int32_t>> entries;
  entries.reserve(model_.tokens.size());
  for (const auto& token : model_.tokens) {
    assign(token.id, token.bytes);
    entries.emplace_back(token.bytes, token.id);
  }
  {
    std::unordered_map<std::string_view, int32_t> by_bytes;
    for (const auto& [bytes, id] : entries) {
      auto [it, inserted] = by_bytes.emplace(bytes, id);
      if (!inserted)
        throw Error("token '" + printable(bytes) + "' appears twice (ids " +
                    std::to_string(it->second) + " and " + std::to_string(id) +
                    "): every token must be listed once");
    }
  }
  all_tokens.build(entries);
  for (int b = 0; b < 256; ++b) {
    const char byte = static_cast<char>(b);
    t.byte_ids[b] = all_tokens.find(std::string_view(&byte, 1));
    char hex[8];
    std::snprintf(hex, sizeof(hex), "0x%02X", b);
    if (t.byte_ids[b] < 0)
      throw Error(std::string("the vocabulary has no token for the single byte ") + hex +
                  ": a byte-level BPE vocabulary needs all 256 bytes");
  }

  // Merges.
  if (!model_.merges.empty()) {
    t.merges.reserve(model_.merges.size());
    for (size_t rank = 0; rank < model_.merges.size(); ++rank) {
      const std::string& left = model_.merges[rank].first;
      const std::string& right = model_.merges[rank].second;
      const int32_t left_id = all_tokens.find(left);
      const int32_t right_id = all_tokens.find(right);
      const std::string joined = left + right;
      const int32_t merged = all_tokens.find(joined);
      auto which = [&] {
        return "merge " + std::to_string(rank + 1) + " ('" + printable(left) + "' + '" +
               printable(right) + "')";
      };
      if (!(left_id >= 0 && right_id >= 0))
        throw Error(which() +
                    " names a part that is not in the vocabulary: every part must be a token");
      if (merged < 0)
        throw Error(which() + " makes '" + printable(joined) +
                    "', which is not in the vocabulary: add it or drop the merge");
      t.merges.insert(left_id, right_id, Merge{static_cast<uint32_t>(rank), merged});
    }
  } else {  // tiktoken ranks: any split of a token into two tokens merges into it, rank = its id
    size_t splits = 0;
    for (const auto& token : model_.tokens) splits += token.bytes.size() - 1;
    t.merges.reserve(splits);
    for (const auto& token : model_.tokens) {
      const std::string_view bytes = token.bytes;
      for (size_t cut = 1; cut < bytes.size(); ++cut) {
        const int32_t left = all_tokens.find(bytes.substr(0, cut));
        const int32_t right = all_tokens.find(bytes.substr(cut));
        if (left >= 0 && right >= 0)
          t.merges.insert(left, right, Merge{static_cast<uint32_t>(token.id), token.id});
      }
    }
  }

  // Direct lookup: a piece equal to a token encodes as that token when BPE of its bytes says so
  // (tiktoken models: always, as tiktoken does).
  {
    std::vector<std::pair<std::string_view, int32_t>> whole;
    whole.reserve(entries.size());
    std::vector<int32_t> ids;
    for (const auto& [bytes, id] : entries) {
      if (!model_.merges.empty() && !model_.ignore_merges) {
        ids.clear();
        if (bytes.size() <= kSmall)
          merge_small(t, bytes, ids);
        else
          merge_long(t, bytes, ids);
        if (ids.size() != 1 || ids[0] != id) continue;
      }
      whole.emplace_back(bytes, id);
    }
    t.whole_pieces.build(whole);
  }

  // Special tokens.
  for (const auto& special : model_.special_tokens) {
    assign(special.id, special.text);
    t.special_first_byte[static_cast<uint8_t>(special.text[0])] = true;
    t.specials_longest_first.push_back(special);
    if (!t.end_of_text && (special.text == "<|endoftext|>" || special.text == "<|end_of_text|>"))
      t.end_of_text = special.id;
  }
  std::stable_sort(
      t.specials_longest_first.begin(), t.specials_longest_first.end(),
      [](const SpecialToken& a, const SpecialToken& b) { return a.text.size() > b.text.size(); });
  tables_ = std::move(tables);
}

BpeTokenizer::~BpeTokenizer() = default;

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  const Tables& t = *tables_;
  if (piece.size() == 1) {
    out.push_back(t.byte_ids[static_cast<uint8_t>(piece[0])]);
    return;
  }
  if (const int32_t id = t.whole_pieces.find(piece); id >= 0) {
    out.push_back(id);
    return;
  }
  Cache::Shard& shard = cache_->shards[hash_bytes(piece) % Cache::kShards];
  {
    std::lock_guard lock(shard.mutex);
    if (auto it = shard.entries.find(piece); it != shard.entries.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = out.size();
  if (piece.size() <= kSmall)
    merge_small(t, piece, out);
  else
    merge_long(t, piece, out);
  std::lock_guard lock(shard.mutex);
  if (shard.entries.size() >= Cache::kMaxEntriesPerShard) shard.entries.clear();
  shard.entries.emplace(std::string(piece), std::vector<int32_t>(out.begin() + start, out.end()));
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool allow_special) const {
  const Tables& t = *tables_;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 16);
  auto encode_ordinary = [&](std::string_view part) {
    t.pretokenizer->split(part, [&](std::string_view piece) { encode_piece(piece, ids); });
  };
  if (!allow_special || t.specials_longest_first.empty()) {
    encode_ordinary(text);
    return ids;
  }
  size_t start = 0;  // first byte not yet encoded
  for (size_t i = 0; i < text.size(); ++i) {
    if (!t.special_first_byte[static_cast<uint8_t>(text[i])]) continue;
    for (const auto& special : t.specials_longest_first) {
      if (text.substr(i).starts_with(special.text)) {
        encode_ordinary(text.substr(start, i - start));
        ids.push_back(special.id);
        start = i + special.text.size();
        i = start - 1;
        break;
      }
    }
  }
  encode_ordinary(text.substr(start));
  return ids;
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  const Tables& t = *tables_;
  std::string bytes;
  for (const int32_t id : ids) {
    if (!(id >= 0 && static_cast<size_t>(id) < t.assigned.size() && t.assigned[id]))
      throw Error("token id " + std::to_string(id) + " is outside the vocabulary of " + name() +
                  ": decode ids the same tokenizer produced");
    bytes += t.id_bytes[id];
  }
  return bytes;
}

int64_t BpeTokenizer::vocab_size() const {
  return static_cast<int64_t>(tables_->assigned.size());
}

std::optional<int32_t> BpeTokenizer::end_of_text() const {
  return tables_->end_of_text;
}

std::string BpeTokenizer::name() const {
  return "bpe " + model_.name + " (" + std::to_string(vocab_size()) + ")";
}

std::optional<int32_t> BpeTokenizer::special_token(std::string_view text) const {
  for (const auto& special : model_.special_tokens)
    if (special.text == text) return special.id;
  return std::nullopt;
}

}  // namespace lattice::data
