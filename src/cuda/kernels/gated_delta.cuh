// cuda/kernels/gated_delta.cuh — the gated delta rule on a GPU, forward and backward: the chunked WY form of
// ops/gated_delta.h, step for step as the CPU op (ops/cpu/gated_delta.cpp's Chunk and backward_chunk; the
// backward's steps keep its letters (a)–(o)). These are the CUDA-core kernels, for f32 storage and the head dims
// the tensor-core kernels (gated_delta_mma.cuh, gated_delta_mma_backward.cuh) do not take.
//
// Forward: one block per (row, value head). Backward: one block per (row, key head), its value heads one after
// the other, so dq and dk of the key head are sums in value-head order written by one block (no atomics). A
// block walks the row's documents (a change of doc_ids starts one: the state restarts at zero and chunks count
// from the document's first token, as the CPU op's sequences) and their chunks of up to kDeltaChunk tokens.
// Every step is one block-wide loop over its outputs, each output a dot product summed in index order by one
// thread, with __syncthreads between steps; the few sums over a whole state or chunk go through fixed
// per-thread partials added in order. So the bits depend on neither the launch nor the thread order (cuda-sim
// checks it by shuffling threads). The products are not the CPU op's GEMMs: equal to it to f32 rounding.
//
// Memory: each block's chunk quantities live in a global workspace slice (gated_delta_*_workspace_bytes). The
// backward keeps the chunk-start states of its longest document, [chunks, dk, dv] (the planner's "delta-rule
// states"), and recomputes each chunk's quantities from its state in the reverse sweep rather than keeping them
// all (the CPU op keeps them: it has the memory, a GPU working set does not).
//
// Cost: at Qwen3.6's sizes (dk = dv = 128, 48 value heads) the rule is ~1% of a layer's FLOPs; these loops run
// far below the GEMMs' rate and are still a small share of the layer.
#pragma once

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/gated_delta_mma.cuh"
#include "cuda/kernels/gated_delta_mma_backward.cuh"
#include "ops/gated_delta.h"

namespace lt::cuda::LT_KERNELS_NS {

constexpr int kDeltaThreads = kGatedDeltaThreads;  // cuda/kernels.h: the workspace counts per-thread partials

// One chunk of one value head (ops/cpu/gated_delta.cpp's Chunk): its inputs widened to f32 and its forward
// quantities, C ≤ kDeltaChunk rows, in a workspace slice of gated_delta_chunk_floats(dk, dv).
struct DeltaChunk {
  int64_t C, dk, dv;
  float *q, *k, *v;          // [C, dk] (q scaled), [C, dk], [C, dv]
  float *beta, *gam;         // [C]: β, γ (in-chunk cumulative log decay)
  float *eg, *egc;           // [C]: e^γ, e^{γ_C − γ}
  float *E, *KK, *QK, *PE, *A;  // [C, C]: e^{γi−γj} (j ≤ i), K Kᵀ, Q Kᵀ, QK ⊙ E, (I + M)⁻¹
  float *Kb, *Vb, *W, *U, *Vp, *Kc;  // [C, dk], [C, dv], [C, dk], [C, dv], [C, dv], [C, dk]

