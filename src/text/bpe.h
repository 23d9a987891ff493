// text/bpe.h — byte-level BPE: the GPT-2 byte alphabet, the merge table, the merge loop and its cache.
//
// The vocabulary of a byte-level tokenizer is written in an alphabet of 256 printable characters, one
// per byte ("Ġ" is the space byte 0x20). We convert every token to its raw bytes once at load, so that
// encoding never builds alphabet strings: a piece's bytes are looked up directly.
//
// The merge loop is HF's: one symbol per byte, a min-heap of candidate merges ordered by (rank, position
// of the left symbol), stale candidates skipped when popped. O(n log n) in the piece length, not a
// quadratic rescan. Results are cached per piece text (most words repeat), in a sharded map with one
// mutex per shard so that several threads can encode at once.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace lt {

// The GPT-2 byte-to-unicode alphabet: bytes 33..126, 161..172, 174..255 map to themselves, the other 68
// to U+0100.. in byte order.
char32_t byte_to_unicode(uint8_t b);
// The byte a character of the alphabet stands for, or -1 when the character is not in it.
int unicode_to_byte(char32_t cp);
// The raw bytes of a token written in the alphabet, or nullopt when a character is outside it.
std::optional<std::string> byte_level_decode(std::string_view token);
// The alphabet form of raw bytes (what HF's convert_ids_to_tokens shows).
std::string byte_level_encode(std::string_view bytes);

// One merge rule: left + right -> merged, all vocabulary ids. Rank is the position in the merge list.
// Heterogeneous lookup of std::string keys by std::string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

struct BpeMerge {
  int32_t left, right, merged;
};

class BpeModel {
 public:
  // token_bytes[id]: raw bytes of vocabulary token `id` (empty where there is none). Every single byte
  // must be a token. merges in rank order; a pair listed twice keeps its LAST rank, as HF and JS do.
  // ignore_merges: a piece that is a whole vocabulary token is that token (Llama 3), before any merge.
  BpeModel(const std::vector<std::string>& token_bytes, const std::vector<BpeMerge>& merges, bool ignore_merges,
           const std::string& source);
  ~BpeModel();

  // Appends the ids of one piece (raw bytes, non-empty). Cached; thread-safe.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  // The merge loop alone, without the cache (the tests compare it with a plain quadratic reference).
  void merge_piece(std::string_view piece, std::vector<int32_t>& out) const;

  size_t cache_entries() const;
  void clear_cache() const;

 private:
  struct MergeTable;
  struct Cache;
  std::array<int32_t, 256> byte_id_{};
  std::unique_ptr<MergeTable> merges_;
  std::unique_ptr<Cache> cache_;
  bool ignore_merges_ = false;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> whole_tokens_;  // only with ignore_merges
};

}  // namespace lt
