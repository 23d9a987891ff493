// ops/moe.h — Mixture-of-Experts routing, token permutation, the weighted combine and the load-balancing loss
// (qwen3_moe, qwen3_5_moe, gpt_oss; ../shared/REFERENCES.md §11 and transformers' modeling code).
//
// Legend: N tokens, C hidden, E experts, k experts per token, A = N·k assignments (token t's j-th choice is
// assignment t·k + j), I an expert's intermediate size.
//
// The experts' GEMMs are not here: model/moe_ffn.cpp runs them per expert on ops/linear.h over the rows this
// file groups. Everything here is elementwise or a short reduction (O(N·E) or O(A·C)), one plain loop each,
// with every sum in a fixed index order: no atomics, the same bits on every host, thread count and plan.
// Activations f32; expert ids int32.
#pragma once

#include <cstdint>

namespace lt {

enum class RouterKind : uint8_t {
  softmax_topk,  // qwen3_moe, qwen3_5_moe: p = softmax(logits) over E; the k largest p; w = p (÷ Σ of the k, renorm)
  topk_softmax,  // gpt_oss: the k largest logits; w = softmax over those k
};

struct RouterShape {
  int64_t N, E, k;
  RouterKind kind = RouterKind::softmax_topk;
  bool renormalize = false;  // softmax_topk only (refused with topk_softmax): w = p_sel / Σ p_sel (qwen3_moe's
                             // norm_topk_prob; always in qwen3_5_moe)
};

// probs[N, E] = softmax(logits[N, E]) as f32 (max subtracted, summed in index order), written for both kinds
// (the auxiliary loss reads it). ids[N, k]: the k best experts of each token by score (p for softmax_topk, the
// logit for topk_softmax), best first, equal scores ordered by the lower expert index. weights[N, k]: their
// routing weights as RouterKind says. Each exp is float(std::exp(double)) (correctly rounded but in rare cases, so
// any libm gives the same bits); sums over E in double, rounded once; the k-term renormalising sum in f32. A NaN or
// infinite logit is an error naming its token. N may be 0; 1 <= k <= E.
void router_forward(int32_t* ids, float* weights, float* probs, const float* logits, const RouterShape& s);

// dlogits[N, E] (written) from dweights[N, k]; dprobs_extra[E], or null, is added to the gradient of probs of
// every token that `counted[N]` marks non-zero (null: every token) — the auxiliary loss's, aux_loss_dprobs: one
// value per expert for all of a step's counted tokens. ids, weights and probs as router_forward wrote them (the
// renormalising Σ p_sel is recomputed from probs as the forward summed it). Sums over E in double, rounded once;
// over k in f32.
void router_backward(float* dlogits, const float* dweights, const float* dprobs_extra, const uint8_t* counted,
                     const int32_t* ids, const float* weights, const float* probs, const RouterShape& s);

// The assignments grouped by expert, stably: expert 0's rows first, each expert's in token order.
// offsets[E + 1]: expert e's grouped rows are [offsets[e], offsets[e + 1]); order[A]: the assignment t·k + j at
// each grouped row; row_of[A]: the grouped row of assignment t·k + j (order's inverse).
void moe_permute(int64_t* offsets, int32_t* order, int32_t* row_of, const int32_t* ids, int64_t N, int64_t k,
                 int64_t E);

// xp[A, C]: grouped row r is x[order[r] / k] (the token of its assignment).
void moe_gather(float* xp, const float* x, const int32_t* order, int64_t A, int64_t k, int64_t C);

// dx[N, C] (written) = Σ_j dxp[row_of[t·k + j]], j = 0 .. k-1 in order: moe_gather's backward.
void moe_scatter_add(float* dx, const float* dxp, const int32_t* row_of, int64_t N, int64_t k, int64_t C);

// out[N, C] (written) = Σ_j weights[t, j] · yp[row_of[t·k + j]], j = 0 .. k-1 in order.
void moe_combine_forward(float* out, const float* yp, const float* weights, const int32_t* row_of, int64_t N,
                         int64_t k, int64_t C);

// The combine's backward (both written): dyp[row_of[t·k + j]] = weights[t, j] · dout[t] and
// dweights[t, j] = dout[t] · yp[row_of[t·k + j]] (a dot over C in index order).
void moe_combine_backward(float* dyp, float* dweights, const float* dout, const float* yp, const float* weights,
                          const int32_t* row_of, int64_t N, int64_t k, int64_t C);

// The combine's backward through the experts' down projections without their outputs (the block keeps h, not
// yp): g[A, I] holds dout[t] · W_down(e) for each grouped row r (assignment a = order[r], t = a / k, j = a % k) and
// h[A, I] the down projections' inputs. dweights[t, j] (written) = g[r] · h[r] (a dot over I in index order)
// + (down_bias ? dout[t] · down_bias[e] : 0) with down_bias[E, C] and dout[N, C] (only read with a bias); then
// g[r] is scaled in place by weights[t, j], becoming d h[r].
void moe_weight_grads(float* dweights, float* g, const float* h, const float* weights, const int32_t* order,
                      const int32_t* ids, const float* dout, const float* down_bias, int64_t A, int64_t k, int64_t I,
                      int64_t C);

// The load-balancing auxiliary loss as transformers' load_balancing_loss_func computes it: every sparse layer's
// router probabilities over the tokens its attention mask counts pooled (R = layers · counted tokens rows; no mask:
// every token), f_e = the share of rows that chose e among their k, P̄_e = the mean of p_e over the rows,
// aux = E · Σ_e f_e · P̄_e. Streamed layer by layer: aux_loss_accumulate adds (+=; the caller zeroes both before the
// first layer) the counted tokens' counts[E] (rows that chose e; exact integers in double) and prob_sums[E] (Σ over
// them of p_e, in token order), and returns how many rows it counted (counted[N] non-zero, or null: all N); the
// forward's value and the backward's per-expert gradient need only the totals.
int64_t aux_loss_accumulate(double* counts, double* prob_sums, const int32_t* ids, const float* probs,
                            const uint8_t* counted, int64_t N, int64_t E, int64_t k);
// aux = E · Σ_e (counts_e / R) · (prob_sums_e / R), R = rows (layers · counted tokens).
double aux_loss_value(const double* counts, const double* prob_sums, int64_t E, int64_t rows);
// dprobs[E] (written): ∂(coef · aux)/∂p_e of any one counted row = coef · E · counts_e / R² (f32): router_backward's
// dprobs_extra for every sparse layer.
void aux_loss_dprobs(float* dprobs, const double* counts, double coef, int64_t E, int64_t rows);

}  // namespace lt
