// cuda/kernels/attention_mma.cuh — causal GQA attention on tensor cores (cuda/kernels/mma.cuh), for bf16
// storage and head dims 64 and 128 (attention.cuh's CUDA-core kernels take every other case). The algorithm is
// attention.cuh's (FlashAttention 2's, with the two-pass deterministic backward); what changes is who multiplies:
// every product is a warp's m16n8k16 bf16 mma with f32 accumulation. So the operands the products read are bf16:
// P = exp(S - m) and dS are rounded to bf16 before P·V, Pᵀ·dO, dSᵀ·Q and dS·K, and dO (f32) is rounded to bf16
// once, into the workspace — FlashAttention's rounding points. Softmax statistics (m, l, lse), Di and every accumulator
// stay f32. No atomics, every sum in a fixed order: a run's bits do not depend on scheduling.
//
// Tiles: 128 query rows (forward, dQ; 64 at DH = 256) or 128 keys (dK, dV) per block, a warp owning 16 of them —
// or, in the forward at DH ≤ 128, 32 (two m-tiles, ForwardTiles; attention_forward_warp_rows()); 64 keys a tile
// of the forward and dQ loops, 64 queries of the dK / dV loop. Masks: FragmentMask (a row's interval of columns
// and its document, once), and tiles wholly inside the causal triangle without documents skip it.
// Tiles stream into shared memory by cp.async (async_copy.cuh), double-buffered: tile i + 1 is copied while tile
// i is multiplied. Fragments come out of shared memory by ldmatrix (mma.cuh). Shared rows are DH + 8 bf16 long,
// so the 8 rows an ldmatrix reads fall on different banks. Blocks with the most tiles (the causal mask's long
// rows) are launched first.
//   forward  block (query tile, query head, batch row): Q fragments in registers (16-row warps) or Q in shared
//            (32-row warps: each K, V fragment feeds both m-tiles); per key tile K, V in shared;
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

#include <algorithm>

#include "cuda/kernels/attention_mma_tiles.cuh"
#include "cuda/kernels/attention_mma_wide.cuh"


