#include "io/json_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "core/error.h"
#include "io/io_faults.h"

namespace lt {

namespace {

std::string errno_str(int err) { return std::strerror(err); }

// Closes the descriptor on scope exit unless released; keeps error paths free of fd leaks.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

void write_all(int fd, const void* data, size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    // Linux caps one write at about 2 GiB; larger tensors go in several calls.
    size_t chunk = std::min<size_t>(size, size_t(1) << 30);
    const IoFault fault = injected_io_fault(IoOp::write, path);
    chunk = std::min(chunk, fault.max_bytes);
    ssize_t n = fault.error ? (errno = fault.error, -1) : chunk == 0 ? 0 : ::write(fd, p, chunk);
    if (n < 0 && errno == EINTR) continue;
    LT_CHECK(n > 0, "{}: write failed: {}", path, n < 0 ? errno_str(errno) : "wrote 0 bytes");
    p += n;
    size -= size_t(n);
  }
}

// fsync, or the failure the fault seam injects (io/io_faults.h).
int checked_fsync(int fd, const std::string& path) {
  const IoFault fault = injected_io_fault(IoOp::fsync, path);
  if (fault.error) {
    errno = fault.error;
    return -1;
  }
  return ::fsync(fd);
}

// fsync of the directory makes the rename itself durable (POSIX leaves it in the page cache otherwise).
void fsync_parent_dir(const std::string& path) {
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::string dir = parent.empty() ? "." : parent.string();
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  LT_CHECK(fd.get() >= 0, "{}: cannot open directory to sync it: {}", dir, errno_str(errno));
  LT_CHECK(checked_fsync(fd.get(), dir) == 0, "{}: fsync of directory failed: {}", dir, errno_str(errno));
}

void write_tmp_file(const std::string& tmp, std::span<const ByteSpan> pieces) {
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  LT_CHECK(fd.get() >= 0, "{}: cannot create: {}", tmp, errno_str(errno));
  for (const ByteSpan& piece : pieces) write_all(fd.get(), piece.data, piece.size, tmp);
  LT_CHECK(checked_fsync(fd.get(), tmp) == 0, "{}: fsync failed: {}", tmp, errno_str(errno));
  // close() can report a deferred write error (NFS, quota), so it is checked too.
  LT_CHECK(::close(fd.release()) == 0, "{}: close failed: {}", tmp, errno_str(errno));
}

}  // namespace

std::string read_file(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
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

void rename_path(const std::string& from, const std::string& to) {
  const IoFault fault = injected_io_fault(IoOp::rename, to);
  const int rc = fault.error ? (errno = fault.error, -1) : ::rename(from.c_str(), to.c_str());
  LT_CHECK(rc == 0, "{}: cannot rename {} over it: {}", to, from, errno_str(errno));
}

void fsync_path(const std::string& path, bool directory) {
  Fd fd(::open(path.c_str(), (directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY) | O_CLOEXEC));
  LT_CHECK(fd.get() >= 0, "{}: cannot open to sync it: {}", path, errno_str(errno));
  LT_CHECK(checked_fsync(fd.get(), path) == 0, "{}: fsync failed: {}", path, errno_str(errno));
}

void write_file_atomic(const std::string& path, std::span<const ByteSpan> pieces) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  try {
    write_tmp_file(tmp, pieces);
    rename_path(tmp, path);
  } catch (...) {
    ::unlink(tmp.c_str());  // best effort: the error being thrown is the one worth reporting
    throw;
  }
  fsync_parent_dir(path);
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  ByteSpan piece{bytes.data(), bytes.size()};
  write_file_atomic(path, std::span<const ByteSpan>(&piece, 1));
}

void write_json_file(const std::string& path, const nlohmann::json& j, int indent) {
  write_file_atomic(path, j.dump(indent) + "\n");
}

}  // namespace lt
