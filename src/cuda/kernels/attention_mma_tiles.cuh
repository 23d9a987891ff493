// cuda/kernels/attention_mma_tiles.cuh — the pieces the tensor-core attention kernels (attention_mma.cuh,
// attention_mma_wide.cuh) are built of: tile shapes per head dim, cp.async copies of head rows into padded shared
// tiles, warp-wide fragment products over a tile (mma.cuh), the quad reductions of a fragment row, and the test
// for a tile the mask cannot touch.
//
// Shared tiles are row-major with rows DH + 8 bf16 long (the stride), so the 8 rows an ldmatrix reads fall on
// different banks. A warp's products are 16 rows by 8·n columns: its A operand comes from registers or from a
// shared tile through a functor a(kk, frag) giving the fragment of k-step kk.
#pragma once

#include <cmath>

#include "cuda/kernels/async_copy.cuh"
#include "cuda/kernels/attention_common.cuh"
#include "cuda/kernels/mma.cuh"

namespace lt::cuda::LT_KERNELS_NS {

constexpr int kMmaTile = 64;  // query rows per tile of the dK/dV loop
constexpr int kMmaThreads = 128;

// A head dim's tiles. At DH ≤ 128 a warp keeps its query (and dO) fragments in registers, a key tile is 64 keys
// and a forward or dQ block 128 queries of 8 warps: each key tile copied into shared memory serves 128 rows, so a
// block moves 64 · DH · 2 · 2 bytes of K and V per 128 · 64 · DH · 4 FLOPs of the forward (128 FLOPs a byte, 64 at
// 64 rows; the dQ pass 192 against 96) — the same registers a thread and warps an SM. The narrow dK/dV block
// likewise takes 128 keys against each 64-query tile of Q and dO (256 FLOPs a byte against 128). At DH = 256 the f32
// accumulator of 16 rows alone takes 128 registers a thread, so those fragments are read from shared memory each
// key tile and the tiles narrow until the block's shared memory fits the 99 KiB of sm_86 / sm_89: forward Q [64]
// + K, V [2][32] rows, dQ Q, dO [64] + K, V [2][16] rows (101376 bytes each), 4 warps.
template <int DH>
struct MmaTiles {
  static_assert(DH == 64 || DH == 128 || DH == 256, "tensor-core attention is built for head dims 64, 128, 256");
  static constexpr bool kWide = DH > 128;
  static constexpr int kStride = DH + 8;               // a shared row, in bf16
  static constexpr int kForwardKeys = kWide ? 32 : 64;  // keys per tile of the forward
  static constexpr int kDqKeys = kWide ? 16 : 64;       // keys per tile of the dQ pass
  static constexpr int kQueryRows = kWide ? 64 : 128;   // queries per forward / dQ block, 16 a warp
  static constexpr int kQueryThreads = kQueryRows * 2;  // a warp per 16 rows
  static constexpr int kKeyRows = 128;                  // keys per narrow dK/dV block (DH ≤ 128), 16 a warp
  static constexpr int kKeyThreads = kKeyRows * 2;
};

// The forward's block by m-tiles a warp (MT: 16 query rows each). MT = 1: Tiles' block, Q fragments in registers
// (at DH ≤ 128). MT = 2 (DH ≤ 128, FlashAttention 2's shape): 4 warps of 32 rows, a block of 128; each K and V
// fragment a warp loads from shared memory feeds both m-tiles' products, so per key tile a warp loads 80 fragments
// (Q's 16, K's 32, V's 32) for 256 mma where two warps of 16 rows loaded 128: ~26 FLOPs a byte read from shared
// memory where 16. Two m-tiles' accumulators (2 · DH / 2 registers) leave no room for Q's fragments, so Q waits in
// shared memory, copied once with the block's first key tile — Q [128] + K, V [2][64] rows of DH + 8: 104448 bytes at DH = 128,
// over sm_86 / sm_89's 99 KiB (the launcher keeps MT = 1 there).
template <int DH, int MT>
struct ForwardTiles {
  static_assert(MT == 1 || (MT == 2 && DH <= 128), "two m-tiles a warp at head dims 64 and 128 only");
  static constexpr bool kQShared = MmaTiles<DH>::kWide || MT > 1;
  static constexpr int kRows = MT == 1 ? MmaTiles<DH>::kQueryRows : 128;  // query rows a block
  static constexpr int kThreads = kRows * 2 / MT;                          // a warp per 16 · MT rows
};

// Issues the copy of rows [row0, row0 + ROWS) of head h of a bf16 [B, T, H, DH] tensor into dst[ROWS, DH + 8]
// (shared); rows past T become 0. Every thread of the block takes 16-byte pieces.
template <int DH, int ROWS>
__device__ __forceinline__ void copy_rows_async(bf16* dst, const bf16* src, int64_t b, int64_t row0, int64_t h,
                                                int64_t T, int64_t H) {
  constexpr int kPieces = DH / 8;
  for (int e = int(threadIdx.x); e < ROWS * kPieces; e += int(blockDim.x)) {
    const int r = e / kPieces, c = 8 * (e % kPieces);
    const bool valid = row0 + r < T;
    copy16_async(dst + r * (DH + 8) + c, valid ? src + head_row(b, row0 + r, h, T, H, DH) + c : src, valid);
  }
}

// Issues the copy of the ROWS per-row statistics row[row0 .. row0 + ROWS) (0 past T) into dst[ROWS] (shared).
template <int ROWS>
__device__ __forceinline__ void copy_stats_async(float* dst, const float* row, int64_t row0, int64_t T) {
  const int i = int(threadIdx.x);
  if (i < ROWS) copy4_async(dst + i, row0 + i < T ? row + row0 + i : row, row0 + i < T);
}

// Issues key tile i of kv head hk (K and V rows [KEYS i, KEYS i + KEYS)) into buffer i % 2 of Ks, Vs
// ([2][KEYS, DH + 8]).
template <int DH, int KEYS>
__device__ __forceinline__ void copy_key_tile_async(bf16* Ks, bf16* Vs, const bf16* k, const bf16* v, int64_t b,
                                                    int64_t i, int64_t hk, const AttentionShape& s) {
  constexpr int kTile = KEYS * (DH + 8);
  copy_rows_async<DH, KEYS>(Ks + (i & 1) * kTile, k, b, i * KEYS, hk, s.T, s.Hkv);
  copy_rows_async<DH, KEYS>(Vs + (i & 1) * kTile, v, b, i * KEYS, hk, s.T, s.Hkv);
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

// The same from a shared row-major tile of row stride STRIDE, its rows [r0, r0 + 16) at columns [16 kk, 16 kk + 16):
// one ldmatrix (matrices: rows r0 and r0 + 8 at columns 16 kk, then at 16 kk + 8).
template <int STRIDE>
__device__ __forceinline__ void shared_a_fragment(uint32_t (&a)[4], const bf16* tile, int r0, int kk) {
  const int lane = int(threadIdx.x) & 31, m = lane >> 3;
  ldmatrix_x4<false>(a, tile + (r0 + 8 * (m & 1) + (lane & 7)) * STRIDE + kk * 16 + 8 * (m >> 1));
}

// The A functor of fragments held in registers, frag[DH / 16][4].
template <int KSTEPS>
__device__ __forceinline__ auto register_a(const uint32_t (&frag)[KSTEPS][4]) {
  return [&frag](int kk, uint32_t(&a)[4]) {
    for (int i = 0; i < 4; ++i) a[i] = frag[kk][i];
  };
}

// The A functor of a shared tile's rows [r0, r0 + 16).
template <int STRIDE>
__device__ __forceinline__ auto shared_a(const bf16* tile, int r0) {
  return [tile, r0](int kk, uint32_t(&a)[4]) { shared_a_fragment<STRIDE>(a, tile, r0, kk); };
}

// The A functor of a product's f32 C fragments p[2·KSTEPS][4] (16 rows by 16·KSTEPS columns), rounded to bf16:
// two neighbouring n-tiles' C layout is one k-step's A layout (mma.cuh).
template <int NT>
__device__ __forceinline__ auto c_fragments_as_a(const float (&p)[NT][4]) {
  return [&p](int kk, uint32_t(&a)[4]) {
    a[0] = pack_bf16(p[2 * kk][0], p[2 * kk][1]);
    a[1] = pack_bf16(p[2 * kk][2], p[2 * kk][3]);
    a[2] = pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]);
    a[3] = pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3]);
  };
}

