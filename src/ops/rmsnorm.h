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

// The summation order both rmsnorm's CPU op and its CUDA kernel follow (so they agree bit for bit):
// Σ_c over kRmsnormLanes f32 lanes (lane k takes c ≡ k mod 16, in order; lanes combined by the tree
// acc[k] += acc[k + w] for w = 8, 4, 2, 1), and dweight reduced over fixed chunks of this many rows into f64
// partials, summed in chunk order and added to dweight once in f32.
constexpr int kRmsnormLanes = 16;
int64_t rmsnorm_dweight_chunk_rows(int64_t rows);
}  // namespace lt
