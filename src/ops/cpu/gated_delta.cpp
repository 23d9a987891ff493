// The gated delta rule on the CPU: the f64 recurrence (the reference) and the chunked WY form (the fast path).
// ops/gated_delta.h has the math; the backward's steps are numbered (a)–(o) below against the forward's.
//
// Legend: C tokens in a chunk (≤ kDeltaChunk), dk / dv head dims, S [dk, dv] row-major (S[d·dv + e]).
#include "ops/gated_delta.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/gemm.h"
#include "ops/override.h"

namespace lt {
namespace {

struct Sequence {
  int64_t begin, len;  // first token (n) and count
};

// Rows of T tokens, cut at every change of doc_ids when given.
std::vector<Sequence> sequences(const int32_t* doc_ids, const DeltaShape& s) {
  std::vector<Sequence> out;
  for (int64_t b = 0; b < s.B; ++b) {
    int64_t start = b * s.T;
    for (int64_t t = 1; t <= s.T; ++t) {
      const int64_t n = b * s.T + t;
      if (t == s.T || (doc_ids && doc_ids[n] != doc_ids[n - 1])) {
        out.push_back({start, n - start});
        start = n;
      }
    }
  }
  return out;
}

void check_shape(const DeltaShape& s) {
  LT_CHECK(s.B > 0 && s.T > 0 && s.Hk > 0 && s.Hv > 0 && s.dk > 0 && s.dv > 0,
           "gated delta rule: sizes must be positive (B {} T {} Hk {} Hv {} dk {} dv {})", s.B, s.T, s.Hk, s.Hv,
           s.dk, s.dv);
  LT_CHECK(s.Hv % s.Hk == 0, "gated delta rule: value heads ({}) must be a multiple of key heads ({})", s.Hv, s.Hk);
  LT_CHECK(s.ldq >= s.Hk * s.dk && s.ldk >= s.Hk * s.dk && s.ldv >= s.Hv * s.dv,
           "gated delta rule: row strides (q {}, k {}, v {}) shorter than the rows ({}, {}, {})", s.ldq, s.ldk,
           s.ldv, s.Hk * s.dk, s.Hk * s.dk, s.Hv * s.dv);
}

float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.f;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

void axpy(float* y, float a, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// y[dv] = Sᵀ x[dk]   (S [dk, dv])
void state_t_times(float* y, const float* S, const float* x, int64_t dk, int64_t dv) {
  std::fill(y, y + dv, 0.f);
  for (int64_t d = 0; d < dk; ++d) axpy(y, x[d], S + d * dv, dv);
}

// S[dk, dv] += a · x[dk] yᵀ[dv]
void state_add_outer(float* S, float a, const float* x, const float* y, int64_t dk, int64_t dv) {
  for (int64_t d = 0; d < dk; ++d) axpy(S + d * dv, a * x[d], y, dv);
}

// The chunk's matrix products go through ops/gemm.h (oneDNN, single-threaded inside the caller's task: a task is
// one sequence and head, so the bits never depend on the thread count). C = op(A) op(B), row-major.
void mm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
        int64_t ldb, float* C, int64_t ldc, Accumulate acc = Accumulate::no) {
  gemm_f32(ta, tb, M, N, K, A, lda, B, ldb, C, ldc, acc);
}

// One chunk of one value head: its inputs gathered contiguous, and the forward's quantities from S₀.
struct Chunk {
  int64_t C = 0, dk, dv;
  std::vector<float> q, k, v;   // [C, dk] (q scaled), [C, dk], [C, dv]
  std::vector<float> beta, gam; // [C]: β, γ = in-chunk cumulative log decay
  std::vector<float> eg, egc;   // [C]: e^γ, e^{γ_C − γ}
  std::vector<float> E;         // [C, C]: e^{γi − γj} for j ≤ i, 0 above the diagonal
  std::vector<float> KK;        // [C, C]: K Kᵀ (M reads j < i)
  std::vector<float> QK;        // [C, C]: Q Kᵀ (the output and the backward read j ≤ i)
  std::vector<float> PE;        // [C, C]: QK ⊙ E, lower triangle
  std::vector<float> A;         // [C, C]: (I + M)⁻¹, unit lower triangular
  std::vector<float> Kb, Vb;    // [C, dk]: β e^γ k;  [C, dv]: β v
  std::vector<float> W, U, Vp;  // [C, dk], [C, dv], [C, dv]: W = A Kb, U = A Vb, V' = U − W S₀
  std::vector<float> Kc;        // [C, dk]: e^{γ_C − γ} k, the state update's left factor

