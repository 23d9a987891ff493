// ops/cpu/rope.cpp — rotary position embedding, rotate-half layout (HF Llama/Qwen), forward and backward.
//
// Legend: N tokens, H heads (Hq or Hkv at the call site), D head dimension, R rotated dims (R = D for the
// full rope; Qwen3.5's partial rope rotates R = D/4), h = R/2.
//
// Frequencies follow HF's `1.0 / (base ** (torch.arange(0, R, 2).float() / R))` in f32:
//   e_j        = f32(2j) / f32(R)                f32 division, as torch
//   inv_freq_j = 1.0f / f32(pow(theta, e_j))     torch takes powf in f32; we take pow in double of the same
//                                                f32 operands and round once, so at most 1 ulp apart
//   angle      = f32(pos) · inv_freq_j           one f32 multiply (HF's [h,1]@[1,T] matmul with K = 1)
//   cos, sin   = f32(cos/sin(double(angle)))     of the f32 angle, correctly rounded up to libm's 1 ulp
// Rotation of each pair (a, b) = (x_j, x_{j+h}), with the f32 roundings HF's x·cos + rotate_half(x)·sin has:
//   a' = a·cos - b·sin,  b' = b·cos + a·sin
// for j < h; dims R..D-1 of a head are neither read nor written (HF concatenates them back unchanged).
// The backward applies the transpose (sin → -sin). cos/sin are computed once per token for all H heads.
// The full rope is rope_apply with R = D: the same loop, so the same bits as before partial rope existed.
// Measured on one core of the shared 2-core AMD EPYC dev box, N = 2048, D = 128: 2.6 ms for H = 32
// (26 GB/s), 1.7 ms for H = 8, where the N·D/2 double cos/sin (~1 ms) dominate.
#include "ops/rope.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/override.h"

namespace lt {
namespace {

constexpr int64_t kTokenChunk = 16;  // tokens per task

// inv_freq over R rotated dims: [R/2].
std::vector<float> inv_freq(int64_t R, double theta) {
  std::vector<float> f(size_t(R / 2));
  for (int64_t j = 0; j < R / 2; ++j) {
    const float e = float(2 * j) / float(R);
    f[size_t(j)] = 1.0f / float(std::pow(double(float(theta)), double(e)));
  }
  return f;
}

// cos_t[h], sin_t[h] of position p: angle = f32(p) · inv_freq_j, cos and sin in double of that f32 angle.
void cos_sin_row(float* cos_t, float* sin_t, int32_t p, const float* freq, int64_t h) {
  for (int64_t j = 0; j < h; ++j) {
    const double angle = double(float(p) * freq[j]);
    cos_t[j] = float(std::cos(angle));
    sin_t[j] = float(std::sin(angle));
  }
}

// A rotation row of position p: cos [h], then sign·sin [h].
void rotation_row(float* row, int32_t p, const float* freq, int64_t h, float sign) {
  cos_sin_row(row, row + h, p, freq, h);
  for (int64_t j = 0; j < h; ++j) row[h + j] = sign * row[h + j];
}

// Rotates the first R dims of each head; sign = +1 rotates by +angle (forward), -1 by -angle (backward: the
// transpose).
//
// A batch repeats its positions (B rows of 0..T-1, or packed documents restarting at 0), so when the distinct
// positions are few against N the cos/sin rows are computed once per position into a table and looked up:
// the same function of the same position, so the same bits, and the double cos/sin (~1 ms per 2048 x 64 pairs,
// the bulk of the op) drop by the repeat factor (32x at the demo's B = 32).
void rope_apply(float* x, const int32_t* pos, int64_t N, int64_t H, int64_t D, int64_t R, double theta,
                float sign) {
  LT_CHECK(D > 0 && D % 2 == 0, "rope: head dimension D must be even and positive, got {}", D);
  LT_CHECK(R > 0 && R % 2 == 0 && R <= D, "rope: rotary dimension R must be even, positive and at most D = {}, got {}",
           D, R);
  LT_CHECK(N >= 0 && H > 0, "rope: bad sizes N={}, H={}", N, H);
  LT_CHECK(theta > 0, "rope: theta must be positive, got {}", theta);
  const int64_t h = R / 2;
  const std::vector<float> freq = inv_freq(R, theta);  // [h]
  int32_t lo = 0, hi = -1;
  if (N > 0) lo = hi = pos[0];
  for (int64_t n = 1; n < N; ++n) lo = std::min(lo, pos[n]), hi = std::max(hi, pos[n]);
  const int64_t P = int64_t(hi) - lo + 1;
  std::vector<float> table;  // [P, 2h]: cos then sign·sin of position lo + p, when positions repeat
  if (N > 0 && 2 * P <= N) {
    table.resize(size_t(P * R));
    parallel_chunks(P, kTokenChunk, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) rotation_row(table.data() + p * R, int32_t(lo + p), freq.data(), h, sign);
    });
  }
  parallel_chunks(N, kTokenChunk, [&](int64_t n0, int64_t n1) {
    std::vector<float> cs(table.empty() ? static_cast<size_t>(R) : 0);  // cos [h] then sign·sin [h]
    for (int64_t n = n0; n < n1; ++n) {
      const float* cos_t;
      if (table.empty()) {
        rotation_row(cs.data(), pos[n], freq.data(), h, sign);
        cos_t = cs.data();
      } else {
        cos_t = table.data() + (int64_t(pos[n]) - lo) * R;
      }
      const float* sin_t = cos_t + h;
      for (int64_t head = 0; head < H; ++head) {
        float* a = x + (n * H + head) * D;  // [h]
        float* b = a + h;                   // [h]
        for (int64_t j = 0; j < h; ++j) {
          const float aj = a[j], bj = b[j];
          a[j] = aj * cos_t[j] - bj * sin_t[j];
          b[j] = bj * cos_t[j] + aj * sin_t[j];
        }
      }
    }
  });
}

}  // namespace

