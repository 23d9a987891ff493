// cuda/kernels/linear_attention.cuh — the per-token ops of a Qwen3.5 / Qwen3.6 layer other than the delta rule,
// each in its CPU op's order (the math and the contracts are in the ops/ headers named below):
//   per-head L2 norm (ops/l2norm.h), β and log-decay gates
//   (ops/delta_gates.h), gated RMSNorm (ops/gated_rmsnorm.h), the output σ gate (ops/sigmoid_gate.h), the
//   gather / scatter of q_proj's query halves (model/block.cpp's gather_queries / scatter_queries) and the
//   zero-centred norms' 1 + w. The short conv is in short_conv.cuh, partial RoPE in rope.cuh.
//
// Legend: N tokens (B rows of T), H heads, D head dimension, Hv value heads,
// dv value head dimension, rows = N·H (or N·Hv), ld* token strides.
//
// Geometry: elementwise ops are grid-stride loops; the row norms give each row a half-warp whose lane k sums
// d ≡ k (mod 16) in order and combines the 16 lanes by the CPU's tree (rmsnorm.cuh's half_warp_ordered_sum), on
// 16-byte packs where the row length and strides are multiples of 8 and the pointers aligned (the same bits).
// Parameter gradients (A_log / dt_bias, gated norm weight) are summed per fixed chunk of tokens
// (the CPU op's chunk rule, cuda/kernels.h) into f64 partials in a workspace, then the chunks are added in order
// and the total added once in f32: no atomics, the CPU op's bits, whatever the launch.
//
// Transcendentals: the SiLU / σ are swiglu_math's (our own exp, the same bits everywhere). delta_gates'
// softplus and −exp(A_log) use expf / log1pf like the CPU op's std::exp / std::log1p: under cuda-sim those are
// the host's functions (the CPU op's bits); on a GPU they are within 2 ulp (docs/cuda-sim.md), so native
// delta_gates results match the CPU op to f32 rounding, not bitwise.
#pragma once

#include <cmath>

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/elementwise.cuh"
#include "cuda/kernels/rmsnorm.cuh"
#include "ops/rmsnorm.h"
#include "ops/swiglu_math.h"