  __device__ static DeltaChunk bind(float*& p, int64_t dk, int64_t dv) {
    const int64_t c = kDeltaChunk;
    DeltaChunk ch{};
    ch.C = 0, ch.dk = dk, ch.dv = dv;
    auto take = [&](float** f, int64_t n) {
      *f = p;
      p += n;
    };
    take(&ch.q, c * dk), take(&ch.k, c * dk), take(&ch.v, c * dv);
    take(&ch.beta, c), take(&ch.gam, c), take(&ch.eg, c), take(&ch.egc, c);
    take(&ch.E, c * c), take(&ch.KK, c * c), take(&ch.QK, c * c), take(&ch.PE, c * c), take(&ch.A, c * c);
    take(&ch.Kb, c * dk), take(&ch.Vb, c * dv), take(&ch.W, c * dk), take(&ch.U, c * dv), take(&ch.Vp, c * dv);
    take(&ch.Kc, c * dk);
    return ch;
  }
};

// out[M, N] (row stride ldo) = (or += when accumulate) Σ_p a(i, p) · b(p, j), p = 0 .. K-1 in order, one output per
// thread at a time; a(i, p) = A[i·sa_i + p·sa_p], b(p, j) = B[p·sb_p + j·sb_j] (the strides give transposes).
// Ends with a barrier.
__device__ __forceinline__ void block_matmul(float* out, int64_t ldo, int64_t M, int64_t N, int64_t K, const float* A,
                                             int64_t sa_i, int64_t sa_p, const float* B, int64_t sb_p, int64_t sb_j,
                                             bool accumulate = false) {
  for (int64_t x = threadIdx.x; x < M * N; x += blockDim.x) {
    const int64_t i = x / N, j = x % N;
    float acc = 0.0f;
    for (int64_t p = 0; p < K; ++p) acc += A[i * sa_i + p * sa_p] * B[p * sb_p + j * sb_j];
    float* y = out + i * ldo + j;
    *y = accumulate ? *y + acc : acc;
  }
  __syncthreads();
}

// Σ_x a[x]·b[x] over n elements, the same value in every thread: fixed per-thread partials (thread t sums
// x ≡ t mod blockDim in order) added in thread order. partial: blockDim floats of workspace.
__device__ __forceinline__ float block_dot(const float* a, const float* b, int64_t n, float* partial) {
  float acc = 0.0f;
  for (int64_t x = threadIdx.x; x < n; x += blockDim.x) acc += a[x] * b[x];
  partial[threadIdx.x] = acc;
  __syncthreads();
  float total = 0.0f;
  for (unsigned t = 0; t < blockDim.x; ++t) total += partial[t];
  __syncthreads();
  return total;
}

// The end of the document starting at t0 in a row (doc_ids of the row, or null: the row is one document).
__device__ __forceinline__ int64_t document_end(const int32_t* doc, int64_t t0, int64_t T) {
  if (!doc) return T;
  int64_t t1 = t0 + 1;
  while (t1 < T && doc[t1] == doc[t0]) ++t1;
  return t1;
}

// Tokens n0 .. n0+C-1 of value head vh (key head kh).
template <class T>
__device__ void chunk_load(DeltaChunk& ch, int64_t n0, int64_t C, int64_t kh, int64_t vh, const T* q, const T* k,
                           const T* v, const float* beta, const float* g, const DeltaShape& s) {
  const int64_t dk = ch.dk, dv = ch.dv;
  ch.C = C;
  for (int64_t x = threadIdx.x; x < C * dk; x += blockDim.x) {
    const int64_t n = n0 + x / dk, d = x % dk;
    ch.q[x] = load(q + n * s.ldq + kh * dk + d) * s.scale;
    ch.k[x] = load(k + n * s.ldk + kh * dk + d);
  }
  for (int64_t x = threadIdx.x; x < C * dv; x += blockDim.x) ch.v[x] = load(v + (n0 + x / dv) * s.ldv + vh * dv + x % dv);
  if (threadIdx.x == 0) {
    float gam = 0.0f;
    for (int64_t i = 0; i < C; ++i) {
      gam += g[(n0 + i) * s.Hv + vh];  // adding g ≤ 0 never increases γ
      ch.gam[i] = gam;
      ch.beta[i] = beta[(n0 + i) * s.Hv + vh];
    }
  }
  __syncthreads();
}

// Everything of the chunk that does not depend on S₀: eg, egc, E, KK, QK, PE, A, Kb, Vb, W, U, Kc.
__device__ void chunk_solve(DeltaChunk& ch) {
  const int64_t C = ch.C, dk = ch.dk, dv = ch.dv;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
    ch.eg[i] = expf(ch.gam[i]);
    ch.egc[i] = expf(ch.gam[C - 1] - ch.gam[i]);
  }
  for (int64_t x = threadIdx.x; x < C * C; x += blockDim.x) {
    const int64_t i = x / C, j = x % C;
    ch.E[x] = j <= i ? expf(ch.gam[i] - ch.gam[j]) : 0.0f;  // the masked triangle is never exponentiated
  }
  block_matmul(ch.KK, C, C, C, dk, ch.k, dk, 1, ch.k, 1, dk);  // K Kᵀ
  block_matmul(ch.QK, C, C, C, dk, ch.q, dk, 1, ch.k, 1, dk);  // Q Kᵀ
  for (int64_t x = threadIdx.x; x < C * C; x += blockDim.x) ch.PE[x] = ch.QK[x] * ch.E[x];
  // (I + M) A = I by rows: A_i = e_i − Σ_{m<i} M_im A_m, M_im = β_i KK_im E_im; row m is zero beyond column m.
  for (int64_t i = 0; i < C; ++i) {
    for (int64_t col = threadIdx.x; col < C; col += blockDim.x) {
      float acc = col == i ? 1.0f : 0.0f;
      for (int64_t m = col; m < i; ++m) acc += -(ch.beta[i] * ch.KK[i * C + m] * ch.E[i * C + m]) * ch.A[m * C + col];
      ch.A[i * C + col] = acc;
    }
    __syncthreads();
  }
  for (int64_t x = threadIdx.x; x < C * dk; x += blockDim.x) {
    const int64_t i = x / dk;
    ch.Kb[x] = ch.beta[i] * ch.eg[i] * ch.k[x];
    ch.Kc[x] = ch.egc[i] * ch.k[x];
  }
  for (int64_t x = threadIdx.x; x < C * dv; x += blockDim.x) ch.Vb[x] = ch.beta[x / dv] * ch.v[x];
  __syncthreads();
  block_matmul(ch.W, dk, C, dk, C, ch.A, C, 1, ch.Kb, dk, 1);  // W = A Kb
  block_matmul(ch.U, dv, C, dv, C, ch.A, C, 1, ch.Vb, dv, 1);  // U = A Vb
}

