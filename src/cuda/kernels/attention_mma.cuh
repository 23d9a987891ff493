// cuda/kernels/attention_mma.cuh — causal GQA attention on tensor cores (cuda/kernels/mma.cuh), for bf16
// storage and head dims 64 and 128 (attention.cuh's CUDA-core kernels take every other case). The algorithm is
// attention.cuh's (FlashAttention 2's, with the two-pass deterministic backward); what changes is who multiplies:
// every product is a warp's m16n8k16 bf16 mma with f32 accumulation. So the operands the products read are bf16:
// P = exp(S - m) and dS are rounded to bf16 before P·V, Pᵀ·dO, dSᵀ·Q and dS·K, and dO (f32) is rounded to bf16
// once, into the workspace — FlashAttention's rounding points. Softmax statistics (m, l, lse), Di and every accumulator
// stay f32. No atomics, every sum in a fixed order: a run's bits do not depend on scheduling.
//
// Tiles: 64 query rows × 64 keys per block of 4 warps; a warp owns 16 rows (forward, dQ) or 16 keys (dK, dV).
// Tiles stream into shared memory by cp.async (async_copy.cuh), double-buffered: tile i + 1 is copied while tile
// i is multiplied. Fragments come out of shared memory by ldmatrix (mma.cuh). Shared rows are DH + 8 bf16 long,
// so the 8 rows an ldmatrix reads fall on different banks. Blocks with the most tiles (the causal mask's long
// rows) are launched first.
//   forward  block (query tile, query head, batch row): Q fragments in registers; per key tile K, V in shared;
//            S = Q Kᵀ (8 n-tiles of 8 keys), scale and mask, online softmax over the quad of lanes sharing a
//            row, O = O·α + P V (P's C fragments are the A fragments of the next product).
//   prepare  Di = rowsum(dO ∘ O) and dO rounded to bf16, once (the dK/dV blocks read each dO tile many times).
//   dK, dV   block (key tile, query head, batch row): K, V of the block in shared; over the head's query tiles
//            from the diagonal on: Sᵀ = K Qᵀ, dPᵀ = V dOᵀ, Pᵀ = exp(scale·Sᵀ - lse), dSᵀ = Pᵀ ∘ (dPᵀ - Di),
//            dV += Pᵀ dO, dK += dSᵀ Q. With grouped heads (G = Hq / Hkv > 1) each query head writes its own
//            partial dK, dV, and a reduction sums the G partials in head order (dK = scale · Σ): G times the
//            blocks of one per kv head, and no atomics.
//   dQ       block (query tile, query head, batch row): Q and dO fragments in registers, per key tile S = Q Kᵀ,
//            dP = dO Vᵀ, dS as above, dQ += dS K; dQ = scale · dQ.
// Under cuda-sim the products are mma.cuh's shuffle emulation (same fragments, sums in k order) and the copies
// complete when issued.
#pragma once

#include <cmath>

#include "cuda/kernels/async_copy.cuh"
#include "cuda/kernels/attention_common.cuh"
#include "cuda/kernels/mma.cuh"


