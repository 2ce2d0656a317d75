// Crash-safe file output: files written through a same-directory temp file and renamed into place,
// directories staged under a temp name and published with one rename, plus whole-file reads with
// clear errors. A crash at any point leaves either the old content or the new one, never a mix.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lattice {

// Reads a whole file. Throws Error naming the file and the OS reason when it cannot be opened or
// read
// ("cannot open file X: No such file or directory; check the path").
std::vector<uint8_t> read_file_bytes(const std::string& path);
std::string read_file_text(const std::string& path);

// Streams a file to `<path>.tmp-<pid>` in the target's directory; commit() fsyncs it, renames it
// over `path` and fsyncs the directory. Destroying an uncommitted writer removes the temp file, so
// an error (or exception) midway leaves the old `path` untouched.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t nbytes);
  void write(std::string_view text) { write(text.data(), text.size()); }
  // Makes the new content visible under `path`, durably. Further writes are an error.
  void commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }
  uint64_t bytes_written() const { return bytes_written_; }

 private:
  void discard() noexcept;

  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  uint64_t bytes_written_ = 0;
  bool committed_ = false;
};

// One-shot atomic writes of a buffer or a text.
void write_file_atomic(const std::string& path, const void* data, size_t nbytes);
void write_text_atomic(const std::string& path, std::string_view text);

// How StagedDirectory::commit replaces an existing folder.
enum class DirectoryReplace {
  // One atomic swap (Linux renameat2 RENAME_EXCHANGE); falls back to rename_aside where the
  // filesystem cannot swap.
  exchange_if_supported,
  // Rename the old folder to `<final>.old-<pid>`, rename the new one in, remove the old one. A
  // crash
  // between the two renames leaves no `<final>`; restore_interrupted_publish() puts the old one
  // back.
  rename_aside,
};

// Stages a directory (a checkpoint) under `<final>.tmp-<pid>/`; the caller writes its files there,
// then commit() fsyncs every file and folder in it and renames it to `final_path`, replacing an
// existing `final_path` whole (see DirectoryReplace). Destroying an uncommitted stage removes the
// staging folder. A stale staging folder of the same name (left by a crashed process with the same
// pid) is removed when the stage is created.
class StagedDirectory {
 public:
  explicit StagedDirectory(std::string final_path);
  ~StagedDirectory();
  StagedDirectory(const StagedDirectory&) = delete;
  StagedDirectory& operator=(const StagedDirectory&) = delete;

  const std::string& final_path() const { return final_path_; }
  const std::string& staging_path() const { return staging_path_; }
  // `staging_path()/relative`, for the files the caller writes.
  std::string file_path(const std::string& relative) const;
  void commit(DirectoryReplace how = DirectoryReplace::exchange_if_supported);

 private:
  void discard() noexcept;
  void replace_by_renaming_aside();

  std::string final_path_;
  std::string staging_path_;
  bool committed_ = false;
};

// After a crash in the middle of a rename_aside publish: if `final_path` is missing and exactly one
// `<final>.old-<pid>` sibling exists, renames it back to `final_path` and returns true. Otherwise
// changes nothing and returns false. Call it before looking for the latest checkpoint.
bool restore_interrupted_publish(const std::string& final_path);

// fsyncs a directory so that renames and creations inside it survive a crash.
void fsync_directory(const std::string& path);

}  // namespace lattice