  Chunk(int64_t dk_, int64_t dv_) : dk(dk_), dv(dv_) {
    const size_t c = size_t(kDeltaChunk);
    q.resize(c * dk), k.resize(c * dk), v.resize(c * dv);
    beta.resize(c), gam.resize(c), eg.resize(c), egc.resize(c);
    E.resize(c * c), KK.resize(c * c), QK.resize(c * c), PE.resize(c * c), A.resize(c * c);
    Kb.resize(c * dk), Vb.resize(c * dv), W.resize(c * dk), U.resize(c * dv), Vp.resize(c * dv), Kc.resize(c * dk);
  }
  static size_t floats(int64_t dk, int64_t dv) {
    const size_t c = size_t(kDeltaChunk);
    return c * (5 * size_t(dk) + 4 * size_t(dv) + 4) + 5 * c * c;
  }

  // Tokens n0 .. n0+C-1 of value head vh (key head kh).
  void load(int64_t n0, int64_t C_, int64_t kh, int64_t vh, const float* q_in, const float* k_in,
            const float* v_in, const float* beta_in, const float* g_in, const DeltaShape& s) {
    C = C_;
    for (int64_t i = 0; i < C; ++i) {
      const int64_t n = n0 + i;
      const float* qi = q_in + n * s.ldq + kh * dk;
      for (int64_t d = 0; d < dk; ++d) q[i * dk + d] = qi[d] * s.scale;
      std::memcpy(&k[i * dk], k_in + n * s.ldk + kh * dk, size_t(dk) * 4);
      std::memcpy(&v[i * dv], v_in + n * s.ldv + vh * dv, size_t(dv) * 4);
      beta[i] = beta_in[n * s.Hv + vh];
      gam[i] = (i ? gam[i - 1] : 0.f) + g_in[n * s.Hv + vh];  // adding g ≤ 0 never increases γ
    }
  }

  // Everything of the chunk that does not depend on S₀: E, KK, QK, PE, A, Kb, Vb, W, U, Kc.
  void solve() {
    mm(Trans::no, Trans::yes, C, C, dk, k.data(), dk, k.data(), dk, KK.data(), C);  // K Kᵀ
    mm(Trans::no, Trans::yes, C, C, dk, q.data(), dk, k.data(), dk, QK.data(), C);  // Q Kᵀ
    for (int64_t i = 0; i < C; ++i) {
      eg[i] = std::exp(gam[i]);
      egc[i] = std::exp(gam[C - 1] - gam[i]);
      for (int64_t j = 0; j < C; ++j) {
        E[i * C + j] = j <= i ? std::exp(gam[i] - gam[j]) : 0.f;
        PE[i * C + j] = QK[i * C + j] * E[i * C + j];
      }
    }
    // (I + M) A = I by forward substitution, M_im = β_i KK_im E_im: A_i = e_i − Σ_{m<i} M_im A_m (C³/6 work:
    // small beside the products with dk and dv).
    std::fill(A.begin(), A.begin() + C * C, 0.f);
    for (int64_t i = 0; i < C; ++i) {
      float* Ai = &A[i * C];
      Ai[i] = 1.f;
      for (int64_t m = 0; m < i; ++m) {
        const float Mim = beta[i] * KK[i * C + m] * E[i * C + m];
        axpy(Ai, -Mim, &A[m * C], m + 1);  // row m of A is zero beyond column m
      }
    }
    for (int64_t i = 0; i < C; ++i) {
      for (int64_t d = 0; d < dk; ++d) {
        Kb[i * dk + d] = beta[i] * eg[i] * k[i * dk + d];
        Kc[i * dk + d] = egc[i] * k[i * dk + d];
      }
      for (int64_t e = 0; e < dv; ++e) Vb[i * dv + e] = beta[i] * v[i * dv + e];
    }
    // W = A Kb, U = A Vb (A's zeros above the diagonal take no part).
    mm(Trans::no, Trans::no, C, dk, C, A.data(), C, Kb.data(), dk, W.data(), dk);
    mm(Trans::no, Trans::no, C, dv, C, A.data(), C, Vb.data(), dv, U.data(), dv);
  }

  // V' = U − W S₀.
  void pseudo_values(const float* S0) {
    mm(Trans::no, Trans::no, C, dv, dk, W.data(), dk, S0, dv, Vp.data(), dv);
    for (int64_t x = 0; x < C * dv; ++x) Vp[x] = U[x] - Vp[x];
  }

  // O = diag(e^γ) Q S₀ + (QKᵀ ⊙ E) V', written to o (rows of stride ldo).
  void output(float* o, int64_t ldo, const float* S0) const {
    mm(Trans::no, Trans::no, C, dv, dk, q.data(), dk, S0, dv, o, ldo);
    for (int64_t i = 0; i < C; ++i)
      for (int64_t e = 0; e < dv; ++e) o[i * ldo + e] *= eg[i];
    mm(Trans::no, Trans::no, C, dv, C, PE.data(), C, Vp.data(), dv, o, ldo, Accumulate::yes);
  }

