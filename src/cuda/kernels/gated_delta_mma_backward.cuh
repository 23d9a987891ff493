// cuda/kernels/gated_delta_mma_backward.cuh — the gated delta rule's backward on tensor cores, reverse-mode through
// gated_delta_mma.cuh's tiles (its notation: tile tokens i, j; masks first f, last l, carry c; σ the q scale). The
// forward's prepare and states launches run again (nothing is kept between the passes), leaving W, V' and every
// tile's S₀; then, split as FLA's chunked backward is, only the state gradient runs in sequence:
//   1. output,  a block per tile:  P = σ Q Kᵀ ⊙ E; dV'ₗ = Pᵀ dO; dP = dO V'ᵀ; dq = σ (dP ⊙ E) K + diag(f σ e^γ) dO S₀ᵀ;
//      dk = σ (dP ⊙ E)ᵀ Q; dγ from E (row minus column sums of dP ⊙ P) and from e^γ (Σ_d q ⊙ dq's S₀ part);
//   2. states,  a block per (row, value head, 16 or 32 value dims), tile after tile from the last: dS₁ to the
//      workspace; dV' = dV'ₗ + diag(l e^{γ_C − γ}) K dS₁; dS₀ = c e^{γ_C} dS₁ + Qᵀ diag(f σ e^γ) dO − Wᵀ diag(f) dV'
//      (zero into a tile whose successor starts a document);
//   3. state gradients, a block per tile: dW = −diag(f) dV' S₀ᵀ (in W's place); dk += diag(l e^{γ_C − γ}) V' dS₁ᵀ;
//      dγ from e^{γ_C − γ} and from c e^{γ_C} (Σ S₀ ⊙ dS₁);
//   4. WY gradients, a block per tile: A again (the forward's steps); dA = (dW Kᵀ) diag(β e^γ) + (dV' Vᵀ) diag(β)
//      to the workspace, dβ and dγ from those diagonals; dk += Awᵀ dW; dv = Auᵀ dV';
//   5. decay gradients, a block per tile: dM = −Aᵀ dA Aᵀ (strictly lower, f32 on CUDA cores, 4 × 4 outputs a
//      thread), dK Kᵀ, dβ and dγ from M = β K Kᵀ ⊙ E, dk += (dKK + dKKᵀ) K, and the tile's dg = reverse cumsum of
//      dγ, dβ written;
//   6. dq and dk of each key head: its value heads' partials summed in value-head order (no atomics).
// Every output element is one lane's or thread's fixed sequence (mma k-steps, loops in index order) and the steps
// touching one element are apart by barriers or launches, so the bits depend on neither the launch nor the thread
// order. Products take bf16 operands (dO, dS₁, dV', dW, dP ⊙ E rounded once each) and sum in f32; gates in f32.
//
// Workspace: the forward's (W, V', S₀) and dS₁, dV', the value heads' dq and dk partials, dA and dγ, per batch row
// (DeltaMmaBackwardWorkspace): the launcher runs groups of rows that fit kDeltaWorkspaceBytes (1.3 GB a row at
// the FLA anchor's 8192 tokens × 48 heads of 128, 160 MB at 1024 tokens).
#pragma once

#include "cuda/kernels/gated_delta_mma.cuh"

