// cuda/kernels/attention_mma.cuh — causal GQA attention on tensor cores (cuda/kernels/mma.cuh), for bf16
// storage and head dims 64 and 128 (attention.cuh's CUDA-core kernels take every other case). The algorithm is
// attention.cuh's (FlashAttention 2's, with the two-pass deterministic backward); what changes is who multiplies:
// every product is a warp's m16n8k16 bf16 mma with f32 accumulation. So the operands the products read are bf16:
// P = exp(S - m) and dS are rounded to bf16 before P·V, Pᵀ·dO, dSᵀ·Q and dS·K, and dO (f32) is rounded to bf16
// as it is loaded — FlashAttention's rounding points. Softmax statistics (m, l, lse), Di and every accumulator
// stay f32. No atomics, every sum in a fixed order: a run's bits do not depend on scheduling.
//
// Tiles: 64 query rows × 64 keys per block of 4 warps; a warp owns 16 rows (forward, dQ) or 16 keys
// (dK, dV).
// Shared rows are DH + 8 bf16 long, so the 8 rows a fragment load touches fall on different banks.
//   forward  block (query tile, query head, batch row): Q fragments in registers; per key tile K, V in shared;
//            S = Q Kᵀ (8 n-tiles of 8 keys), scale and mask, online softmax over the quad of lanes sharing a
//            row, O = O·α + P V (P's C fragments are the A fragments of the next product).
//   dK, dV   block (key tile, kv head, batch row): K, V of the block in shared; over the group's query heads in
//            order and their query tiles from the diagonal on: Sᵀ = K Qᵀ, dPᵀ = V dOᵀ, Pᵀ = exp(scale·Sᵀ - lse),
//            dSᵀ = Pᵀ ∘ (dPᵀ - Di), dV += Pᵀ dO, dK += dSᵀ Q; dK = scale · dK at the end.
//   dQ       block (query tile, query head, batch row): Q and dO fragments in registers, per key tile S = Q Kᵀ,
//            dP = dO Vᵀ, dS as above, dQ += dS K; dQ = scale · dQ.
// Under cuda-sim the products are mma.cuh's shuffle emulation: same fragments, sums in k order.
#pragma once

#include <cmath>

#include "cuda/kernels/attention_common.cuh"
#include "cuda/kernels/mma.cuh"

