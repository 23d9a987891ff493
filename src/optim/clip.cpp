#include "optim/clip.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/parallel.h"
#include "optim/kernels.h"

namespace lt {
namespace {

template <typename Src>
double accumulate_chunk(VectorPath path, float* dst, const Src* src, int64_t n, bool overwrite) {
  switch (path) {
    case VectorPath::avx512_vbmi:
    case VectorPath::avx512: return accumulate_chunk_avx512(dst, src, n, overwrite);
    case VectorPath::avx2: return accumulate_chunk_avx2(dst, src, n, overwrite);
    case VectorPath::plain: return accumulate_chunk_plain(dst, src, n, overwrite);
  }
  LT_FAIL("unknown vector path");
}

template <typename Src>
double accumulate_any(float* dst, const Src* src, int64_t n, GradMode mode) {
  LT_CHECK(n >= 0, "accumulate_grad: negative length {}", n);
  const VectorPath path = best_vector_path();
  const bool overwrite = mode == GradMode::overwrite;
  const int64_t chunks = (n + kAccumulateChunk - 1) / kAccumulateChunk;
  std::vector<double> partial(static_cast<size_t>(chunks));
  parallel_for(chunks, [&](int64_t t) {
    const int64_t b = t * kAccumulateChunk, len = std::min(kAccumulateChunk, n - b);
    partial[size_t(t)] = accumulate_chunk(path, dst + b, src + b, len, overwrite);
  });
  double sum = 0.0;
  for (double p : partial) sum += p;
  return sum;
}

}  // namespace

double accumulate_grad(float* dst, const float* src, int64_t n, GradMode mode) {
  return accumulate_any(dst, src, n, mode);
}

double accumulate_grad(float* dst, const bf16_t* src, int64_t n, GradMode mode) {
  return accumulate_any(dst, src, n, mode);
}

namespace {

// accumulate_grad_slab's loop over chunks [first, last), chunk k's source at packed + packed_at[k - first] when
// packed is given (a run of chunks sent as one buffer), else at its place in src_layout; dst = nullptr with
// overwrite: Σ src² only, the same sums.
void chunk_pass(uint8_t* dst, const SlabLayout& dst_layout, const uint8_t* src, const SlabLayout& src_layout,
                const std::vector<GradChunk>& chunks, size_t first, size_t last, GradMode mode, double* partial,
                const size_t* packed_at = nullptr) {
  LT_CHECK(first <= last && last <= chunks.size(), "accumulate_grad_chunks: chunks [{}, {}) of {}", first, last,
           chunks.size());
  const auto& de = dst_layout.entries();
  const auto& se = src_layout.entries();
  const VectorPath path = best_vector_path();
  const bool overwrite = mode == GradMode::overwrite;
  // One parallel loop over the chunks (one fork-join per slab, not per tensor).
  parallel_for(int64_t(last - first), [&](int64_t k) {
    const GradChunk& t = chunks[first + size_t(k)];
    float* d = dst ? reinterpret_cast<float*>(dst + de[t.entry].offset) + t.begin : nullptr;
    const bool f32 = se[t.entry].dtype == DType::f32;
    const uint8_t* s = packed_at ? src + packed_at[k] : src + se[t.entry].offset + size_t(t.begin) * (f32 ? 4 : 2);
    partial[size_t(k)] = f32 ? accumulate_chunk(path, d, reinterpret_cast<const float*>(s), t.len, overwrite)
                             : accumulate_chunk(path, d, reinterpret_cast<const bf16_t*>(s), t.len, overwrite);
  });
}

double slab_pass(uint8_t* dst, const SlabLayout& dst_layout, const uint8_t* src, const SlabLayout& src_layout,
                 GradMode mode) {
  const std::vector<GradChunk> chunks = grad_chunks(dst_layout, src_layout);
  std::vector<double> partial(chunks.size());
  chunk_pass(dst, dst_layout, src, src_layout, chunks, 0, chunks.size(), mode, partial.data());
  return combine_grad_chunks(chunks, partial.data());
}

}  // namespace

std::vector<GradChunk> grad_chunks(const SlabLayout& dst_layout, const SlabLayout& src_layout) {
  const auto& de = dst_layout.entries();
  const auto& se = src_layout.entries();
  LT_CHECK_EQ(de.size(), se.size(), "accumulate_grad_slab: the two layouts hold different tensor counts");
  std::vector<GradChunk> chunks;
  for (size_t i = 0; i < de.size(); ++i) {
    LT_CHECK(de[i].name == se[i].name && de[i].numel() == se[i].numel(),
             "accumulate_grad_slab: tensor {} is '{}' ({} elements) in the gradient layout but '{}' ({}) in the "
             "source layout", i, de[i].name, de[i].numel(), se[i].name, se[i].numel());
    LT_CHECK(de[i].dtype == DType::f32, "accumulate_grad_slab: gradients are f32, '{}' is {}", de[i].name,
             dtype_name(de[i].dtype));
    LT_CHECK(se[i].dtype == DType::f32 || se[i].dtype == DType::bf16,
             "accumulate_grad_slab: source gradient '{}' is {}; expected f32 or bf16", se[i].name,
             dtype_name(se[i].dtype));
    for (int64_t b = 0; b < de[i].numel(); b += kAccumulateChunk)
      chunks.push_back({i, b, std::min(kAccumulateChunk, de[i].numel() - b)});
  }
  return chunks;
}

void accumulate_grad_chunks(uint8_t* dst, const SlabLayout& dst_layout, const uint8_t* src,
                            const SlabLayout& src_layout, const std::vector<GradChunk>& chunks, size_t first,
                            size_t last, GradMode mode, double* partial) {
  LT_CHECK(dst != nullptr, "accumulate_grad_chunks: no destination slab");
  chunk_pass(dst, dst_layout, src, src_layout, chunks, first, last, mode, partial);
}

void accumulate_grad_packed(uint8_t* dst, const SlabLayout& dst_layout, const uint8_t* packed,
                            const SlabLayout& src_layout, const std::vector<GradChunk>& chunks, size_t first,
                            size_t last, GradMode mode, double* partial) {
  LT_CHECK(dst != nullptr, "accumulate_grad_packed: no destination slab");
  std::vector<size_t> at(last - first);
  size_t bytes = 0;
  for (size_t k = first; k < last; ++k) {
    at[k - first] = bytes;
    bytes += size_t(chunks[k].len) * dtype_size(src_layout.entries()[chunks[k].entry].dtype);
  }
  chunk_pass(dst, dst_layout, packed, src_layout, chunks, first, last, mode, partial, at.data());
}

double combine_grad_chunks(const std::vector<GradChunk>& chunks, const double* partial) {
  // Each entry's chunks in order, then the entries in order: the sum accumulate_grad gives entry by entry.
  double sum = 0.0, entry_sum = 0.0;
  for (size_t k = 0; k < chunks.size(); ++k) {
    entry_sum += partial[k];
    if (k + 1 == chunks.size() || chunks[k + 1].entry != chunks[k].entry) {
      sum += entry_sum;
      entry_sum = 0.0;
    }
  }
  return sum;
}

double accumulate_grad_slab(uint8_t* dst, const SlabLayout& dst_layout, const uint8_t* src,
                            const SlabLayout& src_layout, GradMode mode) {
  if (dst_layout.entries().empty()) return 0.0;  // a frozen slab (model/finetune.h): nothing to add
  LT_CHECK(dst != nullptr, "accumulate_grad_slab: no destination slab");
  return slab_pass(dst, dst_layout, src, src_layout, mode);
}

double grad_chunk_sum_of_squares(const float* x, int64_t n) {
  double acc = 0;
  for (int64_t i = 0; i < n; ++i) acc += double(x[i]) * double(x[i]);
  return acc;
}

double grad_sum_of_squares(const float* x, int64_t n) {
  const int64_t chunks = (n + kAccumulateChunk - 1) / kAccumulateChunk;
  std::vector<double> part(static_cast<size_t>(chunks), 0.0);
  parallel_for(chunks, [&](int64_t c) {
    part[size_t(c)] = grad_chunk_sum_of_squares(x + c * kAccumulateChunk, std::min(n - c * kAccumulateChunk, kAccumulateChunk));
  });
  double total = 0;
  for (double p : part) total += p;
  return total;
}

double grad_slab_sum_of_squares(const uint8_t* slab, const SlabLayout& layout) {
  return slab_pass(nullptr, layout, slab, layout, GradMode::overwrite);
}

GradNormPartials::GradNormPartials(int64_t num_layers)
    : partial_(static_cast<size_t>(num_layers + 2), 0.0), set_(static_cast<size_t>(num_layers + 2), 0) {
  LT_CHECK(num_layers >= 0, "GradNormPartials: negative layer count {}", num_layers);
}

size_t GradNormPartials::slot(SlabKind kind, int64_t layer) const {
  switch (kind) {
    case SlabKind::embedding: return 0;
    case SlabKind::layer:
      LT_CHECK(layer >= 0 && size_t(layer) + 2 < partial_.size(), "GradNormPartials: layer {} out of range", layer);
      return size_t(layer) + 1;
    case SlabKind::head: return partial_.size() - 1;
  }
  LT_FAIL("unknown slab kind");
}

void GradNormPartials::set(SlabKind kind, int64_t layer, double partial) {
  const size_t s = slot(kind, layer);
  partial_[s] = partial;
  set_[s] = 1;
}

double GradNormPartials::sum_of_squares() const {
  double sum = 0.0;
  for (size_t s = 0; s < partial_.size(); ++s) {
    LT_CHECK(set_[s], "gradient norm: no partial sum for the {} this step; every slab's gradient must be "
             "accumulated before the update",
             s == 0 ? std::string("embedding") : s + 1 == partial_.size() ? std::string("head")
                                                                        : fmt::format("layer {}", s - 1));
    sum += partial_[s];
  }
  return sum;
}

void GradNormPartials::clear() {
  std::fill(partial_.begin(), partial_.end(), 0.0);
  std::fill(set_.begin(), set_.end(), uint8_t(0));
}

float clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0f;
  const double c = max_norm / (norm + 1e-6);
  return c < 1.0 ? float(c) : 1.0f;
}

}  // namespace lt
