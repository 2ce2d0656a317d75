// libFuzzer target: the Megatron .idx parser on arbitrary bytes. The first 4 bytes give the size of
// the .bin the index is checked against (so both matching and mismatching sizes are explored);
// the rest is the index. Any input must either be refused with lattice::Error or describe tokens
// that can all be read from a .bin of that size.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/data/megatron_dataset.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  uint32_t bin_bytes;
  std::memcpy(&bin_bytes, data, 4);
  bin_bytes %= 1u << 16;  // a .bin small enough to allocate
  try {
    const auto index =
        lattice::data::parse_megatron_index(std::span(data + 4, size - 4), bin_bytes, "fuzz");
    std::vector<uint8_t> bin(bin_bytes, 0x5a);
    lattice::data::TokenArray tokens{bin.data(), 0, index.type};
    tokens.count = static_cast<int64_t>(bin_bytes) / lattice::data::token_type_size(index.type);
    std::vector<int32_t> out(static_cast<size_t>(tokens.count));
    tokens.read(0, tokens.count, out.data());
    if (index.total_tokens() != tokens.count) __builtin_trap();  // parse must have refused this
  } catch (const lattice::Error&) {
  }
  return 0;
}