namespace lt::cuda::LT_KERNELS_NS {

constexpr int kMmaTile = 64;  // query rows per block = keys per tile (16 per warp)
constexpr int kMmaThreads = 128;

// Two neighbouring elements of a row as one bf16 fragment register (f32 sources round to nearest even).
__device__ __forceinline__ uint32_t pair_of(const bf16* p) { return load_pair(p); }
__device__ __forceinline__ uint32_t pair_of(const float* p) { return pack_bf16(p[0], p[1]); }

// dst[64, DH + 8] (bf16, shared) = rows [row0, row0 + 64) of head h of a [B, T, H, DH] tensor; rows past T are 0.
template <int DH, class Src>
__device__ __forceinline__ void load_mma_rows(bf16* dst, const Src* src, int64_t b, int64_t row0, int64_t h,
                                              int64_t T, int64_t H) {
  constexpr int kPairs = DH / 2;
  for (int e = int(threadIdx.x); e < kMmaTile * kPairs; e += kMmaThreads) {
    const int r = e / kPairs, c = 2 * (e % kPairs);
    const int64_t t = row0 + r;
    *reinterpret_cast<uint32_t*>(dst + r * (DH + 8) + c) = t < T ? pair_of(src + head_row(b, t, h, T, H, DH) + c) : 0u;
  }
}

// A fragments of the 16 rows [row0, row0 + 16) of head h (rows past T are 0), over DH in k-steps of 16.
template <int DH, class Src>
__device__ __forceinline__ void load_a_fragments(uint32_t (&frag)[DH / 16][4], const Src* src, int64_t b,
                                                 int64_t row0, int64_t h, int64_t T, int64_t H) {
  const int lane = int(threadIdx.x) & 31, g = lane >> 2, t = lane & 3;
  for (int half = 0; half < 2; ++half) {
    const int64_t row = row0 + g + 8 * half;
    for (int kk = 0; kk < DH / 16; ++kk) {
      frag[kk][half] = row < T ? pair_of(src + head_row(b, row, h, T, H, DH) + kk * 16 + 2 * t) : 0u;
      frag[kk][2 + half] = row < T ? pair_of(src + head_row(b, row, h, T, H, DH) + kk * 16 + 8 + 2 * t) : 0u;
    }
  }
}

// The same from a shared [64, DH + 8] tile, its rows [r0, r0 + 16).
template <int DH>
__device__ __forceinline__ void shared_a_fragment(uint32_t (&a)[4], const bf16* tile, int r0, int kk) {
  const int lane = int(threadIdx.x) & 31, g = lane >> 2, t = lane & 3;
  const bf16* p = tile + (r0 + g) * (DH + 8) + kk * 16 + 2 * t;
  a[0] = load_pair(p), a[1] = load_pair(p + 8 * (DH + 8));
  a[2] = load_pair(p + 8), a[3] = load_pair(p + 8 * (DH + 8) + 8);
}

// out[16, 64] (8 n-tiles) = A[16, DH] · tileᵀ, tile [64, DH + 8] in shared: its rows are the product's columns.
// a(kk, frag) gives the A fragment of k-step kk.
template <int DH, class AFragment>
__device__ __forceinline__ void mma_rows_by_tile(float (&out)[kMmaTile / 8][4], AFragment a, const bf16* tile) {
  const int lane = int(threadIdx.x) & 31, g = lane >> 2, t = lane & 3;
  for (int j = 0; j < kMmaTile / 8; ++j)
    for (int e = 0; e < 4; ++e) out[j][e] = 0.0f;
  for (int kk = 0; kk < DH / 16; ++kk) {
    uint32_t af[4];
    a(kk, af);
    for (int j = 0; j < kMmaTile / 8; ++j) {
      const bf16* row = tile + (j * 8 + g) * (DH + 8) + kk * 16 + 2 * t;
      const uint32_t bf[2] = {load_pair(row), load_pair(row + 8)};
      mma_bf16_16816(out[j], af, bf, out[j]);
    }
  }
}

// acc[16, DH] += P[16, 64] · tile[64, DH], P as C fragments (8 n-tiles of f32, rounded to bf16 here).
template <int DH>
__device__ __forceinline__ void mma_scores_by_tile(float (&acc)[DH / 8][4], const float (&p)[kMmaTile / 8][4],
                                                   const bf16* tile) {
  constexpr int ST = DH + 8;
  const int lane = int(threadIdx.x) & 31, g = lane >> 2, t = lane & 3;
  for (int kk = 0; kk < kMmaTile / 16; ++kk) {
    const uint32_t af[4] = {pack_bf16(p[2 * kk][0], p[2 * kk][1]), pack_bf16(p[2 * kk][2], p[2 * kk][3]),
                            pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                            pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3])};
    for (int nd = 0; nd < DH / 8; ++nd) {
      const bf16* col = tile + (kk * 16 + 2 * t) * ST + nd * 8 + g;
      const uint32_t bf[2] = {load_pair_strided(col, ST), load_pair_strided(col + 8 * ST, ST)};
      mma_bf16_16816(acc[nd], af, bf, acc[nd]);
    }
  }
}

// Sum over the quad of lanes sharing a fragment row (lanes 4g .. 4g + 3), in a fixed order.
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

