// ops/rope.h — rotary position embedding, rotate-half layout (HF Llama/Qwen):
//   x' = x · cos + rotate_half(x) · sin, rotate_half([a, b]) = [-b, a], a and b the two halves of D.
//   inv_freq[j] = 1 / theta^(2j/D) (f32, as HF), angle = f32(pos) · inv_freq[j].
#pragma once

#include <cstdint>

namespace lt {

// Rotates x[N, H, D] in place; pos[N] is each token's position (per-document positions when packing).
void rope_forward(float* x, const int32_t* pos, int64_t N, int64_t H, int64_t D, double theta);

// Backward of the rotation (its transpose), in place on dx[N, H, D].
void rope_backward(float* dx, const int32_t* pos, int64_t N, int64_t H, int64_t D, double theta);

// The f32 cos and sin rope_forward rotates position p by, for p in [0, P): cos[P, D/2], sin[P, D/2]. The
// CUDA kernels read this table, so they rotate by the CPU op's bits.
void rope_table(float* cos, float* sin, int64_t P, int64_t D, double theta);
}  // namespace lt
