// cuda/kernels/attention.cuh — causal grouped-query attention (ops/attention.h), FlashAttention style, with a
// deterministic backward: no float atomics anywhere, every sum in a fixed order, so a run's bits do not depend
// on scheduling (checked under cuda-sim's reverse and random thread orders).
//
// Head dims up to 256, each compiled for the next of 64, 128, 256 (DMAX; the loops run to the real D). Tiles:
// R query rows × R keys (R = 32 for DMAX ≤ 128, 16 for 256, so shared memory stays under the 99 KiB of
// sm_86/89), 128 threads. Q is scaled by 1/sqrt(D) as it is loaded (the CPU op's order). Per thread, the
// [R, D] accumulators are elements e = tid + 128·i < R·D (row e / D, dim e % D).
//
// Forward, block (query tile, query head, batch row): walks the key tiles up to the diagonal; per tile
//   S = Qs Kᵀ (masked: key after query or another document → -inf), one thread per row updates the running
//   max m and sum l and turns S into P = exp(S - m), then O = O·exp(m_old - m) + P V. lse = m + log l.
// Backward, with Di = rowsum(dO ∘ O) first (its own kernel, into the workspace):
//   pass 1, block (key tile, kv head, batch row): dV += Pᵀ dO and dK += dSᵀ Qs over the group's query heads
//           in order and their query tiles from the diagonal on, P = exp(S - lse), dS = P ∘ (dO Vᵀ - Di);
//   pass 2, block (query tile, query head, batch row): dQ = scale · Σ_key tiles dS K, recomputing S and dP.
// This is the CPU op's algorithm (ops/cpu/attention.cpp); the order of the sums inside a dot product differs
// (sequential over D here, the CPU's register-blocked GEMM there), so results agree to f32 rounding, not bits.
// This version uses CUDA cores: f32 storage, and head dims other than 64, 128 and 256. bf16 storage at 64, 128 and
// 256 runs on tensor cores (attention_mma.cuh), which round P, dS and dO to bf16 for the products.
#pragma once

#include <cmath>
#include <type_traits>

#include "cuda/kernels/attention_common.cuh"
#include "cuda/kernels/attention_mma.cuh"