  // S ← e^{γ_C} S + Kcᵀ V'.
  void advance(float* S) const {
    const float eG = eg[C - 1];
    for (int64_t x = 0; x < dk * dv; ++x) S[x] *= eG;
    mm(Trans::yes, Trans::no, dk, dv, C, Kc.data(), dk, Vp.data(), dv, S, dv, Accumulate::yes);
  }
};

// ---------------------------------------------------------------------------------------------------------
// Chunked forward
// ---------------------------------------------------------------------------------------------------------

void forward_sequence(float* o, const Sequence& seq, int64_t vh, const float* q, const float* k, const float* v,
                      const float* beta, const float* g, const DeltaShape& s) {
  const int64_t kh = vh / (s.Hv / s.Hk);
  Chunk ch(s.dk, s.dv);
  std::vector<float> S(static_cast<size_t>(s.dk * s.dv), 0.f);
  const int64_t ldo = s.Hv * s.dv;
  for (int64_t c0 = 0; c0 < seq.len; c0 += kDeltaChunk) {
    const int64_t n0 = seq.begin + c0;
    ch.load(n0, std::min(kDeltaChunk, seq.len - c0), kh, vh, q, k, v, beta, g, s);
    ch.solve();
    ch.pseudo_values(S.data());
    ch.output(o + n0 * ldo + vh * s.dv, ldo, S.data());
    ch.advance(S.data());
  }
}

// ---------------------------------------------------------------------------------------------------------
// Chunked backward
// ---------------------------------------------------------------------------------------------------------

// Scratch of one backward task, reused across its value heads and chunks.
struct BackwardScratch {
  std::vector<Chunk> chunks;        // [chunks]: every chunk's forward quantities, from the states pass
  std::vector<float> states;        // [chunks, dk, dv]: S₀ of every chunk of the sequence
  std::vector<float> dS, dS0, tS;   // [dk, dv]
  std::vector<float> dq, dk, dv;    // [C, dk], [C, dk], [C, dv] of the chunk (dq for the scaled q)
  std::vector<float> dgam, dbeta;   // [C]
  std::vector<float> dVp, dW, dKb, dVb;  // [C, dv], [C, dk], [C, dk], [C, dv]
  std::vector<float> tCk, tCv;           // [C, dk], [C, dv]
  std::vector<float> dA, Y, dM, dE, dP;  // [C, C]
  std::vector<float> dq_seq, dk_seq;  // [len, dk]: the key head's dq, dk summed over its value heads

