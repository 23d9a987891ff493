// ops/delta_gates.h — the two per-token, per-value-head gates of Gated DeltaNet (HF Qwen3.5/3.6):
//   beta[n, h] = σ(b[n, h])                                         write strength ∈ (0, 1)
//   g[n, h]    = −exp(A_log[h]) · softplus(a[n, h] + dt_bias[h])    log decay ≤ 0 (Mamba-2's Δ·A)
// from the projections b = in_proj_b(x), a = in_proj_a(x) [N, Hv] and the per-head parameters A_log, dt_bias.
// The delta rule multiplies its state by e^g each token, so g ≤ 0 keeps it from growing.
//
// Legend: N tokens, Hv value heads. All f32 (HF computes g from A_log.float() and a.float()).
//
// softplus(x) = x for x > 20, else log1p(exp(x)): torch's F.softplus (beta 1, threshold 20), stable for large
// |x| (exp(20) is far from overflow; for x → −∞ it goes to 0 like e^x). σ is swiglu_math's (ops/swiglu_math.h).
//
// Backward (softplus'(x) = σ(x), taken as torch does: 1 for x > 20, else e^x / (e^x + 1)):
//   db[n, h]       = dbeta · β (1 − β)                          written (1 − β as σ(−b), no cancellation)
//   da[n, h]       = dg · (−exp(A_log[h])) · softplus'(a + dt_bias)   written
//   dA_log[h]     += Σ_n dg[n, h] · g[n, h]                     accumulated
//   ddt_bias[h]   += Σ_n da[n, h]                               accumulated
// The two sums run over fixed token chunks into double partials, summed in chunk order and added once in f32:
// the bits never depend on the thread count.
#pragma once

#include <cstdint>

namespace lt {

// beta[N, Hv], g[N, Hv] from b[N, Hv], a[N, Hv], A_log[Hv], dt_bias[Hv]. Nothing saved: the backward
// recomputes from b and a.
void delta_gates_forward(float* beta, float* g, const float* b, const float* a, const float* A_log,
                         const float* dt_bias, int64_t N, int64_t Hv);

// db, da [N, Hv] written; dA_log, ddt_bias [Hv] accumulated; from dbeta, dg [N, Hv]. db may be dbeta and da
// may be dg.
void delta_gates_backward(float* db, float* da, float* dA_log, float* ddt_bias, const float* dbeta, const float* dg,
                          const float* b, const float* a, const float* A_log, const float* dt_bias, int64_t N,
                          int64_t Hv);

}  // namespace lt
