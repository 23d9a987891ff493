// ops/cpu/moe.cpp — MoE routing, token permutation, the weighted combine and the load-balancing loss (ops/moe.h).
//
// Legend: N tokens, C hidden, E experts, k experts per token, A = N·k assignments (a = t·k + j), I an expert's
// intermediate size, r a grouped row.
//
// Arithmetic (the contract the tests check bit for bit):
//   * exp: float(std::exp(double(z) − double(m))). The double difference of two floats is exact at router scales
//     and glibc's double exp is within 1 ulp of double, so the rounded f32 is the correctly rounded exp in all but
//     a vanishing share of cases: the same bits from any decent libm (or a GPU's double exp), unlike f32 expf.
//   * Sums over E, C or I (the softmax denominators, Σ p·dp, the dots of the backward): one double accumulator in
//     index order, rounded to f32 once. Sums over the k choices of a token (renormalisation, Σ w·dw, the combine)
//     are f32 in j order, as torch computes them in f32. No FMA: the CPU build is baseline x86-64.
//   * Each task owns whole tokens (router, scatter_add, combine) or whole grouped rows (gather, the weight grads),
//     chunked by the problem size alone, so the bits never depend on the thread count. moe_permute is one serial
//     counting sort (O(A) integer work).
//   * No LT_OPS_OVERRIDE entry yet: ops/override.h has no MoE members (no CUDA kernel), so these always run here.
#include "ops/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"

namespace lt {
namespace {

constexpr int64_t kTokenChunk = 64;        // tokens per router task
constexpr int64_t kElemsPerTask = 1 << 14;  // floats per row-copy task (gather, scatter, combine, weight grads)

int64_t rows_per_task(int64_t width) { return std::max<int64_t>(1, kElemsPerTask / std::max<int64_t>(width, 1)); }

float exp_f32(float z, float m) { return float(std::exp(double(z) - double(m))); }

void check_router(const char* op, const RouterShape& s) {
  LT_CHECK(s.N >= 0 && s.E > 0, "{}: bad sizes N={}, E={}", op, s.N, s.E);
  LT_CHECK(s.k >= 1 && s.k <= s.E, "{}: k={} experts per token must be in [1, E={}]", op, s.k, s.E);
  LT_CHECK(s.kind == RouterKind::softmax_topk || !s.renormalize,
           "{}: renormalize applies to the softmax_topk router only (topk_softmax's weights already sum to 1)", op);
}

void check_ids(const char* op, const int32_t* ids, int64_t A, int64_t E) {
  for (int64_t a = 0; a < A; ++a)
    LT_CHECK(ids[a] >= 0 && ids[a] < E, "{}: expert id {} of assignment {} is outside [0, {})", op, ids[a], a, E);
}

// p[E] = softmax(z[E]): max subtracted, exps in f32, their sum in double in index order, rounded once.
void softmax_row(float* p, const float* z, int64_t E) {
  float m = z[0];
  for (int64_t e = 1; e < E; ++e) m = std::max(m, z[e]);
  double sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += double(p[e] = exp_f32(z[e], m));
  const float s = float(sum);
  for (int64_t e = 0; e < E; ++e) p[e] /= s;
}

// id[k] = the k largest of score[E], best first, equal scores by the lower index; sc[k] their scores. Insertion
// with a strict '>' keeps an earlier (lower) index ahead of an equal later one. O(E·k) worst, O(E) typically.
void top_k(int32_t* id, float* sc, const float* score, int64_t E, int64_t k) {
  int64_t n = 0;
  for (int64_t e = 0; e < E; ++e) {
    const float v = score[e];
    if (n == k && !(v > sc[k - 1])) continue;
    int64_t i = n < k ? n++ : k - 1;  // a full list drops its last
    for (; i > 0 && v > sc[i - 1]; --i) sc[i] = sc[i - 1], id[i] = id[i - 1];
    sc[i] = v, id[i] = int32_t(e);
  }
}

}  // namespace

void router_forward(int32_t* ids, float* weights, float* probs, const float* logits, const RouterShape& s) {
  check_router("router_forward", s);
  const int64_t E = s.E, k = s.k;
  // Checked up front, in token order, so the error names the first bad token whatever the threads.
  for (int64_t i = 0; i < s.N * E; ++i)
    LT_CHECK(std::isfinite(logits[i]), "router_forward: token {} has a non-finite router logit ({}) for expert {}",
             i / E, logits[i], i % E);
  parallel_chunks(s.N, kTokenChunk, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* z = logits + t * E;  // [E]
      float* p = probs + t * E;         // [E]
      int32_t* id = ids + t * k;        // [k]
      float* w = weights + t * k;       // [k]: the selection's scores, then its weights
      softmax_row(p, z, E);
      top_k(id, w, s.kind == RouterKind::softmax_topk ? p : z, E, k);
      if (s.kind == RouterKind::topk_softmax) {
        // w = softmax over the k selected logits; z[id[0]] is their max.
        double sum = 0;
        for (int64_t j = 0; j < k; ++j) sum += double(w[j] = exp_f32(z[id[j]], z[id[0]]));
        const float d = float(sum);
        for (int64_t j = 0; j < k; ++j) w[j] /= d;
      } else if (s.renormalize) {
        float sel = 0;  // Σ p_sel in j order (f32, as torch's routing_weights.sum)
        for (int64_t j = 0; j < k; ++j) sel += w[j];
        for (int64_t j = 0; j < k; ++j) w[j] /= sel;
      }  // else w = p_sel: the scores already are
    }
  });
}