// out[mt][16, 8·NT] = A_mt[16, DH] · tileᵀ for the warp's MT m-tiles whose active[mt] (warp-uniform; the others
// are left as they were), tile [8·NT, DH] rows of stride DH + 8 in shared: its rows are the product's columns. One
// ldmatrix gives the B fragments of n-tiles j and j + 1 (matrices: rows 8j and 8j + 8 at columns 16 kk and
// 16 kk + 8), for every m-tile: two m-tiles read each B fragment once for two products. a(mt, kk, frag) gives the A
// fragment of m-tile mt's k-step kk. out points at MT arrays [NT][4].
template <int DH, int NT, int MT, class AFragment>
__device__ __forceinline__ void mma_m_tiles_by_tile(float (*out)[NT][4], const bool (&active)[MT], AFragment a,
                                                    const bf16* tile) {
  static_assert(NT % 2 == 0, "n-tiles come in pairs, one ldmatrix each");
  constexpr int S = DH + 8;
  const int lane = int(threadIdx.x) & 31, m = lane >> 3;
  for (int mt = 0; mt < MT; ++mt)
    if (active[mt])
      for (int j = 0; j < NT; ++j)
        for (int e = 0; e < 4; ++e) out[mt][j][e] = 0.0f;
  const bf16* lane_row = tile + (8 * (m >> 1) + (lane & 7)) * S + 8 * (m & 1);
  for (int kk = 0; kk < DH / 16; ++kk) {
    uint32_t af[MT][4] = {};  // inactive m-tiles' stay unread
    for (int mt = 0; mt < MT; ++mt)
      if (active[mt]) a(mt, kk, af[mt]);
    for (int j = 0; j < NT; j += 2) {
      uint32_t bf[4];
      ldmatrix_x4<false>(bf, lane_row + j * 8 * S + kk * 16);
      for (int mt = 0; mt < MT; ++mt)
        if (active[mt]) {
          mma_bf16_16816(out[mt][j], af[mt], bf, out[mt][j]);
          mma_bf16_16816(out[mt][j + 1], af[mt], bf + 2, out[mt][j + 1]);
        }
    }
  }
}