// V' = U − W S₀.
__device__ void chunk_pseudo_values(DeltaChunk& ch, const float* S0) {
  const int64_t C = ch.C, dk = ch.dk, dv = ch.dv;
  for (int64_t x = threadIdx.x; x < C * dv; x += blockDim.x) {
    const int64_t i = x / dv, e = x % dv;
    float acc = 0.0f;
    for (int64_t d = 0; d < dk; ++d) acc += ch.W[i * dk + d] * S0[d * dv + e];
    ch.Vp[x] = ch.U[x] - acc;
  }
  __syncthreads();
}

// O = diag(e^γ) Q S₀ + PE V', stored to o (rows of stride ldo).
template <class T>
__device__ void chunk_output(const DeltaChunk& ch, T* o, int64_t ldo, const float* S0) {
  const int64_t C = ch.C, dk = ch.dk, dv = ch.dv;
  for (int64_t x = threadIdx.x; x < C * dv; x += blockDim.x) {
    const int64_t i = x / dv, e = x % dv;
    float qs = 0.0f, pv = 0.0f;
    for (int64_t d = 0; d < dk; ++d) qs += ch.q[i * dk + d] * S0[d * dv + e];
    for (int64_t j = 0; j <= i; ++j) pv += ch.PE[i * C + j] * ch.Vp[j * dv + e];
    store(o + i * ldo + e, qs * ch.eg[i] + pv);
  }
  __syncthreads();
}

// S ← e^{γ_C} S + Kcᵀ V' (S may be the state the chunk started from: every element reads only itself).
__device__ void chunk_advance(const DeltaChunk& ch, float* S_out, const float* S_in) {
  const int64_t C = ch.C, dk = ch.dk, dv = ch.dv;
  for (int64_t x = threadIdx.x; x < dk * dv; x += blockDim.x) {
    const int64_t d = x / dv, e = x % dv;
    float acc = 0.0f;
    for (int64_t j = 0; j < C; ++j) acc += ch.Kc[j * dk + d] * ch.Vp[j * dv + e];
    S_out[x] = S_in[x] * ch.eg[C - 1] + acc;
  }
  __syncthreads();
}

