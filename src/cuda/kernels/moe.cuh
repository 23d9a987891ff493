// cuda/kernels/moe.cuh — a sparse layer's routing, token permutation, combine and load-balancing partials on the
// GPU (ops/moe.h's ops; model/moe_ffn.cpp's slice, run by cuda/layers/moe.inl). Each kernel performs the CPU op's
// operations in its order, so on f32 data it gives the CPU op's bits: the router is ops/moe_math.h itself (one
// thread per token), the permutation the same stable counting sort (one block, each thread's assignments a
// contiguous run, so the order is the serial sort's), and every dot over C or I one double accumulator in index
// order in one thread. No atomics but one: the router's error flag takes the smallest bad token (atomicMin), a
// value that does not depend on the threads' order.
#pragma once

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/elementwise.cuh"
#include "ops/moe_math.h"

namespace lt::cuda::LT_KERNELS_NS {

constexpr int kRouterThreads = 128;

inline unsigned blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 1 ? 1 : b);
}

__global__ void moe_flag_init_kernel(int32_t* bad) { *bad = INT32_MAX; }

__global__ void moe_router_forward_kernel(int32_t* ids, float* weights, float* probs, int32_t* bad,
                                          const float* logits, int64_t N, int64_t E, int64_t k, bool topk_softmax,
                                          bool renormalize) {
  const int64_t t = global_thread();
  if (t >= N) return;
  const float* z = logits + t * E;
  for (int64_t e = 0; e < E; ++e)
    if ((lt_float_bits(z[e]) & 0x7f800000u) == 0x7f800000u) {  // inf or NaN
      atomicMin(bad, int32_t(t));
      break;
    }
  moe_math::route_token(ids + t * k, weights + t * k, probs + t * E, z, E, k, topk_softmax, renormalize);
}

__global__ void moe_router_backward_kernel(float* dlogits, const float* dweights, const float* dprobs_extra,
                                           const uint8_t* counted, const int32_t* ids, const float* weights,
                                           const float* probs, int64_t N, int64_t E, int64_t k, bool topk_softmax,
                                           bool renormalize) {
  const int64_t t = global_thread();
  if (t >= N) return;
  const bool extra = dprobs_extra && (!counted || counted[t]);
  moe_math::route_token_backward(dlogits + t * E, dweights + t * k, extra ? dprobs_extra : nullptr, ids + t * k,
                                 weights + t * k, probs + t * E, E, k, topk_softmax, renormalize);
}

// One block. hist[p][e] (workspace, [kMoePermuteThreads, E]): thread p's assignments [p·chunk, (p+1)·chunk) counted
// per expert, then turned into the grouped row where its first one of expert e goes — expert e's rows are thread 0's
// of e, then thread 1's, .., so the placement is the serial sort's (stable, token order within an expert).
__global__ void moe_permute_kernel(int64_t* offsets, int32_t* order, int32_t* row_of, const int32_t* ids, int64_t A,
                                   int64_t E, int32_t* hist) {
  const int64_t p = threadIdx.x, P = blockDim.x, chunk = (A + P - 1) / P;
  const int64_t a0 = p * chunk < A ? p * chunk : A, a1 = a0 + chunk < A ? a0 + chunk : A;
  int32_t* mine = hist + p * E;
  for (int64_t e = 0; e < E; ++e) mine[e] = 0;
  for (int64_t a = a0; a < a1; ++a) ++mine[ids[a]];
  __syncthreads();
  for (int64_t e = p; e < E; e += P) {  // per expert: each thread's first row within the expert, and the count
    int32_t total = 0;
    for (int64_t q = 0; q < P; ++q) {
      const int32_t c = hist[q * E + e];
      hist[q * E + e] = total;
      total += c;
    }
    offsets[e + 1] = total;
  }
  __syncthreads();
  if (p == 0) {
    offsets[0] = 0;
    for (int64_t e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
  }
  __syncthreads();
  for (int64_t e = p; e < E; e += P)
    for (int64_t q = 0; q < P; ++q) hist[q * E + e] += int32_t(offsets[e]);
  __syncthreads();
  for (int64_t a = a0; a < a1; ++a) {
    const int32_t r = mine[ids[a]]++;
    order[r] = int32_t(a);
    row_of[a] = r;
  }
}

// The row kernels (gather, scatter-add, combine) take eight elements a thread where rows_packed (pack.cuh); each
// element's arithmetic is the scalar path's, so the bits are the same.
template <class Out, class In>
__global__ void moe_gather_kernel(Out* xp, const In* x, const int32_t* order, int64_t A, int64_t k, int64_t C,
                                  bool packed) {
  elementwise_loop(A * C, packed, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    const int64_t r = i / C, c = i % C;
    float v[W];
    load_n(v, x + (order[r] / k) * C + c);
    store_n(xp + i, v);
  });
}

