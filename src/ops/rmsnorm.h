// ops/rmsnorm.h — RMSNorm as HF Llama/Qwen: y = (x · rstd) · w, rstd = 1/sqrt(mean(x²) + eps),
// statistics in f32 (sum of squares accumulated in f32 lanes, combined in a fixed order).
// Used for the block norms (rows = N, C = hidden) and Qwen3's per-head q/k norms (rows = N·H, C = D).
#pragma once

#include <cstdint>

namespace lt {

// out[rows, C]; rstd[rows] saved for backward.
void rmsnorm_forward(float* out, float* rstd, const float* in, const float* weight,
                     int64_t rows, int64_t C, float eps);

// din[rows, C] written; dweight[C] accumulated. All buffers distinct.
void rmsnorm_backward(float* din, float* dweight, const float* dout, const float* in, const float* weight,
                      const float* rstd, int64_t rows, int64_t C);

}  // namespace lt
