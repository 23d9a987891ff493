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
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/override.h"

namespace lt {
namespace {

constexpr int64_t kTokenChunk = 16;  // tokens per task

void check_spec(const char* op, const RopeSpec& r) {
  LT_CHECK(r.theta > 0, "{}: theta must be positive, got {}", op, r.theta);
  LT_CHECK(r.factor >= 1 && std::isfinite(r.attention_factor) && r.attention_factor > 0,
           "{}: YaRN needs factor >= 1 and a positive attention factor (got {}, {})", op, r.factor, r.attention_factor);
  LT_CHECK(!r.is_yarn() || (r.original_max_positions > 0 && r.beta_fast > 0 && r.beta_slow > 0),
           "{}: YaRN needs original_max_position_embeddings and beta_fast, beta_slow > 0", op);
}

// YaRN's [low, high] dims (transformers' find_correction_range, in double): the dim whose wavelength fits
// `rotations` turns in the original context.
double correction_dim(double rotations, int64_t R, double theta, int64_t original) {
  return double(R) * std::log(double(original) / (rotations * 2 * M_PI)) / (2 * std::log(theta));
}

// YaRN's ramp over the rotated dims (transformers' find_correction_range and linear_ramp_factor): [low, high].
std::pair<double, double> yarn_ramp(int64_t R, const RopeSpec& r) {
  double low = correction_dim(r.beta_fast, R, r.theta, r.original_max_positions);
  double high = correction_dim(r.beta_slow, R, r.theta, r.original_max_positions);
  if (r.truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0), high = std::min(high, double(R - 1));
  if (low == high) high += 0.001;
  return {low, high};
}

// inv_freq over R rotated dims: [R/2].
std::vector<float> inv_freq(int64_t R, const RopeSpec& r) {
  const int64_t h = R / 2;
  std::vector<float> f(static_cast<size_t>(h));
  const auto [low, high] = r.is_yarn() ? yarn_ramp(R, r) : std::pair{0.0, 1.0};
  for (int64_t j = 0; j < h; ++j) {
    const float e = float(2 * j) / float(R);
    const float pos_freq = float(std::pow(double(float(r.theta)), double(e)));
    f[size_t(j)] = 1.0f / pos_freq;
    if (!r.is_yarn()) continue;
    const float ramp = std::clamp((float(j) - float(low)) / float(high - low), 0.0f, 1.0f);
    const float extrapolation = 1.0f - ramp;  // the share of the original frequency
    const float interpolated = 1.0f / (float(r.factor) * pos_freq);
    f[size_t(j)] = interpolated * (1.0f - extrapolation) + f[size_t(j)] * extrapolation;
  }
  return f;
}

// cos_t[h], sin_t[h] of position p: angle = f32(p) · inv_freq_j, cos and sin in double of that f32 angle, times the
// attention factor in f32 (1 for plain RoPE: unchanged bits).
void cos_sin_row(float* cos_t, float* sin_t, int32_t p, const float* freq, int64_t h, float attention_factor) {
  for (int64_t j = 0; j < h; ++j) {
    const double angle = double(float(p) * freq[j]);
    cos_t[j] = float(std::cos(angle)) * attention_factor;
    sin_t[j] = float(std::sin(angle)) * attention_factor;
  }
}

// A rotation row of position p: cos [h], then sign·sin [h].
void rotation_row(float* row, int32_t p, const float* freq, int64_t h, float attention_factor, float sign) {
  cos_sin_row(row, row + h, p, freq, h, attention_factor);
  for (int64_t j = 0; j < h; ++j) row[h + j] = sign * row[h + j];
}

// Rotates the first R dims of each head; sign = +1 rotates by +angle (forward), -1 by -angle (backward: the
// transpose).
//
// A batch repeats its positions (B rows of 0..T-1, or packed documents restarting at 0), so when the distinct
// positions are few against N the cos/sin rows are computed once per position into a table and looked up:
// the same function of the same position, so the same bits, and the double cos/sin (~1 ms per 2048 x 64 pairs,
// the bulk of the op) drop by the repeat factor (32x at the demo's B = 32).
void rope_apply(float* x, const int32_t* pos, int64_t N, int64_t H, int64_t D, int64_t R, const RopeSpec& rope,
                float sign) {
  LT_CHECK(D > 0 && D % 2 == 0, "rope: head dimension D must be even and positive, got {}", D);
  LT_CHECK(R > 0 && R % 2 == 0 && R <= D, "rope: rotary dimension R must be even, positive and at most D = {}, got {}",
           D, R);
  LT_CHECK(N >= 0 && H > 0, "rope: bad sizes N={}, H={}", N, H);
  check_spec("rope", rope);
  const int64_t h = R / 2;
  const std::vector<float> freq = inv_freq(R, rope);  // [h]
  const float af = float(rope.attention_factor);
  int32_t lo = 0, hi = -1;
  if (N > 0) lo = hi = pos[0];
  for (int64_t n = 1; n < N; ++n) lo = std::min(lo, pos[n]), hi = std::max(hi, pos[n]);
  const int64_t P = int64_t(hi) - lo + 1;
  std::vector<float> table;  // [P, 2h]: cos then sign·sin of position lo + p, when positions repeat
  if (N > 0 && 2 * P <= N) {
    table.resize(size_t(P * R));
    parallel_chunks(P, kTokenChunk, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) rotation_row(table.data() + p * R, int32_t(lo + p), freq.data(), h, af, sign);
    });
  }
  parallel_chunks(N, kTokenChunk, [&](int64_t n0, int64_t n1) {
    std::vector<float> cs(table.empty() ? static_cast<size_t>(R) : 0);  // cos [h] then sign·sin [h]
    for (int64_t n = n0; n < n1; ++n) {
      const float* cos_t;
      if (table.empty()) {
        rotation_row(cs.data(), pos[n], freq.data(), h, af, sign);
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

RopeSpec RopeSpec::yarn(double theta, double factor, double beta_fast, double beta_slow, int64_t original_max,
                        bool truncate, double attention_factor) {
  RopeSpec r(theta);
  r.factor = factor;
  r.beta_fast = beta_fast;
  r.beta_slow = beta_slow;
  r.original_max_positions = original_max;
  r.truncate = truncate;
  r.attention_factor = attention_factor > 0 ? attention_factor : (factor <= 1 ? 1.0 : 0.1 * std::log(factor) + 1.0);
  check_spec("YaRN", r);
  return r;
}

void rope_table(float* cos, float* sin, int64_t P, int64_t D, const RopeSpec& rope) {
  LT_CHECK(D > 0 && D % 2 == 0, "rope_table: head dimension D must be even and positive, got {}", D);
  LT_CHECK(P >= 0 && P <= int64_t(1) << 31, "rope_table: bad number of positions {}", P);
  check_spec("rope_table", rope);
  const int64_t h = D / 2;
  const std::vector<float> freq = inv_freq(D, rope);  // [h]
  const float af = float(rope.attention_factor);
  parallel_chunks(P, kTokenChunk, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) cos_sin_row(cos + p * h, sin + p * h, int32_t(p), freq.data(), h, af);
  });
}

void rope_forward(float* x, const int32_t* pos, int64_t N, int64_t H, int64_t D, const RopeSpec& rope) {
  LT_OPS_OVERRIDE(rope_forward, x, pos, N, H, D, rope);
  rope_apply(x, pos, N, H, D, D, rope, 1.0f);
}

void rope_backward(float* dx, const int32_t* pos, int64_t N, int64_t H, int64_t D, const RopeSpec& rope) {
  LT_OPS_OVERRIDE(rope_backward, dx, pos, N, H, D, rope);
  rope_apply(dx, pos, N, H, D, D, rope, -1.0f);
}

void rope_partial_forward(float* x, const int32_t* pos, int64_t N, int64_t H, int64_t D, int64_t R,
                          const RopeSpec& rope) {
  if (R == D) return rope_forward(x, pos, N, H, D, rope);
  rope_apply(x, pos, N, H, D, R, rope, 1.0f);
}

void rope_partial_backward(float* dx, const int32_t* pos, int64_t N, int64_t H, int64_t D, int64_t R,
                           const RopeSpec& rope) {
  if (R == D) return rope_backward(dx, pos, N, H, D, rope);
  rope_apply(dx, pos, N, H, D, R, rope, -1.0f);
}

}  // namespace lt
