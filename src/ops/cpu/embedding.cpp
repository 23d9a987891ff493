// ops/cpu/embedding.cpp — token embedding lookup and its scatter-add backward.
//
// Legend: N tokens, C hidden size, V vocabulary size.
//
// Backward order (the contract the tests check bit for bit): tokens are grouped by id with a stable counting
// sort, so each id's rows keep token order; for every id the rows are summed in double and added to dtable
// ONCE in f32. So an id seen once adds exactly dout's row, the sum over repeats does not drift with many
// repeats, and two calls on the same input add exactly twice one call. Work is split over fixed column
// blocks (each task owns columns [c0, c1) of every row), never over tokens, so no two tasks touch the same
// element and the bits do not depend on the thread count (nor on the block width).
// Measured on one core of the shared 2-core AMD EPYC dev box, N = 2048, C = 4096, V = 32000: forward
// 2.2 ms (30 GB/s), backward 6 ms (17 GB/s).
#include "ops/embedding.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/override.h"

namespace lt {
namespace {

constexpr int64_t kRowChunk = 64;   // rows per forward task
constexpr int64_t kColChunk = 128;  // columns per backward task

// Checks sizes and every id, in token order, so the error names the first bad position.
void check_ids(const char* op, const int32_t* ids, int64_t N, int64_t C, int64_t V) {
  LT_CHECK(N >= 0 && C > 0 && V > 0, "{}: bad sizes N={}, C={}, V={}", op, N, C, V);
  for (int64_t n = 0; n < N; ++n)
    LT_CHECK(ids[n] >= 0 && ids[n] < V, "{}: token id {} at position {} is outside the vocabulary [0, {})", op,
             ids[n], n, V);
}

}  // namespace

void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C, int64_t V) {
  LT_OPS_OVERRIDE(embedding_forward, out, ids, table, N, C, V);
  check_ids("embedding_forward", ids, N, C, V);
  // out[N, C] = table[V, C][ids[N]]
  parallel_chunks(N, kRowChunk, [&](int64_t r0, int64_t r1) {
    for (int64_t n = r0; n < r1; ++n) std::memcpy(out + n * C, table + int64_t(ids[n]) * C, size_t(C) * 4);
  });
}

TokenGroups group_tokens_by_id(const int32_t* ids, int64_t N, int64_t V) {
  check_ids("embedding_backward", ids, N, 1, V);
  LT_CHECK(N < (int64_t(1) << 31), "embedding_backward: {} tokens, at most 2^31 - 1 are supported", N);
  std::vector<int32_t> count(size_t(V) + 1, 0);  // count[v + 1]: tokens of id v, then prefix sums
  for (int64_t n = 0; n < N; ++n) ++count[size_t(ids[n]) + 1];
  TokenGroups g;
  g.start.push_back(0);
  for (int64_t v = 0; v < V; ++v)
    if (count[size_t(v) + 1] > 0) {
      g.present.push_back(int32_t(v));
      g.start.push_back(g.start.back() + count[size_t(v) + 1]);
    }
  for (int64_t v = 0; v < V; ++v) count[size_t(v) + 1] += count[size_t(v)];  // count[v]: id v's first slot
  g.order.resize(size_t(N));
  for (int64_t n = 0; n < N; ++n) g.order[size_t(count[size_t(ids[n])]++)] = int32_t(n);
  return g;
}

void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t N, int64_t C, int64_t V) {
  LT_OPS_OVERRIDE(embedding_backward, dtable, dout, ids, N, C, V);
  LT_CHECK(C > 0, "embedding_backward: bad size C={}", C);
  embedding_backward_range(dtable, dout, group_tokens_by_id(ids, N, V), C, 0, V * C);
}

void embedding_backward_range(float* dtable, const float* dout, const TokenGroups& groups, int64_t C, int64_t first,
                              int64_t last) {
  LT_CHECK(C > 0 && 0 <= first && first <= last, "embedding_backward_range: bad range [{}, {}) with C={}", first,
           last, C);
  // dtable[V, C] += Σ_{n: ids[n] = v} dout[n, :], elements [first, last) only
  parallel_chunks(C, kColChunk, [&](int64_t c0, int64_t c1) {
    double acc[kColChunk];
    for (size_t i = 0; i < groups.present.size(); ++i) {
      const int64_t row = int64_t(groups.present[i]) * C;
      const int64_t b = std::max(c0, first - row), e = std::min(c1, last - row);  // this row's columns in range
      if (b >= e) continue;
      const int64_t w = e - b;
      const int64_t k0 = groups.start[i], k1 = groups.start[i + 1];
      float* dst = dtable + row + b;
      if (k1 - k0 == 1) {  // the common case: float(double(x)) == x, so add the row directly
        const float* g = dout + int64_t(groups.order[size_t(k0)]) * C + b;
        for (int64_t j = 0; j < w; ++j) dst[j] += g[j];
        continue;
      }
      for (int64_t j = 0; j < w; ++j) acc[j] = 0.0;
      for (int64_t k = k0; k < k1; ++k) {
        const float* g = dout + int64_t(groups.order[size_t(k)]) * C + b;
        for (int64_t j = 0; j < w; ++j) acc[j] += double(g[j]);
      }
      for (int64_t j = 0; j < w; ++j) dst[j] += float(acc[j]);
    }
  });
}

}  // namespace lt
