// ops/cpu/delta_gates.cpp — Gated DeltaNet's beta and log-decay gates, forward and backward in f32; the math is
// in ops/delta_gates.h.
//
// Legend: N tokens, Hv value heads.
//
// Per element, in torch's order and roundings: x = a + dt_bias; sp = softplus(x) with expf/log1pf; −exp(A_log)
// once per head; g = (−exp(A_log)) · sp. The backward recomputes x, sp and e^x (nothing saved: two [N, Hv]
// buffers are cheap to recompute and the caller holds a and b anyway). dA_log is reduced as
// (−exp(A_log)) · Σ_n dg·sp in double, which is Σ_n dg·g without g's f32 rounding.
#include "ops/delta_gates.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/swiglu_math.h"

namespace lt {
namespace {

constexpr float kSoftplusThreshold = 20.0f;  // torch's default: softplus(x) = x above it
constexpr int64_t kFwdTokenChunk = 256;      // tokens per forward task

float softplus(float x) { return x > kSoftplusThreshold ? x : std::log1p(std::exp(x)); }

// −exp(A_log[h]) [Hv].
std::vector<float> neg_exp(const float* A_log, int64_t Hv) {
  std::vector<float> e(static_cast<size_t>(Hv));
  for (int64_t h = 0; h < Hv; ++h) e[size_t(h)] = -std::exp(A_log[h]);
  return e;
}

}  // namespace

void delta_gates_forward(float* beta, float* g, const float* b, const float* a, const float* A_log,
                         const float* dt_bias, int64_t N, int64_t Hv) {
  LT_CHECK(N >= 0 && Hv > 0, "delta_gates_forward: bad sizes N={}, Hv={}", N, Hv);
  const std::vector<float> na = neg_exp(A_log, Hv);  // [Hv]
  parallel_chunks(N, kFwdTokenChunk, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t h = 0; h < Hv; ++h) {
        const int64_t i = n * Hv + h;
        beta[i] = swiglu_math::sigmoid(b[i]);
        g[i] = na[size_t(h)] * softplus(a[i] + dt_bias[h]);
      }
  });
}

void delta_gates_backward(float* db, float* da, float* dA_log, float* ddt_bias, const float* dbeta, const float* dg,
                          const float* b, const float* a, const float* A_log, const float* dt_bias, int64_t N,
                          int64_t Hv) {
  LT_CHECK(N >= 0 && Hv > 0, "delta_gates_backward: bad sizes N={}, Hv={}", N, Hv);
  const std::vector<float> na = neg_exp(A_log, Hv);  // [Hv]
  // Fixed token chunks from the problem size alone: at most 64 partial rows.
  const int64_t chunk = std::max<int64_t>(256, (N + 63) / 64);
  const int64_t n_chunks = (N + chunk - 1) / chunk;
  std::vector<double> partial(size_t(n_chunks * 2 * Hv), 0.0);  // [n_chunks, 2, Hv]: Σ dg·sp, Σ da
  parallel_for(n_chunks, [&](int64_t task) {
    const int64_t n0 = task * chunk, n1 = std::min(N, n0 + chunk);
    double* p_dgsp = partial.data() + task * 2 * Hv;  // [Hv]
    double* p_da = p_dgsp + Hv;                       // [Hv]
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t h = 0; h < Hv; ++h) {
        const int64_t i = n * Hv + h;
        float s, one_minus_s;
        swiglu_math::sigmoid_pair(b[i], &s, &one_minus_s);
        const float dgi = dg[i];
        db[i] = dbeta[i] * (s * one_minus_s);
        const float x = a[i] + dt_bias[h];
        const float dsp = dgi * na[size_t(h)];
        float dai;
        if (x > kSoftplusThreshold) {
          dai = dsp;
        } else {
          const float z = std::exp(x);
          dai = (dsp * z) / (z + 1.0f);
        }
        da[i] = dai;
        p_dgsp[h] += double(dgi) * double(softplus(x));
        p_da[h] += double(dai);
      }
  });
  std::vector<double> total(size_t(2 * Hv), 0.0);  // chunk partials in chunk order
  for (int64_t t = 0; t < n_chunks; ++t)
    for (int64_t i = 0; i < 2 * Hv; ++i) total[size_t(i)] += partial[size_t(t * 2 * Hv + i)];
  for (int64_t h = 0; h < Hv; ++h) {
    dA_log[h] += float(double(na[size_t(h)]) * total[size_t(h)]);
    ddt_bias[h] += float(total[size_t(Hv + h)]);
  }
}

}  // namespace lt
