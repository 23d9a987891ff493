// cuda/kernels/short_conv.cuh — Gated DeltaNet's short causal conv + SiLU (ops/short_conv.h), forward and
// backward in the CPU op's order: the same bits, whatever the launch.
//
// Legend: N tokens (B rows of T), Cc conv channels, K conv width; span(n) the taps back from token n inside its
// document.
//
// Forward: a thread per token and W channels (W = 8 on 16-byte loads where Cc allows). Backward: one pass over the
// CPU op's fixed token chunks (cuda/kernels.h), a thread per chunk and channel writing dx and dweight's f64 partials,
// then the chunks added in order and the total added once in f32 — no atomics. Kernels wider than kConvWindow
// take a thread per token for dx and a second pass for the partials, recomputing dpre per tap.
#pragma once

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/pack.cuh"
#include "ops/swiglu_math.h"

namespace lt::cuda::LT_KERNELS_NS {

// Taps back from token n inside its document (ops/cpu/short_conv.cpp's span): at most K-1, stopping at the row
// start or where doc_ids changes.
__device__ __forceinline__ int64_t conv_span(const int32_t* doc_ids, int64_t n, int64_t T, int64_t K) {
  const int64_t t = n % T;
  int64_t j = 0;
  while (j < K - 1 && j < t && (doc_ids == nullptr || doc_ids[n - j - 1] == doc_ids[n])) ++j;
  return j;
}

// f32 → bf16 → f32: the value a bf16 store of v holds.
__device__ __forceinline__ float bf16_rounded(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// pre[n, c + e] for the W channels from c, oldest tap first from an exact 0 (the CPU's conv_row): a tap's W
// inputs in one load (16 bytes where W = kPack), each channel's sum in the scalar order. kRoundInput: x is the
// f32 projection whose bf16 rounding the conv reads (conv_l2norm.cuh reads it before it is stored rounded).
template <int W, class T, bool kRoundInput = false>
__device__ __forceinline__ void conv_pre(float (&pre)[W], const T* x, const float* weight, int64_t n, int64_t c,
                                         int64_t span, int64_t Cc, int64_t K) {
  for (int e = 0; e < W; ++e) pre[e] = 0.0f;
  for (int64_t k = K - 1 - span; k < K; ++k) {
    float xv[W];
    load_n(xv, x + (n - (K - 1 - k)) * Cc + c);
    if constexpr (kRoundInput)
      for (int e = 0; e < W; ++e) xv[e] = bf16_rounded(xv[e]);
    for (int e = 0; e < W; ++e) pre[e] += weight[(c + e) * K + k] * xv[e];
  }
}

// g · silu'(pre), the CPU op's formula.
__device__ __forceinline__ float silu_grad(float g, float pre) {
  float sg, one_minus_sg;
  swiglu_math::sigmoid_pair(pre, &sg, &one_minus_sg);
  return g * (sg * (1.0f + pre * one_minus_sg));
}

// dpre[n, c + e] = dout · silu'(pre), recomputing pre with the forward's bits.
template <int W, class T>
__device__ __forceinline__ void conv_dpre(float (&dpre)[W], const float* dout, const T* x, const float* weight,
                                          int64_t n, int64_t c, int64_t span, int64_t Cc, int64_t K) {
  float p[W];
  conv_pre(p, x, weight, n, c, span, Cc, K);
  load_n(dpre, dout + n * Cc + c);
  for (int e = 0; e < W; ++e) dpre[e] = silu_grad(dpre[e], p[e]);
}

// The backward kernels' dpre at channels c..: recomputed from dout, except below `stored_below` where the fused
// backward already stored it in dout (conv_l2norm.cuh's q and k channels; 0 for short_conv_backward) — the same
// f32 values either way. W channels never straddle it (it is a multiple of W).
template <int W, class T>
__device__ __forceinline__ void dpre_at(float (&dpre)[W], const float* dout, const T* x, const float* weight,
                                        int64_t n, int64_t c, int64_t span, int64_t Cc, int64_t K,
                                        int64_t stored_below) {
  if (c < stored_below) load_n(dpre, dout + n * Cc + c);
  else conv_dpre(dpre, dout, x, weight, n, c, span, Cc, K);
}

// out[N, Cc]: a thread per token and W channels (W = kPack where Cc % 8 == 0 and the rows are aligned: one
// document span per 8 channels, 16-byte loads and stores; the same bits).
template <int W, class T>
__global__ void short_conv_forward_kernel(T* out, const T* x, const float* weight, const int32_t* doc_ids,
                                          int64_t N, int64_t T_, int64_t Cc, int64_t K) {
  const int64_t groups = Cc / W;
  for (int64_t i = global_thread(); i < N * groups; i += grid_threads()) {
    const int64_t n = i / groups, c = (i % groups) * W;
    float p[W];
    conv_pre(p, x, weight, n, c, conv_span(doc_ids, n, T_, K), Cc, K);
    for (int e = 0; e < W; ++e) p[e] = p[e] * swiglu_math::sigmoid(p[e]);
    store_n(out + n * Cc + c, p);
  }
}

// dx[m, c] = Σ_j dpre[m+j, c] · w[c, K-1-j] over the taps that reach back to m, nearest first; W channels a thread.
template <int W, class T>
__global__ void short_conv_backward_dx_kernel(float* dx, const float* dout, const T* x, const float* weight,
                                              const int32_t* doc_ids, int64_t N, int64_t T_, int64_t Cc,
                                              int64_t K, int64_t stored_below) {
  const int64_t groups = Cc / W;
  for (int64_t i = global_thread(); i < N * groups; i += grid_threads()) {
    const int64_t m = i / groups, c = (i % groups) * W;
    float acc[W];
    for (int e = 0; e < W; ++e) acc[e] = 0.0f;
    for (int64_t j = 0; j < K && m + j < N; ++j) {
      const int64_t span = conv_span(doc_ids, m + j, T_, K);
      if (span < j) continue;
      float d[W];
      dpre_at(d, dout, x, weight, m + j, c, span, Cc, K, stored_below);
      for (int e = 0; e < W; ++e) acc[e] += d[e] * weight[(c + e) * K + (K - 1 - j)];
    }
    store_n(dx + m * Cc + c, acc);
  }
}

// partial[chunk, K, Cc]: Σ over the chunk's tokens n (in order) of f64(dpre[n, c]) · f64(x[n-j, c]) into
// [K-1-j, c]; a thread per (chunk, c), its K partials in the workspace.
template <class T>
__global__ void short_conv_backward_partial_kernel(double* partial, const float* dout, const T* x,
                                                   const float* weight, const int32_t* doc_ids, int64_t N,
                                                   int64_t T_, int64_t Cc, int64_t K, int64_t chunk,
                                                   int64_t n_chunks, int64_t stored_below) {
  for (int64_t i = global_thread(); i < n_chunks * Cc; i += grid_threads()) {
    const int64_t t = i / Cc, c = i % Cc;
    double* p = partial + t * K * Cc + c;  // [K] with stride Cc
    for (int64_t k = 0; k < K; ++k) p[k * Cc] = 0.0;
    const int64_t n0 = t * chunk, n1 = n0 + chunk < N ? n0 + chunk : N;
    for (int64_t n = n0; n < n1; ++n) {
      const int64_t span = conv_span(doc_ids, n, T_, K);
      float dp[1];
      dpre_at(dp, dout, x, weight, n, c, span, Cc, K, stored_below);
      const double d = double(dp[0]);
      for (int64_t j = 0; j <= span; ++j) p[(K - 1 - j) * Cc] += d * double(load(x + (n - j) * Cc + c));
    }
  }
}

// The widest kernel the one-pass backward holds in registers; wider ones take the per-tap kernels above. Its window
// is 4 slots where K ≤ 4 (Qwen3.5 / 3.6): sm_90 gives the kernel 56 registers at 4 slots, 92 at 8 (a third of
// the SM's threads resident).
constexpr int kConvWindow = 8;

// dx and dweight's partials in one pass: a thread per (token chunk, channel) walks its chunk's tokens in order
// holding the last K tokens' x, dpre and spans in registers, so each token's dpre is made once where the per-tap
// kernels made it K + 1 times, and x and dout are read once. dx[m] is written when dpre[m + K − 1] is known: the walk
// runs K − 1 tokens into the next chunk for it, their products left to that chunk. Every sum in the per-tap
// kernels' order (pre oldest tap first, dx nearest tap first, the partials token by token), so the same bits.
// Window slot j holds token n − j (W ≥ K slots); partial (null: frozen) as short_conv_backward_partial_kernel's.
template <int W, class T>
__global__ void short_conv_backward_stream_kernel(float* dx, double* partial, const float* dout, const T* x,
                                                  const float* weight, const int32_t* doc_ids, int64_t N,
                                                  int64_t T_, int64_t Cc, int64_t K, int64_t chunk, int64_t n_chunks,
                                                  int64_t stored_below) {
  for (int64_t i = global_thread(); i < n_chunks * Cc; i += grid_threads()) {
    const int64_t t = i / Cc, c = i % Cc;
    const int64_t n0 = t * chunk, n1 = n0 + chunk < N ? n0 + chunk : N;
    const bool stored = c < stored_below;
    float w[W], w_back[W];  // weight[c, k]; weight[c, K − 1 − j], the tap j tokens back
    float xs[W], ds[W];     // by slot
    int span[W];                      // −1: no token (history before the chunk, or past N)
    double acc[W];                    // acc[j] = Σ_n dpre[n] · x[n − j]: the partial's [K − 1 − j]
    for (int j = 0; j < W; ++j) {
      w[j] = j < K ? weight[c * K + j] : 0.0f;
      w_back[j] = j < K ? weight[c * K + K - 1 - j] : 0.0f;
      // The K − 1 tokens before the chunk, which the conv reaches back into (slot j + 1 once token n0 is in).
      xs[j] = j < K - 1 && n0 - 1 - j >= 0 ? load(x + (n0 - 1 - j) * Cc + c) : 0.0f;
      ds[j] = 0.0f, span[j] = -1, acc[j] = 0.0;
    }
    for (int64_t n = n0; n < n1 + K - 1; ++n) {
      for (int j = W - 1; j > 0; --j) xs[j] = xs[j - 1], ds[j] = ds[j - 1], span[j] = span[j - 1];
      xs[0] = 0.0f, ds[0] = 0.0f, span[0] = -1;
      if (n < N) {
        const int sp = int(conv_span(doc_ids, n, T_, K));
        xs[0] = load(x + n * Cc + c), span[0] = sp;
        float d = dout[n * Cc + c];
        if (!stored) {
          float pre = 0.0f;  // oldest tap first
          for (int j = W - 1; j >= 0; --j)
            if (j <= sp) pre += w_back[j] * xs[j];
          d = silu_grad(d, pre);
        }
        ds[0] = d;
        if (partial && n < n1)
          for (int j = 0; j < W; ++j)
            if (j <= sp) acc[j] += double(d) * double(xs[j]);
      }
      // dx[m] = Σ_j dpre[m + j] · w[K − 1 − j], nearest tap (j = 0, slot K − 1) first, where token m + j's span
      // reaches back to m.
      const int64_t m = n - (K - 1);
      if (m >= n0) {
        float a = 0.0f;
        for (int slot = W - 1; slot >= 0; --slot)
          if (slot < K && span[slot] >= K - 1 - slot) a += ds[slot] * w[slot];
        dx[m * Cc + c] = a;
      }
    }
    if (partial)
      for (int j = 0; j < W; ++j)
        if (j < K) partial[t * K * Cc + (K - 1 - j) * Cc + c] = acc[j];
  }
}

// dweight[c, k] += f32(Σ_chunks partial[chunk, k, c]), chunks in order.
__global__ void short_conv_backward_dweight_kernel(float* dweight, const double* partial, int64_t n_chunks,
                                                   int64_t Cc, int64_t K) {
  for (int64_t i = global_thread(); i < K * Cc; i += grid_threads()) {
    const int64_t k = i / Cc, c = i % Cc;
    double total = 0.0;
    for (int64_t t = 0; t < n_chunks; ++t) total += partial[t * K * Cc + i];
    dweight[c * K + k] += float(total);
  }
}

namespace detail {

template <class T>
void short_conv_forward(Stream s, T* out, const T* x, const float* weight, const int32_t* doc_ids, int64_t N,
                        int64_t T_, int64_t Cc, int64_t K) {
  if (rows_packed(Cc, {out, x}))
    LT_ELEMENTWISE((short_conv_forward_kernel<kPack, T>), N * Cc / kPack, out, x, weight, doc_ids, N, T_, Cc, K);
  else
    LT_ELEMENTWISE((short_conv_forward_kernel<1, T>), N * Cc, out, x, weight, doc_ids, N, T_, Cc, K);
}

// stored_below: `dout` holds dpre, not the conv output's gradient, in channels [0, stored_below)
// (conv_l2norm_backward).
template <class T>
void short_conv_backward(Stream s, float* dx, float* dweight, const float* dout, const T* x, const float* weight,
                         const int32_t* doc_ids, int64_t N, int64_t T_, int64_t Cc, int64_t K, void* workspace,
                         int64_t stored_below = 0) {
  if (N == 0) return;
  const int64_t chunk = short_conv_dweight_chunk_tokens(N);
  const int64_t n_chunks = (N + chunk - 1) / chunk;
  double* partial = static_cast<double*>(workspace);  // [n_chunks, K, Cc]
  if (K <= kConvWindow) {
    double* p = dweight ? partial : nullptr;
    if (K <= 4)
      LT_ELEMENTWISE((short_conv_backward_stream_kernel<4, T>), n_chunks * Cc, dx, p, dout, x, weight, doc_ids, N, T_,
                     Cc, K, chunk, n_chunks, stored_below);
    else
      LT_ELEMENTWISE((short_conv_backward_stream_kernel<kConvWindow, T>), n_chunks * Cc, dx, p, dout, x, weight,
                     doc_ids, N, T_, Cc, K, chunk, n_chunks, stored_below);
    if (!dweight) return;  // a frozen weight (model/finetune.h): no gradient
  } else {
    if (rows_packed(Cc, {dx, dout, x}, {stored_below}))
      LT_ELEMENTWISE((short_conv_backward_dx_kernel<kPack, T>), N * Cc / kPack, dx, dout, x, weight, doc_ids, N, T_,
                     Cc, K, stored_below);
    else
      LT_ELEMENTWISE((short_conv_backward_dx_kernel<1, T>), N * Cc, dx, dout, x, weight, doc_ids, N, T_, Cc, K,
                     stored_below);
    if (!dweight) return;
    LT_ELEMENTWISE(short_conv_backward_partial_kernel<T>, n_chunks * Cc, partial, dout, x, weight, doc_ids, N, T_,
                   Cc, K, chunk, n_chunks, stored_below);
  }
  LT_ELEMENTWISE(short_conv_backward_dweight_kernel, K * Cc, dweight, partial, n_chunks, Cc, K);
}

}  // namespace detail

void short_conv_forward(Stream s, float* out, const float* x, const float* weight, const int32_t* doc_ids,
                        int64_t N, int64_t T, int64_t Cc, int64_t K) {
  detail::short_conv_forward(s, out, x, weight, doc_ids, N, T, Cc, K);
}
void short_conv_forward(Stream s, bf16_t* out, const bf16_t* x, const float* weight, const int32_t* doc_ids,
                        int64_t N, int64_t T, int64_t Cc, int64_t K) {
  detail::short_conv_forward(s, dev(out), dev(x), weight, doc_ids, N, T, Cc, K);
}
void short_conv_backward(Stream s, float* dx, float* dweight, const float* dout, const float* x,
                         const float* weight, const int32_t* doc_ids, int64_t N, int64_t T, int64_t Cc, int64_t K,
                         void* workspace) {
  detail::short_conv_backward(s, dx, dweight, dout, x, weight, doc_ids, N, T, Cc, K, workspace);
}
void short_conv_backward(Stream s, float* dx, float* dweight, const float* dout, const bf16_t* x,
                         const float* weight, const int32_t* doc_ids, int64_t N, int64_t T, int64_t Cc, int64_t K,
                         void* workspace) {
  detail::short_conv_backward(s, dx, dweight, dout, dev(x), weight, doc_ids, N, T, Cc, K, workspace);
}

}  // namespace lt::cuda::LT_KERNELS_NS