void router_backward(float* dlogits, const float* dweights, const float* dprobs_extra, const uint8_t* counted,
                     const int32_t* ids, const float* weights, const float* probs, const RouterShape& s) {
  check_router("router_backward", s);
  check_ids("router_backward", ids, s.N * s.k, s.E);
  const int64_t E = s.E, k = s.k;
  parallel_chunks(s.N, kTokenChunk, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* p = probs + t * E;      // [E]
      const int32_t* id = ids + t * k;     // [k]
      const float* w = weights + t * k;    // [k]
      const float* dw = dweights + t * k;  // [k]
      float* dz = dlogits + t * E;         // [E]; first dp, the gradient of p
      float wdw = 0;                       // Σ_i w_i·dw_i in i order (f32)
      for (int64_t j = 0; j < k; ++j) wdw += w[j] * dw[j];
      // The softmax over all E, backward: dz = p ⊙ (dp − Σ_e p_e·dp_e), with dp read from dz.
      auto softmax_backward_in_place = [&] {
        double pdp = 0;
        for (int64_t e = 0; e < E; ++e) pdp += double(p[e]) * double(dz[e]);
        const float c = float(pdp);
        for (int64_t e = 0; e < E; ++e) dz[e] = p[e] * (dz[e] - c);
      };
      const bool extra = dprobs_extra && (!counted || counted[t]);
      if (extra) std::memcpy(dz, dprobs_extra, size_t(E) * sizeof(float));
      else std::fill(dz, dz + E, 0.0f);
      if (s.kind == RouterKind::softmax_topk) {
        // dp_sel: with renormalisation w_j = p_sel_j / S, so dp_sel_j = (dw_j − Σ_i dw_i·w_i) / S; else dw.
        float sel = 0;  // S recomputed exactly as the forward did
        if (s.renormalize)
          for (int64_t j = 0; j < k; ++j) sel += p[id[j]];
        for (int64_t j = 0; j < k; ++j) dz[id[j]] += s.renormalize ? (dw[j] - wdw) / sel : dw[j];
        softmax_backward_in_place();
      } else {
        // The extra's path through p over all E, then the k-way softmax's: dz_sel_j = w_j·(dw_j − Σ_i w_i·dw_i).
        if (extra) softmax_backward_in_place();
        for (int64_t j = 0; j < k; ++j) dz[id[j]] += w[j] * (dw[j] - wdw);
      }
    }
  });
}

