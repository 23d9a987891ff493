#include "text/bpe.h"

#include <algorithm>
#include <mutex>

#include "core/error.h"
#include "text/utf8.h"

namespace lt {

namespace {

struct Alphabet {
  std::array<char32_t, 256> to_unicode{};
  std::array<int16_t, 324> to_byte{};  // every character of the alphabet is below U+0144
  Alphabet() {
    to_byte.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      to_unicode[size_t(b)] = printable ? char32_t(b) : char32_t(256 + extra++);
      to_byte[to_unicode[size_t(b)]] = int16_t(b);
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet a;
  return a;
}

}  // namespace

char32_t byte_to_unicode(uint8_t b) { return alphabet().to_unicode[b]; }

int unicode_to_byte(char32_t cp) { return cp < alphabet().to_byte.size() ? alphabet().to_byte[cp] : -1; }

std::optional<std::string> byte_level_decode(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  const auto* p = reinterpret_cast<const unsigned char*>(token.data());
  size_t i = 0;
  while (i < token.size()) {
    int bad = 0;
    int len = utf8_sequence_length(p + i, token.size() - i, &bad);
    if (len == 0) return std::nullopt;
    int b = unicode_to_byte(utf8_decode(p + i, len));
    if (b < 0) return std::nullopt;
    out.push_back(char(b));
    i += size_t(len);
  }
  return out;
}

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) utf8_append(out, byte_to_unicode(b));
  return out;
}

// Open addressing over (left << 32 | right) keys: one probe sequence of 16-byte slots, no allocation per
// entry. Ids are below 2^31, so the all-ones key never occurs and marks an empty slot.
struct BpeModel::MergeTable {
  struct Slot {
    uint64_t key = ~uint64_t(0);
    int32_t rank = 0, merged = 0;
  };
  std::vector<Slot> slots;
  uint64_t mask = 0;

  explicit MergeTable(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    slots.resize(cap);
    mask = cap - 1;
  }
  static uint64_t key_of(int32_t a, int32_t b) { return uint64_t(uint32_t(a)) << 32 | uint32_t(b); }
  static uint64_t hash(uint64_t k) { return (k * 0x9E3779B97F4A7C15ull) >> 20; }
  void put(int32_t a, int32_t b, int32_t rank, int32_t merged) {
    uint64_t k = key_of(a, b);
    for (uint64_t i = hash(k) & mask;; i = (i + 1) & mask) {
      if (slots[i].key == k || slots[i].key == ~uint64_t(0)) {
        slots[i] = Slot{k, rank, merged};
        return;
      }
    }
  }
  const Slot* find(int32_t a, int32_t b) const {
    uint64_t k = key_of(a, b);
    for (uint64_t i = hash(k) & mask;; i = (i + 1) & mask) {
      if (slots[i].key == k) return &slots[i];
      if (slots[i].key == ~uint64_t(0)) return nullptr;
    }
  }
};

// Sharded by the hash of the piece; a full shard is cleared (simple, and the working set of a corpus
// refills it quickly). Bounded: kShards * kMaxPerShard entries of pieces shorter than kMaxPieceBytes.
struct BpeModel::Cache {
  static constexpr size_t kShards = 64;
  static constexpr size_t kMaxPerShard = 8192;
  static constexpr size_t kMaxPieceBytes = 256;
  struct Shard {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map;
  };
  std::array<Shard, kShards> shards;
};

