// ops/gated_delta.h — the gated delta rule of Gated DeltaNet (Qwen3.5 / Qwen3.6 linear-attention layers),
// forward and backward.
//
// Per value head h (reading key head h / (Hv / Hk)), a state S [dk, dv] runs along each sequence from zero:
//   S ← e^{g_t} S;   u_t = β_t (v_t − Sᵀ k_t);   S ← S + k_t u_tᵀ;   o_t = Sᵀ (scale · q_t)
// (o_t reads the state after the token's own update). g_t ≤ 0 is the log decay, β_t ∈ (0, 1) the write strength.
// A sequence is a row of T tokens, or with doc_ids one document's run inside a row: the state never crosses a
// document boundary (packed rows), as attention's mask does not (ops/attention.h).
//
// Two implementations:
//   * the recurrence above (gated_delta_*_recurrent): the plain reference, in f64 throughout — the specification
//     the fast path is tested against;
//   * the chunked form (gated_delta_forward / _backward), the fast path: chunks of kDeltaChunk tokens, within a
//     chunk the WY representation (γ the in-chunk cumulative log decay, i, j tokens of the chunk):
//       M = strictly_lower(diag(β) K Kᵀ ⊙ e^{γi−γj}),  A = (I + M)⁻¹,  W = A diag(β e^γ) K,  U = A diag(β) V
//       V' = U − W S₀,   O = diag(e^γ) Q S₀ + lower(Q Kᵀ ⊙ e^{γi−γj}) V',   S₁ = e^{γ_C} S₀ + (diag(e^{γ_C−γ}) K)ᵀ V'
//     in f32 with every exponent ≤ 0 (γ is non-increasing; the masked triangle is never exponentiated). The
//     backward is reverse-mode through exactly these steps, chunk by chunk from the last, the chunk-start states
//     S₀ recomputed by a forward pass over the chunks, whose chunk quantities the reverse sweep then reuses (never
//     saved by the forward: at Qwen3.6's sizes they would be 16× the layer's other activations). Equal to the
//     recurrence to f32 rounding. Every product of a chunk's matrices is one GEMM (ops/gemm.h, single-threaded
//     inside the task of one sequence and head).
//
// Legend: B rows, T tokens per row, N = B·T, Hk key heads, Hv value heads (a multiple of Hk), dk key head dim,
// dv value head dim. Rows are strided (ld*: elements between consecutive tokens), so q, k and v may be slices of
// one [N, 2·Hk·dk + Hv·dv] buffer (the layer's conv output) and their gradients slices of its gradient.
//
// Gradient contract (ops/ops.h): every output here is an activation gradient, written (=). dq and dk of a key
// head sum its value heads' contributions in value-head order; results never depend on the thread count.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lt {

inline constexpr int64_t kDeltaChunk = 64;

struct DeltaShape {
  int64_t B, T, Hk, Hv, dk, dv;
  float scale;     // applied to q: HF uses dk^-1/2
  int64_t ldq, ldk, ldv;  // row strides of q / dq [N, Hk·dk], k / dk [N, Hk·dk], v / dv [N, Hv·dv]
  int64_t N() const { return B * T; }
  // A plain layout: q, k [N, Hk·dk] and v [N, Hv·dv] contiguous.
  static DeltaShape packed(int64_t B, int64_t T, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv, float scale) {
    return {B, T, Hk, Hv, dk, dv, scale, Hk * dk, Hk * dk, Hv * dv};
  }
};

// o[N, Hv·dv] (contiguous) from q, k (rows ldq, ldk of Hk·dk), v (rows ldv of Hv·dv), beta[N, Hv], g[N, Hv].
// doc_ids[B, T] or null (each row one sequence). Nothing is saved: the backward reads the same inputs.
void gated_delta_forward(float* o, const float* q, const float* k, const float* v, const float* beta,
                         const float* g, const int32_t* doc_ids, const DeltaShape& s);

// dq, dk, dv (strided as q, k, v), dbeta[N, Hv], dg[N, Hv] written from dout[N, Hv·dv].
void gated_delta_backward(float* dq, float* dk, float* dv, float* dbeta, float* dg, const float* dout,
                          const float* q, const float* k, const float* v, const float* beta, const float* g,
                          const int32_t* doc_ids, const DeltaShape& s);

// Transient memory the chunked backward allocates per task (one sequence of at most T tokens, one key head):
// every chunk's forward quantities and start state for one value head, and the chunk's temporaries. At most min(threads, tasks) at once.
size_t gated_delta_backward_task_bytes(const DeltaShape& s);

// One token of the recurrence in f32 on a carried state (generation's cache): for each value head h,
// S_h ← e^{g_h} S_h; S_h += k (β_h (v_h − S_hᵀ k))ᵀ; o_h = S_hᵀ (scale · q). state [Hv, dk, dv] is read and
// written; q, k [Hk·dk], v [Hv·dv], beta, g [Hv], o [Hv·dv] are one token's (B, T and the strides unused).
void gated_delta_step(float* o, float* state, const float* q, const float* k, const float* v, const float* beta,
                      const float* g, const DeltaShape& s);

// The plain references: the token-by-token recurrence in f64 (the backward keeps every state: small inputs only).
void gated_delta_forward_recurrent(float* o, const float* q, const float* k, const float* v, const float* beta,
                                   const float* g, const int32_t* doc_ids, const DeltaShape& s);
void gated_delta_backward_recurrent(float* dq, float* dk, float* dv, float* dbeta, float* dg, const float* dout,
                                    const float* q, const float* k, const float* v, const float* beta,
                                    const float* g, const int32_t* doc_ids, const DeltaShape& s);

}  // namespace lt
