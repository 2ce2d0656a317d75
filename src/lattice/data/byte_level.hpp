// Byte-level alphabet of GPT-2's BPE: every byte 0..255 stands for one printable Unicode character
// (printable Latin-1 bytes for themselves, the others for U+0100.. in order), so that token strings
// in encoder.json / vocab.json / merges.txt / tokenizer.json are readable text. Converts token
// strings of that alphabet to the raw bytes they stand for and back.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace lattice::data {

// The Unicode code point GPT-2's table assigns to `byte`.
char32_t byte_to_unicode(uint8_t byte);

// The UTF-8 string of code points that stand for `bytes` (e.g. " hi" -> "Ġhi").
std::string bytes_to_unicode_string(std::string_view bytes);

// The bytes a string of byte-level characters stands for ("Ġhi" -> " hi"); nullopt when `text` is
// not valid UTF-8 or holds a character outside the 256 of the table.
std::optional<std::string> unicode_string_to_bytes(std::string_view text);

}  // namespace lattice::data
