// Byte-level alphabet of GPT-2's BPE: see byte_level.hpp.
#include "lattice/data/byte_level.hpp"

#include <array>

namespace lattice::data {
namespace {

// GPT-2's bytes_to_unicode(): bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF map to themselves, the
// other 68 bytes (in increasing order) to U+0100, U+0101, ...
constexpr std::array<char32_t, 256> make_byte_table() {
  std::array<char32_t, 256> table{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    table[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return table;
}
constexpr std::array<char32_t, 256> kByteToUnicode = make_byte_table();

// Code points in the table are all below U+0144: index them directly.
constexpr char32_t kMaxCodePoint = 0x144;
constexpr std::array<int16_t, kMaxCodePoint> make_unicode_table() {
  std::array<int16_t, kMaxCodePoint> table{};
  for (auto& t : table) t = -1;
  for (int b = 0; b < 256; ++b) table[kByteToUnicode[b]] = static_cast<int16_t>(b);
  return table;
}
constexpr std::array<int16_t, kMaxCodePoint> kUnicodeToByte = make_unicode_table();

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else {  // every code point of the table is below U+0800: two bytes
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace

char32_t byte_to_unicode(uint8_t byte) {
  return kByteToUnicode[byte];
}

std::string bytes_to_unicode_string(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) append_utf8(out, kByteToUnicode[static_cast<uint8_t>(c)]);
  return out;
}

std::optional<std::string> unicode_string_to_bytes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto c0 = static_cast<uint8_t>(text[i]);
    char32_t cp;
    if (c0 < 0x80) {
      cp = c0;
      i += 1;
    } else if ((c0 & 0xE0) == 0xC0 && i + 1 < text.size() &&
               (static_cast<uint8_t>(text[i + 1]) & 0xC0) == 0x80) {
      cp = (static_cast<char32_t>(c0 & 0x1F) << 6) | (static_cast<uint8_t>(text[i + 1]) & 0x3F);
      i += 2;
      if (cp < 0x80) return std::nullopt;  // overlong encoding
    } else {
      return std::nullopt;  // not UTF-8, or a code point above U+07FF: outside the table
    }
    if (cp >= kMaxCodePoint || kUnicodeToByte[cp] < 0) return std::nullopt;
    out += static_cast<char>(kUnicodeToByte[cp]);
  }
  return out;
}

}  // namespace lattice::data
