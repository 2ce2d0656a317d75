// Megatron indexed datasets: see megatron_dataset.hpp.
#include "lattice/data/megatron_dataset.hpp"

#include <cstring>

#include "lattice/core/error.hpp"
#include "lattice/io/atomic_file.hpp"

namespace lattice::data {

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};

// Sequential little-endian reads from the index with one truncation message.
class IndexCursor {
 public:
  IndexCursor(std::span<const uint8_t> bytes, const std::string& name)
      : bytes_(bytes), name_(name) {}
  void need(uint64_t n, const char* what) const {
    check(n <= bytes_.size() - pos_, "Megatron index " + name_ + " is truncated: it ends inside " +
                                         what + "; regenerate the .idx file");
  }
  template <class T>
  T take(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  template <class T>
  std::vector<T> take_array(uint64_t count, const char* what) {
    check(count <= (bytes_.size() - pos_) / sizeof(T), "Megatron index " + name_ +
                                                           " is truncated: it ends inside " + what +
                                                           "; regenerate the .idx file");
    std::vector<T> out(count);
    if (count > 0) std::memcpy(out.data(), bytes_.data() + pos_, count * sizeof(T));
    pos_ += count * sizeof(T);
    return out;
  }
  size_t remaining() const { return bytes_.size() - pos_; }

 private:
  std::span<const uint8_t> bytes_;
  const std::string& name_;
  size_t pos_ = 0;
};

}  // namespace

TokenType megatron_token_type(uint8_t code, const std::string& file) {
  switch (code) {
    case 1:
      return TokenType::uint8;
    case 2:
      return TokenType::int8;
    case 3:
      return TokenType::int16;
    case 4:
      return TokenType::int32;
    case 5:
      return TokenType::int64;
    case 8:
      return TokenType::uint16;
    default:
      throw Error("Megatron index " + file + " has dtype code " + std::to_string(code) +
                  ", which is not an integer token type (1-5 or 8): regenerate it with "
                  "integer tokens");
  }
}

uint8_t megatron_dtype_code(TokenType type) {
  switch (type) {
    case TokenType::uint8:
      return 1;
    case TokenType::int8:
      return 2;
    case TokenType::int16:
      return 3;
    case TokenType::int32:
      return 4;
    case TokenType::int64:
      return 5;
    case TokenType::uint16:
      return 8;
    case TokenType::uint32:
      break;
  }
  throw Error("Megatron datasets have no uint32 dtype: use int32 or int64");
}

int64_t MegatronIndex::total_tokens() const {
  int64_t total = 0;
  for (int32_t n : sequence_lengths) total += n;
  return total;
}

MegatronIndex parse_megatron_index(std::span<const uint8_t> bytes, int64_t bin_bytes,
                                   const std::string& name) {
  IndexCursor in(bytes, name);
  in.need(sizeof(kMagic), "the magic");
  check(std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) == 0,
        "file " + name +
            " is not a Megatron index: bad magic (expected \"MMIDIDX\\0\\0\"); check data.format "
            "and the prefix");
  in.take_array<uint8_t>(sizeof(kMagic), "the magic");
  const auto version = in.take<uint64_t>("the version");
  check(version == 1, "Megatron index " + name + " has version " + std::to_string(version) +
                          ": only version 1 is supported");
  MegatronIndex index;
  index.type = megatron_token_type(in.take<uint8_t>("the dtype code"), name);
  const auto sequences = in.take<uint64_t>("the sequence count");
  const auto documents = in.take<uint64_t>("the document count");
  index.sequence_lengths = in.take_array<int32_t>(sequences, "the sequence lengths");
  index.sequence_pointers = in.take_array<int64_t>(sequences, "the sequence pointers");
  index.document_indices = in.take_array<int64_t>(documents, "the document indices");
  check(in.remaining() == 0, "Megatron index " + name + " has " + std::to_string(in.remaining()) +
                                 " bytes after the document indices: the file is corrupt (or a "
                                 "multimodal index, which is not supported)");
  const int64_t width = token_type_size(index.type);
  int64_t offset = 0;
  for (uint64_t i = 0; i < sequences; ++i) {
    check(index.sequence_lengths[i] >= 0 && index.sequence_pointers[i] == offset,
          "Megatron index " + name + ": sequence " + std::to_string(i) + " has length " +
              std::to_string(index.sequence_lengths[i]) + " at byte " +
              std::to_string(index.sequence_pointers[i]) +
              ", expected the sequences back to back "
              "(byte " +
              std::to_string(offset) + "); the index is corrupt, regenerate it");
    offset += index.sequence_lengths[i] * width;
  }
  check(!index.document_indices.empty() && index.document_indices.front() == 0 &&
            index.document_indices.back() == static_cast<int64_t>(sequences),
        "Megatron index " + name +
            ": the document indices must run from 0 to the sequence count (" +
            std::to_string(sequences) + "); the index is corrupt, regenerate it");
  for (size_t i = 1; i < index.document_indices.size(); ++i)
    check(index.document_indices[i] >= index.document_indices[i - 1],
          "Megatron index " + name + ": document index " + std::to_string(i) +
              " decreases; the index is corrupt, regenerate it");
  check(bin_bytes == offset,
        "Megatron dataset " + name + ": the index describes " + std::to_string(offset) +
            " bytes of tokens but the .bin file has " + std::to_string(bin_bytes) +
            "; the .bin is truncated or belongs to another index");
  check(offset > 0, "Megatron dataset " + name + " holds no tokens: give a non-empty dataset");
  return index;
}