// One m-tile's: out[16, 8·NT] = A[16, DH] · tileᵀ, a(kk, frag) giving A's k-step kk.
template <int DH, int NT, class AFragment>
__device__ __forceinline__ void mma_rows_by_tile(float (&out)[NT][4], AFragment a, const bf16* tile) {
  const bool all[1] = {true};
  mma_m_tiles_by_tile<DH, NT, 1>(&out, all, [&a](int, int kk, uint32_t(&f)[4]) { a(kk, f); }, tile);
}

// acc[mt][16, 8·ND] += A_mt[16, 16·KSTEPS] · tile[16·KSTEPS, 8·ND] for the MT m-tiles whose active[mt]
// (warp-uniform), tile row-major of stride STRIDE in shared (the pointer at its first column). One transposed
// ldmatrix gives the B fragments of column tiles nd and nd + 1 (matrices: rows 16 kk and 16 kk + 8 at columns 8 nd,
// then at 8 nd + 8), for every m-tile. a(mt, kk, frag) as above; acc points at MT arrays [ND][4].
template <int KSTEPS, int ND, int STRIDE, int MT, class AFragment>
__device__ __forceinline__ void mma_m_tiles_accumulate_by_tile(float (*acc)[ND][4], const bool (&active)[MT],
                                                               AFragment a, const bf16* tile) {
  static_assert(ND % 2 == 0, "column tiles come in pairs, one ldmatrix each");
  const int lane = int(threadIdx.x) & 31, m = lane >> 3;
  const bf16* lane_row = tile + (8 * (m & 1) + (lane & 7)) * STRIDE + 8 * (m >> 1);
  for (int kk = 0; kk < KSTEPS; ++kk) {
    uint32_t af[MT][4] = {};  // inactive m-tiles' stay unread
    for (int mt = 0; mt < MT; ++mt)
      if (active[mt]) a(mt, kk, af[mt]);
    for (int nd = 0; nd < ND; nd += 2) {
      uint32_t bf[4];
      ldmatrix_x4<true>(bf, lane_row + kk * 16 * STRIDE + nd * 8);
      for (int mt = 0; mt < MT; ++mt)
        if (active[mt]) {
          mma_bf16_16816(acc[mt][nd], af[mt], bf, acc[mt][nd]);
          mma_bf16_16816(acc[mt][nd + 1], af[mt], bf + 2, acc[mt][nd + 1]);
        }
    }
  }
}

