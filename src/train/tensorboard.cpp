#include "train/tensorboard.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>

#include "core/error.h"
#include "io/json_file.h"
#include "io/paths.h"

namespace lt {
namespace {

std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;  // Castagnoli, reflected
    t[i] = c;
  }
  return t;
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(uint8_t(v) | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}

template <typename T>
void put_fixed(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian host (x86-64, arm64)
  out.append(b, sizeof(T));
}

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_varint(out, (uint64_t(field) << 3) | 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}

std::string event_header(double wall_time, int64_t step) {
  std::string e;
  put_varint(e, (1u << 3) | 1);  // wall_time: fixed64
  put_fixed(e, wall_time);
  put_varint(e, (2u << 3) | 0);  // step: varint
  put_varint(e, uint64_t(step));
  return e;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = crc32c_table();
  auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  make_directories(dir, "report_to tensorboard");
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  path_ = fmt::format("{}/events.out.tfevents.{}.{}.{}", dir, int64_t(now_seconds()), host, getpid());
  file_ = std::fopen(path_.c_str(), "wb");
  LT_CHECK(file_ != nullptr, "{}: cannot create the TensorBoard event file: {}", path_, std::strerror(errno));
  std::string e = event_header(now_seconds(), 0);
  put_bytes(e, 3, "brain.Event:2");
  write_record(e);
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) {
    std::fflush(file_);
    fsync(fileno(file_));
    std::fclose(file_);
  }
}

void TensorBoardWriter::add_scalar(std::string_view tag, int64_t step, double value, double wall_time) {
  std::string v;
  put_bytes(v, 1, tag);
  put_varint(v, (2u << 3) | 5);  // simple_value: fixed32 float
  put_fixed(v, float(value));
  std::string summary;
  put_bytes(summary, 1, v);
  std::string e = event_header(wall_time >= 0 ? wall_time : now_seconds(), step);
  put_bytes(e, 5, summary);
  write_record(e);
}

void TensorBoardWriter::write_record(const std::string& event) {
  std::string rec;
  put_fixed(rec, uint64_t(event.size()));
  uint32_t len_crc = masked_crc32c(rec.data(), 8);
  put_fixed(rec, len_crc);
  rec += event;
  put_fixed(rec, masked_crc32c(event.data(), event.size()));
  LT_CHECK(std::fwrite(rec.data(), 1, rec.size(), file_) == rec.size(), "{}: write failed: {}", path_,
           std::strerror(errno));
}

void TensorBoardWriter::flush() {
  LT_CHECK(std::fflush(file_) == 0 && fsync(fileno(file_)) == 0, "{}: flush failed: {}", path_, std::strerror(errno));
}

namespace {

struct Cursor {
  const uint8_t* p;
  const uint8_t* end;
  const std::string& path;
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      LT_CHECK(p < end, "{}: truncated varint in an event", path);
      uint8_t b = *p++;
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    LT_FAIL("{}: varint too long in an event", path);
  }
  template <typename T>
  T fixed() {
    LT_CHECK(size_t(end - p) >= sizeof(T), "{}: truncated field in an event", path);
    T v;
    std::memcpy(&v, p, sizeof(T));
    p += sizeof(T);
    return v;
  }
  std::string_view bytes() {
    uint64_t n = varint();
    LT_CHECK(uint64_t(end - p) >= n, "{}: truncated bytes in an event", path);
    std::string_view s(reinterpret_cast<const char*>(p), n);
    p += n;
    return s;
  }
  void skip(uint32_t wire) {
    if (wire == 0) varint();
    else if (wire == 1) fixed<uint64_t>();
    else if (wire == 2) bytes();
    else if (wire == 5) fixed<uint32_t>();
    else LT_FAIL("{}: unsupported wire type {} in an event", path, wire);
  }
};

}  // namespace

std::vector<TensorBoardScalar> read_tensorboard_scalars(const std::string& path) {
  std::string data = read_file(path);
  std::vector<TensorBoardScalar> out;
  size_t off = 0;
  while (off < data.size()) {
    LT_CHECK(data.size() - off >= 12, "{}: truncated record header at offset {}", path, off);
    uint64_t len;
    uint32_t len_crc;
    std::memcpy(&len, data.data() + off, 8);
    std::memcpy(&len_crc, data.data() + off + 8, 4);
    LT_CHECK(len_crc == masked_crc32c(data.data() + off, 8), "{}: bad length CRC at offset {}", path, off);
    LT_CHECK(data.size() - off - 12 >= len + 4, "{}: truncated record at offset {}", path, off);
    const char* ev = data.data() + off + 12;
    uint32_t data_crc;
    std::memcpy(&data_crc, ev + len, 4);
    LT_CHECK(data_crc == masked_crc32c(ev, len), "{}: bad data CRC at offset {}", path, off);
    Cursor c{reinterpret_cast<const uint8_t*>(ev), reinterpret_cast<const uint8_t*>(ev + len), path};
    double wall = 0;
    int64_t step = 0;
    std::vector<std::pair<std::string, float>> values;
    while (c.p < c.end) {
      uint64_t key = c.varint();
      uint32_t field = uint32_t(key >> 3), wire = uint32_t(key & 7);
      if (field == 1 && wire == 1) wall = c.fixed<double>();
      else if (field == 2 && wire == 0) step = int64_t(c.varint());
      else if (field == 5 && wire == 2) {
        std::string_view summary = c.bytes();
        Cursor s{reinterpret_cast<const uint8_t*>(summary.data()),
                 reinterpret_cast<const uint8_t*>(summary.data() + summary.size()), path};
        while (s.p < s.end) {
          uint64_t sk = s.varint();
          if ((sk >> 3) != 1 || (sk & 7) != 2) { s.skip(uint32_t(sk & 7)); continue; }
          std::string_view value = s.bytes();
          Cursor v{reinterpret_cast<const uint8_t*>(value.data()),
                   reinterpret_cast<const uint8_t*>(value.data() + value.size()), path};
          std::string tag;
          float x = 0;
          while (v.p < v.end) {
            uint64_t vk = v.varint();
            if ((vk >> 3) == 1 && (vk & 7) == 2) tag = std::string(v.bytes());
            else if ((vk >> 3) == 2 && (vk & 7) == 5) x = v.fixed<float>();
            else v.skip(uint32_t(vk & 7));
          }
          values.push_back({tag, x});
        }
      } else {
        c.skip(wire);
      }
    }
    for (auto& [tag, x] : values) out.push_back({tag, step, wall, x});
    off += 12 + len + 4;
  }
  return out;
}

}  // namespace lt