namespace lt::cuda::LT_KERNELS_NS {

// ---- per-head L2 norm ----

// Row r = n·H + h of a strided [N, H, D] tensor: element d at base + n·ld + h·D + d.
__device__ __forceinline__ int64_t head_row_offset(int64_t r, int64_t H, int64_t D, int64_t ld) {
  return (r / H) * ld + (r % H) * D;
}

// out (ld_out), rnorm[N, H] from in (ld_in): a half-warp per row, W elements a lane at a time (rmsnorm.cuh).
template <int W, class T>
__global__ void __launch_bounds__(kNormThreads)
    l2norm_forward_kernel(T* out, float* rnorm, const T* in, int64_t N, int64_t H, int64_t D, int64_t ld_out,
                          int64_t ld_in, float eps) {
  __shared__ __align__(16) float stage[W == 1 ? 1 : kNormStageFloats];
  const auto [lane, row, live] = half_warp_row(N * H);
  const T* x = in + head_row_offset(live ? row : 0, H, D, ld_in);
  const float ss = half_warp_ordered_sum<W>(stage, D, live, [&](int64_t d, float (&p)[W]) {
    load_n(p, x + d);
    for (int e = 0; e < W; ++e) p[e] = p[e] * p[e];
  });
  if (!live) return;
  const float r = 1.0f / sqrtf(ss + eps);
  if (lane == 0) rnorm[row] = r;
  T* y = out + head_row_offset(row, H, D, ld_out);
  half_warp_row_loop<W>(lane, D, [&](int64_t d, auto) {
    float v[W];
    load_n(v, x + d);
    for (int e = 0; e < W; ++e) v[e] = v[e] * r;
    store_n(y + d, v);
  });
}

// din (ld_din) = r · (g − x · (r² · Σ g·x)); each lane reads its own g before writing (din may be dout).
template <int W, class T>
__global__ void __launch_bounds__(kNormThreads)
    l2norm_backward_kernel(float* din, const float* dout, const T* in, const float* rnorm, int64_t N, int64_t H,
                           int64_t D, int64_t ld_din, int64_t ld_dout, int64_t ld_in) {
  __shared__ __align__(16) float stage[W == 1 ? 1 : kNormStageFloats];
  const auto [lane, row, live] = half_warp_row(N * H);
  const T* x = in + head_row_offset(live ? row : 0, H, D, ld_in);
  const float* g = dout + head_row_offset(live ? row : 0, H, D, ld_dout);
  const float dot = half_warp_ordered_sum<W>(stage, D, live, [&](int64_t d, float (&p)[W]) {
    float gd[W];
    load_n(gd, g + d), load_n(p, x + d);
    for (int e = 0; e < W; ++e) p[e] = gd[e] * p[e];
  });
  if (!live) return;
  const float r = rnorm[row];
  const float k = r * r * dot;
  float* dx = din + head_row_offset(row, H, D, ld_din);
  half_warp_row_loop<W>(lane, D, [&](int64_t d, auto) {
    float gd[W], v[W];
    load_n(gd, g + d), load_n(v, x + d);
    for (int e = 0; e < W; ++e) v[e] = r * (gd[e] - v[e] * k);
    store_n(dx + d, v);
  });
}

// ---- β and log-decay gates ----

constexpr float kGatesSoftplusThreshold = 20.0f;  // torch's default, as ops/cpu/delta_gates.cpp

__device__ __forceinline__ float gates_softplus(float x) { return x > kGatesSoftplusThreshold ? x : log1pf(expf(x)); }

// da of one element: dg · (−exp(A_log)) · softplus'(x), in the CPU op's order.
__device__ __forceinline__ float gates_da(float dg, float neg_exp_a, float x) {
  const float dsp = dg * neg_exp_a;
  if (x > kGatesSoftplusThreshold) return dsp;
  const float z = expf(x);
  return (dsp * z) / (z + 1.0f);
}

// beta[N, Hv], g[N, Hv]
__global__ void delta_gates_forward_kernel(float* beta, float* g, const float* b, const float* a,
                                           const float* A_log, const float* dt_bias, int64_t N, int64_t Hv) {
  for (int64_t i = global_thread(); i < N * Hv; i += grid_threads()) {
    const int64_t h = i % Hv;
    beta[i] = swiglu_math::sigmoid(b[i]);
    g[i] = (-expf(A_log[h])) * gates_softplus(a[i] + dt_bias[h]);
  }
}

// partial[chunk, 2, Hv]: Σ_n f64(dg) · f64(softplus(x)) and Σ_n f64(da) over the chunk's tokens in order. Runs
// before the elementwise kernel, which may overwrite dg with da.
__global__ void delta_gates_backward_partial_kernel(double* partial, const float* dg, const float* a,
                                                    const float* A_log, const float* dt_bias, int64_t N,
                                                    int64_t Hv, int64_t chunk, int64_t n_chunks) {
  for (int64_t i = global_thread(); i < n_chunks * Hv; i += grid_threads()) {
    const int64_t t = i / Hv, h = i % Hv;
    const float na = -expf(A_log[h]);
    const int64_t n0 = t * chunk, n1 = n0 + chunk < N ? n0 + chunk : N;
    double p_dgsp = 0.0, p_da = 0.0;
    for (int64_t n = n0; n < n1; ++n) {
      const int64_t e = n * Hv + h;
      const float x = a[e] + dt_bias[h];
      p_dgsp += double(dg[e]) * double(gates_softplus(x));
      p_da += double(gates_da(dg[e], na, x));
    }
    partial[t * 2 * Hv + h] = p_dgsp;
    partial[t * 2 * Hv + Hv + h] = p_da;
  }
}

// db, da [N, Hv]; each thread reads its element's dbeta and dg before writing (db may be dbeta, da may be dg).
__global__ void delta_gates_backward_kernel(float* db, float* da, const float* dbeta, const float* dg,
                                            const float* b, const float* a, const float* A_log,
                                            const float* dt_bias, int64_t N, int64_t Hv) {
  for (int64_t i = global_thread(); i < N * Hv; i += grid_threads()) {
    const int64_t h = i % Hv;
    float s, one_minus_s;
    swiglu_math::sigmoid_pair(b[i], &s, &one_minus_s);
    const float dgi = dg[i];
    db[i] = dbeta[i] * (s * one_minus_s);
    da[i] = gates_da(dgi, -expf(A_log[h]), a[i] + dt_bias[h]);
  }
}

// dA_log[h] += f32(f64(−exp(A_log[h])) · Σ_chunks Σ dg·sp), ddt_bias[h] += f32(Σ_chunks Σ da), chunks in order.
__global__ void delta_gates_backward_params_kernel(float* dA_log, float* ddt_bias, const double* partial,
                                                   const float* A_log, int64_t Hv, int64_t n_chunks) {
  for (int64_t h = global_thread(); h < Hv; h += grid_threads()) {
    double dgsp = 0.0, dai = 0.0;
    for (int64_t t = 0; t < n_chunks; ++t) {
      dgsp += partial[t * 2 * Hv + h];
      dai += partial[t * 2 * Hv + Hv + h];
    }
    if (dA_log) dA_log[h] += float(double(-expf(A_log[h])) * dgsp);
    if (ddt_bias) ddt_bias[h] += float(dai);
  }
}

// ---- gated RMSNorm ----

__device__ __forceinline__ float gated_silu(float z) { return z * swiglu_math::sigmoid(z); }

// out[rows, dv], rstd[rows]: a half-warp per row, W elements a lane at a time.
template <int W, class T>
__global__ void __launch_bounds__(kNormThreads)
    gated_rmsnorm_forward_kernel(T* out, float* rstd, const T* x, const T* z, const float* weight, int64_t rows,
                                 int64_t dv, float eps) {
  __shared__ __align__(16) float stage[W == 1 ? 1 : kNormStageFloats];
  const auto [lane, row, live] = half_warp_row(rows);
  const T* xr = x + (live ? row : 0) * dv;
  const float ss = half_warp_ordered_sum<W>(stage, dv, live, [&](int64_t d, float (&p)[W]) {
    load_n(p, xr + d);
    for (int e = 0; e < W; ++e) p[e] = p[e] * p[e];
  });
  if (!live) return;
  const float s = 1.0f / sqrtf(ss / float(dv) + eps);
  if (lane == 0) rstd[row] = s;
  const T* zr = z + row * dv;
  T* y = out + row * dv;
  half_warp_row_loop<W>(lane, dv, [&](int64_t d, auto) {
    float v[W], w[W], zd[W];
    load_n(v, xr + d), load_n(w, weight + d), load_n(zd, zr + d);
    for (int e = 0; e < W; ++e) v[e] = ((v[e] * s) * w[e]) * gated_silu(zd[e]);
    store_n(y + d, v);
  });
}

// w_d · G_d with G_d = g_d · silu(z_d), as the CPU op rounds them.
__device__ __forceinline__ float gated_wG(float g, float z, float w) {
  float sg, one_minus_sg;
  swiglu_math::sigmoid_pair(z, &sg, &one_minus_sg);
  return w * (g * (z * sg));
}

// dx, dz [rows, dv]: a half-warp per row, W elements a lane at a time.
template <int W, class T>
__global__ void __launch_bounds__(kNormThreads)
    gated_rmsnorm_backward_kernel(float* dx, float* dz, const float* dout, const T* x, const T* z,
                                  const float* weight, const float* rstd, int64_t rows, int64_t dv) {
  __shared__ __align__(16) float stage[W == 1 ? 1 : kNormStageFloats];
  const auto [lane, row, live] = half_warp_row(rows);
  const int64_t base = (live ? row : 0) * dv;
  const float dot = half_warp_ordered_sum<W>(stage, dv, live, [&](int64_t d, float (&p)[W]) {
    float g[W], zd[W], w[W];
    load_n(g, dout + base + d), load_n(zd, z + base + d), load_n(w, weight + d), load_n(p, x + base + d);
    for (int e = 0; e < W; ++e) p[e] = gated_wG(g[e], zd[e], w[e]) * p[e];
  });
  if (!live) return;
  const float s = rstd[row];
  const float k = s * s * (dot / float(dv));
  half_warp_row_loop<W>(lane, dv, [&](int64_t d, auto) {
    float xd[W], zd[W], g[W], w[W], odz[W], odx[W];
    load_n(xd, x + base + d), load_n(zd, z + base + d), load_n(g, dout + base + d), load_n(w, weight + d);
    for (int e = 0; e < W; ++e) {
      float sg, one_minus_sg;
      swiglu_math::sigmoid_pair(zd[e], &sg, &one_minus_sg);
      const float nw = (xd[e] * s) * w[e];
      odz[e] = (g[e] * nw) * (sg * (1.0f + zd[e] * one_minus_sg));
      odx[e] = s * (gated_wG(g[e], zd[e], w[e]) - xd[e] * k);
    }
    store_n(dz + base + d, odz), store_n(dx + base + d, odx);
  });
}

// partial[chunk, dv] = Σ_{rows of the chunk} f64(g · silu(z)) · f64(x · rstd); a thread per (chunk, d).
template <class T>
__global__ void gated_rmsnorm_backward_partial_kernel(double* partial, const float* dout, const T* x, const T* z,
                                                      const float* rstd, int64_t rows, int64_t dv,
                                                      int64_t chunk_rows, int64_t n_chunks) {
  for (int64_t i = global_thread(); i < n_chunks * dv; i += grid_threads()) {
    const int64_t t = i / dv, d = i % dv;
    const int64_t r0 = t * chunk_rows, r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
    double p = 0.0;
    for (int64_t r = r0; r < r1; ++r) {
      const float zd = load(z + r * dv + d);
      const float G = dout[r * dv + d] * (zd * swiglu_math::sigmoid(zd));
      p += double(G) * double(load(x + r * dv + d) * rstd[r]);
    }
    partial[i] = p;
  }
}

// dweight[d] += f32(Σ_chunks partial[chunk, d]), chunks in order.
__global__ void chunk_partials_to_f32_kernel(float* dweight, const double* partial, int64_t n_chunks, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    double total = 0.0;
    for (int64_t t = 0; t < n_chunks; ++t) total += partial[t * n + i];
    dweight[i] += float(total);
  }
}

