#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/aligned.h"
#include "core/error.h"
#include "io/json_file.h"
#include "io/paths.h"

namespace lt {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kMetadataKey = "__metadata__";

uint64_t load_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

void store_u64_le(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i));
}

// The only dtypes safetensors spells that we hold; the exact upper-case spelling is required.
DType parse_st_dtype(const json& j, const std::string& where) {
  LT_CHECK(j.is_string(), "{}: 'dtype' is {}, expected a string such as \"BF16\"", where, j.type_name());
  const std::string& s = j.get_ref<const std::string&>();
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i8, DType::u8, DType::i32, DType::i64})
    if (s == dtype_safetensors_name(t)) return t;
  LT_FAIL("{}: unknown dtype '{}' (supported: F32, BF16, F16, I8, U8, I32, I64)", where, s);
}

// The header is parsed from text, where nlohmann stores every non-negative integer as unsigned; a signed
// integer there is a negative one.
Shape parse_st_shape(const json& j, const std::string& where) {
  LT_CHECK(j.is_array(), "{}: 'shape' is {}, expected an array of non-negative integers", where, j.type_name());
  Shape shape;
  for (const json& d : j) {
    LT_CHECK(d.is_number_integer(), "{}: 'shape' holds {} {}, expected non-negative integers", where, d.type_name(),
             d.dump());
    LT_CHECK(d.is_number_unsigned(), "{}: 'shape' has negative dimension {}", where, d.get<int64_t>());
    uint64_t v = d.get<uint64_t>();
    LT_CHECK(v <= uint64_t(INT64_MAX), "{}: 'shape' dimension {} is too large", where, v);
    shape.push_back(int64_t(v));
  }
  return shape;
}

SafetensorsTensorInfo parse_entry(const std::string& path, const std::string& name, const json& e,
                                  size_t data_size) {
  std::string where = fmt::format("{}: tensor '{}'", path, name);
  LT_CHECK(e.is_object(), "{}: header entry is {}, expected an object with dtype, shape and data_offsets", where,
           e.type_name());
  for (const char* key : {"dtype", "shape", "data_offsets"})
    LT_CHECK(e.contains(key), "{}: header entry has no '{}'", where, key);

  SafetensorsTensorInfo info;
  info.dtype = parse_st_dtype(e["dtype"], where);
  info.shape = parse_st_shape(e["shape"], where);

  const json& off = e["data_offsets"];
  LT_CHECK(off.is_array() && off.size() == 2, "{}: 'data_offsets' is {}, expected [begin, end]", where, off.dump());
  for (const json& o : off)
    LT_CHECK(o.is_number_unsigned(), "{}: 'data_offsets' {} must be non-negative integers", where, off.dump());
  info.begin = off[0].get<uint64_t>();
  info.end = off[1].get<uint64_t>();
  LT_CHECK(info.begin <= info.end, "{}: 'data_offsets' [{}, {}) has begin after end", where, info.begin, info.end);

  // shape x dtype size, with overflow checked: a corrupt shape must not wrap around to a plausible size.
  uint64_t bytes = dtype_size(info.dtype);
  for (int64_t d : info.shape)
    LT_CHECK(!__builtin_mul_overflow(bytes, uint64_t(d), &bytes), "{}: shape {} overflows 64 bits of bytes", where,
             shape_str(info.shape));
  LT_CHECK(bytes == info.end - info.begin,
           "{}: shape {} of {} needs {} bytes but 'data_offsets' [{}, {}) span {} bytes", where,
           shape_str(info.shape), dtype_safetensors_name(info.dtype), bytes, info.begin, info.end,
           info.end - info.begin);
  LT_CHECK(info.end <= data_size, "{}: 'data_offsets' [{}, {}) reach outside the data area of {} bytes", where,
           info.begin, info.end, data_size);
  return info;
}

SafetensorsMetadata parse_metadata(const std::string& path, const json& m) {
  LT_CHECK(m.is_object(), "{}: '__metadata__' is {}, expected an object of strings", path, m.type_name());
  SafetensorsMetadata out;
  for (const auto& [key, value] : m.items()) {
    LT_CHECK(value.is_string(), "{}: '__metadata__' value of '{}' is {} {}, expected a string", path, key,
             value.type_name(), value.dump());
    out[key] = value.get<std::string>();
  }
  return out;
}

