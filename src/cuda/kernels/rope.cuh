// cuda/kernels/rope.cuh — rotary position embedding (ops/rope.h), rotate-half layout, in place.
//
// The angles come from ops' rope_table (cos[P, D/2], sin[P, D/2], computed on the host exactly as the CPU op
// computes them), so the kernel's only arithmetic is the rotation, in the CPU op's order:
//   a' = a·cos - b·sin,  b' = b·cos + a·sin   (the backward with sin negated: the transpose)
// One block per token; its threads take the token's H·R/2 pairs. Partial rotary (Qwen3.5/3.6) rotates the first
// R dims of each head by a table built for R (rope_table(cos, sin, P, R, theta): cos[P, R/2]) and leaves dims
// R..D-1 unread and unwritten; the full rope is R = D, the same loop and the same bits.
#pragma once

#include "cuda/kernels/common.cuh"

namespace lt::cuda::LT_KERNELS_NS {

constexpr int kRopeThreads = 128;

template <class T>
__global__ void __launch_bounds__(kRopeThreads)
    rope_kernel(T* x, const int32_t* pos, const float* cos, const float* sin, int64_t H, int64_t D, int64_t R,
                float sign) {
  const int64_t n = blockIdx.x, h = R / 2;
  const float* cos_t = cos + int64_t(pos[n]) * h;  // [h]
  const float* sin_t = sin + int64_t(pos[n]) * h;  // [h]
  for (int64_t i = threadIdx.x; i < H * h; i += kRopeThreads) {
    const int64_t head = i / h, j = i % h;
    T* a = x + (n * H + head) * D;  // [h]
    T* b = a + h;                   // [h]
    const float aj = load(a + j), bj = load(b + j), c = cos_t[j], s = sign * sin_t[j];
    store(a + j, aj * c - bj * s);
    store(b + j, bj * c + aj * s);
  }
}

namespace detail {
template <class T>
void rope(Stream s, T* x, const int32_t* pos, const float* cos, const float* sin, int64_t N, int64_t H, int64_t D,
          int64_t R, float sign) {
  if (N == 0) return;
  LT_LAUNCH(rope_kernel<T>, dim3(unsigned(N)), dim3(kRopeThreads), 0, native_stream(s), x, pos, cos, sin, H, D, R,
            sign);
}
}  // namespace detail

void rope_forward(Stream s, float* x, const int32_t* pos, const float* cos, const float* sin, int64_t N,
                  int64_t H, int64_t D) {
  detail::rope(s, x, pos, cos, sin, N, H, D, D, 1.0f);
}
void rope_forward(Stream s, bf16_t* x, const int32_t* pos, const float* cos, const float* sin, int64_t N,
                  int64_t H, int64_t D) {
  detail::rope(s, dev(x), pos, cos, sin, N, H, D, D, 1.0f);
}
void rope_backward(Stream s, float* dx, const int32_t* pos, const float* cos, const float* sin, int64_t N,
                   int64_t H, int64_t D) {
  detail::rope(s, dx, pos, cos, sin, N, H, D, D, -1.0f);
}
void rope_partial_forward(Stream s, float* x, const int32_t* pos, const float* cos, const float* sin, int64_t N,
                          int64_t H, int64_t D, int64_t R) {
  detail::rope(s, x, pos, cos, sin, N, H, D, R, 1.0f);
}
void rope_partial_forward(Stream s, bf16_t* x, const int32_t* pos, const float* cos, const float* sin, int64_t N,
                          int64_t H, int64_t D, int64_t R) {
  detail::rope(s, dev(x), pos, cos, sin, N, H, D, R, 1.0f);
}
void rope_partial_backward(Stream s, float* dx, const int32_t* pos, const float* cos, const float* sin, int64_t N,
                           int64_t H, int64_t D, int64_t R) {
  detail::rope(s, dx, pos, cos, sin, N, H, D, R, -1.0f);
}

}  // namespace lt::cuda::LT_KERNELS_NS
