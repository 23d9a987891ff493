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

double accumulate_grad_slab(uint8_t* dst, const SlabLayout& dst_layout, const uint8_t* src,
                            const SlabLayout& src_layout, GradMode mode) {
  const auto& de = dst_layout.entries();
  const auto& se = src_layout.entries();
  LT_CHECK_EQ(de.size(), se.size(), "accumulate_grad_slab: the two layouts hold different tensor counts");
  double sum = 0.0;
  for (size_t i = 0; i < de.size(); ++i) {
    LT_CHECK(de[i].name == se[i].name && de[i].numel() == se[i].numel(),
             "accumulate_grad_slab: tensor {} is '{}' ({} elements) in the gradient layout but '{}' ({}) in the "
             "source layout", i, de[i].name, de[i].numel(), se[i].name, se[i].numel());
    LT_CHECK(de[i].dtype == DType::f32, "accumulate_grad_slab: gradients are f32, '{}' is {}", de[i].name,
             dtype_name(de[i].dtype));
    float* d = reinterpret_cast<float*>(dst + de[i].offset);
    switch (se[i].dtype) {
      case DType::f32:
        sum += accumulate_grad(d, reinterpret_cast<const float*>(src + se[i].offset), de[i].numel(), mode);
        break;
      case DType::bf16:
        sum += accumulate_grad(d, reinterpret_cast<const bf16_t*>(src + se[i].offset), de[i].numel(), mode);
        break;
      default:
        LT_FAIL("accumulate_grad_slab: source gradient '{}' is {}; expected f32 or bf16", se[i].name,
                dtype_name(se[i].dtype));
    }
  }
  return sum;
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
    LT_CHECK(set_[s], "gradient norm: no partial sum for slab {} (0 = embedding, then layers, last = head) "
             "this step; every slab's gradient must be accumulated before the update", s);
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
