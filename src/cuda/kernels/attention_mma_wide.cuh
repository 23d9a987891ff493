// cuda/kernels/attention_mma_wide.cuh — the dK/dV pass of tensor-core attention at head dim 256 (Qwen3.5 /
// Qwen3.6's full-attention layers), and at 128 where shared memory is short. At DH ≤ 128 a warp owns 16 keys and
// accumulates their whole dK and dV rows (attention_mma.cuh); at 256 those two accumulators alone would take 256
// registers a thread. So the block's work is split two ways: scores by (keys, queries), accumulation by (keys, dims).
//
//   block    (32-key tile, query head, batch row), 4 warps; K, V of the block in shared [32, 264] each.
//   per query tile of 32 from the diagonal on (Q, dO [32, 264] and lse, Di [32] copied in by cp.async):
//     scores       warp w: keys 16 (w % 2) .. + 16, queries 16 (w / 2) .. + 16 of the tile —
//                  Sᵀ = K Qᵀ, dPᵀ = V dOᵀ, Pᵀ and dSᵀ as attention_mma.cuh, rounded to bf16 into shared
//                  Pᵀ, dSᵀ [32 keys, 40] (the same rounding points as the narrow kernels' P and dS fragments).
//     accumulate   warp w: keys 16 (w % 2) .. + 16, dims DH/2 · (w / 2) .. + DH/2 —
//                  dV += Pᵀ dO, dK += dSᵀ Q (A fragments from the shared Pᵀ, dSᵀ; B by transposed ldmatrix):
//                  64 + 64 accumulator registers a thread.
// Every sum in a fixed order (query k-steps of 16 in ascending order, as the narrow kernel's), no atomics; grouped
// heads write per-head partials that attention_kv_reduce_kernel sums in head order. Shared memory 72960 bytes,
// within sm_86 / sm_89's 99 KiB; the query tile is single-buffered (a second one would not fit there).
//
// Head dim 128 runs here too on GPUs whose blocks cannot opt into the narrow kernel's 137 KiB (sm_86 / sm_89: 99
// KiB): 40192 bytes, dims 64 (w / 2) .. + 64 per warp.
#pragma once

#include "cuda/kernels/attention_mma_tiles.cuh"