void moe_permute(int64_t* offsets, int32_t* order, int32_t* row_of, const int32_t* ids, int64_t N, int64_t k,
                 int64_t E) {
  LT_CHECK(N >= 0 && k >= 1 && E >= 1, "moe_permute: bad sizes N={}, k={}, E={}", N, k, E);
  const int64_t A = N * k;
  LT_CHECK(A <= INT32_MAX, "moe_permute: {} assignments, at most 2^31 - 1 are supported", A);
  check_ids("moe_permute", ids, A, E);
  // A stable counting sort: offsets from the counts, then assignments placed in a = 0 .. A-1 order.
  std::fill(offsets, offsets + E + 1, int64_t(0));
  for (int64_t a = 0; a < A; ++a) ++offsets[ids[a] + 1];
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
  std::vector<int64_t> next(offsets, offsets + E);  // [E]: each expert's next free row
  for (int64_t a = 0; a < A; ++a) {
    const int64_t r = next[size_t(ids[a])]++;
    order[r] = int32_t(a);
    row_of[a] = int32_t(r);
  }
}

void moe_gather(float* xp, const float* x, const int32_t* order, int64_t A, int64_t k, int64_t C) {
  LT_CHECK(A >= 0 && k >= 1 && C >= 1 && A % k == 0, "moe_gather: bad sizes A={}, k={}, C={}", A, k, C);
  // xp[A, C] from x[N, C]
  parallel_chunks(A, rows_per_task(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) std::memcpy(xp + r * C, x + (order[r] / k) * C, size_t(C) * sizeof(float));
  });
}

void moe_scatter_add(float* dx, const float* dxp, const int32_t* row_of, int64_t N, int64_t k, int64_t C) {
  LT_CHECK(N >= 0 && k >= 1 && C >= 1, "moe_scatter_add: bad sizes N={}, k={}, C={}", N, k, C);
  // dx[N, C] = Σ_j dxp[A, C][row_of[t·k + j]], f32 in j order
  parallel_chunks(N, rows_per_task(C * k), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* d = dx + t * C;
      std::memcpy(d, dxp + int64_t(row_of[t * k]) * C, size_t(C) * sizeof(float));
      for (int64_t j = 1; j < k; ++j) {
        const float* src = dxp + int64_t(row_of[t * k + j]) * C;
        for (int64_t c = 0; c < C; ++c) d[c] += src[c];
      }
    }
  });
}

void moe_combine_forward(float* out, const float* yp, const float* weights, const int32_t* row_of, int64_t N,
                         int64_t k, int64_t C) {
  LT_CHECK(N >= 0 && k >= 1 && C >= 1, "moe_combine_forward: bad sizes N={}, k={}, C={}", N, k, C);
  // out[N, C] = Σ_j weights[N, k] · yp[A, C][row_of], f32 in j order (the first product starts the sum)
  parallel_chunks(N, rows_per_task(C * k), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* o = out + t * C;
      for (int64_t j = 0; j < k; ++j) {
        const float wj = weights[t * k + j];
        const float* y = yp + int64_t(row_of[t * k + j]) * C;
        if (j == 0)
          for (int64_t c = 0; c < C; ++c) o[c] = wj * y[c];
        else
          for (int64_t c = 0; c < C; ++c) o[c] += wj * y[c];
      }
    }
  });
}

void moe_combine_backward(float* dyp, float* dweights, const float* dout, const float* yp, const float* weights,
                          const int32_t* row_of, int64_t N, int64_t k, int64_t C) {
  LT_CHECK(N >= 0 && k >= 1 && C >= 1, "moe_combine_backward: bad sizes N={}, k={}, C={}", N, k, C);
  // dyp[A, C] and dweights[N, k] written; each token owns its k grouped rows
  parallel_chunks(N, rows_per_task(C * k), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* g = dout + t * C;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t r = row_of[t * k + j];
        const float wj = weights[t * k + j];
        const float* y = yp + r * C;
        float* dy = dyp + r * C;
        double dot = 0;
        for (int64_t c = 0; c < C; ++c) {
          dy[c] = wj * g[c];
          dot += double(g[c]) * double(y[c]);
        }
        dweights[t * k + j] = float(dot);
      }
    }
  });
}

