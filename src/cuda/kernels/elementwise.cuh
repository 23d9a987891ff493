// cuda/kernels/elementwise.cuh — SwiGLU and GPT-OSS's clamped SwiGLU (ops/swiglu_math.h's per-element formulas, the
// CPU ops' bits), the residual add, gradient accumulation and dtype conversions: grid-stride loops over n elements.
#pragma once

#include "cuda/kernels/common.cuh"
#include "ops/swiglu_math.h"

namespace lt::cuda::LT_KERNELS_NS {

template <class T>
__global__ void swiglu_forward_kernel(T* out, const T* gate, const T* up, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    store(out + i, swiglu_math::forward(load(gate + i), load(up + i)));
}

template <class T>
__global__ void swiglu_backward_kernel(float* dgate, float* dup, const float* dout, const T* gate, const T* up,
                                       int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    swiglu_math::backward(dout[i], load(gate + i), load(up + i), dgate + i, dup + i);
}

template <class T>
__global__ void clamped_swiglu_forward_kernel(T* out, const T* gate, const T* up, int64_t n, float alpha,
                                              float limit) {
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    store(out + i, swiglu_math::clamped_forward(load(gate + i), load(up + i), alpha, limit));
}

template <class T>
__global__ void clamped_swiglu_backward_kernel(float* dgate, float* dup, const float* dout, const T* gate, const T* up,
                                               int64_t n, float alpha, float limit) {
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    swiglu_math::clamped_backward(dout[i], load(gate + i), load(up + i), alpha, limit, dgate + i, dup + i);
}

template <class T>
__global__ void add_kernel(T* out, const T* a, const T* b, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) store(out + i, load(a + i) + load(b + i));
}

__global__ void accumulate_kernel(float* y, const float* x, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) y[i] += x[i];
}

__global__ void zero_kernel(float* y, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) y[i] = 0.0f;
}

__global__ void convert_to_bf16_kernel(bf16* dst, const float* src, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) store(dst + i, src[i]);
}

__global__ void convert_to_f32_kernel(float* dst, const bf16* src, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) dst[i] = load(src + i);
}

void swiglu_forward(Stream s, float* out, const float* gate, const float* up, int64_t n) {
  LT_ELEMENTWISE(swiglu_forward_kernel<float>, n, out, gate, up, n);
}
void swiglu_forward(Stream s, bf16_t* out, const bf16_t* gate, const bf16_t* up, int64_t n) {
  LT_ELEMENTWISE(swiglu_forward_kernel<bf16>, n, dev(out), dev(gate), dev(up), n);
}
void swiglu_backward(Stream s, float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                     int64_t n) {
  LT_ELEMENTWISE(swiglu_backward_kernel<float>, n, dgate, dup, dout, gate, up, n);
}
void swiglu_backward(Stream s, float* dgate, float* dup, const float* dout, const bf16_t* gate,
                     const bf16_t* up, int64_t n) {
  LT_ELEMENTWISE(swiglu_backward_kernel<bf16>, n, dgate, dup, dout, dev(gate), dev(up), n);
}
void clamped_swiglu_forward(Stream s, float* out, const float* gate, const float* up, int64_t n, float alpha,
                            float limit) {
  LT_ELEMENTWISE(clamped_swiglu_forward_kernel<float>, n, out, gate, up, n, alpha, limit);
}
void clamped_swiglu_forward(Stream s, bf16_t* out, const bf16_t* gate, const bf16_t* up, int64_t n, float alpha,
                            float limit) {
  LT_ELEMENTWISE(clamped_swiglu_forward_kernel<bf16>, n, dev(out), dev(gate), dev(up), n, alpha, limit);
}
void clamped_swiglu_backward(Stream s, float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                             int64_t n, float alpha, float limit) {
  LT_ELEMENTWISE(clamped_swiglu_backward_kernel<float>, n, dgate, dup, dout, gate, up, n, alpha, limit);
}
void clamped_swiglu_backward(Stream s, float* dgate, float* dup, const float* dout, const bf16_t* gate,
                             const bf16_t* up, int64_t n, float alpha, float limit) {
  LT_ELEMENTWISE(clamped_swiglu_backward_kernel<bf16>, n, dgate, dup, dout, dev(gate), dev(up), n, alpha, limit);
}
void add(Stream s, float* out, const float* a, const float* b, int64_t n) {
  LT_ELEMENTWISE(add_kernel<float>, n, out, a, b, n);
}
void add(Stream s, bf16_t* out, const bf16_t* a, const bf16_t* b, int64_t n) {
  LT_ELEMENTWISE(add_kernel<bf16>, n, dev(out), dev(a), dev(b), n);
}
void accumulate(Stream s, float* y, const float* x, int64_t n) { LT_ELEMENTWISE(accumulate_kernel, n, y, x, n); }
void zero(Stream s, float* y, int64_t n) { LT_ELEMENTWISE(zero_kernel, n, y, n); }

void convert(Stream s, bf16_t* dst, const float* src, int64_t n) {
  LT_ELEMENTWISE(convert_to_bf16_kernel, n, dev(dst), src, n);
}
void convert(Stream s, float* dst, const bf16_t* src, int64_t n) {
  LT_ELEMENTWISE(convert_to_f32_kernel, n, dst, dev(src), n);
}

}  // namespace lt::cuda::LT_KERNELS_NS