// ---- the output σ gate ----

// Element i = (n·H + h)·D + d of [N, H, D]: its offset in the strided gate.
__device__ __forceinline__ int64_t gate_offset(int64_t i, int64_t H, int64_t D, int64_t ld_token, int64_t ld_head) {
  const int64_t d = i % D, r = i / D;
  return (r / H) * ld_token + (r % H) * ld_head + d;
}

// W elements a thread (elementwise.cuh's loop): kPack where D and the strides are multiples of 8 and the pointers
// 16-byte aligned — eight consecutive d of a head are eight consecutive gate elements — else 1. The same bits.
template <class T>
__global__ void sigmoid_gate_forward_kernel(T* out, const T* x, const T* gate, int64_t N, int64_t H, int64_t D,
                                            int64_t ld_token, int64_t ld_head, bool packed) {
  elementwise_loop(N * H * D, packed, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    float xv[W], g[W];
    load_n(xv, x + i), load_n(g, gate + gate_offset(i, H, D, ld_token, ld_head));
    for (int e = 0; e < W; ++e) xv[e] = xv[e] * swiglu_math::sigmoid(g[e]);
    store_n(out + i, xv);
  });
}

// dx may be dout: each thread reads its elements before writing them.
template <class T>
__global__ void sigmoid_gate_backward_kernel(float* dx, float* dgate, const float* dout, const T* x, const T* gate,
                                             int64_t N, int64_t H, int64_t D, int64_t ld_token, int64_t ld_head,
                                             bool packed) {
  elementwise_loop(N * H * D, packed, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    const int64_t o = gate_offset(i, H, D, ld_token, ld_head);
    float g[W], gd[W], xv[W], dg[W];
    load_n(g, gate + o), load_n(gd, dout + i), load_n(xv, x + i);
    for (int e = 0; e < W; ++e) {
      float s, one_minus_s;
      swiglu_math::sigmoid_pair(g[e], &s, &one_minus_s);
      dg[e] = (gd[e] * xv[e]) * (s * one_minus_s);
      gd[e] = gd[e] * s;
    }
    store_n(dgate + o, dg), store_n(dx + i, gd);
  });
}

