// model/moe_ffn.cpp — the sparse MLP of one route slice, forward and backward (model/moe_ffn.h says why so).
#include "model/moe_ffn.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "model/block.h"
#include "model/carver.h"
#include "ops/swiglu.h"

namespace lt {
namespace {

MoeRouting carve_routing(Carver& c, const BlockShape& s) {
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
  if (s.Is > 0) {
    r.shared_gate = c.take(S);
    r.identity = c.take_as<int32_t>(S);
  }
  return r;
}

MoeScratch carve_scratch(Carver& c, const BlockShape& s) {
  const int64_t S = s.mlp_rows(), A = S * s.k, width = S * s.mlp_width();  // the grouped rows', then the shared's
  MoeScratch b{};
  b.dh = c.take(width);
  b.dgate = c.take(width);
  b.dup = c.take(width);
  b.dyp = c.take(A * s.C);
  b.dxp = c.take(A * s.C);
  b.dxp2 = c.take(A * s.C);
  b.dlogits = c.take(S * s.E);
  b.dweights = c.take(A);
  if (s.Is > 0) b.dshared = c.take(S);
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

float sigmoid(float x) { return float(1.0 / (1.0 + std::exp(-double(x)))); }

// The shared expert (qwen3_5_moe) of one slice's n tokens: its gate [n] = σ(n2 · w_sg), into r.shared_gate.
void shared_gate_forward(const MoeRouting& r, const float* n2, const MoeView& w, const BlockShape& s, int64_t n) {
  adapted_forward(r.shared_gate, n2, w.shared_gate, nullptr, w.shared_gate_lora, s.lora,
                  moe_lora_site(r, s, Adapted::shared_expert_gate), n, s.C, 1);
  for (int64_t t = 0; t < n; ++t) r.shared_gate[t] = sigmoid(r.shared_gate[t]);
}

// With LoRA on a down projection the expert's output is h·W_downᵀ + L(h), so the gradient of the weight that scales
// it reads dout·L(h) beside moe_weight_grads' (dout·W_down)·h: dweights[at(row)] += dout_rows[row]·lora_out[row]
// over C (one double sum in order, as moe_weight_grads'), at(row) = order[row] (null order: row).
void add_adapter_dots(float* dweights, const float* dout_rows, const float* lora_out, const int32_t* order,
                      int64_t rows, int64_t C) {
  for (int64_t row = 0; row < rows; ++row) {
    double dot = 0;
    for (int64_t c = 0; c < C; ++c) dot += double(dout_rows[row * C + c]) * double(lora_out[row * C + c]);
    dweights[order ? order[row] : row] += float(dot);
  }
}

// The shared expert's backward, after the routed experts' (their rows of dh and d h done, dyp free): d its h into
// b.dh's shared rows, its down projection's and gate's weight gradients; the gate's logit gradient into b.dshared.
void shared_down_backward(MoeGrads& g, MoeScratch& b, const MoeRouting& r, const float* dout, const float* hs,
                          const MoeView& w, const BlockShape& s, int64_t n) {
  const int64_t C = s.C, Is = s.Is;
  float* gs = b.dh + n * s.k * s.Ie;
  for (int64_t t = 0; t < n; ++t) r.identity[t] = int32_t(t);
  // gs = dout·W_down_s; d σ = gs·hs (moe_weight_grads with one "assignment" per token, weight σ), gs ← σ·gs = d hs.
  linear_backward_input(gs, dout, w.shared.down, n, Is, C);
  moe_weight_grads(b.dshared, gs, hs, r.shared_gate, r.identity, r.identity, dout, nullptr, n, 1, Is, C);
  const LoraSite down_site = moe_lora_site(r, s, Adapted::shared_down_proj);
  if (w.shared.down_lora.present()) {  // d σ += dout·L_s(hs), L_s in dyp for a moment
    std::fill_n(b.dyp, n * C, 0.0f);
    lora_forward(b.dyp, hs, w.shared.down_lora, s.lora, down_site, n, Is, C);
    add_adapter_dots(b.dshared, dout, b.dyp, nullptr, n, C);
  }
  for (int64_t t = 0; t < n; ++t) {
    const float sg = r.shared_gate[t];
    b.dshared[t] *= sg * (1.0f - sg);  // through σ to the logit
    const float* d = dout + t * C;
    float* o = b.dyp + t * C;
    for (int64_t c = 0; c < C; ++c) o[c] = sg * d[c];
  }
  linear_backward(nullptr, g.shared.down, nullptr, b.dyp, hs, w.shared.down, n, Is, C);
  // The adapter's part: d hs += its input gradient (gs is σ·dout·W_down_s already), its gradients from σ·dout.
  lora_backward(gs, g.shared.down_lora, b.dyp, hs, w.shared.down_lora, s.lora, down_site, n, Is, C);
}

}  // namespace

size_t MoeRouting::floats(const BlockShape& s) {
  Carver c{nullptr};
  carve_routing(c, s);
  return c.used;
}
MoeRouting MoeRouting::bind(float* buffer, const BlockShape& s) {
  Carver c{buffer};
  return carve_routing(c, s);
}
size_t MoeScratch::floats(const BlockShape& s) {
  Carver c{nullptr};
  carve_scratch(c, s);
  return c.used;
}
MoeScratch MoeScratch::bind(float* buffer, const BlockShape& s) {
  Carver c{buffer};
  return carve_scratch(c, s);
}

RouterShape router_shape(const BlockShape& s, int64_t n) {
  return RouterShape{n, s.E, s.k, s.topk_softmax ? RouterKind::topk_softmax : RouterKind::softmax_topk, s.renorm_topk};
}

LoraSite moe_lora_site(const MoeRouting& r, const BlockShape& s, Adapted a, int64_t expert, int64_t first) {
  if (s.lora.dropout == 0) return LoraSite{0, r.t0};  // no mask to draw
  const uint64_t key = lora_site_key(r.dropout_key, s.layer, a);
  if (expert < 0) return LoraSite{key, r.t0};
  return LoraSite{lora_expert_key(key, expert), r.t0, r.order + first, s.k};
}

void moe_route(MoeRouting& r, const float* n2, const MoeView& w, const BlockShape& s, int64_t n, int64_t t0,
               uint64_t dropout_key) {
  LT_CHECK(n > 0 && n <= s.mlp_rows(), "moe_route: {} tokens in a route slice of {}", n, s.mlp_rows());
  LT_CHECK(int64_t(w.experts.size()) == s.E, "moe_route: {} experts bound, the layer has {}", w.experts.size(), s.E);
  r.t0 = t0, r.dropout_key = dropout_key;
  adapted_forward(r.logits, n2, w.router, w.router_bias, w.router_lora, s.lora, moe_lora_site(r, s, Adapted::router), n,
                  s.C, s.E);
  router_forward(r.ids, r.weights, r.probs, r.logits, router_shape(s, n));
  moe_permute(r.offsets, r.order, r.row_of, r.ids, n, s.k, s.E);
  moe_gather(r.xp, n2, r.order, n * s.k, s.k, s.C);
}

void moe_gate_up(float* gate, float* up, const MoeRouting& r, const float* n2, const MoeView& w, const BlockShape& s,
                 int64_t n) {
  for_each_expert(r, s, [&](int64_t e, int64_t first, int64_t rows) {
    const ExpertView& x = w.experts[size_t(e)];
    const float* xp = r.xp + first * s.C;
    adapted_forward(gate + first * s.Ie, xp, x.gate, x.gate_bias, x.gate_lora, s.lora,
                    moe_lora_site(r, s, Adapted::gate_proj, e, first), rows, s.C, s.Ie);
    adapted_forward(up + first * s.Ie, xp, x.up, x.up_bias, x.up_lora, s.lora,
                    moe_lora_site(r, s, Adapted::up_proj, e, first), rows, s.C, s.Ie);
  });
  if (s.Is == 0) return;
  const int64_t shared = n * s.k * s.Ie;  // the shared expert's rows follow the grouped ones
  adapted_forward(gate + shared, n2, w.shared.gate, nullptr, w.shared.gate_lora, s.lora,
                  moe_lora_site(r, s, Adapted::shared_gate_proj), n, s.C, s.Is);
  adapted_forward(up + shared, n2, w.shared.up, nullptr, w.shared.up_lora, s.lora,
                  moe_lora_site(r, s, Adapted::shared_up_proj), n, s.C, s.Is);
}

void moe_down_combine(float* y, MoeRouting& r, const float* h, const float* n2, const MoeView& w, const BlockShape& s,
                      int64_t n) {
  for_each_expert(r, s, [&](int64_t e, int64_t first, int64_t rows) {
    const ExpertView& x = w.experts[size_t(e)];
    adapted_forward(r.yp + first * s.C, h + first * s.Ie, x.down, x.down_bias, x.down_lora, s.lora,
                    moe_lora_site(r, s, Adapted::down_proj, e, first), rows, s.Ie, s.C);
  });
  moe_combine_forward(y, r.yp, r.weights, r.row_of, n, s.k, s.C);
  if (s.Is == 0) return;
  // The shared expert's output into yp's first n rows (free after the combine), times its gate, added.
  adapted_forward(r.yp, h + n * s.k * s.Ie, w.shared.down, nullptr, w.shared.down_lora, s.lora,
                  moe_lora_site(r, s, Adapted::shared_down_proj), n, s.Is, s.C);
  shared_gate_forward(r, n2, w, s, n);
  for (int64_t t = 0; t < n; ++t) {
    const float sg = r.shared_gate[t];
    const float* ys = r.yp + t * s.C;
    float* o = y + t * s.C;
    for (int64_t c = 0; c < s.C; ++c) o[c] += sg * ys[c];
  }
}

MoeAuxLoss::MoeAuxLoss(int64_t E, const uint8_t* counted, double weight)
    : counted_(counted), weight_(weight), counts_(size_t(E), 0.0), prob_sums_(size_t(E), 0.0), dprobs_(size_t(E), 0.0f) {
  LT_CHECK(E >= 1 && std::isfinite(weight) && weight >= 0,
           "the auxiliary loss needs experts and a finite weight >= 0 (E={}, weight={})", E, weight);
}

void MoeAuxLoss::add(const MoeRouting& r, const BlockShape& s, int64_t t0, int64_t n) {
  rows_ += aux_loss_accumulate(counts_.data(), prob_sums_.data(), r.ids, r.probs, counted(t0), n, s.E, s.k);
}

void MoeAuxLoss::add_partials(const double* counts, const double* prob_sums, int64_t t0, int64_t n) {
  for (size_t e = 0; e < counts_.size(); ++e) counts_[e] += counts[e], prob_sums_[e] += prob_sums[e];
  const uint8_t* mask = counted(t0);
  int64_t rows = n;
  if (mask) rows = std::count_if(mask, mask + n, [](uint8_t m) { return m != 0; });
  rows_ += rows;
}

double MoeAuxLoss::finish() {
  const int64_t E = int64_t(counts_.size());
  if (rows_ == 0) return value_ = 0;  // every token padding: no term, no gradient (dprobs stay 0)
  value_ = aux_loss_value(counts_.data(), prob_sums_.data(), E, rows_);
  aux_loss_dprobs(dprobs_.data(), counts_.data(), weight_, E, rows_);
  return value_;
}

void moe_backward(float* dn2, float* dn_router, MoeGrads& g, MoeScratch& b, const MoeRouting& r, const float* dout,
                  const float* n2, const float* gate, const float* up, const float* h, const MoeView& w,
                  const BlockShape& s, int64_t n, const MoeAuxLoss* aux) {
  const int64_t A = n * s.k, C = s.C, Ie = s.Ie, shared = A * Ie;  // the shared expert's rows start at `shared`
  // A frozen MLP (model/finetune.h) binds no expert gradients: every weight GEMM is skipped (null dW).
  ExpertGrads frozen{};
  auto grads_of = [&](int64_t e) -> ExpertGrads& { return g.experts.empty() ? frozen : g.experts[size_t(e)]; };
  // g = dout·W_down per grouped row (dyp holds each row's token's dout for now), then the routing weights'
  // gradient g·h and dh = w·g (moe_weight_grads); then dyp = w·dout for W_down's gradient.
  moe_gather(b.dyp, dout, r.order, A, s.k, C);
  for_each_expert(r, s, [&](int64_t e, int64_t first, int64_t rows) {
    linear_backward_input(b.dh + first * Ie, b.dyp + first * C, w.experts[size_t(e)].down, rows, Ie, C);
  });
  // gpt_oss: the combine multiplies down(h) + b_down, so the weights' gradient adds dout·b_down ([E, C] gathered).
  std::vector<float> down_bias;
  if (w.experts.front().down_bias) {
    down_bias.resize(size_t(s.E * C));
    for (int64_t e = 0; e < s.E; ++e)
      std::copy_n(w.experts[size_t(e)].down_bias, C, down_bias.begin() + std::ptrdiff_t(e * C));
  }
  // LoRA on the experts' down projections: their adapters' outputs L(h) [A, C] into dxp (free until the input
  // gradients) for the weights' gradient (add_adapter_dots).
  const bool down_adapted = w.experts.front().down_lora.present();
  if (down_adapted) {
    std::fill_n(b.dxp, A * C, 0.0f);
    for_each_expert(r, s, [&](int64_t e, int64_t first, int64_t rows) {
      lora_forward(b.dxp + first * C, h + first * Ie, w.experts[size_t(e)].down_lora, s.lora,
                   moe_lora_site(r, s, Adapted::down_proj, e, first), rows, Ie, C);
    });
  }
  moe_weight_grads(b.dweights, b.dh, h, r.weights, r.order, r.ids, dout, down_bias.empty() ? nullptr : down_bias.data(),
                   A, s.k, Ie, C);
  if (down_adapted) add_adapter_dots(b.dweights, b.dyp, b.dxp, r.order, A, C);
  for (int64_t row = 0; row < A; ++row) {
    const float wt = r.weights[r.order[row]];
    float* d = b.dyp + row * C;
    for (int64_t c = 0; c < C; ++c) d[c] *= wt;
  }
  for_each_expert(r, s, [&](int64_t e, int64_t first, int64_t rows) {
    const ExpertView& x = w.experts[size_t(e)];
    linear_backward(nullptr, grads_of(e).down, grads_of(e).down_bias, b.dyp + first * C, h + first * Ie, x.down, rows,
                    Ie, C);
    // dh (w·g already) += the adapter's input gradient; its gradients from w·dout.
    lora_backward(b.dh + first * Ie, grads_of(e).down_lora, b.dyp + first * C, h + first * Ie, x.down_lora, s.lora,
                  moe_lora_site(r, s, Adapted::down_proj, e, first), rows, Ie, C);
  });
  if (s.Is > 0) {
    shared_gate_forward(r, n2, w, s, n);  // σ again from n2: the forward's bits
    shared_down_backward(g, b, r, dout, h + shared, w, s, n);
  }
  if (s.swiglu_limit > 0) {
    clamped_swiglu_backward(b.dgate, b.dup, b.dh, gate, up, n * s.mlp_width(), kClampedSwigluAlpha, s.swiglu_limit);
  } else {
    swiglu_backward(b.dgate, b.dup, b.dh, gate, up, n * s.mlp_width());
  }
  for_each_expert(r, s, [&](int64_t e, int64_t first, int64_t rows) {
    const ExpertView& x = w.experts[size_t(e)];
    ExpertGrads& gx = grads_of(e);
    adapted_backward(b.dxp + first * C, gx.gate, gx.gate_bias, gx.gate_lora, b.dgate + first * Ie, r.xp + first * C,
                     x.gate, x.gate_lora, s.lora, moe_lora_site(r, s, Adapted::gate_proj, e, first), rows, C, Ie);
    adapted_backward(b.dxp2 + first * C, gx.up, gx.up_bias, gx.up_lora, b.dup + first * Ie, r.xp + first * C, x.up,
                     x.up_lora, s.lora, moe_lora_site(r, s, Adapted::up_proj, e, first), rows, C, Ie);
  });
  for (int64_t i = 0; i < A * C; ++i) b.dxp[i] += b.dxp2[i];
  moe_scatter_add(dn2, b.dxp, r.row_of, n, s.k, C);
  if (s.Is > 0) {
    // The shared expert's input gradients (gate, up, then its gate's logit) into dxp's first n rows, added to dn2.
    adapted_backward(b.dxp, g.shared.gate, nullptr, g.shared.gate_lora, b.dgate + shared, n2, w.shared.gate,
                     w.shared.gate_lora, s.lora, moe_lora_site(r, s, Adapted::shared_gate_proj), n, C, s.Is);
    adapted_backward(b.dxp2, g.shared.up, nullptr, g.shared.up_lora, b.dup + shared, n2, w.shared.up,
                     w.shared.up_lora, s.lora, moe_lora_site(r, s, Adapted::shared_up_proj), n, C, s.Is);
    for (int64_t i = 0; i < n * C; ++i) b.dxp[i] += b.dxp2[i];
    adapted_backward(b.dxp2, g.shared_gate, nullptr, g.shared_gate_lora, b.dshared, n2, w.shared_gate,
                     w.shared_gate_lora, s.lora, moe_lora_site(r, s, Adapted::shared_expert_gate), n, C, 1);
    for (int64_t i = 0; i < n * C; ++i) dn2[i] += b.dxp[i] + b.dxp2[i];
  }
  // The router: its weights' gradient through top-k and softmax (plus the auxiliary loss's), then the linear.
  router_backward(b.dlogits, b.dweights, aux ? aux->dprobs() : nullptr, aux ? aux->counted(r.t0) : nullptr, r.ids,
                  r.weights, r.probs, router_shape(s, n));
  adapted_backward(dn_router, g.router, g.router_bias, g.router_lora, b.dlogits, n2, w.router, w.router_lora, s.lora,
                   moe_lora_site(r, s, Adapted::router), n, C, s.E);
}

}  // namespace lt
