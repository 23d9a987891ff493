// io/json_file.h — whole-file reads, JSON parsing with positions, and atomic writes.
//
// Every error names the path (and for JSON, the line, column and byte) so a user can open the file at
// the right spot. Atomic writes go to "<path>.tmp.<pid>", are fsync'ed, renamed over <path>, and the
// directory is fsync'ed: after a crash the path holds either the old file or the whole new one, never
// a torn write. Checkpoints and weight files (io/safetensors.h) rely on this.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

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

// One piece of a file to write: `size` bytes at `data`. Lets a writer stream a header and many tensors
// to one file without first concatenating gigabytes in memory.
struct ByteSpan {
  const void* data;
  size_t size;
};

// Writes the pieces, in order, to `path` atomically (see the file comment). Throws lt::Error naming the
// path and strerror (ENOSPC, EACCES, ...); the temporary file is removed on failure.
void write_file_atomic(const std::string& path, std::span<const ByteSpan> pieces);
void write_file_atomic(const std::string& path, std::string_view bytes);

// rename(from, to) (atomic on one file system; over a directory that exists only when it is empty), and fsync of a
// file or directory. Throw lt::Error naming the paths and strerror; both go through the fault seam
// (io/io_faults.h), as the atomic writers' own writes, fsyncs and renames do.
void rename_path(const std::string& from, const std::string& to);
void fsync_path(const std::string& path, bool directory);

// json.dump(indent) + newline, written atomically.
void write_json_file(const std::string& path, const nlohmann::json& j, int indent = 2);

}  // namespace lt
