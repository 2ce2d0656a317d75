// Crash-safe file output and whole-file reads: see atomic_file.hpp.
#include "lattice/io/atomic_file.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

#include "lattice/core/error.hpp"

namespace lattice {
namespace {

namespace fs = std::filesystem;

std::string os_reason(int error_number) {
  return std::strerror(error_number);
}

// The folder that holds `path` ("." for a bare file name).
std::string parent_directory(const std::string& path) {
  fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

// `path` without trailing separators, so that "runs/step-10/" and "runs/step-10" name one folder.
std::string without_trailing_separators(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

void fsync_path(const std::string& path, int open_flags, const char* what) {
  int fd = ::open(path.c_str(), open_flags | O_CLOEXEC);
  if (fd < 0) {
    throw Error("cannot open " + std::string(what) + " " + path +
                " to sync it: " + os_reason(errno) + "; check that it exists and is readable");
  }
  int rc = ::fsync(fd);
  int saved = errno;
  ::close(fd);
  // Some filesystems refuse fsync on directories (EINVAL); nothing more can be done there.
  if (rc != 0 && saved != EINVAL) {
    throw Error("cannot sync " + std::string(what) + " " + path + " to disk: " + os_reason(saved) +
                "; check the disk and free space");
  }
}

// fsyncs every regular file and folder under `root` (children before their folder), then `root`.
void fsync_tree(const std::string& root) {
  std::error_code ec;
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_directory()) {
      fsync_path(it->path().string(), O_RDONLY | O_DIRECTORY, "folder");
    } else if (it->is_regular_file()) {
      fsync_path(it->path().string(), O_RDONLY, "file");
    }
  }
  if (ec) {
    throw Error("cannot list folder " + root + " to sync it: " + ec.message() +
                "; check that it exists and is readable");
  }
  fsync_directory(root);
}

void rename_or_throw(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    throw Error("cannot rename " + from + " to " + to + ": " + os_reason(errno) +
                "; check that both are on one filesystem and the folder is writable");
  }
}

}  // namespace

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw Error("cannot open file " + path + ": " + os_reason(errno) + "; check the path");
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    int saved = errno;
    ::close(fd);
    throw Error("cannot read file " + path + ": " +
                (S_ISDIR(info.st_mode) ? std::string("it is a folder") : os_reason(saved)) +
                "; check the path");
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(info.st_size));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t got = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      int saved = errno;
      ::close(fd);
      throw Error("cannot read file " + path + ": " +
                  (got == 0 ? std::string("it shrank while being read") : os_reason(saved)) +
                  "; check that no other process is writing it");
    }
    done += static_cast<size_t>(got);
  }
  ::close(fd);
  return bytes;
}

std::string read_file_text(const std::string& path) {
  std::vector<uint8_t> bytes = read_file_bytes(path);
  return std::string(bytes.begin(), bytes.end());
}

AtomicFileWriter::AtomicFileWriter(std::string path)
    : path_(std::move(path)), temp_path_(path_ + ".tmp-" + std::to_string(::getpid())) {
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw Error("cannot create file " + temp_path_ + " (to write " + path_ +
                "): " + os_reason(errno) + "; check that the folder exists and is writable");
  }
}

AtomicFileWriter::~AtomicFileWriter() {
  if (!committed_) discard();
}

void AtomicFileWriter::discard() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(temp_path_.c_str());
}

void AtomicFileWriter::write(const void* data, size_t nbytes) {
  check(fd_ >= 0, "file " + path_ + " was already committed or failed; write it with a new writer");
  const char* bytes = static_cast<const char*>(data);
  while (nbytes > 0) {
    ssize_t wrote = ::write(fd_, bytes, nbytes);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote < 0) {
      int saved = errno;
      discard();
      throw Error("cannot write file " + path_ + ": " + os_reason(saved) +
                  "; check free disk space and permissions (the old file is untouched)");
    }
    bytes += wrote;
    nbytes -= static_cast<size_t>(wrote);
    bytes_written_ += static_cast<uint64_t>(wrote);
  }
}

void AtomicFileWriter::commit() {
  check(fd_ >= 0, "file " + path_ + " was already committed or failed; write it with a new writer");
  if (::fsync(fd_) != 0) {
    int saved = errno;
    discard();
    throw Error("cannot sync file " + path_ + " to disk: " + os_reason(saved) +
                "; check the disk and free space (the old file is untouched)");
  }
  int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) {
    int saved = errno;
    discard();
    throw Error("cannot close file " + path_ + ": " + os_reason(saved) +
                "; check the disk and free space (the old file is untouched)");
  }
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    int saved = errno;
    discard();
    throw Error("cannot rename " + temp_path_ + " to " + path_ + ": " + os_reason(saved) +
                "; check that the target is not a folder and its folder is writable");
  }
  committed_ = true;
  fsync_directory(parent_directory(path_));
}

