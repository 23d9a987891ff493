// LM head (ops/head.h): loss and gradients against a double-precision reference, with per-element error
// bounds derived from f32 / bf16 rounding; finite differences; invariance across chunk sizes, thread counts
// and vector paths; the gradient contract; bf16 mode; forward == forward_backward; bad targets.
//
// Legend: N tokens, C hidden size, V vocabulary size.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "ops/head.h"
#include "testing/grad_check.h"

namespace lt {
namespace {

constexpr double kU = 0x1p-24;  // unit roundoff of f32

struct Problem {
  HeadShape s;
  uint64_t seed;
  std::vector<float> x;          // [N, C]
  std::vector<int32_t> targets;  // [N]
  std::vector<float> norm_w;     // [C]
  std::vector<float> lm_w;       // [V, C] f32
  std::vector<bf16_t> lm_w_b;    // [V, C] its bf16 rounding
  float grad_scale;              // 1 / number of counted tokens, as the model uses it

  WeightRef weight(DType dt) const {
    return dt == DType::bf16 ? WeightRef{lm_w_b.data(), DType::bf16} : WeightRef{lm_w.data(), DType::f32};
  }
};

// Random data, never zero; targets random with every fifth token and all of tokens 8..15 ignored, so
// chunk_tokens = 8 has a chunk with nothing to count.
Problem make_problem(int64_t N, int64_t C, int64_t V, int64_t chunk, uint64_t seed) {
  Problem p;
  p.s = HeadShape{N, C, V, 1e-5f, chunk};
  p.seed = seed;
  p.x = testing::random_vector(size_t(N * C), seed, -2.f, 2.f);
  p.norm_w = testing::random_vector(size_t(C), seed + 1, 0.5f, 1.5f);
  p.lm_w = testing::random_vector(size_t(V * C), seed + 2, -1.f, 1.f);
  p.lm_w_b.resize(p.lm_w.size());
  convert_f32_to_bf16(p.lm_w_b.data(), p.lm_w.data(), p.lm_w.size());
  Rng rng(seed + 3);
  int64_t counted = 0;
  for (int64_t n = 0; n < N; ++n) {
    int32_t t = int32_t(rng.below(uint64_t(V)));
    if (n % 5 == 0 || (n >= 8 && n < 16)) t = kIgnoreIndex;
    counted += t != kIgnoreIndex;
    p.targets.push_back(t);
  }
  p.grad_scale = counted ? 1.f / float(counted) : 1.f;
  return p;
}

struct Result {
  double loss;
  std::vector<float> dx, dnorm_w, dlm_w;  // [N, C], [C], [V, C]
};

Result run(const Problem& p, DType dt, int64_t chunk) {
  HeadShape s = p.s;
  s.chunk_tokens = chunk;
  Result r;
  r.dx.assign(size_t(s.N * s.C), std::numeric_limits<float>::quiet_NaN());
  r.dnorm_w.assign(size_t(s.C), 0.f);
  r.dlm_w.assign(size_t(s.V * s.C), 0.f);
  r.loss = head_forward_backward(r.dx.data(), r.dnorm_w.data(), r.dlm_w.data(), p.x.data(), p.targets.data(),
                                 p.norm_w.data(), p.weight(dt), p.grad_scale, s);
  return r;
}

Result run(const Problem& p, DType dt) { return run(p, dt, p.s.chunk_tokens); }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

// ---- reference --------------------------------------------------------------------------------------------
//
// The head in double on the kernel's operands (bf16 mode: xn, lm_w and dlogits rounded to bf16), and for
// every output a bound on |kernel − reference| carried through the computation:
//   * the kernel's xn has relative error eps_x: Σx² over C/16 + 16 f32 additions (halved by the sqrt),
//     /C, +eps, sqrt, 1/x and two products; eps_x = (C/2 + 8)·u covers it;
//   * an f32 sum of K terms errs by at most (K + 2)·u·Σ|terms| (classic γ_K bound with slack);
//   * a logit error dz moves log-sum-exp and z[target] by dz each, and each softmax p by a factor e^{±2dz};
//     exp of the f32 difference z − m errs by (|z − m| + 4)·u relative;
//   * a value the kernel holds within tol of the reference value v rounds to bf16 like round(v) unless
//     [v − tol, v + tol] straddles a rounding boundary; then it may take the neighbour (spread below).
// Bounds only grow where the reference says an error can enter, so ignored tokens must match exactly.
struct Reference {
  double loss = 0, loss_bound = 0;
  std::vector<double> dx, dx_bound;            // [N, C]
  std::vector<double> dnorm_w, dnorm_w_bound;  // [C]
  std::vector<double> dlm_w, dlm_w_bound;      // [V, C]
  std::vector<double> dlm_w_mag;               // [V, C] Σ_tokens |dlogits · xn| (for the accumulate test)
};

// The operand the kernel uses for a value it holds within tol of v, and how far it can be from it.
struct Operand {
  double value, spread;
};

Operand operand(double v, double tol, DType dt) {
  if (dt == DType::f32) return {v, tol};
  double q = round_to_bf16(float(v));
  double lo = round_to_bf16(float(v - tol)), hi = round_to_bf16(float(v + tol));
  return {q, std::max(q - lo, hi - q)};
}

Reference reference(const Problem& p, DType dt) {
  const int64_t N = p.s.N, C = p.s.C, V = p.s.V;
  const double u = kU, gs = p.grad_scale, eps_x = (double(C) / 2 + 8) * u;
  Reference ref;
  ref.dx.assign(size_t(N * C), 0);
  ref.dx_bound.assign(size_t(N * C), 0);
  ref.dnorm_w.assign(size_t(C), 0);
  ref.dnorm_w_bound.assign(size_t(C), 0);
  ref.dlm_w.assign(size_t(V * C), 0);
  ref.dlm_w_bound.assign(size_t(V * C), 0);
  ref.dlm_w_mag.assign(size_t(V * C), 0);
  std::vector<double> B(size_t(V * C));  // [V, C] the weight operand, exactly as the kernel has it
  for (size_t i = 0; i < B.size(); ++i) B[i] = dt == DType::bf16 ? bf16_to_f32(p.lm_w_b[i]) : p.lm_w[i];
  std::vector<double> xh(C), a(C), da(C), z(V), dz(V);    // per token: [C] or [V]
  std::vector<double> d(V), dd(V), dxn(C), ddxn(C);

  for (int64_t n = 0; n < N; ++n) {
    const float* x = p.x.data() + n * C;
    const int32_t t = p.targets[size_t(n)];
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += double(x[c]) * x[c];
    const double r = 1 / std::sqrt(ss / double(C) + double(p.s.eps));
    for (int64_t c = 0; c < C; ++c) {
      xh[c] = x[c] * r;
      double xn = xh[c] * p.norm_w[c];
      Operand o = operand(xn, eps_x * std::fabs(xn), dt);
      a[c] = o.value;
      da[c] = o.spread;
    }
    for (int64_t v = 0; v < V; ++v) {
      double s = 0, mag = 0, spread = 0;
      for (int64_t c = 0; c < C; ++c) {
        s += a[c] * B[v * C + c];
        mag += (std::fabs(a[c]) + da[c]) * std::fabs(B[v * C + c]);
        spread += da[c] * std::fabs(B[v * C + c]);
      }
      z[v] = s;
      dz[v] = double(C + 2) * u * mag + spread;
    }
    std::fill(d.begin(), d.end(), 0.0);
    std::fill(dd.begin(), dd.end(), 0.0);
    if (t != kIgnoreIndex) {
      const double m = *std::max_element(z.begin(), z.end());
      const double dz_max = *std::max_element(dz.begin(), dz.end());
      double se = 0;
      for (int64_t v = 0; v < V; ++v) se += std::exp(z[v] - m);
      const double lse = m + std::log(se);
      double spread_term = 0;  // Σ p·|z − m|: the f32 subtraction's share of log-sum-exp's error
      for (int64_t v = 0; v < V; ++v) spread_term += std::exp(z[v] - lse) * (z[v] - m);
      ref.loss += lse - z[t];
      ref.loss_bound += 2 * dz_max + 8 * u * (1 + std::fabs(lse) + std::fabs(z[t])) + u * spread_term;
      for (int64_t v = 0; v < V; ++v) {
        const double pv = std::exp(z[v] - lse);
        const double dv = gs * (pv - (v == t ? 1.0 : 0.0));
        const double tol = gs * pv * (std::expm1(2 * dz_max) + (m - z[v] + 16) * u) + 2 * u * std::fabs(dv);
        Operand o = operand(dv, tol, dt);
        d[v] = o.value;
        dd[v] = o.spread;
      }
    }
    // dxn = dlogits · lm_w; dlm_w += dlogitsᵀ · xn
    for (int64_t c = 0; c < C; ++c) {
      double s = 0, mag = 0, spread = 0;
      for (int64_t v = 0; v < V; ++v) {
        double b = std::fabs(B[v * C + c]);
        s += d[v] * B[v * C + c];
        mag += (std::fabs(d[v]) + dd[v]) * b;
        spread += dd[v] * b;
      }
      dxn[c] = s;
      ddxn[c] = double(V + 2) * u * mag + spread;
    }
    for (int64_t v = 0; v < V; ++v)
      for (int64_t c = 0; c < C; ++c) {
        size_t i = size_t(v * C + c);
        ref.dlm_w[i] += d[v] * a[c];
        double mag = (std::fabs(d[v]) + dd[v]) * (std::fabs(a[c]) + da[c]);
        ref.dlm_w_mag[i] += mag;
        ref.dlm_w_bound[i] += double(N + 2) * u * mag + dd[v] * (std::fabs(a[c]) + da[c]) + std::fabs(d[v]) * da[c];
      }
    // RMSNorm backward: dx = r·(g − x̂·mean(g x̂)), g = dxn·w; dnorm_w += dxn·x̂
    double mean = 0, mean_abs = 0, mean_err = 0;
    for (int64_t c = 0; c < C; ++c) {
      mean += dxn[c] * p.norm_w[c] * xh[c] / double(C);
      mean_abs += std::fabs(dxn[c] * p.norm_w[c] * xh[c]) / double(C);
      mean_err += ddxn[c] * p.norm_w[c] * std::fabs(xh[c]) / double(C);
    }
    const double round_rel = 3 * eps_x + double(C + 8) * u;  // rstd and x̂ errors, the f32 dot and the rest
    for (int64_t c = 0; c < C; ++c) {
      size_t i = size_t(n * C + c);
      double g = dxn[c] * p.norm_w[c];
      ref.dx[i] = r * (g - xh[c] * mean);
      ref.dx_bound[i] = r * (p.norm_w[c] * ddxn[c] + std::fabs(xh[c]) * mean_err) +
                        round_rel * r * (std::fabs(g) + 2 * std::fabs(xh[c]) * mean_abs);
      ref.dnorm_w[size_t(c)] += dxn[c] * xh[c];
      ref.dnorm_w_bound[size_t(c)] += ddxn[c] * std::fabs(xh[c]) + std::fabs(dxn[c] * xh[c]) * (eps_x + 2 * u);
    }
  }
  for (int64_t c = 0; c < C; ++c) ref.dnorm_w_bound[size_t(c)] += u * std::fabs(ref.dnorm_w[size_t(c)]);
  return ref;
}

// Every element within its bound (<=, so zero bounds demand exact zeros).
void expect_within(const char* what, const std::vector<float>& got, const std::vector<double>& ref,
                   const std::vector<double>& bound) {
  ASSERT_EQ(got.size(), ref.size());
  size_t bad = 0, worst = 0;
  double worst_ratio = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double err = std::fabs(double(got[i]) - ref[i]);
    if (!(err <= bound[i])) ++bad;
    double ratio = bound[i] > 0 ? err / bound[i] : (err > 0 ? INFINITY : 0);
    if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": worst element " << worst << " got " << got[worst] << " reference " << ref[worst]
                     << " bound " << bound[worst] << " (error / bound " << worst_ratio << ")";
}

// Σ bound / Σ |reference|: how tight a bound is relative to the values it guards.
double relative_bound(const std::vector<double>& ref, const std::vector<double>& bound) {
  double b = 0, r = 0;
  for (size_t i = 0; i < ref.size(); ++i) b += bound[i], r += std::fabs(ref[i]);
  return b / r;
}

// Share of elements where `other` lies outside ref's bound.
double share_outside(const std::vector<double>& other, const std::vector<double>& ref, const std::vector<double>& bound) {
  size_t k = 0;
  for (size_t i = 0; i < ref.size(); ++i) k += std::fabs(other[i] - ref[i]) > bound[i];
  return double(k) / double(ref.size());
}

// ---- tests on several shapes ------------------------------------------------------------------------------

struct Config {
  int64_t N, C, V, chunk;
};

class Head : public ::testing::TestWithParam<Config> {
 protected:
  Problem problem() const {
    Config c = GetParam();
    return make_problem(c.N, c.C, c.V, c.chunk, 1000 + uint64_t(c.N * 7 + c.C * 3 + c.V + c.chunk));
  }
};

// Several chunks with a ragged last one (8, 16 into 37 or 74), one chunk exactly N, one larger than N, and
// a shape below one vector width (C = 5, V = 13) so only tail paths run.
INSTANTIATE_TEST_SUITE_P(Shapes, Head,
                         ::testing::Values(Config{37, 48, 101, 8}, Config{37, 48, 101, 16}, Config{74, 48, 101, 16},
                                           Config{37, 48, 101, 37}, Config{37, 48, 101, 64}, Config{9, 5, 13, 4}),
                         [](const ::testing::TestParamInfo<Config>& i) {
                           return "N" + std::to_string(i.param.N) + "_C" + std::to_string(i.param.C) + "_V" +
                                  std::to_string(i.param.V) + "_chunk" + std::to_string(i.param.chunk);
                         });

TEST_P(Head, F32MatchesReference) {
  Problem p = problem();
  SCOPED_TRACE("seed " + std::to_string(p.seed));
  Reference ref = reference(p, DType::f32);
  Result r = run(p, DType::f32);
  EXPECT_LE(std::fabs(r.loss - ref.loss), ref.loss_bound) << "loss " << r.loss << " reference " << ref.loss;
  expect_within("dx", r.dx, ref.dx, ref.dx_bound);
  expect_within("dnorm_w", r.dnorm_w, ref.dnorm_w, ref.dnorm_w_bound);
  expect_within("dlm_w", r.dlm_w, ref.dlm_w, ref.dlm_w_bound);
  // The bounds are f32-sized (measured: 2e-5 of the loss, under 1e-3 of the gradients), so a missing term,
  // a wrong sign or scale, which would be O(1), cannot hide in them.
  EXPECT_LT(ref.loss_bound / ref.loss, 1e-4);
  EXPECT_LT(relative_bound(ref.dx, ref.dx_bound), 2e-3);
  EXPECT_LT(relative_bound(ref.dnorm_w, ref.dnorm_w_bound), 2e-3);
  EXPECT_LT(relative_bound(ref.dlm_w, ref.dlm_w_bound), 2e-3);
}

TEST_P(Head, Bf16MatchesReferenceOnRoundedOperands) {
  Problem p = problem();
  SCOPED_TRACE("seed " + std::to_string(p.seed));
  Reference ref = reference(p, DType::bf16);
  Result r = run(p, DType::bf16);
  EXPECT_LE(std::fabs(r.loss - ref.loss), ref.loss_bound) << "loss " << r.loss << " reference " << ref.loss;
  expect_within("dx", r.dx, ref.dx, ref.dx_bound);
  expect_within("dnorm_w", r.dnorm_w, ref.dnorm_w, ref.dnorm_w_bound);
  expect_within("dlm_w", r.dlm_w, ref.dlm_w, ref.dlm_w_bound);
  // The checks have teeth: the unrounded (f32) reference, i.e. a kernel that skipped the bf16 roundings,
  // breaks the loss bound and the bounds of a large share of the gradient elements (measured: over a third).
  Reference f = reference(p, DType::f32);
  EXPECT_GT(std::fabs(f.loss - ref.loss), ref.loss_bound);
  EXPECT_GT(share_outside(f.dx, ref.dx, ref.dx_bound), 0.25);
  EXPECT_GT(share_outside(f.dnorm_w, ref.dnorm_w, ref.dnorm_w_bound), 0.25);
  EXPECT_GT(share_outside(f.dlm_w, ref.dlm_w, ref.dlm_w_bound), 0.25);
}

TEST_P(Head, ForwardLossEqualsForwardBackwardLossBitwise) {
  Problem p = problem();
  for (DType dt : {DType::f32, DType::bf16}) {
    double fwd = head_forward(p.x.data(), p.targets.data(), p.norm_w.data(), p.weight(dt), p.s);
    EXPECT_TRUE(same_bits(fwd, run(p, dt).loss)) << dtype_name(dt);
  }
}

TEST_P(Head, BitsIndependentOfThreadCount) {
  Problem p = problem();
  int saved = num_threads();
  for (DType dt : {DType::f32, DType::bf16}) {
    set_num_threads(1);
    Result one = run(p, dt);
    set_num_threads(2);
    Result two = run(p, dt);
    EXPECT_TRUE(same_bits(one.loss, two.loss)) << dtype_name(dt);
    EXPECT_TRUE(same_bits(one.dx, two.dx)) << dtype_name(dt);
    EXPECT_TRUE(same_bits(one.dnorm_w, two.dnorm_w)) << dtype_name(dt);
    EXPECT_TRUE(same_bits(one.dlm_w, two.dlm_w)) << dtype_name(dt);
  }
  set_num_threads(saved);
}

// The vector softmax passes against the scalar ones, bit for bit: the op table (tests/ops/test_op_harness.cpp).

// dx is written (a NaN prefill disappears, bits equal a fresh run); dnorm_w and dlm_w accumulate onto
// what is there. Sentinels after every output catch writes past the end.
TEST_P(Head, GradientContract) {
  Problem p = problem();
  const int64_t N = p.s.N, C = p.s.C, V = p.s.V;
  constexpr int64_t kPad = 17;
  constexpr float kSentinel = 12345.f;
  for (DType dt : {DType::f32, DType::bf16}) {
    Result fresh = run(p, dt);
    Reference ref = reference(p, dt);
    std::vector<float> dx(size_t(N * C + kPad), std::numeric_limits<float>::quiet_NaN());
    std::vector<float> dnorm_w = testing::random_vector(size_t(C + kPad), 77, -0.1f, 0.1f);
    std::vector<float> dlm_w = testing::random_vector(size_t(V * C + kPad), 78, -0.01f, 0.01f);
    for (auto* v : {&dx, &dnorm_w, &dlm_w}) std::fill(v->end() - kPad, v->end(), kSentinel);
    const std::vector<float> dnorm_w0 = dnorm_w, dlm_w0 = dlm_w;
    double loss = head_forward_backward(dx.data(), dnorm_w.data(), dlm_w.data(), p.x.data(), p.targets.data(),
                                        p.norm_w.data(), p.weight(dt), p.grad_scale, p.s);
    EXPECT_TRUE(same_bits(loss, fresh.loss));
    for (auto* v : {&dx, &dnorm_w, &dlm_w})
      for (int64_t i = 0; i < kPad; ++i) ASSERT_EQ((*v)[v->size() - kPad + size_t(i)], kSentinel) << dtype_name(dt);
    dx.resize(size_t(N * C));
    EXPECT_TRUE(same_bits(dx, fresh.dx)) << dtype_name(dt);
    // dnorm_w = fl(pre + D) with D the exact double sum, fresh = fl(D): they differ by u·(|pre| + 2|D|).
    for (int64_t c = 0; c < C; ++c) {
      double pre = dnorm_w0[size_t(c)], f = fresh.dnorm_w[size_t(c)];
      EXPECT_LE(std::fabs(double(dnorm_w[size_t(c)]) - pre - f), 2 * kU * (std::fabs(pre) + 2 * std::fabs(f)))
          << "dnorm_w " << c;
    }
    // dlm_w: at most N + 1 f32 additions, each on partial sums no larger than |pre| + Σ|terms|, in either run.
    for (int64_t i = 0; i < V * C; ++i) {
      double pre = dlm_w0[size_t(i)];
      double tol = 2 * double(N + 2) * kU * (std::fabs(pre) + ref.dlm_w_mag[size_t(i)]);
      ASSERT_LE(std::fabs(double(dlm_w[size_t(i)]) - pre - fresh.dlm_w[size_t(i)]), tol)
          << dtype_name(dt) << " dlm_w " << i;
    }
  }
}

// ---- single tests -------------------------------------------------------------------------------------------

// Loss, dx and dnorm_w do not depend on how the tokens are chunked except through oneDNN's blocking of the
// GEMMs (ops/head.cpp), so any two chunkings agree within twice the reference bound; dlm_w's per-chunk f32
// partial sums add the same kind of error.
TEST(Head, ChunkSizesAgree) {
  Problem p = make_problem(74, 48, 101, 74, 4242);
  Reference ref = reference(p, DType::f32);
  Result base = run(p, DType::f32, 74);
  for (int64_t chunk : {1, 8, 16, 37, 100}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    Result r = run(p, DType::f32, chunk);
    EXPECT_LE(std::fabs(r.loss - base.loss), 2 * ref.loss_bound);
    for (size_t i = 0; i < r.dx.size(); ++i)
      ASSERT_LE(std::fabs(double(r.dx[i]) - base.dx[i]), 2 * ref.dx_bound[i]) << "dx " << i;
    for (size_t i = 0; i < r.dnorm_w.size(); ++i)
      ASSERT_LE(std::fabs(double(r.dnorm_w[i]) - base.dnorm_w[i]), 2 * ref.dnorm_w_bound[i]) << "dnorm_w " << i;
    for (size_t i = 0; i < r.dlm_w.size(); ++i)
      ASSERT_LE(std::fabs(double(r.dlm_w[i]) - base.dlm_w[i]), 2 * ref.dlm_w_bound[i]) << "dlm_w " << i;
  }
}

// Central differences of L = grad_scale · head_forward on f32 data, step h = 1e-2. Truncation error is
// h²/6·|L'''| (L''' = O(|lm_w|³) per token, O(1) here: ~1e-5 against gradients of O(1e-2..1)); the rounding
// term is the f32 noise of L (~1e-7 of it per touched token) over 2h, ~1e-5 absolute. Against the header's
// floor of 1e-2 both stay near 1e-3 at worst (measured worst: 5e-4, for dx); we allow 5e-3.
TEST(Head, FiniteDifferences) {
  Problem p = make_problem(37, 48, 101, 16, 99);
  Result r = run(p, DType::f32);
  auto loss = [&] {
    return double(p.grad_scale) *
           head_forward(p.x.data(), p.targets.data(), p.norm_w.data(), p.weight(DType::f32), p.s);
  };
  constexpr double kBound = 5e-3;
  auto gx = testing::grad_check(p.x, r.dx, loss, 1);
  EXPECT_GRAD_OK(gx, kBound, "dx");
  auto gw = testing::grad_check(p.norm_w, r.dnorm_w, loss, 2);
  EXPECT_GRAD_OK(gw, kBound, "dnorm_w");
  auto gl = testing::grad_check(p.lm_w, r.dlm_w, loss, 3);
  EXPECT_GRAD_OK(gl, kBound, "dlm_w");
}

TEST(Head, AllTokensIgnored) {
  Problem p = make_problem(37, 48, 101, 16, 5);
  std::fill(p.targets.begin(), p.targets.end(), kIgnoreIndex);
  for (DType dt : {DType::f32, DType::bf16}) {
    std::vector<float> dx(p.x.size(), std::numeric_limits<float>::quiet_NaN());
    std::vector<float> dnorm_w = testing::random_vector(48, 6), dlm_w = testing::random_vector(p.lm_w.size(), 7);
    const std::vector<float> dnorm_w0 = dnorm_w, dlm_w0 = dlm_w;
    double loss = head_forward_backward(dx.data(), dnorm_w.data(), dlm_w.data(), p.x.data(), p.targets.data(),
                                        p.norm_w.data(), p.weight(dt), 1.f, p.s);
    EXPECT_EQ(loss, 0.0);
    EXPECT_EQ(head_forward(p.x.data(), p.targets.data(), p.norm_w.data(), p.weight(dt), p.s), 0.0);
    for (float v : dx) ASSERT_EQ(v, 0.f);
    EXPECT_TRUE(same_bits(dnorm_w, dnorm_w0));
    EXPECT_TRUE(same_bits(dlm_w, dlm_w0));
  }
}

// A target outside [0, V) that is not -100 is an error naming the token, the target and V, raised before
// anything is accumulated.
TEST(Head, BadTargetThrows) {
  Problem p = make_problem(37, 48, 101, 8, 11);
  for (int32_t bad : {101, -1, -101, 1 << 30}) {
    p.targets[21] = bad;
    std::vector<float> dx(p.x.size()), dnorm_w(48, 0.5f), dlm_w(p.lm_w.size(), 0.25f);
    try {
      head_forward_backward(dx.data(), dnorm_w.data(), dlm_w.data(), p.x.data(), p.targets.data(), p.norm_w.data(),
                            p.weight(DType::f32), 1.f, p.s);
      ADD_FAILURE() << "target " << bad << " was accepted";
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("token 21"), std::string::npos) << msg;
      EXPECT_NE(msg.find("target " + std::to_string(bad)), std::string::npos) << msg;
      EXPECT_NE(msg.find("V=101"), std::string::npos) << msg;
    }
    for (float v : dnorm_w) ASSERT_EQ(v, 0.5f);
    for (float v : dlm_w) ASSERT_EQ(v, 0.25f);
    EXPECT_THROW(head_forward(p.x.data(), p.targets.data(), p.norm_w.data(), p.weight(DType::f32), p.s), Error);
  }
}

}  // namespace
}  // namespace lt
