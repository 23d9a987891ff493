// fuzz/fuzz_data_common.h — the small real tokenizer the text fuzzers use (examples/arith's, written by
// scripts/fuzz.sh into the fuzz data directory LT_FUZZ_DATA_DIR before the fuzzers run).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

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

}  // namespace lt::fuzz