void write_file_atomic(const std::string& path, const void* data, size_t nbytes) {
  AtomicFileWriter writer(path);
  writer.write(data, nbytes);
  writer.commit();
}

void write_text_atomic(const std::string& path, std::string_view text) {
  write_file_atomic(path, text.data(), text.size());
}

void fsync_directory(const std::string& path) {
  fsync_path(path, O_RDONLY | O_DIRECTORY, "folder");
}

StagedDirectory::StagedDirectory(std::string final_path)
    : final_path_(without_trailing_separators(std::move(final_path))),
      staging_path_(final_path_ + ".tmp-" + std::to_string(::getpid())) {
  std::error_code ec;
  fs::remove_all(staging_path_, ec);
  if (ec) {
    throw Error("cannot remove stale staging folder " + staging_path_ + ": " + ec.message() +
                "; delete it by hand");
  }
  if (::mkdir(staging_path_.c_str(), 0755) != 0) {
    throw Error("cannot create staging folder " + staging_path_ + " (for " + final_path_ +
                "): " + os_reason(errno) + "; check that the parent folder exists and is writable");
  }
}

StagedDirectory::~StagedDirectory() {
  if (!committed_) discard();
}

void StagedDirectory::discard() noexcept {
  std::error_code ec;
  fs::remove_all(staging_path_, ec);
}

std::string StagedDirectory::file_path(const std::string& relative) const {
  return (fs::path(staging_path_) / relative).string();
}

void StagedDirectory::commit(DirectoryReplace how) {
  check(!committed_, "folder " + final_path_ + " was already published; stage it again to rewrite");
  fsync_tree(staging_path_);
  const std::string parent = parent_directory(final_path_);
  std::error_code ec;
  const bool replacing = fs::exists(fs::symlink_status(final_path_, ec));
  if (!replacing) {
    rename_or_throw(staging_path_, final_path_);
    committed_ = true;
    fsync_directory(parent);
    return;
  }
#ifdef RENAME_EXCHANGE
  if (how == DirectoryReplace::exchange_if_supported) {
    // One atomic step: the new folder takes the final name, the old one takes the staging name.
    if (::renameat2(AT_FDCWD, staging_path_.c_str(), AT_FDCWD, final_path_.c_str(),
                    RENAME_EXCHANGE) == 0) {
      committed_ = true;
      fsync_directory(parent);
      fs::remove_all(staging_path_, ec);  // now the old content
      if (ec) {
        throw Error("published " + final_path_ + " but cannot remove the old copy at " +
                    staging_path_ + ": " + ec.message() + "; delete it by hand");
      }
      return;
    }
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) {
      throw Error("cannot publish " + staging_path_ + " as " + final_path_ + ": " +
                  os_reason(errno) +
                  "; check that both are on one filesystem and the folder is writable");
    }
  }
#endif
  replace_by_renaming_aside();
}

void StagedDirectory::replace_by_renaming_aside() {
  const std::string aside_path = final_path_ + ".old-" + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(aside_path, ec);
  rename_or_throw(final_path_, aside_path);
  try {
    rename_or_throw(staging_path_, final_path_);
  } catch (...) {
    ::rename(aside_path.c_str(), final_path_.c_str());  // put the old one back
    throw;
  }
  committed_ = true;
  fsync_directory(parent_directory(final_path_));
  fs::remove_all(aside_path, ec);
  if (ec) {
    throw Error("published " + final_path_ + " but cannot remove the old copy at " + aside_path +
                ": " + ec.message() + "; delete it by hand");
  }
}

bool restore_interrupted_publish(const std::string& final_path) {
  const std::string target = without_trailing_separators(final_path);
  std::error_code ec;
  if (fs::exists(fs::symlink_status(target, ec))) return false;
  const std::string parent = parent_directory(target);
  const std::string prefix = fs::path(target).filename().string() + ".old-";
  std::vector<fs::path> candidates;
  for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
        name.find_first_not_of("0123456789", prefix.size()) == std::string::npos) {
      candidates.push_back(it->path());
    }
  }
  if (ec || candidates.size() != 1) return false;
  rename_or_throw(candidates.front().string(), target);
  fsync_directory(parent);
  return true;
}

}  // namespace lattice