namespace lt::cuda::LT_KERNELS_NS {

constexpr int kAttnThreads = 128;

template <int DMAX>
struct AttnTile {
  static_assert(DMAX == 64 || DMAX == 128 || DMAX == 256, "attention kernels are built for D ≤ 64, 128, 256");
  static constexpr int kRows = DMAX <= 128 ? 32 : 16;                // query rows = keys per tile
  static constexpr int kPerThread = kRows * DMAX / kAttnThreads;     // accumulator elements per thread, at most
  static constexpr int kScoresPerThread = kRows * kRows / kAttnThreads;
};

// dst[rows, D] (f32, shared) = scale · src rows [row0, row0 + rows) of head h; rows past T are zero.
template <class T>
__device__ __forceinline__ void load_tile(float* dst, const T* src, int64_t b, int64_t row0, int64_t h,
                                          int64_t seq, int64_t H, int D, float scale, int rows) {
  for (int e = int(threadIdx.x); e < rows * D; e += kAttnThreads) {
    const int r = e / D, d = e % D;
    const int64_t t = row0 + r;
    dst[e] = t < seq ? scale * load(src + head_row(b, t, h, seq, H, D) + d) : 0.0f;
  }
}

template <class T, int DMAX>
__global__ void __launch_bounds__(kAttnThreads)
    attention_forward_kernel(T* out, float* lse, const T* q, const T* k, const T* v, const int32_t* doc_ids,
                             const float* sinks, AttentionShape s, float scale) {
  using Tile = AttnTile<DMAX>;
  const int D = int(s.D);
  constexpr int R = Tile::kRows;
  float* Qs = LT_DYNAMIC_SHARED(float);  // [R, D]
  float* Ks = Qs + R * D;                // [R, D]
  float* Vs = Ks + R * D;                // [R, D]
  float* S = Vs + R * D;                 // [R, R] scores, then P
  float* m = S + R * R;                  // [R] running max
  float* l = m + R;                      // [R] running sum
  float* alpha = l + R;                  // [R] this tile's rescaling of O
  const int tid = int(threadIdx.x);
  const int64_t b = blockIdx.z, h = blockIdx.y, q0 = int64_t(blockIdx.x) * R;
  const int64_t hk = h / (s.Hq / s.Hkv);
  load_tile(Qs, q, b, q0, h, s.T, s.Hq, D, scale, R);
  if (tid < R) m[tid] = -INFINITY, l[tid] = 0.0f;
  float acc[Tile::kPerThread];
  for (int i = 0; i < Tile::kPerThread; ++i) acc[i] = 0.0f;
  const int64_t last_query = (q0 + R < s.T ? q0 + R : s.T) - 1;
  for (int64_t k0 = 0; k0 <= last_query; k0 += R) {
    __syncthreads();  // the previous tile's K, V, P are no longer read
    load_tile(Ks, k, b, k0, hk, s.T, s.Hkv, D, 1.0f, R);
    load_tile(Vs, v, b, k0, hk, s.T, s.Hkv, D, 1.0f, R);
    __syncthreads();
    for (int n = 0; n < Tile::kScoresPerThread; ++n) {
      const int e = tid + kAttnThreads * n, r = e / R, c = e % R;
      const int64_t i = q0 + r, j = k0 + c;
      float dot = -INFINITY;
      if (i < s.T && j < s.T && attends(doc_ids, b, s.T, i, j, s.window)) {
        dot = 0.0f;
        for (int d = 0; d < D; ++d) dot += Qs[r * D + d] * Ks[c * D + d];
      }
      S[e] = dot;
    }
    __syncthreads();
    if (tid < R) {  // the online softmax of row tid
      float mx = -INFINITY;
      for (int c = 0; c < R; ++c) mx = fmaxf(mx, S[tid * R + c]);
      const float m_new = fmaxf(m[tid], mx);
      float sum = 0.0f;
      for (int c = 0; c < R; ++c) {
        const float sc = S[tid * R + c];
        const float p = sc == -INFINITY ? 0.0f : expf(sc - m_new);
        S[tid * R + c] = p;
        sum += p;
      }
      const float a = m_new == -INFINITY ? 1.0f : expf(m[tid] - m_new);  // exp(-inf) = 0 on the first tile
      alpha[tid] = a;
      l[tid] = l[tid] * a + sum;
      m[tid] = m_new;
    }
    __syncthreads();
    for (int i = 0; i < Tile::kPerThread && tid + kAttnThreads * i < R * D; ++i) {
      const int e = tid + kAttnThreads * i, r = e / D, d = e % D;
      float o = acc[i] * alpha[r];
      for (int c = 0; c < R; ++c) o += S[r * R + c] * Vs[c * D + d];
      acc[i] = o;
    }
  }
  __syncthreads();
  if (tid < R && q0 + tid < s.T) {  // the row's lse (with the sink: lse', and the share alpha its output keeps)
    float row_lse = m[tid] + logf(l[tid]);
    if (sinks) {
      const SinkRow sr = with_sink(row_lse, sinks[h]);
      alpha[tid] = sr.keep, row_lse = sr.lse;
    }
    lse[(b * s.Hq + h) * s.T + q0 + tid] = row_lse;
  }
  __syncthreads();
  for (int i = 0; i < Tile::kPerThread && tid + kAttnThreads * i < R * D; ++i) {
    const int e = tid + kAttnThreads * i, r = e / D, d = e % D;
    const int64_t t = q0 + r;
    if (t >= s.T) continue;
    float o = acc[i] / l[r];
    if (sinks) o *= alpha[r];
    store(out + head_row(b, t, h, s.T, s.Hq, D) + d, o);
  }
}

// Di[b, h, t] = Σ_d dO · O, one thread per (token, head) row.
template <class T>
__global__ void attention_rowdot_kernel(float* Di, const float* dout, const T* out, AttentionShape s) {
  const int64_t rows = s.B * s.T * s.Hq;
  for (int64_t row = global_thread(); row < rows; row += grid_threads()) {
    const int64_t h = row % s.Hq, bt = row / s.Hq, b = bt / s.T, t = bt % s.T;
    float sum = 0.0f;
    for (int64_t d = 0; d < s.D; ++d) sum += dout[row * s.D + d] * load(out + row * s.D + d);
    Di[(b * s.Hq + h) * s.T + t] = sum;
  }
}

// P[r, c] = exp(Qs_r · K_c - lse_r) (0 where masked) and dS = P ∘ (dO_r · V_c - Di_r), for query rows
// [q0, q0 + R) and keys [k0, k0 + R); every thread takes kScoresPerThread entries.
template <int DMAX>
__device__ __forceinline__ void attention_probabilities(float* P, float* dS, const float* Qs, const float* dOs,
                                                        const float* Ks, const float* Vs, const float* lse_s,
                                                        const float* Di_s, const int32_t* doc_ids, int64_t b,
                                                        int64_t T, int64_t window, int D, int64_t q0, int64_t k0) {
  constexpr int R = AttnTile<DMAX>::kRows;
  for (int n = 0; n < AttnTile<DMAX>::kScoresPerThread; ++n) {
    const int e = int(threadIdx.x) + kAttnThreads * n, r = e / R, c = e % R;
    const int64_t i = q0 + r, j = k0 + c;
    float p = 0.0f, ds = 0.0f;
    if (i < T && j < T && attends(doc_ids, b, T, i, j, window)) {
      float sc = 0.0f, dp = 0.0f;
      for (int d = 0; d < D; ++d) sc += Qs[r * D + d] * Ks[c * D + d];
      for (int d = 0; d < D; ++d) dp += dOs[r * D + d] * Vs[c * D + d];
      p = expf(sc - lse_s[r]);
      ds = p * (dp - Di_s[r]);
    }
    P[e] = p;
    dS[e] = ds;
  }
}

// Loads lse and Di of query rows [q0, q0 + R) of head h into shared memory (0 past T).
template <int R>
__device__ __forceinline__ void load_row_stats(float* lse_s, float* Di_s, const float* lse, const float* Di,
                                               int64_t b, int64_t h, int64_t q0, AttentionShape s) {
  const int tid = int(threadIdx.x);
  if (tid < R) {
    const int64_t t = q0 + tid;
    lse_s[tid] = t < s.T ? lse[(b * s.Hq + h) * s.T + t] : 0.0f;
    Di_s[tid] = t < s.T ? Di[(b * s.Hq + h) * s.T + t] : 0.0f;
  }
}

// Pass 1: dK, dV of one key tile of one kv head.
template <class T, int DMAX>
__global__ void __launch_bounds__(kAttnThreads)
    attention_backward_kv_kernel(float* dk, float* dv, const float* dout, const float* lse, const float* Di,
                                 const T* q, const T* k, const T* v, const int32_t* doc_ids, AttentionShape s,
                                 float scale) {
  using Tile = AttnTile<DMAX>;
  const int D = int(s.D);
  constexpr int R = Tile::kRows;
  float* Ks = LT_DYNAMIC_SHARED(float);  // [R, D]
  float* Vs = Ks + R * D;                // [R, D]
  float* Qs = Vs + R * D;                // [R, D] scale · q
  float* dOs = Qs + R * D;               // [R, D]
  float* P = dOs + R * D;                // [R, R]
  float* dS = P + R * R;                 // [R, R]
  float* lse_s = dS + R * R;             // [R]
  float* Di_s = lse_s + R;               // [R]
  const int tid = int(threadIdx.x);
  const int64_t b = blockIdx.z, hk = blockIdx.y, k0 = int64_t(blockIdx.x) * R, G = s.Hq / s.Hkv;
  load_tile(Ks, k, b, k0, hk, s.T, s.Hkv, D, 1.0f, R);
  load_tile(Vs, v, b, k0, hk, s.T, s.Hkv, D, 1.0f, R);
  float acc_dk[Tile::kPerThread], acc_dv[Tile::kPerThread];
  for (int i = 0; i < Tile::kPerThread; ++i) acc_dk[i] = 0.0f, acc_dv[i] = 0.0f;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t h = hk * G + g;
    for (int64_t q0 = (k0 / R) * R; q0 < s.T; q0 += R) {  // query tiles from the diagonal on
      __syncthreads();  // the previous tile's Q, dO, P, dS are no longer read
      load_tile(Qs, q, b, q0, h, s.T, s.Hq, D, scale, R);
      for (int e = tid; e < R * D; e += kAttnThreads) {
        const int64_t t = q0 + e / D;
        dOs[e] = t < s.T ? dout[head_row(b, t, h, s.T, s.Hq, D) + e % D] : 0.0f;
      }
      load_row_stats<R>(lse_s, Di_s, lse, Di, b, h, q0, s);
      __syncthreads();
      attention_probabilities<DMAX>(P, dS, Qs, dOs, Ks, Vs, lse_s, Di_s, doc_ids, b, s.T, s.window, D, q0, k0);
      __syncthreads();
      for (int i = 0; i < Tile::kPerThread && tid + kAttnThreads * i < R * D; ++i) {  // dV += Pᵀ dO, dK += dSᵀ Qs
        const int e = tid + kAttnThreads * i, c = e / D, d = e % D;                       // for key row c, dim d
        float sv = acc_dv[i], sk = acc_dk[i];
        for (int r = 0; r < R; ++r) {
          sv += P[r * R + c] * dOs[r * D + d];
          sk += dS[r * R + c] * Qs[r * D + d];
        }
        acc_dv[i] = sv, acc_dk[i] = sk;
      }
    }
  }
  for (int i = 0; i < Tile::kPerThread && tid + kAttnThreads * i < R * D; ++i) {
    const int e = tid + kAttnThreads * i, c = e / D, d = e % D;
    const int64_t t = k0 + c;
    if (t < s.T) {
      dk[head_row(b, t, hk, s.T, s.Hkv, D) + d] = acc_dk[i];
      dv[head_row(b, t, hk, s.T, s.Hkv, D) + d] = acc_dv[i];
    }
  }
}