// One m-tile's: acc[16, 8·ND] += A[16, 16·KSTEPS] · tile[16·KSTEPS, 8·ND], a(kk, frag) giving A's k-step kk.
template <int KSTEPS, int ND, int STRIDE, class AFragment>
__device__ __forceinline__ void mma_accumulate_by_tile(float (&acc)[ND][4], AFragment a, const bf16* tile) {
  const bool all[1] = {true};
  mma_m_tiles_accumulate_by_tile<KSTEPS, ND, STRIDE, 1>(&acc, all, [&a](int, int kk, uint32_t(&f)[4]) { a(kk, f); },
                                                        tile);
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

// Whether every pair (query, key) of queries [r0, r0 + 16) and keys [k0, k0 + keys) attends (warp-uniform): the
// tile lies below the diagonal, inside T and the sliding window, and there are no documents. Such tiles skip the
// per-element mask.
__device__ __forceinline__ bool tile_unmasked(const int32_t* doc_ids, int64_t T, int64_t window, int64_t r0,
                                              int64_t k0, int64_t keys) {
  return doc_ids == nullptr && k0 + keys - 1 <= r0 && r0 + 15 < T && (window <= 0 || k0 > r0 + 15 - window);
}

// The first x of [lo, hi] where pred(x) holds, pred false and then true along [lo, hi] and taken to hold at hi (not
// asked there): a warp's 32-way search, one load a lane a round (3 rounds over 32768 positions). Every lane of the
// warp must call it; all get the answer.
template <class Pred>
__device__ __forceinline__ int64_t warp_first_position(int64_t lo, int64_t hi, Pred pred) {
  const int lane = int(threadIdx.x) & 31;
  while (lo < hi) {
    const int64_t step = (hi - lo + 31) / 32, x = lo + lane * step;
    const int before = __popc(__ballot_sync(0xffffffffu, x < hi && !pred(x)));  // the probes before the answer
    if (before == 0) return lo;
    const int64_t last_before = lo + (before - 1) * step;
    hi = last_before + step < hi ? last_before + step : hi;
    lo = last_before + 1;
  }
  return lo;
}

// Documents are runs of equal ids along a row, ids never decreasing (as every batch makes them — data_loader.cpp,
// batch.cpp — and as the short convolution and the delta rule take them). So a block can skip the key (or query)
// tiles wholly outside its rows' documents, which the mask would zero element by element: with packed documents of
// length L in rows of T tokens, a causal pass otherwise multiplies about T / L times the tiles it needs. Skipped
// tiles are ones whose every score is masked: a forward or dQ row's leading tiles leave its accumulators at their
// +0 start, so the result is the same bits; a dK / dV pass's trailing tiles would add products of P = 0 and
// dS = ±0, which can change only the sign of a sum that is exactly zero. docs: the row's ids; p < T.
__device__ __forceinline__ int64_t warp_document_first(const int32_t* docs, int64_t p) {
  const int32_t d = docs[p];
  return warp_first_position(0, p, [docs, d](int64_t x) { return docs[x] >= d; });
}
__device__ __forceinline__ int64_t warp_document_end(const int32_t* docs, int64_t p, int64_t T) {  // past its last
  const int32_t d = docs[p];
  return warp_first_position(p + 1, T, [docs, d](int64_t x) { return docs[x] > d; });
}

// The mask of a thread's fragment elements (attends(), every position past T masked) over a warp's 16 fragment rows
// [r0, r0 + 16) — queries (ROWS_ARE_QUERIES: the forward, dQ) or keys (dK / dV) — against a tile's columns, the
// other kind. Made once a warp: a row's columns that may attend are an interval [lo, hi] (causal, the window, T)
// and share its document; each tile reads a column's document once (T < 2^31: positions fit an int). The per
// element test it replaces read two document ids from global memory for every score of every tile with documents.
template <bool ROWS_ARE_QUERIES>
struct FragmentMask {
  const int32_t* docs;  // the batch row's document ids, or null
  int T, lo[2], hi[2], row_doc[2];

  __device__ __forceinline__ FragmentMask(const int32_t* doc_ids, int64_t b, const AttentionShape& s, int64_t r0)
      : docs(doc_ids ? doc_ids + b * s.T : nullptr), T(int(s.T)) {
    const int g = (int(threadIdx.x) & 31) >> 2;
    for (int r = 0; r < 2; ++r) {
      const int64_t x = r0 + g + 8 * r;
      if (ROWS_ARE_QUERIES) {  // keys (x − window, x]
        lo[r] = s.window > 0 && s.window <= x ? int(x - s.window + 1) : 0;
        hi[r] = int(x);
      } else {  // queries [x, x + window)
        lo[r] = int(x);
        hi[r] = int(s.window > 0 && x + s.window <= s.T ? x + s.window - 1 : s.T - 1);
      }
      if (x >= s.T) lo[r] = 1, hi[r] = 0;  // a row past T attends nothing
      row_doc[r] = docs && x < s.T ? docs[x] : 0;
    }
  }
  // Column position c's document (0 past T or without documents).
  __device__ __forceinline__ int column_doc(int c) const { return docs && c < T ? docs[c] : 0; }
  // Whether fragment row r (g + 8r) and column c, of document c_doc, attend.
  __device__ __forceinline__ bool valid(int r, int c, int c_doc) const {
    return c >= lo[r] && c <= hi[r] && (!docs || c_doc == row_doc[r]);
  }
};

// P and dS of one score: P = exp(scale·S − lse) where the pair attends, dS = P ∘ (dP − Di).
__device__ __forceinline__ void probability_and_grad(float& s_then_p, float& dp_then_ds, bool valid, float scale,
                                                     float lse, float Di) {
  const float p = valid ? expf(s_then_p * scale - lse) : 0.0f;
  dp_then_ds = p * (dp_then_ds - Di);
  s_then_p = p;
}

// Writes a warp's dK, dV accumulators (fragment rows: its keys [w0, w0 + 16), columns: dims [d0, d0 + 8·ND)) to
// dk, dv [B, T, Hkv, DH] (G = Hq / Hkv = 1: the results, dK scaled) or to query head h's partials
// [G, B, T, Hkv, DH] (G > 1: unscaled, at h % G; attention_kv_reduce_kernel sums and scales them).
template <int DH, int ND>
__device__ __forceinline__ void store_key_grads(float* dk, float* dv, const float (&dka)[ND][4],
                                                const float (&dva)[ND][4], int64_t b, int64_t w0, int d0, int64_t h,
                                                const AttentionShape& s, float scale) {
  const int t = int(threadIdx.x) & 3, g = (int(threadIdx.x) & 31) >> 2;
  const int64_t G = s.Hq / s.Hkv, hk = h / G;
  const float dk_scale = G == 1 ? scale : 1.0f;  // partials are scaled once summed
  const int64_t part = G == 1 ? 0 : (h % G) * s.B * s.T * s.Hkv * DH;
  for (int r = 0; r < 2; ++r) {
    const int64_t key = w0 + g + 8 * r;
    if (key >= s.T) continue;
    float* dk_row = dk + part + head_row(b, key, hk, s.T, s.Hkv, DH) + d0;
    float* dv_row = dv + part + head_row(b, key, hk, s.T, s.Hkv, DH) + d0;
    for (int nd = 0; nd < ND; ++nd)
      for (int c = 0; c < 2; ++c) {
        dk_row[nd * 8 + 2 * t + c] = dk_scale * dka[nd][2 * r + c];
        dv_row[nd * 8 + 2 * t + c] = dva[nd][2 * r + c];
      }
  }
}

}  // namespace lt::cuda::LT_KERNELS_NS
