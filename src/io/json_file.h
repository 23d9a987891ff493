// io/json_file.h — whole-file reads, JSON parsing with positions, and JSON files written atomically
// (io/atomic_file.h, included here for the writers that use both).
//
// Every error names the path (and for JSON, the line, column and byte) so a user can open the file at
// the right spot.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "io/atomic_file.h"

namespace lt {

// The whole file as bytes. Throws lt::Error naming the path and strerror.
std::string read_file(const std::string& path);

// Parses `text` as JSON. `source` names it in errors ("config.json: invalid JSON at line 3, column 7
// (byte 41): ..."). Throws lt::Error.
nlohmann::json parse_json(std::string_view text, const std::string& source);

// read_file + parse_json, the path as source.
nlohmann::json read_json_file(const std::string& path);

// Runs `parse` — code reading a JSON document with nlohmann's accessors — and turns a JSON type or range error it
// throws (a field of a type the code did not check first: `"compute": 5` read with value(key, std::string()))
// into an lt::Error naming `source`, so no raw library message reaches the user. The loaders of user files
// run their parsing under it (found by fuzzing, docs/robustness.md).
[[noreturn]] void fail_json_access(const std::string& source, const nlohmann::json::exception& e);
template <typename F>
auto with_json_errors(const std::string& source, F&& parse) -> decltype(parse()) {
  try {
    return parse();
  } catch (const nlohmann::json::exception& e) {
    fail_json_access(source, e);
  }
}

// json.dump(indent) + newline, written atomically.
void write_json_file(const std::string& path, const nlohmann::json& j, int indent = 2);

}  // namespace lt
