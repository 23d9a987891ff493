// cuda/kernels/gated_delta_mma.cuh — the gated delta rule's forward on tensor cores: bf16 storage, key and value
// head dims multiples of 16 up to 128 (gated_delta_on_tensor_cores; Qwen3.5 / Qwen3.6: 128 and 128). The chunked
// WY form of ops/gated_delta.h in three launches, split as FLA's chunked kernels split it, so that only the state
// recurrence runs in sequence and the rest runs a block per (tile, value head):
//   1. prepare, a block per tile:   M = strictly_lower(diag(β) K Kᵀ ⊙ E), A = (I + M)⁻¹ (by blocks: 8 × 8
//      diagonal blocks by forward substitution, merged pairwise to 64), W = (A diag(β e^γ)) K and
//      U = (A diag(β)) V to the workspace (bf16);
//   2. states, a block per (row, value head, 16 or 32 value dims), tile after tile: S₀ to the workspace (bf16),
//      V' = U − W S₀ in U's place, S ← e^{γ_C} S + Kᵀ (diag(e^{γ_C − γ}) V') (S in f32 in shared memory);
//   3. output, a block per tile:    O = diag(e^γ) (scale · Q S₀) + (scale · Q Kᵀ ⊙ E) V'.
// Tiles are a row's aligned 64-token spans, not (as the CPU op's chunks) counted from each document's start: a
// document boundary inside a tile masks E's cross-document entries (so M's, A's and QKᵀ ⊙ E's), drops S₀'s term
// for the tokens of every document but the one the tile continues (DeltaTileGates::first), keeps in the end state
// only the last document's tokens (last) and S₀ only when that document is the first (carry); the state restarts
// at zero where a tile begins a document (starts). Padding rows beyond a row's end are zero throughout.
//
// Rounding: every product's operands are bf16 — K, V, Q as stored; A diag(·), S₀, V' and scale·QKᵀ ⊙ E each
// rounded once — and its sums f32 (the tensor core's); gates, S and the combinations are f32. So the output is the
// recurrence's to bf16 rounding (tests hold it to the f64 recurrence), not the CPU op's bits. Every output element
// is one lane's fixed sequence of mma k-steps, so the bits depend on neither the launch nor the thread order.
//
// Workspace (DeltaMmaWorkspace): W, U / V' and S₀ of every tile, ~50 MB a batch row at Qwen3.6's 48 heads of 128
// and 1024 tokens; the launcher runs groups of rows within kDeltaWorkspaceBytes.
//
// Speed: the products run on mma.sync from shared memory, their operands loaded by ldmatrix (tile_product); the
// sequential launch does 4 · 64 · dk · dv FLOPs per tile and head (W S₀ and Kᵀ V'), about a third of the
// forward's, and waits on each tile's loads: the launch to look at first on a GPU.
#pragma once

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "cuda/kernels/async_copy.cuh"
#include "cuda/kernels/attention_common.cuh"
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/mma.cuh"
#include "ops/gated_delta.h"

namespace lt::cuda::LT_KERNELS_NS {

constexpr int kDeltaMmaThreads = 128;
constexpr int kDeltaTile = int(kDeltaChunk);  // tokens per tile: 64
constexpr int kTileLd = kDeltaTile + 8;        // row stride of a [64, 64] bf16 tile in shared memory (padded)

// One tile's gates in shared memory (tokens i, j of the tile; i ≥ C are padding).
struct DeltaTileGates {
  float gam[kDeltaTile];   // γ_i = Σ_{m ≤ i} g_m from the tile's first token (non-increasing)
  float eg[kDeltaTile];    // e^{γ_i}
  float egc[kDeltaTile];   // e^{γ_{C−1} − γ_i}
  float beta[kDeltaTile];  // β_i, 0 for padding
  int32_t doc[kDeltaTile];  // token i's document (0 without doc_ids)
  int C;                    // tokens in the tile
  int starts;               // the tile's first token begins a document: the state entering it is zero
  int pad[2];               // to kDeltaTileGatesBytes, a whole number of 16-byte copies

