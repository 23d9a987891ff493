#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "core/error.h"
#include "io/io_faults.h"
#include "io/unique_fd.h"

namespace lt {

namespace {

constexpr size_t kBufferBytes = size_t(1) << 20;

std::string errno_str(int err) { return std::strerror(err); }

// write(2) until done, at the file position or (offset >= 0) at `offset`; each call asks the fault seam first.
void write_all(int fd, const void* data, size_t size, const std::string& path, int64_t offset = -1) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    // Linux caps one write at about 2 GiB; larger tensors go in several calls.
    size_t chunk = std::min<size_t>(size, size_t(1) << 30);
    const IoFault fault = injected_io_fault(IoOp::write, path);
    chunk = std::min(chunk, fault.max_bytes);
    ssize_t n = fault.error ? (errno = fault.error, -1)
                : chunk == 0 ? 0
                : offset >= 0 ? ::pwrite(fd, p, chunk, offset)
                              : ::write(fd, p, chunk);
    if (n < 0 && errno == EINTR) continue;
    LT_CHECK(n > 0, "{}: write failed: {}", path, n < 0 ? errno_str(errno) : "wrote 0 bytes");
    p += n;
    size -= size_t(n);
    if (offset >= 0) offset += n;
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
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  LT_CHECK(fd.get() >= 0, "{}: cannot open directory to sync it: {}", dir, errno_str(errno));
  LT_CHECK(checked_fsync(fd.get(), dir) == 0, "{}: fsync of directory failed: {}", dir, errno_str(errno));
}

}  // namespace

// ---- AtomicFile -----------------------------------------------------------------------------------------------

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp." + std::to_string(::getpid())) {
  fd_ = UniqueFd(::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  LT_CHECK(fd_.get() >= 0, "{}: cannot create: {}", tmp_, errno_str(errno));
  buffer_.reserve(kBufferBytes);
}

AtomicFile::~AtomicFile() {
  fd_ = UniqueFd();
  if (!committed_) ::unlink(tmp_.c_str());  // best effort: the error being thrown is the one worth reporting
}

void AtomicFile::flush() {
  if (buffer_.empty()) return;
  write_all(fd_.get(), buffer_.data(), buffer_.size(), tmp_);
  buffer_.clear();
}

void AtomicFile::append(const void* data, size_t size) {
  LT_CHECK(fd_.get() >= 0 && !committed_, "{}: append after commit", path_);
  size_ += size;
  if (buffer_.size() + size <= kBufferBytes) {
    buffer_.insert(buffer_.end(), static_cast<const char*>(data), static_cast<const char*>(data) + size);
    return;
  }
  flush();
  if (size >= kBufferBytes) write_all(fd_.get(), data, size, tmp_);  // a large piece goes straight to the file
  else buffer_.insert(buffer_.end(), static_cast<const char*>(data), static_cast<const char*>(data) + size);
}

void AtomicFile::write_at(uint64_t offset, const void* data, size_t size) {
  LT_CHECK(offset + size <= size_, "{}: write at {} + {} past the {} bytes written", path_, offset, size, size_);
  flush();
  write_all(fd_.get(), data, size, tmp_, int64_t(offset));
}

void AtomicFile::commit() {
  flush();
  LT_CHECK(checked_fsync(fd_.get(), tmp_) == 0, "{}: fsync failed: {}", tmp_, errno_str(errno));
  // close() can report a deferred write error (NFS, quota), so it is checked too.
  const int rc = ::close(fd_.release());
  LT_CHECK(rc == 0, "{}: close failed: {}", tmp_, errno_str(errno));
  rename_path(tmp_, path_);
  committed_ = true;
  fsync_parent_dir(path_);
}

// ---- ScratchFile ----------------------------------------------------------------------------------------------

ScratchFile::ScratchFile(const std::string& dir) : dir_(dir) {
  fd_ = UniqueFd(::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
  if (fd_.get() < 0 && (errno == EOPNOTSUPP || errno == EISDIR)) {  // a file system without O_TMPFILE
    std::string name = (std::filesystem::path(dir) / ".lazytrain-scratch-XXXXXX").string();
    fd_ = UniqueFd(::mkostemp(name.data(), O_CLOEXEC));
    if (fd_.get() >= 0) ::unlink(name.c_str());  // unnamed from here on, as O_TMPFILE would have made it
  }
  LT_CHECK(fd_.get() >= 0, "{}: cannot create an unnamed scratch file there: {}", dir, errno_str(errno));
  buffer_.reserve(kBufferBytes);
}

void ScratchFile::flush() {
  if (buffer_.empty()) return;
  write_all(fd_.get(), buffer_.data(), buffer_.size(), dir_ + " (scratch file)");
  buffer_.clear();
}

void ScratchFile::append(const void* data, size_t size) {
  size_ += size;
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const size_t take = std::min(size, kBufferBytes - buffer_.size());
    buffer_.insert(buffer_.end(), p, p + take);
    p += take;
    size -= take;
    if (buffer_.size() == kBufferBytes) flush();
  }
}

size_t ScratchFile::read_at(uint64_t offset, char* out, size_t size) {
  size = size_t(std::min<uint64_t>(size, size_ - offset));
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd_.get(), out + done, size - done, off_t(offset + done));
    if (n < 0 && errno == EINTR) continue;
    LT_CHECK(n > 0, "{} (scratch file): read failed at byte {} of {}: {}", dir_, offset + done, size_,
             n < 0 ? errno_str(errno) : "the file is shorter than written");
    done += size_t(n);
  }
  return done;
}

// ---- whole files, rename, fsync -------------------------------------------------------------------------------

void write_file_atomic(const std::string& path, std::span<const ByteSpan> pieces) {
  AtomicFile out(path);
  for (const ByteSpan& piece : pieces) out.append(piece.data, piece.size);
  out.commit();
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  ByteSpan piece{bytes.data(), bytes.size()};
  write_file_atomic(path, std::span<const ByteSpan>(&piece, 1));
}

void rename_path(const std::string& from, const std::string& to) {
  const IoFault fault = injected_io_fault(IoOp::rename, to);
  const int rc = fault.error ? (errno = fault.error, -1) : ::rename(from.c_str(), to.c_str());
  LT_CHECK(rc == 0, "{}: cannot rename {} over it: {}", to, from, errno_str(errno));
}

void fsync_path(const std::string& path, bool directory) {
  UniqueFd fd(::open(path.c_str(), (directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY) | O_CLOEXEC));
  LT_CHECK(fd.get() >= 0, "{}: cannot open to sync it: {}", path, errno_str(errno));
  LT_CHECK(checked_fsync(fd.get(), path) == 0, "{}: fsync failed: {}", path, errno_str(errno));
}

}  // namespace lt