// Sorted by offset, the ranges must tile [0, data_size): each begins where the previous ended.
void check_tiling(const std::string& path, const std::map<std::string, SafetensorsTensorInfo>& tensors,
                  size_t data_size) {
  std::vector<std::pair<const std::string*, const SafetensorsTensorInfo*>> order;
  for (const auto& [name, info] : tensors) order.emplace_back(&name, &info);
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return std::pair(a.second->begin, a.second->end) < std::pair(b.second->begin, b.second->end);
  });
  size_t pos = 0;
  const std::string* prev = nullptr;
  for (const auto& [name, info] : order) {
    LT_CHECK(info->begin >= pos, "{}: tensor '{}' data_offsets [{}, {}) overlap tensor '{}' which ends at {}", path,
             *name, info->begin, info->end, prev ? *prev : "", pos);
    LT_CHECK(info->begin == pos, "{}: hole in the data area: bytes [{}, {}) before tensor '{}' belong to no tensor",
             path, pos, info->begin, *name);
    pos = info->end;
    prev = name;
  }
  LT_CHECK(pos == data_size, "{}: hole in the data area: bytes [{}, {}) after the last tensor belong to no tensor",
           path, pos, data_size);
}

}  // namespace

// ---- reading ------------------------------------------------------------------------------------------

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  LT_CHECK(fd >= 0, "{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  int stat_rc = ::fstat(fd, &st);
  int stat_errno = errno;
  size_t size = size_t(st.st_size);
  void* p = MAP_FAILED;
  int map_errno = 0;
  if (stat_rc == 0 && S_ISREG(st.st_mode) && size >= 8) {
    p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    map_errno = errno;
  }
  ::close(fd);  // the mapping keeps the file alive
  LT_CHECK(stat_rc == 0, "{}: cannot stat: {}", path, std::strerror(stat_errno));
  LT_CHECK(S_ISREG(st.st_mode), "{}: not a regular file", path);
  LT_CHECK(size >= 8, "{}: file is {} bytes, too short for a safetensors file (the header length alone is 8 bytes)",
           path, size);
  LT_CHECK(p != MAP_FAILED, "{}: mmap of {} bytes failed: {}", path, size, std::strerror(map_errno));

  SafetensorsFile f;  // owns the mapping from here: a throw below unmaps it
  f.path_ = path;
  f.map_ = static_cast<const uint8_t*>(p);
  f.map_size_ = size;

  uint64_t n = load_u64_le(f.map_);
  LT_CHECK(n > 0, "{}: header length is 0, expected a JSON header", path);
  LT_CHECK(n <= kSafetensorsMaxHeaderBytes, "{}: header length {} exceeds the {} byte cap (corrupt or not safetensors)",
           path, n, kSafetensorsMaxHeaderBytes);
  LT_CHECK(n <= size - 8, "{}: header length {} exceeds the {} bytes after the length field (truncated file?)", path,
           n, size - 8);
  f.data_start_ = 8 + size_t(n);
  size_t data_size = size - f.data_start_;

  json header = parse_json(std::string_view(reinterpret_cast<const char*>(f.map_ + 8), n), path + " header");
  LT_CHECK(header.is_object(), "{}: header is a JSON {}, expected an object", path, header.type_name());
  for (const auto& [name, entry] : header.items()) {
    if (name == kMetadataKey)
      f.metadata_ = parse_metadata(path, entry);
    else
      f.tensors_[name] = parse_entry(path, name, entry, data_size);
  }
  check_tiling(path, f.tensors_, data_size);
  return f;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)),
      map_(std::exchange(o.map_, nullptr)),
      map_size_(std::exchange(o.map_size_, 0)),
      data_start_(o.data_start_),
      tensors_(std::move(o.tensors_)),
      metadata_(std::move(o.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    unmap();
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    map_size_ = std::exchange(o.map_size_, 0);
    data_start_ = o.data_start_;
    tensors_ = std::move(o.tensors_);
    metadata_ = std::move(o.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { unmap(); }

void SafetensorsFile::unmap() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), map_size_);
  map_ = nullptr;
  map_size_ = 0;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& kv : tensors_) out.push_back(kv.first);
  return out;
}

const SafetensorsTensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = tensors_.find(name);
  LT_CHECK(it != tensors_.end(), "{}: no tensor named '{}' ({} tensors in the file)", path_, name, tensors_.size());
  return it->second;
}

TensorView SafetensorsFile::view(const std::string& name) const {
  const SafetensorsTensorInfo& i = info(name);
  // const_cast: TensorView has no const flavour; the PROT_READ mapping turns a stray write into a fault.
  return TensorView::contiguous(const_cast<uint8_t*>(map_ + data_start_ + i.begin), i.dtype, i.shape);
}

void SafetensorsFile::read_f32(const std::string& name, float* dst, const Shape& expected, ElementRange range) const {
  copy_tensor_to_f32(dst, view(name), expected, name, path_, range);
}

