// Tests of io/atomic_file: atomic file writes and directory publishing leave no temp files, replace
// old content, keep the old content when abandoned, and reads fail with clear errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/io/atomic_file.hpp"

using namespace lattice;
namespace fs = std::filesystem;

namespace {

// A fresh, empty folder per test, removed afterwards.
class AtomicFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           ("lattice_io_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // Names of the entries in the test folder, sorted.
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& item : fs::directory_iterator(dir_)) names.push_back(item.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_;
};

std::string message_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& error) {
    return error.what();
  }
  return "<no error>";
}

TEST_F(AtomicFileTest, WriteTextCreatesThenReplacesAndLeavesNoTempFiles) {
  write_text_atomic(path("config.json"), "first version, rather long");
  EXPECT_EQ(read_file_text(path("config.json")), "first version, rather long");
  write_text_atomic(path("config.json"), "second");
  EXPECT_EQ(read_file_text(path("config.json")), "second");
  EXPECT_EQ(listing(), std::vector<std::string>{"config.json"});
}

TEST_F(AtomicFileTest, ReadFileBytesReturnsExactBytes) {
  const uint8_t bytes[] = {0, 1, 2, 255, 0, 7};
  write_file_atomic(path("blob.bin"), bytes, sizeof(bytes));
  EXPECT_EQ(read_file_bytes(path("blob.bin")), std::vector<uint8_t>(bytes, bytes + sizeof(bytes)));
  write_file_atomic(path("empty.bin"), nullptr, 0);
  EXPECT_TRUE(read_file_bytes(path("empty.bin")).empty());
}

TEST_F(AtomicFileTest, MissingFileErrorNamesThePathAndReason) {
  std::string message = message_of([&] { read_file_bytes(path("nope.bin")); });
  EXPECT_NE(message.find(path("nope.bin")), std::string::npos) << message;
  EXPECT_NE(message.find("No such file"), std::string::npos) << message;
  EXPECT_NE(message.find("check the path"), std::string::npos) << message;
  message = message_of([&] { read_file_bytes(dir_.string()); });
  EXPECT_NE(message.find("it is a folder"), std::string::npos) << message;
}

TEST_F(AtomicFileTest, AbandonedWriterKeepsOldContentAndRemovesTemp) {
  write_text_atomic(path("state.txt"), "old");
  {
    AtomicFileWriter writer(path("state.txt"));
    writer.write(std::string_view("new but never committed"));
    EXPECT_TRUE(fs::exists(writer.temp_path()));
    EXPECT_EQ(writer.temp_path(), path("state.txt") + ".tmp-" + std::to_string(::getpid()));
  }
  EXPECT_EQ(read_file_text(path("state.txt")), "old");
  EXPECT_EQ(listing(), std::vector<std::string>{"state.txt"});
}

TEST_F(AtomicFileTest, StreamingWriterCountsBytesAndRefusesWritesAfterCommit) {
  AtomicFileWriter writer(path("stream.txt"));
  writer.write(std::string_view("abc"));
  writer.write(std::string_view("def"));
  EXPECT_EQ(writer.bytes_written(), 6u);
  writer.commit();
  EXPECT_EQ(read_file_text(path("stream.txt")), "abcdef");
  EXPECT_THROW(writer.write(std::string_view("x")), Error);
  EXPECT_THROW(writer.commit(), Error);
  EXPECT_EQ(listing(), std::vector<std::string>{"stream.txt"});
}

TEST_F(AtomicFileTest, WritingIntoMissingFolderNamesIt) {
  std::string message = message_of([&] { write_text_atomic(path("no/such/dir/a.txt"), "x"); });
  EXPECT_NE(message.find(path("no/such/dir/a.txt")), std::string::npos) << message;
  EXPECT_NE(message.find("folder exists"), std::string::npos) << message;
}

TEST_F(AtomicFileTest, StagedDirectoryPublishesNewFolder) {
  StagedDirectory stage(path("step-10"));
  EXPECT_EQ(stage.staging_path(), path("step-10") + ".tmp-" + std::to_string(::getpid()));
  write_text_atomic(stage.file_path("model.txt"), "weights");
  fs::create_directories(stage.file_path("shards"));
  write_text_atomic(stage.file_path("shards/rank0.txt"), "shard");
  EXPECT_FALSE(fs::exists(path("step-10")));
  stage.commit();
  EXPECT_EQ(read_file_text(path("step-10/model.txt")), "weights");
  EXPECT_EQ(read_file_text(path("step-10/shards/rank0.txt")), "shard");
  EXPECT_EQ(listing(), std::vector<std::string>{"step-10"});
}

