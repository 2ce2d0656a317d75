// TensorBoardWriter: see tensorboard_events.hpp.
#include "lattice/io/tensorboard_events.hpp"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "lattice/core/crc32c.hpp"
#include "lattice/core/error.hpp"

namespace lattice::io {
namespace {

// Protocol-buffer wire format: a field key is (number << 3) | wire type.
enum WireType : uint8_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, int field, WireType type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | type);
}

template <typename T>
void put_little_endian(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // x86-64 is little-endian, as the format
  out.append(bytes, sizeof(T));
}

void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

// tensorflow.Event: wall_time = 1 (double), step = 2 (int64), file_version = 3 (string),
// summary = 5 (Summary).
std::string event(double wall_time, int64_t step) {
  std::string out;
  put_key(out, 1, kFixed64);
  put_little_endian(out, wall_time);
  put_key(out, 2, kVarint);
  put_varint(out, static_cast<uint64_t>(step));
  return out;
}

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// TFRecord's masked CRC-32C (so that a CRC of data holding CRCs is not degenerate).
uint32_t masked_crc(const void* data, size_t n) {
  const uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& directory) {
  const double now = seconds_now();
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  path_ = (std::filesystem::path(directory) /
           ("events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) + "." + host + "." +
            std::to_string(::getpid())))
              .string();
  file_ = std::fopen(path_.c_str(), "ab");
  if (file_ == nullptr)
    throw Error("cannot create TensorBoard event file " + path_ + ": " + std::strerror(errno) +
                "; check the run directory, or set metrics.tensorboard = false");
  std::string version = event(now, 0);
  put_bytes(version, 3, "brain.Event:2");
  write_record(version);
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::add_scalars(int64_t step,
                                    const std::vector<std::pair<std::string, double>>& scalars) {
  // Summary: repeated Value value = 1; Value: tag = 1 (string), simple_value = 2 (float).
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    put_bytes(v, 1, tag);
    put_key(v, 2, kFixed32);
    put_little_endian(v, static_cast<float>(value));
    put_bytes(summary, 1, v);
  }
  std::string e = event(seconds_now(), step);
  put_bytes(e, 5, summary);
  write_record(e);
}

void TensorBoardWriter::write_record(const std::string& data) {
  std::string record;
  const uint64_t length = data.size();
  put_little_endian(record, length);
  put_little_endian(record, masked_crc(record.data(), sizeof(length)));
  record += data;
  put_little_endian(record, masked_crc(data.data(), data.size()));
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() ||
      std::fflush(file_) != 0)
    throw Error("cannot write TensorBoard event file " + path_ + ": " + std::strerror(errno) +
                "; free space on that disk, or set metrics.tensorboard = false");
}

}  // namespace lattice::io