// Pass 2: dQ of one query tile of one query head.
template <class T, int DMAX>
__global__ void __launch_bounds__(kAttnThreads)
    attention_backward_q_kernel(float* dq, const float* dout, const float* lse, const float* Di, const T* q,
                                const T* k, const T* v, const int32_t* doc_ids, AttentionShape s, float scale) {
  using Tile = AttnTile<DMAX>;
  const int D = int(s.D);
  constexpr int R = Tile::kRows;
  float* Qs = LT_DYNAMIC_SHARED(float);  // [R, D] scale · q
  float* dOs = Qs + R * D;               // [R, D]
  float* Ks = dOs + R * D;               // [R, D]
  float* Vs = Ks + R * D;                // [R, D]
  float* P = Vs + R * D;                 // [R, R]
  float* dS = P + R * R;                 // [R, R]
  float* lse_s = dS + R * R;             // [R]
  float* Di_s = lse_s + R;               // [R]
  const int tid = int(threadIdx.x);
  const int64_t b = blockIdx.z, h = blockIdx.y, q0 = int64_t(blockIdx.x) * R;
  const int64_t hk = h / (s.Hq / s.Hkv);
  load_tile(Qs, q, b, q0, h, s.T, s.Hq, D, scale, R);
  for (int e = tid; e < R * D; e += kAttnThreads) {
    const int64_t t = q0 + e / D;
    dOs[e] = t < s.T ? dout[head_row(b, t, h, s.T, s.Hq, D) + e % D] : 0.0f;
  }
  load_row_stats<R>(lse_s, Di_s, lse, Di, b, h, q0, s);
  float acc[Tile::kPerThread];
  for (int i = 0; i < Tile::kPerThread; ++i) acc[i] = 0.0f;
  const int64_t last_query = (q0 + R < s.T ? q0 + R : s.T) - 1;
  for (int64_t k0 = 0; k0 <= last_query; k0 += R) {
    __syncthreads();
    load_tile(Ks, k, b, k0, hk, s.T, s.Hkv, D, 1.0f, R);
    load_tile(Vs, v, b, k0, hk, s.T, s.Hkv, D, 1.0f, R);
    __syncthreads();
    attention_probabilities<DMAX>(P, dS, Qs, dOs, Ks, Vs, lse_s, Di_s, doc_ids, b, s.T, s.window, D, q0, k0);
    __syncthreads();
    for (int i = 0; i < Tile::kPerThread && tid + kAttnThreads * i < R * D; ++i) {  // dQ += dS K, row r, dim d
      const int e = tid + kAttnThreads * i, r = e / D, d = e % D;
      float sum = acc[i];
      for (int c = 0; c < R; ++c) sum += dS[r * R + c] * Ks[c * D + d];
      acc[i] = sum;
    }
  }
  for (int i = 0; i < Tile::kPerThread && tid + kAttnThreads * i < R * D; ++i) {
    const int e = tid + kAttnThreads * i, r = e / D, d = e % D;
    const int64_t t = q0 + r;
    if (t < s.T) dq[head_row(b, t, h, s.T, s.Hq, D) + d] = scale * acc[i];
  }
}

