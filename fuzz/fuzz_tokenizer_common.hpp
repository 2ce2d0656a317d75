// Shared by the tokenizer fuzz targets: after a fuzzed file loads, the tokenizer it gives must
// round-trip text; anything else a loader does with bad input must be a lattice::Error.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "lattice/data/tokenizer.hpp"

namespace lattice::fuzz {

// Aborts (a finding) when `tokenizer` does not decode its own encoding of `text` to `text`.
inline void require_round_trip(const data::Tokenizer& tokenizer, std::string_view text,
                               bool allow_special) {
  const std::string decoded = tokenizer.decode(tokenizer.encode(text, allow_special));
  if (decoded != text) {
    std::fprintf(stderr, "round trip failed for %zu bytes with %s\n", text.size(),
                 tokenizer.name().c_str());
    std::abort();
  }
}

inline void exercise(const data::Tokenizer& tokenizer) {
  require_round_trip(tokenizer, "Hello, world! It's 2026: naïve café 😀\n\n  x<|endoftext|>", false);
  require_round_trip(tokenizer, std::string_view("\xFF\xC3(\x80 ab", 8), true);
}

}  // namespace lattice::fuzz