template <int DH>
__global__ void __launch_bounds__(kMmaThreads)
    attention_forward_mma_kernel(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                                 const int32_t* doc_ids, AttentionShape s, float scale) {
  constexpr int ST = DH + 8, NT = kMmaTile / 8;
  bf16* Ks = LT_DYNAMIC_SHARED(bf16);  // [64, ST]
  bf16* Vs = Ks + kMmaTile * ST;       // [64, ST]
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, g = lane >> 2, t = lane & 3;
  const int64_t b = blockIdx.z, h = blockIdx.y, q0 = int64_t(blockIdx.x) * kMmaTile, hk = h / (s.Hq / s.Hkv);
  const int64_t w0 = q0 + 16 * warp;  // this warp's rows [w0, w0 + 16)
  uint32_t qf[DH / 16][4];
  load_a_fragments<DH>(qf, q, b, w0, h, s.T, s.Hq);
  float o[DH / 8][4];
  for (int nd = 0; nd < DH / 8; ++nd)
    for (int e = 0; e < 4; ++e) o[nd][e] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g and g + 8
  const int64_t last_query = (q0 + kMmaTile < s.T ? q0 + kMmaTile : s.T) - 1;
  const int64_t warp_last = w0 + 15;
  for (int64_t k0 = 0; k0 <= last_query; k0 += kMmaTile) {
    __syncthreads();  // the previous tile's K and V are no longer read
    load_mma_rows<DH>(Ks, k, b, k0, hk, s.T, s.Hkv);
    load_mma_rows<DH>(Vs, v, b, k0, hk, s.T, s.Hkv);
    __syncthreads();
    if (w0 >= s.T || k0 > warp_last) continue;  // warp-uniform: every key of the tile is after every row
    float sc[NT][4];
    mma_rows_by_tile<DH>(sc, [&](int kk, uint32_t(&a)[4]) { for (int i = 0; i < 4; ++i) a[i] = qf[kk][i]; }, Ks);
    float mx[2] = {-INFINITY, -INFINITY};
    for (int j = 0; j < NT; ++j)
      for (int e = 0; e < 4; ++e) {
        const int64_t i = w0 + g + 8 * (e >> 1), jj = k0 + j * 8 + 2 * t + (e & 1);
        const float x = i < s.T && jj < s.T && attends(doc_ids, b, s.T, i, jj) ? sc[j][e] * scale : -INFINITY;
        sc[j][e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
    float alpha[2], sum[2] = {0.0f, 0.0f};
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m[r], quad_max(mx[r]));
      alpha[r] = m_new == -INFINITY ? 1.0f : expf(m[r] - m_new);  // exp(-inf) = 0 on a row's first keys
      m[r] = m_new;
    }
    for (int j = 0; j < NT; ++j)
      for (int e = 0; e < 4; ++e) {
        const float p = sc[j][e] == -INFINITY ? 0.0f : expf(sc[j][e] - m[e >> 1]);
        sc[j][e] = p;
        sum[e >> 1] += p;
      }
    for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + quad_sum(sum[r]);
    for (int nd = 0; nd < DH / 8; ++nd)
      for (int e = 0; e < 4; ++e) o[nd][e] *= alpha[e >> 1];
    mma_scores_by_tile<DH>(o, sc, Vs);
  }
  for (int r = 0; r < 2; ++r) {
    const int64_t i = w0 + g + 8 * r;
    if (i >= s.T) continue;
    bf16* row = out + head_row(b, i, h, s.T, s.Hq, DH);
    for (int nd = 0; nd < DH / 8; ++nd)
      for (int c = 0; c < 2; ++c) store(row + nd * 8 + 2 * t + c, o[nd][2 * r + c] / l[r]);
    if (t == 0) lse[(b * s.Hq + h) * s.T + i] = m[r] + logf(l[r]);
  }
}

// P and dS of fragment element e: row = first16 + g + 8·(e / 2) of the warp's 16, column jcol of the tile's 64.
__device__ __forceinline__ void probability_and_grad(float& s_then_p, float& dp_then_ds, bool valid, float scale,
                                                     float lse, float Di) {
  const float p = valid ? expf(s_then_p * scale - lse) : 0.0f;
  dp_then_ds = p * (dp_then_ds - Di);
  s_then_p = p;
}