namespace detail {

constexpr size_t attention_forward_shared(int DMAX, int64_t D) {
  const size_t R = DMAX <= 128 ? 32 : 16;
  return (3 * R * size_t(D) + R * R + 3 * R) * sizeof(float);
}
constexpr size_t attention_backward_shared(int DMAX, int64_t D) {
  const size_t R = DMAX <= 128 ? 32 : 16;
  return (4 * R * size_t(D) + 2 * R * R + 2 * R) * sizeof(float);
}

template <class T, int DMAX>
void attention_forward(Stream st, T* out, float* lse, const T* q, const T* k, const T* v, const int32_t* doc_ids,
                       const float* sinks, AttentionShape s) {
  constexpr int R = AttnTile<DMAX>::kRows;
  const size_t shared = attention_forward_shared(DMAX, s.D);
  allow_shared(attention_forward_kernel<T, DMAX>, attention_forward_shared(DMAX, DMAX));
  const dim3 grid(unsigned((s.T + R - 1) / R), unsigned(s.Hq), unsigned(s.B));
  LT_LAUNCH((attention_forward_kernel<T, DMAX>), grid, dim3(kAttnThreads), shared, native_stream(st), out, lse, q, k,
            v, doc_ids, sinks, s, attention_scale(s.D));
}

template <class T, int DMAX>
void attention_backward(Stream st, float* dq, float* dk, float* dv, const float* dout, const T* out,
                        const float* lse, const T* q, const T* k, const T* v, const int32_t* doc_ids,
                        AttentionShape s, float* Di) {
  constexpr int R = AttnTile<DMAX>::kRows;
  const int64_t rows = s.B * s.T * s.Hq;
  LT_LAUNCH(attention_rowdot_kernel<T>, dim3(elementwise_blocks(rows)), dim3(kElementwiseThreads), 0,
            native_stream(st), Di, dout, out, s);
  const size_t shared = attention_backward_shared(DMAX, s.D);
  allow_shared(attention_backward_kv_kernel<T, DMAX>, attention_backward_shared(DMAX, DMAX));
  allow_shared(attention_backward_q_kernel<T, DMAX>, attention_backward_shared(DMAX, DMAX));
  const unsigned tiles = unsigned((s.T + R - 1) / R);
  LT_LAUNCH((attention_backward_kv_kernel<T, DMAX>), dim3(tiles, unsigned(s.Hkv), unsigned(s.B)), dim3(kAttnThreads),
            shared, native_stream(st), dk, dv, dout, lse, Di, q, k, v, doc_ids, s, attention_scale(s.D));
  LT_LAUNCH((attention_backward_q_kernel<T, DMAX>), dim3(tiles, unsigned(s.Hq), unsigned(s.B)), dim3(kAttnThreads),
            shared, native_stream(st), dq, dout, lse, Di, q, k, v, doc_ids, s, attention_scale(s.D));
}

// Calls fn.template operator()<DMAX>() with the build for the shape's head dimension (the next of 64, 128, 256).
template <class Fn>
void with_head_dim(int64_t D, const char* op, Fn&& fn) {
  if (D >= 1 && D <= 64) fn.template operator()<64>();
  else if (D > 64 && D <= 128) fn.template operator()<128>();
  else if (D > 128 && D <= 256) fn.template operator()<256>();
  else throw_unsupported_head_dim(op, D);
}

}  // namespace detail