template <class T>
__global__ void __launch_bounds__(kDeltaThreads)
    gated_delta_forward_kernel(T* o, const T* q, const T* k, const T* v, const float* beta, const float* g,
                               const int32_t* doc_ids, DeltaShape s, float* workspace) {
  const int64_t b = blockIdx.x / s.Hv, vh = blockIdx.x % s.Hv, kh = vh / (s.Hv / s.Hk), ldo = s.Hv * s.dv;
  float* p = workspace + int64_t(blockIdx.x) * gated_delta_forward_block_floats(s);
  DeltaChunk ch = DeltaChunk::bind(p, s.dk, s.dv);
  float* S = p;  // [dk, dv]
  const int32_t* doc = doc_ids ? doc_ids + b * s.T : nullptr;
  for (int64_t t0 = 0, t1; t0 < s.T; t0 = t1) {
    t1 = document_end(doc, t0, s.T);
    for (int64_t x = threadIdx.x; x < s.dk * s.dv; x += blockDim.x) S[x] = 0.0f;
    for (int64_t c0 = t0; c0 < t1; c0 += kDeltaChunk) {
      const int64_t n0 = b * s.T + c0;
      chunk_load(ch, n0, t1 - c0 < kDeltaChunk ? t1 - c0 : kDeltaChunk, kh, vh, q, k, v, beta, g, s);
      chunk_solve(ch);
      chunk_pseudo_values(ch, S);
      chunk_output(ch, o + n0 * ldo + vh * s.dv, ldo, S);
      chunk_advance(ch, S, S);
    }
  }
}

// The backward's temporaries of one chunk (ops/cpu/gated_delta.cpp's BackwardScratch, less the chunks it keeps).
struct DeltaBackwardScratch {
  float *dS, *dS0, *tS;                // [dk, dv]
  float *dq, *dk, *tCk, *dW, *dKb;     // [C, dk] (dq of the scaled q)
  float *dv, *tCv, *dVp, *dVb;         // [C, dv]
  float *dgam, *dbeta;                 // [C]
  float *dA, *Y, *dM, *dE, *dP;        // [C, C]
  float* partial;                      // [kDeltaThreads]

  __device__ static DeltaBackwardScratch bind(float*& p, int64_t dk, int64_t dv) {
    const int64_t c = kDeltaChunk;
    DeltaBackwardScratch w;
    auto take = [&](float** f, int64_t n) {
      *f = p;
      p += n;
    };
    take(&w.dS, dk * dv), take(&w.dS0, dk * dv), take(&w.tS, dk * dv);
    take(&w.dq, c * dk), take(&w.dk, c * dk), take(&w.tCk, c * dk), take(&w.dW, c * dk), take(&w.dKb, c * dk);
    take(&w.dv, c * dv), take(&w.tCv, c * dv), take(&w.dVp, c * dv), take(&w.dVb, c * dv);
    take(&w.dgam, c), take(&w.dbeta, c);
    take(&w.dA, c * c), take(&w.Y, c * c), take(&w.dM, c * c), take(&w.dE, c * c), take(&w.dP, c * c);
    take(&w.partial, kDeltaThreads);
    return w;
  }
};