BpeModel::BpeModel(const std::vector<std::string>& token_bytes, const std::vector<BpeMerge>& merges,
                   bool ignore_merges, const std::string& source)
    : merges_(std::make_unique<MergeTable>(merges.size())),
      cache_(std::make_unique<Cache>()),
      ignore_merges_(ignore_merges) {
  byte_id_.fill(-1);
  for (size_t id = 0; id < token_bytes.size(); ++id) {
    const std::string& t = token_bytes[id];
    if (t.size() == 1 && byte_id_[uint8_t(t[0])] < 0) byte_id_[uint8_t(t[0])] = int32_t(id);
    if (ignore_merges && !t.empty()) whole_tokens_.emplace(t, int32_t(id));
  }
  for (int b = 0; b < 256; ++b) {
    LT_CHECK(byte_id_[size_t(b)] >= 0,
             "{}: the vocabulary has no token for byte 0x{:02X} ('{}'), so it is not a byte-level BPE vocabulary",
             source, b, byte_level_encode(std::string(1, char(b))));
  }
  for (size_t r = 0; r < merges.size(); ++r) merges_->put(merges[r].left, merges[r].right, int32_t(r), merges[r].merged);
}

BpeModel::~BpeModel() = default;

void BpeModel::merge_piece(std::string_view piece, std::vector<int32_t>& out) const {
  const size_t n = piece.size();
  if (n == 1) {
    out.push_back(byte_id_[uint8_t(piece[0])]);
    return;
  }
  struct Symbol {
    int32_t id, prev, next;  // id -1: merged into its left neighbour
  };
  struct Candidate {
    int32_t rank, pos, left, right, merged;
    // std heap functions build a max-heap: "greater" puts the lowest (rank, pos) on top.
    bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Symbol> sym(n);
  for (size_t i = 0; i < n; ++i) sym[i] = Symbol{byte_id_[uint8_t(piece[i])], int32_t(i) - 1, int32_t(i) + 1};
  sym[n - 1].next = -1;
  std::vector<Candidate> heap;
  heap.reserve(n);
  auto push = [&](int32_t pos) {
    const Symbol& l = sym[size_t(pos)];
    const Symbol& r = sym[size_t(l.next)];
    if (const MergeTable::Slot* m = merges_->find(l.id, r.id)) {
      heap.push_back(Candidate{m->rank, pos, l.id, r.id, m->merged});
      std::push_heap(heap.begin(), heap.end());
    }
  };
  for (size_t i = 0; i + 1 < n; ++i) push(int32_t(i));
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    Candidate c = heap.back();
    heap.pop_back();
    Symbol& l = sym[size_t(c.pos)];
    if (l.id != c.left || l.next < 0) continue;  // stale: the left symbol changed
    Symbol& r = sym[size_t(l.next)];
    if (r.id != c.right) continue;  // stale: the right neighbour changed
    l.id = c.merged;
    r.id = -1;
    l.next = r.next;
    if (l.next >= 0) sym[size_t(l.next)].prev = c.pos;
    if (l.prev >= 0) push(l.prev);
    if (l.next >= 0) push(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = sym[size_t(i)].next) out.push_back(sym[size_t(i)].id);
}

void BpeModel::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_id_[uint8_t(piece[0])]);
    return;
  }
  if (ignore_merges_) {
    if (auto it = whole_tokens_.find(piece); it != whole_tokens_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (piece.size() >= Cache::kMaxPieceBytes) {
    merge_piece(piece, out);
    return;
  }
  size_t h = StringHash{}(piece);
  Cache::Shard& shard = cache_->shards[(h >> 7) % Cache::kShards];
  {
    std::lock_guard<std::mutex> lock(shard.mutex);
    if (auto it = shard.map.find(piece); it != shard.map.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  size_t start = out.size();
  merge_piece(piece, out);
  std::vector<int32_t> ids(out.begin() + std::ptrdiff_t(start), out.end());
  std::lock_guard<std::mutex> lock(shard.mutex);
  if (shard.map.size() >= Cache::kMaxPerShard) shard.map.clear();
  shard.map.emplace(std::string(piece), std::move(ids));
}

size_t BpeModel::cache_entries() const {
  size_t n = 0;
  for (Cache::Shard& s : cache_->shards) {
    std::lock_guard<std::mutex> lock(s.mutex);
    n += s.map.size();
  }
  return n;
}

void BpeModel::clear_cache() const {
  for (Cache::Shard& s : cache_->shards) {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.map.clear();
  }
}

}  // namespace lt
