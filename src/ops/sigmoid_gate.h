// ops/sigmoid_gate.h — gated attention's output gate (HF Qwen3.5/3.6 full-attention layers): the attention
// output is multiplied elementwise by σ(gate) before o_proj, gate coming from the second half of each head of
// q_proj's output, so a head can be damped per token and per channel.
//
// Legend: N tokens, H heads (Hq), D head dimension.
//
//   out[n, h, d] = x[n, h, d] · σ(gate[n, h, d])
// Backward:  dx = dout · σ(gate)  written;  dgate = dout · x · σ(gate)(1 − σ(gate))  written
// (1 − σ taken as σ(−gate), no cancellation). σ is swiglu_math's (ops/swiglu_math.h). Elementwise: the bits
// never depend on the thread count.
//
// x, out, dout, dx are contiguous [N, H, D]. gate (and dgate, in the same layout) is strided: element (n, h, d)
// is at gate[n · ld_token + h · ld_head + d]. HF's q_proj gives [N, Hq, 2D] with each head [query (D) | gate (D)],
// so there gate = q_proj_out + D, ld_token = Hq·2D, ld_head = 2D, and dgate = dq_proj_out + D fills the gate
// halves of q_proj's gradient, leaving the query halves to whoever writes them.
#pragma once

#include <cstdint>

namespace lt {

// out[N, H, D] from x[N, H, D] and the strided gate. out may be x.
void sigmoid_gate_forward(float* out, const float* x, const float* gate, int64_t N, int64_t H, int64_t D,
                          int64_t ld_token, int64_t ld_head);

// dx[N, H, D] and dgate (strided as gate) written from dout[N, H, D]. dx may be dout; dgate must not overlap
// dx, dout or x.
void sigmoid_gate_backward(float* dx, float* dgate, const float* dout, const float* x, const float* gate, int64_t N,
                           int64_t H, int64_t D, int64_t ld_token, int64_t ld_head);

}  // namespace lt
