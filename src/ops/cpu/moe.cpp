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
//   * The router's per-token arithmetic is ops/moe_math.h, which the CUDA kernels compile too
//     (cuda/kernels/moe.cuh, the same bits); ops/override.h routes every op here to them (`--device cuda-sim`, the
//     op table's CUDA rows) after the argument checks.
#include "ops/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/moe_math.h"
#include "ops/override.h"

namespace lt {
namespace {

constexpr int64_t kTokenChunk = 64;        // tokens per router task
constexpr int64_t kElemsPerTask = 1 << 14;  // floats per row-copy task (gather, scatter, combine, weight grads)

int64_t rows_per_task(int64_t width) { return std::max<int64_t>(1, kElemsPerTask / std::max<int64_t>(width, 1)); }

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

}  // namespace

void router_forward(int32_t* ids, float* weights, float* probs, const float* logits, const RouterShape& s) {
  check_router("router_forward", s);
  const int64_t E = s.E, k = s.k;
  // Checked up front, in token order, so the error names the first bad token whatever the threads.
  for (int64_t i = 0; i < s.N * E; ++i)
    LT_CHECK(std::isfinite(logits[i]), "router_forward: token {} has a non-finite router logit ({}) for expert {}",
             i / E, logits[i], i % E);
  LT_OPS_OVERRIDE(router_forward, ids, weights, probs, logits, s);
  parallel_chunks(s.N, kTokenChunk, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      moe_math::route_token(ids + t * k, weights + t * k, probs + t * E, logits + t * E, E, k,
                            s.kind == RouterKind::topk_softmax, s.renormalize);
  });
}

void router_backward(float* dlogits, const float* dweights, const float* dprobs_extra, const uint8_t* counted,
                     const int32_t* ids, const float* weights, const float* probs, const RouterShape& s) {
  check_router("router_backward", s);
  check_ids("router_backward", ids, s.N * s.k, s.E);
  LT_OPS_OVERRIDE(router_backward, dlogits, dweights, dprobs_extra, counted, ids, weights, probs, s);
  const int64_t E = s.E, k = s.k;
  parallel_chunks(s.N, kTokenChunk, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const bool extra = dprobs_extra && (!counted || counted[t]);
      moe_math::route_token_backward(dlogits + t * E, dweights + t * k, extra ? dprobs_extra : nullptr, ids + t * k,
                                     weights + t * k, probs + t * E, E, k, s.kind == RouterKind::topk_softmax,
                                     s.renormalize);
    }
  });
}

void moe_permute(int64_t* offsets, int32_t* order, int32_t* row_of, const int32_t* ids, int64_t N, int64_t k,
                 int64_t E) {
  LT_CHECK(N >= 0 && k >= 1 && E >= 1, "moe_permute: bad sizes N={}, k={}, E={}", N, k, E);
  const int64_t A = N * k;
  LT_CHECK(A <= INT32_MAX, "moe_permute: {} assignments, at most 2^31 - 1 are supported", A);
  check_ids("moe_permute", ids, A, E);
  LT_OPS_OVERRIDE(moe_permute, offsets, order, row_of, ids, N, k, E);
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
  LT_OPS_OVERRIDE(moe_gather, xp, x, order, A, k, C);
  // xp[A, C] from x[N, C]
  parallel_chunks(A, rows_per_task(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) std::memcpy(xp + r * C, x + (order[r] / k) * C, size_t(C) * sizeof(float));
  });
}

void moe_scatter_add(float* dx, const float* dxp, const int32_t* row_of, int64_t N, int64_t k, int64_t C) {
  LT_CHECK(N >= 0 && k >= 1 && C >= 1, "moe_scatter_add: bad sizes N={}, k={}, C={}", N, k, C);
  LT_OPS_OVERRIDE(moe_scatter_add, dx, dxp, row_of, N, k, C);
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
  LT_OPS_OVERRIDE(moe_combine_forward, out, yp, weights, row_of, N, k, C);
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
  LT_OPS_OVERRIDE(moe_combine_backward, dyp, dweights, dout, yp, weights, row_of, N, k, C);
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
  LT_OPS_OVERRIDE(moe_weight_grads, dweights, g, h, weights, order, ids, dout, down_bias, A, k, I, C);
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
  LT_OPS_OVERRIDE(aux_loss_accumulate, counts, prob_sums, ids, probs, counted, N, E, k);
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