void copy_tensor_to_f32(float* dst, const TensorView& src, const Shape& expected, const std::string& name,
                        const std::string& file, ElementRange range) {
  LT_CHECK(src.shape == expected, "{}: tensor '{}' has shape {}, expected {}", file, name, shape_str(src.shape),
           shape_str(expected));
  LT_CHECK(src.dtype == DType::f32 || src.dtype == DType::bf16 || src.dtype == DType::f16,
           "{}: tensor '{}' is {}, expected a floating type (F32, BF16 or F16)", file, name,
           dtype_safetensors_name(src.dtype));
  LT_CHECK(src.is_contiguous(), "{}: tensor '{}' is not contiguous", file, name);
  const size_t esize = dtype_size(src.dtype);
  const int64_t end = range.end < 0 ? src.numel() : range.end;
  LT_CHECK(0 <= range.begin && range.begin <= end && end <= src.numel(),
           "{}: tensor '{}': elements [{}, {}) asked of its {}", file, name, range.begin, end, src.numel());
  const size_t n = size_t(end - range.begin);
  if (n == 0) return;  // dst may be null then, and memcpy(nullptr, ..., 0) is still undefined
  dst += range.begin;
  const uint8_t* s = static_cast<const uint8_t*>(src.data) + size_t(range.begin) * esize;
  if (reinterpret_cast<uintptr_t>(s) % esize == 0) {
    convert_to_f32(dst, s, src.dtype, n);
    return;
  }
  // Unaligned source (a writer that did not pad its header): the vector conversions want aligned
  // elements, so go through an aligned bounce buffer a chunk at a time.
  constexpr size_t kChunk = size_t(1) << 16;
  AlignedBuffer<uint8_t> bounce(kChunk * esize, 64);
  for (size_t i = 0; i < n; i += kChunk) {
    size_t m = std::min(kChunk, n - i);
    std::memcpy(bounce.data(), s + i * esize, m * esize);
    convert_to_f32(dst + i, bounce.data(), src.dtype, m);
  }
}

// ---- writing ------------------------------------------------------------------------------------------

void write_safetensors(const std::string& path, const NamedTensors& tensors, const SafetensorsMetadata& extra) {
  // Data order: larger dtypes first, then by name. With an 8-aligned data area every tensor then starts
  // at a multiple of its own dtype size, and the ranges still tile the data area with no padding.
  std::vector<const NamedTensors::value_type*> order;
  for (const auto& kv : tensors) {
    const auto& [name, t] = kv;
    LT_CHECK(!name.empty() && name != kMetadataKey, "{}: invalid tensor name '{}'", path, name);
    LT_CHECK(t.is_contiguous(), "{}: tensor '{}' of shape {} is not contiguous", path, name, shape_str(t.shape));
    LT_CHECK(t.data != nullptr || t.bytes() == 0, "{}: tensor '{}' has no data", path, name);
    order.push_back(&kv);
  }
  std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return dtype_size(a->second.dtype) > dtype_size(b->second.dtype);
  });

  json header = json::object();  // std::map-backed: keys come out sorted
  std::vector<ByteSpan> pieces(2);
  size_t offset = 0;
  for (const auto* kv : order) {
    const TensorView& t = kv->second;
    header[kv->first] = {{"dtype", dtype_safetensors_name(t.dtype)},
                         {"shape", t.shape},
                         {"data_offsets", {offset, offset + t.bytes()}}};
    pieces.push_back({t.data, t.bytes()});
    offset += t.bytes();
  }
  json meta(extra);
  meta["format"] = "pt";  // what torch-saved files carry; transformers' loader checks it
  header[kMetadataKey] = meta;

  std::string text = header.dump();
  text.append(align_up(text.size(), 8) - text.size(), ' ');  // 8 + len(text) is then a multiple of 8
  uint8_t len[8];
  store_u64_le(len, text.size());
  pieces[0] = {len, 8};
  pieces[1] = {text.data(), text.size()};
  write_file_atomic(path, pieces);
}

// ---- model directories --------------------------------------------------------------------------------

std::string safetensors_shard_name(size_t index, size_t count) {
  return fmt::format("model-{:05d}-of-{:05d}.safetensors", index + 1, count);
}

namespace {

// Reads model.safetensors.index.json into tensor -> shard file name.
std::map<std::string, std::string> read_weight_map(const std::string& index_path) {
  json index = read_json_file(index_path);
  LT_CHECK(index.is_object(), "{}: is a JSON {}, expected an object", index_path, index.type_name());
  LT_CHECK(index.contains("weight_map"), "{}: has no 'weight_map'", index_path);
  const json& wm = index["weight_map"];
  LT_CHECK(wm.is_object(), "{}: 'weight_map' is {}, expected an object", index_path, wm.type_name());
  // "metadata.total_size" is informational: transformers does not check it and some published indexes
  // disagree with their shards, so it is not checked here either.
  std::map<std::string, std::string> out;
  for (const auto& [name, file] : wm.items()) {
    LT_CHECK(file.is_string(), "{}: 'weight_map' entry of tensor '{}' is {}, expected a file name", index_path, name,
             file.type_name());
    const std::string& f = file.get_ref<const std::string&>();
    LT_CHECK(!f.empty() && f.find('/') == std::string::npos && f != "..",
             "{}: tensor '{}' maps to '{}', expected a file name in the same directory", index_path, name, f);
    out[name] = f;
  }
  return out;
}

void remove_if_present(const std::string& path) {
  std::error_code ec;
  fs::remove(path, ec);
  LT_CHECK(!ec, "{}: cannot remove: {}", path, ec.message());
}

}  // namespace