template <int DH>
__global__ void __launch_bounds__(kMmaThreads)
    attention_backward_kv_mma_kernel(float* dk, float* dv, const float* dout, const float* lse, const float* Di,
                                     const bf16* q, const bf16* k, const bf16* v, const int32_t* doc_ids,
                                     AttentionShape s, float scale) {
  constexpr int ST = DH + 8, NT = kMmaTile / 8;
  bf16* Ks = LT_DYNAMIC_SHARED(bf16);  // [64, ST] this block's keys
  bf16* Vs = Ks + kMmaTile * ST;       // [64, ST]
  bf16* Qs = Vs + kMmaTile * ST;       // [64, ST] a query tile
  bf16* dOs = Qs + kMmaTile * ST;      // [64, ST] its dO, rounded to bf16
  float* lse_s = reinterpret_cast<float*>(dOs + kMmaTile * ST);  // [64]
  float* Di_s = lse_s + kMmaTile;                                // [64]
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int64_t b = blockIdx.z, hk = blockIdx.y, k0 = int64_t(blockIdx.x) * kMmaTile, G = s.Hq / s.Hkv;
  const int64_t w0 = k0 + 16 * warp;  // this warp's keys [w0, w0 + 16)
  load_mma_rows<DH>(Ks, k, b, k0, hk, s.T, s.Hkv);
  load_mma_rows<DH>(Vs, v, b, k0, hk, s.T, s.Hkv);
  float dka[DH / 8][4], dva[DH / 8][4];
  for (int nd = 0; nd < DH / 8; ++nd)
    for (int e = 0; e < 4; ++e) dka[nd][e] = 0.0f, dva[nd][e] = 0.0f;
  for (int64_t gi = 0; gi < G; ++gi) {
    const int64_t h = hk * G + gi;
    for (int64_t q0 = k0; q0 < s.T; q0 += kMmaTile) {  // query tiles from the diagonal on
      __syncthreads();  // the previous tile's Q, dO and statistics are no longer read
      load_mma_rows<DH>(Qs, q, b, q0, h, s.T, s.Hq);
      load_mma_rows<DH>(dOs, dout, b, q0, h, s.T, s.Hq);
      if (tid < kMmaTile) {
        const int64_t i = q0 + tid;
        lse_s[tid] = i < s.T ? lse[(b * s.Hq + h) * s.T + i] : 0.0f;
        Di_s[tid] = i < s.T ? Di[(b * s.Hq + h) * s.T + i] : 0.0f;
      }
      __syncthreads();
      if (w0 >= s.T) continue;  // warp-uniform
      float pt[NT][4], dst[NT][4];  // Sᵀ then Pᵀ, dPᵀ then dSᵀ: [16 keys, 64 queries]
      mma_rows_by_tile<DH>(pt, [&](int kk, uint32_t(&a)[4]) { shared_a_fragment<DH>(a, Ks, 16 * warp, kk); }, Qs);
      mma_rows_by_tile<DH>(dst, [&](int kk, uint32_t(&a)[4]) { shared_a_fragment<DH>(a, Vs, 16 * warp, kk); }, dOs);
      for (int j = 0; j < NT; ++j)
        for (int e = 0; e < 4; ++e) {
          const int64_t key = w0 + g + 8 * (e >> 1);
          const int col = j * 8 + 2 * t + (e & 1);
          const int64_t i = q0 + col;
          const bool valid = key < s.T && i < s.T && attends(doc_ids, b, s.T, i, key);
          probability_and_grad(pt[j][e], dst[j][e], valid, scale, lse_s[col], Di_s[col]);
        }
      mma_scores_by_tile<DH>(dva, pt, dOs);
      mma_scores_by_tile<DH>(dka, dst, Qs);
    }
  }
  for (int r = 0; r < 2; ++r) {
    const int64_t key = w0 + g + 8 * r;
    if (key >= s.T) continue;
    float* dk_row = dk + head_row(b, key, hk, s.T, s.Hkv, DH);
    float* dv_row = dv + head_row(b, key, hk, s.T, s.Hkv, DH);
    for (int nd = 0; nd < DH / 8; ++nd)
      for (int c = 0; c < 2; ++c) {
        dk_row[nd * 8 + 2 * t + c] = scale * dka[nd][2 * r + c];
        dv_row[nd * 8 + 2 * t + c] = dva[nd][2 * r + c];
      }
  }
}

