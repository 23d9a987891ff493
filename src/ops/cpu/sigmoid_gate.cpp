// ops/cpu/sigmoid_gate.cpp — gated attention's σ output gate, forward and backward in f32; the math and the
// strided gate layout are in ops/sigmoid_gate.h.
//
// Legend: N tokens, H heads, D head dimension.
#include "ops/sigmoid_gate.h"

#include "core/error.h"
#include "core/parallel.h"
#include "ops/swiglu_math.h"

namespace lt {
namespace {

constexpr int64_t kTokenChunk = 16;  // tokens per task

void check_sizes(const char* op, int64_t N, int64_t H, int64_t D, int64_t ld_token, int64_t ld_head) {
  LT_CHECK(N >= 0 && H > 0 && D > 0, "{}: bad sizes N={}, H={}, D={}", op, N, H, D);
  // The gate's elements must not overlap one another (dgate is written through the same strides).
  LT_CHECK(ld_head >= D && ld_token >= (H - 1) * ld_head + D,
           "{}: gate strides (token {}, head {}) overlap for H={}, D={}", op, ld_token, ld_head, H, D);
}

}  // namespace

void sigmoid_gate_forward(float* out, const float* x, const float* gate, int64_t N, int64_t H, int64_t D,
                          int64_t ld_token, int64_t ld_head) {
  check_sizes("sigmoid_gate_forward", N, H, D, ld_token, ld_head);
  parallel_chunks(N, kTokenChunk, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t h = 0; h < H; ++h) {
        const float* xr = x + (n * H + h) * D;                // [D]
        const float* gr = gate + n * ld_token + h * ld_head;  // [D]
        float* y = out + (n * H + h) * D;                     // [D]
        for (int64_t d = 0; d < D; ++d) y[d] = xr[d] * swiglu_math::sigmoid(gr[d]);
      }
  });
}

void sigmoid_gate_backward(float* dx, float* dgate, const float* dout, const float* x, const float* gate, int64_t N,
                           int64_t H, int64_t D, int64_t ld_token, int64_t ld_head) {
  check_sizes("sigmoid_gate_backward", N, H, D, ld_token, ld_head);
  parallel_chunks(N, kTokenChunk, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t h = 0; h < H; ++h) {
        const float* xr = x + (n * H + h) * D;                // [D]
        const float* gr = gate + n * ld_token + h * ld_head;  // [D]
        const float* g = dout + (n * H + h) * D;              // [D]
        float* dxr = dx + (n * H + h) * D;                    // [D]
        float* dgr = dgate + n * ld_token + h * ld_head;      // [D]
        for (int64_t d = 0; d < D; ++d) {
          float s, one_minus_s;
          swiglu_math::sigmoid_pair(gr[d], &s, &one_minus_s);
          const float gd = g[d];  // read before dx is written (dx may be dout)
          dgr[d] = (gd * xr[d]) * (s * one_minus_s);
          dxr[d] = gd * s;
        }
      }
  });
}

}  // namespace lt