  BackwardScratch(const DeltaShape& s, int64_t max_len) {
    const size_t c = size_t(kDeltaChunk), dk_ = size_t(s.dk), dv_ = size_t(s.dv);
    const size_t chunks = size_t((max_len + kDeltaChunk - 1) / kDeltaChunk);
    this->chunks.assign(chunks, Chunk(s.dk, s.dv));
    states.resize(chunks * dk_ * dv_);
    dS.resize(dk_ * dv_), dS0.resize(dk_ * dv_), tS.resize(dk_ * dv_);
    dq.resize(c * dk_), dk.resize(c * dk_), dv.resize(c * dv_);
    dgam.resize(c), dbeta.resize(c);
    dVp.resize(c * dv_), dW.resize(c * dk_), dKb.resize(c * dk_), dVb.resize(c * dv_);
    tCk.resize(c * dk_), tCv.resize(c * dv_);
    dA.resize(c * c), Y.resize(c * c), dM.resize(c * c), dE.resize(c * c), dP.resize(c * c);
    dq_seq.resize(size_t(max_len) * dk_), dk_seq.resize(size_t(max_len) * dk_);
  }
  static size_t bytes(const DeltaShape& s, int64_t max_len) {
    const size_t c = size_t(kDeltaChunk), dk_ = size_t(s.dk), dv_ = size_t(s.dv);
    const size_t chunks = size_t((max_len + kDeltaChunk - 1) / kDeltaChunk);
    const size_t floats = (chunks + 3) * dk_ * dv_ + c * (5 * dk_ + 4 * dv_ + 2) + 5 * c * c +
                          2 * size_t(max_len) * dk_;
    return (floats + chunks * Chunk::floats(s.dk, s.dv)) * sizeof(float);  // every chunk's forward quantities
  }
};

// Reverse-mode through one chunk's forward (Chunk::pseudo_values, output, advance) with S₀ = `S0`: reads dO
// (rows of stride ldo) and sc.dS (the gradient of the chunk's end state), leaves the chunk's input gradients in
// sc.dq (of the scaled q), sc.dk, sc.dv, sc.dbeta, sc.dgam and the gradient of S₀ in sc.dS0. Every product
// of a chunk's [C, dk|dv] matrices with each other or with a state is one GEMM; the rest is per row.
void backward_chunk(const Chunk& ch, const float* S0, const float* dO, int64_t ldo, BackwardScratch& sc) {
  const int64_t C = ch.C, dk = ch.dk, dv = ch.dv;
  const float* dS1 = sc.dS.data();
  float* dS0 = sc.dS0.data();
  float* tS = sc.tS.data();
  float* tCk = sc.tCk.data();
  float* tCv = sc.tCv.data();
  std::fill(sc.dgam.begin(), sc.dgam.begin() + C, 0.f);
  std::fill(sc.dbeta.begin(), sc.dbeta.begin() + C, 0.f);
  std::fill(sc.dE.begin(), sc.dE.begin() + C * C, 0.f);
  constexpr Trans N = Trans::no, T = Trans::yes;
  constexpr Accumulate add = Accumulate::yes;

  // (a) S₁ = e^{γ_C} S₀ + …: dS₀ = e^{γ_C} dS₁, dγ_C = e^{γ_C} Σ S₀ ⊙ dS₁.
  const float eG = ch.eg[C - 1];
  float dG = 0.f;
  for (int64_t x = 0; x < dk * dv; ++x) {
    dS0[x] = eG * dS1[x];
    dG += S0[x] * dS1[x];
  }
  dG *= eG;
  // (b) S₁ += Kcᵀ V' (Kc_i = e^{γ_C−γ_i} k_i): R = K dS₁, dV'_i = e^{γ_C−γ_i} R_i, dk_i = e^{γ_C−γ_i} (V' dS₁ᵀ)_i,
  //     and the exponent's gradient s_i = e^{γ_C−γ_i} R_i · V'_i to γ_C (+) and γ_i (−).
  mm(N, N, C, dv, dk, ch.k.data(), dk, dS1, dv, sc.dVp.data(), dv);
  mm(N, T, C, dk, dv, ch.Vp.data(), dv, dS1, dv, sc.dk.data(), dk);
  for (int64_t i = 0; i < C; ++i) {
    float* dVpi = &sc.dVp[i * dv];
    const float si = ch.egc[i] * dot(dVpi, &ch.Vp[i * dv], dv);
    for (int64_t e = 0; e < dv; ++e) dVpi[e] *= ch.egc[i];
    for (int64_t d = 0; d < dk; ++d) sc.dk[i * dk + d] *= ch.egc[i];
    dG += si;
    sc.dgam[i] -= si;
  }
  // (c) O = diag(e^γ) Q S₀ + (QKᵀ ⊙ E) V': dγ_i += e^{γ_i} (Q S₀)_i · dO_i, dq = diag(e^γ) dO S₀ᵀ,
  //     dS₀ += (diag(e^γ) Q)ᵀ dO, dV' += (QKᵀ ⊙ E)ᵀ dO.
  mm(N, N, C, dv, dk, ch.q.data(), dk, S0, dv, tCv, dv);
  mm(N, T, C, dk, dv, dO, ldo, S0, dv, sc.dq.data(), dk);
  for (int64_t i = 0; i < C; ++i) {
    sc.dgam[i] += ch.eg[i] * dot(&tCv[i * dv], dO + i * ldo, dv);
    for (int64_t d = 0; d < dk; ++d) {
      sc.dq[i * dk + d] *= ch.eg[i];
      tCk[i * dk + d] = ch.eg[i] * ch.q[i * dk + d];
    }
  }
  mm(T, N, dk, dv, C, tCk, dk, dO, ldo, dS0, dv, add);
  mm(T, N, C, dv, C, ch.PE.data(), C, dO, ldo, sc.dVp.data(), dv, add);
  // (h) P = QKᵀ ⊙ E: dP = dO V'ᵀ; dQK = dP ⊙ E (zero above the diagonal); dq += dQK K, dk += dQKᵀ Q;
  //     dE_ij += dP_ij (QKᵀ)_ij off the diagonal.
  float* dP = sc.dP.data();
  mm(N, T, C, C, dv, dO, ldo, ch.Vp.data(), dv, dP, C);
  for (int64_t i = 0; i < C; ++i) {
    for (int64_t j = 0; j < i; ++j) sc.dE[i * C + j] += dP[i * C + j] * ch.QK[i * C + j];
    for (int64_t j = 0; j < C; ++j) dP[i * C + j] *= ch.E[i * C + j];  // now dQK
  }
  mm(N, N, C, dk, C, dP, C, ch.k.data(), dk, sc.dq.data(), dk, add);
  mm(T, N, C, dk, C, dP, C, ch.q.data(), dk, sc.dk.data(), dk, add);
  // (d) V' = U − W S₀: dU = dV', dW = −dV' S₀ᵀ, dS₀ −= Wᵀ dV'.
  mm(N, T, C, dk, dv, sc.dVp.data(), dv, S0, dv, sc.dW.data(), dk);
  for (int64_t x = 0; x < C * dk; ++x) sc.dW[x] = -sc.dW[x];
  mm(T, N, dk, dv, C, ch.W.data(), dk, sc.dVp.data(), dv, tS, dv);
  for (int64_t x = 0; x < dk * dv; ++x) dS0[x] -= tS[x];
  const float* dU = sc.dVp.data();
  // (e) W = A Kb, U = A Vb: dA = strictly_lower(dW Kbᵀ + dU Vbᵀ) (A's diagonal is constant), dKb = Aᵀ dW,
  //     dVb = Aᵀ dU.
  float* dA = sc.dA.data();
  mm(N, T, C, C, dk, sc.dW.data(), dk, ch.Kb.data(), dk, dA, C);
  mm(N, T, C, C, dv, dU, dv, ch.Vb.data(), dv, dA, C, add);
  for (int64_t i = 0; i < C; ++i)
    for (int64_t j = i; j < C; ++j) dA[i * C + j] = 0.f;
  mm(T, N, C, dk, C, ch.A.data(), C, sc.dW.data(), dk, sc.dKb.data(), dk);
  mm(T, N, C, dv, C, ch.A.data(), C, dU, dv, sc.dVb.data(), dv);
  // (f) A = (I + M)⁻¹: dM = −Aᵀ dA Aᵀ, strictly lower. Y = dA Aᵀ, then dM = −Aᵀ Y (A's and dA's zeros make the
  //     full products the triangular sums).
  mm(N, T, C, C, C, dA, C, ch.A.data(), C, sc.Y.data(), C);
  mm(T, N, C, C, C, ch.A.data(), C, sc.Y.data(), C, sc.dM.data(), C);
  // (g) M_ij = β_i KK_ij E_ij (j < i): dβ, dE, and dKK = −(AᵀY)_ij β_i E_ij (strictly lower, in place of dM);
  //     then KK = K Kᵀ: dk += dKK K + dKKᵀ K.
  float* dKK = sc.dM.data();
  for (int64_t i = 0; i < C; ++i) {
    for (int64_t j = 0; j < C; ++j) {
      if (j >= i) {
        dKK[i * C + j] = 0.f;
        continue;
      }
      const float dM = -dKK[i * C + j], KK = ch.KK[i * C + j], E = ch.E[i * C + j];
      sc.dbeta[i] += dM * KK * E;
      sc.dE[i * C + j] += dM * ch.beta[i] * KK;
      dKK[i * C + j] = dM * ch.beta[i] * E;
    }
  }
  mm(N, N, C, dk, C, dKK, C, ch.k.data(), dk, sc.dk.data(), dk, add);
  mm(T, N, C, dk, C, dKK, C, ch.k.data(), dk, sc.dk.data(), dk, add);
  // (i) E_ij = e^{γ_i − γ_j}: dγ_i += dE_ij E_ij, dγ_j −= dE_ij E_ij.
  for (int64_t i = 0; i < C; ++i) {
    for (int64_t j = 0; j < i; ++j) {
      const float t = sc.dE[i * C + j] * ch.E[i * C + j];
      sc.dgam[i] += t;
      sc.dgam[j] -= t;
    }
  }
  // (l) Kb_i = β_i e^{γ_i} k_i;  (m) Vb_i = β_i v_i.
  for (int64_t i = 0; i < C; ++i) {
    const float t = ch.eg[i] * dot(&ch.k[i * dk], &sc.dKb[i * dk], dk);
    axpy(&sc.dk[i * dk], ch.beta[i] * ch.eg[i], &sc.dKb[i * dk], dk);
    sc.dbeta[i] += t;
    sc.dgam[i] += ch.beta[i] * t;
    for (int64_t e = 0; e < dv; ++e) sc.dv[i * dv + e] = ch.beta[i] * sc.dVb[i * dv + e];
    sc.dbeta[i] += dot(&ch.v[i * dv], &sc.dVb[i * dv], dv);
  }
  // (n) γ_C is γ of the chunk's last token.
  sc.dgam[C - 1] += dG;
}

// One sequence, one key head: every value head of the group, chunks from the last. Writes dv, dbeta, dg of the
// value heads and dq, dk of the key head (the value heads' sums in value-head order).
void backward_sequence(float* dq, float* dk, float* dv, float* dbeta, float* dg, const float* dout,
                       const Sequence& seq, int64_t kh, const float* q, const float* k, const float* v,
                       const float* beta, const float* g, const DeltaShape& s, BackwardScratch& sc) {
  const int64_t group = s.Hv / s.Hk, Sdd = s.dk * s.dv, ldo = s.Hv * s.dv;
  const int64_t chunks = (seq.len + kDeltaChunk - 1) / kDeltaChunk;
  std::fill(sc.dq_seq.begin(), sc.dq_seq.begin() + seq.len * s.dk, 0.f);
  std::fill(sc.dk_seq.begin(), sc.dk_seq.begin() + seq.len * s.dk, 0.f);
  for (int64_t vh = kh * group; vh < (kh + 1) * group; ++vh) {
    // The forward again, by its own steps (so the backward sees the forward's S₀ bits): every chunk's quantities
    // kept for the reverse pass, and the chunk-start states.
    std::fill(sc.states.begin(), sc.states.begin() + Sdd, 0.f);
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t c0 = c * kDeltaChunk;
      Chunk& ch = sc.chunks[size_t(c)];
      ch.load(seq.begin + c0, std::min(kDeltaChunk, seq.len - c0), kh, vh, q, k, v, beta, g, s);
      ch.solve();
      ch.pseudo_values(&sc.states[size_t(c * Sdd)]);
      if (c + 1 == chunks) break;
      std::memcpy(&sc.states[size_t((c + 1) * Sdd)], &sc.states[size_t(c * Sdd)], size_t(Sdd) * 4);
      ch.advance(&sc.states[size_t((c + 1) * Sdd)]);
    }
    std::fill(sc.dS.begin(), sc.dS.end(), 0.f);
    for (int64_t c = chunks - 1; c >= 0; --c) {
      const int64_t c0 = c * kDeltaChunk, n0 = seq.begin + c0;
      const float* S0 = &sc.states[size_t(c * Sdd)];
      const Chunk& ch = sc.chunks[size_t(c)];
      backward_chunk(ch, S0, dout + n0 * ldo + vh * s.dv, ldo, sc);
      // (o) γ = cumsum(g): dg_j = Σ_{i≥j} dγ_i.
      float acc = 0.f;
      for (int64_t i = ch.C - 1; i >= 0; --i) {
        acc += sc.dgam[size_t(i)];
        const int64_t n = n0 + i;
        dg[n * s.Hv + vh] = acc;
        dbeta[n * s.Hv + vh] = sc.dbeta[size_t(i)];
        std::memcpy(dv + n * s.ldv + vh * s.dv, &sc.dv[size_t(i * s.dv)], size_t(s.dv) * 4);
        axpy(&sc.dq_seq[size_t((c0 + i) * s.dk)], s.scale, &sc.dq[size_t(i * s.dk)], s.dk);
        axpy(&sc.dk_seq[size_t((c0 + i) * s.dk)], 1.f, &sc.dk[size_t(i * s.dk)], s.dk);
      }
      std::swap(sc.dS, sc.dS0);
    }
  }
  for (int64_t i = 0; i < seq.len; ++i) {
    const int64_t n = seq.begin + i;
    std::memcpy(dq + n * s.ldq + kh * s.dk, &sc.dq_seq[size_t(i * s.dk)], size_t(s.dk) * 4);
    std::memcpy(dk + n * s.ldk + kh * s.dk, &sc.dk_seq[size_t(i * s.dk)], size_t(s.dk) * 4);
  }
}

}  // namespace

