// ops/rope.h — rotary position embedding, rotate-half layout (HF Llama/Qwen):
//   x' = x · cos + rotate_half(x) · sin, rotate_half([a, b]) = [-b, a], a and b the two halves of D.
//   inv_freq[j] = 1 / theta^(2j/D) (f32, as HF), angle = f32(pos) · inv_freq[j].
//
// Partial rotary (Qwen3.5/3.6 gated attention, partial_rotary_factor 0.25): only the first R dims of each
// head are rotated, with R in place of D everywhere above (HF builds inv_freq from dim = int(D · factor),
// and apply_rotary_pos_emb rotates x[..., :R] by rotate_half over those R dims); dims R..D-1 pass through
// untouched. The full rope is the case R = D and gives the same bits (one code path).
#pragma once

#include <cstdint>

namespace lt {

// Rotates x[N, H, D] in place; pos[N] is each token's position (per-document positions when packing).
void rope_forward(float* x, const int32_t* pos, int64_t N, int64_t H, int64_t D, double theta);

// Backward of the rotation (its transpose), in place on dx[N, H, D].
void rope_backward(float* dx, const int32_t* pos, int64_t N, int64_t H, int64_t D, double theta);

// The f32 cos and sin rope_forward rotates position p by, for p in [0, P): cos[P, D/2], sin[P, D/2]. The
// CUDA kernels read this table, so they rotate by the CPU op's bits.
// A partial rope's table is rope_table(cos, sin, P, R, theta): the angles depend on R alone.
void rope_table(float* cos, float* sin, int64_t P, int64_t D, double theta);

// Rotates the first R dims of each head of x[N, H, D] in place (R even, 0 < R <= D); dims R..D-1 untouched.
// R = D calls rope_forward (so an installed ops override runs it too).
void rope_partial_forward(float* x, const int32_t* pos, int64_t N, int64_t H, int64_t D, int64_t R,
                          double theta);

// Backward of rope_partial_forward, in place on dx[N, H, D]: dims R..D-1 pass the gradient through.
void rope_partial_backward(float* dx, const int32_t* pos, int64_t N, int64_t H, int64_t D, int64_t R,
                           double theta);
}  // namespace lt