__global__ void moe_scatter_add_kernel(float* dx, const float* dxp, const int32_t* row_of, int64_t N, int64_t k,
                                       int64_t C, bool packed) {
  elementwise_loop(N * C, packed, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    const int64_t t = i / C, c = i % C;
    float d[W], v[W];
    load_n(d, dxp + int64_t(row_of[t * k]) * C + c);
    for (int64_t j = 1; j < k; ++j) {
      load_n(v, dxp + int64_t(row_of[t * k + j]) * C + c);
      for (int e = 0; e < W; ++e) d[e] += v[e];
    }
    store_n(dx + i, d);
  });
}

__global__ void moe_combine_forward_kernel(float* out, const float* yp, const float* weights, const int32_t* row_of,
                                           int64_t N, int64_t k, int64_t C, bool packed) {
  elementwise_loop(N * C, packed, [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    const int64_t t = i / C, c = i % C;
    float o[W], v[W];
    load_n(o, yp + int64_t(row_of[t * k]) * C + c);
    for (int e = 0; e < W; ++e) o[e] = weights[t * k] * o[e];
    for (int64_t j = 1; j < k; ++j) {
      load_n(v, yp + int64_t(row_of[t * k + j]) * C + c);
      for (int e = 0; e < W; ++e) o[e] += weights[t * k + j] * v[e];
    }
    store_n(out + i, o);
  });
}

// One thread per grouped row: dweights[order[r]] = g[r]·h[r] over I then dout·b_down over C (GPT-OSS), one double
// accumulator in index order; g[r] then scaled by the row's weight.
template <class H>
__global__ void moe_weight_grads_kernel(float* dweights, float* g, const H* h, const float* weights,
                                        const int32_t* order, const int32_t* ids, const float* dout,
                                        const float* down_bias, int64_t A, int64_t k, int64_t I, int64_t C) {
  const int64_t r = global_thread();
  if (r >= A) return;
  float* gr = g + r * I;
  const H* hr = h + r * I;
  const int64_t a = order[r];
  double dot = 0;
  for (int64_t i = 0; i < I; ++i) dot += double(gr[i]) * double(load(hr + i));
  if (down_bias) {
    const float* b = down_bias + int64_t(ids[a]) * C;
    const float* d = dout + (a / k) * C;
    for (int64_t c = 0; c < C; ++c) dot += double(d[c]) * double(b[c]);
  }
  dweights[a] = float(dot);
  const float wa = weights[a];
  for (int64_t i = 0; i < I; ++i) gr[i] *= wa;
}

// One thread per assignment a = t·k + j: dyp[row_of[a]] = w·dout[t] and dweights[a] = dout[t]·yp[row_of[a]].
__global__ void moe_combine_backward_kernel(float* dyp, float* dweights, const float* dout, const float* yp,
                                            const float* weights, const int32_t* row_of, int64_t N, int64_t k,
                                            int64_t C) {
  const int64_t a = global_thread();
  if (a >= N * k) return;
  const float* g = dout + (a / k) * C;
  const int64_t r = row_of[a];
  const float wj = weights[a];
  double dot = 0;
  for (int64_t c = 0; c < C; ++c) {
    dyp[r * C + c] = wj * g[c];
    dot += double(g[c]) * double(yp[r * C + c]);
  }
  dweights[a] = float(dot);
}

__global__ void moe_scale_rows_kernel(float* y, const float* weights, const int32_t* order, int64_t A, int64_t C) {
  for (int64_t i = global_thread(); i < A * C; i += grid_threads()) y[i] *= weights[order[i / C]];
}

// One thread per expert, tokens in order (the CPU op's per-call partials, which the host adds to its running
// totals): counts[e] = the counted tokens' choices of e, prob_sums[e] = Σ over them of p_e.
__global__ void moe_aux_partials_kernel(double* counts, double* prob_sums, const int32_t* ids, const float* probs,
                                        const uint8_t* counted, int64_t N, int64_t E, int64_t k) {
  const int64_t e = global_thread();
  if (e >= E) return;
  double c = 0, s = 0;
  for (int64_t t = 0; t < N; ++t) {
    if (counted && !counted[t]) continue;
    for (int64_t j = 0; j < k; ++j) c += ids[t * k + j] == e ? 1.0 : 0.0;
    s += double(probs[t * E + e]);
  }
  counts[e] = c;
  prob_sums[e] = s;
}

// σ as model/moe_ffn.cpp's shared gate: float(1 / (1 + exp(−double(x)))).
__device__ __forceinline__ float shared_sigmoid(float x) { return float(1.0 / (1.0 + ::exp(-double(x)))); }

