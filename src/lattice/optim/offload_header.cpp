// Offload header encoding: see offload_header.hpp. Layout (little-endian as the host writes it):
//   "LATOFF01" | u32 version | i32 streams | i64 numel | i64 chunk_elements | u64 generation |
//   i64 last_step | i32 active_slot | u64 chunk_count | u32 crc[chunk_count] | u32 crc of all
//   before
#include "lattice/optim/offload_header.hpp"

#include <cstring>

#include "lattice/core/error.hpp"
#include "lattice/optim/offload_file.hpp"

namespace lattice::optim {
namespace {

constexpr char kMagic[8] = {'L', 'A', 'T', 'O', 'F', 'F', '0', '1'};
constexpr uint32_t kVersion = 1;

template <class T>
void put(std::vector<uint8_t>& out, T value) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &value, sizeof(T));
}

class Reader {
 public:
  Reader(const std::vector<uint8_t>& bytes, const std::string& path) : bytes_(bytes), path_(path) {}
  template <class T>
  T get() {
    if (position_ + sizeof(T) > bytes_.size()) fail("is truncated");
    T value;
    std::memcpy(&value, bytes_.data() + position_, sizeof(T));
    position_ += sizeof(T);
    return value;
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw Error("offload header " + path_ + " " + what +
                "; delete the offload directory and restore the optimizer state from a checkpoint");
  }
  size_t position() const { return position_; }

 private:
  const std::vector<uint8_t>& bytes_;
  const std::string& path_;
  size_t position_ = 0;
};

}  // namespace

std::vector<uint8_t> OffloadHeader::encode() const {
  std::vector<uint8_t> out(kMagic, kMagic + sizeof(kMagic));
  put(out, kVersion);
  put(out, streams);
  put(out, numel);
  put(out, chunk_elements);
  put(out, generation);
  put(out, last_step);
  put(out, active_slot);
  put(out, static_cast<uint64_t>(chunk_crcs.size()));
  for (uint32_t crc : chunk_crcs) put(out, crc);
  put(out, crc32c(out.data(), out.size()));
  return out;
}

OffloadHeader OffloadHeader::decode(const std::vector<uint8_t>& bytes, const std::string& path) {
  Reader in(bytes, path);
  if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    in.fail("is not a Lattice offload header (wrong magic)");
  }
  for (size_t i = 0; i < sizeof(kMagic); ++i) in.get<char>();
  const auto version = in.get<uint32_t>();
  if (version != kVersion) in.fail("has version " + std::to_string(version) + ", expected 1");
  OffloadHeader h;
  h.streams = in.get<int32_t>();
  h.numel = in.get<int64_t>();
  h.chunk_elements = in.get<int64_t>();
  h.generation = in.get<uint64_t>();
  h.last_step = in.get<int64_t>();
  h.active_slot = in.get<int32_t>();
  const auto chunks = in.get<uint64_t>();
  if ((h.streams != 2 && h.streams != 3) || h.numel < 0 || h.chunk_elements <= 0 ||
      (h.active_slot != 0 && h.active_slot != 1) ||
      chunks != static_cast<uint64_t>(h.chunk_count())) {
    in.fail("holds impossible values (corrupt)");
  }
  if (bytes.size() != in.position() + 4 * chunks + 4) in.fail("has the wrong size (corrupt)");
  h.chunk_crcs.resize(chunks);
  for (auto& crc : h.chunk_crcs) crc = in.get<uint32_t>();
  const size_t covered = in.position();
  if (in.get<uint32_t>() != crc32c(bytes.data(), covered)) in.fail("fails its checksum (corrupt)");
  return h;
}

}  // namespace lattice::optim
