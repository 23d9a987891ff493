// cuda/kernels/rope.cuh — rotary position embedding (ops/rope.h), rotate-half layout, in place.
//
// The angles come from ops' rope_table (cos[P, D/2], sin[P, D/2], computed on the host exactly as the CPU op
// computes them), so the kernel's only arithmetic is the rotation, in the CPU op's order:
//   a' = a·cos - b·sin,  b' = b·cos + a·sin   (the backward with sin negated: the transpose)
// One block per token; its threads take the token's H·R/2 pairs. Partial rotary (Qwen3.5/3.6) rotates the first
// R dims of each head by a table built for R (rope_table(cos, sin, P, R, theta): cos[P, R/2]) and leaves dims
// R..D-1 unread and unwritten; the full rope is R = D, the same loop and the same bits. Where R/2 and D are
// multiples of 8 and the pointers 16-byte aligned, a thread takes eight pairs with 16-byte loads (pack.cuh): the
// same arithmetic per pair, the same bits.
#pragma once

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/pack.cuh"

namespace lt::cuda::LT_KERNELS_NS {

constexpr int kRopeThreads = 128;

// W pairs a thread: 1, or kPack where R/2 % 8 == 0, D % 8 == 0 and x, cos and sin are 16-byte aligned (16-byte
// loads and stores of eight consecutive pairs; the same arithmetic per pair).
template <int W, class T>
__global__ void __launch_bounds__(kRopeThreads)
    rope_kernel(T* x, const int32_t* pos, const float* cos, const float* sin, int64_t H, int64_t D, int64_t R,
                float sign) {
  const int64_t n = blockIdx.x, h = R / 2, groups = h / W;
  const float* cos_t = cos + int64_t(pos[n]) * h;  // [h]
  const float* sin_t = sin + int64_t(pos[n]) * h;  // [h]
  for (int64_t i = threadIdx.x; i < H * groups; i += kRopeThreads) {
    const int64_t head = i / groups, j = (i % groups) * W;
    T* a = x + (n * H + head) * D + j;  // [W]
    T* b = a + h;                       // [W]
    float av[W], bv[W], c[W], sn[W];
    load_n(av, a), load_n(bv, b), load_n(c, cos_t + j), load_n(sn, sin_t + j);
    for (int e = 0; e < W; ++e) {
      const float s = sign * sn[e], ae = av[e];
      av[e] = ae * c[e] - bv[e] * s;
      bv[e] = bv[e] * c[e] + ae * s;
    }
    store_n(a, av), store_n(b, bv);
  }
}

namespace detail {
template <class T>
void rope(Stream s, T* x, const int32_t* pos, const float* cos, const float* sin, int64_t N, int64_t H, int64_t D,
          int64_t R, float sign) {
  if (N == 0) return;
  if (rows_packed(R / 2, {x, cos, sin}, {D}))
    LT_LAUNCH((rope_kernel<kPack, T>), dim3(unsigned(N)), dim3(kRopeThreads), 0, native_stream(s), x, pos, cos, sin,
              H, D, R, sign);
  else
    LT_LAUNCH((rope_kernel<1, T>), dim3(unsigned(N)), dim3(kRopeThreads), 0, native_stream(s), x, pos, cos, sin, H,
              D, R, sign);
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