// ---- q_proj's query halves, zero-centred norm weights ----

// q[rows, D] = the first D of each q_proj row [rows, 2D] (bits copied, no rounding); 16 bytes a copy where packed.
template <class T>
__global__ void gather_queries_kernel(T* q, const T* q_proj, int64_t rows, int64_t D, bool packed) {
  elementwise_loop(rows * D, packed, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    copy_n<W>(q + i, q_proj + (i / D) * 2 * D + i % D);
  });
}

// The first D of each q_proj row [rows, 2D] = q[rows, D]; the gate halves untouched.
__global__ void scatter_queries_kernel(float* q_proj, const float* q, int64_t rows, int64_t D, bool packed) {
  elementwise_loop(rows * D, packed, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    copy_n<W>(q_proj + (i / D) * 2 * D + i % D, q + i);
  });
}

__global__ void one_plus_kernel(float* out, const float* w, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) out[i] = 1.0f + w[i];
}

namespace detail {

template <class T>
void l2norm_forward(Stream s, T* out, float* rnorm, const T* in, int64_t N, int64_t H, int64_t D, int64_t ld_out,
                    int64_t ld_in, float eps) {
  if (N == 0) return;
  if (rows_packed(D, {out, in}, {ld_out, ld_in}))
    LT_LAUNCH((l2norm_forward_kernel<kPack, T>), dim3(norm_blocks(N * H)), dim3(kNormThreads), 0, native_stream(s),
              out, rnorm, in, N, H, D, ld_out, ld_in, eps);
  else
    LT_LAUNCH((l2norm_forward_kernel<1, T>), dim3(norm_blocks(N * H)), dim3(kNormThreads), 0, native_stream(s),
              out, rnorm, in, N, H, D, ld_out, ld_in, eps);
}

template <class T>
void l2norm_backward(Stream s, float* din, const float* dout, const T* in, const float* rnorm, int64_t N,
                     int64_t H, int64_t D, int64_t ld_din, int64_t ld_dout, int64_t ld_in) {
  if (N == 0) return;
  if (rows_packed(D, {din, dout, in}, {ld_din, ld_dout, ld_in}))
    LT_LAUNCH((l2norm_backward_kernel<kPack, T>), dim3(norm_blocks(N * H)), dim3(kNormThreads), 0,
              native_stream(s), din, dout, in, rnorm, N, H, D, ld_din, ld_dout, ld_in);
  else
    LT_LAUNCH((l2norm_backward_kernel<1, T>), dim3(norm_blocks(N * H)), dim3(kNormThreads), 0, native_stream(s),
              din, dout, in, rnorm, N, H, D, ld_din, ld_dout, ld_in);
}

template <class T>
void gated_rmsnorm_forward(Stream s, T* out, float* rstd, const T* x, const T* z, const float* weight,
                           int64_t rows, int64_t dv, float eps) {
  if (rows == 0) return;
  if (rows_packed(dv, {out, x, z, weight}))
    LT_LAUNCH((gated_rmsnorm_forward_kernel<kPack, T>), dim3(norm_blocks(rows)), dim3(kNormThreads), 0,
              native_stream(s), out, rstd, x, z, weight, rows, dv, eps);
  else
    LT_LAUNCH((gated_rmsnorm_forward_kernel<1, T>), dim3(norm_blocks(rows)), dim3(kNormThreads), 0,
              native_stream(s), out, rstd, x, z, weight, rows, dv, eps);
}

template <class T>
void gated_rmsnorm_backward(Stream s, float* dx, float* dz, float* dweight, const float* dout, const T* x,
                            const T* z, const float* weight, const float* rstd, int64_t rows, int64_t dv,
                            void* workspace) {
  if (rows == 0) return;
  if (rows_packed(dv, {dx, dz, dout, x, z, weight}))
    LT_LAUNCH((gated_rmsnorm_backward_kernel<kPack, T>), dim3(norm_blocks(rows)), dim3(kNormThreads), 0,
              native_stream(s), dx, dz, dout, x, z, weight, rstd, rows, dv);
  else
    LT_LAUNCH((gated_rmsnorm_backward_kernel<1, T>), dim3(norm_blocks(rows)), dim3(kNormThreads), 0,
              native_stream(s), dx, dz, dout, x, z, weight, rstd, rows, dv);
  if (!dweight) return;  // a frozen weight (model/finetune.h): no gradient
  const int64_t chunk_rows = rmsnorm_dweight_chunk_rows(rows);
  const int64_t n_chunks = (rows + chunk_rows - 1) / chunk_rows;
  double* partial = static_cast<double*>(workspace);  // [n_chunks, dv]
  LT_ELEMENTWISE(gated_rmsnorm_backward_partial_kernel<T>, n_chunks * dv, partial, dout, x, z, rstd, rows, dv,
                    chunk_rows, n_chunks);
  LT_ELEMENTWISE(chunk_partials_to_f32_kernel, dv, dweight, partial, n_chunks, dv);
}

template <class T>
void sigmoid_gate_forward(Stream s, T* out, const T* x, const T* gate, int64_t N, int64_t H, int64_t D,
                          int64_t ld_token, int64_t ld_head) {
  const bool packed = rows_packed(D, {out, x, gate}, {ld_token, ld_head});
  LT_ELEMENTWISE_PACKED(sigmoid_gate_forward_kernel<T>, N * H * D, packed, out, x, gate, N, H, D, ld_token, ld_head);
}

template <class T>
void sigmoid_gate_backward(Stream s, float* dx, float* dgate, const float* dout, const T* x, const T* gate,
                           int64_t N, int64_t H, int64_t D, int64_t ld_token, int64_t ld_head) {
  const bool packed = rows_packed(D, {dx, dgate, dout, x, gate}, {ld_token, ld_head});
  LT_ELEMENTWISE_PACKED(sigmoid_gate_backward_kernel<T>, N * H * D, packed, dx, dgate, dout, x, gate, N, H, D,
                        ld_token, ld_head);
}

template <class T>
void gather_queries(Stream s, T* q, const T* q_proj, int64_t rows, int64_t D) {
  const bool packed = rows_packed(D, {q, q_proj});
  LT_ELEMENTWISE_PACKED(gather_queries_kernel<T>, rows * D, packed, q, q_proj, rows, D);
}

}  // namespace detail

