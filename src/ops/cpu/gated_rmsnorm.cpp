// ops/cpu/gated_rmsnorm.cpp — HF Qwen3_5RMSNormGated forward/backward in f32; the math is in
// ops/gated_rmsnorm.h.
//
// Legend: rows = N·Hv, dv value head dimension.
//
// Forward per row, as HF (variance = x.pow(2).mean(-1); x · rsqrt(variance + eps); weight · that; · silu(gate)):
//   ss = Σ x² (16 f32 lanes, fixed tree); rstd = 1/sqrt(ss/dv + eps); y = ((x · rstd) · w) · (z · σ(z)).
// σ is swiglu_math's, the one the SwiGLU op and its CUDA kernel share. The backward recomputes silu(z) and
// x · rstd with the forward's roundings; dw's row chunks follow rmsnorm's rule (rmsnorm_dweight_chunk_rows).
#include "ops/gated_rmsnorm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/rmsnorm.h"
#include "ops/swiglu_math.h"

namespace lt {
namespace {

constexpr int kLanes = 16;
constexpr int64_t kFwdRowChunk = 32;  // rows per forward task

// Σ_d a_d · b_d in f32 lanes: lane k sums d ≡ k (mod 16) in order; lanes combine as a fixed pairwise tree.
float lane_dot(const float* a, const float* b, int64_t n) {
  float acc[kLanes] = {};
  int64_t d = 0;
  for (; d + kLanes <= n; d += kLanes)
    for (int k = 0; k < kLanes; ++k) acc[k] += a[d + k] * b[d + k];
  for (int k = 0; d + k < n; ++k) acc[k] += a[d + k] * b[d + k];
  for (int width = kLanes / 2; width >= 1; width /= 2)
    for (int k = 0; k < width; ++k) acc[k] += acc[k + width];
  return acc[0];
}

float silu(float z) { return z * swiglu_math::sigmoid(z); }

}  // namespace

void gated_rmsnorm_forward(float* out, float* rstd, const float* x, const float* z, const float* weight,
                           int64_t rows, int64_t dv, float eps) {
  LT_CHECK(rows >= 0 && dv > 0, "gated_rmsnorm_forward: bad sizes rows={}, dv={}", rows, dv);
  parallel_chunks(rows, kFwdRowChunk, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * dv;  // [dv]
      const float* zr = z + r * dv;  // [dv]
      float* y = out + r * dv;       // [dv]
      const float s = 1.0f / std::sqrt(lane_dot(xr, xr, dv) / float(dv) + eps);
      rstd[r] = s;
      for (int64_t d = 0; d < dv; ++d) y[d] = ((xr[d] * s) * weight[d]) * silu(zr[d]);
    }
  });
}

void gated_rmsnorm_backward(float* dx, float* dz, float* dweight, const float* dout, const float* x, const float* z,
                            const float* weight, const float* rstd, int64_t rows, int64_t dv) {
  LT_CHECK(rows >= 0 && dv > 0, "gated_rmsnorm_backward: bad sizes rows={}, dv={}", rows, dv);
  const int64_t chunk = rmsnorm_dweight_chunk_rows(rows);  // at most 64 partial rows of dw
  const int64_t n_chunks = (rows + chunk - 1) / chunk;
  std::vector<double> partial(size_t(n_chunks * dv), 0.0);  // [n_chunks, dv]
  parallel_for(n_chunks, [&](int64_t t) {
    const int64_t r0 = t * chunk, r1 = std::min(rows, r0 + chunk);
    double* p = partial.data() + t * dv;
    std::vector<float> G(static_cast<size_t>(dv)), wG(static_cast<size_t>(dv));  // g·silu(z), w·G of one row
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * dv;
      const float* zr = z + r * dv;
      const float* g = dout + r * dv;
      float* dxr = dx + r * dv;
      float* dzr = dz + r * dv;
      const float s = rstd[r];
      for (int64_t d = 0; d < dv; ++d) {
        float sg, one_minus_sg;
        swiglu_math::sigmoid_pair(zr[d], &sg, &one_minus_sg);
        const float nw = (xr[d] * s) * weight[d];  // the forward's normalised, scaled x
        G[size_t(d)] = g[d] * (zr[d] * sg);
        wG[size_t(d)] = weight[d] * G[size_t(d)];
        dzr[d] = (g[d] * nw) * (sg * (1.0f + zr[d] * one_minus_sg));
      }
      const float k = s * s * (lane_dot(wG.data(), xr, dv) / float(dv));
      for (int64_t d = 0; d < dv; ++d) dxr[d] = s * (wG[size_t(d)] - xr[d] * k);
      for (int64_t d = 0; d < dv; ++d) p[d] += double(G[size_t(d)]) * double(xr[d] * s);
    }
  });
  std::vector<double> total(size_t(dv), 0.0);  // chunk partials in chunk order
  for (int64_t t = 0; t < n_chunks; ++t)
    for (int64_t d = 0; d < dv; ++d) total[size_t(d)] += partial[size_t(t * dv + d)];
  for (int64_t d = 0; d < dv; ++d) dweight[d] += float(total[size_t(d)]);
}

}  // namespace lt