void gated_delta_forward(float* o, const float* q, const float* k, const float* v, const float* beta,
                         const float* g, const int32_t* doc_ids, const DeltaShape& s) {
  LT_OPS_OVERRIDE(gated_delta_forward, o, q, k, v, beta, g, doc_ids, s);
  check_shape(s);
  const std::vector<Sequence> seqs = sequences(doc_ids, s);
  parallel_for(int64_t(seqs.size()) * s.Hv, [&](int64_t task) {
    forward_sequence(o, seqs[size_t(task / s.Hv)], task % s.Hv, q, k, v, beta, g, s);
  });
}

void gated_delta_backward(float* dq, float* dk, float* dv, float* dbeta, float* dg, const float* dout,
                          const float* q, const float* k, const float* v, const float* beta, const float* g,
                          const int32_t* doc_ids, const DeltaShape& s) {
  LT_OPS_OVERRIDE(gated_delta_backward, dq, dk, dv, dbeta, dg, dout, q, k, v, beta, g, doc_ids, s);
  check_shape(s);
  const std::vector<Sequence> seqs = sequences(doc_ids, s);
  parallel_for(int64_t(seqs.size()) * s.Hk, [&](int64_t task) {
    const Sequence& seq = seqs[size_t(task / s.Hk)];
    BackwardScratch sc(s, seq.len);
    backward_sequence(dq, dk, dv, dbeta, dg, dout, seq, task % s.Hk, q, k, v, beta, g, s, sc);
  });
}