namespace lt::cuda::LT_KERNELS_NS {

// rows × cols of f32 from global (row stride ld), each row times scale(r) (0 for rows ≥ valid), rounded to bf16
// into shared (row stride lds).
template <class Scale>
__device__ void load_tile_rows_rounded(bf16* dst, int lds, const float* src, int64_t ld, int rows, int cols, int valid,
                                       const Scale& scale) {
  for (int x = int(threadIdx.x); x < rows * cols; x += int(blockDim.x)) {
    const int r = x / cols, c = x % cols;
    dst[r * lds + c] = __float2bfloat16_rn(r < valid ? scale(r) * src[r * ld + c] : 0.0f);
  }
}

// The workspace's bf16 (the API's raw bf16_t) as the kernels' type, in device code.
__device__ __forceinline__ bf16* tile_bf16(bf16_t* p) { return reinterpret_cast<bf16*>(p); }

// The dq and dk partials, dV', dA and dγ of a tile, [64, ·] each, at its index (DeltaTileAt::index).
struct DeltaTileGrads {
  float *dq, *dk, *dVp, *dA, *dgam;
  __device__ static DeltaTileGrads at(const DeltaMmaBackwardWorkspace& w, int64_t index, const DeltaShape& s) {
    return {w.dq_part + index * kDeltaTile * s.dk, w.dk_part + index * kDeltaTile * s.dk,
            w.dVp + index * kDeltaTile * s.dv, w.dA + index * kDeltaTile * kDeltaTile, w.dgam + index * kDeltaTile};
  }
};

// ---- 1. output -------------------------------------------------------------------------------------------------

template <class Carve>
LT_HD_INLINE void delta_backward_output_carve(Carve& sh, int dk, int dv, DeltaTileGates** tg, bf16** qs, bf16** ks,
                                              bf16** dOb, bf16** R, float** Pf, bf16** Pb, float** dg) {
  *tg = sh.template take<DeltaTileGates>(1);
  *qs = sh.template take<bf16>(kDeltaTile * (dk + 8)), *ks = sh.template take<bf16>(kDeltaTile * (dk + 8));
  *dOb = sh.template take<bf16>(kDeltaTile * (dv + 8)), *R = sh.template take<bf16>(kDeltaTile * (dv + 8));
  *Pf = sh.template take<float>(kDeltaTile * (kDeltaTile + 1)), *Pb = sh.template take<bf16>(kDeltaTile * kTileLd);
  *dg = sh.template take<float>(kDeltaTile);
}

__global__ void __launch_bounds__(kDeltaMmaThreads)
    delta_backward_output_kernel(DeltaMmaBackwardWorkspace w, const float* dout, const bf16* q, const bf16* k,
                                 const float* beta, const float* g, const int32_t* doc_ids, DeltaShape s) {
  const DeltaTileAt at = DeltaTileAt::of(blockIdx.x, s);
  const DeltaTileGrads t = DeltaTileGrads::at(w, at.index(), s);
  const int dk = int(s.dk), dv = int(s.dv), lk = dk + 8, lv = dv + 8, lp = kDeltaTile + 1;
  const int64_t ldo = s.Hv * s.dv;
  SharedCarve sh{reinterpret_cast<uintptr_t>(LT_DYNAMIC_SHARED(unsigned char))};
  DeltaTileGates* tgp;
  bf16 *qs, *ks, *dOb, *R, *Pb;  // R: V', then S₀ 64 of its rows at a time
  float *Pf, *dg;
  delta_backward_output_carve(sh, dk, dv, &tgp, &qs, &ks, &dOb, &R, &Pf, &Pb, &dg);
  const DeltaTileGates& tg = *tgp;
  load_tile_gates(*tgp, at.b, at.t0, at.vh, beta, g, doc_ids, s);
  load_tile_rows(qs, lk, q + at.n0 * s.ldq + at.kh * dk, s.ldq, kDeltaTile, dk, tg.C);
  load_tile_rows(ks, lk, k + at.n0 * s.ldk + at.kh * dk, s.ldk, kDeltaTile, dk, tg.C);
  load_tile_rows_rounded(dOb, lv, dout + at.n0 * ldo + at.vh * dv, ldo, kDeltaTile, dv, tg.C, [](int) { return 1.0f; });
  load_tile_rows(R, lv, tile_bf16(w.forward.UV) + at.index() * kDeltaTile * dv, dv, kDeltaTile, dv, kDeltaTile);
  __syncthreads();
  block_mma(
      kDeltaTile, kDeltaTile, dk, SmemA<true>(qs, lk), SmemB<true>(ks, lk),
      [&](int i, int j, float qk) {
        const float p = s.scale * qk * tg.decay(i, j);
        Pf[i * lp + j] = p;
        Pb[i * kTileLd + j] = __float2bfloat16_rn(p);
      });
  __syncthreads();
  // dV'ₗ = Pᵀ dO.
  block_mma(
      kDeltaTile, dv, kDeltaTile, SmemA<false>(Pb, kTileLd), SmemB<false>(dOb, lv),
      [&](int i, int j, float x) { t.dVp[i * dv + j] = x; });
  __syncthreads();
  // dP = dO V'ᵀ: dP ⊙ P in Pf's place (E's share of dγ), σ dP ⊙ E rounded in Pb's.
  block_mma(
      kDeltaTile, kDeltaTile, dv, SmemA<true>(dOb, lv), SmemB<true>(R, lv),
      [&](int i, int j, float dp) {
        Pf[i * lp + j] *= dp;
        Pb[i * kTileLd + j] = __float2bfloat16_rn(s.scale * dp * tg.decay(i, j));
      });
  __syncthreads();
  // E_ij = e^{γ_i − γ_j}: dγ_i = Σ_j (dP ⊙ P)_ij − Σ_m (dP ⊙ P)_mi.
  for (int i = int(threadIdx.x); i < kDeltaTile; i += int(blockDim.x)) {
    float r = 0.0f;
    for (int j = 0; j < kDeltaTile; ++j) r += Pf[i * lp + j];
    for (int m = 0; m < kDeltaTile; ++m) r -= Pf[m * lp + i];
    dg[i] = r;
  }
  block_mma(
      kDeltaTile, dk, kDeltaTile, SmemA<true>(Pb, kTileLd), SmemB<false>(ks, lk),
      [&](int i, int d, float x) { t.dq[i * dk + d] = x; });
  block_mma(
      kDeltaTile, dk, kDeltaTile, SmemA<false>(Pb, kTileLd), SmemB<false>(qs, lk),
      [&](int i, int d, float x) { t.dk[i * dk + d] = x; });
  __syncthreads();
  // dq += diag(f σ e^γ) dO S₀ᵀ, by 64 of S₀'s rows at a time; dγ_i += Σ_d q_id (that)_id (Pf the products).
  const bf16* S0 = tile_bf16(w.forward.states) + at.index() * dk * dv;
  for (int d0 = 0; d0 < dk; d0 += kDeltaTile) {
    const int rows = dk - d0 < kDeltaTile ? dk - d0 : kDeltaTile;
    load_tile_rows(R, lv, S0 + int64_t(d0) * dv, dv, rows, dv, rows);
    __syncthreads();
    block_mma(
        kDeltaTile, rows, dv, SmemA<true>(dOb, lv), SmemB<true>(R, lv),
        [&](int i, int d, float x) {
          const float dq = tg.first(i) ? s.scale * tg.eg[i] * x : 0.0f;
          t.dq[i * dk + d0 + d] += dq;
          Pf[i * lp + d] = dq * __bfloat162float(qs[i * lk + d0 + d]);
        });
    __syncthreads();
    for (int i = int(threadIdx.x); i < kDeltaTile; i += int(blockDim.x))
      for (int d = 0; d < rows; ++d) dg[i] += Pf[i * lp + d];
    __syncthreads();
  }
  for (int i = int(threadIdx.x); i < kDeltaTile; i += int(blockDim.x)) t.dgam[i] = dg[i];
}

// ---- 2. states -------------------------------------------------------------------------------------------------

template <class Carve>
LT_HD_INLINE void delta_backward_states_carve(Carve& sh, int dk, int cols, DeltaTileGates** tg, float** dS, bf16** dSb,
                                              bf16** qs, bf16** ks, bf16** ws, bf16** dOs, bf16** dVb) {
  *tg = sh.template take<DeltaTileGates>(1);
  *dS = sh.template take<float>(dk * (cols + 4)), *dSb = sh.template take<bf16>(dk * (cols + 8));
  *qs = sh.template take<bf16>(kDeltaTile * (dk + 8)), *ks = sh.template take<bf16>(kDeltaTile * (dk + 8));
  *ws = sh.template take<bf16>(kDeltaTile * (dk + 8));
  *dOs = sh.template take<bf16>(kDeltaTile * (cols + 8)), *dVb = sh.template take<bf16>(kDeltaTile * (cols + 8));
}

__global__ void __launch_bounds__(kDeltaMmaThreads)
    delta_backward_states_kernel(DeltaMmaBackwardWorkspace w, const float* dout, const bf16* q, const bf16* k,
                                 const int32_t* doc_ids, DeltaShape s) {
  const int cols = kDeltaStateCols, parts = int(s.dv) / cols;
  const int64_t slot = blockIdx.x / parts, b = slot / s.Hv, vh = slot % s.Hv, kh = vh / (s.Hv / s.Hk);
  const int64_t tiles = (s.T + kDeltaTile - 1) / kDeltaTile, j0 = int64_t(blockIdx.x % parts) * cols;
  const int dk = int(s.dk), dv = int(s.dv), lk = dk + 8, ls = cols + 4, lb = cols + 8;
  const int64_t ldo = s.Hv * s.dv;
  SharedCarve sh{reinterpret_cast<uintptr_t>(LT_DYNAMIC_SHARED(unsigned char))};
  DeltaTileGates* tgp;
  float* dS;  // [dk, cols] f32: the gradient of the current tile's end state, columns j0 .. j0 + cols − 1
  bf16 *dSb, *qs, *ks, *ws, *dOs, *dVb;
  delta_backward_states_carve(sh, dk, cols, &tgp, &dS, &dSb, &qs, &ks, &ws, &dOs, &dVb);
  const DeltaTileGates& tg = *tgp;
  // A tile's operands load behind the next-later tile's work (cp.async), one buffer each (three blocks an SM at
  // 74.3 KiB): K's rows once that tile's dV' product has read them; its gates (as prepare made them), Q's and W's
  // rows once its dS product has.
  auto fetch_k = [&](int64_t tile) {
    const int64_t t0 = tile * kDeltaTile;
    load_tile_rows<true>(ks, lk, k + (b * s.T + t0) * s.ldk + kh * dk, s.ldk, kDeltaTile, dk,
                         delta_tile_tokens(s, t0));
    async_commit();
  };
  auto fetch_q_w = [&](int64_t tile) {
    const int64_t t0 = tile * kDeltaTile, index = slot * tiles + tile;
    fetch_tile_gates(*tgp, w.forward.gates + index * kDeltaTileGatesBytes);
    load_tile_rows<true>(qs, lk, q + (b * s.T + t0) * s.ldq + kh * dk, s.ldq, kDeltaTile, dk,
                         delta_tile_tokens(s, t0));
    load_tile_rows<true>(ws, lk, tile_bf16(w.forward.W) + index * kDeltaTile * dk, dk, kDeltaTile, dk, kDeltaTile);
    async_commit();
  };
  fetch_k(tiles - 1);
  fetch_q_w(tiles - 1);
  for (int64_t tile = tiles - 1; tile >= 0; --tile) {
    const int64_t t0 = tile * kDeltaTile, n0 = b * s.T + t0, index = slot * tiles + tile;
    async_wait<0>();
    __syncthreads();
    // The row's last tile, or one whose successor starts a document: nothing flows back into its end state.
    const bool reset = tile == tiles - 1 || (doc_ids && doc_ids[n0 + kDeltaTile] != doc_ids[n0 + kDeltaTile - 1]);
    if (reset)
      for (int x = int(threadIdx.x); x < dk * cols; x += int(blockDim.x)) dS[x / cols * ls + x % cols] = 0.0f;
    load_tile_rows_rounded(dOs, lb, dout + n0 * ldo + vh * dv + j0, ldo, kDeltaTile, cols, tg.C,
                           [&](int i) { return tg.first(i) ? s.scale * tg.eg[i] : 0.0f; });
    bf16* dS1 = tile_bf16(w.dstates) + index * dk * dv + j0;
    for (int x = int(threadIdx.x); x < dk * cols; x += int(blockDim.x)) {  // the reset's elements, thread by thread
      const int d = x / cols, j = x % cols;
      const bf16 rounded = __float2bfloat16_rn(dS[d * ls + j]);
      dSb[d * lb + j] = rounded;
      dS1[d * dv + j] = rounded;
    }
    __syncthreads();
    // dV' = dV'ₗ + diag(l e^{γ_C − γ}) K dS₁; dVb = diag(f) dV' for Wᵀ's product.
    float* dVt = w.dVp + index * kDeltaTile * dv + j0;
    block_mma(
        kDeltaTile, cols, dk, SmemA<true>(ks, lk), SmemB<false>(dSb, lb),
        [&](int i, int j, float kds) {
          const float dvp = dVt[i * dv + j] + (tg.last(i) ? tg.egc[i] * kds : 0.0f);
          dVt[i * dv + j] = dvp;
          dVb[i * lb + j] = __float2bfloat16_rn(tg.first(i) ? dvp : 0.0f);
        });
    __syncthreads();
    if (tile > 0) fetch_k(tile - 1);  // K is read: the earlier tile's load behind the dS product
    const float keep = tg.carry() ? tg.eg[tg.C - 1] : 0.0f;
    block_mma2(
        dk, cols, kDeltaTile, SmemA<false>(qs, lk), SmemB<false>(dOs, lb), kDeltaTile,
        SmemA<false>(ws, lk), SmemB<false>(dVb, lb),
        [&](int d, int j, float qdo, float wdv) { dS[d * ls + j] = keep * dS[d * ls + j] + qdo - wdv; });
    __syncthreads();  // every thread has its `keep`: the gates' buffer is free too
    if (tile > 0) fetch_q_w(tile - 1);
  }
}

// ---- 3. state gradients ----------------------------------------------------------------------------------------

template <class Carve>
LT_HD_INLINE void delta_backward_state_grads_carve(Carve& sh, int dv, DeltaTileGates** tg, bf16** Vb, bf16** dVb,
                                                   bf16** Sc, bf16** dSc, float** X, float** rows, float** partial) {
  *tg = sh.template take<DeltaTileGates>(1);
  *Vb = sh.template take<bf16>(kDeltaTile * (dv + 8)), *dVb = sh.template take<bf16>(kDeltaTile * (dv + 8));
  *Sc = sh.template take<bf16>(kDeltaTile * (dv + 8)), *dSc = sh.template take<bf16>(kDeltaTile * (dv + 8));
  *X = sh.template take<float>(kDeltaTile * (kDeltaTile + 1)), *rows = sh.template take<float>(kDeltaTile);
  *partial = sh.template take<float>(kDeltaMmaThreads);
}

__global__ void __launch_bounds__(kDeltaMmaThreads)
    delta_backward_state_grads_kernel(DeltaMmaBackwardWorkspace w, const bf16* k, const float* beta, const float* g,
                                      const int32_t* doc_ids, DeltaShape s) {
  const DeltaTileAt at = DeltaTileAt::of(blockIdx.x, s);
  const DeltaTileGrads t = DeltaTileGrads::at(w, at.index(), s);
  const int dk = int(s.dk), dv = int(s.dv), lv = dv + 8, lx = kDeltaTile + 1, tid = int(threadIdx.x);
  SharedCarve sh{reinterpret_cast<uintptr_t>(LT_DYNAMIC_SHARED(unsigned char))};
  DeltaTileGates* tgp;
  bf16 *Vb, *dVb, *Sc, *dSc;  // V', diag(f) dV', and 64 rows at a time of S₀ and dS₁
  float *X, *rs, *partial;
  delta_backward_state_grads_carve(sh, dv, &tgp, &Vb, &dVb, &Sc, &dSc, &X, &rs, &partial);
  const DeltaTileGates& tg = *tgp;
  load_tile_gates(*tgp, at.b, at.t0, at.vh, beta, g, doc_ids, s);
  load_tile_rows(Vb, lv, tile_bf16(w.forward.UV) + at.index() * kDeltaTile * dv, dv, kDeltaTile, dv, kDeltaTile);
  load_tile_rows_rounded(dVb, lv, t.dVp, dv, kDeltaTile, dv, kDeltaTile,
                         [&](int i) { return tg.first(i) ? 1.0f : 0.0f; });
  for (int i = tid; i < kDeltaTile; i += int(blockDim.x)) rs[i] = 0.0f;
  const bf16* S0 = tile_bf16(w.forward.states) + at.index() * dk * dv;
  const bf16* dS1 = tile_bf16(w.dstates) + at.index() * dk * dv;
  bf16* dW = tile_bf16(w.forward.W) + at.index() * kDeltaTile * dk;
  const bf16* kt = k + at.n0 * s.ldk + at.kh * dk;
  float sd = 0.0f;  // this thread's share of Σ S₀ ⊙ dS₁, elements x ≡ tid in order
  for (int d0 = 0; d0 < dk; d0 += kDeltaTile) {
    const int rows = dk - d0 < kDeltaTile ? dk - d0 : kDeltaTile;
    load_tile_rows(Sc, lv, S0 + int64_t(d0) * dv, dv, rows, dv, rows);
    load_tile_rows(dSc, lv, dS1 + int64_t(d0) * dv, dv, rows, dv, rows);
    __syncthreads();
    for (int x = tid; x < rows * dv; x += int(blockDim.x))
      sd += __bfloat162float(Sc[x / dv * lv + x % dv]) * __bfloat162float(dSc[x / dv * lv + x % dv]);
    // dW = −diag(f) dV' S₀ᵀ.
    block_mma(
        kDeltaTile, rows, dv, SmemA<true>(dVb, lv), SmemB<true>(Sc, lv),
        [&](int i, int d, float x) { dW[i * dk + d0 + d] = __float2bfloat16_rn(-x); });
    // dk += diag(l e^{γ_C − γ}) V' dS₁ᵀ; its row dots with k give e^{γ_C − γ}'s share of dγ.
    block_mma(
        kDeltaTile, rows, dv, SmemA<true>(Vb, lv), SmemB<true>(dSc, lv),
        [&](int i, int d, float x) {
          const float dkv = tg.last(i) ? tg.egc[i] * x : 0.0f;
          t.dk[i * dk + d0 + d] += dkv;
          X[i * lx + d] = i < tg.C ? dkv * __bfloat162float(kt[i * s.ldk + d0 + d]) : 0.0f;
        });
    __syncthreads();
    for (int i = tid; i < kDeltaTile; i += int(blockDim.x))
      for (int d = 0; d < rows; ++d) rs[i] += X[i * lx + d];
    __syncthreads();
  }
  partial[tid] = sd;
  __syncthreads();
  // e^{γ_C − γ_i}: dγ_i −= s_i, dγ_{C−1} += Σ_i s_i; c e^{γ_C} S₀: dγ_{C−1} += c e^{γ_C} Σ S₀ ⊙ dS₁.
  if (tid == 0) {
    float sum = 0.0f, total = 0.0f;
    for (int i = 0; i < kDeltaTile; ++i) sum += rs[i];
    for (int x = 0; x < int(blockDim.x); ++x) total += partial[x];
    t.dgam[tg.C - 1] += sum + (tg.carry() ? tg.eg[tg.C - 1] * total : 0.0f);
  }
  __syncthreads();
  for (int i = tid; i < kDeltaTile; i += int(blockDim.x)) t.dgam[i] -= rs[i];
}

// ---- 4. WY gradients -------------------------------------------------------------------------------------------

template <class Carve>
LT_HD_INLINE void delta_backward_wy_carve(Carve& sh, int dk, int dv, DeltaTileGates** tg, bf16** kv, float** X,
                                          float** A, bf16** dWb, bf16** dVb, float** col_beta, float** col_gam) {
  *tg = sh.template take<DeltaTileGates>(1);
  *kv = sh.template take<bf16>(kDeltaTile * ((dk > dv ? dk : dv) + 8));
  *X = sh.template take<float>(kDeltaTile * kTileLd), *A = sh.template take<float>(kDeltaTile * (kDeltaTile + 1));
  *dWb = sh.template take<bf16>(kDeltaTile * (dk + 8)), *dVb = sh.template take<bf16>(kDeltaTile * (dv + 8));
  *col_beta = sh.template take<float>(kDeltaTile), *col_gam = sh.template take<float>(kDeltaTile);
}

__global__ void __launch_bounds__(kDeltaMmaThreads)
    delta_backward_wy_kernel(DeltaMmaBackwardWorkspace w, float* dv_out, float* dbeta, const bf16* k, const bf16* v,
                             const float* beta, const float* g, const int32_t* doc_ids, DeltaShape s) {
  const DeltaTileAt at = DeltaTileAt::of(blockIdx.x, s);
  const DeltaTileGrads t = DeltaTileGrads::at(w, at.index(), s);
  const int dk = int(s.dk), dv = int(s.dv), lk = dk + 8, lv = dv + 8, la = kDeltaTile + 1, tid = int(threadIdx.x);
  SharedCarve sh{reinterpret_cast<uintptr_t>(LT_DYNAMIC_SHARED(unsigned char))};
  DeltaTileGates* tgp;
  bf16 *kv, *dWb, *dVb;  // kv: K, then V
  float *X, *A, *cb, *cg;  // X: K Kᵀ ⊙ E, then products to sum by column, then Aw | Au
  delta_backward_wy_carve(sh, dk, dv, &tgp, &kv, &X, &A, &dWb, &dVb, &cb, &cg);
  const DeltaTileGates& tg = *tgp;
  load_tile_gates(*tgp, at.b, at.t0, at.vh, beta, g, doc_ids, s);
  load_tile_rows(kv, lk, k + at.n0 * s.ldk + at.kh * dk, s.ldk, kDeltaTile, dk, tg.C);
  load_tile_rows(dWb, lk, tile_bf16(w.forward.W) + at.index() * kDeltaTile * dk, dk, kDeltaTile, dk, kDeltaTile);
  load_tile_rows_rounded(dVb, lv, t.dVp, dv, kDeltaTile, dv, kDeltaTile, [](int) { return 1.0f; });
  __syncthreads();
  tile_key_products(X, kTileLd, tg, kv, lk, dk);
  tile_unit_lower_inverse(A, la, X, kTileLd, tg);
  // Aw = A diag(β e^γ): dA = (dW Kᵀ) diag(β e^γ); dβ_j, dγ_j from Σ_i A_ij e^{γ_j} (dW Kᵀ)_ij.
  block_mma(
      kDeltaTile, kDeltaTile, dk, SmemA<true>(dWb, lk), SmemB<true>(kv, lk),
      [&](int i, int j, float x) {
        t.dA[i * kDeltaTile + j] = tg.beta[j] * tg.eg[j] * x;
        X[i * kTileLd + j] = A[i * la + j] * tg.eg[j] * x;
      });
  __syncthreads();
  for (int j = tid; j < kDeltaTile; j += int(blockDim.x)) {
    float x = 0.0f;
    for (int i = 0; i < kDeltaTile; ++i) x += X[i * kTileLd + j];
    cb[j] = x;
    cg[j] = tg.beta[j] * x;
  }
  load_tile_rows(kv, lv, v + at.n0 * s.ldv + at.vh * dv, s.ldv, kDeltaTile, dv, tg.C);
  __syncthreads();
  // Au = A diag(β): dA += (dV' Vᵀ) diag(β); dβ_j += Σ_i A_ij (dV' Vᵀ)_ij.
  block_mma(
      kDeltaTile, kDeltaTile, dv, SmemA<true>(dVb, lv), SmemB<true>(kv, lv),
      [&](int i, int j, float x) {
        t.dA[i * kDeltaTile + j] += tg.beta[j] * x;
        X[i * kTileLd + j] = A[i * la + j] * x;
      });
  __syncthreads();
  for (int j = tid; j < kDeltaTile; j += int(blockDim.x)) {
    float x = 0.0f;
    for (int i = 0; i < kDeltaTile; ++i) x += X[i * kTileLd + j];
    cb[j] += x;
  }
  __syncthreads();
  bf16* Aw = reinterpret_cast<bf16*>(X);  // X (f32 [64, 72]) holds the two bf16 [64, 72]
  bf16* Au = Aw + kDeltaTile * kTileLd;
  tile_wy_operands(Aw, Au, A, la, tg);
  // W = Aw K: dk += Awᵀ dW.  U = Au V: dv = Auᵀ dV' (v appears nowhere else).
  block_mma(
      kDeltaTile, dk, kDeltaTile, SmemA<false>(Aw, kTileLd), SmemB<false>(dWb, lk),
      [&](int i, int d, float x) { t.dk[i * dk + d] += x; });
  float* dvt = dv_out + at.n0 * s.ldv + at.vh * dv;
  block_mma(
      kDeltaTile, dv, kDeltaTile, SmemA<false>(Au, kTileLd), SmemB<false>(dVb, lv),
      [&](int i, int e, float x) {
        if (i < tg.C) dvt[i * s.ldv + e] = x;
      });
  for (int i = tid; i < kDeltaTile; i += int(blockDim.x)) {
    t.dgam[i] += cg[i];
    if (i < tg.C) dbeta[(at.n0 + i) * s.Hv + at.vh] = cb[i];
  }
}

// ---- 5. decay gradients ----------------------------------------------------------------------------------------

// The t-th pair (k, r ≤ k) of a lower triangle in row order: (0, 0), (1, 0), (1, 1), (2, 0), ...
struct TrianglePair {
  int k, r;
  __device__ static TrianglePair at(int t) {
    int k = 0;
    while ((k + 1) * (k + 2) / 2 <= t) ++k;
    return {k, t - k * (k + 1) / 2};
  }
};

// acc[u][v] += Σ_{m0 ≤ m < m1} a(m, u) b(m, v), m in order: 8 loads a step for 16 products.
template <class ColumnA, class ColumnB>
__device__ __forceinline__ void accumulate_outer_4x4(float (&acc)[4][4], int m0, int m1, const ColumnA& a,
                                                     const ColumnB& b) {
  for (int m = m0; m < m1; ++m) {
    float x[4], y[4];
    for (int u = 0; u < 4; ++u) x[u] = a(m, u), y[u] = b(m, u);
    for (int u = 0; u < 4; ++u)
      for (int v = 0; v < 4; ++v) acc[u][v] += x[u] * y[v];
  }
}

// A = (I + M)⁻¹ backward: dM = −Aᵀ dA Aᵀ, strictly lower, into dA's place ([64, l] f32 each; dA and A zero on and
// above the diagonal, but A's unit diagonal). Y = dA Aᵀ (Y_ij = Σ_{m < i, m ≤ j} dA_im A_jm; only j < i is read),
// then dM_ij = −Σ_{m ≥ i} A_mi Y_mj. A thread takes a 4 × 4 tile of outputs over one m loop: 8 shared loads feed 16
// products, where an output a thread loaded 2 a product — the two products (~131k) were the decay launch's ~8k
// cycles of shared-memory bandwidth a tile, counted. A tile's m range is its elements' union; the extra terms are
// products with A's or dA's exact zeros, before (dM) or after (Y) the element's own terms in m order, so each element
// has the bits of its own loop. Tiles go out largest first (Y's grows with its column, dM's shrinks with its row), a
// warp's lanes alike.
__device__ void tile_inverse_gradient(float* dA, float* Y, const float* A, int l) {
  constexpr int kTiles = kDeltaTile / 4, kLower = kTiles * (kTiles + 1) / 2;  // 16 tiles a side, 136 on or below
  const int tid = int(threadIdx.x), nt = int(blockDim.x);
  // Y's tiles (I ≥ J): m < 4J + 4 (dA_im = 0 from m = i, A_jm = 0 beyond j).
  for (int t = tid; t < kLower; t += nt) {
    const TrianglePair p = TrianglePair::at(t);
    const int J = kTiles - 1 - p.k, I = J + p.r;
    float acc[4][4] = {};
    accumulate_outer_4x4(acc, 0, 4 * J + 4, [&](int m, int u) { return dA[(4 * I + u) * l + m]; },
                         [&](int m, int v) { return A[(4 * J + v) * l + m]; });
    for (int u = 0; u < 4; ++u)
      for (int v = 0; v < 4; ++v) Y[(4 * I + u) * l + 4 * J + v] = acc[u][v];
  }
  __syncthreads();
  // dM's tiles (I ≥ J): m from 4I (A_mi = 0 below m = i; the Y_mj read are all in Y's tiles above); −0 on and above
  // the diagonal, as everywhere above it.
  for (int t = tid; t < kLower; t += nt) {
    const TrianglePair p = TrianglePair::at(t);
    const int I = p.k, J = p.r;
    float acc[4][4] = {};
    accumulate_outer_4x4(acc, 4 * I, kDeltaTile, [&](int m, int u) { return A[m * l + 4 * I + u]; },
                         [&](int m, int v) { return Y[m * l + 4 * J + v]; });
    for (int u = 0; u < 4; ++u)
      for (int v = 0; v < 4; ++v) dA[(4 * I + u) * l + 4 * J + v] = -(4 * J + v < 4 * I + u ? acc[u][v] : 0.0f);
  }
  for (int x = tid; x < kDeltaTile * kDeltaTile; x += nt) {
    const int i = x / kDeltaTile, j = x % kDeltaTile;
    if (j / 4 > i / 4) dA[i * l + j] = -0.0f;
  }
  __syncthreads();
}

template <class Carve>
LT_HD_INLINE void delta_backward_decay_carve(Carve& sh, int dk, DeltaTileGates** tg, bf16** ks, float** KKE, float** A,
                                             float** dA, float** Y, bf16** dKs, float** rows) {
  *tg = sh.template take<DeltaTileGates>(1);
  *ks = sh.template take<bf16>(kDeltaTile * (dk + 8));
  const int n = kDeltaTile * (kDeltaTile + 1);
  *KKE = sh.template take<float>(n), *A = sh.template take<float>(n), *dA = sh.template take<float>(n);
  *Y = sh.template take<float>(n), *dKs = sh.template take<bf16>(kDeltaTile * kTileLd);
  *rows = sh.template take<float>(2 * kDeltaTile);
}

__global__ void __launch_bounds__(kDeltaMmaThreads)
    delta_backward_decay_kernel(DeltaMmaBackwardWorkspace w, float* dbeta, float* dg, const bf16* k,
                                const float* beta, const float* g, const int32_t* doc_ids, DeltaShape s) {
  const DeltaTileAt at = DeltaTileAt::of(blockIdx.x, s);
  const DeltaTileGrads t = DeltaTileGrads::at(w, at.index(), s);
  const int dk = int(s.dk), lk = dk + 8, l = kDeltaTile + 1, tid = int(threadIdx.x), nt = int(blockDim.x);
  SharedCarve sh{reinterpret_cast<uintptr_t>(LT_DYNAMIC_SHARED(unsigned char))};
  DeltaTileGates* tgp;
  bf16 *ks, *dKs;
  float *KKE, *A, *dA, *Y, *rows;  // rows: dβ's and dγ's shares per token
  delta_backward_decay_carve(sh, dk, &tgp, &ks, &KKE, &A, &dA, &Y, &dKs, &rows);
  const DeltaTileGates& tg = *tgp;
  load_tile_gates(*tgp, at.b, at.t0, at.vh, beta, g, doc_ids, s);
  load_tile_rows(ks, lk, k + at.n0 * s.ldk + at.kh * dk, s.ldk, kDeltaTile, dk, tg.C);
  for (int x = tid; x < kDeltaTile * kDeltaTile; x += nt) {
    const int i = x / kDeltaTile, j = x % kDeltaTile;
    dA[i * l + j] = j < i ? t.dA[x] : 0.0f;  // A's free entries: strictly lower
  }
  __syncthreads();
  tile_key_products(KKE, l, tg, ks, lk, dk);
  tile_unit_lower_inverse(A, l, KKE, l, tg);
  tile_inverse_gradient(dA, Y, A, l);
  // M_ij = β_i KKE_ij: dβ_i = Σ_j dM_ij KKE_ij; dKK_ij = dM_ij β_i E_ij; dE_ij E_ij = dM_ij β_i KKE_ij (in KKE's place).
  for (int i = tid; i < kDeltaTile; i += nt) {
    float db = 0.0f;
    for (int j = 0; j < kDeltaTile; ++j) db += dA[i * l + j] * KKE[i * l + j];
    rows[i] = db;
  }
  __syncthreads();
  for (int x = tid; x < kDeltaTile * kDeltaTile; x += nt) {
    const int i = x / kDeltaTile, j = x % kDeltaTile;
    Y[i * l + j] = dA[i * l + j] * tg.beta[i] * tg.decay(i, j);
    KKE[i * l + j] = dA[i * l + j] * tg.beta[i] * KKE[i * l + j];
  }
  __syncthreads();
  for (int x = tid; x < kDeltaTile * kDeltaTile; x += nt) {
    const int i = x / kDeltaTile, j = x % kDeltaTile;
    dKs[i * kTileLd + j] = __float2bfloat16_rn(Y[i * l + j] + Y[j * l + i]);
  }
  // E_ij = e^{γ_i − γ_j}: dγ_i += Σ_j (dE ⊙ E)_ij − Σ_m (dE ⊙ E)_mi.
  for (int i = tid; i < kDeltaTile; i += nt) {
    float r = 0.0f;
    for (int j = 0; j < kDeltaTile; ++j) r += KKE[i * l + j];
    for (int m = 0; m < kDeltaTile; ++m) r -= KKE[m * l + i];
    rows[kDeltaTile + i] = r;
  }
  __syncthreads();
  // K Kᵀ: dk += (dKK + dKKᵀ) K.
  block_mma(
      kDeltaTile, dk, kDeltaTile, SmemA<true>(dKs, kTileLd), SmemB<false>(ks, lk),
      [&](int i, int d, float x) { t.dk[i * dk + d] += x; });
  // γ = cumsum(g) within the tile: dg_j = Σ_{i ≥ j} dγ_i, one thread from the last token.
  if (tid == 0) {
    float acc = 0.0f;
    for (int i = tg.C - 1; i >= 0; --i) {
      acc += t.dgam[i] + rows[kDeltaTile + i];
      dg[(at.n0 + i) * s.Hv + at.vh] = acc;
      dbeta[(at.n0 + i) * s.Hv + at.vh] += rows[i];
    }
  }
}

// ---- 6. dq and dk of the key heads -----------------------------------------------------------------------------

__global__ void delta_backward_heads_kernel(float* dq, float* dk, DeltaMmaBackwardWorkspace w, DeltaShape s) {
  const int64_t tiles = (s.T + kDeltaTile - 1) / kDeltaTile, group = s.Hv / s.Hk, n_all = s.B * s.T * s.Hk * s.dk;
  for (int64_t x = global_thread(); x < n_all; x += grid_threads()) {
    const int64_t d = x % s.dk, kh = x / s.dk % s.Hk, n = x / (s.dk * s.Hk), b = n / s.T, t = n % s.T;
    float sq = 0.0f, sk = 0.0f;
    for (int64_t vh = kh * group; vh < (kh + 1) * group; ++vh) {
      const int64_t at = (((b * s.Hv + vh) * tiles + t / kDeltaTile) * kDeltaTile + t % kDeltaTile) * s.dk + d;
      sq += w.dq_part[at];
      sk += w.dk_part[at];
    }
    dq[n * s.ldq + kh * s.dk + d] = sq;
    dk[n * s.ldk + kh * s.dk + d] = sk;
  }
}

// ---- launch ----------------------------------------------------------------------------------------------------

struct DeltaMmaBackwardShared {
  size_t output, states, state_grads, wy, decay;
  static DeltaMmaBackwardShared of(const DeltaShape& s) {
    const int dk = int(s.dk), dv = int(s.dv);
    DeltaTileGates* tg;
    bf16 *b1, *b2, *b3, *b4, *b5;
    float *f1, *f2, *f3, *f4, *f5;
    SharedCarve o{0}, st{0}, sg{0}, wy{0}, de{0};
    delta_backward_output_carve(o, dk, dv, &tg, &b1, &b2, &b3, &b4, &f1, &b5, &f2);
    delta_backward_states_carve(st, dk, kDeltaStateCols, &tg, &f1, &b1, &b2, &b3, &b4, &b5, &b5);
    delta_backward_state_grads_carve(sg, dv, &tg, &b1, &b2, &b3, &b4, &f1, &f2, &f3);
    delta_backward_wy_carve(wy, dk, dv, &tg, &b1, &f1, &f2, &b2, &b3, &f3, &f4);
    delta_backward_decay_carve(de, dk, &tg, &b1, &f1, &f2, &f3, &f4, &b2, &f5);
    return {o.used, st.used, sg.used, wy.used, de.used};
  }
};

// The launches for rows [b0, b0 + r.B) of the batch (r the group's shape, the pointers at its first row).
inline void gated_delta_backward_mma_rows(Stream st, float* dq, float* dk, float* dv, float* dbeta, float* dg,
                                          const float* dout, const bf16* q, const bf16* k, const bf16* v,
                                          const float* beta, const float* g, const int32_t* doc_ids,
                                          const DeltaShape& r, const DeltaMmaBackwardWorkspace& w) {
  const DeltaMmaShared fwd = DeltaMmaShared::of(r);
  const DeltaMmaBackwardShared bwd = DeltaMmaBackwardShared::of(r);
  const int64_t tiles = (r.T + kDeltaTile - 1) / kDeltaTile, parts = r.dv / kDeltaStateCols;
  const dim3 tile_blocks(unsigned(r.B * r.Hv * tiles)), row_blocks(unsigned(r.B * r.Hv * parts));
  const dim3 threads(kDeltaMmaThreads);
  bf16 *W = dev(w.forward.W), *UV = dev(w.forward.UV), *states = dev(w.forward.states);
  const auto ns = native_stream(st);
  detail::allow_shared(delta_prepare_kernel, fwd.prepare);
  detail::allow_shared(delta_states_kernel, fwd.states);
  detail::allow_shared(delta_backward_output_kernel, bwd.output);
  detail::allow_shared(delta_backward_states_kernel, bwd.states);
  detail::allow_shared(delta_backward_state_grads_kernel, bwd.state_grads);
  detail::allow_shared(delta_backward_wy_kernel, bwd.wy);
  detail::allow_shared(delta_backward_decay_kernel, bwd.decay);
  unsigned char* gates = w.forward.gates;
  LT_LAUNCH(delta_prepare_kernel, tile_blocks, threads, fwd.prepare, ns, W, UV, gates, k, v, beta, g, doc_ids, r);
  LT_LAUNCH(delta_states_kernel, row_blocks, threads, fwd.states, ns, UV, states, W, gates, k, r);
  LT_LAUNCH(delta_backward_output_kernel, tile_blocks, threads, bwd.output, ns, w, dout, q, k, beta, g, doc_ids, r);
  LT_LAUNCH(delta_backward_states_kernel, row_blocks, threads, bwd.states, ns, w, dout, q, k, doc_ids, r);
  LT_LAUNCH(delta_backward_state_grads_kernel, tile_blocks, threads, bwd.state_grads, ns, w, k, beta, g, doc_ids, r);
  LT_LAUNCH(delta_backward_wy_kernel, tile_blocks, threads, bwd.wy, ns, w, dv, dbeta, k, v, beta, g, doc_ids, r);
  LT_LAUNCH(delta_backward_decay_kernel, tile_blocks, threads, bwd.decay, ns, w, dbeta, dg, k, beta, g, doc_ids, r);
  LT_LAUNCH(delta_backward_heads_kernel, dim3(elementwise_blocks(r.B * r.T * r.Hk * r.dk)), dim3(kElementwiseThreads),
            0, ns, dq, dk, w, r);
}

inline void gated_delta_backward_mma(Stream st, float* dq, float* dk, float* dv, float* dbeta, float* dg,
                                     const float* dout, const bf16* q, const bf16* k, const bf16* v, const float* beta,
                                     const float* g, const int32_t* doc_ids, const DeltaShape& s, void* workspace) {
  const DeltaMmaBackwardWorkspace w = DeltaMmaBackwardWorkspace::carve(workspace, s, gated_delta_backward_rows(s));
  const int64_t ldo = s.Hv * s.dv;
  for (int64_t b0 = 0; b0 < s.B; b0 += w.rows) {
    DeltaShape r = s;
    r.B = std::min(w.rows, s.B - b0);
    const int64_t n0 = b0 * s.T;
    gated_delta_backward_mma_rows(st, dq + n0 * s.ldq, dk + n0 * s.ldk, dv + n0 * s.ldv, dbeta + n0 * s.Hv,
                                  dg + n0 * s.Hv, dout + n0 * ldo, q + n0 * s.ldq, k + n0 * s.ldk, v + n0 * s.ldv,
                                  beta + n0 * s.Hv, g + n0 * s.Hv, doc_ids ? doc_ids + n0 : nullptr, r, w);
  }
}

}  // namespace lt::cuda::LT_KERNELS_NS