namespace lt::cuda::LT_KERNELS_NS {

constexpr int kWideKeys = 32;     // keys per dK/dV block at DH = 256
constexpr int kWideQueries = 32;  // queries per tile of its loop

// Shared bytes of the wide dK/dV block: K, V, Q, dO tiles, Pᵀ and dSᵀ, lse and Di.
constexpr size_t attention_mma_backward_kv_wide_shared(int DH) {
  return 2 * size_t(kWideKeys + kWideQueries) * (DH + 8) * sizeof(bf16) +
         2 * size_t(kWideKeys) * (kWideQueries + 8) * sizeof(bf16) + 2 * size_t(kWideQueries) * sizeof(float);
}

// dk, dv: as attention_backward_kv_mma_kernel (results or partials); dout: dO in bf16 [B, T, Hq, DH].
template <int DH>
__global__ void __launch_bounds__(kMmaThreads)
    attention_backward_kv_wide_mma_kernel(float* dk, float* dv, const bf16* dout, const float* lse, const float* Di,
                                          const bf16* q, const bf16* k, const bf16* v, const int32_t* doc_ids,
                                          AttentionShape s, float scale) {
  static_assert(DH == 128 || DH == 256, "head dim 64 takes attention_backward_kv_mma_kernel");
  // ND: a warp's 8-dim column tiles (half of DH)
  constexpr int S = DH + 8, BK = kWideKeys, BQ = kWideQueries, PS = BQ + 8, ND = DH / 16;
  bf16* Ks = LT_DYNAMIC_SHARED(bf16);  // [BK, S] this block's keys
  bf16* Vs = Ks + BK * S;              // [BK, S]
  bf16* Qs = Vs + BK * S;              // [BQ, S] the query tile
  bf16* dOs = Qs + BQ * S;             // [BQ, S] its dO
  bf16* Ps = dOs + BQ * S;             // [BK, PS] Pᵀ (bf16), row = key, column = query of the tile
  bf16* dSs = Ps + BK * PS;            // [BK, PS] dSᵀ
  float* lse_s = reinterpret_cast<float*>(dSs + BK * PS);  // [BQ]
  float* Di_s = lse_s + BQ;                                 // [BQ]
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, g = lane >> 2, t = lane & 3;
  const int64_t b = blockIdx.z, h = blockIdx.y, k0 = int64_t(blockIdx.x) * BK;
  const int64_t hk = h / (s.Hq / s.Hkv);
  const int kr = 16 * (warp & 1);          // the warp's keys [kr, kr + 16) of the block, in both phases
  const int qc = 16 * (warp >> 1);         // scores: its queries [qc, qc + 16) of the tile
  const int dc = (DH / 2) * (warp >> 1);   // accumulation: its dims [dc, dc + DH / 2)
  const int64_t w0 = k0 + kr;
  const float* lse_row = lse + (b * s.Hq + h) * s.T;
  const float* Di_row = Di + (b * s.Hq + h) * s.T;
  copy_rows_async<DH, BK>(Ks, k, b, k0, hk, s.T, s.Hkv);
  copy_rows_async<DH, BK>(Vs, v, b, k0, hk, s.T, s.Hkv);
  float dka[ND][4], dva[ND][4];
  for (int nd = 0; nd < ND; ++nd)
    for (int e = 0; e < 4; ++e) dka[nd][e] = 0.0f, dva[nd][e] = 0.0f;
  // The query tiles from the diagonal to the end of the last key's document (after it no query attends).
  const int64_t last_key = (k0 + BK < s.T ? k0 + BK : s.T) - 1;
  const int64_t end = doc_ids ? warp_document_end(doc_ids + b * s.T, last_key, s.T) : s.T;
  const int64_t tiles = (end - k0 + BQ - 1) / BQ;
  const FragmentMask<false> mask(doc_ids, b, s, w0);
  for (int64_t it = 0; it < tiles; ++it) {
    const int64_t q0 = k0 + it * BQ;
    copy_rows_async<DH, BQ>(Qs, q, b, q0, h, s.T, s.Hq);
    copy_rows_async<DH, BQ>(dOs, dout, b, q0, h, s.T, s.Hq);
    copy_stats_async<BQ>(lse_s, lse_row, q0, s.T);
    copy_stats_async<BQ>(Di_s, Di_row, q0, s.T);
    async_commit();
    async_wait<0>();
    __syncthreads();  // the tile's copies, by every thread, have landed
    if (w0 < s.T) {   // warp-uniform; a warp past T leaves its keys' rows of Pᵀ, dSᵀ unread by any written result
      float pt[2][4], dst[2][4];  // Sᵀ then Pᵀ, dPᵀ then dSᵀ: [16 keys, 16 queries]
      mma_rows_by_tile<DH>(pt, shared_a<S>(Ks, kr), Qs + qc * S);
      mma_rows_by_tile<DH>(dst, shared_a<S>(Vs, kr), dOs + qc * S);
      const int64_t i0 = q0 + qc;  // the warp's first query
      const bool unmasked =
          doc_ids == nullptr && i0 >= w0 + 15 && i0 + 15 < s.T && (s.window <= 0 || i0 + 15 - w0 < s.window);
      for (int j = 0; j < 2; ++j)
        for (int c = 0; c < 2; ++c) {
          const int col = qc + j * 8 + 2 * t + c, i = int(q0) + col;
          const int i_doc = unmasked ? 0 : mask.column_doc(i);
          for (int r = 0; r < 2; ++r)
            probability_and_grad(pt[j][2 * r + c], dst[j][2 * r + c], unmasked || mask.valid(r, i, i_doc), scale,
                                 lse_s[col], Di_s[col]);
        }
      for (int j = 0; j < 2; ++j)
        for (int r = 0; r < 2; ++r) {
          const int at = (kr + g + 8 * r) * PS + qc + j * 8 + 2 * t;
          *reinterpret_cast<uint32_t*>(Ps + at) = pack_bf16(pt[j][2 * r], pt[j][2 * r + 1]);
          *reinterpret_cast<uint32_t*>(dSs + at) = pack_bf16(dst[j][2 * r], dst[j][2 * r + 1]);
        }
    }
    __syncthreads();  // Pᵀ, dSᵀ of the whole tile are in shared
    if (w0 < s.T) {
      mma_accumulate_by_tile<BQ / 16, ND, S>(dva, shared_a<PS>(Ps, kr), dOs + dc);
      mma_accumulate_by_tile<BQ / 16, ND, S>(dka, shared_a<PS>(dSs, kr), Qs + dc);
    }
    __syncthreads();  // every warp is done with Q, dO, Pᵀ, dSᵀ before the next tile's copies overwrite them
  }
  store_key_grads<DH>(dk, dv, dka, dva, b, w0, dc, h, s, scale);
}

}  // namespace lt::cuda::LT_KERNELS_NS