namespace detail {

template <class Dev>
void attention_forward_any(Stream st, Dev* out, float* lse, const Dev* q, const Dev* k, const Dev* v,
                           const int32_t* doc_ids, const float* sinks, AttentionShape s) {
  check_attention_shape("attention_forward", s);
  if (s.B * s.T == 0) return;
  if constexpr (std::is_same_v<Dev, bf16>) {
    if (attention_on_tensor_cores(s.D)) {
      with_head_dim(s.D, "attention_forward", [&]<int DH>() {
        attention_forward_mma<DH>(st, out, lse, q, k, v, doc_ids, sinks, s, attention_scale(s.D));
      });
      return;
    }
  }
  with_head_dim(s.D, "attention_forward",
                [&]<int DMAX>() { attention_forward<Dev, DMAX>(st, out, lse, q, k, v, doc_ids, sinks, s); });
}

template <class Dev>
void attention_backward_any(Stream st, float* dq, float* dk, float* dv, const float* dout, const Dev* out,
                            const float* lse, const Dev* q, const Dev* k, const Dev* v, const int32_t* doc_ids,
                            AttentionShape s, void* workspace) {
  check_attention_shape("attention_backward", s);
  if (s.B * s.T == 0) return;
  if constexpr (std::is_same_v<Dev, bf16>) {
    if (attention_on_tensor_cores(s.D)) {
      const float scale = attention_scale(s.D);
      with_head_dim(s.D, "attention_backward", [&]<int DH>() {
        attention_backward_mma<DH>(st, dq, dk, dv, dout, out, lse, q, k, v, doc_ids, s, scale, workspace);
      });
      return;
    }
  }
  with_head_dim(s.D, "attention_backward", [&]<int DMAX>() {
    attention_backward<Dev, DMAX>(st, dq, dk, dv, dout, out, lse, q, k, v, doc_ids, s, static_cast<float*>(workspace));
  });
}

}  // namespace detail

