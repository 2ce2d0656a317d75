// Safetensors reader and writer: see safetensors.hpp.
#include "lattice/io/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "lattice/core/error.hpp"
#include "lattice/io/atomic_file.hpp"

namespace lattice {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

// The reference implementation refuses headers above 100 MB; so do we (a larger length is garbage).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";
constexpr const char* kDamagedFix =
    "; the file is damaged, re-create it or resume from an earlier checkpoint";

std::string single_quoted(const std::string& name) {
  return "'" + name + "'";
}

// Parses and checks one header entry; `fail` prefixes the file name.
class HeaderChecker {
 public:
  explicit HeaderChecker(const std::string& path) : path_(path) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw Error("safetensors file " + path_ + " " + what + kDamagedFix);
  }

  uint64_t non_negative_integer(const nlohmann::json& value, const std::string& tensor,
                                const char* field) const {
    if (value.is_number_unsigned()) return value.get<uint64_t>();
    if (value.is_number_integer()) {
      fail("has tensor " + single_quoted(tensor) + " with negative " + field + " " + value.dump());
    }
    fail("has tensor " + single_quoted(tensor) + " whose " + field + " " + value.dump() +
         " is not an integer");
  }

  SafetensorsEntry parse_entry(const std::string& name, const nlohmann::json& spec) const {
    if (!spec.is_object())
      fail("has tensor " + single_quoted(name) + " whose header entry is not an object");
    for (const char* field : {"dtype", "shape", "data_offsets"}) {
      if (!spec.contains(field))
        fail("has tensor " + single_quoted(name) + " without \"" + field + "\"");
    }
    SafetensorsEntry entry;
    entry.name = name;
    const nlohmann::json& dtype = spec["dtype"];
    if (!dtype.is_string())
      fail("has tensor " + single_quoted(name) + " whose dtype is not a string");
    std::optional<DType> parsed = parse_safetensors_dtype(dtype.get<std::string>());
    // A dtype of the format Lattice does not read (F64, I8, ...) is not damage: say what to do.
    if (!parsed)
      throw Error("safetensors file " + path_ + " has tensor " + single_quoted(name) +
                  " with unknown dtype \"" + dtype.get<std::string>() +
                  "\" (supported: F32, BF16, F16, I32, I64, U8): convert it (a Hugging Face model: "
                  "save it in float32, bfloat16 or float16)");
    entry.dtype = *parsed;

    const nlohmann::json& shape = spec["shape"];
    if (!shape.is_array()) fail("has tensor " + single_quoted(name) + " whose shape is not a list");
    uint64_t numel = 1;
    for (const nlohmann::json& dim : shape) {
      uint64_t extent = non_negative_integer(dim, name, "shape dimension");
      if (extent > static_cast<uint64_t>(INT64_MAX) ||
          __builtin_mul_overflow(numel, extent, &numel)) {
        fail("has tensor " + single_quoted(name) + " whose shape " + shape.dump() + " overflows");
      }
      entry.shape.push_back(static_cast<int64_t>(extent));
    }
    uint64_t nbytes = 0;
    if (__builtin_mul_overflow(numel, dtype_size(entry.dtype), &nbytes)) {
      fail("has tensor " + single_quoted(name) + " whose shape " + shape.dump() + " overflows");
    }

    const nlohmann::json& offsets = spec["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2) {
      fail("has tensor " + single_quoted(name) + " whose data_offsets " + offsets.dump() +
           " is not [begin, end]");
    }
    uint64_t begin = non_negative_integer(offsets[0], name, "data offset");
    uint64_t end = non_negative_integer(offsets[1], name, "data offset");
    if (end < begin) {
      fail("has tensor " + single_quoted(name) + " whose data_offsets " + offsets.dump() +
           " end before they begin");
    }
    if (end - begin != nbytes) {
      fail("has tensor " + single_quoted(name) + " of dtype " + dtype.get<std::string>() +
           " and shape " + shape_string(entry.shape) + " (" + std::to_string(nbytes) +
           " bytes) but data_offsets " + offsets.dump() + " span " + std::to_string(end - begin) +
           " bytes");
    }
    entry.nbytes = static_cast<size_t>(nbytes);
    entry.data_begin = begin;
    return entry;
  }

 private:
  const std::string& path_;
};

}  // namespace

