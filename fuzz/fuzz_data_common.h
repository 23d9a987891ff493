// fuzz/fuzz_data_common.h — the small real tokenizer the text fuzzers use (examples/arith's, written by
// scripts/fuzz.sh into the fuzz data directory LT_FUZZ_DATA_DIR before the fuzzers run).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "fuzz_common.h"

namespace lt::fuzz {

inline std::string data_dir() {
  const std::string dir = LT_FUZZ_DATA_DIR;
  if (!std::filesystem::exists(dir + "/model/tokenizer.json")) {
    std::fprintf(stderr, "fuzz: %s/model/tokenizer.json is missing: run scripts/fuzz.sh (make fuzz), which makes it\n",
                 dir.c_str());
    std::exit(2);
  }
  return dir;
}

// scratch_dir()/name holding a copy of the real model file `file` (once), beside which a fuzzer writes the fuzzed
// one: the tokenizer's two files are fuzzed each with the other real.
inline std::string dir_with_real(const std::string& name, const std::string& file) {
  const std::string d = scratch_dir() + "/" + name;
  std::filesystem::create_directories(d);
  std::filesystem::copy_file(data_dir() + "/model/" + file, d + "/" + file,
                             std::filesystem::copy_options::overwrite_existing);
  return d;
}

}  // namespace lt::fuzz
