// io/safetensors.h — the safetensors weight format: read (mmap, fully validated), write (atomic), and
// models split over several files (HF's model.safetensors.index.json).
//
// File layout (all integers little-endian):
//   [0, 8)          u64 n: header length in bytes
//   [8, 8 + n)      header: JSON object, padded with spaces
//                     { "<tensor name>": {"dtype": "BF16", "shape": [V, C], "data_offsets": [begin, end)},
//                       ...,
//                       "__metadata__": {"format": "pt", ...string -> string} }   (optional)
//   [8 + n, size)   data area; each tensor's bytes at [begin, end) relative to its start, row-major.
// A valid file's ranges, sorted, tile the data area exactly: no overlaps, no holes, nothing after the last.
//
// Model directory (HF naming):
//   model.safetensors                                  one file, or
//   model.safetensors.index.json                       {"metadata": {"total_size": bytes},
//                                                       "weight_map": {"<tensor>": "model-00001-of-00002.safetensors"}}
//   model-00001-of-00002.safetensors, ...              the shards (5-digit, 1-based)
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace lt {

// Elements [begin, end) of a tensor in row-major order; end < 0: to its last. What a data-parallel rank loads of
// the f32 masters it keeps (dist/data_parallel.h).
struct ElementRange {
  int64_t begin = 0, end = -1;
};

using SafetensorsMetadata = std::map<std::string, std::string>;
// Tensors to write, by name. A std::map, so iteration (and the header) is in sorted-name order.
using NamedTensors = std::map<std::string, TensorView>;

constexpr const char* kSafetensorsSingleName = "model.safetensors";
constexpr const char* kSafetensorsIndexName = "model.safetensors.index.json";
// A header above this is treated as corruption rather than read (the reference reader uses 100 MB).
constexpr size_t kSafetensorsMaxHeaderBytes = size_t(100) << 20;

struct SafetensorsTensorInfo {
  DType dtype = DType::f32;
  Shape shape;       // [] for a scalar
  size_t begin = 0;  // byte range [begin, end) relative to the start of the data area
  size_t end = 0;
};

// One safetensors file, memory-mapped read-only for the object's lifetime. Views point into the
// mapping: they are valid while the object lives, and writing through them faults (the mapping is
// PROT_READ). Movable, not copyable.
class SafetensorsFile {
 public:
  // Maps and validates the whole header; throws lt::Error naming the file, the tensor or field and
  // what was expected.
  static SafetensorsFile open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  const SafetensorsTensorInfo& info(const std::string& name) const;  // throws naming file and tensor
  // A contiguous view into the mapping. Aligned to the dtype size for files written by this writer or
  // HF's; other files may give unaligned views (read_f32 copes with those).
  TensorView view(const std::string& name) const;
  // Copies tensor `name` into dst as f32 (from f32, bf16 or f16), checking its shape is `expected`; with a
  // range, only its elements [range.begin, range.end) into dst[range.begin, range.end).
  void read_f32(const std::string& name, float* dst, const Shape& expected, ElementRange range = {}) const;
  const SafetensorsMetadata& metadata() const { return metadata_; }
  size_t data_start() const { return data_start_; }  // 8 + header length: file offset of the data area

 private:
  SafetensorsFile() = default;
  void unmap();

  std::string path_;
  const uint8_t* map_ = nullptr;  // the whole file
  size_t map_size_ = 0;
  size_t data_start_ = 0;
  std::map<std::string, SafetensorsTensorInfo> tensors_;
  SafetensorsMetadata metadata_;
};

// Copies `src` (contiguous, f32/bf16/f16, any alignment) into dst as f32 after checking its shape is
// `expected`; errors name the tensor, the file and both shapes.
void copy_tensor_to_f32(float* dst, const TensorView& src, const Shape& expected, const std::string& name,
                        const std::string& file, ElementRange range = {});

// Writes `tensors` (each contiguous) to `path` atomically (io/json_file.h). The header lists names
// sorted and carries "__metadata__": {"format": "pt"} plus `extra`; it is padded with spaces so the data
// area starts 8-byte aligned. Data is ordered by dtype size (largest first), then name, as HF's writer
// does, so every tensor starts aligned to its dtype size and mmap views can be used as typed pointers.
void write_safetensors(const std::string& path, const NamedTensors& tensors, const SafetensorsMetadata& extra = {});

// A model's weights in a directory: model.safetensors, else the shards of model.safetensors.index.json
// (transformers' order of preference). One lookup over all files.
class SafetensorsModel {
 public:
  // Opens every file and checks: each shard listed exists and holds the tensors mapped to it, and no
  // tensor appears in two shards or in a shard the index does not map it to.
  static SafetensorsModel open_dir(const std::string& dir);

  const std::string& dir() const { return dir_; }
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  const SafetensorsFile& file_of(const std::string& name) const;  // throws naming the tensor and dir
  const SafetensorsTensorInfo& info(const std::string& name) const { return file_of(name).info(name); }
  TensorView view(const std::string& name) const { return file_of(name).view(name); }
  void read_f32(const std::string& name, float* dst, const Shape& expected, ElementRange range = {}) const {
    file_of(name).read_f32(name, dst, expected, range);
  }
  size_t num_files() const { return files_.size(); }

 private:
  std::string dir_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> where_;  // tensor name -> index into files_
};

// Writes `tensors` into `dir` (which must exist): one model.safetensors when the tensor bytes fit in
// max_shard_bytes, else greedy shards in sorted-name order, each holding at most max_shard_bytes of
// tensor data unless one tensor alone is larger (as transformers' save_pretrained), plus the index,
// written last. The other layout's entry file (model.safetensors or the index) is removed so the
// directory has one reading. Returns the file names written, relative to dir.
std::vector<std::string> write_safetensors_model(const std::string& dir, const NamedTensors& tensors,
                                                 size_t max_shard_bytes, const SafetensorsMetadata& extra = {});

// "model-00002-of-00005.safetensors" for index 1 (0-based) of 5.
std::string safetensors_shard_name(size_t index, size_t count);

}  // namespace lt