void l2norm_forward(Stream s, float* out, float* rnorm, const float* in, int64_t N, int64_t H, int64_t D,
                    int64_t ld_out, int64_t ld_in, float eps) {
  detail::l2norm_forward(s, out, rnorm, in, N, H, D, ld_out, ld_in, eps);
}
void l2norm_forward(Stream s, bf16_t* out, float* rnorm, const bf16_t* in, int64_t N, int64_t H, int64_t D,
                    int64_t ld_out, int64_t ld_in, float eps) {
  detail::l2norm_forward(s, dev(out), rnorm, dev(in), N, H, D, ld_out, ld_in, eps);
}
void l2norm_backward(Stream s, float* din, const float* dout, const float* in, const float* rnorm, int64_t N,
                     int64_t H, int64_t D, int64_t ld_din, int64_t ld_dout, int64_t ld_in) {
  detail::l2norm_backward(s, din, dout, in, rnorm, N, H, D, ld_din, ld_dout, ld_in);
}
void l2norm_backward(Stream s, float* din, const float* dout, const bf16_t* in, const float* rnorm, int64_t N,
                     int64_t H, int64_t D, int64_t ld_din, int64_t ld_dout, int64_t ld_in) {
  detail::l2norm_backward(s, din, dout, dev(in), rnorm, N, H, D, ld_din, ld_dout, ld_in);
}