namespace lt::cuda::LT_KERNELS_NS {

constexpr int kMmaTile = 64;  // query rows per block = keys per tile (16 per warp)
constexpr int kMmaThreads = 128;

// Issues the copy of rows [row0, row0 + 64) of head h of a bf16 [B, T, H, DH] tensor into dst[64, DH + 8]
// (shared); rows past T become 0. Every thread takes 16-byte pieces.
template <int DH>
__device__ __forceinline__ void copy_rows_async(bf16* dst, const bf16* src, int64_t b, int64_t row0, int64_t h,
                                                int64_t T, int64_t H) {
  constexpr int kPieces = DH / 8;
  for (int e = int(threadIdx.x); e < kMmaTile * kPieces; e += kMmaThreads) {
    const int r = e / kPieces, c = 8 * (e % kPieces);
    const bool valid = row0 + r < T;
    copy16_async(dst + r * (DH + 8) + c, valid ? src + head_row(b, row0 + r, h, T, H, DH) + c : src, valid);
  }
}

// Issues the copy of the 64 per-row statistics row[row0 .. row0 + 64) (0 past T) into dst[64] (shared).
__device__ __forceinline__ void copy_stats_async(float* dst, const float* row, int64_t row0, int64_t T) {
  const int i = int(threadIdx.x);
  if (i < kMmaTile) copy4_async(dst + i, row0 + i < T ? row + row0 + i : row, row0 + i < T);
}

// Issues key tile i of kv head hk (K and V rows [64 i, 64 i + 64)) into buffer i % 2 of Ks, Vs ([2][64, DH + 8]).
template <int DH>
__device__ __forceinline__ void copy_key_tile_async(bf16* Ks, bf16* Vs, const bf16* k, const bf16* v, int64_t b,
                                                    int64_t i, int64_t hk, const AttentionShape& s) {
  constexpr int kTile = kMmaTile * (DH + 8);
  copy_rows_async<DH>(Ks + (i & 1) * kTile, k, b, i * kMmaTile, hk, s.T, s.Hkv);
  copy_rows_async<DH>(Vs + (i & 1) * kTile, v, b, i * kMmaTile, hk, s.T, s.Hkv);
}

// One step of a double buffer: issue tile it + 1 (issue(it + 1) copies it into the other buffer, read last in the
// previous iteration) when there is one, then wait for this thread's copies of tile it. A __syncthreads must
// follow before tile it is read (the other threads' copies).
template <class Issue>
__device__ __forceinline__ void prefetch_next_and_wait(int64_t it, int64_t tiles, Issue issue) {
  if (it + 1 < tiles) {
    issue(it + 1);
    async_commit();
    async_wait<1>();
  } else {
    async_wait<0>();
  }
}

// A fragments of the 16 rows [row0, row0 + 16) of head h (rows past T are 0), over DH in k-steps of 16.
template <int DH>
__device__ __forceinline__ void load_a_fragments(uint32_t (&frag)[DH / 16][4], const bf16* src, int64_t b,
                                                 int64_t row0, int64_t h, int64_t T, int64_t H) {
  const int lane = int(threadIdx.x) & 31, g = lane >> 2, t = lane & 3;
  for (int half = 0; half < 2; ++half) {
    const int64_t row = row0 + g + 8 * half;
    for (int kk = 0; kk < DH / 16; ++kk) {
      frag[kk][half] = row < T ? load_pair(src + head_row(b, row, h, T, H, DH) + kk * 16 + 2 * t) : 0u;
      frag[kk][2 + half] = row < T ? load_pair(src + head_row(b, row, h, T, H, DH) + kk * 16 + 8 + 2 * t) : 0u;
    }
  }
}

// The same from a shared [64, DH + 8] tile, its rows [r0, r0 + 16): one ldmatrix (matrices: rows r0 and r0 + 8
// at columns 16 kk, then at 16 kk + 8).
template <int DH>
__device__ __forceinline__ void shared_a_fragment(uint32_t (&a)[4], const bf16* tile, int r0, int kk) {
  const int lane = int(threadIdx.x) & 31, m = lane >> 3;
  ldmatrix_x4<false>(a, tile + (r0 + 8 * (m & 1) + (lane & 7)) * (DH + 8) + kk * 16 + 8 * (m >> 1));
}

// out[16, 64] (8 n-tiles) = A[16, DH] · tileᵀ, tile [64, DH + 8] in shared: its rows are the product's columns.
// a(kk, frag) gives the A fragment of k-step kk. One ldmatrix gives the B fragments of n-tiles j and j + 1
// (matrices: rows 8j and 8j + 8 at columns 16 kk and 16 kk + 8).
template <int DH, class AFragment>
__device__ __forceinline__ void mma_rows_by_tile(float (&out)[kMmaTile / 8][4], AFragment a, const bf16* tile) {
  const int lane = int(threadIdx.x) & 31, m = lane >> 3;
  for (int j = 0; j < kMmaTile / 8; ++j)
    for (int e = 0; e < 4; ++e) out[j][e] = 0.0f;
  const bf16* lane_row = tile + (8 * (m >> 1) + (lane & 7)) * (DH + 8) + 8 * (m & 1);
  for (int kk = 0; kk < DH / 16; ++kk) {
    uint32_t af[4];
    a(kk, af);
    for (int j = 0; j < kMmaTile / 8; j += 2) {
      uint32_t bf[4];
      ldmatrix_x4<false>(bf, lane_row + j * 8 * (DH + 8) + kk * 16);
      mma_bf16_16816(out[j], af, bf, out[j]);
      mma_bf16_16816(out[j + 1], af, bf + 2, out[j + 1]);
    }
  }
}

// acc[16, DH] += P[16, 64] · tile[64, DH], P as C fragments (8 n-tiles of f32, rounded to bf16 here). One
// transposed ldmatrix gives the B fragments of column tiles nd and nd + 1 (matrices: rows 16 kk and 16 kk + 8 at
// columns 8 nd, then at 8 nd + 8).
template <int DH>
__device__ __forceinline__ void mma_scores_by_tile(float (&acc)[DH / 8][4], const float (&p)[kMmaTile / 8][4],
                                                   const bf16* tile) {
  const int lane = int(threadIdx.x) & 31, m = lane >> 3;
  const bf16* lane_row = tile + (8 * (m & 1) + (lane & 7)) * (DH + 8) + 8 * (m >> 1);
  for (int kk = 0; kk < kMmaTile / 16; ++kk) {
    const uint32_t af[4] = {pack_bf16(p[2 * kk][0], p[2 * kk][1]), pack_bf16(p[2 * kk][2], p[2 * kk][3]),
                            pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                            pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3])};
    for (int nd = 0; nd < DH / 8; nd += 2) {
      uint32_t bf[4];
      ldmatrix_x4<true>(bf, lane_row + kk * 16 * (DH + 8) + nd * 8);
      mma_bf16_16816(acc[nd], af, bf, acc[nd]);
      mma_bf16_16816(acc[nd + 1], af, bf + 2, acc[nd + 1]);
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

// Whether every pair (row, key) of rows [r0, r0 + 16) and keys [k0, k0 + 64) attends (warp-uniform): the tile
// lies below the diagonal, inside T and the sliding window, and there are no documents. Such tiles skip the
// per-element mask.
__device__ __forceinline__ bool tile_unmasked(const int32_t* doc_ids, int64_t T, int64_t window, int64_t r0,
                                              int64_t k0) {
  return doc_ids == nullptr && k0 + kMmaTile - 1 <= r0 && r0 + 15 < T && (window <= 0 || k0 > r0 + 15 - window);
}

template <int DH>
__global__ void __launch_bounds__(kMmaThreads)
    attention_forward_mma_kernel(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                                 const int32_t* doc_ids, const float* sinks, AttentionShape s, float scale) {
  constexpr int NT = kMmaTile / 8, kTile = kMmaTile * (DH + 8);
  bf16* Ks = LT_DYNAMIC_SHARED(bf16);  // [2][64, DH + 8]: key tiles i (buffer i % 2)
  bf16* Vs = Ks + 2 * kTile;           // [2][64, DH + 8]
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, g = lane >> 2, t = lane & 3;
  const int64_t q0 = int64_t(gridDim.x - 1 - blockIdx.x) * kMmaTile;  // the last query tiles have most keys
  const int64_t b = blockIdx.z, h = blockIdx.y, hk = h / (s.Hq / s.Hkv);
  const int64_t w0 = q0 + 16 * warp;  // this warp's rows [w0, w0 + 16)
  const int64_t last_query = (q0 + kMmaTile < s.T ? q0 + kMmaTile : s.T) - 1;
  const int64_t tiles = last_query / kMmaTile + 1;
  auto copy_key_tile = [&](int64_t i) { copy_key_tile_async<DH>(Ks, Vs, k, v, b, i, hk, s); };
  copy_key_tile(0);
  async_commit();
  uint32_t qf[DH / 16][4];
  load_a_fragments<DH>(qf, q, b, w0, h, s.T, s.Hq);
  float o[DH / 8][4];
  for (int nd = 0; nd < DH / 8; ++nd)
    for (int e = 0; e < 4; ++e) o[nd][e] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g and g + 8
  for (int64_t it = 0; it < tiles; ++it) {
    const int64_t k0 = it * kMmaTile;
    const bf16* Kt = Ks + (it & 1) * kTile;
    const bf16* Vt = Vs + (it & 1) * kTile;
    prefetch_next_and_wait(it, tiles, copy_key_tile);
    __syncthreads();  // this tile's copies, by every thread, have landed
    if (w0 < s.T && k0 <= w0 + 15) {  // warp-uniform: not every key of the tile after every row
      float sc[NT][4];
      mma_rows_by_tile<DH>(sc, [&](int kk, uint32_t(&a)[4]) { for (int i = 0; i < 4; ++i) a[i] = qf[kk][i]; }, Kt);
      const bool unmasked = tile_unmasked(doc_ids, s.T, s.window, w0, k0);
      float mx[2] = {-INFINITY, -INFINITY};
      for (int j = 0; j < NT; ++j)
        for (int e = 0; e < 4; ++e) {
          const int64_t i = w0 + g + 8 * (e >> 1), jj = k0 + j * 8 + 2 * t + (e & 1);
          const bool valid = unmasked || (i < s.T && jj < s.T && attends(doc_ids, b, s.T, i, jj, s.window));
          const float x = valid ? sc[j][e] * scale : -INFINITY;
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
      mma_scores_by_tile<DH>(o, sc, Vt);
    }
    __syncthreads();  // every warp is done with this buffer before the copy two tiles on overwrites it
  }
  for (int r = 0; r < 2; ++r) {
    const int64_t i = w0 + g + 8 * r;
    if (i >= s.T) continue;
    SinkRow sr{1.0f, m[r] + logf(l[r])};  // the row's lse; with a sink, lse' and the share its output keeps
    if (sinks) sr = with_sink(sr.lse, sinks[h]);
    bf16* row = out + head_row(b, i, h, s.T, s.Hq, DH);
    for (int nd = 0; nd < DH / 8; ++nd)
      for (int c = 0; c < 2; ++c) {
        float x = o[nd][2 * r + c] / l[r];
        if (sinks) x *= sr.keep;
        store(row + nd * 8 + 2 * t + c, x);
      }
    if (t == 0) lse[(b * s.Hq + h) * s.T + i] = sr.lse;
  }
}

// Di[b, h, t] = Σ_d dO · O and dO rounded to bf16, one warp per (token, head) row: lane sums in d order, then a
// fixed butterfly over the lanes.
__global__ void attention_mma_prepare_kernel(float* Di, bf16* dout_bf16, const float* dout, const bf16* out,
                                             AttentionShape s) {
  const int64_t rows = s.B * s.T * s.Hq, lane = int(threadIdx.x) & 31;
  for (int64_t row = global_thread() / 32; row < rows; row += grid_threads() / 32) {
    float sum = 0.0f;
    for (int64_t d = lane; d < s.D; d += 32) {
      const float x = dout[row * s.D + d];
      dout_bf16[row * s.D + d] = __float2bfloat16_rn(x);
      sum += x * load(out + row * s.D + d);
    }
    for (int width = 16; width >= 1; width /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, width);
    const int64_t h = row % s.Hq, bt = row / s.Hq;
    if (lane == 0) Di[(bt / s.T * s.Hq + h) * s.T + bt % s.T] = sum;
  }
}

// P and dS of fragment element e: row = first16 + g + 8·(e / 2) of the warp's 16, column jcol of the tile's 64.
__device__ __forceinline__ void probability_and_grad(float& s_then_p, float& dp_then_ds, bool valid, float scale,
                                                     float lse, float Di) {
  const float p = valid ? expf(s_then_p * scale - lse) : 0.0f;
  dp_then_ds = p * (dp_then_ds - Di);
  s_then_p = p;
}

// dk, dv: [B, T, Hkv, DH] (G = 1: the results, scaled) or the partials [G, B, T, Hkv, DH] (G > 1: unscaled, head
// h's at h % G); dout: dO in bf16 [B, T, Hq, DH].
template <int DH>
__global__ void __launch_bounds__(kMmaThreads)
    attention_backward_kv_mma_kernel(float* dk, float* dv, const bf16* dout, const float* lse, const float* Di,
                                     const bf16* q, const bf16* k, const bf16* v, const int32_t* doc_ids,
                                     AttentionShape s, float scale) {
  constexpr int NT = kMmaTile / 8, kTile = kMmaTile * (DH + 8);
  bf16* Ks = LT_DYNAMIC_SHARED(bf16);  // [64, DH + 8] this block's keys
  bf16* Vs = Ks + kTile;               // [64, DH + 8]
  bf16* Qs = Vs + kTile;               // [2][64, DH + 8] query tiles i (buffer i % 2)
  bf16* dOs = Qs + 2 * kTile;          // [2][64, DH + 8] their dO
  float* lse_s = reinterpret_cast<float*>(dOs + 2 * kTile);  // [2][64]
  float* Di_s = lse_s + 2 * kMmaTile;                         // [2][64]
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, g = lane >> 2, t = lane & 3;
  const int64_t b = blockIdx.z, h = blockIdx.y, k0 = int64_t(blockIdx.x) * kMmaTile, G = s.Hq / s.Hkv;
  const int64_t hk = h / G;
  const int64_t w0 = k0 + 16 * warp;  // this warp's keys [w0, w0 + 16)
  const float* lse_row = lse + (b * s.Hq + h) * s.T;
  const float* Di_row = Di + (b * s.Hq + h) * s.T;
  auto copy_query_tile = [&](int64_t i) {  // query tile i from the diagonal on, into buffer i % 2
    const int64_t q0 = k0 + i * kMmaTile;
    const int buf = int(i & 1);
    copy_rows_async<DH>(Qs + buf * kTile, q, b, q0, h, s.T, s.Hq);
    copy_rows_async<DH>(dOs + buf * kTile, dout, b, q0, h, s.T, s.Hq);
    copy_stats_async(lse_s + buf * kMmaTile, lse_row, q0, s.T);
    copy_stats_async(Di_s + buf * kMmaTile, Di_row, q0, s.T);
  };
  copy_rows_async<DH>(Ks, k, b, k0, hk, s.T, s.Hkv);
  copy_rows_async<DH>(Vs, v, b, k0, hk, s.T, s.Hkv);
  copy_query_tile(0);
  async_commit();
  float dka[DH / 8][4], dva[DH / 8][4];
  for (int nd = 0; nd < DH / 8; ++nd)
    for (int e = 0; e < 4; ++e) dka[nd][e] = 0.0f, dva[nd][e] = 0.0f;
  const int64_t tiles = (s.T - k0 + kMmaTile - 1) / kMmaTile;
  for (int64_t it = 0; it < tiles; ++it) {
    const int64_t q0 = k0 + it * kMmaTile;
    const int buf = int(it & 1);
    prefetch_next_and_wait(it, tiles, copy_query_tile);
    __syncthreads();
    if (w0 < s.T) {  // warp-uniform
      const bf16* Qt = Qs + buf * kTile;
      const bf16* dOt = dOs + buf * kTile;
      float pt[NT][4], dst[NT][4];  // Sᵀ then Pᵀ, dPᵀ then dSᵀ: [16 keys, 64 queries]
      mma_rows_by_tile<DH>(pt, [&](int kk, uint32_t(&a)[4]) { shared_a_fragment<DH>(a, Ks, 16 * warp, kk); }, Qt);
      mma_rows_by_tile<DH>(dst, [&](int kk, uint32_t(&a)[4]) { shared_a_fragment<DH>(a, Vs, 16 * warp, kk); }, dOt);
      // Every query of the tile at or after every key of the warp and within its window, all inside T, no documents.
      const bool unmasked = doc_ids == nullptr && q0 >= w0 + 15 && q0 + kMmaTile - 1 < s.T &&
                            (s.window <= 0 || q0 + kMmaTile - 1 - w0 < s.window);
      for (int j = 0; j < NT; ++j)
        for (int e = 0; e < 4; ++e) {
          const int64_t key = w0 + g + 8 * (e >> 1);
          const int col = j * 8 + 2 * t + (e & 1);
          const int64_t i = q0 + col;
          const bool valid = unmasked || (key < s.T && i < s.T && attends(doc_ids, b, s.T, i, key, s.window));
          probability_and_grad(pt[j][e], dst[j][e], valid, scale, lse_s[buf * kMmaTile + col],
                               Di_s[buf * kMmaTile + col]);
        }
      mma_scores_by_tile<DH>(dva, pt, dOt);
      mma_scores_by_tile<DH>(dka, dst, Qt);
    }
    __syncthreads();
  }
  const float dk_scale = G == 1 ? scale : 1.0f;  // partials are scaled once summed
  const int64_t part = G == 1 ? 0 : (h % G) * s.B * s.T * s.Hkv * DH;
  for (int r = 0; r < 2; ++r) {
    const int64_t key = w0 + g + 8 * r;
    if (key >= s.T) continue;
    float* dk_row = dk + part + head_row(b, key, hk, s.T, s.Hkv, DH);
    float* dv_row = dv + part + head_row(b, key, hk, s.T, s.Hkv, DH);
    for (int nd = 0; nd < DH / 8; ++nd)
      for (int c = 0; c < 2; ++c) {
        dk_row[nd * 8 + 2 * t + c] = dk_scale * dka[nd][2 * r + c];
        dv_row[nd * 8 + 2 * t + c] = dva[nd][2 * r + c];
      }
  }
}

// dk = scale · Σ_g dk_part[g], dv = Σ_g dv_part[g], summed in head order; n = B·T·Hkv·D.
__global__ void attention_kv_reduce_kernel(float* dk, float* dv, const float* dk_part, const float* dv_part,
                                           int64_t n, int64_t G, float scale) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    float a = dk_part[i], c = dv_part[i];
    for (int64_t g = 1; g < G; ++g) a += dk_part[g * n + i], c += dv_part[g * n + i];
    dk[i] = scale * a;
    dv[i] = c;
  }
}

// dout: dO in bf16 [B, T, Hq, DH].
template <int DH>
__global__ void __launch_bounds__(kMmaThreads)
    attention_backward_q_mma_kernel(float* dq, const bf16* dout, const float* lse, const float* Di, const bf16* q,
                                    const bf16* k, const bf16* v, const int32_t* doc_ids, AttentionShape s,
                                    float scale) {
  constexpr int NT = kMmaTile / 8, kTile = kMmaTile * (DH + 8);
  bf16* Ks = LT_DYNAMIC_SHARED(bf16);  // [2][64, DH + 8]
  bf16* Vs = Ks + 2 * kTile;           // [2][64, DH + 8]
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, g = lane >> 2, t = lane & 3;
  const int64_t q0 = int64_t(gridDim.x - 1 - blockIdx.x) * kMmaTile;  // longest first
  const int64_t b = blockIdx.z, h = blockIdx.y, hk = h / (s.Hq / s.Hkv);
  const int64_t w0 = q0 + 16 * warp;
  const int64_t last_query = (q0 + kMmaTile < s.T ? q0 + kMmaTile : s.T) - 1;
  const int64_t tiles = last_query / kMmaTile + 1;
  auto copy_key_tile = [&](int64_t i) { copy_key_tile_async<DH>(Ks, Vs, k, v, b, i, hk, s); };
  copy_key_tile(0);
  async_commit();
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
  for (int64_t it = 0; it < tiles; ++it) {
    const int64_t k0 = it * kMmaTile;
    const bf16* Kt = Ks + (it & 1) * kTile;
    const bf16* Vt = Vs + (it & 1) * kTile;
    prefetch_next_and_wait(it, tiles, copy_key_tile);
    __syncthreads();
    if (w0 < s.T && k0 <= w0 + 15) {  // warp-uniform
      float p[NT][4], ds[NT][4];
      mma_rows_by_tile<DH>(p, [&](int kk, uint32_t(&a)[4]) { for (int i = 0; i < 4; ++i) a[i] = qf[kk][i]; }, Kt);
      mma_rows_by_tile<DH>(ds, [&](int kk, uint32_t(&a)[4]) { for (int i = 0; i < 4; ++i) a[i] = of[kk][i]; }, Vt);
      const bool unmasked = tile_unmasked(doc_ids, s.T, s.window, w0, k0);
      for (int j = 0; j < NT; ++j)
        for (int e = 0; e < 4; ++e) {
          const int64_t i = w0 + g + 8 * (e >> 1), key = k0 + j * 8 + 2 * t + (e & 1);
          const bool valid = unmasked || (i < s.T && key < s.T && attends(doc_ids, b, s.T, i, key, s.window));
          probability_and_grad(p[j][e], ds[j][e], valid, scale, lse_r[e >> 1], Di_r[e >> 1]);
        }
      mma_scores_by_tile<DH>(dqa, ds, Kt);
    }
    __syncthreads();
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

constexpr size_t attention_mma_forward_shared(int DH) { return 4 * size_t(kMmaTile) * (DH + 8) * sizeof(bf16); }
constexpr size_t attention_mma_backward_kv_shared(int DH) {
  return 6 * size_t(kMmaTile) * (DH + 8) * sizeof(bf16) + 4 * kMmaTile * sizeof(float);
}

template <int DH>
void attention_forward_mma(Stream st, bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                           const int32_t* doc_ids, const float* sinks, AttentionShape s, float scale) {
  check_attention_alignment("attention_forward", {q, k, v});
  const size_t shared = attention_mma_forward_shared(DH);
  allow_shared(attention_forward_mma_kernel<DH>, shared);
  const dim3 grid(unsigned((s.T + kMmaTile - 1) / kMmaTile), unsigned(s.Hq), unsigned(s.B));
  LT_LAUNCH(attention_forward_mma_kernel<DH>, grid, dim3(kMmaThreads), shared, native_stream(st), out, lse, q, k, v,
            doc_ids, sinks, s, scale);
}

template <int DH>
void attention_backward_mma(Stream st, float* dq, float* dk, float* dv, const float* dout, const bf16* out,
                            const float* lse, const bf16* q, const bf16* k, const bf16* v, const int32_t* doc_ids,
                            AttentionShape s, float scale, void* workspace) {
  const AttentionMmaWorkspace w = AttentionMmaWorkspace::carve(workspace, s);
  bf16* dout_bf16 = dev(w.dout);
  check_attention_alignment("attention_backward", {q, k, v, dout_bf16, w.Di});
  const int64_t rows = s.B * s.T * s.Hq, G = s.Hq / s.Hkv;
  LT_LAUNCH(attention_mma_prepare_kernel, dim3(elementwise_blocks(rows * 32)), dim3(kElementwiseThreads), 0,
            native_stream(st), w.Di, dout_bf16, dout, out, s);
  const unsigned tiles = unsigned((s.T + kMmaTile - 1) / kMmaTile);
  const size_t kv_shared = attention_mma_backward_kv_shared(DH), q_shared = attention_mma_forward_shared(DH);
  allow_shared(attention_backward_kv_mma_kernel<DH>, kv_shared);
  allow_shared(attention_backward_q_mma_kernel<DH>, q_shared);
  LT_LAUNCH(attention_backward_kv_mma_kernel<DH>, dim3(tiles, unsigned(s.Hq), unsigned(s.B)), dim3(kMmaThreads),
            kv_shared, native_stream(st), G == 1 ? dk : w.dk_part, G == 1 ? dv : w.dv_part, dout_bf16, lse, w.Di, q,
            k, v, doc_ids, s, scale);
  if (G > 1) {
    const int64_t n = s.B * s.T * s.Hkv * DH;
    LT_LAUNCH(attention_kv_reduce_kernel, dim3(elementwise_blocks(n)), dim3(kElementwiseThreads), 0, native_stream(st),
              dk, dv, w.dk_part, w.dv_part, n, G, scale);
  }
  LT_LAUNCH(attention_backward_q_mma_kernel<DH>, dim3(tiles, unsigned(s.Hq), unsigned(s.B)), dim3(kMmaThreads),
            q_shared, native_stream(st), dq, dout_bf16, lse, w.Di, q, k, v, doc_ids, s, scale);
}

}  // namespace detail
}  // namespace lt::cuda::LT_KERNELS_NS
