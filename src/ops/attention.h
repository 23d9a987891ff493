// ops/attention.h — causal grouped-query attention, tiled with an online softmax (FlashAttention style):
// the T×T score matrix is never materialised; the forward saves the log-sum-exp per query row and the
// backward recomputes probabilities from it.
//
// Query head h reads key/value head h / (Hq / Hkv). Scale 1/sqrt(D).
// doc_ids (optional, [B, T]): when given, token i attends to j only if j <= i and doc_ids match —
// packing several documents in one row without attention crossing them. nullptr = plain causal.
// window (AttentionShape; GPT-OSS's sliding layers): > 0 narrows that to the last `window` keys, i − window < j <= i
// (transformers' sliding window: W keys including the query itself); 0 = every earlier key.
//
// Attention sinks (GPT-OSS): one learned logit per query head joins every row's softmax and its probability is
// dropped, p_ij = exp(s_ij) / (Σ_j exp(s_ij) + exp(sink_h)). That is ordinary attention with out scaled by
// exp(lse − lse') and lse' = log(exp(lse) + exp(sink)); the backward of ordinary attention given out' and lse' is then
// the sink softmax's (its P = exp(S − lse') and Di = rowsum(dO ∘ O') = Σ_j p_ij dP_ij, the sink column's dP being 0),
// and the sink's own gradient is −Σ_i exp(sink_h − lse'_i) · Di. So sinks are two small ops around the unchanged
// kernels: attention_sinks_forward after attention_forward, attention_sinks_backward beside attention_backward.
#pragma once

#include <cstdint>

namespace lt {

struct AttentionShape {
  int64_t B, T, Hq, Hkv, D;
  int64_t window = 0;  // sliding window (keys, the query's own included); 0: none
};

// out[B, T, Hq, D]; lse[B, Hq, T] (natural-log log-sum-exp of the scaled scores, saved);
// q[B, T, Hq, D], k[B, T, Hkv, D], v[B, T, Hkv, D].
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const int32_t* doc_ids, AttentionShape s);

// dq, dk, dv written (same shapes as q, k, v).
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out, const float* lse,
                        const float* q, const float* k, const float* v, const int32_t* doc_ids, AttentionShape s);

// The sinks applied to attention_forward's out [B, T, Hq, D] and lse [B, Hq, T], in place; sinks [Hq] (f32 logits,
// on the scale of the scaled scores). Each row in double, rounded once.
void attention_sinks_forward(float* out, float* lse, const float* sinks, AttentionShape s);

// dsinks[Hq] (written) = −Σ_{b,i} exp(sink_h − lse_bhi) · rowsum(dout ∘ out)_bhi, from the sink-adjusted out and lse
// (the ones attention_backward is then given); summed in double in (b, i) order.
void attention_sinks_backward(float* dsinks, const float* dout, const float* out, const float* lse,
                              const float* sinks, AttentionShape s);

}  // namespace lt