void delta_gates_forward(Stream s, float* beta, float* g, const float* b, const float* a, const float* A_log,
                         const float* dt_bias, int64_t N, int64_t Hv) {
  LT_ELEMENTWISE(delta_gates_forward_kernel, N * Hv, beta, g, b, a, A_log, dt_bias, N, Hv);
}
void delta_gates_backward(Stream s, float* db, float* da, float* dA_log, float* ddt_bias, const float* dbeta,
                          const float* dg, const float* b, const float* a, const float* A_log,
                          const float* dt_bias, int64_t N, int64_t Hv, void* workspace) {
  if (N == 0) return;
  const int64_t chunk = delta_gates_param_chunk_tokens(N);
  const int64_t n_chunks = (N + chunk - 1) / chunk;
  double* partial = static_cast<double*>(workspace);  // [n_chunks, 2, Hv]
  const bool params = dA_log || ddt_bias;  // both null: frozen (model/finetune.h)
  if (params)
    LT_ELEMENTWISE(delta_gates_backward_partial_kernel, n_chunks * Hv, partial, dg, a, A_log, dt_bias, N, Hv,
                   chunk, n_chunks);
  LT_ELEMENTWISE(delta_gates_backward_kernel, N * Hv, db, da, dbeta, dg, b, a, A_log, dt_bias, N, Hv);
  if (params) LT_ELEMENTWISE(delta_gates_backward_params_kernel, Hv, dA_log, ddt_bias, partial, A_log, Hv, n_chunks);
}

