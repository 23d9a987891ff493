// MoE ops (ops/moe.h): the router against a plain double reference for both kinds, its tie rule and bad input, its
// backward by finite differences; the permutation's invariants, gather / scatter_add, the combine and the weight
// gradients against plain references and finite differences; the auxiliary loss against a direct transcription of
// transformers' load_balancing_loss_func; the same bits with 1 and 2 threads.
//
// Legend: N tokens, C hidden, E experts, k experts per token, A = N·k assignments, I an expert's intermediate size,
// R = layers · N pooled router rows. u = 2^-24, the f32 unit roundoff.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "ops/moe.h"
#include "testing/error_testing.h"
#include "testing/grad_check.h"

namespace lt {
namespace {

using testing::grad_check;
using testing::random_vector;
using Vec = std::vector<float>;
using IVec = std::vector<int32_t>;
using DVec = std::vector<double>;

constexpr double kU = 0x1p-24;

std::string describe(const RouterShape& s) {
  return "N=" + std::to_string(s.N) + " E=" + std::to_string(s.E) + " k=" + std::to_string(s.k) +
         (s.kind == RouterKind::softmax_topk ? " softmax_topk" : " topk_softmax") + (s.renormalize ? " renorm" : "");
}

// Odd shapes (a partial top-k, many experts, k = E, k = 1), each for softmax_topk with and without renormalisation
// and for topk_softmax.
std::vector<RouterShape> router_shapes() {
  std::vector<RouterShape> r;
  for (auto [N, E, k] : {std::array<int64_t, 3>{7, 5, 2}, {33, 16, 8}, {6, 6, 6}, {9, 8, 1}}) {
    r.push_back({N, E, k, RouterKind::softmax_topk, false});
    r.push_back({N, E, k, RouterKind::softmax_topk, true});
    r.push_back({N, E, k, RouterKind::topk_softmax, false});
  }
  return r;
}

struct Routed {
  IVec ids;  // [N, k]
  Vec w, p;  // [N, k], [N, E]
};

Routed route(const Vec& logits, const RouterShape& s) {
  Routed r{IVec(size_t(s.N * s.k)), Vec(size_t(s.N * s.k)), Vec(size_t(s.N * s.E))};
  router_forward(r.ids.data(), r.w.data(), r.p.data(), logits.data(), s);
  return r;
}

// ---- the double reference ---------------------------------------------------------------------------------------

// p[E] = softmax(z[E]) in double.
DVec softmax_ref(const double* z, int64_t E) {
  const double m = *std::max_element(z, z + E);
  DVec p(static_cast<size_t>(E));
  double sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += p[size_t(e)] = std::exp(z[e] - m);
  for (auto& v : p) v /= sum;
  return p;
}

// The k best of score[E], best first, equal scores by the lower index (a stable sort, descending).
IVec topk_ref(const DVec& score, int64_t k) {
  IVec idx(score.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return score[size_t(a)] > score[size_t(b)]; });
  idx.resize(size_t(k));
  return idx;
}

// The routing weights of one token's selection `id[k]` (fixed) as RouterKind says.
DVec weights_ref(const double* z, const int32_t* id, const RouterShape& s) {
  DVec w(size_t(s.k));
  if (s.kind == RouterKind::topk_softmax) {
    DVec zs(size_t(s.k));
    for (int64_t j = 0; j < s.k; ++j) zs[size_t(j)] = z[id[j]];
    return softmax_ref(zs.data(), s.k);
  }
  const DVec p = softmax_ref(z, s.E);
  double sum = 0;
  for (int64_t j = 0; j < s.k; ++j) sum += w[size_t(j)] = p[size_t(id[j])];
  if (s.renormalize)
    for (auto& v : w) v /= sum;
  return w;
}

// Row t of the logits as doubles.
DVec row(const Vec& logits, int64_t t, int64_t E) { return DVec(logits.begin() + t * E, logits.begin() + (t + 1) * E); }

// The smallest gap between the k-th and (k+1)-th largest logit of any token (infinite when k = E): the selection
// cannot change while no logit moves by half of it (p is monotone in the logit, so this holds for both kinds).
double topk_margin(const Vec& logits, int64_t N, int64_t E, int64_t k) {
  double margin = INFINITY;
  for (int64_t t = 0; k < E && t < N; ++t) {
    DVec z = row(logits, t, E);
    std::sort(z.begin(), z.end(), std::greater<>());
    margin = std::min(margin, z[size_t(k - 1)] - z[size_t(k)]);
  }
  return margin;
}

// Seeded logits in [-3, 3) whose top-k margin is at least `margin` (another seed until it is).
Vec logits_with_margin(const RouterShape& s, uint64_t seed, double margin) {
  for (;; ++seed) {
    Vec z = random_vector(size_t(s.N * s.E), seed, -3.f, 3.f);
    if (topk_margin(z, s.N, s.E, s.k) >= margin) return z;
  }
}

// ---- the router -------------------------------------------------------------------------------------------------

TEST(MoeRouter, ForwardMatchesDoubleReference) {
  uint64_t seed = 100;
  for (const RouterShape& s : router_shapes()) {
    const Vec logits = random_vector(size_t(s.N * s.E), ++seed, -3.f, 3.f);
    const Routed r = route(logits, s);
    // p = e/S: the exp, the rounding of the double sum and the division each round once (3u); the reference is
    // exact to ~E·2^-53. w adds the f32 sum of k positive p (k−1 roundings) and one division: (k + 8)u with margin.
    const double tol_p = 4 * kU, tol_w = double(s.k + 8) * kU;
    for (int64_t t = 0; t < s.N; ++t) {
      const DVec z = row(logits, t, s.E), p = softmax_ref(z.data(), s.E);
      const IVec id = topk_ref(s.kind == RouterKind::softmax_topk ? p : z, s.k);
      const DVec w = weights_ref(z.data(), id.data(), s);
      for (int64_t e = 0; e < s.E; ++e)
        ASSERT_NEAR(r.p[size_t(t * s.E + e)], p[size_t(e)], tol_p * p[size_t(e)]) << describe(s) << " t=" << t;
      for (int64_t j = 0; j < s.k; ++j) {
        ASSERT_EQ(r.ids[size_t(t * s.k + j)], id[size_t(j)]) << describe(s) << " t=" << t << " j=" << j;
        ASSERT_NEAR(r.w[size_t(t * s.k + j)], w[size_t(j)], tol_w * w[size_t(j)]) << describe(s) << " t=" << t;
      }
    }
  }
}

TEST(MoeRouter, EqualScoresPickTheLowerExpertFirst) {
  struct Tie {
    Vec z;
    int64_t k;
    IVec want;
  };
  const Tie ties[] = {{{1, 3, 3, 0, 3}, 2, {1, 2}},          // three equal bests, two places
                      {{3, 1, 3, 3}, 2, {0, 2}},             // the tie straddles the cut
                      {{0.5f, 0.5f, 0.5f, 0.5f, 0.5f}, 3, {0, 1, 2}},  // all equal
                      {{-1, 2, -1, -1}, 3, {1, 0, 2}}};      // a best, then equal ones in index order
  for (const Tie& tie : ties)
    for (RouterKind kind : {RouterKind::softmax_topk, RouterKind::topk_softmax}) {
      const RouterShape s{1, int64_t(tie.z.size()), tie.k, kind};
      const Routed r = route(tie.z, s);
      EXPECT_EQ(r.ids, tie.want) << describe(s);
      for (int64_t j = 1; j < tie.k; ++j)  // equal logits, equal weights
        if (tie.z[size_t(r.ids[size_t(j)])] == tie.z[size_t(r.ids[0])]) {
          EXPECT_EQ(r.w[size_t(j)], r.w[0]) << describe(s);
        }
    }
}

TEST(MoeRouter, RejectsBadInput) {
  Vec z = random_vector(4 * 5, 7);
  z[3 * 5 + 2] = NAN;
  const RouterShape s{4, 5, 2};
  testing::expect_error([&] { route(z, s); }, {"token 3", "non-finite", "expert 2"});
  z[3 * 5 + 2] = INFINITY;
  testing::expect_error([&] { route(z, s); }, {"token 3", "non-finite"});
  z[3 * 5 + 2] = 0.25f;
  testing::expect_error([&] { route(z, {4, 5, 0}); }, {"k=0", "[1, E=5]"});
  testing::expect_error([&] { route(z, {4, 5, 6}); }, {"k=6", "[1, E=5]"});
  testing::expect_error([&] { route(z, {4, 5, 2, RouterKind::topk_softmax, true}); }, {"renormalize"});
}

// dlogits by central differences of L = Σ dw ⊙ w(z) + Σ_t extra · p_t(z), evaluated by the double reference with
// the op's selection held (the margin, 1e-3 > 2h, keeps the true selection equal to it under every probe).
TEST(MoeRouter, BackwardMatchesFiniteDifferences) {
  uint64_t seed = 200;
  for (const RouterShape& s : router_shapes())
    for (bool with_extra : {false, true}) {
      Vec logits = logits_with_margin(s, ++seed, 1e-3);
      const Routed r = route(logits, s);
      const Vec dw = random_vector(size_t(s.N * s.k), ++seed), extra = random_vector(size_t(s.E), ++seed);
      Vec dz(size_t(s.N * s.E), NAN);
      router_backward(dz.data(), dw.data(), with_extra ? extra.data() : nullptr, nullptr, r.ids.data(), r.w.data(),
                      r.p.data(), s);
      auto loss = [&] {
        double L = 0;
        for (int64_t t = 0; t < s.N; ++t) {
          const DVec z = row(logits, t, s.E);
          const DVec w = weights_ref(z.data(), &r.ids[size_t(t * s.k)], s);
          for (int64_t j = 0; j < s.k; ++j) L += double(dw[size_t(t * s.k + j)]) * w[size_t(j)];
          if (!with_extra) continue;
          const DVec p = softmax_ref(z.data(), s.E);
          for (int64_t e = 0; e < s.E; ++e) L += double(extra[size_t(e)]) * p[size_t(e)];
        }
        return L;
      };
      // Truncation h²·|L'''| ≈ 1e-8 and the double loss's rounding ≈ 1e-12 leave the f32 gradient's own rounding
      // (a few u of O(1) terms) as the error: measured ≤ 2e-6 relative above a 1e-2 floor; 2e-5 allows 10×.
      const auto res = grad_check(logits, dz, loss, seed, logits.size(), 2.5e-4f, 1e-2);
      EXPECT_GRAD_OK(res, 2e-5, describe(s) + (with_extra ? " with dprobs_extra" : ""));
    }
}

// ---- permutation, gather, scatter -------------------------------------------------------------------------------

struct Perm {
  std::vector<int64_t> offsets;  // [E + 1]
  IVec order, row_of;            // [A], [A]
};

Perm permute(const IVec& ids, int64_t N, int64_t k, int64_t E) {
  Perm p{std::vector<int64_t>(size_t(E + 1), -1), IVec(size_t(N * k), -1), IVec(size_t(N * k), -1)};
  moe_permute(p.offsets.data(), p.order.data(), p.row_of.data(), ids.data(), N, k, E);
  return p;
}

// Seeded expert ids in [0, below) — repeats within a token allowed, experts from `below` on left empty.
IVec random_ids(size_t n, uint64_t seed, int64_t below) {
  Rng rng(seed);
  IVec v(n);
  for (auto& x : v) x = int32_t(rng.below(uint64_t(below)));
  return v;
}

TEST(MoePermute, GroupsEveryAssignmentOnceStablyByExpert) {
  struct Problem {
    IVec ids;  // [N, k]
    int64_t N, k, E;
  };
  const Problem problems[] = {
      {route(random_vector(33 * 16, 300, -3.f, 3.f), {33, 16, 4}).ids, 33, 4, 16},  // a router's: distinct per token
      {random_ids(13 * 2, 301, 5), 13, 2, 9}};  // repeats within a token; experts 5..8 get no rows
  for (const auto& [ids, N, k, E] : problems) {
    const int64_t A = N * k;
    const Perm p = permute(ids, N, k, E);
    // The reference: assignments stably sorted by expert.
    IVec want(static_cast<size_t>(A));
    std::iota(want.begin(), want.end(), 0);
    std::stable_sort(want.begin(), want.end(), [&](int32_t a, int32_t b) { return ids[size_t(a)] < ids[size_t(b)]; });
    EXPECT_EQ(p.order, want);
    ASSERT_EQ(p.offsets[0], 0);
    ASSERT_EQ(p.offsets[size_t(E)], A);
    for (int64_t e = 0; e < E; ++e) {
      EXPECT_EQ(p.offsets[size_t(e + 1)] - p.offsets[size_t(e)], std::count(ids.begin(), ids.end(), int32_t(e)));
      for (int64_t r = p.offsets[size_t(e)]; r < p.offsets[size_t(e + 1)]; ++r) {
        EXPECT_EQ(ids[size_t(p.order[size_t(r)])], e) << "row " << r;
        if (r > p.offsets[size_t(e)]) {  // stable: token (assignment) order within an expert
          EXPECT_LT(p.order[size_t(r - 1)], p.order[size_t(r)]) << "row " << r;
        }
      }
    }
    for (int64_t r = 0; r < A; ++r) EXPECT_EQ(p.row_of[size_t(p.order[size_t(r)])], r);
  }
  testing::expect_error([&] { permute(IVec{0, 5}, 1, 2, 5); }, {"expert id 5", "assignment 1"});
}

TEST(MoePermute, GatherAndScatterAddMatchPlainLoops) {
  for (auto [N, E, k, C] : {std::array<int64_t, 4>{7, 5, 2, 3}, {33, 16, 8, 37}, {9, 8, 1, 5}}) {
    const int64_t A = N * k;
    const IVec ids = route(random_vector(size_t(N * E), 310 + C, -3.f, 3.f), {N, E, k}).ids;
    const Perm p = permute(ids, N, k, E);
    const Vec x = random_vector(size_t(N * C), 311), dxp = random_vector(size_t(A * C), 312);
    Vec xp(size_t(A * C), NAN), dx(size_t(N * C), NAN);
    moe_gather(xp.data(), x.data(), p.order.data(), A, k, C);
    moe_scatter_add(dx.data(), dxp.data(), p.row_of.data(), N, k, C);
    for (int64_t r = 0; r < A; ++r)
      ASSERT_EQ(0, std::memcmp(&xp[size_t(r * C)], &x[size_t(p.order[size_t(r)] / k * C)], size_t(C) * 4)) << r;
    // scatter_add performs the plain loop's f32 additions in j order: the same bits.
    for (int64_t t = 0; t < N; ++t)
      for (int64_t c = 0; c < C; ++c) {
        float s = 0;
        for (int64_t j = 0; j < k; ++j) s += dxp[size_t(p.row_of[size_t(t * k + j)] * C + c)];
        ASSERT_EQ(dx[size_t(t * C + c)], s) << "t=" << t << " c=" << c;
      }
    // Adjoints: <gather(x), dxp> = <x, scatter_add(dxp)>. dx's f32 sums of k terms round k−1 times (≤ (k−1)u of
    // their magnitudes); the doubles' own rounding is negligible: k·u of Σ|xp·dxp|.
    double magnitude = 0;
    for (size_t i = 0; i < xp.size(); ++i) magnitude += std::abs(double(xp[i]) * double(dxp[i]));
    EXPECT_NEAR(testing::dot(xp, dxp), testing::dot(x, dx), double(k) * kU * magnitude);
    if (k == 1) {  // with one choice the round trip is the identity
      Vec back(size_t(N * C));
      moe_scatter_add(back.data(), xp.data(), p.row_of.data(), N, k, C);
      EXPECT_TRUE(testing::bits_equal(back, x));
    }
  }
}

// ---- combine and weight gradients -------------------------------------------------------------------------------

TEST(MoeCombine, ForwardAndBackwardMatchPlainLoopsAndFiniteDifferences) {
  for (auto [N, E, k, C] : {std::array<int64_t, 4>{7, 5, 2, 3}, {33, 16, 8, 37}, {9, 8, 1, 5}}) {
    const int64_t A = N * k;
    const Routed r = route(random_vector(size_t(N * E), 400 + C, -3.f, 3.f), {N, E, k, RouterKind::softmax_topk, true});
    const Perm p = permute(r.ids, N, k, E);
    Vec yp = random_vector(size_t(A * C), 401), w = r.w;
    const Vec dout = random_vector(size_t(N * C), 402);
    Vec out(size_t(N * C), NAN), dyp(size_t(A * C), NAN), dw(size_t(A), NAN);
    moe_combine_forward(out.data(), yp.data(), w.data(), p.row_of.data(), N, k, C);
    moe_combine_backward(dyp.data(), dw.data(), dout.data(), yp.data(), w.data(), p.row_of.data(), N, k, C);
    // The plain loops: f32 products summed in j order (forward), one product (dyp), a double dot over C (dw).
    for (int64_t t = 0; t < N; ++t) {
      for (int64_t c = 0; c < C; ++c) {
        float s = 0;
        for (int64_t j = 0; j < k; ++j) s += w[size_t(t * k + j)] * yp[size_t(p.row_of[size_t(t * k + j)] * C + c)];
        ASSERT_EQ(out[size_t(t * C + c)], s);
      }
      for (int64_t j = 0; j < k; ++j) {
        const int64_t rr = p.row_of[size_t(t * k + j)];
        double d = 0;
        for (int64_t c = 0; c < C; ++c) {
          ASSERT_EQ(dyp[size_t(rr * C + c)], w[size_t(t * k + j)] * dout[size_t(t * C + c)]);
          d += double(dout[size_t(t * C + c)]) * double(yp[size_t(rr * C + c)]);
        }
        ASSERT_EQ(dw[size_t(t * k + j)], float(d));
      }
    }
    // L = <dout, out> is linear in yp and in w: the central difference errs only by the f32 rounding of the out
    // elements a probe moves (≤ C·u·|out|·|dout| / h ≈ 1e-4 absolute at C = 37), on gradients of O(0.01 .. 1):
    // measured ≤ 6e-5 relative above the 1e-2 floor.
    auto loss = [&] {
      moe_combine_forward(out.data(), yp.data(), w.data(), p.row_of.data(), N, k, C);
      return testing::dot(out, dout);
    };
    EXPECT_GRAD_OK(grad_check(yp, dyp, loss, 403), 1e-3, "dyp C=" + std::to_string(C));
    EXPECT_GRAD_OK(grad_check(w, dw, loss, 404), 1e-3, "dweights C=" + std::to_string(C));
  }
}

// dweights against the explicit yp = W_down(e)·h + b_e, dweights = dout · yp (all in double), with g = dout·W_down(e)
// rounded to f32 as the block would hand it over.
TEST(MoeWeightGrads, MatchTheExplicitFormula) {
  const int64_t N = 11, E = 5, k = 2, I = 13, C = 9, A = N * k;
  const Routed r = route(random_vector(size_t(N * E), 500, -3.f, 3.f), {N, E, k, RouterKind::softmax_topk, true});
  const Perm p = permute(r.ids, N, k, E);
  const Vec W = random_vector(size_t(E * C * I), 501), bias = random_vector(size_t(E * C), 502);  // [E, C, I], [E, C]
  const Vec h = random_vector(size_t(A * I), 503), dout = random_vector(size_t(N * C), 504);
  Vec g0(size_t(A * I));  // [A, I]
  for (int64_t rr = 0; rr < A; ++rr) {
    const int64_t a = p.order[size_t(rr)], t = a / k, e = r.ids[size_t(a)];
    for (int64_t i = 0; i < I; ++i) {
      double s = 0;
      for (int64_t c = 0; c < C; ++c) s += double(dout[size_t(t * C + c)]) * double(W[size_t((e * C + c) * I + i)]);
      g0[size_t(rr * I + i)] = float(s);
    }
  }
  for (bool with_bias : {false, true}) {
    Vec g = g0, dw(size_t(A), NAN);
    moe_weight_grads(dw.data(), g.data(), h.data(), r.w.data(), p.order.data(), r.ids.data(), dout.data(),
                     with_bias ? bias.data() : nullptr, A, k, I, C);
    for (int64_t rr = 0; rr < A; ++rr) {
      const int64_t a = p.order[size_t(rr)], t = a / k, e = r.ids[size_t(a)];
      double want = 0, scale = 0;  // dout · (W h + b) and Σ of the magnitudes it sums
      for (int64_t c = 0; c < C; ++c) {
        double y = with_bias ? double(bias[size_t(e * C + c)]) : 0.0;
        for (int64_t i = 0; i < I; ++i) y += double(W[size_t((e * C + c) * I + i)]) * double(h[size_t(rr * I + i)]);
        want += double(dout[size_t(t * C + c)]) * y;
      }
      for (int64_t i = 0; i < I; ++i) scale += std::abs(double(g0[size_t(rr * I + i)]) * double(h[size_t(rr * I + i)]));
      // g's f32 rounding moves each g_i·h_i by ≤ u of it, the result's by u: 2u of the magnitudes, with margin.
      EXPECT_NEAR(dw[size_t(a)], want, 2 * kU * (scale + std::abs(want))) << "row " << rr << " bias " << with_bias;
      for (int64_t i = 0; i < I; ++i)  // g becomes d h = weights · g: one f32 product
        ASSERT_EQ(g[size_t(rr * I + i)], g0[size_t(rr * I + i)] * r.w[size_t(a)]);
    }
  }
}

// ---- the auxiliary loss -----------------------------------------------------------------------------------------

// transformers' load_balancing_loss_func (no attention mask), in double: the layers' logits concatenated, P =
// softmax, the top-k of P one-hot, tokens_per_expert [k, E] = their mean over rows, router_prob_per_expert [E] = the
// mean of P, aux = E · Σ tokens_per_expert · router_prob_per_expert.
double load_balancing_loss_func(const std::vector<Vec>& layer_logits, int64_t N, int64_t E, int64_t k) {
  const double R = double(layer_logits.size()) * double(N);
  std::vector<DVec> tokens_per_expert(size_t(k), DVec(size_t(E), 0.0));
  DVec router_prob(size_t(E), 0.0);
  for (const Vec& logits : layer_logits)
    for (int64_t t = 0; t < N; ++t) {
      const DVec z = row(logits, t, E), P = softmax_ref(z.data(), E);
      const IVec sel = topk_ref(P, k);
      for (int64_t j = 0; j < k; ++j) tokens_per_expert[size_t(j)][size_t(sel[size_t(j)])] += 1.0 / R;
      for (int64_t e = 0; e < E; ++e) router_prob[size_t(e)] += P[size_t(e)] / R;
    }
  double s = 0;
  for (int64_t j = 0; j < k; ++j)
    for (int64_t e = 0; e < E; ++e) s += tokens_per_expert[size_t(j)][size_t(e)] * router_prob[size_t(e)];
  return double(E) * s;
}

TEST(MoeAuxLoss, MatchesLoadBalancingLossFuncOverPooledLayers) {
  const int64_t N = 33, E = 16;
  for (int64_t k : {2, 8})
    for (RouterKind kind : {RouterKind::softmax_topk, RouterKind::topk_softmax}) {
      const RouterShape s{N, E, k, kind};
      const std::vector<Vec> logits = {random_vector(size_t(N * E), 600 + k, -3.f, 3.f),
                                       random_vector(size_t(N * E), 700 + k, -3.f, 3.f)};
      DVec counts(size_t(E), 0.0), prob_sums(size_t(E), 0.0);
      std::vector<Routed> routed;
      for (const Vec& z : logits) {
        routed.push_back(route(z, s));
        aux_loss_accumulate(counts.data(), prob_sums.data(), routed.back().ids.data(), routed.back().p.data(), nullptr, N,
                            E, k);
      }
      const double aux = aux_loss_value(counts.data(), prob_sums.data(), E, 2 * N);
      // The op's P is f32 (≤ 3u each, the router test); the counts are exact: 4u of the value.
      EXPECT_NEAR(aux, load_balancing_loss_func(logits, N, E, k), 4 * kU * aux) << describe(s);

      // ∂(coef·aux)/∂p of one row with the selections fixed: aux is linear in p, so the central difference is exact
      // up to the double sums' rounding; dprobs is f32 (u ≈ 6e-8 relative): 1e-6.
      const double coef = 0.9;
      Vec dprobs(size_t(E), NAN);
      aux_loss_dprobs(dprobs.data(), counts.data(), coef, E, 2 * N);
      const int64_t t0 = 5;
      Vec prow(routed[0].p.begin() + t0 * E, routed[0].p.begin() + (t0 + 1) * E);
      auto loss = [&] {
        Vec p0 = routed[0].p;
        std::copy(prow.begin(), prow.end(), p0.begin() + t0 * E);
        DVec c(size_t(E), 0.0), ps(size_t(E), 0.0);
        aux_loss_accumulate(c.data(), ps.data(), routed[0].ids.data(), p0.data(), nullptr, N, E, k);
        aux_loss_accumulate(c.data(), ps.data(), routed[1].ids.data(), routed[1].p.data(), nullptr, N, E, k);
        return coef * aux_loss_value(c.data(), ps.data(), E, 2 * N);
      };
      EXPECT_GRAD_OK(grad_check(prow, dprobs, loss, 601, size_t(E)), 1e-6, describe(s));
    }
}

// With an attention mask, transformers' masked means are the unmasked ones over the counted tokens alone: the op
// with a mask gives the bits of the op on those tokens' rows gathered; the router's backward adds the extra to the
// counted tokens only (each token's row is the unmasked op's, with or without the extra, bit for bit).
TEST(MoeAuxLoss, AttentionMaskCountsOnlyItsTokens) {
  const int64_t N = 29, E = 12, k = 3;
  const RouterShape s{N, E, k, RouterKind::softmax_topk, true};
  const Routed r = route(random_vector(size_t(N * E), 650, -3.f, 3.f), s);
  std::vector<uint8_t> counted(static_cast<size_t>(N));
  for (int64_t t = 0; t < N; ++t) counted[size_t(t)] = (t * 7) % 5 != 2;  // padding scattered, first token counted
  IVec ids;
  Vec probs;
  for (int64_t t = 0; t < N; ++t) {
    if (!counted[size_t(t)]) continue;
    ids.insert(ids.end(), r.ids.begin() + t * k, r.ids.begin() + (t + 1) * k);
    probs.insert(probs.end(), r.p.begin() + t * E, r.p.begin() + (t + 1) * E);
  }
  const int64_t M = int64_t(ids.size()) / k;
  ASSERT_LT(M, N);
  DVec c1(size_t(E), 0.0), p1(size_t(E), 0.0), c2(size_t(E), 0.0), p2(size_t(E), 0.0);
  EXPECT_EQ(aux_loss_accumulate(c1.data(), p1.data(), r.ids.data(), r.p.data(), counted.data(), N, E, k), M);
  EXPECT_EQ(aux_loss_accumulate(c2.data(), p2.data(), ids.data(), probs.data(), nullptr, M, E, k), M);
  for (int64_t e = 0; e < E; ++e) {
    EXPECT_EQ(c1[size_t(e)], c2[size_t(e)]) << "expert " << e;
    EXPECT_EQ(p1[size_t(e)], p2[size_t(e)]) << "expert " << e;
  }

  const Vec dw = random_vector(size_t(N * k), 651), extra = random_vector(size_t(E), 652);
  Vec masked(size_t(N * E)), with(size_t(N * E)), without(size_t(N * E));
  router_backward(masked.data(), dw.data(), extra.data(), counted.data(), r.ids.data(), r.w.data(), r.p.data(), s);
  router_backward(with.data(), dw.data(), extra.data(), nullptr, r.ids.data(), r.w.data(), r.p.data(), s);
  router_backward(without.data(), dw.data(), nullptr, nullptr, r.ids.data(), r.w.data(), r.p.data(), s);
  for (int64_t t = 0; t < N; ++t)
    for (int64_t e = 0; e < E; ++e) {
      const size_t i = size_t(t * E + e);
      EXPECT_EQ(masked[i], counted[size_t(t)] ? with[i] : without[i]) << "token " << t << " expert " << e;
    }
}

// ---- determinism ------------------------------------------------------------------------------------------------

// Every op of the file on one problem spanning several tasks, its outputs (ids as exact floats) in one vector.
Vec run_everything(int64_t N, int64_t E, int64_t k, int64_t C, int64_t I) {
  const int64_t A = N * k;
  const RouterShape s{N, E, k, RouterKind::softmax_topk, true};
  const Routed r = route(random_vector(size_t(N * E), 800, -3.f, 3.f), s);
  const Vec dwin = random_vector(size_t(A), 801), extra = random_vector(size_t(E), 802);
  Vec dz(size_t(N * E));
  router_backward(dz.data(), dwin.data(), extra.data(), nullptr, r.ids.data(), r.w.data(), r.p.data(), s);
  const Perm p = permute(r.ids, N, k, E);
  const Vec x = random_vector(size_t(N * C), 803), yp = random_vector(size_t(A * C), 804);
  const Vec h = random_vector(size_t(A * I), 805), bias = random_vector(size_t(E * C), 806);
  Vec xp(size_t(A * C)), dx(size_t(N * C)), out(size_t(N * C)), dyp(size_t(A * C));
  Vec dw(static_cast<size_t>(A)), dw2(static_cast<size_t>(A));
  Vec g = random_vector(size_t(A * I), 807);
  moe_gather(xp.data(), x.data(), p.order.data(), A, k, C);
  moe_scatter_add(dx.data(), yp.data(), p.row_of.data(), N, k, C);
  moe_combine_forward(out.data(), yp.data(), r.w.data(), p.row_of.data(), N, k, C);
  moe_combine_backward(dyp.data(), dw.data(), x.data(), yp.data(), r.w.data(), p.row_of.data(), N, k, C);
  moe_weight_grads(dw2.data(), g.data(), h.data(), r.w.data(), p.order.data(), r.ids.data(), x.data(), bias.data(), A,
                   k, I, C);
  DVec counts(size_t(E), 0.0), prob_sums(size_t(E), 0.0);
  aux_loss_accumulate(counts.data(), prob_sums.data(), r.ids.data(), r.p.data(), nullptr, N, E, k);
  Vec all;
  for (const Vec* v : std::initializer_list<const Vec*>{&r.w, &r.p, &dz, &xp, &dx, &out, &dyp, &dw, &dw2, &g})
    all.insert(all.end(), v->begin(), v->end());
  for (int32_t id : r.ids) all.push_back(float(id));
  for (int32_t o : p.order) all.push_back(float(o));
  for (double v : prob_sums) all.push_back(float(v)), all.push_back(float(v - double(float(v))));
  return all;
}

TEST(MoeOps, SameBitsWithOneAndTwoThreads) {
  const int saved = num_threads();
  set_num_threads(1);
  const Vec one = run_everything(300, 40, 4, 37, 19);  // 5 router tasks, 3 expert blocks, many row tasks
  set_num_threads(2);
  const Vec two = run_everything(300, 40, 4, 37, 19);
  set_num_threads(saved);
  EXPECT_TRUE(testing::bits_equal(one, two));
}

}  // namespace
}  // namespace lt
