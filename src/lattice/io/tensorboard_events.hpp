// TensorBoardWriter: TensorBoard event files with scalar summaries, written as tf.summary writes
// them: a file named events.out.tfevents.<seconds>.<host>.<pid> holding TFRecord records (little-
// endian length, masked CRC-32C of the length, the bytes, masked CRC-32C of the bytes), each a
// tensorflow.Event protocol buffer: first the file-version event ("brain.Event:2"), then one event
// per step whose Summary holds a simple_value per tag. The encoding is written by hand (the few
// fields above), so no protobuf library is needed. Each event is flushed as it is added: a crash
// leaves at most a truncated last record, which TensorBoard's reader skips.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace lattice::io {

class TensorBoardWriter {
 public:
  // Creates the event file in `directory` (which must exist) and writes its version event.
  // Throws lattice::Error naming the path when it cannot.
  explicit TensorBoardWriter(const std::string& directory);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One event at `step` with a scalar per (tag, value), stamped with the wall time now.
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& event);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace lattice::io