std::string_view safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
    case DType::i32:
      return "I32";
    case DType::i64:
      return "I64";
    case DType::u8:
      return "U8";
  }
  return "?";
}

std::optional<DType> parse_safetensors_dtype(std::string_view name) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8}) {
    if (safetensors_dtype_name(dtype) == name) return dtype;
  }
  return std::nullopt;
}

SafetensorsEntry safetensors_entry(std::string name, const Tensor& tensor) {
  SafetensorsEntry entry;
  entry.name = std::move(name);
  entry.dtype = tensor.dtype();
  entry.shape = tensor.shape();
  entry.data = tensor.raw();
  entry.nbytes = tensor.nbytes();
  return entry;
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                       const std::map<std::string, std::string>& metadata) {
  std::map<std::string, const SafetensorsEntry*> by_name;
  std::map<std::string, std::pair<uint64_t, uint64_t>> offsets;
  uint64_t data_bytes = 0;
  for (const SafetensorsEntry& entry : entries) {
    const std::string where = "tensor " + single_quoted(entry.name) + " for " + path;
    check(!entry.name.empty() && entry.name != kMetadataKey,
          "cannot write " + where + ": the name is empty or reserved; rename the tensor");
    check(by_name.emplace(entry.name, &entry).second,
          "cannot write " + where + ": the name appears twice; give every tensor its own name");
    uint64_t expected = static_cast<uint64_t>(shape_numel(entry.shape)) * dtype_size(entry.dtype);
    check(entry.nbytes == expected,
          "cannot write " + where + ": shape " + shape_string(entry.shape) + " of " +
              std::string(safetensors_dtype_name(entry.dtype)) + " needs " +
              std::to_string(expected) + " bytes but the entry has " +
              std::to_string(entry.nbytes) + "; fix the entry's shape or nbytes");
    check(entry.data != nullptr || entry.nbytes == 0,
          "cannot write " + where + ": its data pointer is null; pass the tensor's storage");
    offsets[entry.name] = {data_bytes, data_bytes + entry.nbytes};
    data_bytes += entry.nbytes;
  }

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  for (const auto& [name, entry] : by_name) {
    nlohmann::ordered_json spec = nlohmann::ordered_json::object();
    spec["dtype"] = safetensors_dtype_name(entry->dtype);
    spec["shape"] = entry->shape;
    spec["data_offsets"] = {offsets[name].first, offsets[name].second};
    header[name] = std::move(spec);
  }
  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const nlohmann::json::exception&) {
    throw Error("cannot write safetensors file " + path +
                ": a tensor name or metadata string is not valid UTF-8; use UTF-8 names");
  }
  header_text.append((8 - header_text.size() % 8) % 8, ' ');

  uint64_t header_length = header_text.size();
  uint8_t length_bytes[8];
  for (int i = 0; i < 8; ++i) length_bytes[i] = static_cast<uint8_t>(header_length >> (8 * i));

  AtomicFileWriter writer(path);
  writer.write(length_bytes, sizeof(length_bytes));
  writer.write(header_text);
  for (const SafetensorsEntry& entry : entries) {
    if (entry.nbytes) writer.write(entry.data, entry.nbytes);
  }
  writer.commit();
}

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw Error("cannot open safetensors file " + path_ + ": " + std::strerror(errno) +
                "; check the path");
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    throw Error("cannot read safetensors file " + path_ +
                ": it is not a regular file; check the path");
  }
  const uint64_t file_size = static_cast<uint64_t>(info.st_size);
  if (file_size > 0) {
    mapping_ = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapping_ == MAP_FAILED) {
      int saved = errno;
      mapping_ = nullptr;
      ::close(fd);
      throw Error("cannot map safetensors file " + path_ + ": " + std::strerror(saved) +
                  "; check free memory and the file's permissions");
    }
    mapping_size_ = file_size;
  }
  ::close(fd);

  try {
    HeaderChecker checker(path_);
    const uint8_t* bytes = static_cast<const uint8_t*>(mapping_);
    if (file_size < 8) {
      checker.fail("is truncated: it has " + std::to_string(file_size) +
                   " bytes, fewer than the 8-byte header length");
    }
    uint64_t header_length = 0;
    for (int i = 0; i < 8; ++i) header_length |= static_cast<uint64_t>(bytes[i]) << (8 * i);
    if (header_length > kMaxHeaderBytes) {
      checker.fail("has an implausible header length of " + std::to_string(header_length) +
                   " bytes (limit " + std::to_string(kMaxHeaderBytes) +
                   "); it is not a safetensors file or its first 8 bytes are damaged");
    }
    if (header_length > file_size - 8) {
      checker.fail("is truncated: its header length says " + std::to_string(header_length) +
                   " bytes of JSON, the file has " + std::to_string(file_size - 8) +
                   " after the length");
    }
    const char* header_begin = reinterpret_cast<const char*>(bytes + 8);
    const uint64_t data_size = file_size - 8 - header_length;
    const uint8_t* data = bytes + 8 + header_length;

    // Top-level keys are collected as they are parsed: a repeated tensor name is corruption that a
    // plain parse would hide by keeping the last one.
    std::set<std::string> seen_keys;
    std::string duplicate_key;
    auto watch_keys = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
      if (event == nlohmann::json::parse_event_t::key && depth == 1 &&
          !seen_keys.insert(parsed.get<std::string>()).second && duplicate_key.empty()) {
        duplicate_key = parsed.get<std::string>();
      }
      return true;
    };
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(header_begin, header_begin + header_length, watch_keys);
    } catch (const nlohmann::json::parse_error& error) {
      checker.fail("has a header that is not valid JSON (error near byte " +
                   std::to_string(error.byte) + " of " + std::to_string(header_length) + ")");
    }
    if (!header.is_object()) checker.fail("has a header that is not a JSON object");
    if (!duplicate_key.empty())
      checker.fail("names " + single_quoted(duplicate_key) + " twice in its header");

    for (const auto& [key, value] : header.items()) {
      if (key == kMetadataKey) {
        if (!value.is_object()) checker.fail("has \"__metadata__\" that is not an object");
        for (const auto& [meta_key, meta_value] : value.items()) {
          if (!meta_value.is_string()) {
            checker.fail("has metadata " + single_quoted(meta_key) +
                         " whose value is not a string");
          }
          metadata_[meta_key] = meta_value.get<std::string>();
        }
        continue;
      }
      entries_.emplace(key, checker.parse_entry(key, value));
    }

    // Sorted by where their bytes lie: checks range, contiguity and overlap in one pass.
    std::vector<SafetensorsEntry*> by_offset;
    for (auto& [name, entry] : entries_) by_offset.push_back(&entry);
    std::sort(by_offset.begin(), by_offset.end(), [](const auto* a, const auto* b) {
      return a->data_begin != b->data_begin ? a->data_begin < b->data_begin : a->name < b->name;
    });
    uint64_t covered_end = 0;
    bool contiguous = true;
    for (const SafetensorsEntry* entry : by_offset) {
      contiguous = contiguous && entry->data_begin == covered_end;
      covered_end = std::max<uint64_t>(covered_end, entry->data_begin + entry->nbytes);
    }
    if (covered_end > data_size) {
      if (contiguous) {
        checker.fail("is truncated: header says " + std::to_string(covered_end) +
                     " bytes of data, file has " + std::to_string(data_size));
      }
      for (const SafetensorsEntry* entry : by_offset) {
        if (entry->data_begin + entry->nbytes > data_size) {
          checker.fail("has tensor " + single_quoted(entry->name) + " whose data_offsets [" +
                       std::to_string(entry->data_begin) + ", " +
                       std::to_string(entry->data_begin + entry->nbytes) +
                       "] lie outside the data section of " + std::to_string(data_size) + " bytes");
        }
      }
    }
    const SafetensorsEntry* previous = nullptr;
    for (SafetensorsEntry* entry : by_offset) {
      if (entry->nbytes == 0) continue;  // an empty range overlaps nothing
      if (previous && entry->data_begin < previous->data_begin + previous->nbytes) {
        checker.fail("has tensors " + single_quoted(previous->name) + " and " +
                     single_quoted(entry->name) + " whose data_offsets overlap");
      }
      previous = entry;
    }
    for (SafetensorsEntry* entry : by_offset) entry->data = data + entry->data_begin;
  } catch (...) {
    close();
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  close();
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept {
  *this = std::move(other);
}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    close();
    path_ = std::move(other.path_);
    mapping_ = std::exchange(other.mapping_, nullptr);
    mapping_size_ = std::exchange(other.mapping_size_, 0);
    entries_ = std::move(other.entries_);  // data pointers stay valid: the mapping moved with them
    metadata_ = std::move(other.metadata_);
    other.entries_.clear();
    other.metadata_.clear();
  }
  return *this;
}

