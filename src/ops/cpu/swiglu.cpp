// ops/cpu/swiglu.cpp — h = silu(gate) · up and its backward, elementwise over n = N·I.
//
// The per-element arithmetic (a stable sigmoid from our own exp, and the backward's formulas) is in
// ops/swiglu_math.h, shared with the CUDA kernel.
//
// Three builds of the same loop bodies: the baseline (SSE2) one is the specification, and an AVX-512 and an
// AVX2 + FMA one chosen at run time from cpu_features() (AVX-512 first). FMA contraction is turned off for
// the vector builds (GCC would otherwise fuse a·b + c there, and not in the baseline which has no FMA), so
// all give the same bits, on every x86-64 and every thread count; the tests compare them bit for bit.
// Measured on one core of the shared (loaded) 2-core AMD EPYC dev box, n = 22.5M: forward 31 ms baseline,
// 14 ms AVX-512 (19 GB/s); backward 40 ms baseline, 12 ms AVX-512 (36 GB/s). Roughly memory-bound.
// The AVX2 build, later, with other jobs holding both cores (load average ~6; best of 7, a throwaway driver
// run with LT_MAX_ISA=plain|avx2|avx512): forward 88 / 25 / 20 ms, backward 124 / 54 / 38 ms.

#include "ops/swiglu.h"

#include <algorithm>
#include <cstdint>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/parallel.h"
#include "ops/override.h"
#include "ops/swiglu_math.h"

namespace lt {
namespace {

constexpr int64_t kChunk = int64_t(1) << 14;  // elements per task

// out[i] = silu(gate[i]) · up[i], i in [b, e)
[[gnu::always_inline]] inline void forward_loop(float* out, const float* gate, const float* up, int64_t b,
                                                int64_t e) {
  for (int64_t i = b; i < e; ++i) out[i] = swiglu_math::forward(gate[i], up[i]);
}

[[gnu::always_inline]] inline void backward_loop(float* dgate, float* dup, const float* dout, const float* gate,
                                                 const float* up, int64_t b, int64_t e) {
  for (int64_t i = b; i < e; ++i) swiglu_math::backward(dout[i], gate[i], up[i], &dgate[i], &dup[i]);
}

void forward_plain(float* out, const float* gate, const float* up, int64_t b, int64_t e) {
  forward_loop(out, gate, up, b, e);
}

void backward_plain(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t b,
                    int64_t e) {
  backward_loop(dgate, dup, dout, gate, up, b, e);
}

// optimize("fp-contract=off"): keeps every product and sum rounded separately, as in the baseline build.
__attribute__((target("avx512f"), optimize("fp-contract=off"))) void forward_avx512(float* out, const float* gate,
                                                                                    const float* up, int64_t b,
                                                                                    int64_t e) {
  forward_loop(out, gate, up, b, e);
}

__attribute__((target("avx512f"), optimize("fp-contract=off"))) void backward_avx512(
    float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t b, int64_t e) {
  backward_loop(dgate, dup, dout, gate, up, b, e);
}

// The AVX2 build: FMA is available there too, so contraction is off for the same reason.
__attribute__((target("avx2,fma"), optimize("fp-contract=off"))) void forward_avx2(float* out, const float* gate,
                                                                                  const float* up, int64_t b,
                                                                                  int64_t e) {
  forward_loop(out, gate, up, b, e);
}

__attribute__((target("avx2,fma"), optimize("fp-contract=off"))) void backward_avx2(
    float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t b, int64_t e) {
  backward_loop(dgate, dup, dout, gate, up, b, e);
}

struct Loops {
  void (*forward)(float*, const float*, const float*, int64_t, int64_t);
  void (*backward)(float*, float*, const float*, const float*, const float*, int64_t, int64_t);
};

// The widest build the CPU runs: AVX-512, else AVX2 with FMA, else the baseline.
Loops select_loops() {
  switch (isa_level(cpu_features())) {
    case IsaLevel::avx512: return {forward_avx512, backward_avx512};
    case IsaLevel::avx2: return {forward_avx2, backward_avx2};
    case IsaLevel::plain: break;
  }
  return {forward_plain, backward_plain};
}

}  // namespace

void swiglu_forward(float* out, const float* gate, const float* up, int64_t n) {
  LT_OPS_OVERRIDE(swiglu_forward, out, gate, up, n);
  LT_CHECK(n >= 0, "swiglu_forward: bad size n={}", n);
  // out[n] = silu(gate[n]) · up[n]
  const auto loop = select_loops().forward;
  parallel_chunks(n, kChunk, [&](int64_t b, int64_t e) { loop(out, gate, up, b, e); });
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n) {
  LT_OPS_OVERRIDE(swiglu_backward, dgate, dup, dout, gate, up, n);
  LT_CHECK(n >= 0, "swiglu_backward: bad size n={}", n);
  // dgate[n], dup[n] written
  const auto loop = select_loops().backward;
  parallel_chunks(n, kChunk, [&](int64_t b, int64_t e) { loop(dgate, dup, dout, gate, up, b, e); });
}

void clamped_swiglu_forward(float* out, const float* gate, const float* up, int64_t n, float alpha, float limit) {
  LT_CHECK(n >= 0 && alpha > 0 && limit > 0, "clamped_swiglu_forward: bad n={}, alpha={}, limit={}", n, alpha, limit);
  LT_OPS_OVERRIDE(clamped_swiglu_forward, out, gate, up, n, alpha, limit);
  parallel_chunks(n, kChunk, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = swiglu_math::clamped_forward(gate[i], up[i], alpha, limit);
  });
}

void clamped_swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n,
                             float alpha, float limit) {
  LT_CHECK(n >= 0 && alpha > 0 && limit > 0, "clamped_swiglu_backward: bad n={}, alpha={}, limit={}", n, alpha,
           limit);
  LT_OPS_OVERRIDE(clamped_swiglu_backward, dgate, dup, dout, gate, up, n, alpha, limit);
  parallel_chunks(n, kChunk, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      swiglu_math::clamped_backward(dout[i], gate[i], up[i], alpha, limit, dgate + i, dup + i);
  });
}

}  // namespace lt
