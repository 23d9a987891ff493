// train/data_tokenize.h — datasets -> tokenised examples (token ids + a trainable flag per token), with
// the cutoff policy, bad-record policy, a report of what was kept, and the on-disk cache.
//
// One example = one record rendered by the chat template (text/chat_template.h) and tokenised segment
// by segment (tokenize_chat): trainable = the assistant turns' content and the token that closes each
// (<|im_end|>, or EOS for `plain`); system and user turns, role headers and the "\n" after <|im_end|>
// are not. The loader (train/data_loader.h) turns trainable 0 into label -100.
//
// cutoff_len: an example longer than it is truncated to its first cutoff_len tokens (`overlong:
// truncate`, the default) or dropped (`overlong: drop`); both are counted. An example with no trainable
// token after position 0 within the cutoff (a prompt that fills it) is dropped and counted as well: it
// would contribute nothing to the loss, and a batch of only such rows would have no counted token.
// (LLaMA-Factory instead shares the budget between prompt and response turn by turn; a plain prefix
// keeps the rendering a prefix of what inference sees.)
//
// on_bad_example: a malformed record (invalid JSON, missing field, wrong type, empty response, ...)
// stops the load with "path:line: what" (`stop`, the default), or is skipped and counted (`skip`), the
// first few messages kept for the report.
//
// Cache: with a cache_dir, each dataset's tokenised examples are written to
//   <cache_dir>/<name>-<key as 16 hex digits>.ltdata
// where the key is a 64-bit FNV-1a hash over everything that changes the result: the cache format
// version, the dataset spec (format, columns, tags), every data file's bytes and relative name, the
// tokenizer's tokenizer.json and tokenizer_config.json bytes, the template, cutoff_len and both policies.
// (FNV-1a is not cryptographic: a key says "same inputs" with a 2^-64 chance of a false match between
// two different inputs, which is enough to avoid redoing work; it is no defence against a crafted file.)
// A restart reads the files to hash them but neither parses nor tokenises them. The file is written
// atomically (tmp + fsync + rename) as the examples arrive (TokenCacheWriter: the data is never held whole,
// so a data set larger than memory tokenises) and read back with mmap, after its checksum is verified through
// read(2); one whose header, sizes, offsets or payload checksum do not match is rebuilt, and the report says
// why. A tokenizer that was not loaded from a file (Tokenizer::from_json) cannot be hashed, so it is never
// cached, and its examples are held in memory.
//
// Cache file layout (little-endian, every section 8-byte aligned; version 2 puts the sections whose size is
// known only at the end after the ids, which stream):
//   [0, 64)  header: char magic[8] = "LTDATA\0\1"; u32 version (2); u32 header bytes (64); u64 key;
//            u64 examples n; u64 tokens N; u64 report bytes R; u64 payload checksum (FNV-1a of all that
//            follows the header); u64 0
//   i32 ids[N], zero-padded to a multiple of 8 bytes
//   u8  trainable[N], zero-padded to a multiple of 8
//   i64 offsets[n + 1]      example i is tokens [offsets[i], offsets[i+1])
//   char report[R]          the DatasetReport as JSON (so a cache hit reports the same counts)
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/text.h"
#include "train/data_format.h"

namespace lt {

enum class Overlong { truncate, drop };
enum class OnBadExample { stop, skip };

// "truncate" | "drop", "stop" | "skip"; throw lt::Error listing the choices otherwise.
Overlong parse_overlong(std::string_view s);
OnBadExample parse_on_bad_example(std::string_view s);

struct TokenizeOptions {
  int64_t cutoff_len = 2048;
  Overlong overlong = Overlong::truncate;
  OnBadExample on_bad_example = OnBadExample::stop;
  std::string cache_dir = "";  // empty: no cache
};

enum class CacheUse { none, hit, built, rebuilt };
std::string_view cache_use_name(CacheUse c);

// What became of one dataset's records. Every record is exactly one of: bad, dropped (overlong or
// no_target) or an example.
struct DatasetReport {
  std::string name, path;
  int64_t records = 0;             // records read
  int64_t bad = 0;                 // malformed, skipped (on_bad_example: skip)
  int64_t truncated = 0;           // longer than cutoff_len, cut to it (and kept)
  int64_t dropped_overlong = 0;    // longer than cutoff_len, dropped (overlong: drop)
  int64_t dropped_no_target = 0;   // no trainable token within cutoff_len
  int64_t examples = 0;            // kept
  int64_t tokens = 0;              // in kept examples
  int64_t trainable_tokens = 0;    // of those, trained on
  std::vector<std::string> bad_messages;  // "path:line: what", the first kMaxBadMessages
  CacheUse cache = CacheUse::none;
  std::string cache_path;
  std::string cache_note;  // rebuilt: what was wrong with the old file; none: why there is no cache

