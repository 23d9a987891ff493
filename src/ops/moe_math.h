// ops/moe_math.h — one token's router arithmetic, the one definition the CPU op (ops/cpu/moe.cpp) and the CUDA
// kernel (cuda/kernels/moe.cuh) compile, so both give the same bits (ops/moe.h's contract).
//
// Per token: p[E] = softmax(z[E]), the k best experts by score (p, or z for topk_softmax), their routing
// weights; and the backward from dw[k] to dz[E]. Arithmetic, as ops/cpu/moe.cpp's header says: each exp is
// float(exp(double(z) − double(m))) (a correctly rounded double exp but in vanishing cases, so any libm or a GPU's
// double exp gives the same f32), sums over E one double accumulator in index order rounded once, sums over k f32
// in j order. No FMA: the CPU build is baseline x86-64 and nvcc compiles the kernels with -fmad=false.
#pragma once

#include <math.h>

#include <cstdint>

#include "core/host_device.h"

namespace lt::moe_math {

LT_HD_INLINE float exp_f32(float z, float m) { return float(::exp(double(z) - double(m))); }

// p[E] = softmax(z[E]): max subtracted, exps in f32, their sum in double in index order, rounded once.
LT_HD_INLINE void softmax_row(float* p, const float* z, int64_t E) {
  float m = z[0];
  for (int64_t e = 1; e < E; ++e) m = z[e] > m ? z[e] : m;
  double sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += double(p[e] = exp_f32(z[e], m));
  const float s = float(sum);
  for (int64_t e = 0; e < E; ++e) p[e] /= s;
}

// id[k] = the k largest of score[E], best first, equal scores by the lower index; sc[k] their scores. Insertion
// with a strict '>' keeps an earlier (lower) index ahead of an equal later one; the list always fills with valid
// ids (a NaN score is never preferred). O(E·k) worst, O(E) typically.
LT_HD_INLINE void top_k(int32_t* id, float* sc, const float* score, int64_t E, int64_t k) {
  int64_t n = 0;
  for (int64_t e = 0; e < E; ++e) {
    const float v = score[e];
    if (n == k && !(v > sc[k - 1])) continue;
    int64_t i = n < k ? n++ : k - 1;  // a full list drops its last
    for (; i > 0 && v > sc[i - 1]; --i) sc[i] = sc[i - 1], id[i] = id[i - 1];
    sc[i] = v, id[i] = int32_t(e);
  }
}

// One token: probs p[E], ids id[k], weights w[k] from its logits z[E]. topk_softmax: the k largest logits, w =
// softmax over them; else the k largest p, w = p_sel (÷ their f32 sum with renormalize).
LT_HD_INLINE void route_token(int32_t* id, float* w, float* p, const float* z, int64_t E, int64_t k,
                              bool topk_softmax, bool renormalize) {
  softmax_row(p, z, E);
  top_k(id, w, topk_softmax ? z : p, E, k);  // w: the selection's scores, then its weights
  if (topk_softmax) {
    double sum = 0;  // z[id[0]] is the max of the selected logits
    for (int64_t j = 0; j < k; ++j) sum += double(w[j] = exp_f32(z[id[j]], z[id[0]]));
    const float d = float(sum);
    for (int64_t j = 0; j < k; ++j) w[j] /= d;
  } else if (renormalize) {
    float sel = 0;  // Σ p_sel in j order (f32, as torch's routing_weights.sum)
    for (int64_t j = 0; j < k; ++j) sel += w[j];
    for (int64_t j = 0; j < k; ++j) w[j] /= sel;
  }
}

// In place over dz[E] holding dp: dz = p ⊙ (dp − Σ_e p_e·dp_e), the full softmax's backward.
LT_HD_INLINE void softmax_backward_in_place(float* dz, const float* p, int64_t E) {
  double pdp = 0;
  for (int64_t e = 0; e < E; ++e) pdp += double(p[e]) * double(dz[e]);
  const float c = float(pdp);
  for (int64_t e = 0; e < E; ++e) dz[e] = p[e] * (dz[e] - c);
}

// One token's backward: dz[E] (written) from dw[k], plus extra[E] (or null) added to dp — the auxiliary loss's
// gradient of this token's probabilities. id, w, p as route_token wrote them (Σ p_sel recomputed as it summed).
LT_HD_INLINE void route_token_backward(float* dz, const float* dw, const float* extra, const int32_t* id,
                                       const float* w, const float* p, int64_t E, int64_t k, bool topk_softmax,
                                       bool renormalize) {
  float wdw = 0;  // Σ_i w_i·dw_i in i order (f32)
  for (int64_t j = 0; j < k; ++j) wdw += w[j] * dw[j];
  for (int64_t e = 0; e < E; ++e) dz[e] = extra ? extra[e] : 0.0f;
  if (!topk_softmax) {
    // dp_sel: with renormalisation w_j = p_sel_j / S, so dp_sel_j = (dw_j − Σ_i dw_i·w_i) / S; else dw.
    float sel = 0;
    if (renormalize)
      for (int64_t j = 0; j < k; ++j) sel += p[id[j]];
    for (int64_t j = 0; j < k; ++j) dz[id[j]] += renormalize ? (dw[j] - wdw) / sel : dw[j];
    softmax_backward_in_place(dz, p, E);
  } else {
    // The extra's path through p over all E, then the k-way softmax's: dz_sel_j = w_j·(dw_j − Σ_i w_i·dw_i).
    if (extra) softmax_backward_in_place(dz, p, E);
    for (int64_t j = 0; j < k; ++j) dz[id[j]] += w[j] * (dw[j] - wdw);
  }
}

}  // namespace lt::moe_math
