// train/data_cache.h — the tokenised-dataset cache file: write atomically, map and verify on read.
// The layout and what the key covers are in train/data_tokenize.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "train/data_tokenize.h"

namespace lt {

inline constexpr uint32_t kDataCacheVersion = 1;

// Writes `store` and `report` to `path` (tmp + fsync + rename). Throws lt::Error on I/O errors.
void write_token_cache(const std::string& path, const TokenStore& store, const DatasetReport& report);

// The cache at `path` mapped read-only, after checking magic, version, key, sizes, offsets and the
// payload checksum. Never throws for a bad file: `store` is null and `why_not` says what was wrong.
struct CacheRead {
  std::shared_ptr<const TokenStore> store;
  DatasetReport report;
  std::string why_not;
};
CacheRead read_token_cache(const std::string& path, uint64_t key);

}  // namespace lt
