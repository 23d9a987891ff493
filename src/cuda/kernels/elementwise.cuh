// cuda/kernels/elementwise.cuh — SwiGLU and GPT-OSS's clamped SwiGLU (ops/swiglu_math.h's per-element formulas, the
// CPU ops' bits), the residual add, gradient accumulation and dtype conversions: grid-stride loops over n elements,
// 16 bytes a load and store where the pointers allow.
#pragma once

#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "cuda/kernels/common.cuh"
#include "ops/swiglu_math.h"

namespace lt::cuda::LT_KERNELS_NS {

// Eight elements at a time where every pointer of a launch is 16-byte aligned (the executor's buffers are; an
// offset view may not be): one 16-byte load or store per eight bf16, two per eight f32, instead of eight 2- or
// 4-byte ones. Each element is the scalar path's formula on the same values, so the bits do not depend on which
// path ran. The packs come first (thread i takes packs i, i + grid, ...), then the n % 8 tail.
constexpr int kPack = 8;

__device__ __forceinline__ void load_pack(float (&x)[kPack], const float* p) {
#ifdef __CUDACC__
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
#else
  std::memcpy(x, p, sizeof(x));
#endif
}
__device__ __forceinline__ void load_pack(float (&x)[kPack], const bf16* p) {
  uint32_t w[kPack / 2];
#ifdef __CUDACC__
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
#else
  std::memcpy(w, p, sizeof(w));
#endif
  for (int i = 0; i < kPack / 2; ++i)
    x[2 * i] = __bfloat162float(__ushort_as_bfloat16((unsigned short)(w[i] & 0xffffu))),
    x[2 * i + 1] = __bfloat162float(__ushort_as_bfloat16((unsigned short)(w[i] >> 16)));
}
__device__ __forceinline__ void store_pack(float* p, const float (&x)[kPack]) {
#ifdef __CUDACC__
  reinterpret_cast<float4*>(p)[0] = make_float4(x[0], x[1], x[2], x[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(x[4], x[5], x[6], x[7]);
#else
  std::memcpy(p, x, sizeof(x));
#endif
}
__device__ __forceinline__ void store_pack(bf16* p, const float (&x)[kPack]) {
  uint32_t w[kPack / 2];
  for (int i = 0; i < kPack / 2; ++i)
    w[i] = uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(x[2 * i]))) |
           (uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(x[2 * i + 1]))) << 16);
#ifdef __CUDACC__
  *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
#else
  std::memcpy(p, w, sizeof(w));
#endif
}

// Widened loads and rounded stores of W = 1 or kPack consecutive elements.
template <int W, class T>
__device__ __forceinline__ void load_n(float (&x)[W], const T* p) {
  if constexpr (W == kPack) load_pack(x, p);
  else x[0] = load(p);
}
template <int W, class T>
__device__ __forceinline__ void store_n(T* p, const float (&x)[W]) {
  if constexpr (W == kPack) store_pack(p, x);
  else store(p, x[0]);
}

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

// Whether every pointer is 16-byte aligned (the packed path); the launch over n elements, a thread per pack then.
inline bool all_aligned16(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}
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
