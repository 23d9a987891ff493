// cuda/kernels/elementwise.cuh — SwiGLU and GPT-OSS's clamped SwiGLU (ops/swiglu_math.h's per-element formulas, the
// CPU ops' bits), the residual add, gradient accumulation and dtype conversions: grid-stride loops over n elements,
// 16 bytes a load and store where the pointers allow.
#pragma once

#include <type_traits>

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/pack.cuh"
#include "ops/swiglu_math.h"

namespace lt::cuda::LT_KERNELS_NS {

// The elementwise loop over n elements: body(i, width) handles elements [i, i + W), W = width's value — kPack
// where `packed` (every pointer of the launch 16-byte aligned, the launcher's check), then 1 for the rest.
template <class Body>
__device__ __forceinline__ void elementwise_loop(int64_t n, bool packed, Body body) {
  const int64_t packs = packed ? n / kPack : 0;
  for (int64_t p = global_thread(); p < packs; p += grid_threads())
    body(kPack * p, std::integral_constant<int, kPack>{});
  for (int64_t i = kPack * packs + global_thread(); i < n; i += grid_threads())
    body(i, std::integral_constant<int, 1>{});
}

template <class T>
__global__ void swiglu_forward_kernel(T* out, const T* gate, const T* up, int64_t n, bool packed) {
  elementwise_loop(n, packed, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    float g[W], u[W], y[W];
    load_n(g, gate + i), load_n(u, up + i);
    for (int e = 0; e < W; ++e) y[e] = swiglu_math::forward(g[e], u[e]);
    store_n(out + i, y);
  });
}

template <class T>
__global__ void swiglu_backward_kernel(float* dgate, float* dup, const float* dout, const T* gate, const T* up,
                                       int64_t n, bool packed) {
  elementwise_loop(n, packed, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    float d[W], g[W], u[W], dg[W], du[W];
    load_n(d, dout + i), load_n(g, gate + i), load_n(u, up + i);
    for (int e = 0; e < W; ++e) swiglu_math::backward(d[e], g[e], u[e], dg + e, du + e);
    store_n(dgate + i, dg), store_n(dup + i, du);
  });
}

template <class T>
__global__ void clamped_swiglu_forward_kernel(T* out, const T* gate, const T* up, int64_t n, float alpha,
                                              float limit, bool packed) {
  elementwise_loop(n, packed, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    float g[W], u[W], y[W];
    load_n(g, gate + i), load_n(u, up + i);
    for (int e = 0; e < W; ++e) y[e] = swiglu_math::clamped_forward(g[e], u[e], alpha, limit);
    store_n(out + i, y);
  });
}

template <class T>
__global__ void clamped_swiglu_backward_kernel(float* dgate, float* dup, const float* dout, const T* gate, const T* up,
                                               int64_t n, float alpha, float limit, bool packed) {
  elementwise_loop(n, packed, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    float d[W], g[W], u[W], dg[W], du[W];
    load_n(d, dout + i), load_n(g, gate + i), load_n(u, up + i);
    for (int e = 0; e < W; ++e) swiglu_math::clamped_backward(d[e], g[e], u[e], alpha, limit, dg + e, du + e);
    store_n(dgate + i, dg), store_n(dup + i, du);
  });
}

template <class T>
__global__ void add_kernel(T* out, const T* a, const T* b, int64_t n, bool packed) {
  elementwise_loop(n, packed, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    float x[W], y[W];
    load_n(x, a + i), load_n(y, b + i);
    for (int e = 0; e < W; ++e) x[e] = x[e] + y[e];
    store_n(out + i, x);
  });
}

__global__ void accumulate_kernel(float* y, const float* x, int64_t n, bool packed) {
  elementwise_loop(n, packed, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    float a[W], b[W];
    load_n(a, y + i), load_n(b, x + i);
    for (int e = 0; e < W; ++e) a[e] += b[e];
    store_n(y + i, a);
  });
}

__global__ void zero_kernel(float* y, int64_t n, bool packed) {
  elementwise_loop(n, packed, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    float z[W];
    for (int e = 0; e < W; ++e) z[e] = 0.0f;
    store_n(y + i, z);
  });
}

// f32 → bf16 (rounded to nearest even) and bf16 → f32 (exact).
template <class To, class From>
__device__ __forceinline__ void convert_elements(To* dst, const From* src, int64_t n, bool packed) {
  elementwise_loop(n, packed, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    float x[W];
    load_n(x, src + i);
    store_n(dst + i, x);
  });
}
__global__ void convert_to_bf16_kernel(bf16* dst, const float* src, int64_t n, bool packed) {
  convert_elements(dst, src, n, packed);
}
__global__ void convert_to_f32_kernel(float* dst, const bf16* src, int64_t n, bool packed) {
  convert_elements(dst, src, n, packed);
}