void rope_table(float* cos, float* sin, int64_t P, int64_t D, double theta) {
  LT_CHECK(D > 0 && D % 2 == 0, "rope_table: head dimension D must be even and positive, got {}", D);
  LT_CHECK(P >= 0 && P <= int64_t(1) << 31, "rope_table: bad number of positions {}", P);
  LT_CHECK(theta > 0, "rope_table: theta must be positive, got {}", theta);
  const int64_t h = D / 2;
  const std::vector<float> freq = inv_freq(D, theta);  // [h]
  parallel_chunks(P, kTokenChunk, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) cos_sin_row(cos + p * h, sin + p * h, int32_t(p), freq.data(), h);
  });
}

void rope_forward(float* x, const int32_t* pos, int64_t N, int64_t H, int64_t D, double theta) {
  LT_OPS_OVERRIDE(rope_forward, x, pos, N, H, D, theta);
  rope_apply(x, pos, N, H, D, D, theta, 1.0f);
}

void rope_backward(float* dx, const int32_t* pos, int64_t N, int64_t H, int64_t D, double theta) {
  LT_OPS_OVERRIDE(rope_backward, dx, pos, N, H, D, theta);
  rope_apply(dx, pos, N, H, D, D, theta, -1.0f);
}

void rope_partial_forward(float* x, const int32_t* pos, int64_t N, int64_t H, int64_t D, int64_t R, double theta) {
  if (R == D) return rope_forward(x, pos, N, H, D, theta);
  rope_apply(x, pos, N, H, D, R, theta, 1.0f);
}

void rope_partial_backward(float* dx, const int32_t* pos, int64_t N, int64_t H, int64_t D, int64_t R,
                           double theta) {
  if (R == D) return rope_backward(dx, pos, N, H, D, theta);
  rope_apply(dx, pos, N, H, D, R, theta, -1.0f);
}

}  // namespace lt