__global__ void moe_sigmoid_kernel(float* x, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) x[i] = shared_sigmoid(x[i]);
}

__global__ void moe_add_gated_kernel(float* y, const float* ys, const float* sg, int64_t n, int64_t C) {
  for (int64_t i = global_thread(); i < n * C; i += grid_threads()) y[i] += sg[i / C] * ys[i];
}

// One thread per token: the shared gate's logit gradient (gs·hs in double, times σ(1 − σ) in f32).
// With an adapter on the shared down projection, its output's part dout·L_s(hs) (double, over C) joins in f32
// before the σ factor, as model/moe_ffn.cpp adds it.
__global__ void moe_shared_gate_grad_kernel(float* dlogit, const float* gs, const bf16* hs, const float* sg, int64_t n,
                                            int64_t Is, const float* dout, const float* lora_out, int64_t C) {
  const int64_t t = global_thread();
  if (t >= n) return;
  double dot = 0;
  for (int64_t i = 0; i < Is; ++i) dot += double(gs[t * Is + i]) * double(load(hs + t * Is + i));
  float d = float(dot);
  if (lora_out) {
    double extra = 0;
    for (int64_t c = 0; c < C; ++c) extra += double(dout[t * C + c]) * double(lora_out[t * C + c]);
    d += float(extra);
  }
  const float s = sg[t];
  dlogit[t] = d * (s * (1.0f - s));
}

// One thread per row: dweights[order[r]] += dout_rows[r]·lora_out[r] over C (double, in order).
__global__ void moe_adapter_dots_kernel(float* dweights, const float* dout_rows, const float* lora_out,
                                        const int32_t* order, int64_t rows, int64_t C) {
  const int64_t r = global_thread();
  if (r >= rows) return;
  double dot = 0;
  for (int64_t c = 0; c < C; ++c) dot += double(dout_rows[r * C + c]) * double(lora_out[r * C + c]);
  dweights[order ? int64_t(order[r]) : r] += float(dot);
}

__global__ void moe_scale_by_token_kernel(float* out, const float* in, const float* sg, int64_t n, int64_t width) {
  for (int64_t i = global_thread(); i < n * width; i += grid_threads()) out[i] = sg[i / width] * in[i];
}

void moe_router_forward(Stream s, int32_t* ids, float* weights, float* probs, int32_t* bad, const float* logits,
                        int64_t N, int64_t E, int64_t k, bool topk_softmax, bool renormalize) {
  LT_LAUNCH(moe_flag_init_kernel, dim3(1), dim3(1), 0, native_stream(s), bad);
  if (N > 0)
    LT_LAUNCH(moe_router_forward_kernel, dim3(blocks_for(N, kRouterThreads)), dim3(kRouterThreads), 0,
              native_stream(s), ids, weights, probs, bad, logits, N, E, k, topk_softmax, renormalize);
}

void moe_router_backward(Stream s, float* dlogits, const float* dweights, const float* dprobs_extra,
                         const uint8_t* counted, const int32_t* ids, const float* weights, const float* probs,
                         int64_t N, int64_t E, int64_t k, bool topk_softmax, bool renormalize) {
  if (N > 0)
    LT_LAUNCH(moe_router_backward_kernel, dim3(blocks_for(N, kRouterThreads)), dim3(kRouterThreads), 0,
              native_stream(s), dlogits, dweights, dprobs_extra, counted, ids, weights, probs, N, E, k, topk_softmax,
              renormalize);
}

void moe_permute(Stream s, int64_t* offsets, int32_t* order, int32_t* row_of, const int32_t* ids, int64_t N,
                 int64_t k, int64_t E, void* workspace) {
  LT_LAUNCH(moe_permute_kernel, dim3(1), dim3(kMoePermuteThreads), 0, native_stream(s), offsets, order, row_of, ids,
            N * k, E, static_cast<int32_t*>(workspace));
}

void moe_gather(Stream s, bf16_t* xp, const bf16_t* x, const int32_t* order, int64_t A, int64_t k, int64_t C) {
  LT_ELEMENTWISE_PACKED((moe_gather_kernel<bf16, bf16>), A * C, rows_packed(C, {xp, x}), dev(xp), dev(x), order,
                        A, k, C);
}
void moe_gather(Stream s, float* xp, const bf16_t* x, const int32_t* order, int64_t A, int64_t k, int64_t C) {
  LT_ELEMENTWISE_PACKED((moe_gather_kernel<float, bf16>), A * C, rows_packed(C, {xp, x}), xp, dev(x), order, A,
                        k, C);
}
void moe_gather(Stream s, float* xp, const float* x, const int32_t* order, int64_t A, int64_t k, int64_t C) {
  LT_ELEMENTWISE_PACKED((moe_gather_kernel<float, float>), A * C, rows_packed(C, {xp, x}), xp, x, order, A, k,
                        C);
}

