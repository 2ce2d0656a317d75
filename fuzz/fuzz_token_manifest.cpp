// libFuzzer target: the dataset manifest reader on arbitrary text. Any input must either be
// refused with lattice::Error or give a manifest whose shard token counts add up to its totals.
#include <cstddef>
#include <cstdint>
#include <string>

#include "lattice/core/error.hpp"
#include "lattice/data/dataset_manifest.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto m = lattice::data::parse_manifest(
        std::string(reinterpret_cast<const char*>(data), size), "fuzz.json");
    int64_t train = 0;
    for (const auto& s : m.shards)
      if (s.split == "train") train += s.tokens;
    if (train != m.train_tokens) __builtin_trap();
    (void)m.to_json();
  } catch (const lattice::Error&) {
  }
  return 0;
}
