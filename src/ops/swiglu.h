// ops/swiglu.h — the SwiGLU gate of the MLP: h = silu(gate) · up, silu(g) = g · sigmoid(g).
#pragma once

#include <cstdint>

namespace lt {

// out[n] = silu(gate[n]) · up[n], n = N·I elements.
void swiglu_forward(float* out, const float* gate, const float* up, int64_t n);

// dgate, dup written.
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n);

// GPT-OSS's clamped SwiGLU (transformers' GptOssExperts; α = 1.702 and limit = 7 are constants of the model):
//   g' = min(g, limit),  u' = clamp(u, −limit, limit),  out = (u' + 1) · (g' · σ(α·g'))
// rounded in that order. Backward, with a = α·g', s = σ(a):
//   dgate = dout · (u' + 1) · s · (1 + a·(1 − s))  where g <= limit, else 0
//   dup   = dout · g' · s                           where −limit <= u <= limit, else 0
// (torch's clamp passes the gradient at the bounds). σ and 1 − σ as SwiGLU's (ops/swiglu_math.h). One plain build:
// the same bits on every host.
inline constexpr float kClampedSwigluAlpha = 1.702f;  // GptOssExperts' alpha
void clamped_swiglu_forward(float* out, const float* gate, const float* up, int64_t n, float alpha, float limit);
void clamped_swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n,
                             float alpha, float limit);

}  // namespace lt