// The launch over n elements, a thread per pack where packed.
#define LT_ELEMENTWISE_PACKED(kernel, n, packed, ...)                                                        \
  do {                                                                                                     \
    if ((n) > 0)                                                                                           \
      LT_LAUNCH(kernel, dim3(elementwise_blocks((packed) ? ((n) + kPack - 1) / kPack : (n))),              \
                dim3(kElementwiseThreads), 0, native_stream(s), __VA_ARGS__, (packed));                   \
  } while (0)

void swiglu_forward(Stream s, float* out, const float* gate, const float* up, int64_t n) {
  const bool packed = all_aligned16({out, gate, up});
  LT_ELEMENTWISE_PACKED(swiglu_forward_kernel<float>, n, packed, out, gate, up, n);
}
void swiglu_forward(Stream s, bf16_t* out, const bf16_t* gate, const bf16_t* up, int64_t n) {
  const bool packed = all_aligned16({out, gate, up});
  LT_ELEMENTWISE_PACKED(swiglu_forward_kernel<bf16>, n, packed, dev(out), dev(gate), dev(up), n);
}
void swiglu_backward(Stream s, float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                     int64_t n) {
  const bool packed = all_aligned16({dgate, dup, dout, gate, up});
  LT_ELEMENTWISE_PACKED(swiglu_backward_kernel<float>, n, packed, dgate, dup, dout, gate, up, n);
}
void swiglu_backward(Stream s, float* dgate, float* dup, const float* dout, const bf16_t* gate,
                     const bf16_t* up, int64_t n) {
  const bool packed = all_aligned16({dgate, dup, dout, gate, up});
  LT_ELEMENTWISE_PACKED(swiglu_backward_kernel<bf16>, n, packed, dgate, dup, dout, dev(gate), dev(up), n);
}
void clamped_swiglu_forward(Stream s, float* out, const float* gate, const float* up, int64_t n, float alpha,
                            float limit) {
  const bool packed = all_aligned16({out, gate, up});
  LT_ELEMENTWISE_PACKED(clamped_swiglu_forward_kernel<float>, n, packed, out, gate, up, n, alpha, limit);
}
void clamped_swiglu_forward(Stream s, bf16_t* out, const bf16_t* gate, const bf16_t* up, int64_t n, float alpha,
                            float limit) {
  const bool packed = all_aligned16({out, gate, up});
  LT_ELEMENTWISE_PACKED(clamped_swiglu_forward_kernel<bf16>, n, packed, dev(out), dev(gate), dev(up), n, alpha, limit);
}
void clamped_swiglu_backward(Stream s, float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                             int64_t n, float alpha, float limit) {
  const bool packed = all_aligned16({dgate, dup, dout, gate, up});
  LT_ELEMENTWISE_PACKED(clamped_swiglu_backward_kernel<float>, n, packed, dgate, dup, dout, gate, up, n, alpha, limit);
}
void clamped_swiglu_backward(Stream s, float* dgate, float* dup, const float* dout, const bf16_t* gate,
                             const bf16_t* up, int64_t n, float alpha, float limit) {
  const bool packed = all_aligned16({dgate, dup, dout, gate, up});
  LT_ELEMENTWISE_PACKED(clamped_swiglu_backward_kernel<bf16>, n, packed, dgate, dup, dout, dev(gate), dev(up), n, alpha,
                        limit);
}
void add(Stream s, float* out, const float* a, const float* b, int64_t n) {
  const bool packed = all_aligned16({out, a, b});
  LT_ELEMENTWISE_PACKED(add_kernel<float>, n, packed, out, a, b, n);
}
void add(Stream s, bf16_t* out, const bf16_t* a, const bf16_t* b, int64_t n) {
  const bool packed = all_aligned16({out, a, b});
  LT_ELEMENTWISE_PACKED(add_kernel<bf16>, n, packed, dev(out), dev(a), dev(b), n);
}
void accumulate(Stream s, float* y, const float* x, int64_t n) {
  const bool packed = all_aligned16({y, x});
  LT_ELEMENTWISE_PACKED(accumulate_kernel, n, packed, y, x, n);
}
void zero(Stream s, float* y, int64_t n) {
  const bool packed = all_aligned16({y});
  LT_ELEMENTWISE_PACKED(zero_kernel, n, packed, y, n);
}

void convert(Stream s, bf16_t* dst, const float* src, int64_t n) {
  const bool packed = all_aligned16({dst, src});
  LT_ELEMENTWISE_PACKED(convert_to_bf16_kernel, n, packed, dev(dst), src, n);
}
void convert(Stream s, float* dst, const bf16_t* src, int64_t n) {
  const bool packed = all_aligned16({dst, src});
  LT_ELEMENTWISE_PACKED(convert_to_f32_kernel, n, packed, dst, dev(src), n);
}

}  // namespace lt::cuda::LT_KERNELS_NS
