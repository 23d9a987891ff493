#include "train/data_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/error.h"
#include "io/json_file.h"
#include "io/unique_fd.h"

namespace lt {

namespace {

constexpr char kMagic[8] = {'L', 'T', 'D', 'A', 'T', 'A', '\0', '\1'};  // the version follows
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

// Byte sizes of the sections after the header, in file order, for n examples and N tokens.
struct Sections {
  uint64_t ids, trainable, offsets, report;
  uint64_t payload() const { return ids + trainable + offsets + report; }
};
Sections sections(uint64_t n, uint64_t tokens, uint64_t report_bytes) {
  return {pad8(4 * tokens), pad8(tokens), 8 * (n + 1), report_bytes};
}

const uint8_t kZeros[8] = {};

// FNV-1a of the `bytes` after the header, read in chunks rather than through the mapping: checking a file
// larger than memory must not make it all resident in this process.
uint64_t payload_checksum(int fd, uint64_t bytes, std::string* error) {
  std::vector<uint8_t> chunk(size_t(1) << 20);
  uint64_t h = kFnvOffset;
  for (uint64_t at = 0; at < bytes;) {
    const ssize_t n = ::pread(fd, chunk.data(), size_t(std::min<uint64_t>(chunk.size(), bytes - at)),
                              off_t(kHeaderBytes + at));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *error = fmt::format("cannot read: {}", n < 0 ? std::strerror(errno) : "shorter than its header says");
      return 0;
    }
    h = fnv1a64(chunk.data(), size_t(n), h);
    at += uint64_t(n);
  }
  return h;
}

std::string parent_dir(const std::string& path) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

}  // namespace

TokenCacheWriter::TokenCacheWriter(const std::string& path, uint64_t key)
    : out_(path), trainable_(parent_dir(path)), offsets_(parent_dir(path)), key_(key), checksum_(kFnvOffset) {
  const Header blank{};
  out_.append(&blank, sizeof blank);  // rewritten by commit() once the sizes and checksum are known
  const int64_t zero = 0;
  offsets_.append(&zero, sizeof zero);
}

void TokenCacheWriter::payload(const void* data, size_t size) {
  checksum_ = fnv1a64(data, size, checksum_);
  out_.append(data, size);
}

void TokenCacheWriter::add(std::span<const int32_t> ids, std::span<const uint8_t> trainable) {
  LT_CHECK(!ids.empty() && ids.size() == trainable.size(), "{}: an example of {} ids and {} flags", out_.path(),
           ids.size(), trainable.size());
  payload(ids.data(), ids.size_bytes());
  trainable_.append(trainable.data(), trainable.size());
  tokens_ += ids.size();
  ++n_;
  const int64_t end = int64_t(tokens_);
  offsets_.append(&end, sizeof end);
}

void TokenCacheWriter::commit(const DatasetReport& report) {
  const std::string report_text = report.to_json().dump();
  const Sections s = sections(n_, tokens_, report_text.size());
  payload(kZeros, s.ids - 4 * tokens_);
  trainable_.read_all([&](std::string_view chunk) { payload(chunk.data(), chunk.size()); });
  payload(kZeros, s.trainable - tokens_);
  offsets_.read_all([&](std::string_view chunk) { payload(chunk.data(), chunk.size()); });
  payload(report_text.data(), report_text.size());
  LT_CHECK_EQ(out_.size(), kHeaderBytes + s.payload(), "{}: cache sections", out_.path());

  Header h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kDataCacheVersion;
  h.header_bytes = kHeaderBytes;
  h.key = key_;
  h.n = n_;
  h.tokens = tokens_;
  h.report_bytes = report_text.size();
  h.checksum = checksum_;
  out_.write_at(0, &h, sizeof h);
  out_.commit();
}

CacheRead read_token_cache(const std::string& path, uint64_t key) {
  CacheRead r;
  const UniqueFd file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));  // open to verify the checksum through read(2)
  const int fd = file.get();
  if (fd < 0) {
    r.why_not = fmt::format("cannot open: {}", std::strerror(errno));
    return r;
  }
  struct stat st {};
  bool stat_ok = ::fstat(fd, &st) == 0;
  const uint64_t size = stat_ok ? uint64_t(st.st_size) : 0;
  void* addr = size >= kHeaderBytes ? ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
  int map_errno = errno;
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
  std::string read_error;
  const uint64_t checksum = payload_checksum(file.get(), s.payload(), &read_error);
  if (!read_error.empty()) {
    r.why_not = read_error;
    return r;
  }
  if (checksum != h.checksum) {
    r.why_not = "payload checksum mismatch (corrupt)";
    return r;
  }
  auto store = std::make_shared<TokenStore>();
  store->ids = reinterpret_cast<const int32_t*>(base + kHeaderBytes);
  store->trainable = base + kHeaderBytes + s.ids;
  store->offsets = reinterpret_cast<const int64_t*>(base + kHeaderBytes + s.ids + s.trainable);
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
    const char* text = reinterpret_cast<const char*>(base + kHeaderBytes + s.payload() - s.report);
    r.report = DatasetReport::from_json(nlohmann::json::parse(std::string_view(text, h.report_bytes)));
  } catch (const std::exception& e) {
    r.why_not = fmt::format("unreadable report section ({})", e.what());
    return r;
  }
  r.store = std::move(store);
  return r;
}

}  // namespace lt