  static constexpr size_t kMaxBadMessages = 10;
  nlohmann::json to_json() const;  // the counts and bad messages (not the cache fields)
  static DatasetReport from_json(const nlohmann::json& j);
  std::string summary() const;     // one line for the log
};

// Example ids and flags in one flat array each, with offsets; either owned or mapped from a cache file.
struct TokenStore {
  const int64_t* offsets = nullptr;   // [n + 1]
  const int32_t* ids = nullptr;       // [offsets[n]]
  const uint8_t* trainable = nullptr; // [offsets[n]]
  int64_t n = 0;
  uint64_t key = 0;                   // the cache key (0 for data built in memory without one)
  std::vector<int64_t> own_offsets;   // backing storage when owned
  std::vector<int32_t> own_ids;
  std::vector<uint8_t> own_trainable;
  std::shared_ptr<void> mapping;      // backing storage when mapped (munmap on release)
};

// Several datasets' examples, concatenated in the order given (LLaMA-Factory's default "concat" mix;
// the loader shuffles). Cheap to copy: the stores are shared and immutable.
class TokenizedDataset {
 public:
  TokenizedDataset() = default;
  // From examples in memory (tests, tools); no report, key from the contents.
  static TokenizedDataset from_examples(const std::vector<TokenizedChat>& examples);

  int64_t size() const { return size_; }
  std::span<const int32_t> ids(int64_t i) const;        // [T_i]
  std::span<const uint8_t> trainable(int64_t i) const;  // [T_i]
  int64_t length(int64_t i) const;
  int64_t max_length() const { return max_length_; }
  int64_t total_tokens() const { return total_tokens_; }
  // A hash of the parts' keys, in order: what the loader's cursor fingerprint is built on.
  uint64_t key() const { return key_; }
  const std::vector<DatasetReport>& reports() const { return reports_; }
  std::string summary() const;  // one line per dataset, then the totals

  // Appends a dataset's store (used by load_datasets).
  void add(std::shared_ptr<const TokenStore> store, DatasetReport report);

 private:
  struct Location {
    const TokenStore* store;
    int64_t index;
  };
  Location locate(int64_t i) const;

  std::vector<std::shared_ptr<const TokenStore>> stores_;
  std::vector<int64_t> starts_;  // [stores + 1] first global index of each store
  std::vector<DatasetReport> reports_;
  int64_t size_ = 0, max_length_ = 0, total_tokens_ = 0;
  uint64_t key_ = 0xcbf29ce484222325ull;
};

// Renders and tokenises one conversation (before any cutoff).
TokenizedChat tokenize_conversation(const Tokenizer& tokenizer, const ChatTemplate& tpl,
                                    std::span<const ChatMessage> messages);

enum class CutoffResult { kept, truncated, dropped_overlong, dropped_no_target };
// Applies cutoff_len and the policy to `t` in place (truncating it when asked).
CutoffResult apply_cutoff(TokenizedChat& t, int64_t cutoff_len, Overlong overlong);

// Reads, converts and tokenises every dataset (or loads it from the cache), in order. Throws lt::Error
// on the first bad record with on_bad_example = stop, on unreadable files and broken JSON arrays, and
// when no example is left.
TokenizedDataset load_datasets(const std::vector<DatasetSpec>& specs, const Tokenizer& tokenizer,
                               const ChatTemplate& tpl, const TokenizeOptions& options);

// FNV-1a 64 (exposed for tests and the other caches that may want it).
inline constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
uint64_t fnv1a64(const void* data, size_t size, uint64_t h = kFnvOffset);
// The cache path load_datasets uses for a dataset name and key.
std::string data_cache_path(const std::string& cache_dir, const std::string& name, uint64_t key);

}  // namespace lt
