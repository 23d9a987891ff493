#include "train/data_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "io/json_file.h"

namespace lt {

namespace {

constexpr char kMagic[8] = {'L', 'T', 'D', 'A', 'T', 'A', '\0', '\1'};
constexpr uint32_t kHeaderBytes = 64;

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t header_bytes;
  uint64_t key;
  uint64_t n;
  uint64_t tokens;
  uint64_t report_bytes;
  uint64_t checksum;
  uint64_t reserved;
};
static_assert(sizeof(Header) == kHeaderBytes);

uint64_t pad8(uint64_t x) { return (x + 7) & ~uint64_t(7); }

// Byte sizes of the sections after the header, for n examples and N tokens.
struct Sections {
  uint64_t offsets, ids, trainable, report;
  uint64_t payload() const { return offsets + ids + trainable + report; }
};
Sections sections(uint64_t n, uint64_t tokens, uint64_t report_bytes) {
  return {8 * (n + 1), 4 * tokens, pad8(tokens), report_bytes};
}

}  // namespace

void write_token_cache(const std::string& path, const TokenStore& store, const DatasetReport& report) {
  const uint64_t n = uint64_t(store.n), tokens = uint64_t(store.offsets[store.n]);
  std::string report_text = report.to_json().dump();
  Sections s = sections(n, tokens, report_text.size());
  static const uint8_t zeros[8] = {};

  ByteSpan pieces[] = {
      {nullptr, 0},  // the header, filled below once the checksum is known
      {store.offsets, s.offsets},
      {store.ids, s.ids},
      {store.trainable, tokens},
      {zeros, s.trainable - tokens},
      {report_text.data(), report_text.size()},
  };
  uint64_t checksum = kFnvOffset;
  for (size_t i = 1; i < std::size(pieces); ++i) checksum = fnv1a64(pieces[i].data, pieces[i].size, checksum);

  Header h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kDataCacheVersion;
  h.header_bytes = kHeaderBytes;
  h.key = store.key;
  h.n = n;
  h.tokens = tokens;
  h.report_bytes = report_text.size();
  h.checksum = checksum;
  pieces[0] = {&h, sizeof h};
  write_file_atomic(path, std::span<const ByteSpan>(pieces));
}

CacheRead read_token_cache(const std::string& path, uint64_t key) {
  CacheRead r;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    r.why_not = fmt::format("cannot open: {}", std::strerror(errno));
    return r;
  }
  struct stat st {};
  bool stat_ok = ::fstat(fd, &st) == 0;
  const uint64_t size = stat_ok ? uint64_t(st.st_size) : 0;
  void* addr = size >= kHeaderBytes ? ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
  int map_errno = errno;
  ::close(fd);
  if (size < kHeaderBytes) {
    r.why_not = fmt::format("{} bytes, shorter than the {}-byte header", size, kHeaderBytes);
    return r;
  }
  if (addr == MAP_FAILED) {
    r.why_not = fmt::format("cannot map: {}", std::strerror(map_errno));
    return r;
  }
  std::shared_ptr<void> mapping(addr, [size](void* p) { ::munmap(p, size); });
  const auto* base = static_cast<const uint8_t*>(addr);
  Header h;
  std::memcpy(&h, base, sizeof h);

  if (std::memcmp(h.magic, kMagic, 8) != 0) {
    r.why_not = "not a LazyTrain data cache (bad magic)";
    return r;
  }
  if (h.version != kDataCacheVersion || h.header_bytes != kHeaderBytes) {
    r.why_not = fmt::format("format version {} (this build reads {})", h.version, kDataCacheVersion);
    return r;
  }
  if (h.key != key) {
    r.why_not = fmt::format("key {:016x} in the header, expected {:016x}", h.key, key);
    return r;
  }
  // Sizes are checked before any section is touched; the bounds keep the products from overflowing.
  if (h.n > (uint64_t(1) << 40) || h.tokens > (uint64_t(1) << 44) || h.report_bytes > (uint64_t(1) << 32)) {
    r.why_not = "implausible sizes in the header";
    return r;
  }
  Sections s = sections(h.n, h.tokens, h.report_bytes);
  if (size != kHeaderBytes + s.payload()) {
    r.why_not = fmt::format("{} bytes, the header implies {} (truncated?)", size, kHeaderBytes + s.payload());
    return r;
  }
  if (fnv1a64(base + kHeaderBytes, s.payload()) != h.checksum) {
    r.why_not = "payload checksum mismatch (corrupt)";
    return r;
  }
  auto store = std::make_shared<TokenStore>();
  store->offsets = reinterpret_cast<const int64_t*>(base + kHeaderBytes);
  store->ids = reinterpret_cast<const int32_t*>(base + kHeaderBytes + s.offsets);
  store->trainable = base + kHeaderBytes + s.offsets + s.ids;
  store->n = int64_t(h.n);
  store->key = key;
  store->mapping = mapping;
  bool offsets_ok = store->offsets[0] == 0 && uint64_t(store->offsets[store->n]) == h.tokens;
  for (int64_t i = 0; offsets_ok && i < store->n; ++i) offsets_ok = store->offsets[i] < store->offsets[i + 1];
  if (!offsets_ok) {
    r.why_not = "example offsets are not increasing from 0 to the token count";
    return r;
  }
  try {
    const char* text = reinterpret_cast<const char*>(base + kHeaderBytes + s.offsets + s.ids + s.trainable);
    r.report = DatasetReport::from_json(nlohmann::json::parse(std::string_view(text, h.report_bytes)));
  } catch (const std::exception& e) {
    r.why_not = fmt::format("unreadable report section ({})", e.what());
    return r;
  }
  r.store = std::move(store);
  return r;
}

}  // namespace lt