void gated_delta_step(float* o, float* state, const float* q, const float* k, const float* v, const float* beta,
                      const float* g, const DeltaShape& s) {
  LT_CHECK(s.Hk > 0 && s.Hv > 0 && s.Hv % s.Hk == 0 && s.dk > 0 && s.dv > 0,
           "gated delta step: bad heads (Hk {} Hv {} dk {} dv {})", s.Hk, s.Hv, s.dk, s.dv);
  const int64_t group = s.Hv / s.Hk, Sdd = s.dk * s.dv;
  std::vector<float> qs(static_cast<size_t>(s.dk)), u(static_cast<size_t>(s.dv));
  for (int64_t vh = 0; vh < s.Hv; ++vh) {
    const float* kh = k + (vh / group) * s.dk;
    const float* qh = q + (vh / group) * s.dk;
    float* S = state + vh * Sdd;
    const float decay = std::exp(g[vh]);
    for (int64_t x = 0; x < Sdd; ++x) S[x] *= decay;
    state_t_times(u.data(), S, kh, s.dk, s.dv);  // Sᵀk
    for (int64_t e = 0; e < s.dv; ++e) u[size_t(e)] = beta[vh] * (v[vh * s.dv + e] - u[size_t(e)]);
    state_add_outer(S, 1.f, kh, u.data(), s.dk, s.dv);
    for (int64_t d = 0; d < s.dk; ++d) qs[size_t(d)] = qh[d] * s.scale;
    state_t_times(o + vh * s.dv, S, qs.data(), s.dk, s.dv);
  }
}