// Reverse-mode through one chunk's forward (chunk_pseudo_values, chunk_output, chunk_advance) with S₀ = S0: reads
// dO (rows of stride ldo) and sc.dS (the gradient of the chunk's end state); leaves the chunk's input gradients in
// sc.dq (of the scaled q), sc.dk, sc.dv, sc.dbeta, sc.dgam and the gradient of S₀ in sc.dS0.
__device__ void chunk_backward(const DeltaChunk& ch, const float* S0, const float* dO, int64_t ldo,
                               DeltaBackwardScratch& sc) {
  const int64_t C = ch.C, dk = ch.dk, dv = ch.dv, tid = threadIdx.x, nt = blockDim.x;
  const float* dS1 = sc.dS;
  for (int64_t x = tid; x < C * C; x += nt) sc.dE[x] = 0.0f;
  // (a) S₁ = e^{γ_C} S₀ + …: dS₀ = e^{γ_C} dS₁, dγ_C = e^{γ_C} Σ S₀ ⊙ dS₁.
  const float eG = ch.eg[C - 1];
  for (int64_t x = tid; x < dk * dv; x += nt) sc.dS0[x] = eG * dS1[x];
  float dG = block_dot(S0, dS1, dk * dv, sc.partial) * eG;
  // (b) S₁ += Kcᵀ V': dV' = diag(egc) K dS₁, dk = diag(egc) V' dS₁ᵀ, s_i = egc_i (K dS₁)_i · V'_i to γ_C and −γ_i.
  block_matmul(sc.dVp, dv, C, dv, dk, ch.k, dk, 1, dS1, dv, 1);
  block_matmul(sc.dk, dk, C, dk, dv, ch.Vp, dv, 1, dS1, 1, dv);
  for (int64_t i = tid; i < C; i += nt) {
    float si = 0.0f;
    for (int64_t e = 0; e < dv; ++e) si += sc.dVp[i * dv + e] * ch.Vp[i * dv + e];
    si *= ch.egc[i];
    for (int64_t e = 0; e < dv; ++e) sc.dVp[i * dv + e] *= ch.egc[i];
    for (int64_t d = 0; d < dk; ++d) sc.dk[i * dk + d] *= ch.egc[i];
    sc.dgam[i] = -si;
    sc.partial[i] = si;  // C ≤ kDeltaChunk ≤ kDeltaThreads
  }
  __syncthreads();
  for (int64_t i = 0; i < C; ++i) dG += sc.partial[i];  // every thread, in row order
  __syncthreads();
  // (c) O = diag(e^γ) Q S₀ + PE V': dγ_i += e^{γ_i} (Q S₀)_i · dO_i, dq = diag(e^γ) dO S₀ᵀ,
  //     dS₀ += (diag(e^γ) Q)ᵀ dO, dV' += PEᵀ dO.
  block_matmul(sc.tCv, dv, C, dv, dk, ch.q, dk, 1, S0, dv, 1);
  block_matmul(sc.dq, dk, C, dk, dv, dO, ldo, 1, S0, 1, dv);
  for (int64_t i = tid; i < C; i += nt) {
    float t = 0.0f;
    for (int64_t e = 0; e < dv; ++e) t += sc.tCv[i * dv + e] * dO[i * ldo + e];
    sc.dgam[i] += ch.eg[i] * t;
    for (int64_t d = 0; d < dk; ++d) {
      sc.dq[i * dk + d] *= ch.eg[i];
      sc.tCk[i * dk + d] = ch.eg[i] * ch.q[i * dk + d];
    }
  }
  __syncthreads();
  block_matmul(sc.dS0, dv, dk, dv, C, sc.tCk, 1, dk, dO, ldo, 1, true);
  block_matmul(sc.dVp, dv, C, dv, C, ch.PE, 1, C, dO, ldo, 1, true);
  // (h) PE = QK ⊙ E: dP = dO V'ᵀ; dE_ij += dP_ij QK_ij (j < i); dQK = dP ⊙ E; dq += dQK K, dk += dQKᵀ Q.
  block_matmul(sc.dP, C, C, C, dv, dO, ldo, 1, ch.Vp, 1, dv);
  for (int64_t x = tid; x < C * C; x += nt) {
    const int64_t i = x / C, j = x % C;
    if (j < i) sc.dE[x] += sc.dP[x] * ch.QK[x];
    sc.dP[x] *= ch.E[x];
  }
  __syncthreads();
  block_matmul(sc.dq, dk, C, dk, C, sc.dP, C, 1, ch.k, dk, 1, true);
  block_matmul(sc.dk, dk, C, dk, C, sc.dP, 1, C, ch.q, dk, 1, true);
  // (d) V' = U − W S₀: dU = dV', dW = −dV' S₀ᵀ, dS₀ −= Wᵀ dV'.
  block_matmul(sc.dW, dk, C, dk, dv, sc.dVp, dv, 1, S0, 1, dv);
  block_matmul(sc.tS, dv, dk, dv, C, ch.W, 1, dk, sc.dVp, dv, 1);
  for (int64_t x = tid; x < C * dk; x += nt) sc.dW[x] = -sc.dW[x];
  for (int64_t x = tid; x < dk * dv; x += nt) sc.dS0[x] -= sc.tS[x];
  __syncthreads();
  const float* dU = sc.dVp;
  // (e) W = A Kb, U = A Vb: dA = strictly_lower(dW Kbᵀ + dU Vbᵀ), dKb = Aᵀ dW, dVb = Aᵀ dU.
  block_matmul(sc.dA, C, C, C, dk, sc.dW, dk, 1, ch.Kb, 1, dk);
  block_matmul(sc.dA, C, C, C, dv, dU, dv, 1, ch.Vb, 1, dv, true);
  for (int64_t x = tid; x < C * C; x += nt)
    if (x % C >= x / C) sc.dA[x] = 0.0f;
  __syncthreads();
  block_matmul(sc.dKb, dk, C, dk, C, ch.A, 1, C, sc.dW, dk, 1);
  block_matmul(sc.dVb, dv, C, dv, C, ch.A, 1, C, dU, dv, 1);
  // (f) A = (I + M)⁻¹: dM = −Aᵀ dA Aᵀ: Y = dA Aᵀ, then Aᵀ Y (negated in (g)).
  block_matmul(sc.Y, C, C, C, C, sc.dA, C, 1, ch.A, 1, C);
  block_matmul(sc.dM, C, C, C, C, ch.A, 1, C, sc.Y, C, 1);
  // (g) M_ij = β_i KK_ij E_ij (j < i): dβ_i, dE_ij, and dKK_ij = dM_ij β_i E_ij in place of dM (zero for j ≥ i);
  //     then KK = K Kᵀ: dk += dKK K + dKKᵀ K.
  for (int64_t i = tid; i < C; i += nt) {
    float db = 0.0f;
    for (int64_t j = 0; j < C; ++j) {
      const int64_t x = i * C + j;
      if (j >= i) {
        sc.dM[x] = 0.0f;
        continue;
      }
      const float dM = -sc.dM[x];
      db += dM * ch.KK[x] * ch.E[x];
      sc.dE[x] += dM * ch.beta[i] * ch.KK[x];
      sc.dM[x] = dM * ch.beta[i] * ch.E[x];
    }
    sc.dbeta[i] = db;
  }
  __syncthreads();
  block_matmul(sc.dk, dk, C, dk, C, sc.dM, C, 1, ch.k, dk, 1, true);
  block_matmul(sc.dk, dk, C, dk, C, sc.dM, 1, C, ch.k, dk, 1, true);
  // (i) E_ij = e^{γ_i − γ_j}: dγ_i += dE_ij E_ij, dγ_j −= dE_ij E_ij — one thread, the CPU op's order.
  if (tid == 0)
    for (int64_t i = 0; i < C; ++i)
      for (int64_t j = 0; j < i; ++j) {
        const float t = sc.dE[i * C + j] * ch.E[i * C + j];
        sc.dgam[i] += t;
        sc.dgam[j] -= t;
      }
  __syncthreads();
  // (l) Kb_i = β_i e^{γ_i} k_i;  (m) Vb_i = β_i v_i;  (n) γ_C is the last token's γ.
  for (int64_t i = tid; i < C; i += nt) {
    float t = 0.0f, u = 0.0f;
    for (int64_t d = 0; d < dk; ++d) t += ch.k[i * dk + d] * sc.dKb[i * dk + d];
    t *= ch.eg[i];
    for (int64_t d = 0; d < dk; ++d) sc.dk[i * dk + d] += (ch.beta[i] * ch.eg[i]) * sc.dKb[i * dk + d];
    for (int64_t e = 0; e < dv; ++e) {
      sc.dv[i * dv + e] = ch.beta[i] * sc.dVb[i * dv + e];
      u += ch.v[i * dv + e] * sc.dVb[i * dv + e];
    }
    sc.dbeta[i] += t;
    sc.dgam[i] += ch.beta[i] * t;
    sc.dbeta[i] += u;
    if (i == C - 1) sc.dgam[i] += dG;
  }
  __syncthreads();
}

