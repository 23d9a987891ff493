// model/moe_ffn.cpp — the sparse MLP of one route slice, forward and backward (model/moe_ffn.h says why so).
#include "model/moe_ffn.h"

#include "core/error.h"
#include "model/block.h"
#include "ops/swiglu.h"

namespace lt {
namespace {

// Sub-buffers 64-byte aligned (16 floats), as the block's (model/block.cpp); ints take a float's 4 bytes, the
// int64 offsets two.
struct Carve {
  float* base;
  size_t used = 0;
  float* take(int64_t n) {
    float* p = base ? base + used : nullptr;
    used += (size_t(n) + 15) / 16 * 16;
    return p;
  }
  template <class T>
  T* take_as(int64_t n) {
    return reinterpret_cast<T*>(take(n * int64_t(sizeof(T) / sizeof(float))));
  }
};

MoeRouting carve_routing(Carve& c, const BlockShape& s) {
  const int64_t S = s.mlp_rows(), A = S * s.k;
  MoeRouting r{};
  r.logits = c.take(S * s.E);
  r.probs = c.take(S * s.E);
  r.weights = c.take(A);
  r.ids = c.take_as<int32_t>(A);
  r.order = c.take_as<int32_t>(A);
  r.row_of = c.take_as<int32_t>(A);
  r.offsets = c.take_as<int64_t>(s.E + 1);
  r.xp = c.take(A * s.C);
  r.yp = c.take(A * s.C);
  return r;
}

MoeScratch carve_scratch(Carve& c, const BlockShape& s) {
  const int64_t S = s.mlp_rows(), A = S * s.k;
  MoeScratch b{};
  b.dh = c.take(A * s.Ie);
  b.dgate = c.take(A * s.Ie);
  b.dup = c.take(A * s.Ie);
  b.dyp = c.take(A * s.C);
  b.dxp = c.take(A * s.C);
  b.dxp2 = c.take(A * s.C);
  b.dlogits = c.take(S * s.E);
  b.dweights = c.take(A);
  return b;
}

// Calls f(e, first grouped row, rows) for every expert with rows in this slice, in expert order.
template <class F>
void for_each_expert(const MoeRouting& r, const BlockShape& s, F&& f) {
  for (int64_t e = 0; e < s.E; ++e) {
    const int64_t first = r.offsets[e], rows = r.offsets[e + 1] - first;
    if (rows > 0) f(e, first, rows);
  }
}

}  // namespace

size_t MoeRouting::floats(const BlockShape& s) {
  Carve c{nullptr};
  carve_routing(c, s);
  return c.used;
}
MoeRouting MoeRouting::bind(float* buffer, const BlockShape& s) {
  Carve c{buffer};
  return carve_routing(c, s);
}
size_t MoeScratch::floats(const BlockShape& s) {
  Carve c{nullptr};
  carve_scratch(c, s);
  return c.used;
}
MoeScratch MoeScratch::bind(float* buffer, const BlockShape& s) {
  Carve c{buffer};
  return carve_scratch(c, s);
}

RouterShape router_shape(const BlockShape& s, int64_t n) {
  return RouterShape{n, s.E, s.k, RouterKind::softmax_topk, s.renorm_topk};
}

void moe_route(MoeRouting& r, const float* n2, const MoeView& w, const BlockShape& s, int64_t n) {
  LT_CHECK(n > 0 && n <= s.mlp_rows(), "moe_route: {} tokens in a route slice of {}", n, s.mlp_rows());
  LT_CHECK(int64_t(w.experts.size()) == s.E, "moe_route: {} experts bound, the layer has {}", w.experts.size(), s.E);
  linear_forward(r.logits, n2, w.router, nullptr, n, s.C, s.E);
  router_forward(r.ids, r.weights, r.probs, r.logits, router_shape(s, n));
  moe_permute(r.offsets, r.order, r.row_of, r.ids, n, s.k, s.E);
  moe_gather(r.xp, n2, r.order, n * s.k, s.k, s.C);
}

void moe_gate_up(float* gate, float* up, const MoeRouting& r, const MoeView& w, const BlockShape& s, int64_t n) {
  (void)n;
  for_each_expert(r, s, [&](int64_t e, int64_t first, int64_t rows) {
    const ExpertView& x = w.experts[size_t(e)];
    linear_forward(gate + first * s.Ie, r.xp + first * s.C, x.gate, nullptr, rows, s.C, s.Ie);
    linear_forward(up + first * s.Ie, r.xp + first * s.C, x.up, nullptr, rows, s.C, s.Ie);
  });
}

void moe_down_combine(float* y, MoeRouting& r, const float* h, const MoeView& w, const BlockShape& s, int64_t n) {
  for_each_expert(r, s, [&](int64_t e, int64_t first, int64_t rows) {
    linear_forward(r.yp + first * s.C, h + first * s.Ie, w.experts[size_t(e)].down, nullptr, rows, s.Ie, s.C);
  });
  moe_combine_forward(y, r.yp, r.weights, r.row_of, n, s.k, s.C);
}

void moe_backward(float* dn2, float* dn_router, MoeGrads& g, MoeScratch& b, const MoeRouting& r, const float* dout,
                  const float* n2, const float* gate, const float* up, const float* h, const MoeView& w,
                  const BlockShape& s, int64_t n, const float* dprobs_extra) {
  const int64_t A = n * s.k, C = s.C, Ie = s.Ie;
  // g = dout·W_down per grouped row (dyp holds each row's token's dout for now), then the routing weights'
  // gradient g·h and dh = w·g (moe_weight_grads); then dyp = w·dout for W_down's gradient.
  moe_gather(b.dyp, dout, r.order, A, s.k, C);
  for_each_expert(r, s, [&](int64_t e, int64_t first, int64_t rows) {
    linear_backward_input(b.dh + first * Ie, b.dyp + first * C, w.experts[size_t(e)].down, rows, Ie, C);
  });
  moe_weight_grads(b.dweights, b.dh, h, r.weights, r.order, r.ids, dout, nullptr, A, s.k, Ie, C);
  for (int64_t row = 0; row < A; ++row) {
    const float wt = r.weights[r.order[row]];
    float* d = b.dyp + row * C;
    for (int64_t c = 0; c < C; ++c) d[c] *= wt;
  }
  swiglu_backward(b.dgate, b.dup, b.dh, gate, up, A * Ie);
  for_each_expert(r, s, [&](int64_t e, int64_t first, int64_t rows) {
    const ExpertView& x = w.experts[size_t(e)];
    ExpertGrads& gx = g.experts[size_t(e)];
    linear_backward(nullptr, gx.down, nullptr, b.dyp + first * C, h + first * Ie, x.down, rows, Ie, C);
    linear_backward(b.dxp + first * C, gx.gate, nullptr, b.dgate + first * Ie, r.xp + first * C, x.gate, rows, C, Ie);
    linear_backward(b.dxp2 + first * C, gx.up, nullptr, b.dup + first * Ie, r.xp + first * C, x.up, rows, C, Ie);
  });
  for (int64_t i = 0; i < A * C; ++i) b.dxp[i] += b.dxp2[i];
  moe_scatter_add(dn2, b.dxp, r.row_of, n, s.k, C);
  // The router: its weights' gradient through top-k and softmax (plus the auxiliary loss's), then the linear.
  router_backward(b.dlogits, b.dweights, dprobs_extra, r.ids, r.weights, r.probs, router_shape(s, n));
  linear_backward(dn_router, g.router, nullptr, b.dlogits, n2, w.router, n, C, s.E);
}

}  // namespace lt
