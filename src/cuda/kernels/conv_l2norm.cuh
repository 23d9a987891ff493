// cuda/kernels/conv_l2norm.cuh — Gated DeltaNet's input half fused: the in_proj_qkv output's rounding, the short
// conv + SiLU and the L2 norms of the q and k heads in one pass (forward); the norms' backward with SiLU's
// derivative in one pass ahead of the conv's backward (backward). All of it is memory-bound, so passes over
// [N, Cc] are the cost. Bytes a channel and token at Qwen3.6's q | k share of the channels (2·Hk·dk / Cc = 0.4),
// a row's second read in a norm counted as a cache hit: the forward read the f32 projection, wrote it rounded,
// read that back for the conv, wrote the conv output and read q and k back for the norms (11.6 bytes); it now
// reads the projection once and writes the three stored tensors (8.8), in two launches instead of four. The
// backward no longer reads the conv output (it recomputes its rounded value from the stored conv input, a cached
// read) and stores q and k's pre-SiLU gradient where the norms' backward stored their output gradient, for the
// conv's one-pass backward (short_conv.cuh) to read instead of recomputing SiLU's derivative: with that pass,
// 20.0 → 14.0 bytes and 5 → 1.4 sigmoids a channel.
//
// Bits: the same operations in the same order as convert → short_conv_forward → l2norm_forward (q, k) and
// l2norm_backward (q, k) → short_conv_backward (short_conv.cuh, linear_attention.cuh), so the fused path gives
// their bits; a q or k row goes to a half-warp with the norms' ordered sum (rmsnorm.cuh), the v channels to a
// thread per W channels.
//
// Legend: N tokens (B rows of T), Cc conv channels (q | k | v: 2·Hk·dk + Hv·dv), K conv width, Hk key heads of dk.
#pragma once

#include "cuda/kernels/rmsnorm.cuh"
#include "cuda/kernels/short_conv.cuh"

