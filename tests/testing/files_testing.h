// tests/testing/files_testing.h — scratch directories, files and error messages for tests.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "core/error.h"

namespace lt::testing {

// A fresh, empty directory for the running test: TempDir()/<prefix><pid>/<test name>.
inline std::string fresh_test_dir(const std::string& prefix) {
  namespace fs = std::filesystem;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::path(::testing::TempDir()) / (prefix + std::to_string(::getpid())) / info->name();
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

inline void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// The message of the lt::Error fn throws, or "(no error)".
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace lt::testing
