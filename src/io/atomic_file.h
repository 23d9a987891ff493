// io/atomic_file.h — files that are either whole or absent: atomic writes, streamed or at once, and unnamed
// scratch files for what a writer has to hold before it knows where it goes.
//
// An atomic write goes to "<path>.tmp.<pid>", is fsync'ed, renamed over <path>, and the directory is fsync'ed:
// after a crash the path holds either the old file or the whole new one, never a torn write. Checkpoints, weight
// files (io/safetensors.h) and the data cache (train/data_cache.h) rely on this. Every write, fsync and rename
// goes through the fault seam (io/io_faults.h), and every error names the path and strerror.
//
//   AtomicFile out(path);            // <path>.tmp.<pid>, created now
//   out.append(header, 64);          // as the bytes come: nothing is held in memory beyond a 1 MiB buffer
//   out.append(body, n);
//   out.write_at(0, fixed, 64);      // a field known only at the end (a size, a checksum)
//   out.commit();                    // fsync, rename over path, fsync the directory
//   // destroyed without commit(): the temporary file is removed and path is untouched
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/unique_fd.h"

namespace lt {

// One piece of a file to write: `size` bytes at `data`. Lets a writer stream a header and many tensors
// to one file without first concatenating gigabytes in memory.
struct ByteSpan {
  const void* data;
  size_t size;
};

class AtomicFile {
 public:
  // Creates the temporary file beside `path`. Throws lt::Error naming it.
  explicit AtomicFile(std::string path);
  ~AtomicFile();  // removes the temporary file unless committed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void append(const void* data, size_t size);
  // Overwrites bytes already appended (flushes the buffer first).
  void write_at(uint64_t offset, const void* data, size_t size);
  uint64_t size() const { return size_; }
  // Flush, fsync, close, rename over the path, fsync its directory. Throws lt::Error; the temporary file is
  // then removed by the destructor and the path keeps its old contents.
  void commit();
  const std::string& path() const { return path_; }

 private:
  void flush();

  std::string path_, tmp_;
  UniqueFd fd_;
  bool committed_ = false;
  uint64_t size_ = 0;
  std::vector<char> buffer_;
};

// An unnamed file in a directory (O_TMPFILE: it has no name, so nothing is left behind whatever happens), for
// bytes a writer must keep until it knows where they go (train/data_cache.h keeps two sections there while the
// first streams). Appends are buffered; read_all() then hands the bytes back in order, a chunk at a time.
class ScratchFile {
 public:
  // `dir` must exist. Throws lt::Error naming it.
  explicit ScratchFile(const std::string& dir);
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  void append(const void* data, size_t size);
  uint64_t size() const { return size_; }
  // Calls sink(chunk) for the bytes appended, in order, in chunks of at most 1 MiB.
  template <typename Sink>
  void read_all(Sink&& sink);

 private:
  void flush();
  size_t read_at(uint64_t offset, char* out, size_t size);  // returns bytes read (< size only at the end)

  std::string dir_;
  UniqueFd fd_;
  uint64_t size_ = 0;
  std::vector<char> buffer_;
};

template <typename Sink>
void ScratchFile::read_all(Sink&& sink) {
  flush();
  std::vector<char> chunk(size_t(1) << 20);
  for (uint64_t at = 0; at < size_;) {
    const size_t n = read_at(at, chunk.data(), chunk.size());
    sink(std::string_view(chunk.data(), n));
    at += n;
  }
}

// Writes the pieces, in order, to `path` atomically. Throws lt::Error naming the path and strerror (ENOSPC,
// EACCES, ...); the temporary file is removed on failure.
void write_file_atomic(const std::string& path, std::span<const ByteSpan> pieces);
void write_file_atomic(const std::string& path, std::string_view bytes);

// rename(from, to) (atomic on one file system; over a directory that exists only when it is empty), and fsync of a
// file or directory. Throw lt::Error naming the paths and strerror; both go through the fault seam.
void rename_path(const std::string& from, const std::string& to);
void fsync_path(const std::string& path, bool directory);

}  // namespace lt
