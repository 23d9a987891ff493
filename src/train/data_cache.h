// train/data_cache.h — the tokenised-dataset cache file: written atomically as examples arrive, mapped and
// verified on read. The layout and what the key covers are in train/data_tokenize.h.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "io/atomic_file.h"
#include "train/data_tokenize.h"

namespace lt {

inline constexpr uint32_t kDataCacheVersion = 2;

// Writes a cache file example by example, so that a data set larger than memory is never held whole: the ids
// stream into the file, the trainable flags and offsets into two unnamed scratch files beside it (each a
// section that follows the ids), copied in at commit. Memory: a few MiB of buffers, whatever the data.
class TokenCacheWriter {
 public:
  // Starts <path>.tmp.<pid>. Throws lt::Error naming the path.
  TokenCacheWriter(const std::string& path, uint64_t key);
  // Appends one example (ids and flags of one length, at least one token). Throws lt::Error on I/O errors.
  void add(std::span<const int32_t> ids, std::span<const uint8_t> trainable);
  // Appends the sections and the report, writes the header, fsyncs and renames over the path. Throws lt::Error;
  // nothing is left at the path then (nor a temporary, once the writer is destroyed).
  void commit(const DatasetReport& report);

 private:
  void payload(const void* data, size_t size);  // appends after the header, into the checksum

  AtomicFile out_;
  ScratchFile trainable_, offsets_;
  uint64_t key_, n_ = 0, tokens_ = 0, checksum_;
};

// The cache at `path` mapped read-only, after checking magic, version, key, sizes, offsets and the
// payload checksum (read through a buffer, so checking does not make the file resident in this process).
// Never throws for a bad file: `store` is null and `why_not` says what was wrong.
struct CacheRead {
  std::shared_ptr<const TokenStore> store;
  DatasetReport report;
  std::string why_not;
};
CacheRead read_token_cache(const std::string& path, uint64_t key);

}  // namespace lt
