// TensorBoard event files: what TensorBoardWriter writes is read back by TensorBoard's own reader
// (tests/reference/read_tensorboard.py, tensorboard from PyPI: framing, CRC-32C, the Event and
// Summary protocol buffers) with every step, tag and value; a file cut inside its last record
// still reads up to the record before; an unwritable directory is one error naming the path.
#include "lattice/io/tensorboard_events.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "lattice/core/error.hpp"

namespace fs = std::filesystem;
using lattice::io::TensorBoardWriter;

namespace {

bool python_has_tensorboard() {
  return std::system("/usr/bin/python3 -c 'import tensorboard' > /dev/null 2>&1") == 0;
}

// The scalars TensorBoard's reader finds in `path` (a directory or one file).
nlohmann::json read_with_tensorboard(const fs::path& path) {
  const fs::path out = fs::temp_directory_path() / ("tb-read-" + std::to_string(::getpid()));
  const std::string command = "/usr/bin/python3 '" + std::string(LATTICE_SOURCE_DIR) +
                              "/tests/reference/read_tensorboard.py' '" + path.string() + "' > '" +
                              out.string() + "'";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  fs::remove(out);
  return nlohmann::json::parse(text.str());
}

class TensorBoardEvents : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!python_has_tensorboard())
      GTEST_SKIP() << "/usr/bin/python3 cannot import tensorboard (scripts/install_deps.sh "
                      "installs it from PyPI)";
    dir_ = fs::temp_directory_path() / ("lattice-tb-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

}  // namespace

TEST_F(TensorBoardEvents, TensorBoardReadsEveryStepTagAndValue) {
  std::string path;
  {
    TensorBoardWriter writer(dir_.string());
    path = writer.path();
    for (int64_t step = 1; step <= 30; ++step)
      writer.add_scalars(step * 10, {{"loss", 5.0 / static_cast<double>(step)},
                                     {"memory/rss", 1.5e9 + static_cast<double>(step)},
                                     {"moe/max_mean_load", -0.25 * static_cast<double>(step)}});
  }
  EXPECT_EQ(fs::path(path).parent_path(), dir_);
  EXPECT_EQ(fs::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u) << path;
  const nlohmann::json read = read_with_tensorboard(dir_);
  EXPECT_EQ(read.at("file_version"), "brain.Event:2");
  const auto& events = read.at("events");
  ASSERT_EQ(events.size(), 30u);
  for (int64_t step = 1; step <= 30; ++step) {
    const auto& e = events[static_cast<size_t>(step - 1)];
    EXPECT_EQ(e.at("step").get<int64_t>(), step * 10);
    const auto& s = e.at("scalars");
    ASSERT_EQ(s.size(), 3u);
    // simple_value is a 32-bit float: the value rounded to float, exactly.
    EXPECT_EQ(s.at("loss").get<float>(), static_cast<float>(5.0 / static_cast<double>(step)));
    EXPECT_EQ(s.at("memory/rss").get<float>(),
              static_cast<float>(1.5e9 + static_cast<double>(step)));
    EXPECT_EQ(s.at("moe/max_mean_load").get<float>(),
              static_cast<float>(-0.25 * static_cast<double>(step)));
    EXPECT_GT(e.at("wall_time").get<double>(), 1.7e9);  // seconds since 1970, 2023 or later
  }
}

TEST_F(TensorBoardEvents, AFileCutInsideItsLastRecordReadsUpToTheRecordBefore) {
  std::string path;
  {
    TensorBoardWriter writer(dir_.string());
    path = writer.path();
    writer.add_scalars(1, {{"loss", 2.0}});
    writer.add_scalars(2, {{"loss", 1.0}});
  }
  fs::resize_file(path, fs::file_size(path) - 5);  // a crash inside the last write
  const nlohmann::json read = read_with_tensorboard(path);
  const auto& events = read.at("events");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].at("step").get<int64_t>(), 1);
}

TEST(TensorBoardWriter, AMissingDirectoryIsOneErrorNamingIt) {
  try {
    TensorBoardWriter writer("/nonexistent-lattice-dir/run");
    FAIL() << "expected an error";
  } catch (const lattice::Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("/nonexistent-lattice-dir/run/events.out.tfevents."), std::string::npos)
        << message;
    EXPECT_NE(message.find("metrics.tensorboard = false"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}
