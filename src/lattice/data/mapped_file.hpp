// MappedFile: a whole file mapped read-only into memory (RAII), so token files of any size are read
// in place without copying. An empty file maps to an empty span.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace lattice::data {

class MappedFile {
 public:
  // Maps `path`. Throws lattice::Error naming the file and the OS reason when it cannot be opened
  // or mapped.
  explicit MappedFile(std::string path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace lattice::data
