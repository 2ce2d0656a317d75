// libFuzzer target: the llm.c shard parser on arbitrary bytes. Any input must either be refused
// with lattice::Error or give tokens that can all be read and checked against a vocabulary.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/data/llmc_shard.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto tokens = lattice::data::parse_llmc_shard(std::span(data, size), "fuzz.bin");
    std::vector<int32_t> out(static_cast<size_t>(tokens.count));
    tokens.read(0, tokens.count, out.data());
    tokens.check_ids(50257, "fuzz.bin");
  } catch (const lattice::Error&) {
  }
  return 0;
}
