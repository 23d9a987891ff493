#include "io/json_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "io/unique_fd.h"

namespace lt {

namespace {

std::string errno_str(int err) { return std::strerror(err); }

}  // namespace

std::string read_file(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  LT_CHECK(fd.get() >= 0, "{}: cannot open: {}", path, errno_str(errno));
  struct stat st {};
  LT_CHECK(::fstat(fd.get(), &st) == 0, "{}: cannot stat: {}", path, errno_str(errno));
  LT_CHECK(!S_ISDIR(st.st_mode), "{}: is a directory, expected a file", path);
  std::string out;
  out.reserve(size_t(st.st_size));
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    LT_CHECK(n >= 0, "{}: read failed: {}", path, errno_str(errno));
    if (n == 0) break;
    out.append(buf, size_t(n));
  }
  return out;
}

nlohmann::json parse_json(std::string_view text, const std::string& source) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte is 1-based (the byte after the last one read); turn it into a line and column.
    size_t byte = std::min(e.byte, text.size());
    size_t line = 1, col = 1;
    for (size_t i = 0; i + 1 < byte; ++i) {
      if (text[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    // nlohmann's text is "[json.exception.parse_error.101] parse error at line 1, column 5: <reason>";
    // keep only the reason, we print our own position.
    std::string_view what = e.what();
    size_t colon = what.find(": ");
    std::string_view reason = colon == std::string_view::npos ? what : what.substr(colon + 2);
    LT_FAIL("{}: invalid JSON at line {}, column {} (byte {}): {}", source, line, col, e.byte, reason);
  } catch (const nlohmann::json::exception& e) {  // no position: a number out of range ("1e309", found by fuzzing)
    std::string_view what = e.what();
    const size_t bracket = what.find("] ");
    LT_FAIL("{}: invalid JSON: {}", source, bracket == std::string_view::npos ? what : what.substr(bracket + 2));
  }
}

nlohmann::json read_json_file(const std::string& path) { return parse_json(read_file(path), path); }

void fail_json_access(const std::string& source, const nlohmann::json::exception& e) {
  std::string_view what = e.what();  // "[json.exception.type_error.302] type must be string, but is number"
  const size_t bracket = what.find("] ");
  LT_FAIL("{}: a field has the wrong type or range: {}", source,
          bracket == std::string_view::npos ? what : what.substr(bracket + 2));
}

void write_json_file(const std::string& path, const nlohmann::json& j, int indent) {
  write_file_atomic(path, j.dump(indent) + "\n");
}

}  // namespace lt
