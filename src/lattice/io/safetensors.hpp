// Safetensors (the Hugging Face tensor file format): a validating reader and an atomic writer.
// Layout: 8-byte little-endian header length N, N bytes of JSON header
// {"__metadata__": {str: str}, name: {"dtype", "shape", "data_offsets": [begin, end]}, ...} padded
// with spaces to a multiple of 8, then the tensor bytes (offsets relative to the end of the
// header).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lattice/core/dtype.hpp"
#include "lattice/core/memory.hpp"
#include "lattice/core/tensor.hpp"

namespace lattice {

// One tensor of a safetensors file. When read, `data` points into the open file's mapping (valid
// while the SafetensorsFile lives; not necessarily aligned) and `data_begin` is its offset in the
// data section.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  const void* data = nullptr;
  size_t nbytes = 0;
  uint64_t data_begin = 0;
};

// An entry that refers to a tensor's storage (the tensor must outlive the write).
SafetensorsEntry safetensors_entry(std::string name, const Tensor& tensor);

// "F32", "BF16", "F16", "I32", "I64", "U8" <-> DType.
std::string_view safetensors_dtype_name(DType dtype);
std::optional<DType> parse_safetensors_dtype(std::string_view name);

// Writes `entries` atomically (temp file, fsync, rename). Header keys are sorted ("__metadata__"
// first, as the reference implementation writes it), data is stored contiguously in the order
// given, and the header is space-padded to a multiple of 8. Throws Error on a duplicate or reserved
// name, or an entry whose nbytes disagrees with its dtype and shape.
void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                       const std::map<std::string, std::string>& metadata = {});

// The bytes of `n` fp32 values stored as `dtype` (what a SafetensorsEntry of that dtype holds):
// F32 is copied, BF16 and F16 are rounded to nearest even, so read_f32 gives back the values
// rounded. F16 refuses a finite value beyond its range (|v| > 65504) with an Error naming the
// tensor `name`; any other dtype is an Error.
std::vector<uint8_t> f32_as_dtype(const float* values, int64_t n, DType dtype,
                                  const std::string& name);

// An open, fully validated safetensors file (memory-mapped read-only). The constructor rejects any
// truncated or corrupt file with one Error line that names the file and what is wrong: header
// length beyond the file, invalid JSON, unknown dtype, shape/size disagreement, offsets outside the
// data section or overlapping, malformed metadata. Gaps between tensors are tolerated.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(std::string path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Tensor names in sorted order.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  // Throws Error naming the tensor and the file when absent.
  const SafetensorsEntry& entry(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Copies a tensor into `dst`, which must already have the stored dtype and shape (Error
  // otherwise, naming the tensor, the expected and the found shape/dtype).
  void read_into(const std::string& name, Tensor& dst) const;
  // A new tensor with the stored dtype and shape.
  Tensor read(const std::string& name, MemoryTracker* tracker = nullptr,
              MemoryCategory category = MemoryCategory::other) const;
  // Copies a tensor of n elements as fp32; F32 is copied, BF16 and F16 are widened exactly. Any
  // other dtype, or n different from the stored element count, is an Error.
  void read_f32(const std::string& name, float* dst, int64_t n) const;

 private:
  void close() noexcept;

  std::string path_;
  void* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace lattice