void SafetensorsFile::close() noexcept {
  if (mapping_) ::munmap(mapping_, mapping_size_);
  mapping_ = nullptr;
  mapping_size_ = 0;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> result;
  result.reserve(entries_.size());
  for (const auto& [name, entry] : entries_) result.push_back(name);
  return result;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto found = entries_.find(name);
  if (found == entries_.end()) {
    throw Error("tensor " + single_quoted(name) + " is not in safetensors file " + path_ +
                " (it has " + std::to_string(entries_.size()) +
                " tensors); check the tensor name and that the file matches the model");
  }
  return found->second;
}

void SafetensorsFile::read_into(const std::string& name, Tensor& dst) const {
  const SafetensorsEntry& stored = entry(name);
  if (stored.dtype != dst.dtype() || stored.shape != dst.shape()) {
    throw Error("tensor " + single_quoted(name) + " in " + path_ + " has shape " +
                shape_string(stored.shape) + " and dtype " +
                std::string(safetensors_dtype_name(stored.dtype)) + ", expected shape " +
                shape_string(dst.shape()) + " and dtype " +
                std::string(safetensors_dtype_name(dst.dtype())) +
                "; check that the file matches the model config");
  }
  if (stored.nbytes) std::memcpy(dst.raw(), stored.data, stored.nbytes);
}