void moe_scatter_add(Stream s, float* dx, const float* dxp, const int32_t* row_of, int64_t N, int64_t k, int64_t C) {
  LT_ELEMENTWISE_PACKED(moe_scatter_add_kernel, N * C, rows_packed(C, {dx, dxp}), dx, dxp, row_of, N, k, C);
}

void moe_combine_forward(Stream s, float* out, const float* yp, const float* weights, const int32_t* row_of, int64_t N,
                         int64_t k, int64_t C) {
  LT_ELEMENTWISE_PACKED(moe_combine_forward_kernel, N * C, rows_packed(C, {out, yp}), out, yp, weights, row_of, N,
                        k, C);
}

void moe_weight_grads(Stream s, float* dweights, float* g, const bf16_t* h, const float* weights,
                      const int32_t* order, const int32_t* ids, const float* dout, const float* down_bias, int64_t A,
                      int64_t k, int64_t I, int64_t C) {
  if (A > 0)
    LT_LAUNCH(moe_weight_grads_kernel<bf16>, dim3(blocks_for(A, kRouterThreads)), dim3(kRouterThreads), 0,
              native_stream(s), dweights, g, dev(h), weights, order, ids, dout, down_bias, A, k, I, C);
}
void moe_weight_grads(Stream s, float* dweights, float* g, const float* h, const float* weights,
                      const int32_t* order, const int32_t* ids, const float* dout, const float* down_bias, int64_t A,
                      int64_t k, int64_t I, int64_t C) {
  if (A > 0)
    LT_LAUNCH(moe_weight_grads_kernel<float>, dim3(blocks_for(A, kRouterThreads)), dim3(kRouterThreads), 0,
              native_stream(s), dweights, g, h, weights, order, ids, dout, down_bias, A, k, I, C);
}

void moe_combine_backward(Stream s, float* dyp, float* dweights, const float* dout, const float* yp,
                          const float* weights, const int32_t* row_of, int64_t N, int64_t k, int64_t C) {
  if (N * k > 0)
    LT_LAUNCH(moe_combine_backward_kernel, dim3(blocks_for(N * k, kRouterThreads)), dim3(kRouterThreads), 0,
              native_stream(s), dyp, dweights, dout, yp, weights, row_of, N, k, C);
}

void moe_scale_rows(Stream s, float* y, const float* weights, const int32_t* order, int64_t A, int64_t C) {
  LT_ELEMENTWISE(moe_scale_rows_kernel, A * C, y, weights, order, A, C);
}

void moe_aux_partials(Stream s, double* counts, double* prob_sums, const int32_t* ids, const float* probs,
                      const uint8_t* counted, int64_t N, int64_t E, int64_t k) {
  LT_LAUNCH(moe_aux_partials_kernel, dim3(blocks_for(E, kRouterThreads)), dim3(kRouterThreads), 0, native_stream(s),
            counts, prob_sums, ids, probs, counted, N, E, k);
}

void moe_shared_gate(Stream s, float* gate, int64_t n) { LT_ELEMENTWISE(moe_sigmoid_kernel, n, gate, n); }

void moe_add_gated(Stream s, float* y, const float* ys, const float* gate, int64_t n, int64_t C) {
  LT_ELEMENTWISE(moe_add_gated_kernel, n * C, y, ys, gate, n, C);
}

void moe_shared_gate_grad(Stream s, float* dlogit, const float* gs, const bf16_t* hs, const float* gate, int64_t n,
                          int64_t Is, const float* dout, const float* lora_out, int64_t C) {
  if (n > 0)
    LT_LAUNCH(moe_shared_gate_grad_kernel, dim3(blocks_for(n, kRouterThreads)), dim3(kRouterThreads), 0,
              native_stream(s), dlogit, gs, dev(hs), gate, n, Is, dout, lora_out, C);
}

void moe_adapter_dots(Stream s, float* dweights, const float* dout_rows, const float* lora_out, const int32_t* order,
                      int64_t rows, int64_t C) {
  if (rows > 0)
    LT_LAUNCH(moe_adapter_dots_kernel, dim3(blocks_for(rows, kRouterThreads)), dim3(kRouterThreads), 0,
              native_stream(s), dweights, dout_rows, lora_out, order, rows, C);
}

void moe_scale_by_token(Stream s, float* out, const float* in, const float* gate, int64_t n, int64_t width) {
  LT_ELEMENTWISE(moe_scale_by_token_kernel, n * width, out, in, gate, n, width);
}

}  // namespace lt::cuda::LT_KERNELS_NS