void gated_rmsnorm_forward(Stream s, float* out, float* rstd, const float* x, const float* z,
                           const float* weight, int64_t rows, int64_t dv, float eps) {
  detail::gated_rmsnorm_forward(s, out, rstd, x, z, weight, rows, dv, eps);
}
void gated_rmsnorm_forward(Stream s, bf16_t* out, float* rstd, const bf16_t* x, const bf16_t* z,
                           const float* weight, int64_t rows, int64_t dv, float eps) {
  detail::gated_rmsnorm_forward(s, dev(out), rstd, dev(x), dev(z), weight, rows, dv, eps);
}
void gated_rmsnorm_backward(Stream s, float* dx, float* dz, float* dweight, const float* dout, const float* x,
                            const float* z, const float* weight, const float* rstd, int64_t rows, int64_t dv,
                            void* workspace) {
  detail::gated_rmsnorm_backward(s, dx, dz, dweight, dout, x, z, weight, rstd, rows, dv, workspace);
}
void gated_rmsnorm_backward(Stream s, float* dx, float* dz, float* dweight, const float* dout, const bf16_t* x,
                            const bf16_t* z, const float* weight, const float* rstd, int64_t rows, int64_t dv,
                            void* workspace) {
  detail::gated_rmsnorm_backward(s, dx, dz, dweight, dout, dev(x), dev(z), weight, rstd, rows, dv, workspace);
}

void sigmoid_gate_forward(Stream s, float* out, const float* x, const float* gate, int64_t N, int64_t H, int64_t D,
                          int64_t ld_token, int64_t ld_head) {
  detail::sigmoid_gate_forward(s, out, x, gate, N, H, D, ld_token, ld_head);
}
void sigmoid_gate_forward(Stream s, bf16_t* out, const bf16_t* x, const bf16_t* gate, int64_t N, int64_t H,
                          int64_t D, int64_t ld_token, int64_t ld_head) {
  detail::sigmoid_gate_forward(s, dev(out), dev(x), dev(gate), N, H, D, ld_token, ld_head);
}
void sigmoid_gate_backward(Stream s, float* dx, float* dgate, const float* dout, const float* x, const float* gate,
                           int64_t N, int64_t H, int64_t D, int64_t ld_token, int64_t ld_head) {
  detail::sigmoid_gate_backward(s, dx, dgate, dout, x, gate, N, H, D, ld_token, ld_head);
}
void sigmoid_gate_backward(Stream s, float* dx, float* dgate, const float* dout, const bf16_t* x,
                           const bf16_t* gate, int64_t N, int64_t H, int64_t D, int64_t ld_token, int64_t ld_head) {
  detail::sigmoid_gate_backward(s, dx, dgate, dout, dev(x), dev(gate), N, H, D, ld_token, ld_head);
}

void gather_queries(Stream s, float* q, const float* q_proj, int64_t rows, int64_t D) {
  detail::gather_queries(s, q, q_proj, rows, D);
}
void gather_queries(Stream s, bf16_t* q, const bf16_t* q_proj, int64_t rows, int64_t D) {
  detail::gather_queries(s, dev(q), dev(q_proj), rows, D);
}
void scatter_queries(Stream s, float* q_proj, const float* q, int64_t rows, int64_t D) {
  const bool packed = rows_packed(D, {q_proj, q});
  LT_ELEMENTWISE_PACKED(scatter_queries_kernel, rows * D, packed, q_proj, q, rows, D);
}
void norm_weight_one_plus(Stream s, float* out, const float* w, int64_t n) {
  LT_ELEMENTWISE(one_plus_kernel, n, out, w, n);
}

}  // namespace lt::cuda::LT_KERNELS_NS
