// Test helpers for the token-file tests: a fresh temporary directory per test, raw file writes
// (to build corrupt files byte by byte) and an expectation that a call throws lattice::Error whose
// message contains given fragments.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include "lattice/core/error.hpp"

namespace lattice::testing {

inline std::filesystem::path fresh_test_directory() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  auto dir = std::filesystem::temp_directory_path() /
             ("lattice-data-" + std::string(info->test_suite_name()) + "-" + info->name() + "-" +
              std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline void write_bytes(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

inline std::vector<uint8_t> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

template <class Fn>
void expect_error(Fn&& fn, std::initializer_list<std::string> fragments) {
  try {
    fn();
    ADD_FAILURE() << "expected lattice::Error";
  } catch (const lattice::Error& e) {
    const std::string message = e.what();
    for (const auto& f : fragments)
      EXPECT_NE(message.find(f), std::string::npos) << "'" << f << "' missing from: " << message;
  }
}

}  // namespace lattice::testing