void write_megatron_dataset(const std::string& prefix,
                            const std::vector<std::vector<int32_t>>& documents, TokenType type) {
  const int64_t width = token_type_size(type);
  const uint8_t code = megatron_dtype_code(type);
  AtomicFileWriter bin(prefix + ".bin");
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers;
  int64_t offset = 0;
  std::vector<uint8_t> buffer;
  for (const auto& doc : documents) {
    check(doc.size() <= static_cast<size_t>(INT32_MAX),
          "a Megatron sequence holds at most 2^31-1 tokens");
    buffer.resize(doc.size() * static_cast<size_t>(width));
    for (size_t i = 0; i < doc.size(); ++i) {
      const int64_t id = doc[i];
      switch (type) {
        case TokenType::uint8:
        case TokenType::int8:
          buffer[i] = static_cast<uint8_t>(id);
          break;
        case TokenType::int16:
        case TokenType::uint16: {
          const auto v = static_cast<uint16_t>(id);
          std::memcpy(&buffer[i * 2], &v, 2);
          break;
        }
        case TokenType::int32:
        case TokenType::uint32: {
          const auto v = static_cast<uint32_t>(id);
          std::memcpy(&buffer[i * 4], &v, 4);
          break;
        }
        case TokenType::int64:
          std::memcpy(&buffer[i * 8], &id, 8);
          break;
      }
    }
    bin.write(buffer.data(), buffer.size());
    lengths.push_back(static_cast<int32_t>(doc.size()));
    pointers.push_back(offset);
    offset += static_cast<int64_t>(buffer.size());
  }
  std::vector<int64_t> document_indices(documents.size() + 1);
  for (size_t i = 0; i < document_indices.size(); ++i)
    document_indices[i] = static_cast<int64_t>(i);
  AtomicFileWriter idx(prefix + ".idx");
  idx.write(kMagic, sizeof(kMagic));
  const uint64_t version = 1, sequences = lengths.size(), docs = document_indices.size();
  idx.write(&version, sizeof(version));
  idx.write(&code, 1);
  idx.write(&sequences, sizeof(sequences));
  idx.write(&docs, sizeof(docs));
  idx.write(lengths.data(), lengths.size() * sizeof(int32_t));
  idx.write(pointers.data(), pointers.size() * sizeof(int64_t));
  idx.write(document_indices.data(), document_indices.size() * sizeof(int64_t));
  bin.commit();
  idx.commit();
}

MegatronDataset::MegatronDataset(const std::string& prefix, int64_t vocab_size)
    : bin_(prefix + ".bin"),
      idx_(prefix + ".idx"),
      index_(parse_megatron_index(idx_.bytes(), static_cast<int64_t>(bin_.size()), prefix)),
      vocab_size_(vocab_size) {
  tokens_.data = bin_.bytes().data();
  tokens_.type = index_.type;
  tokens_.count = static_cast<int64_t>(bin_.size()) / token_type_size(index_.type);
  if (vocab_size > 0)
    tokens_.check_ids(vocab_size, prefix + ".bin");
  else
    vocab_size_ = int64_t{1} << 31;
}

}  // namespace lattice::data