template <int DH>
__global__ void __launch_bounds__(kMmaThreads)
    attention_backward_q_mma_kernel(float* dq, const float* dout, const float* lse, const float* Di, const bf16* q,
                                    const bf16* k, const bf16* v, const int32_t* doc_ids, AttentionShape s,
                                    float scale) {
  constexpr int ST = DH + 8, NT = kMmaTile / 8;
  bf16* Ks = LT_DYNAMIC_SHARED(bf16);  // [64, ST]
  bf16* Vs = Ks + kMmaTile * ST;       // [64, ST]
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, g = lane >> 2, t = lane & 3;
  const int64_t b = blockIdx.z, h = blockIdx.y, q0 = int64_t(blockIdx.x) * kMmaTile, hk = h / (s.Hq / s.Hkv);
  const int64_t w0 = q0 + 16 * warp;
  uint32_t qf[DH / 16][4], of[DH / 16][4];
  load_a_fragments<DH>(qf, q, b, w0, h, s.T, s.Hq);
  load_a_fragments<DH>(of, dout, b, w0, h, s.T, s.Hq);
  float lse_r[2], Di_r[2];
  for (int r = 0; r < 2; ++r) {
    const int64_t i = w0 + g + 8 * r;
    lse_r[r] = i < s.T ? lse[(b * s.Hq + h) * s.T + i] : 0.0f;
    Di_r[r] = i < s.T ? Di[(b * s.Hq + h) * s.T + i] : 0.0f;
  }
  float dqa[DH / 8][4];
  for (int nd = 0; nd < DH / 8; ++nd)
    for (int e = 0; e < 4; ++e) dqa[nd][e] = 0.0f;
  const int64_t last_query = (q0 + kMmaTile < s.T ? q0 + kMmaTile : s.T) - 1;
  for (int64_t k0 = 0; k0 <= last_query; k0 += kMmaTile) {
    __syncthreads();
    load_mma_rows<DH>(Ks, k, b, k0, hk, s.T, s.Hkv);
    load_mma_rows<DH>(Vs, v, b, k0, hk, s.T, s.Hkv);
    __syncthreads();
    if (w0 >= s.T || k0 > w0 + 15) continue;  // warp-uniform
    float p[NT][4], ds[NT][4];
    mma_rows_by_tile<DH>(p, [&](int kk, uint32_t(&a)[4]) { for (int i = 0; i < 4; ++i) a[i] = qf[kk][i]; }, Ks);
    mma_rows_by_tile<DH>(ds, [&](int kk, uint32_t(&a)[4]) { for (int i = 0; i < 4; ++i) a[i] = of[kk][i]; }, Vs);
    for (int j = 0; j < NT; ++j)
      for (int e = 0; e < 4; ++e) {
        const int64_t i = w0 + g + 8 * (e >> 1), key = k0 + j * 8 + 2 * t + (e & 1);
        const bool valid = i < s.T && key < s.T && attends(doc_ids, b, s.T, i, key);
        probability_and_grad(p[j][e], ds[j][e], valid, scale, lse_r[e >> 1], Di_r[e >> 1]);
      }
    mma_scores_by_tile<DH>(dqa, ds, Ks);
  }
  for (int r = 0; r < 2; ++r) {
    const int64_t i = w0 + g + 8 * r;
    if (i >= s.T) continue;
    float* row = dq + head_row(b, i, h, s.T, s.Hq, DH);
    for (int nd = 0; nd < DH / 8; ++nd)
      for (int c = 0; c < 2; ++c) row[nd * 8 + 2 * t + c] = scale * dqa[nd][2 * r + c];
  }
}

namespace detail {

constexpr size_t attention_mma_forward_shared(int DH) { return 2 * size_t(kMmaTile) * (DH + 8) * sizeof(bf16); }
constexpr size_t attention_mma_backward_kv_shared(int DH) {
  return 4 * size_t(kMmaTile) * (DH + 8) * sizeof(bf16) + 2 * kMmaTile * sizeof(float);
}

template <int DH>
void attention_forward_mma(Stream st, bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                           const int32_t* doc_ids, AttentionShape s, float scale) {
  const size_t shared = attention_mma_forward_shared(DH);
  allow_shared(attention_forward_mma_kernel<DH>, shared);
  const dim3 grid(unsigned((s.T + kMmaTile - 1) / kMmaTile), unsigned(s.Hq), unsigned(s.B));
  LT_LAUNCH(attention_forward_mma_kernel<DH>, grid, dim3(kMmaThreads), shared, native_stream(st), out, lse, q, k, v,
            doc_ids, s, scale);
}

template <int DH>
void attention_backward_mma(Stream st, float* dq, float* dk, float* dv, const float* dout, const float* lse,
                            const float* Di, const bf16* q, const bf16* k, const bf16* v, const int32_t* doc_ids,
                            AttentionShape s, float scale) {
  const unsigned tiles = unsigned((s.T + kMmaTile - 1) / kMmaTile);
  const size_t kv_shared = attention_mma_backward_kv_shared(DH), q_shared = attention_mma_forward_shared(DH);
  allow_shared(attention_backward_kv_mma_kernel<DH>, kv_shared);
  allow_shared(attention_backward_q_mma_kernel<DH>, q_shared);
  LT_LAUNCH(attention_backward_kv_mma_kernel<DH>, dim3(tiles, unsigned(s.Hkv), unsigned(s.B)), dim3(kMmaThreads),
            kv_shared, native_stream(st), dk, dv, dout, lse, Di, q, k, v, doc_ids, s, scale);
  LT_LAUNCH(attention_backward_q_mma_kernel<DH>, dim3(tiles, unsigned(s.Hq), unsigned(s.B)), dim3(kMmaThreads),
            q_shared, native_stream(st), dq, dout, lse, Di, q, k, v, doc_ids, s, scale);
}

}  // namespace detail
}  // namespace lt::cuda::LT_KERNELS_NS
