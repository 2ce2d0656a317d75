// Offload state files: see offload_file.hpp.
#include "lattice/optim/offload_file.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "lattice/core/error.hpp"

namespace lattice::optim {
namespace {

constexpr const char* kFixCorrupt =
    "; the file was changed outside Lattice: delete the offload directory and restore the "
    "optimizer state from a checkpoint";

}  // namespace

std::string offload_io_error(const std::string& path, const std::string& operation,
                             int error_number) {
  std::string message =
      "offload state file " + path + ": cannot " + operation + ": " + std::strerror(error_number);
  switch (error_number) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return message +
             "; free space on that disk or set the offload directory to a disk with room for "
             "two copies of the offloaded state";
    case EACCES:
    case EPERM:
    case EROFS:
      return message + "; set the offload directory to a writable folder";
    default:
      return message + "; check the disk and the offload directory";
  }
}

OffloadFile::OffloadFile(std::string path, Mode mode) : path_(std::move(path)) {
  int flags = O_RDWR | O_CLOEXEC;
  if (mode == Mode::create_or_truncate) flags |= O_CREAT | O_TRUNC;
  if (mode == Mode::open_or_create) flags |= O_CREAT;
  fd_ = ::open(path_.c_str(), flags, 0644);
  if (fd_ < 0) {
    if (errno == ENOENT && mode == Mode::open_existing) {
      throw Error("offload state file " + path_ +
                  " is missing; the offload directory is incomplete: delete it and restore the "
                  "optimizer state from a checkpoint");
    }
    throw Error(offload_io_error(path_, "open it", errno));
  }
}

OffloadFile::~OffloadFile() {
  close_now();
}

OffloadFile::OffloadFile(OffloadFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}

OffloadFile& OffloadFile::operator=(OffloadFile&& other) noexcept {
  if (this != &other) {
    close_now();
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

void OffloadFile::close_now() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

int64_t OffloadFile::size() const {
  struct stat info {};
  if (::fstat(fd_, &info) != 0) throw Error(offload_io_error(path_, "stat it", errno));
  return static_cast<int64_t>(info.st_size);
}

void OffloadFile::reserve(int64_t nbytes) {
  if (nbytes <= 0) return;
  const int rc = ::posix_fallocate(fd_, 0, static_cast<off_t>(nbytes));
  if (rc != 0) {
    throw Error(offload_io_error(path_, "reserve " + std::to_string(nbytes) + " bytes", rc));
  }
}

void OffloadFile::read_exact(void* data, size_t nbytes, int64_t offset) const {
  auto* out = static_cast<char*>(data);
  size_t done = 0;
  while (done < nbytes) {
    const ssize_t got = ::pread(fd_, out + done, nbytes - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw Error(offload_io_error(path_, "read " + std::to_string(nbytes) + " bytes", errno));
    }
    if (got == 0) {
      throw Error("offload state file " + path_ + " is truncated (ends before byte " +
                  std::to_string(offset + static_cast<int64_t>(nbytes)) + ")" + kFixCorrupt);
    }
    done += static_cast<size_t>(got);
  }
}

void OffloadFile::write_exact(const void* data, size_t nbytes, int64_t offset) {
  const auto* in = static_cast<const char*>(data);
  size_t done = 0;
  while (done < nbytes) {
    const ssize_t put = ::pwrite(fd_, in + done, nbytes - done, static_cast<off_t>(offset + done));
    if (put < 0) {
      if (errno == EINTR) continue;
      throw Error(offload_io_error(path_, "write " + std::to_string(nbytes) + " bytes", errno));
    }
    done += static_cast<size_t>(put);
  }
}

void OffloadFile::sync() {
  if (::fdatasync(fd_) != 0) throw Error(offload_io_error(path_, "sync it to disk", errno));
}

void OffloadFile::lock_exclusive(const std::string& holder_hint) {
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      throw Error("offload directory of " + path_ + " is in use by another " + holder_hint +
                  "; give each rank (and each optimizer) its own offload directory");
    }
    throw Error(offload_io_error(path_, "lock it", errno));
  }
}

void offload_write_atomically(const std::string& path, const void* data, size_t nbytes,
                              bool durable) {
  const std::string temp = path + ".tmp";
  {
    OffloadFile file(temp, OffloadFile::Mode::create_or_truncate);
    file.write_exact(data, nbytes, 0);
    if (durable) file.sync();
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int saved = errno;
    ::unlink(temp.c_str());
    throw Error(offload_io_error(path, "rename " + temp + " over it", saved));
  }
  if (durable) {
    std::string folder = std::filesystem::path(path).parent_path().string();
    if (folder.empty()) folder = ".";
    const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
      const int rc = ::fsync(fd);
      const int saved = errno;
      ::close(fd);
      if (rc != 0 && saved != EINVAL) throw Error(offload_io_error(folder, "sync it", saved));
    }
  }
}

}  // namespace lattice::optim