  __device__ bool first(int i) const { return i < C && doc[i] == doc[0]; }     // S₀ reaches token i
  __device__ bool last(int i) const { return i < C && doc[i] == doc[C - 1]; }  // token i reaches the end state
  __device__ bool carry() const { return doc[0] == doc[C - 1]; }                // S₀ reaches the end state
  // E_ij = e^{γ_i − γ_j} for j ≤ i of one document, else 0 (the masked entries are never exponentiated).
  __device__ float decay(int i, int j) const {
    return j <= i && i < C && doc[i] == doc[j] ? expf(gam[i] - gam[j]) : 0.0f;
  }
};

// The tokens of a row's tile from t0: 64, or fewer in the row's last.
__device__ __forceinline__ int delta_tile_tokens(const DeltaShape& s, int64_t t0) {
  return int(s.T - t0 < kDeltaTile ? s.T - t0 : kDeltaTile);
}

// Tile t0 / 64 of row b for value head vh. Ends with a barrier.
__device__ void load_tile_gates(DeltaTileGates& tg, int64_t b, int64_t t0, int64_t vh, const float* beta,
                                const float* g, const int32_t* doc_ids, const DeltaShape& s) {
  const int C = delta_tile_tokens(s, t0);
  const int64_t n0 = b * s.T + t0;
  // Every thread loads its tokens' gates (g into gam first: the global loads in parallel, not one thread's 64 in
  // sequence, which sat on the states launches' critical path); then one thread sums γ in token order from shared.
  for (int i = int(threadIdx.x); i < kDeltaTile; i += int(blockDim.x)) {
    tg.beta[i] = i < C ? beta[(n0 + i) * s.Hv + vh] : 0.0f;
    tg.doc[i] = i < C && doc_ids ? doc_ids[n0 + i] : 0;
    tg.gam[i] = i < C ? g[(n0 + i) * s.Hv + vh] : 0.0f;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float gam = 0.0f;
    for (int i = 0; i < kDeltaTile; ++i) {
      if (i < C) gam += tg.gam[i];  // adding g ≤ 0 never increases γ
      tg.gam[i] = gam;
    }
    tg.C = C;
    tg.starts = t0 == 0 || (doc_ids && doc_ids[n0 - 1] != doc_ids[n0]);
  }
  __syncthreads();
  for (int i = int(threadIdx.x); i < kDeltaTile; i += int(blockDim.x)) {
    tg.eg[i] = expf(tg.gam[i]);
    tg.egc[i] = expf(tg.gam[C - 1] - tg.gam[i]);
  }
  __syncthreads();
}

// Dynamic shared memory handed out in 16-byte aligned pieces; with a null base it only counts (the launchers'
// sizes are the kernels' own carves).
struct SharedCarve {
  uintptr_t base, used = 0;
  template <class T>
  LT_HD_INLINE T* take(int64_t n) {
    T* at = reinterpret_cast<T*>(base + used);
    used += (uintptr_t(n) * sizeof(T) + 15) / 16 * 16;
    return at;
  }
};

// Eight bf16 (16 bytes, both addresses 16-byte aligned), or eight zeros.
__device__ __forceinline__ void copy_bf16x8(bf16* dst, const bf16* src, bool valid) {
#ifdef __CUDACC__
  *reinterpret_cast<uint4*>(dst) = valid ? *reinterpret_cast<const uint4*>(src) : make_uint4(0, 0, 0, 0);
#else
  if (valid) std::memcpy(dst, src, 16);
  else std::memset(dst, 0, 16);
#endif
}

// A tile's gates to the workspace (prepare, which makes them anyway) and back (the sequential launches: a copy
// behind compute, complete after async_commit, async_wait and a barrier), 16 bytes a thread.
static_assert(sizeof(DeltaTileGates) == kDeltaTileGatesBytes && kDeltaTileGatesBytes % 16 == 0,
              "the workspace's slot per tile is one DeltaTileGates");
__device__ void store_tile_gates(unsigned char* dst, const DeltaTileGates& tg) {
  const auto* src = reinterpret_cast<const bf16*>(&tg);
  for (int x = int(threadIdx.x); x < int(kDeltaTileGatesBytes / 16); x += int(blockDim.x))
    copy_bf16x8(reinterpret_cast<bf16*>(dst) + 8 * x, src + 8 * x, true);
}
__device__ void fetch_tile_gates(DeltaTileGates& tg, const unsigned char* src) {
  auto* dst = reinterpret_cast<unsigned char*>(&tg);
  for (int x = int(threadIdx.x); x < int(kDeltaTileGatesBytes / 16); x += int(blockDim.x))
    copy16_async(dst + 16 * x, src + 16 * x, true);
}

// rows × cols bf16 from global (row stride ld) into shared (row stride lds); rows ≥ valid are zero. 16 bytes a
// thread where every row starts 16-byte aligned (a layer's q, k, v and the workspace's tiles do), else 2. Async: the
// 16-byte copies are cp.async (async_copy.cuh: they land behind compute, after async_commit, async_wait and a
// barrier); the 2-byte ones are done when issued either way.
template <bool Async = false>
__device__ void load_tile_rows(bf16* dst, int lds, const bf16* src, int64_t ld, int rows, int cols, int valid) {
  const bool wide = cols % 8 == 0 && ld % 8 == 0 && lds % 8 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  if (wide) {
    const int packs = cols / 8;
    for (int x = int(threadIdx.x); x < rows * packs; x += int(blockDim.x)) {
      const int r = x / packs, c = x % packs * 8;
      if constexpr (Async)  // a zero-filled row reads nothing: its source is the tile's first row, in bounds
        copy16_async(dst + r * lds + c, r < valid ? src + r * ld + c : src, r < valid);
      else
        copy_bf16x8(dst + r * lds + c, src + r * ld + c, r < valid);
    }
    return;
  }
  for (int x = int(threadIdx.x); x < rows * cols; x += int(blockDim.x)) {
    const int r = x / cols, c = x % cols;
    dst[r * lds + c] = r < valid ? src[r * ld + c] : __float2bfloat16_rn(0.0f);
  }
}

// Two bf16 `stride` elements apart as one fragment register (low half first): a pair along a tile's column.
__device__ __forceinline__ uint32_t pair_strided(const bf16* x, int stride) {
  return uint32_t(__bfloat16_as_ushort(x[0])) | (uint32_t(__bfloat16_as_ushort(x[stride])) << 16);
}

// An mma operand tile in shared memory: A's element (row i, k p), or B's (k p, column j) with the column as its
// row, at base[row · ld + k] (kKContiguous: a fragment's pair is one 4-byte load) or at base[k · ld + row] (the
// transposed operands: a pair is two 2-byte loads ld apart). tile_product loads it by ldmatrix — the transposed
// form by ldmatrix.trans — where ld is a multiple of 8 and base 16-byte aligned, else by pairs: the same registers,
// so the same bits either way. SmemA / SmemB are the two roles as tile_product's pair functors.
template <bool kKContiguous>
struct SmemOperand {
  static constexpr bool kKc = kKContiguous;
  const bf16* base;
  int ld;
  __device__ uint32_t pair(int row, int k) const {
    if constexpr (kKContiguous) return load_pair(base + row * ld + k);
    else return pair_strided(base + k * ld + row, ld);
  }
  // Row `r8` in memory of the 8 x 8 block at operand rows row0.., k k0.. (an operand row, or a k).
  __device__ const bf16* block_row(int row0, int k0, int r8) const {
    return kKContiguous ? base + (row0 + r8) * ld + k0 : base + (k0 + r8) * ld + row0;
  }
  __device__ bool by_ldmatrix() const { return ld % 8 == 0 && reinterpret_cast<uintptr_t>(base) % 16 == 0; }
};
template <bool kKContiguous>
struct SmemA : SmemOperand<kKContiguous> {
  __device__ SmemA(const bf16* base, int ld) : SmemOperand<kKContiguous>{base, ld} {}
  __device__ uint32_t operator()(int i, int p) const { return this->pair(i, p); }
};
template <bool kKContiguous>
struct SmemB : SmemOperand<kKContiguous> {
  __device__ SmemB(const bf16* base, int ld) : SmemOperand<kKContiguous>{base, ld} {}
  __device__ uint32_t operator()(int p, int j) const { return this->pair(j, p); }
};
template <class F>
constexpr bool kIsSmemOperand = std::is_base_of_v<SmemOperand<true>, F> || std::is_base_of_v<SmemOperand<false>, F>;

// acc (the C fragment of a 16 x 8 tile at rows r.., columns c..) += Σ_p A[r.., p] B[p, c..], p < K in k-steps of
// 16 (mma.cuh's fragments); a(i, p) = (A[i][p], A[i][p+1]) and b(p, j) = (B[p][j], B[p+1][j]) as packed bf16 pairs.
// A shared-memory operand (SmemA / SmemB) goes by ldmatrix: A's four 8 x 8 blocks a k-step, B's two k-steps a load
// (its last k-step by pairs when K / 16 is odd).
template <class FA, class FB>
__device__ __forceinline__ void tile_product(float acc[4], int r, int c, int K, const FA& a, const FB& b) {
  const int lane = int(threadIdx.x) & 31, g = lane >> 2, t = 2 * (lane & 3), r8 = lane & 7, m = lane >> 3;
  bool a_ldmatrix = false, b_ldmatrix = false;
  if constexpr (kIsSmemOperand<FA>) a_ldmatrix = a.by_ldmatrix();
  if constexpr (kIsSmemOperand<FB>) b_ldmatrix = b.by_ldmatrix();
  uint32_t b4[4] = {0, 0, 0, 0};  // B's k-steps p and p + 16 (blocks of k p, p + 8, p + 16, p + 24)
  for (int p = 0; p < K; p += 16) {
    uint32_t fa[4], fb[2];
    if constexpr (kIsSmemOperand<FA>) {
      if (a_ldmatrix) ldmatrix_x4<!FA::kKc>(fa, a.block_row(r + 8 * (m & 1), p + 8 * (m >> 1), r8));
    }
    if (!a_ldmatrix) {
      fa[0] = a(r + g, p + t), fa[1] = a(r + g + 8, p + t);
      fa[2] = a(r + g, p + t + 8), fa[3] = a(r + g + 8, p + t + 8);
    }
    bool b_loaded = false;
    if constexpr (kIsSmemOperand<FB>) {
      if (b_ldmatrix && p % 32 == 0 && p + 32 <= K) {
        ldmatrix_x4<!FB::kKc>(b4, b.block_row(c, p + 8 * m, r8));
        fb[0] = b4[0], fb[1] = b4[1], b_loaded = true;
      } else if (b_ldmatrix && p % 32 == 16) {
        fb[0] = b4[2], fb[1] = b4[3], b_loaded = true;
      }
    }
    if (!b_loaded) fb[0] = b(p + t, c + g), fb[1] = b(p + t + 8, c + g);
    mma_bf16_16816(acc, fa, fb, acc);
  }
}

// out[M, N] = A[M, K1] B1[K1, N] (and A2[M, K2] B2[K2, N]) on the block's warps, a warp per 16 x 8 tile at a time
// (M a multiple of 16, N of 8, K of 16; every lane of a warp takes the same tiles, as mma.sync needs):
// epilogue(i, j, Σ A B[, Σ A2 B2]) once per element, by the lane holding it. No barrier.
template <class FA, class FB, class Epilogue>
__device__ void block_mma(int M, int N, int K, const FA& a, const FB& b, const Epilogue& epilogue) {
  const int lane = int(threadIdx.x) & 31, g = lane >> 2, t = 2 * (lane & 3), tiles_n = N / 8;
  for (int tile = int(threadIdx.x) >> 5; tile < (M / 16) * tiles_n; tile += int(blockDim.x) >> 5) {
    const int r = tile / tiles_n * 16, c = tile % tiles_n * 8;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    tile_product(acc, r, c, K, a, b);
    epilogue(r + g, c + t, acc[0]), epilogue(r + g, c + t + 1, acc[1]);
    epilogue(r + g + 8, c + t, acc[2]), epilogue(r + g + 8, c + t + 1, acc[3]);
  }
}
template <class FA, class FB, class FA2, class FB2, class Epilogue>
__device__ void block_mma2(int M, int N, int K, const FA& a, const FB& b, int K2, const FA2& a2, const FB2& b2,
                           const Epilogue& epilogue) {
  const int lane = int(threadIdx.x) & 31, g = lane >> 2, t = 2 * (lane & 3), tiles_n = N / 8;
  for (int tile = int(threadIdx.x) >> 5; tile < (M / 16) * tiles_n; tile += int(blockDim.x) >> 5) {
    const int r = tile / tiles_n * 16, c = tile % tiles_n * 8;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, acc2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    tile_product(acc, r, c, K, a, b);
    tile_product(acc2, r, c, K2, a2, b2);
    epilogue(r + g, c + t, acc[0], acc2[0]), epilogue(r + g, c + t + 1, acc[1], acc2[1]);
    epilogue(r + g + 8, c + t, acc[2], acc2[2]), epilogue(r + g + 8, c + t + 1, acc[3], acc2[3]);
  }
}

// KKE_ij = (K Kᵀ)_ij E_ij below the diagonal, 0 elsewhere: f32 [64, lm] from the tile's keys ks [64, lk]. Ends with a
// barrier.
__device__ void tile_key_products(float* KKE, int lm, const DeltaTileGates& tg, const bf16* ks, int lk, int dk) {
  block_mma(
      kDeltaTile, kDeltaTile, dk, SmemA<true>(ks, lk), SmemB<true>(ks, lk),
      [&](int i, int j, float kk) { KKE[i * lm + j] = j < i ? kk * tg.decay(i, j) : 0.0f; });
  __syncthreads();
}

// The diagonal blocks tile_unit_lower_inverse solves by substitution before merging them.
constexpr int kDeltaInverseBlock = 8;

// One level of the blocked inverse: each pair of diagonal blocks of S (top T, bottom R; A_TT and A_RR done, M_RT
// the M block below T) gets A_RT = −A_RR (M_RT A_TT). X = M_RT A_TT waits transposed in A's upper triangle (the
// pair's mirror block: X_ic at A[c, i]), zeroed by the caller. Both products give each thread S / 4 sums over one
// shared loop (32 · S elements a product, 128 threads), so its chain is S long, not S²/4.
template <int S>
__device__ void tile_inverse_merge(float* A, int la, const float* KKE, int lm, const DeltaTileGates& tg) {
  static_assert(kDeltaTile == 64 && kDeltaMmaThreads == 128, "32 columns (or rows) x 4 row (or column) groups");
  constexpr int kPer = S / 4;
  const int tid = int(threadIdx.x), nt = int(blockDim.x);
  // X: unit u takes column c of a top block and the bottom block's rows r, r + 4, ...: X_ic = Σ_{c ≤ m < b+S} M_im A_mc.
  for (int u = tid; u < kDeltaMmaThreads; u += nt) {
    const int q = u % 32, r = u / 32, b = q / S * 2 * S, c = b + q % S, i0 = b + S + r;
    float x[kPer] = {}, beta[kPer];
    for (int k = 0; k < kPer; ++k) beta[k] = tg.beta[i0 + 4 * k];
    for (int m = c; m < b + S; ++m) {
      const float a = A[m * la + c];
      for (int k = 0; k < kPer; ++k) x[k] += (beta[k] * KKE[(i0 + 4 * k) * lm + m]) * a;
    }
    for (int k = 0; k < kPer; ++k) A[c * la + i0 + 4 * k] = x[k];
  }
  __syncthreads();
  // A_RT: unit u takes row i of a bottom block and the top block's columns r, r + 4, ...: A_ic = −Σ_{b+S ≤ n ≤ i} A_in
  // X_nc (A_ii = 1).
  for (int u = tid; u < kDeltaMmaThreads; u += nt) {
    const int q = u % 32, r = u / 32, b = q / S * 2 * S, i = b + S + q % S, c0 = b + r;
    float y[kPer] = {};
    for (int n = b + S; n <= i; ++n) {
      const float a = A[i * la + n];
      for (int k = 0; k < kPer; ++k) y[k] += a * A[(c0 + 4 * k) * la + n];
    }
    for (int k = 0; k < kPer; ++k) A[i * la + c0 + 4 * k] = -y[k];
  }
  __syncthreads();
}

// A = (I + M)⁻¹ with M_ij = β_i KKE_ij strictly lower, by blocks as FLA's solve_tril: the 8 × 8 diagonal blocks by
// forward substitution, then pairs of blocks of 8, 16 and 32 merged (tile_inverse_merge). The longest chain of
// dependent adds is 28 + 2 · (8 + 16 + 32) = 140 where the column solve's (a column per thread, 64 threads busy)
// was 2016, ~8k cycles at an add's 4 — counted, the prepare launch's longest stretch; about the same products
// (45.5k against 43.7k), 128 threads wide. Every element is one thread's fixed loop in index order, the stages
// apart by barriers, so the bits depend on no thread order. f32 [64, la]. Ends with a barrier.
__device__ void tile_unit_lower_inverse(float* A, int la, const float* KKE, int lm, const DeltaTileGates& tg) {
  constexpr int B = kDeltaInverseBlock;
  const int tid = int(threadIdx.x), nt = int(blockDim.x);
  // The diagonal blocks, a column per thread: A_ic = δ_ic − Σ_{c ≤ m < i} M_im A_mc down the block (zero above c).
  for (int c = tid; c < kDeltaTile; c += nt)
    for (int i = c / B * B; i < (c / B + 1) * B; ++i) {
      float acc = i == c ? 1.0f : 0.0f;
      for (int m = c; m < i; ++m) acc += -(tg.beta[i] * KKE[i * lm + m]) * A[m * la + c];
      A[i * la + c] = acc;
    }
  __syncthreads();
  tile_inverse_merge<B>(A, la, KKE, lm, tg);
  tile_inverse_merge<2 * B>(A, la, KKE, lm, tg);
  tile_inverse_merge<4 * B>(A, la, KKE, lm, tg);
  // The mirror blocks back to zero: every entry right of its row's diagonal block.
  for (int x = tid; x < kDeltaTile * kDeltaTile; x += nt) {
    const int i = x / kDeltaTile, j = x % kDeltaTile;
    if (j >= (i / B + 1) * B) A[i * la + j] = 0.0f;
  }
  __syncthreads();
}

// Aw = bf16(A diag(β e^γ)) and Au = bf16(A diag(β)), [64, kTileLd] each: the operands W = Aw K and U = Au V take.
// Ends with a barrier.
__device__ void tile_wy_operands(bf16* Aw, bf16* Au, const float* A, int la, const DeltaTileGates& tg) {
  for (int x = int(threadIdx.x); x < kDeltaTile * kDeltaTile; x += int(blockDim.x)) {
    const int i = x / kDeltaTile, j = x % kDeltaTile;
    Aw[i * kTileLd + j] = __float2bfloat16_rn(A[i * la + j] * (tg.beta[j] * tg.eg[j]));
    Au[i * kTileLd + j] = __float2bfloat16_rn(A[i * la + j] * tg.beta[j]);
  }
  __syncthreads();
}

// Where the blocks of a launch find their tile: blockIdx.x = slot · tiles + tile, slot = b · Hv + vh.
struct DeltaTileAt {
  int64_t tiles, tile, slot, b, vh, kh, t0, n0;
  __device__ static DeltaTileAt of(int64_t index, const DeltaShape& s) {
    DeltaTileAt at;
    at.tiles = (s.T + kDeltaTile - 1) / kDeltaTile;
    at.tile = index % at.tiles, at.slot = index / at.tiles;
    at.b = at.slot / s.Hv, at.vh = at.slot % s.Hv, at.kh = at.vh / (s.Hv / s.Hk);
    at.t0 = at.tile * kDeltaTile, at.n0 = at.b * s.T + at.t0;
    return at;
  }
  __device__ int64_t index() const { return slot * tiles + tile; }
};

// ---- 1. prepare ------------------------------------------------------------------------------------------------

template <class Carve>
LT_HD_INLINE void delta_prepare_carve(Carve& sh, int dk, int dv, DeltaTileGates** tg, bf16** ks, bf16** vs,
                                      float** KKE, float** A, bf16** Aw, bf16** Au) {
  *tg = sh.template take<DeltaTileGates>(1);
  *ks = sh.template take<bf16>(kDeltaTile * (dk + 8)), *vs = sh.template take<bf16>(kDeltaTile * (dv + 8));
  // Aw and Au (bf16 [64, kTileLd] each) in KKE's place (f32 [64, kTileLd]), dead once A is made: 69.5 KiB at head
  // dims 128, three blocks an SM where 85.8 KiB allowed two.
  *KKE = sh.template take<float>(kDeltaTile * kTileLd), *A = sh.template take<float>(kDeltaTile * (kDeltaTile + 1));
  *Aw = reinterpret_cast<bf16*>(*KKE), *Au = *Aw + kDeltaTile * kTileLd;
}

__global__ void __launch_bounds__(kDeltaMmaThreads)
    delta_prepare_kernel(bf16* W, bf16* U, unsigned char* gates, const bf16* k, const bf16* v, const float* beta,
                         const float* g, const int32_t* doc_ids, DeltaShape s) {
  const DeltaTileAt at = DeltaTileAt::of(blockIdx.x, s);
  const int dk = int(s.dk), dv = int(s.dv), lk = dk + 8, lv = dv + 8, lm = kTileLd, la = kDeltaTile + 1;
  SharedCarve sh{reinterpret_cast<uintptr_t>(LT_DYNAMIC_SHARED(unsigned char))};
  DeltaTileGates* tgp;
  bf16 *ks, *vs, *Aw, *Au;
  float *KKE, *A;
  delta_prepare_carve(sh, dk, dv, &tgp, &ks, &vs, &KKE, &A, &Aw, &Au);
  DeltaTileGates& tg = *tgp;
  load_tile_gates(tg, at.b, at.t0, at.vh, beta, g, doc_ids, s);
  store_tile_gates(gates + at.index() * kDeltaTileGatesBytes, tg);  // for the sequential launches
  load_tile_rows(ks, lk, k + at.n0 * s.ldk + at.kh * dk, s.ldk, kDeltaTile, dk, tg.C);
  load_tile_rows(vs, lv, v + at.n0 * s.ldv + at.vh * dv, s.ldv, kDeltaTile, dv, tg.C);
  __syncthreads();
  tile_key_products(KKE, lm, tg, ks, lk, dk);
  tile_unit_lower_inverse(A, la, KKE, lm, tg);
  tile_wy_operands(Aw, Au, A, la, tg);  // over KKE
  bf16* Wt = W + at.index() * kDeltaTile * dk;
  bf16* Ut = U + at.index() * kDeltaTile * dv;
  block_mma(
      kDeltaTile, dk, kDeltaTile, SmemA<true>(Aw, kTileLd), SmemB<false>(ks, lk),
      [&](int i, int j, float w) { Wt[i * dk + j] = __float2bfloat16_rn(w); });
  block_mma(
      kDeltaTile, dv, kDeltaTile, SmemA<true>(Au, kTileLd), SmemB<false>(vs, lv),
      [&](int i, int j, float u) { Ut[i * dv + j] = __float2bfloat16_rn(u); });
}

// ---- 2. states -------------------------------------------------------------------------------------------------

// The value dims of one states block. The state's columns are independent (no sum runs across them), so any split
// gives the same bits; 16 makes twice the blocks of 32 in the two sequential launches (384 at Qwen3.6's 48 value
// heads of 128, against 132 SMs: three blocks an SM at the forward's 59 KiB of shared memory, so one wave).
constexpr int kDeltaStateCols = 16;

template <class Carve>
LT_HD_INLINE void delta_states_carve(Carve& sh, int dk, int cols, DeltaTileGates** tg, float** S, bf16** Sb, bf16** ws,
                                     bf16** ks, bf16** us, bf16** vd) {
  *tg = sh.template take<DeltaTileGates>(2);  // this tile's and the next's
  *S = sh.template take<float>(dk * (cols + 4)), *Sb = sh.template take<bf16>(dk * (cols + 8));
  *ws = sh.template take<bf16>(kDeltaTile * (dk + 8)), *ks = sh.template take<bf16>(kDeltaTile * (dk + 8));
  *us = sh.template take<bf16>(kDeltaTile * (cols + 8)), *vd = sh.template take<bf16>(kDeltaTile * (cols + 8));
}

// The state through a row's tiles, a block per (row, value head, 16 value dims). Each tile's operands load behind
// the previous tile's work (cp.async): its gates (as prepare made them), W's rows and U's columns once the previous
// V' product has read them, K's rows once the previous state update has — one buffer each but the gates', so three
// blocks fit an SM (two buffers of each would not: two waves).
__global__ void __launch_bounds__(kDeltaMmaThreads)
    delta_states_kernel(bf16* UV, bf16* states, const bf16* W, const unsigned char* gates, const bf16* k,
                        DeltaShape s) {
  const int cols = kDeltaStateCols, parts = int(s.dv) / cols;
  const int64_t slot = blockIdx.x / parts, b = slot / s.Hv, kh = slot % s.Hv / (s.Hv / s.Hk);
  const int64_t tiles = (s.T + kDeltaTile - 1) / kDeltaTile, j0 = int64_t(blockIdx.x % parts) * cols;
  const int dk = int(s.dk), dv = int(s.dv), lk = dk + 8, ls = cols + 4, lb = cols + 8;
  SharedCarve sh{reinterpret_cast<uintptr_t>(LT_DYNAMIC_SHARED(unsigned char))};
  DeltaTileGates* tgs;  // [2]: tile t's in tgs[t % 2]
  float* S;             // [dk, cols] f32: the state's columns j0 .. j0 + cols − 1
  bf16 *Sb, *ws, *ks, *us, *vd;
  delta_states_carve(sh, dk, cols, &tgs, &S, &Sb, &ws, &ks, &us, &vd);
  auto fetch_w_u = [&](int64_t tile) {  // tile's gates, W rows and U columns j0 ..
    const int64_t index = slot * tiles + tile;
    fetch_tile_gates(tile % 2 ? tgs[1] : tgs[0], gates + index * kDeltaTileGatesBytes);
    load_tile_rows<true>(ws, lk, W + index * kDeltaTile * dk, dk, kDeltaTile, dk, kDeltaTile);
    load_tile_rows<true>(us, lb, UV + index * kDeltaTile * dv + j0, dv, kDeltaTile, cols, kDeltaTile);
  };
  auto fetch_k = [&](int64_t tile) {  // tile's K rows (zero past the row's end)
    const int64_t t0 = tile * kDeltaTile;
    load_tile_rows<true>(ks, lk, k + (b * s.T + t0) * s.ldk + kh * dk, s.ldk, kDeltaTile, dk,
                         delta_tile_tokens(s, t0));
  };
  fetch_w_u(0);
  async_commit();
  fetch_k(0);
  async_commit();
  for (int64_t tile = 0; tile < tiles; ++tile) {
    const int64_t index = slot * tiles + tile;
    const DeltaTileGates& tg = tile % 2 ? tgs[1] : tgs[0];
    async_wait<1>();  // this tile's gates, W and U (its K may still be on the way)
    __syncthreads();
    if (tg.starts)
      for (int x = int(threadIdx.x); x < dk * cols; x += int(blockDim.x)) S[x / cols * ls + x % cols] = 0.0f;
    bf16* S0 = states + index * dk * dv + j0;  // [dk, dv]: this block's columns
    for (int x = int(threadIdx.x); x < dk * cols; x += int(blockDim.x)) {  // the reset's elements, thread by thread
      const int d = x / cols, j = x % cols;
      const bf16 rounded = __float2bfloat16_rn(S[d * ls + j]);
      Sb[d * lb + j] = rounded;
      S0[d * dv + j] = rounded;
    }
    async_wait<0>();
    __syncthreads();
    // V' = U − W S₀ for the tokens S₀ reaches (U elsewhere), in U's place; vd = diag(e^{γ_C − γ}) V' of the tokens
    // that reach the end state.
    bf16* Vt = UV + index * kDeltaTile * dv + j0;
    block_mma(
        kDeltaTile, cols, dk, SmemA<true>(ws, lk), SmemB<false>(Sb, lb),
        [&](int i, int j, float ws0) {
          const float vp = __bfloat162float(us[i * lb + j]) - (tg.first(i) ? ws0 : 0.0f);
          Vt[i * dv + j] = __float2bfloat16_rn(vp);
          vd[i * lb + j] = __float2bfloat16_rn(tg.last(i) ? vp * tg.egc[i] : 0.0f);
        });
    __syncthreads();
    // W and U are read: the next tile's load behind the state update (its gates into the other buffer). A group
    // is committed either way, so the waits above count the same at the last tile.
    if (tile + 1 < tiles) fetch_w_u(tile + 1);
    async_commit();
    // S ← e^{γ_C} S + Kᵀ vd, S₀'s term only where the tile's last document is its first.
    const float keep = tg.carry() ? tg.eg[tg.C - 1] : 0.0f;
    block_mma(
        dk, cols, kDeltaTile, SmemA<false>(ks, lk), SmemB<false>(vd, lb),
        [&](int d, int j, float kv) { S[d * ls + j] = keep * S[d * ls + j] + kv; });
    __syncthreads();
    if (tile + 1 < tiles) fetch_k(tile + 1);  // behind the next tile's S₀
    async_commit();
  }
}

// ---- 3. output -------------------------------------------------------------------------------------------------

template <class Carve>
LT_HD_INLINE void delta_output_carve(Carve& sh, int dk, int dv, DeltaTileGates** tg, bf16** qs, bf16** ks, bf16** S0,
                                     bf16** vp, bf16** P) {
  *tg = sh.template take<DeltaTileGates>(1);
  *qs = sh.template take<bf16>(kDeltaTile * (dk + 8)), *ks = sh.template take<bf16>(kDeltaTile * (dk + 8));
  *S0 = sh.template take<bf16>(dk * (dv + 8)), *vp = sh.template take<bf16>(kDeltaTile * (dv + 8));
  *P = sh.template take<bf16>(kDeltaTile * kTileLd);
}

__global__ void __launch_bounds__(kDeltaMmaThreads)
    delta_output_kernel(bf16* o, const bf16* q, const bf16* k, const bf16* UV, const bf16* states, const float* beta,
                        const float* g, const int32_t* doc_ids, DeltaShape s) {
  const DeltaTileAt at = DeltaTileAt::of(blockIdx.x, s);
  const int dk = int(s.dk), dv = int(s.dv), lk = dk + 8, lv = dv + 8;
  SharedCarve sh{reinterpret_cast<uintptr_t>(LT_DYNAMIC_SHARED(unsigned char))};
  DeltaTileGates* tgp;
  bf16 *qs, *ks, *S0, *vp, *P;
  delta_output_carve(sh, dk, dv, &tgp, &qs, &ks, &S0, &vp, &P);
  DeltaTileGates& tg = *tgp;
  load_tile_gates(tg, at.b, at.t0, at.vh, beta, g, doc_ids, s);
  load_tile_rows(qs, lk, q + at.n0 * s.ldq + at.kh * dk, s.ldq, kDeltaTile, dk, tg.C);
  load_tile_rows(ks, lk, k + at.n0 * s.ldk + at.kh * dk, s.ldk, kDeltaTile, dk, tg.C);
  load_tile_rows(S0, lv, states + at.index() * dk * dv, dv, dk, dv, dk);
  load_tile_rows(vp, lv, UV + at.index() * kDeltaTile * dv, dv, kDeltaTile, dv, kDeltaTile);
  __syncthreads();
  block_mma(
      kDeltaTile, kDeltaTile, dk, SmemA<true>(qs, lk), SmemB<true>(ks, lk),
      [&](int i, int j, float qk) { P[i * kTileLd + j] = __float2bfloat16_rn(s.scale * qk * tg.decay(i, j)); });
  __syncthreads();
  const int64_t ldo = s.Hv * s.dv;
  bf16* out = o + at.n0 * ldo + at.vh * dv;
  block_mma2(
      kDeltaTile, dv, dk, SmemA<true>(qs, lk), SmemB<false>(S0, lv), kDeltaTile,
      SmemA<true>(P, kTileLd), SmemB<false>(vp, lv),
      [&](int i, int j, float qs0, float pv) {
        if (i < tg.C) store(out + i * ldo + j, (tg.first(i) ? s.scale * tg.eg[i] * qs0 : 0.0f) + pv);
      });
}

// ---- launch ----------------------------------------------------------------------------------------------------

struct DeltaMmaShared {
  size_t prepare, states, output;
  static DeltaMmaShared of(const DeltaShape& s) {
    const int dk = int(s.dk), dv = int(s.dv);
    DeltaTileGates* tg;
    bf16 *b1, *b2, *b3, *b4, *b5;
    float *f1, *f2;
    SharedCarve p{0}, st{0}, out{0};
    delta_prepare_carve(p, dk, dv, &tg, &b1, &b2, &f1, &f2, &b3, &b4);
    delta_states_carve(st, dk, kDeltaStateCols, &tg, &f1, &b1, &b2, &b3, &b4, &b5);
    delta_output_carve(out, dk, dv, &tg, &b1, &b2, &b3, &b4, &b5);
    return {p.used, st.used, out.used};
  }
};

// Rows [b0, b0 + r.B) of the batch (r the group's shape, the pointers at its first row).
inline void gated_delta_forward_mma_rows(Stream st, bf16* o, const bf16* q, const bf16* k, const bf16* v,
                                         const float* beta, const float* g, const int32_t* doc_ids,
                                         const DeltaShape& r, const DeltaMmaWorkspace& w) {
  bf16 *W = dev(w.W), *UV = dev(w.UV), *states = dev(w.states);
  const DeltaMmaShared shared = DeltaMmaShared::of(r);
  const int64_t tiles = (r.T + kDeltaTile - 1) / kDeltaTile, parts = r.dv / kDeltaStateCols;
  const dim3 tile_blocks(unsigned(r.B * r.Hv * tiles)), threads(kDeltaMmaThreads);
  detail::allow_shared(delta_prepare_kernel, shared.prepare);
  detail::allow_shared(delta_states_kernel, shared.states);
  detail::allow_shared(delta_output_kernel, shared.output);
  LT_LAUNCH(delta_prepare_kernel, tile_blocks, threads, shared.prepare, native_stream(st), W, UV, w.gates, k, v,
            beta, g, doc_ids, r);
  LT_LAUNCH(delta_states_kernel, dim3(unsigned(r.B * r.Hv * parts)), threads, shared.states, native_stream(st), UV,
            states, W, w.gates, k, r);
  LT_LAUNCH(delta_output_kernel, tile_blocks, threads, shared.output, native_stream(st), o, q, k, UV, states, beta,
            g, doc_ids, r);
}

inline void gated_delta_forward_mma(Stream st, bf16* o, const bf16* q, const bf16* k, const bf16* v, const float* beta,
                                    const float* g, const int32_t* doc_ids, const DeltaShape& s, void* workspace) {
  const DeltaMmaWorkspace w = DeltaMmaWorkspace::carve(workspace, s, gated_delta_forward_rows(s));
  for (int64_t b0 = 0; b0 < s.B; b0 += w.rows) {
    DeltaShape r = s;
    r.B = std::min(w.rows, s.B - b0);
    const int64_t n0 = b0 * s.T;
    gated_delta_forward_mma_rows(st, o + n0 * s.Hv * s.dv, q + n0 * s.ldq, k + n0 * s.ldk, v + n0 * s.ldv,
                                 beta + n0 * s.Hv, g + n0 * s.Hv, doc_ids ? doc_ids + n0 : nullptr, r, w);
  }
}

}  // namespace lt::cuda::LT_KERNELS_NS