size_t gated_delta_backward_task_bytes(const DeltaShape& s) { return BackwardScratch::bytes(s, s.T); }

// ---------------------------------------------------------------------------------------------------------
// The recurrence in f64 (the reference)
// ---------------------------------------------------------------------------------------------------------

void gated_delta_forward_recurrent(float* o, const float* q, const float* k, const float* v, const float* beta,
                                   const float* g, const int32_t* doc_ids, const DeltaShape& s) {
  check_shape(s);
  const int64_t group = s.Hv / s.Hk, dk = s.dk, dv = s.dv;
  std::vector<double> S(static_cast<size_t>(dk * dv)), u(static_cast<size_t>(dv));
  for (const Sequence& seq : sequences(doc_ids, s)) {
    for (int64_t vh = 0; vh < s.Hv; ++vh) {
      const int64_t kh = vh / group;
      std::fill(S.begin(), S.end(), 0.0);
      for (int64_t n = seq.begin; n < seq.begin + seq.len; ++n) {
        const float* qn = q + n * s.ldq + kh * dk;
        const float* kn = k + n * s.ldk + kh * dk;
        const float* vn = v + n * s.ldv + vh * dv;
        const double decay = std::exp(double(g[n * s.Hv + vh])), b = beta[n * s.Hv + vh];
        for (double& x : S) x *= decay;
        for (int64_t e = 0; e < dv; ++e) {
          double kv = 0;
          for (int64_t d = 0; d < dk; ++d) kv += S[size_t(d * dv + e)] * kn[d];
          u[size_t(e)] = b * (vn[e] - kv);
        }
        for (int64_t d = 0; d < dk; ++d)
          for (int64_t e = 0; e < dv; ++e) S[size_t(d * dv + e)] += double(kn[d]) * u[size_t(e)];
        for (int64_t e = 0; e < dv; ++e) {
          double acc = 0;
          for (int64_t d = 0; d < dk; ++d) acc += S[size_t(d * dv + e)] * (double(qn[d]) * s.scale);
          o[n * s.Hv * dv + vh * dv + e] = float(acc);
        }
      }
    }
  }
}