TEST_F(AtomicFileTest, StagedDirectoryReplacesExistingFolderWhole) {
  fs::create_directories(path("latest"));
  write_text_atomic(path("latest/model.txt"), "old weights");
  write_text_atomic(path("latest/only-in-old.txt"), "stale");

  StagedDirectory stage(path("latest/"));  // a trailing separator names the same folder
  EXPECT_EQ(stage.final_path(), path("latest"));
  write_text_atomic(stage.file_path("model.txt"), "new weights");
  stage.commit();

  EXPECT_EQ(read_file_text(path("latest/model.txt")), "new weights");
  EXPECT_FALSE(fs::exists(path("latest/only-in-old.txt")));
  EXPECT_EQ(listing(), std::vector<std::string>{"latest"});
  EXPECT_THROW(stage.commit(), Error);
}

TEST_F(AtomicFileTest, RenameAsideReplacementAlsoReplacesWhole) {
  fs::create_directories(path("latest"));
  write_text_atomic(path("latest/model.txt"), "old weights");
  write_text_atomic(path("latest/only-in-old.txt"), "stale");
  StagedDirectory stage(path("latest"));
  write_text_atomic(stage.file_path("model.txt"), "new weights");
  stage.commit(DirectoryReplace::rename_aside);
  EXPECT_EQ(read_file_text(path("latest/model.txt")), "new weights");
  EXPECT_FALSE(fs::exists(path("latest/only-in-old.txt")));
  EXPECT_EQ(listing(), std::vector<std::string>{"latest"});
}

TEST_F(AtomicFileTest, RestoreInterruptedPublishPutsTheOldFolderBack) {
  // The state a crash between the two renames of rename_aside leaves behind.
  fs::create_directories(path("ckpt.old-4242"));
  write_text_atomic(path("ckpt.old-4242/model.txt"), "previous");
  fs::create_directories(path("ckpt.old-12x"));  // not a pid suffix: ignored
  EXPECT_TRUE(restore_interrupted_publish(path("ckpt")));
  EXPECT_EQ(read_file_text(path("ckpt/model.txt")), "previous");
  EXPECT_EQ(listing(), (std::vector<std::string>{"ckpt", "ckpt.old-12x"}));
  // Nothing to do when the folder exists.
  fs::create_directories(path("ckpt.old-7"));
  EXPECT_FALSE(restore_interrupted_publish(path("ckpt")));
  EXPECT_TRUE(fs::exists(path("ckpt.old-7")));
  // Ambiguous (two candidates) or absent: changes nothing.
  fs::create_directories(path("other.old-1"));
  fs::create_directories(path("other.old-2"));
  EXPECT_FALSE(restore_interrupted_publish(path("other")));
  EXPECT_FALSE(fs::exists(path("other")));
  EXPECT_FALSE(restore_interrupted_publish(path("never-written")));
}

TEST_F(AtomicFileTest, AbandonedStageLeavesOldFolderAndNoStagingFolder) {
  fs::create_directories(path("ckpt"));
  write_text_atomic(path("ckpt/model.txt"), "old");
  {
    StagedDirectory stage(path("ckpt"));
    write_text_atomic(stage.file_path("model.txt"), "half written");
  }
  EXPECT_EQ(read_file_text(path("ckpt/model.txt")), "old");
  EXPECT_EQ(listing(), std::vector<std::string>{"ckpt"});
}

TEST_F(AtomicFileTest, StaleStagingFolderIsClearedOnCreate) {
  const std::string stale = path("ckpt") + ".tmp-" + std::to_string(::getpid());
  fs::create_directories(stale);
  write_text_atomic(stale + "/leftover.txt", "from a crashed run");
  StagedDirectory stage(path("ckpt"));
  EXPECT_FALSE(fs::exists(stage.file_path("leftover.txt")));
  stage.commit();
  EXPECT_TRUE(fs::is_empty(path("ckpt")));
}

}  // namespace
