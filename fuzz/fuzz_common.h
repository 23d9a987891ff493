// fuzz/fuzz_common.h — what every fuzzer shares (docs/robustness.md). Each fuzz_<input>.cpp hands libFuzzer's
// bytes to the loader a user's file goes through, as a real file where the loader reads files. The contract
// under test: bad input is an lt::Error (one clear message) — never a crash, a hang, a leak, undefined behaviour
// (ASan, UBSan), nor another exception type, whose raw message would reach the user; that aborts here, so
// libFuzzer records the input as a crash.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "core/error.h"

namespace lt::fuzz {

// A directory of this process's own under $TMPDIR (or /tmp), made once.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string d = std::string(tmp && *tmp ? tmp : "/tmp") + "/lt_fuzz_" + std::to_string(::getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

// Writes bytes to scratch_dir()/name and returns the path.
inline std::string write_file(const std::string& name, std::string_view bytes) {
  const std::string path = scratch_dir() + "/" + name;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
  return path;
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return std::string_view(reinterpret_cast<const char*>(data), size);
}

// Runs the loader: an lt::Error is the expected answer to bad input; anything else is a finding.
template <typename F>
void expect_clean(F&& run) {
  try {
    run();
  } catch (const Error& e) {
    if (std::getenv("LT_FUZZ_VERBOSE")) std::fprintf(stderr, "fuzz: lt::Error: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: an exception other than lt::Error escaped (%s): %s\n", typeid(e).name(), e.what());
    std::abort();
  }
}

}  // namespace lt::fuzz