template <class T>
__global__ void __launch_bounds__(kDeltaThreads)
    gated_delta_backward_kernel(float* dq, float* dk, float* dv, float* dbeta, float* dg, const float* dout,
                                const T* q, const T* k, const T* v, const float* beta, const float* g,
                                const int32_t* doc_ids, DeltaShape s, float* workspace) {
  const int64_t b = blockIdx.x / s.Hk, kh = blockIdx.x % s.Hk, group = s.Hv / s.Hk, ldo = s.Hv * s.dv;
  const int64_t Sdd = s.dk * s.dv, tid = threadIdx.x, nt = blockDim.x;
  float* p = workspace + int64_t(blockIdx.x) * gated_delta_backward_block_floats(s);
  DeltaChunk ch = DeltaChunk::bind(p, s.dk, s.dv);
  DeltaBackwardScratch sc = DeltaBackwardScratch::bind(p, s.dk, s.dv);
  float* states = p;  // [chunks, dk, dv] of the document
  const int32_t* doc = doc_ids ? doc_ids + b * s.T : nullptr;
  // dq and dk of the key head: sums over its value heads, this block's alone.
  for (int64_t x = tid; x < s.T * s.dk; x += nt) {
    const int64_t n = b * s.T + x / s.dk, d = x % s.dk;
    dq[n * s.ldq + kh * s.dk + d] = 0.0f;
    dk[n * s.ldk + kh * s.dk + d] = 0.0f;
  }
  __syncthreads();
  for (int64_t t0 = 0, t1; t0 < s.T; t0 = t1) {
    t1 = document_end(doc, t0, s.T);
    const int64_t len = t1 - t0, chunks = (len + kDeltaChunk - 1) / kDeltaChunk;
    auto chunk_len = [&](int64_t c) { return len - c * kDeltaChunk < kDeltaChunk ? len - c * kDeltaChunk : kDeltaChunk; };
    for (int64_t vh = kh * group; vh < (kh + 1) * group; ++vh) {
      // The chunk-start states, by the forward's own steps (so the backward sees the forward's S₀ bits).
      for (int64_t x = tid; x < Sdd; x += nt) states[x] = 0.0f;
      __syncthreads();
      for (int64_t c = 0; c + 1 < chunks; ++c) {
        chunk_load(ch, b * s.T + t0 + c * kDeltaChunk, chunk_len(c), kh, vh, q, k, v, beta, g, s);
        chunk_solve(ch);
        chunk_pseudo_values(ch, states + c * Sdd);
        chunk_advance(ch, states + (c + 1) * Sdd, states + c * Sdd);
      }
      for (int64_t x = tid; x < Sdd; x += nt) sc.dS[x] = 0.0f;
      for (int64_t c = chunks - 1; c >= 0; --c) {
        const int64_t n0 = b * s.T + t0 + c * kDeltaChunk;
        const float* S0 = states + c * Sdd;
        chunk_load(ch, n0, chunk_len(c), kh, vh, q, k, v, beta, g, s);
        chunk_solve(ch);
        chunk_pseudo_values(ch, S0);
        chunk_backward(ch, S0, dout + n0 * ldo + vh * s.dv, ldo, sc);
        // (o) γ = cumsum(g): dg_j = Σ_{i≥j} dγ_i, one thread from the last row.
        if (tid == 0) {
          float acc = 0.0f;
          for (int64_t i = ch.C - 1; i >= 0; --i) {
            acc += sc.dgam[i];
            dg[(n0 + i) * s.Hv + vh] = acc;
          }
        }
        for (int64_t i = tid; i < ch.C; i += nt) dbeta[(n0 + i) * s.Hv + vh] = sc.dbeta[i];
        for (int64_t x = tid; x < ch.C * s.dv; x += nt) dv[(n0 + x / s.dv) * s.ldv + vh * s.dv + x % s.dv] = sc.dv[x];
        for (int64_t x = tid; x < ch.C * s.dk; x += nt) {
          const int64_t n = n0 + x / s.dk, d = x % s.dk;
          dq[n * s.ldq + kh * s.dk + d] += s.scale * sc.dq[x];
          dk[n * s.ldk + kh * s.dk + d] += sc.dk[x];
        }
        float* t = sc.dS;  // dS₀ of this chunk is dS₁ of the one before
        sc.dS = sc.dS0;
        sc.dS0 = t;
        __syncthreads();
      }
    }
  }
}

