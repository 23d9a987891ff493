// ops/attention.h — causal grouped-query attention, tiled with an online softmax (FlashAttention style):
// the T×T score matrix is never materialised; the forward saves the log-sum-exp per query row and the
// backward recomputes probabilities from it.
//
// Query head h reads key/value head h / (Hq / Hkv). Scale 1/sqrt(D).
// doc_ids (optional, [B, T]): when given, token i attends to j only if j <= i and doc_ids match —
// packing several documents in one row without attention crossing them. nullptr = plain causal.
#pragma once

#include <cstdint>

namespace lt {

struct AttentionShape {
  int64_t B, T, Hq, Hkv, D;
};

// out[B, T, Hq, D]; lse[B, Hq, T] (natural-log log-sum-exp of the scaled scores, saved);
// q[B, T, Hq, D], k[B, T, Hkv, D], v[B, T, Hkv, D].
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const int32_t* doc_ids, AttentionShape s);

// dq, dk, dv written (same shapes as q, k, v).
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out, const float* lse,
                        const float* q, const float* k, const float* v, const int32_t* doc_ids, AttentionShape s);

}  // namespace lt
