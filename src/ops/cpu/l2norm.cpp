// ops/cpu/l2norm.cpp — per-head L2 normalisation (Gated DeltaNet's q and k), forward and backward in f32; the
// math is in ops/l2norm.h.
//
// Legend: N tokens, H heads, D head dimension, ld* token strides.
//
// Forward, per row: ss = Σ x² (16 f32 lanes, fixed tree), r = 1/sqrt(ss + eps) (torch's rsqrt on CPU is that
// division), y = x · r. Backward, per row: s = Σ g·x (same lane sum), dx = r · (g − x · (r² · s)). Every row
// is independent, so the bits never depend on the thread count.
#include "ops/l2norm.h"

#include <cmath>

#include "core/error.h"
#include "core/parallel.h"

namespace lt {
namespace {

constexpr int kLanes = 16;
constexpr int64_t kTokenChunk = 16;  // tokens per task

// Σ_d a_d · b_d in f32 lanes: lane k sums d ≡ k (mod 16) in order; lanes combine as a fixed pairwise tree.
float lane_dot(const float* a, const float* b, int64_t D) {
  float acc[kLanes] = {};
  int64_t d = 0;
  for (; d + kLanes <= D; d += kLanes)
    for (int k = 0; k < kLanes; ++k) acc[k] += a[d + k] * b[d + k];
  for (int k = 0; d + k < D; ++k) acc[k] += a[d + k] * b[d + k];
  for (int width = kLanes / 2; width >= 1; width /= 2)
    for (int k = 0; k < width; ++k) acc[k] += acc[k + width];
  return acc[0];
}

void check_sizes(const char* op, int64_t N, int64_t H, int64_t D, int64_t ld_a, int64_t ld_b) {
  LT_CHECK(N >= 0 && H > 0 && D > 0, "{}: bad sizes N={}, H={}, D={}", op, N, H, D);
  LT_CHECK(ld_a >= H * D && ld_b >= H * D, "{}: token strides {} and {} must be at least H·D = {}", op, ld_a, ld_b,
           H * D);
}

}  // namespace

void l2norm_forward(float* out, float* rnorm, const float* in, int64_t N, int64_t H, int64_t D, int64_t ld_out,
                    int64_t ld_in, float eps) {
  check_sizes("l2norm_forward", N, H, D, ld_out, ld_in);
  parallel_chunks(N, kTokenChunk, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t h = 0; h < H; ++h) {
        const float* x = in + n * ld_in + h * D;  // [D]
        float* y = out + n * ld_out + h * D;      // [D]
        const float r = 1.0f / std::sqrt(lane_dot(x, x, D) + eps);
        rnorm[n * H + h] = r;
        for (int64_t d = 0; d < D; ++d) y[d] = x[d] * r;
      }
  });
}

void l2norm_backward(float* din, const float* dout, const float* in, const float* rnorm, int64_t N, int64_t H,
                     int64_t D, int64_t ld_din, int64_t ld_dout, int64_t ld_in) {
  check_sizes("l2norm_backward", N, H, D, ld_din, ld_dout);
  LT_CHECK(ld_in >= H * D, "l2norm_backward: token stride of in {} must be at least H·D = {}", ld_in, H * D);
  parallel_chunks(N, kTokenChunk, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t h = 0; h < H; ++h) {
        const float* x = in + n * ld_in + h * D;    // [D]
        const float* g = dout + n * ld_dout + h * D;  // [D]
        float* dx = din + n * ld_din + h * D;       // [D]
        const float r = rnorm[n * H + h];
        const float k = r * r * lane_dot(g, x, D);  // the dot is taken before dx is written (din may be dout)
        for (int64_t d = 0; d < D; ++d) dx[d] = r * (g[d] - x[d] * k);
      }
  });
}

}  // namespace lt
