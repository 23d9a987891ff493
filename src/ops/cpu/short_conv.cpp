// ops/cpu/short_conv.cpp — Gated DeltaNet's causal depthwise conv1d + SiLU, forward and backward (the math and
// the document rule are in ops/short_conv.h).
//
// Legend: N = B·T tokens, T tokens per row, Cc channels, K kernel width, s = span(n) taps back.
//
// Layout: tokens outer, channels inner, so every inner loop runs over c with unit stride (the weight is
// transposed once to wT[K, Cc] for that). SiLU uses swiglu_math's sigmoid, the one the SwiGLU op and its CUDA
// kernel share. The backward works in fixed token chunks (from the problem size alone); each chunk recomputes
// pre for its tokens and the K-1 after them (their taps reach back into the chunk), so no chunk reads another's
// results. dw's per-chunk partials are double [n_chunks, K, Cc], summed in chunk order.
#include "ops/short_conv.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/swiglu_math.h"

namespace lt {
namespace {

constexpr int64_t kFwdTokenChunk = 16;  // tokens per forward task

void check_sizes(const char* op, int64_t N, int64_t T, int64_t Cc, int64_t K) {
  LT_CHECK(T > 0 && N >= 0 && N % T == 0, "{}: N = {} tokens must be whole rows of T = {}", op, N, T);
  LT_CHECK(Cc > 0 && K > 0, "{}: bad sizes channels={}, K={}", op, Cc, K);
}

// Taps back from token n that stay in its document: at most K-1, stopping at a row start or where doc_ids
// changes.
int64_t span(const int32_t* doc_ids, int64_t n, int64_t T, int64_t K) {
  const int64_t t = n % T;
  int64_t j = 0;
  while (j < K - 1 && j < t && (doc_ids == nullptr || doc_ids[n - j - 1] == doc_ids[n])) ++j;
  return j;
}

// wT[K, Cc] from weight[Cc, K].
std::vector<float> transpose_weight(const float* weight, int64_t Cc, int64_t K) {
  std::vector<float> wT(size_t(K * Cc));
  for (int64_t c = 0; c < Cc; ++c)
    for (int64_t k = 0; k < K; ++k) wT[size_t(k * Cc + c)] = weight[c * K + k];
  return wT;
}

// pre[Cc] of token n: oldest tap first, starting from an exact 0 + first product.
void conv_row(float* pre, const float* x, const float* wT, int64_t n, int64_t s, int64_t Cc, int64_t K) {
  std::fill(pre, pre + Cc, 0.0f);
  for (int64_t k = K - 1 - s; k < K; ++k) {
    const float* xm = x + (n - (K - 1 - k)) * Cc;  // [Cc] the token K-1-k back
    const float* wk = wT + k * Cc;                 // [Cc]
    for (int64_t c = 0; c < Cc; ++c) pre[c] += wk[c] * xm[c];
  }
}

}  // namespace

void short_conv_forward(float* out, const float* x, const float* weight, const int32_t* doc_ids, int64_t N,
                        int64_t T, int64_t Cc, int64_t K) {
  check_sizes("short_conv_forward", N, T, Cc, K);
  const std::vector<float> wT = transpose_weight(weight, Cc, K);  // [K, Cc]
  parallel_chunks(N, kFwdTokenChunk, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      float* y = out + n * Cc;  // [Cc]
      conv_row(y, x, wT.data(), n, span(doc_ids, n, T, K), Cc, K);
      for (int64_t c = 0; c < Cc; ++c) y[c] = y[c] * swiglu_math::sigmoid(y[c]);
    }
  });
}

void short_conv_backward(float* dx, float* dweight, const float* dout, const float* x, const float* weight,
                         const int32_t* doc_ids, int64_t N, int64_t T, int64_t Cc, int64_t K) {
  check_sizes("short_conv_backward", N, T, Cc, K);
  const std::vector<float> wT = transpose_weight(weight, Cc, K);  // [K, Cc]
  // At most 64 partial rows of dw; a task holds (chunk + K - 1) rows of dpre.
  const int64_t chunk = std::max<int64_t>(32, (N + 63) / 64);
  const int64_t n_chunks = (N + chunk - 1) / chunk;
  std::vector<double> partial(size_t(n_chunks * K * Cc), 0.0);  // [n_chunks, K, Cc]
  parallel_for(n_chunks, [&](int64_t task) {
    const int64_t n0 = task * chunk, n1 = std::min(N, n0 + chunk), n2 = std::min(N, n1 + K - 1);
    std::vector<float> dpre(size_t((n2 - n0) * Cc));  // [n2 - n0, Cc] tokens n0 .. n2-1
    std::vector<int64_t> spans(size_t(n2 - n0));
    for (int64_t n = n0; n < n2; ++n) {
      const int64_t s = spans[size_t(n - n0)] = span(doc_ids, n, T, K);
      float* d = dpre.data() + (n - n0) * Cc;
      conv_row(d, x, wT.data(), n, s, Cc, K);  // pre, as the forward rounds it
      const float* g = dout + n * Cc;
      for (int64_t c = 0; c < Cc; ++c) {
        float sg, one_minus_sg;
        swiglu_math::sigmoid_pair(d[c], &sg, &one_minus_sg);
        d[c] = g[c] * (sg * (1.0f + d[c] * one_minus_sg));
      }
    }
    // dx[m] gathers the taps of tokens m .. m+K-1 that reach back to m, nearest first.
    for (int64_t m = n0; m < n1; ++m) {
      float* dxm = dx + m * Cc;  // [Cc]
      std::fill(dxm, dxm + Cc, 0.0f);
      for (int64_t j = 0; j < K && m + j < n2; ++j) {
        if (spans[size_t(m + j - n0)] < j) continue;
        const float* d = dpre.data() + (m + j - n0) * Cc;
        const float* wk = wT.data() + (K - 1 - j) * Cc;
        for (int64_t c = 0; c < Cc; ++c) dxm[c] += d[c] * wk[c];
      }
    }
    double* p = partial.data() + task * K * Cc;  // [K, Cc]
    for (int64_t n = n0; n < n1; ++n) {
      const float* d = dpre.data() + (n - n0) * Cc;
      for (int64_t j = 0; j <= spans[size_t(n - n0)]; ++j) {
        const float* xm = x + (n - j) * Cc;
        double* pk = p + (K - 1 - j) * Cc;
        for (int64_t c = 0; c < Cc; ++c) pk[c] += double(d[c]) * double(xm[c]);
      }
    }
  });
  std::vector<double> total(size_t(K * Cc), 0.0);  // [K, Cc], chunk partials in chunk order
  for (int64_t t = 0; t < n_chunks; ++t)
    for (int64_t i = 0; i < K * Cc; ++i) total[size_t(i)] += partial[size_t(t * K * Cc + i)];
  for (int64_t c = 0; c < Cc; ++c)
    for (int64_t k = 0; k < K; ++k) dweight[c * K + k] += float(total[size_t(k * Cc + c)]);
}

}  // namespace lt