void gated_delta_backward_recurrent(float* dq, float* dk, float* dv, float* dbeta, float* dg, const float* dout,
                                    const float* q, const float* k, const float* v, const float* beta,
                                    const float* g, const int32_t* doc_ids, const DeltaShape& s) {
  check_shape(s);
  const int64_t group = s.Hv / s.Hk, Kd = s.dk, Vd = s.dv, Sdd = Kd * Vd;
  for (const Sequence& seq : sequences(doc_ids, s)) {
    const int64_t len = seq.len;
    // dq, dk of each key head: the value heads' sums (f64, rounded once).
    std::vector<double> dq_acc(size_t(len * s.Hk * Kd), 0.0), dk_acc(size_t(len * s.Hk * Kd), 0.0);
    for (int64_t vh = 0; vh < s.Hv; ++vh) {
      const int64_t kh = vh / group;
      auto at = [&](const float* base, int64_t ld, int64_t n, int64_t off) { return base + n * ld + off; };
      // Forward, keeping S_t after each token (states[t + 1]) and the decayed state S' of each token.
      // resid = v − S'ᵀk and u = β resid per token.
      std::vector<double> states(size_t((len + 1) * Sdd), 0.0), decayed(size_t(len * Sdd));
      std::vector<double> resid(size_t(len * Vd)), u(size_t(len * Vd));
      for (int64_t t = 0; t < len; ++t) {
        const int64_t n = seq.begin + t;
        const float* kn = at(k, s.ldk, n, kh * Kd);
        const float* vn = at(v, s.ldv, n, vh * Vd);
        const double decay = std::exp(double(g[n * s.Hv + vh])), b = beta[n * s.Hv + vh];
        double* Sp = &decayed[size_t(t * Sdd)];
        for (int64_t x = 0; x < Sdd; ++x) Sp[x] = decay * states[size_t(t * Sdd + x)];
        for (int64_t e = 0; e < Vd; ++e) {
          double kv = 0;
          for (int64_t d = 0; d < Kd; ++d) kv += Sp[d * Vd + e] * kn[d];
          resid[size_t(t * Vd + e)] = vn[e] - kv;
          u[size_t(t * Vd + e)] = b * resid[size_t(t * Vd + e)];
        }
        double* Sn = &states[size_t((t + 1) * Sdd)];
        for (int64_t d = 0; d < Kd; ++d)
          for (int64_t e = 0; e < Vd; ++e) Sn[d * Vd + e] = Sp[d * Vd + e] + double(kn[d]) * u[size_t(t * Vd + e)];
      }
      // Backward from the last token.
      std::vector<double> dS(static_cast<size_t>(Sdd), 0.0), du(static_cast<size_t>(Vd)), dkv(static_cast<size_t>(Vd));
      for (int64_t t = len - 1; t >= 0; --t) {
        const int64_t n = seq.begin + t;
        const float* qn = at(q, s.ldq, n, kh * Kd);
        const float* kn = at(k, s.ldk, n, kh * Kd);
        const float* don = dout + n * s.Hv * Vd + vh * Vd;
        const double b = beta[n * s.Hv + vh];
        const double* Sn = &states[size_t((t + 1) * Sdd)];
        const double* Sp = &decayed[size_t(t * Sdd)];
        double* dqn = &dq_acc[size_t((t * s.Hk + kh) * Kd)];
        double* dkn = &dk_acc[size_t((t * s.Hk + kh) * Kd)];
        // o = S_tᵀ (scale q): dq += scale S_t do, dS += scale q doᵀ.
        for (int64_t d = 0; d < Kd; ++d) {
          double acc = 0;
          for (int64_t e = 0; e < Vd; ++e) {
            acc += Sn[d * Vd + e] * don[e];
            dS[size_t(d * Vd + e)] += double(qn[d]) * s.scale * don[e];
          }
          dqn[d] += acc * s.scale;
        }
        // S_t = S' + k uᵀ: dk += dS u, du = dSᵀ k.
        for (int64_t e = 0; e < Vd; ++e) {
          double acc = 0;
          for (int64_t d = 0; d < Kd; ++d) acc += dS[size_t(d * Vd + e)] * kn[d];
          du[size_t(e)] = acc;
        }
        for (int64_t d = 0; d < Kd; ++d) {
          double acc = 0;
          for (int64_t e = 0; e < Vd; ++e) acc += dS[size_t(d * Vd + e)] * u[size_t(t * Vd + e)];
          dkn[d] += acc;
        }
        // u = β (v − S'ᵀ k): dβ, dv, and dkv = −β du into S' and k.
        double db = 0;
        for (int64_t e = 0; e < Vd; ++e) {
          db += du[size_t(e)] * resid[size_t(t * Vd + e)];
          dv[n * s.ldv + vh * Vd + e] = float(b * du[size_t(e)]);
          dkv[size_t(e)] = -b * du[size_t(e)];
        }
        dbeta[n * s.Hv + vh] = float(db);
        for (int64_t d = 0; d < Kd; ++d) {
          double acc = 0;
          for (int64_t e = 0; e < Vd; ++e) {
            dS[size_t(d * Vd + e)] += double(kn[d]) * dkv[size_t(e)];
            acc += Sp[d * Vd + e] * dkv[size_t(e)];
          }
          dkn[d] += acc;
        }
        // S' = e^g S_{t-1}: dg = Σ S' ⊙ dS, dS_{t-1} = e^g dS.
        const double decay = std::exp(double(g[n * s.Hv + vh]));
        double dgt = 0;
        for (int64_t x = 0; x < Sdd; ++x) {
          dgt += Sp[x] * dS[size_t(x)];
          dS[size_t(x)] *= decay;
        }
        dg[n * s.Hv + vh] = float(dgt);
      }
    }
    for (int64_t t = 0; t < len; ++t) {
      const int64_t n = seq.begin + t;
      for (int64_t kh = 0; kh < s.Hk; ++kh)
        for (int64_t d = 0; d < Kd; ++d) {
          dq[n * s.ldq + kh * Kd + d] = float(dq_acc[size_t((t * s.Hk + kh) * Kd + d)]);
          dk[n * s.ldk + kh * Kd + d] = float(dk_acc[size_t((t * s.Hk + kh) * Kd + d)]);
        }
    }
  }
}

}  // namespace lt