namespace lt::cuda::LT_KERNELS_NS {

// A q or k row of the conv output: token n, channels [col, col + dk), head h of 2·Hk (q's heads, then k's).
struct QkRow {
  int64_t n, h, col;
  // Its entry of q_rnorm or k_rnorm [N, Hk] (F: float, or const float to read).
  template <class F>
  __device__ F& rnorm(F* q_rnorm, F* k_rnorm, int64_t Hk) const {
    return h < Hk ? q_rnorm[n * Hk + h] : k_rnorm[n * Hk + h - Hk];
  }
};
__device__ __forceinline__ QkRow qk_row(int64_t row, int64_t Hk, int64_t dk) {
  const int64_t n = row / (2 * Hk), h = row % (2 * Hk);
  return {n, h, h * dk};
}

// One token's W channels from c through the forward: pre[n, c..] = bf16(p) stored, out[n, c..] = bf16(silu(conv))
// stored; v gets out's values as stored (widened).
template <int W>
__device__ __forceinline__ void conv_silu_store(float (&v)[W], bf16* pre, bf16* out, const float* p,
                                                const float* weight, int64_t n, int64_t c, int64_t span, int64_t Cc,
                                                int64_t K) {
  float x[W];
  load_n(x, p + n * Cc + c);
  store_n(pre + n * Cc + c, x);
  conv_pre<W, float, true>(v, p, weight, n, c, span, Cc, K);
  for (int e = 0; e < W; ++e) v[e] = bf16_rounded(v[e] * swiglu_math::sigmoid(v[e]));
  store_n(out + n * Cc + c, v);
}

// The conv's pre-activation a and its rounded output x (the forward's stored value) at token n, channels c.., from
// the stored conv input.
template <int W>
__device__ __forceinline__ void conv_recompute(float (&a)[W], float (&x)[W], const bf16* pre, const float* weight,
                                               int64_t n, int64_t c, int64_t span, int64_t Cc, int64_t K) {
  conv_pre(a, pre, weight, n, c, span, Cc, K);
  for (int e = 0; e < W; ++e) x[e] = bf16_rounded(a[e] * swiglu_math::sigmoid(a[e]));
}

// q and k rows (N · 2Hk of them, a half-warp each): conv + SiLU stored, then the row's L2 norm into qk_hat
// [N, 2·Hk·dk] and q_rnorm / k_rnorm [N, Hk].
template <int W>
__global__ void __launch_bounds__(kNormThreads)
    conv_l2norm_forward_qk_kernel(bf16* pre, bf16* out, bf16* qk_hat, float* q_rnorm, float* k_rnorm,
                                  const float* p, const float* weight, const int32_t* doc_ids, int64_t N, int64_t T_,
                                  int64_t Cc, int64_t K, int64_t Hk, int64_t dk, float eps) {
  __shared__ __align__(16) float stage[W == 1 ? 1 : kNormStageFloats];
  const auto [lane, row, live] = half_warp_row(N * 2 * Hk);
  const QkRow r = qk_row(live ? row : 0, Hk, dk);
  const int64_t span = live ? conv_span(doc_ids, r.n, T_, K) : 0;
  const float ss = half_warp_ordered_sum<W>(stage, dk, live, [&](int64_t d, float (&t)[W]) {
    conv_silu_store(t, pre, out, p, weight, r.n, r.col + d, span, Cc, K);
    for (int e = 0; e < W; ++e) t[e] = t[e] * t[e];
  });
  if (!live) return;
  const float rn = 1.0f / sqrtf(ss + eps);
  if (lane == 0) r.rnorm(q_rnorm, k_rnorm, Hk) = rn;
  const bf16* x = out + r.n * Cc + r.col;
  bf16* y = qk_hat + r.n * 2 * Hk * dk + r.col;
  half_warp_row_loop<W>(lane, dk, [&](int64_t d, auto) {
    float v[W];
    load_n(v, x + d);  // this lane's own store in the sum (both loops give a lane the same elements)
    for (int e = 0; e < W; ++e) v[e] = v[e] * rn;
    store_n(y + d, v);
  });
}

// v channels [c0, Cc): conv + SiLU stored, a thread per token and W channels.
template <int W>
__global__ void conv_forward_v_kernel(bf16* pre, bf16* out, const float* p, const float* weight,
                                      const int32_t* doc_ids, int64_t N, int64_t T_, int64_t Cc, int64_t K,
                                      int64_t c0) {
  const int64_t groups = (Cc - c0) / W;
  for (int64_t i = global_thread(); i < N * groups; i += grid_threads()) {
    const int64_t n = i / groups, c = c0 + (i % groups) * W;
    float v[W];
    conv_silu_store(v, pre, out, p, weight, n, c, conv_span(doc_ids, n, T_, K), Cc, K);
  }
}

// q and k rows: dpre[n, col..] = silu'(a) · r · (g − x · (r² · Σ g·x)), g the row of dqk [N, 2·Hk·dk], x and
// a recomputed from the stored conv input.
template <int W>
__global__ void __launch_bounds__(kNormThreads)
    conv_l2norm_backward_qk_kernel(float* dpre, const float* dqk, const bf16* pre, const float* q_rnorm,
                                   const float* k_rnorm, const float* weight, const int32_t* doc_ids, int64_t N,
                                   int64_t T_, int64_t Cc, int64_t K, int64_t Hk, int64_t dk) {
  __shared__ __align__(16) float stage[W == 1 ? 1 : kNormStageFloats];
  const auto [lane, row, live] = half_warp_row(N * 2 * Hk);
  const QkRow r = qk_row(live ? row : 0, Hk, dk);
  const int64_t span = live ? conv_span(doc_ids, r.n, T_, K) : 0;
  const float* g = dqk + r.n * 2 * Hk * dk + r.col;
  const float dot = half_warp_ordered_sum<W>(stage, dk, live, [&](int64_t d, float (&t)[W]) {
    float a[W], gd[W];
    conv_recompute(a, t, pre, weight, r.n, r.col + d, span, Cc, K);
    load_n(gd, g + d);
    for (int e = 0; e < W; ++e) t[e] = gd[e] * t[e];
  });
  if (!live) return;
  const float rn = r.rnorm(q_rnorm, k_rnorm, Hk);
  const float k = rn * rn * dot;
  float* dp = dpre + r.n * Cc + r.col;
  half_warp_row_loop<W>(lane, dk, [&](int64_t d, auto) {
    float a[W], x[W], gd[W];
    conv_recompute(a, x, pre, weight, r.n, r.col + d, span, Cc, K);
    load_n(gd, g + d);
    for (int e = 0; e < W; ++e) x[e] = silu_grad(rn * (gd[e] - x[e] * k), a[e]);
    store_n(dp + d, x);
  });
}

namespace detail {

// Every launch 16 bytes a pack where dk and Cc are multiples of 8 and the buffers aligned (then so are 2·Hk·dk and
// the v channels' start); else one channel a lane.
inline bool conv_l2norm_packed(int64_t Cc, int64_t dk, std::initializer_list<const void*> pointers) {
  return rows_packed(dk, pointers, {Cc});
}

template <int W>
void conv_l2norm_forward(Stream s, bf16* pre, bf16* out, bf16* qk_hat, float* q_rnorm, float* k_rnorm,
                         const float* p, const float* weight, const int32_t* doc_ids, int64_t N, int64_t T_,
                         int64_t Cc, int64_t K, int64_t Hk, int64_t dk, float eps) {
  LT_LAUNCH((conv_l2norm_forward_qk_kernel<W>), dim3(norm_blocks(N * 2 * Hk)), dim3(kNormThreads), 0,
            native_stream(s), pre, out, qk_hat, q_rnorm, k_rnorm, p, weight, doc_ids, N, T_, Cc, K, Hk, dk, eps);
  const int64_t c0 = 2 * Hk * dk;
  LT_ELEMENTWISE((conv_forward_v_kernel<W>), N * (Cc - c0) / W, pre, out, p, weight, doc_ids, N, T_, Cc, K, c0);
}

template <int W>
void conv_l2norm_backward(Stream s, float* dx, float* dweight, float* dout, const float* dqk, const bf16* pre,
                          const float* q_rnorm, const float* k_rnorm, const float* weight, const int32_t* doc_ids,
                          int64_t N, int64_t T_, int64_t Cc, int64_t K, int64_t Hk, int64_t dk, void* workspace) {
  LT_LAUNCH((conv_l2norm_backward_qk_kernel<W>), dim3(norm_blocks(N * 2 * Hk)), dim3(kNormThreads), 0,
            native_stream(s), dout, dqk, pre, q_rnorm, k_rnorm, weight, doc_ids, N, T_, Cc, K, Hk, dk);
  short_conv_backward(s, dx, dweight, dout, pre, weight, doc_ids, N, T_, Cc, K, workspace, 2 * Hk * dk);
}

}  // namespace detail

void conv_l2norm_forward(Stream s, bf16_t* pre, bf16_t* out, bf16_t* qk_hat, float* q_rnorm, float* k_rnorm,
                         const float* p, const float* weight, const int32_t* doc_ids, int64_t N, int64_t T,
                         int64_t Cc, int64_t K, int64_t Hk, int64_t dk, float eps) {
  if (N == 0) return;
  if (detail::conv_l2norm_packed(Cc, dk, {pre, out, qk_hat, p}))
    detail::conv_l2norm_forward<kPack>(s, dev(pre), dev(out), dev(qk_hat), q_rnorm, k_rnorm, p, weight, doc_ids, N,
                                       T, Cc, K, Hk, dk, eps);
  else
    detail::conv_l2norm_forward<1>(s, dev(pre), dev(out), dev(qk_hat), q_rnorm, k_rnorm, p, weight, doc_ids, N, T,
                                   Cc, K, Hk, dk, eps);
}

void conv_l2norm_backward(Stream s, float* dx, float* dweight, float* dout, const float* dqk, const bf16_t* pre,
                          const float* q_rnorm, const float* k_rnorm, const float* weight, const int32_t* doc_ids,
                          int64_t N, int64_t T, int64_t Cc, int64_t K, int64_t Hk, int64_t dk, void* workspace) {
  if (N == 0) return;
  if (detail::conv_l2norm_packed(Cc, dk, {dout, dqk, pre}))
    detail::conv_l2norm_backward<kPack>(s, dx, dweight, dout, dqk, dev(pre), q_rnorm, k_rnorm, weight, doc_ids, N, T,
                                        Cc, K, Hk, dk, workspace);
  else
    detail::conv_l2norm_backward<1>(s, dx, dweight, dout, dqk, dev(pre), q_rnorm, k_rnorm, weight, doc_ids, N, T, Cc,
                                    K, Hk, dk, workspace);
}

}  // namespace lt::cuda::LT_KERNELS_NS