Tensor SafetensorsFile::read(const std::string& name, MemoryTracker* tracker,
                             MemoryCategory category) const {
  const SafetensorsEntry& stored = entry(name);
  Tensor result(stored.shape, stored.dtype, tracker, category);
  if (stored.nbytes) std::memcpy(result.raw(), stored.data, stored.nbytes);
  return result;
}

std::vector<uint8_t> f32_as_dtype(const float* values, int64_t n, DType dtype,
                                  const std::string& name) {
  std::vector<uint8_t> bytes(static_cast<size_t>(n) * dtype_size(dtype));
  switch (dtype) {
    case DType::f32:
      if (n > 0) std::memcpy(bytes.data(), values, bytes.size());
      return bytes;
    case DType::bf16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t bits = to_bf16(values[i]).bits;
        std::memcpy(bytes.data() + 2 * i, &bits, 2);
      }
      return bytes;
    case DType::f16:
      for (int64_t i = 0; i < n; ++i) {
        check(!(std::fabs(values[i]) > 65504.0f) || std::isinf(values[i]),
              "tensor " + single_quoted(name) + " holds " + std::to_string(values[i]) +
                  " at element " + std::to_string(i) +
                  ", beyond fp16's range of +-65504: export it as bf16 or fp32");
        const uint16_t bits = float_to_f16(values[i]);
        std::memcpy(bytes.data() + 2 * i, &bits, 2);
      }
      return bytes;
    default:
      throw Error("tensor " + single_quoted(name) + ": fp32 values cannot be stored as " +
                  std::string(safetensors_dtype_name(dtype)) + "; use F32, BF16 or F16");
  }
}

void SafetensorsFile::read_f32(const std::string& name, float* dst, int64_t n) const {
  const SafetensorsEntry& stored = entry(name);
  const int64_t numel = shape_numel(stored.shape);
  const std::string stored_dtype(safetensors_dtype_name(stored.dtype));
  if (n != numel) {
    throw Error("tensor " + single_quoted(name) + " in " + path_ + " has shape " +
                shape_string(stored.shape) + " (" + std::to_string(numel) +
                " elements), expected " + std::to_string(n) +
                " elements; check that the file matches the model config");
  }
  const uint8_t* source = static_cast<const uint8_t*>(stored.data);
  switch (stored.dtype) {
    case DType::f32:
      if (stored.nbytes) std::memcpy(dst, source, stored.nbytes);
      return;
    case DType::bf16:
    case DType::f16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, source + 2 * i, 2);  // the mapping need not be 2-byte aligned
        dst[i] = stored.dtype == DType::bf16 ? to_float(bf16{bits}) : f16_to_float(bits);
      }
      return;
    default:
      throw Error("tensor " + single_quoted(name) + " in " + path_ + " has dtype " + stored_dtype +
                  ", expected a float type (F32, BF16 or F16); read it with read_into instead");
  }
}

}  // namespace lattice
