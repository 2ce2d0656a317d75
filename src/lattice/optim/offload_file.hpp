// OffloadFile: one state file of the optimizer offload (an open descriptor with whole-buffer
// positional reads and writes, space reservation, sync and an exclusive lock), every failure a
// lattice::Error that names the file and the fix. The offload's per-chunk checksum is
// lattice::crc32c (core/crc32c.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "lattice/core/crc32c.hpp"

namespace lattice::optim {

// The error text for a failed operation on an offload file: names the path, the OS reason and
// what to do (ENOSPC / EFBIG / EDQUOT: free space or move the directory; EACCES / EROFS: writable
// directory; anything else: check the disk).
std::string offload_io_error(const std::string& path, const std::string& operation,
                             int error_number);

class OffloadFile {
 public:
  enum class Mode { create_or_truncate, open_existing, open_or_create };

  OffloadFile() = default;
  OffloadFile(std::string path, Mode mode);
  ~OffloadFile();
  OffloadFile(OffloadFile&& other) noexcept;
  OffloadFile& operator=(OffloadFile&& other) noexcept;
  OffloadFile(const OffloadFile&) = delete;
  OffloadFile& operator=(const OffloadFile&) = delete;

  const std::string& path() const { return path_; }
  bool is_open() const { return fd_ >= 0; }
  int64_t size() const;

  // Reserves `nbytes` of disk space (posix_fallocate), so that a full disk shows up here rather
  // than in the middle of a step.
  void reserve(int64_t nbytes);
  // Reads exactly `nbytes` at `offset`; a short read means the file was truncated.
  void read_exact(void* data, size_t nbytes, int64_t offset) const;
  void write_exact(const void* data, size_t nbytes, int64_t offset);
  void sync();
  // Takes an exclusive advisory lock (flock) without waiting; throws when another holder has it.
  void lock_exclusive(const std::string& holder_hint);

 private:
  void close_now() noexcept;

  std::string path_;
  int fd_ = -1;
};

// Writes `nbytes` to `path` through `<path>.tmp` and a rename (fsyncing file and folder when
// `durable`), so a crash leaves either the old or the new content.
void offload_write_atomically(const std::string& path, const void* data, size_t nbytes,
                              bool durable);

}  // namespace lattice::optim
