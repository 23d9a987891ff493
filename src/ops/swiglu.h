// ops/swiglu.h — the SwiGLU gate of the MLP: h = silu(gate) · up, silu(g) = g · sigmoid(g).
#pragma once

#include <cstdint>

namespace lt {

// out[n] = silu(gate[n]) · up[n], n = N·I elements.
void swiglu_forward(float* out, const float* gate, const float* up, int64_t n);

// dgate, dup written.
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n);

}  // namespace lt