void moe_weight_grads(float* dweights, float* g, const float* h, const float* weights, const int32_t* order,
                      const int32_t* ids, const float* dout, const float* down_bias, int64_t A, int64_t k, int64_t I,
                      int64_t C) {
  LT_CHECK(A >= 0 && k >= 1 && I >= 1 && A % k == 0 && (!down_bias || C >= 1),
           "moe_weight_grads: bad sizes A={}, k={}, I={}, C={}", A, k, I, C);
  // Each grouped row r owns g[r], h[r] and dweights[order[r]] (order is a permutation).
  parallel_chunks(A, rows_per_task(I + (down_bias ? 2 * C : 0)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t a = order[r], t = a / k;
      float* gr = g + r * I;        // [I]
      const float* hr = h + r * I;  // [I]
      double dot = 0;               // g·h over I, then dout·b over C, one accumulator
      for (int64_t i = 0; i < I; ++i) dot += double(gr[i]) * double(hr[i]);
      if (down_bias) {
        const float* b = down_bias + int64_t(ids[a]) * C;  // [C]
        const float* d = dout + t * C;                     // [C]
        for (int64_t c = 0; c < C; ++c) dot += double(d[c]) * double(b[c]);
      }
      dweights[a] = float(dot);
      const float wa = weights[a];
      for (int64_t i = 0; i < I; ++i) gr[i] *= wa;
    }
  });
}

int64_t aux_loss_accumulate(double* counts, double* prob_sums, const int32_t* ids, const float* probs,
                            const uint8_t* counted, int64_t N, int64_t E, int64_t k) {
  LT_CHECK(N >= 0 && E >= 1 && k >= 1 && k <= E, "aux_loss_accumulate: bad sizes N={}, E={}, k={}", N, E, k);
  check_ids("aux_loss_accumulate", ids, N * k, E);
  int64_t rows = 0;
  for (int64_t t = 0; t < N; ++t) {
    if (counted && !counted[t]) continue;
    for (int64_t j = 0; j < k; ++j) counts[ids[t * k + j]] += 1.0;
    ++rows;
  }
  // Each task owns a block of experts and walks the tokens in order: every prob_sums[e] is a token-order sum.
  constexpr int64_t kExpertBlock = 16;
  parallel_chunks(E, kExpertBlock, [&](int64_t e0, int64_t e1) {
    double acc[kExpertBlock] = {};
    for (int64_t t = 0; t < N; ++t) {
      if (counted && !counted[t]) continue;
      for (int64_t e = e0; e < e1; ++e) acc[e - e0] += double(probs[t * E + e]);
    }
    for (int64_t e = e0; e < e1; ++e) prob_sums[e] += acc[e - e0];
  });
  return rows;
}

double aux_loss_value(const double* counts, const double* prob_sums, int64_t E, int64_t rows) {
  LT_CHECK(E >= 1 && rows >= 1, "aux_loss_value: bad sizes E={}, rows={}", E, rows);
  const double R = double(rows);
  double s = 0;
  for (int64_t e = 0; e < E; ++e) s += (counts[e] / R) * (prob_sums[e] / R);
  return double(E) * s;
}

void aux_loss_dprobs(float* dprobs, const double* counts, double coef, int64_t E, int64_t rows) {
  LT_CHECK(E >= 1 && rows >= 1, "aux_loss_dprobs: bad sizes E={}, rows={}", E, rows);
  const double R = double(rows);
  for (int64_t e = 0; e < E; ++e) dprobs[e] = float(coef * double(E) * counts[e] / (R * R));
}

}  // namespace lt