template <class T>
void gated_delta_forward_launch(Stream st, T* o, const T* q, const T* k, const T* v, const float* beta,
                                const float* g, const int32_t* doc_ids, const DeltaShape& s, void* workspace) {
  if (s.B == 0 || s.T == 0) return;
  LT_LAUNCH(gated_delta_forward_kernel<T>, dim3(unsigned(s.B * s.Hv)), dim3(kDeltaThreads), 0, native_stream(st),
            o, q, k, v, beta, g, doc_ids, s, static_cast<float*>(workspace));
}

template <class T>
void gated_delta_backward_launch(Stream st, float* dq, float* dk, float* dv, float* dbeta, float* dg,
                                 const float* dout, const T* q, const T* k, const T* v, const float* beta,
                                 const float* g, const int32_t* doc_ids, const DeltaShape& s, void* workspace) {
  if (s.B == 0 || s.T == 0) return;
  LT_LAUNCH(gated_delta_backward_kernel<T>, dim3(unsigned(s.B * s.Hk)), dim3(kDeltaThreads), 0, native_stream(st),
            dq, dk, dv, dbeta, dg, dout, q, k, v, beta, g, doc_ids, s, static_cast<float*>(workspace));
}

void gated_delta_forward(Stream st, float* o, const float* q, const float* k, const float* v, const float* beta,
                         const float* g, const int32_t* doc_ids, const DeltaShape& s, void* workspace) {
  check_gated_delta_shape("gated_delta_forward", s);
  gated_delta_forward_launch(st, o, q, k, v, beta, g, doc_ids, s, workspace);
}
void gated_delta_forward(Stream st, bf16_t* o, const bf16_t* q, const bf16_t* k, const bf16_t* v, const float* beta,
                         const float* g, const int32_t* doc_ids, const DeltaShape& s, void* workspace) {
  check_gated_delta_shape("gated_delta_forward", s);
  if (s.B * s.T == 0) return;
  if (gated_delta_on_tensor_cores(s))
    return gated_delta_forward_mma(st, dev(o), dev(q), dev(k), dev(v), beta, g, doc_ids, s, workspace);
  gated_delta_forward_launch(st, dev(o), dev(q), dev(k), dev(v), beta, g, doc_ids, s, workspace);
}
void gated_delta_backward(Stream st, float* dq, float* dk, float* dv, float* dbeta, float* dg, const float* dout,
                          const float* q, const float* k, const float* v, const float* beta, const float* g,
                          const int32_t* doc_ids, const DeltaShape& s, void* workspace) {
  check_gated_delta_shape("gated_delta_backward", s);
  gated_delta_backward_launch(st, dq, dk, dv, dbeta, dg, dout, q, k, v, beta, g, doc_ids, s, workspace);
}
void gated_delta_backward(Stream st, float* dq, float* dk, float* dv, float* dbeta, float* dg, const float* dout,
                          const bf16_t* q, const bf16_t* k, const bf16_t* v, const float* beta, const float* g,
                          const int32_t* doc_ids, const DeltaShape& s, void* workspace) {
  check_gated_delta_shape("gated_delta_backward", s);
  if (s.B * s.T == 0) return;
  if (gated_delta_on_tensor_cores(s))
    return gated_delta_backward_mma(st, dq, dk, dv, dbeta, dg, dout, dev(q), dev(k), dev(v), beta, g, doc_ids, s,
                                    workspace);
  gated_delta_backward_launch(st, dq, dk, dv, dbeta, dg, dout, dev(q), dev(k), dev(v), beta, g, doc_ids, s,
                              workspace);
}

}  // namespace lt::cuda::LT_KERNELS_NS
