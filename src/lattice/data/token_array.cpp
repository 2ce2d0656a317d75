// TokenArray: see token_array.hpp.
#include "lattice/data/token_array.hpp"

#include <cstring>

#include "lattice/core/error.hpp"

namespace lattice::data {

int64_t token_type_size(TokenType type) {
  switch (type) {
    case TokenType::uint8:
    case TokenType::int8:
      return 1;
    case TokenType::int16:
    case TokenType::uint16:
      return 2;
    case TokenType::int32:
    case TokenType::uint32:
      return 4;
    case TokenType::int64:
      return 8;
  }
  return 0;
}

std::string token_type_name(TokenType type) {
  switch (type) {
    case TokenType::uint8:
      return "uint8";
    case TokenType::int8:
      return "int8";
    case TokenType::int16:
      return "int16";
    case TokenType::uint16:
      return "uint16";
    case TokenType::int32:
      return "int32";
    case TokenType::uint32:
      return "uint32";
    case TokenType::int64:
      return "int64";
  }
  return "unknown";
}

namespace {
template <class T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // unaligned-safe; the files are little-endian like the host
  return v;
}
}  // namespace

int64_t TokenArray::at(int64_t i) const {
  const uint8_t* p = data + i * token_type_size(type);
  switch (type) {
    case TokenType::uint8:
      return *p;
    case TokenType::int8:
      return static_cast<int8_t>(*p);
    case TokenType::int16:
      return load<int16_t>(p);
    case TokenType::uint16:
      return load<uint16_t>(p);
    case TokenType::int32:
      return load<int32_t>(p);
    case TokenType::uint32:
      return load<uint32_t>(p);
    case TokenType::int64:
      return load<int64_t>(p);
  }
  return 0;
}

void TokenArray::read(int64_t offset, int64_t n, int32_t* out) const {
  check(offset >= 0 && n >= 0 && offset + n <= count,
        "read of tokens [" + std::to_string(offset) + ", " + std::to_string(offset + n) +
            ") outside a token array of " + std::to_string(count));
  if (type == TokenType::uint16) {
    const uint8_t* p = data + offset * 2;
    for (int64_t i = 0; i < n; ++i) out[i] = load<uint16_t>(p + 2 * i);
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(at(offset + i));
}

void TokenArray::check_ids(int64_t vocab_size, const std::string& file) const {
  if (type == TokenType::uint16 && vocab_size >= 65536) return;
  if (type == TokenType::uint8 && vocab_size >= 256) return;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t id = at(i);
    if (id < 0 || id >= vocab_size)
      throw Error("token file " + file + ": token " + std::to_string(i) + " has id " +
                  std::to_string(id) + ", outside the vocabulary [0, " +
                  std::to_string(vocab_size) +
                  "): prepare the file with the tokenizer the model uses, or raise "
                  "model.vocab_size");
  }
}

}  // namespace lattice::data