namespace lt::cuda::LT_KERNELS_NS {

// One m-tile's step of the online softmax over a key tile: its scores sc (rows r0 + g and r0 + g + 8, keys k0 on)
// scaled and masked, then P = exp(S − m) in their place; the rows' running maximum m and sum l, and o rescaled.
template <int NT, int ND>
__device__ __forceinline__ void online_softmax_step(float (&sc)[NT][4], float (&m)[2], float (&l)[2],
                                                    float (&o)[ND][4], const int32_t* doc_ids, int64_t b,
                                                    const AttentionShape& s, int64_t r0, int64_t k0, float scale) {
  const int t = int(threadIdx.x) & 3;
  const bool unmasked = tile_unmasked(doc_ids, s.T, s.window, r0, k0, 8 * NT);
  // Made each tile, not once a warp as in the backward: held across the key loop its registers would push two
  // m-tiles' accumulators over 255 (a spill), and its two document loads a tile are few.
  const FragmentMask<true> mask(doc_ids, b, s, r0);
  float mx[2] = {-INFINITY, -INFINITY};
  for (int j = 0; j < NT; ++j)
    for (int c = 0; c < 2; ++c) {
      const int key = int(k0) + j * 8 + 2 * t + c;
      const int key_doc = unmasked ? 0 : mask.column_doc(key);
      for (int r = 0; r < 2; ++r) {
        const float x = unmasked || mask.valid(r, key, key_doc) ? sc[j][2 * r + c] * scale : -INFINITY;
        sc[j][2 * r + c] = x;
        mx[r] = fmaxf(mx[r], x);
      }
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
  for (int nd = 0; nd < ND; ++nd)
    for (int e = 0; e < 4; ++e) o[nd][e] *= alpha[e >> 1];
}

// MT m-tiles a warp (ForwardTiles). Each m-tile's rows see the keys, products and softmax steps a one-m-tile warp
// gives them, in the same order, so MT = 1 and 2 give the same bits.
template <int DH, int MT>
__global__ void __launch_bounds__(ForwardTiles<DH, MT>::kThreads)
    attention_forward_mma_kernel(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                                 const int32_t* doc_ids, const float* sinks, AttentionShape s, float scale) {
  using Tiles = MmaTiles<DH>;
  using Block = ForwardTiles<DH, MT>;
  constexpr int BN = Tiles::kForwardKeys, NT = BN / 8, S = Tiles::kStride, kTile = BN * S, QR = Block::kRows;
  bf16* Ks = LT_DYNAMIC_SHARED(bf16);  // [2][BN, S]: key tiles i (buffer i % 2)
  bf16* Vs = Ks + 2 * kTile;           // [2][BN, S]
  bf16* Qs = Vs + 2 * kTile;           // [QR, S] the block's queries (Block::kQShared only)
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, g = lane >> 2, t = lane & 3;
  const int64_t q0 = int64_t(gridDim.x - 1 - blockIdx.x) * QR;  // the last query tiles have most keys
  const int64_t b = blockIdx.z, h = blockIdx.y, hk = h / (s.Hq / s.Hkv);
  const int64_t w0 = q0 + 16 * MT * warp;  // this warp's rows [w0, w0 + 16 MT): m-tile mt's from w0 + 16 mt
  const int64_t last_query = (q0 + QR < s.T ? q0 + QR : s.T) - 1;
  const int64_t tiles = last_query / BN + 1;
  const int64_t first = doc_ids ? warp_document_first(doc_ids + b * s.T, q0) / BN : 0;  // before it no row attends
  auto copy_key_tile = [&](int64_t i) { copy_key_tile_async<DH, BN>(Ks, Vs, k, v, b, i, hk, s); };
  copy_key_tile(first);
  uint32_t qf[Block::kQShared ? 1 : DH / 16][4];
  if constexpr (Block::kQShared) copy_rows_async<DH, QR>(Qs, q, b, q0, h, s.T, s.Hq);  // with key tile `first`
  else load_a_fragments<DH>(qf, q, b, w0, h, s.T, s.Hq);
  async_commit();
  float o[MT][DH / 8][4];
  for (int mt = 0; mt < MT; ++mt)
    for (int nd = 0; nd < DH / 8; ++nd)
      for (int e = 0; e < 4; ++e) o[mt][nd][e] = 0.0f;
  float m[MT][2], l[MT][2];  // rows g and g + 8 of each m-tile
  for (int mt = 0; mt < MT; ++mt)
    for (int r = 0; r < 2; ++r) m[mt][r] = -INFINITY, l[mt][r] = 0.0f;
  for (int64_t it = first; it < tiles; ++it) {
    const int64_t k0 = it * BN;
    const bf16* Kt = Ks + (it & 1) * kTile;
    const bf16* Vt = Vs + (it & 1) * kTile;
    prefetch_next_and_wait(it, tiles, copy_key_tile);
    __syncthreads();  // this tile's copies, by every thread, have landed
    bool active[MT], any = false;  // warp-uniform: not every key of the tile after every row of the m-tile
    LT_UNROLL for (int mt = 0; mt < MT; ++mt) {
      const int64_t r0 = w0 + 16 * mt;
      active[mt] = r0 < s.T && k0 <= r0 + 15;
      any = any || active[mt];
    }
    if (any) {
      float sc[MT][NT][4];
      if constexpr (Block::kQShared)
        mma_m_tiles_by_tile<DH, NT, MT>(
            sc, active, [&](int mt, int kk, uint32_t(&a)[4]) { shared_a_fragment<S>(a, Qs, 16 * (MT * warp + mt), kk); },
            Kt);
      else
        mma_m_tiles_by_tile<DH, NT, MT>(sc, active, [&](int, int kk, uint32_t(&a)[4]) { register_a(qf)(kk, a); }, Kt);
      LT_UNROLL for (int mt = 0; mt < MT; ++mt)
        if (active[mt])
          online_softmax_step(sc[mt], m[mt], l[mt], o[mt], doc_ids, b, s, w0 + 16 * mt, k0, scale);
      mma_m_tiles_accumulate_by_tile<BN / 16, DH / 8, S, MT>(
          o, active, [&](int mt, int kk, uint32_t(&a)[4]) { c_fragments_as_a(sc[mt])(kk, a); }, Vt);
    }
    __syncthreads();  // every warp is done with this buffer before the copy two tiles on overwrites it
  }
  // Each m-tile's rows g and g + 8 by a call each, not a loop, which nvcc did not unroll: o's indices must be
  // constants or o goes through local memory (a 272-byte stack frame at DH = 128, 528 at 256: stored after the key
  // loop and loaded back here, a thread's 64 or 128 floats a block).
  auto write_row = [&](int mt, int r) {
    const int64_t i = w0 + 16 * mt + g + 8 * r;
    if (i >= s.T) return;
    SinkRow sr{1.0f, m[mt][r] + logf(l[mt][r])};  // the row's lse; with a sink, lse' and the share its output keeps
    if (sinks) sr = with_sink(sr.lse, sinks[h]);
    bf16* row = out + head_row(b, i, h, s.T, s.Hq, DH);
    for (int nd = 0; nd < DH / 8; ++nd)
      for (int c = 0; c < 2; ++c) {
        float x = o[mt][nd][2 * r + c] / l[mt][r];
        if (sinks) x *= sr.keep;
        store(row + nd * 8 + 2 * t + c, x);
      }
    if (t == 0) lse[(b * s.Hq + h) * s.T + i] = sr.lse;
  };
  write_row(0, 0);
  write_row(0, 1);
  if constexpr (MT == 2) {
    write_row(1, 0);
    write_row(1, 1);
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

// dk, dv: [B, T, Hkv, DH] (G = 1: the results, scaled) or the partials [G, B, T, Hkv, DH] (G > 1: unscaled, head
// h's at h % G); dout: dO in bf16 [B, T, Hq, DH].
template <int DH>
__global__ void __launch_bounds__(MmaTiles<DH>::kKeyThreads)
    attention_backward_kv_mma_kernel(float* dk, float* dv, const bf16* dout, const float* lse, const float* Di,
                                     const bf16* q, const bf16* k, const bf16* v, const int32_t* doc_ids,
                                     AttentionShape s, float scale) {
  static_assert(!MmaTiles<DH>::kWide, "DH = 256 takes attention_backward_kv_wide_mma_kernel");
  constexpr int NT = kMmaTile / 8, kTile = kMmaTile * (DH + 8), KB = MmaTiles<DH>::kKeyRows;
  bf16* Ks = LT_DYNAMIC_SHARED(bf16);  // [KB, DH + 8] this block's keys
  bf16* Vs = Ks + KB * (DH + 8);       // [KB, DH + 8]
  bf16* Qs = Vs + KB * (DH + 8);       // [2][64, DH + 8] query tiles i (buffer i % 2)
  bf16* dOs = Qs + 2 * kTile;          // [2][64, DH + 8] their dO
  float* lse_s = reinterpret_cast<float*>(dOs + 2 * kTile);  // [2][64]
  float* Di_s = lse_s + 2 * kMmaTile;                         // [2][64]
  const int warp = int(threadIdx.x) >> 5, t = int(threadIdx.x) & 3;
  const int64_t b = blockIdx.z, h = blockIdx.y, k0 = int64_t(blockIdx.x) * KB;
  const int64_t hk = h / (s.Hq / s.Hkv);
  const int64_t w0 = k0 + 16 * warp;  // this warp's keys [w0, w0 + 16)
  const float* lse_row = lse + (b * s.Hq + h) * s.T;
  const float* Di_row = Di + (b * s.Hq + h) * s.T;
  auto copy_query_tile = [&](int64_t i) {  // query tile i from the diagonal on, into buffer i % 2
    const int64_t q0 = k0 + i * kMmaTile;
    const int buf = int(i & 1);
    copy_rows_async<DH, kMmaTile>(Qs + buf * kTile, q, b, q0, h, s.T, s.Hq);
    copy_rows_async<DH, kMmaTile>(dOs + buf * kTile, dout, b, q0, h, s.T, s.Hq);
    copy_stats_async<kMmaTile>(lse_s + buf * kMmaTile, lse_row, q0, s.T);
    copy_stats_async<kMmaTile>(Di_s + buf * kMmaTile, Di_row, q0, s.T);
  };
  copy_rows_async<DH, KB>(Ks, k, b, k0, hk, s.T, s.Hkv);
  copy_rows_async<DH, KB>(Vs, v, b, k0, hk, s.T, s.Hkv);
  copy_query_tile(0);
  async_commit();
  // The query tiles from the diagonal to the end of the last key's document (after it no query attends).
  const int64_t last_key = (k0 + KB < s.T ? k0 + KB : s.T) - 1;
  const int64_t end = doc_ids ? warp_document_end(doc_ids + b * s.T, last_key, s.T) : s.T;
  const int tiles = int((end - k0 + kMmaTile - 1) / kMmaTile);
  float dka[DH / 8][4], dva[DH / 8][4];
  for (int nd = 0; nd < DH / 8; ++nd)
    for (int e = 0; e < 4; ++e) dka[nd][e] = 0.0f, dva[nd][e] = 0.0f;
  const FragmentMask<false> mask(doc_ids, b, s, w0);
  for (int it = 0; it < tiles; ++it) {
    const int64_t q0 = k0 + int64_t(it) * kMmaTile;
    const int buf = int(it & 1);
    prefetch_next_and_wait(it, tiles, copy_query_tile);
    __syncthreads();
    // Warp-uniform: a warp's first tile is the one holding its first key (the tiles wholly before it, which the
    // block's earlier warps need, would add only zeros), so it sums the tiles a 64-key block would, in order.
    if (w0 < s.T && q0 + kMmaTile - 1 >= w0) {
      const bf16* Qt = Qs + buf * kTile;
      const bf16* dOt = dOs + buf * kTile;
      float pt[NT][4], dst[NT][4];  // Sᵀ then Pᵀ, dPᵀ then dSᵀ: [16 keys, 64 queries]
      mma_rows_by_tile<DH>(pt, shared_a<DH + 8>(Ks, 16 * warp), Qt);
      mma_rows_by_tile<DH>(dst, shared_a<DH + 8>(Vs, 16 * warp), dOt);
      // Every query of the tile at or after every key of the warp and within its window, all inside T, no documents.
      const bool unmasked = doc_ids == nullptr && q0 >= w0 + 15 && q0 + kMmaTile - 1 < s.T &&
                            (s.window <= 0 || q0 + kMmaTile - 1 - w0 < s.window);
      for (int j = 0; j < NT; ++j)
        for (int c = 0; c < 2; ++c) {
          const int col = j * 8 + 2 * t + c, i = int(q0) + col;
          const int i_doc = unmasked ? 0 : mask.column_doc(i);
          for (int r = 0; r < 2; ++r)
            probability_and_grad(pt[j][2 * r + c], dst[j][2 * r + c], unmasked || mask.valid(r, i, i_doc), scale,
                                 lse_s[buf * kMmaTile + col], Di_s[buf * kMmaTile + col]);
        }
      mma_accumulate_by_tile<kMmaTile / 16, DH / 8, DH + 8>(dva, c_fragments_as_a(pt), dOt);
      mma_accumulate_by_tile<kMmaTile / 16, DH / 8, DH + 8>(dka, c_fragments_as_a(dst), Qt);
    }
    __syncthreads();
  }
  store_key_grads<DH>(dk, dv, dka, dva, b, w0, 0, h, s, scale);
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
__global__ void __launch_bounds__(MmaTiles<DH>::kQueryThreads)
    attention_backward_q_mma_kernel(float* dq, const bf16* dout, const float* lse, const float* Di, const bf16* q,
                                    const bf16* k, const bf16* v, const int32_t* doc_ids, AttentionShape s,
                                    float scale) {
  using Tiles = MmaTiles<DH>;
  constexpr int BN = Tiles::kDqKeys, NT = BN / 8, S = Tiles::kStride, kTile = BN * S, QR = Tiles::kQueryRows;
  bf16* Ks = LT_DYNAMIC_SHARED(bf16);  // [2][BN, S]: key tiles i (buffer i % 2)
  bf16* Vs = Ks + 2 * kTile;           // [2][BN, S]
  bf16* Qs = Vs + 2 * kTile;           // [QR, S] the block's queries (wide head dims only)
  bf16* dOs = Qs + QR * S;             // [QR, S] their dO (wide head dims only)
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, g = lane >> 2, t = lane & 3;
  const int64_t q0 = int64_t(gridDim.x - 1 - blockIdx.x) * QR;  // longest first
  const int64_t b = blockIdx.z, h = blockIdx.y, hk = h / (s.Hq / s.Hkv);
  const int64_t w0 = q0 + 16 * warp;
  const int64_t last_query = (q0 + QR < s.T ? q0 + QR : s.T) - 1;
  const int64_t tiles = last_query / BN + 1;
  const int64_t first = doc_ids ? warp_document_first(doc_ids + b * s.T, q0) / BN : 0;  // before it no row attends
  auto copy_key_tile = [&](int64_t i) { copy_key_tile_async<DH, BN>(Ks, Vs, k, v, b, i, hk, s); };
  copy_key_tile(first);
  uint32_t qf[Tiles::kWide ? 1 : DH / 16][4], of[Tiles::kWide ? 1 : DH / 16][4];
  if constexpr (Tiles::kWide) {  // with key tile `first`
    copy_rows_async<DH, QR>(Qs, q, b, q0, h, s.T, s.Hq);
    copy_rows_async<DH, QR>(dOs, dout, b, q0, h, s.T, s.Hq);
  } else {
    load_a_fragments<DH>(qf, q, b, w0, h, s.T, s.Hq);
    load_a_fragments<DH>(of, dout, b, w0, h, s.T, s.Hq);
  }
  async_commit();
  float lse_r[2], Di_r[2];
  for (int r = 0; r < 2; ++r) {
    const int64_t i = w0 + g + 8 * r;
    lse_r[r] = i < s.T ? lse[(b * s.Hq + h) * s.T + i] : 0.0f;
    Di_r[r] = i < s.T ? Di[(b * s.Hq + h) * s.T + i] : 0.0f;
  }
  float dqa[DH / 8][4];
  for (int nd = 0; nd < DH / 8; ++nd)
    for (int e = 0; e < 4; ++e) dqa[nd][e] = 0.0f;
  const FragmentMask<true> mask(doc_ids, b, s, w0);
  for (int64_t it = first; it < tiles; ++it) {
    const int64_t k0 = it * BN;
    const bf16* Kt = Ks + (it & 1) * kTile;
    const bf16* Vt = Vs + (it & 1) * kTile;
    prefetch_next_and_wait(it, tiles, copy_key_tile);
    __syncthreads();
    if (w0 < s.T && k0 <= w0 + 15) {  // warp-uniform
      float p[NT][4], ds[NT][4];
      if constexpr (Tiles::kWide) {
        mma_rows_by_tile<DH>(p, shared_a<S>(Qs, 16 * warp), Kt);
        mma_rows_by_tile<DH>(ds, shared_a<S>(dOs, 16 * warp), Vt);
      } else {
        mma_rows_by_tile<DH>(p, register_a(qf), Kt);
        mma_rows_by_tile<DH>(ds, register_a(of), Vt);
      }
      const bool unmasked = tile_unmasked(doc_ids, s.T, s.window, w0, k0, BN);
      for (int j = 0; j < NT; ++j)
        for (int c = 0; c < 2; ++c) {
          const int key = int(k0) + j * 8 + 2 * t + c;
          const int key_doc = unmasked ? 0 : mask.column_doc(key);
          for (int r = 0; r < 2; ++r)
            probability_and_grad(p[j][2 * r + c], ds[j][2 * r + c], unmasked || mask.valid(r, key, key_doc), scale,
                                 lse_r[r], Di_r[r]);
        }
      mma_accumulate_by_tile<BN / 16, DH / 8, S>(dqa, c_fragments_as_a(ds), Kt);
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

template <int DH, int MT = 1>
constexpr size_t attention_mma_forward_shared() {
  using Tiles = MmaTiles<DH>;
  using Block = ForwardTiles<DH, MT>;
  return (4 * size_t(Tiles::kForwardKeys) + (Block::kQShared ? Block::kRows : 0)) * Tiles::kStride * sizeof(bf16);
}
template <int DH>
constexpr size_t attention_mma_backward_q_shared() {
  using Tiles = MmaTiles<DH>;
  return (4 * size_t(Tiles::kDqKeys) + (Tiles::kWide ? 2 * Tiles::kQueryRows : 0)) * Tiles::kStride * sizeof(bf16);
}
// The narrow dK/dV block's (DH ≤ 128; the wide one's is attention_mma_backward_kv_wide_shared).
template <int DH>
constexpr size_t attention_mma_backward_kv_shared() {
  return (2 * size_t(MmaTiles<DH>::kKeyRows) + 4 * kMmaTile) * (DH + 8) * sizeof(bf16) + 4 * kMmaTile * sizeof(float);
}
// Every block the launchers pick fits the 99 KiB an sm_86 / sm_89 block may opt into, but the narrow dK/dV block
// (137 KiB; the wide one takes its place there) and the forward's 32-row warps (102 KiB; 16-row ones) at head dim 128.
static_assert(attention_mma_forward_shared<256>() <= kSm89BlockSharedBytes &&
              attention_mma_forward_shared<64, 2>() <= kSm89BlockSharedBytes &&
              attention_mma_forward_shared<128, 2>() > kSm89BlockSharedBytes &&
              attention_mma_backward_q_shared<256>() <= kSm89BlockSharedBytes &&
              attention_mma_backward_kv_wide_shared(256) <= kSm89BlockSharedBytes &&
              attention_mma_forward_shared<128>() <= kSm89BlockSharedBytes &&
              attention_mma_backward_q_shared<128>() <= kSm89BlockSharedBytes &&
              attention_mma_backward_kv_shared<128>() > kSm89BlockSharedBytes);

template <int DH, int MT>
void launch_attention_forward_mma(Stream st, bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                                  const int32_t* doc_ids, const float* sinks, AttentionShape s, float scale) {
  const size_t shared = attention_mma_forward_shared<DH, MT>();
  allow_shared(attention_forward_mma_kernel<DH, MT>, shared);
  using Block = ForwardTiles<DH, MT>;
  const dim3 grid(unsigned((s.T + Block::kRows - 1) / Block::kRows), unsigned(s.Hq), unsigned(s.B));
  LT_LAUNCH((attention_forward_mma_kernel<DH, MT>), grid, dim3(Block::kThreads), shared, native_stream(st), out, lse,
            q, k, v, doc_ids, sinks, s, scale);
}

// The forward takes warps of attention_forward_warp_rows() (16 or 32) at head dims 64 and 128 where the 32-row
// block's shared memory fits what the GPU's blocks may opt into (not sm_86 / sm_89 at 128), else warps of 16.
template <int DH>
void attention_forward_mma(Stream st, bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                           const int32_t* doc_ids, const float* sinks, AttentionShape s, float scale) {
  check_attention_alignment("attention_forward", {q, k, v});
  if constexpr (DH <= 128) {
    if (attention_forward_warp_rows() == 32 && attention_mma_forward_shared<DH, 2>() <= max_block_shared_bytes())
      return launch_attention_forward_mma<DH, 2>(st, out, lse, q, k, v, doc_ids, sinks, s, scale);
  }
  launch_attention_forward_mma<DH, 1>(st, out, lse, q, k, v, doc_ids, sinks, s, scale);
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
  const unsigned key_blocks = unsigned((s.T + MmaTiles<DH>::kKeyRows - 1) / MmaTiles<DH>::kKeyRows);
  const size_t kv_shared = attention_mma_backward_kv_shared<DH>(), q_shared = attention_mma_backward_q_shared<DH>();
  // The dK/dV pass: the wide kernel at head dim 256, and at 128 where the narrow block's 137 KiB of shared memory
  // exceed what the GPU's blocks may opt into (sm_86 / sm_89: 99 KiB).
  const bool wide = DH == 256 || (DH == 128 && kv_shared > max_block_shared_bytes());
  // Rows [b0, b0 + r.B) of the batch into dk_out, dv_out (their first row's).
  auto launch_kv = [&](int64_t b0, AttentionShape r, float* dk_out, float* dv_out) {
    const int64_t qo = b0 * s.T * s.Hq * DH, kvo = b0 * s.T * s.Hkv * DH, so = b0 * s.Hq * s.T;
    const int32_t* docs = doc_ids ? doc_ids + b0 * s.T : nullptr;
    if (wide) {
      if constexpr (DH >= 128) {
        const size_t wide_shared = attention_mma_backward_kv_wide_shared(DH);
        const unsigned key_tiles = unsigned((s.T + kWideKeys - 1) / kWideKeys);
        allow_shared(attention_backward_kv_wide_mma_kernel<DH>, wide_shared);
        LT_LAUNCH(attention_backward_kv_wide_mma_kernel<DH>, dim3(key_tiles, unsigned(s.Hq), unsigned(r.B)),
                  dim3(kMmaThreads), wide_shared, native_stream(st), dk_out, dv_out, dout_bf16 + qo, lse + so,
                  w.Di + so, q + qo, k + kvo, v + kvo, docs, r, scale);
      }
    } else if constexpr (DH <= 128) {
      allow_shared(attention_backward_kv_mma_kernel<DH>, kv_shared);
      LT_LAUNCH(attention_backward_kv_mma_kernel<DH>, dim3(key_blocks, unsigned(s.Hq), unsigned(r.B)),
                dim3(MmaTiles<DH>::kKeyThreads), kv_shared, native_stream(st), dk_out, dv_out, dout_bf16 + qo, lse + so, w.Di + so,
                q + qo, k + kvo, v + kvo, docs, r, scale);
    }
  };
  if (G == 1) {
    launch_kv(0, s, dk, dv);
  } else {  // per group of rows: each query head's partials, then their sum in head order
    for (int64_t b0 = 0; b0 < s.B; b0 += w.partial_rows) {
      AttentionShape r = s;
      r.B = std::min(w.partial_rows, s.B - b0);
      launch_kv(b0, r, w.dk_part, w.dv_part);
      const int64_t n = r.B * s.T * s.Hkv * DH;
      LT_LAUNCH(attention_kv_reduce_kernel, dim3(elementwise_blocks(n)), dim3(kElementwiseThreads), 0,
                native_stream(st), dk + b0 * s.T * s.Hkv * DH, dv + b0 * s.T * s.Hkv * DH, w.dk_part, w.dv_part, n,
                G, scale);
    }
  }
  using Tiles = MmaTiles<DH>;
  allow_shared(attention_backward_q_mma_kernel<DH>, q_shared);
  const unsigned q_blocks = unsigned((s.T + Tiles::kQueryRows - 1) / Tiles::kQueryRows);
  LT_LAUNCH(attention_backward_q_mma_kernel<DH>, dim3(q_blocks, unsigned(s.Hq), unsigned(s.B)),
            dim3(Tiles::kQueryThreads), q_shared, native_stream(st), dq, dout_bf16, lse, w.Di, q, k, v, doc_ids, s,
            scale);
}

}  // namespace detail
}  // namespace lt::cuda::LT_KERNELS_NS