void attention_forward(Stream s, float* out, float* lse, const float* q, const float* k, const float* v,
                       const int32_t* doc_ids, AttentionShape shape, const float* sinks) {
  detail::attention_forward_any(s, out, lse, q, k, v, doc_ids, sinks, shape);
}
void attention_forward(Stream s, bf16_t* out, float* lse, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                       const int32_t* doc_ids, AttentionShape shape, const float* sinks) {
  detail::attention_forward_any(s, dev(out), lse, dev(q), dev(k), dev(v), doc_ids, sinks, shape);
}
void attention_backward(Stream s, float* dq, float* dk, float* dv, const float* dout, const float* out,
                        const float* lse, const float* q, const float* k, const float* v, const int32_t* doc_ids,
                        AttentionShape shape, void* workspace) {
  detail::attention_backward_any(s, dq, dk, dv, dout, out, lse, q, k, v, doc_ids, shape, workspace);
}
void attention_backward(Stream s, float* dq, float* dk, float* dv, const float* dout, const bf16_t* out,
                        const float* lse, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                        const int32_t* doc_ids, AttentionShape shape, void* workspace) {
  detail::attention_backward_any(s, dq, dk, dv, dout, dev(out), lse, dev(q), dev(k), dev(v), doc_ids, shape,
                                 workspace);
}

}  // namespace lt::cuda::LT_KERNELS_NS
