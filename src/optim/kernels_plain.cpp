// optim/kernels_plain.cpp — the plain C++ kernels (the specification the vector paths match bit for bit),
// the step scalars, and the run-time choice of path.
#include <algorithm>
#include <cfloat>
#include <cmath>

#include "core/cpu_features.h"
#include "core/error.h"
#include "optim/kernels.h"

// No multiply-add contraction: only the explicit std::fma calls fuse, as in the vector paths.
#pragma GCC optimize("fp-contract=off")

namespace lt {
namespace {

// The AdamW update of one element (kernels.h); m and v are updated in place, p is returned. std::fma is the
// single-rounding multiply-add (an instruction where the CPU has one, libm's exact emulation otherwise).
inline float adamw_element(float p, float grad, float& m, float& v, const AdamWScalars& s) {
  const float g = grad * s.clip;
  const float p1 = p * s.decay;
  m = std::fma(g, s.one_minus_beta1, m * s.beta1);
  v = std::fma(g * s.one_minus_beta2, g, v * s.beta2);
  const float d = std::sqrt(v) / s.bc2_sqrt + s.eps;
  return p1 + (s.neg_step_size * m) / d;
}

}  // namespace

VectorPath best_vector_path() {
  const CpuFeatures& f = cpu_features();
  switch (isa_level(f)) {
    case IsaLevel::avx512: return f.avx512vbmi ? VectorPath::avx512_vbmi : VectorPath::avx512;
    case IsaLevel::avx2: return VectorPath::avx2;
    case IsaLevel::plain: break;
  }
  return VectorPath::plain;
}

const char* vector_path_name(VectorPath path) {
  switch (path) {
    case VectorPath::plain: return "plain";
    case VectorPath::avx2: return "avx2";
    case VectorPath::avx512: return "avx512";
    case VectorPath::avx512_vbmi: return "avx512_vbmi";
  }
  return "?";
}

AdamWScalars adamw_scalars(double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step,
                           float clip) {
  LT_CHECK(step >= 1, "AdamW steps count from 1, got {}", step);
  AdamWScalars s;
  s.clip = clip;
  s.decay = float(1.0 - lr * weight_decay);
  s.beta1 = float(beta1);
  s.one_minus_beta1 = float(1.0 - beta1);
  s.beta2 = float(beta2);
  s.one_minus_beta2 = float(1.0 - beta2);
  const double bias_correction1 = 1.0 - std::pow(beta1, double(step));
  const double bias_correction2 = 1.0 - std::pow(beta2, double(step));
  s.bc2_sqrt = float(std::sqrt(bias_correction2));
  s.eps = float(eps);
  s.neg_step_size = float(-(lr / bias_correction1));
  return s;
}

void adamw32_plain(const AdamW32Args& a, const AdamWScalars& s) {
  for (int64_t i = 0; i < a.n; ++i) {
    a.p[i] = adamw_element(a.p[i], a.g[i], a.m[i], a.v[i], s);
    if (a.copy) a.copy[i] = f32_to_bf16(a.p[i]);
  }
}

void adamw8_plain(const AdamW8Args& a, const AdamWScalars& s) {
  const QuantTable& ts = quant_table(QuantMapKind::signed_dynamic);
  const QuantTable& tu = quant_table(QuantMapKind::unsigned_dynamic);
  float mbuf[kMaxBlock], vbuf[kMaxBlock];  // the block's new m, v between the update and requantisation
  for (int64_t b0 = 0, blk = 0; b0 < a.n; b0 += a.block, ++blk) {
    const int64_t len = std::min(a.block, a.n - b0);
    const float am = a.absmax_m[blk], av = a.absmax_v[blk];
    float max_m = 0.0f, max_v = 0.0f;
    for (int64_t j = 0; j < len; ++j) {
      const int64_t i = b0 + j;
      float m = ts.values[a.qm[i]] * am;
      float v = tu.values[a.qv[i]] * av;
      a.p[i] = adamw_element(a.p[i], a.g[i], m, v, s);
      if (a.copy) a.copy[i] = f32_to_bf16(a.p[i]);
      mbuf[j] = m;
      vbuf[j] = v;
      max_m = std::max(max_m, std::fabs(m));
      max_v = std::max(max_v, v);
    }
    if (max_m < FLT_MIN) max_m = 0.0f;
    if (max_v < FLT_MIN) max_v = 0.0f;
    a.absmax_m[blk] = max_m;
    a.absmax_v[blk] = max_v;
    const float inv_m = max_m > 0.0f ? 1.0f / max_m : 0.0f;
    const float inv_v = max_v > 0.0f ? 1.0f / max_v : 0.0f;
    for (int64_t j = 0; j < len; ++j) {
      a.qm[b0 + j] = quant_lookup(ts, mbuf[j] * inv_m);
      uint8_t cv = quant_lookup(tu, vbuf[j] * inv_v);
      if (cv == 0 && vbuf[j] > 0.0f && inv_v > 0.0f) cv = 1;  // the zero-point guard
      a.qv[b0 + j] = cv;
    }
  }
}

double accumulate_chunk_plain(float* dst, const float* src, int64_t n, bool overwrite) {
  double lane[16] = {};
  for (int64_t i = 0; i < n; ++i) {
    const float x = overwrite ? src[i] : dst[i] + src[i];
    if (dst) dst[i] = x;
    lane[i % 16] += double(x) * double(x);
  }
  return combine_lanes(lane);
}

double accumulate_chunk_plain(float* dst, const bf16_t* src, int64_t n, bool overwrite) {
  double lane[16] = {};
  for (int64_t i = 0; i < n; ++i) {
    const float x = overwrite ? bf16_to_f32(src[i]) : dst[i] + bf16_to_f32(src[i]);
    if (dst) dst[i] = x;
    lane[i % 16] += double(x) * double(x);
  }
  return combine_lanes(lane);
}

void adamw32(VectorPath path, const AdamW32Args& a, const AdamWScalars& s) {
  switch (path) {
    case VectorPath::avx512_vbmi:
    case VectorPath::avx512: return adamw32_avx512(a, s);
    case VectorPath::avx2: return adamw32_avx2(a, s);
    case VectorPath::plain: return adamw32_plain(a, s);
  }
}

void adamw8(VectorPath path, const AdamW8Args& a, const AdamWScalars& s) {
  LT_CHECK(a.block >= 16 && a.block <= kMaxBlock && a.block % 16 == 0,
           "8-bit block size must be a multiple of 16 in [16, {}], got {}", kMaxBlock, a.block);
  switch (path) {
    case VectorPath::avx512_vbmi: return adamw8_avx512_vbmi(a, s);
    case VectorPath::avx512: return adamw8_avx512(a, s);
    case VectorPath::avx2: return adamw8_avx2(a, s);
    case VectorPath::plain: return adamw8_plain(a, s);
  }
}

}  // namespace lt