SafetensorsModel SafetensorsModel::open_dir(const std::string& dir) {
  SafetensorsModel m;
  m.dir_ = dir;
  fs::path single = fs::path(dir) / kSafetensorsSingleName;
  fs::path index = fs::path(dir) / kSafetensorsIndexName;
  if (path_exists(single)) {
    m.files_.push_back(SafetensorsFile::open(single.string()));
    for (const std::string& name : m.files_[0].names()) m.where_[name] = 0;
    return m;
  }
  LT_CHECK(path_exists(index), "{}: no {} or {} (not a safetensors model directory)", dir, kSafetensorsSingleName,
           kSafetensorsIndexName);

  std::map<std::string, std::string> weight_map = read_weight_map(index.string());
  std::map<std::string, size_t> file_index;  // shard file name -> index into files_
  for (const auto& [name, file] : weight_map) {
    if (!file_index.count(file)) {
      fs::path p = fs::path(dir) / file;
      LT_CHECK(path_exists(p), "{}: tensor '{}' maps to {}, which does not exist", index.string(), name, p.string());
      file_index[file] = m.files_.size();
      m.files_.push_back(SafetensorsFile::open(p.string()));
    }
    const SafetensorsFile& shard = m.files_[file_index[file]];
    LT_CHECK(shard.contains(name), "{}: tensor '{}' maps to {}, which does not contain it", index.string(), name,
             shard.path());
    m.where_[name] = file_index[file];
  }
  // The reverse direction: whatever a shard holds must be mapped to that shard, so a tensor stored twice
  // (or left over from an older save) cannot silently shadow the one the index names.
  for (const auto& [file, i] : file_index) {
    for (const std::string& name : m.files_[i].names()) {
      auto it = weight_map.find(name);
      LT_CHECK(it != weight_map.end(), "{}: holds tensor '{}', which {} does not list", m.files_[i].path(), name,
               index.string());
      LT_CHECK(it->second == file, "{}: tensor '{}' is in two shards, {} and {}", index.string(), name, file,
               it->second);
    }
  }
  return m;
}

std::vector<std::string> SafetensorsModel::names() const {
  std::vector<std::string> out;
  for (const auto& kv : where_) out.push_back(kv.first);
  return out;
}

const SafetensorsFile& SafetensorsModel::file_of(const std::string& name) const {
  auto it = where_.find(name);
  LT_CHECK(it != where_.end(), "{}: no tensor named '{}' in the model's safetensors files", dir_, name);
  return files_[it->second];
}

std::vector<std::string> write_safetensors_model(const std::string& dir, const NamedTensors& tensors,
                                                 size_t max_shard_bytes, const SafetensorsMetadata& extra) {
  LT_CHECK(max_shard_bytes > 0, "{}: max shard size must be positive", dir);
  LT_CHECK(is_directory_path(dir), "{}: not a directory", dir);
  fs::path single = fs::path(dir) / kSafetensorsSingleName;
  fs::path index = fs::path(dir) / kSafetensorsIndexName;

  size_t total = 0;
  for (const auto& kv : tensors) total += kv.second.bytes();
  if (total <= max_shard_bytes) {
    write_safetensors(single.string(), tensors, extra);
    remove_if_present(index.string());  // a stale index would describe other files
    return {kSafetensorsSingleName};
  }

  // Greedy in name order: start a new shard when the next tensor would overflow a non-empty one.
  std::vector<NamedTensors> shards(1);
  size_t shard_bytes = 0;
  for (const auto& [name, t] : tensors) {
    if (!shards.back().empty() && shard_bytes + t.bytes() > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().emplace(name, t);
    shard_bytes += t.bytes();
  }
  LT_CHECK(shards.size() <= 99999, "{}: {} shards exceed the 5-digit naming; raise the max shard size", dir,
           shards.size());

  std::vector<std::string> written;
  json weight_map = json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    std::string file = safetensors_shard_name(i, shards.size());
    write_safetensors((fs::path(dir) / file).string(), shards[i], extra);
    for (const auto& kv : shards[i]) weight_map[kv.first] = file;
    written.push_back(file);
  }
  // The index goes last, so whoever sees the new index sees all of its shards already complete.
  write_json_file(index.string(), {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}});
  remove_if_present(single.string());  // it would take precedence over the index
  written.push_back(kSafetensorsIndexName);
  return written;
}

}  // namespace lt
