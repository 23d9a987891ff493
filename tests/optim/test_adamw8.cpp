// The fused 8-bit AdamW step against a plain reference (dequantise -> AdamW in f64 -> requantise with brute-force
// nearest codes), code for code and absmax for absmax, on odd lengths and several block sizes, on every vector
// path; its closeness to an unrounded f64 AdamW; independence from the thread count; the zero-point guard.
//
// Legend: n elements, B block size.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/parallel.h"
#include "core/rng.h"
#include "optim/adamw.h"
#include "optim/kernels.h"
#include "optim_testing.h"

namespace lt {
namespace {

using testing::brute_force_nearest;

// f32 arithmetic written in f64: each operation in double, rounded to f32. For + - * / and sqrt that IS the
// f32 result (rounding a binary64 result to binary32 is innocuous since 53 >= 2·24 + 2), so the reference can
// be plain double code and still demand identical bits. The two multiply-adds of m and v are f32 FMAs
// (std::fma on floats: one rounding), as in the kernels and in torch; double rounding would not be exact there.
inline float r32(double x) { return float(x); }

struct State8 {
  std::vector<uint8_t> qm, qv;  // [n]
  std::vector<float> am, av;    // [ceil(n / B)]
  State8(int64_t n, int64_t B)
      : qm(static_cast<size_t>(n), uint8_t(quant_zero_code(QuantMapKind::signed_dynamic))),
        qv(static_cast<size_t>(n), uint8_t(quant_zero_code(QuantMapKind::unsigned_dynamic))),
        am(static_cast<size_t>((n + B - 1) / B), 0.0f),
        av(static_cast<size_t>((n + B - 1) / B), 0.0f) {}
  bool operator==(const State8& o) const {
    return qm == o.qm && qv == o.qv && testing::bits_equal(am, o.am) && testing::bits_equal(av, o.av);
  }
};

enum class Guard { on, off };

// The reference step: dequantise with the old absmax, AdamW (kernels.h's order, f64 rounded per operation),
// new absmax (flushed below FLT_MIN), requantise to the brute-force nearest code, zero-point guard for v.
void reference_step8(std::vector<float>& p, const std::vector<float>& grad, State8& st, int64_t B,
                     const AdamWScalars& s, Guard guard = Guard::on) {
  const QuantMap& qs = quant_map(QuantMapKind::signed_dynamic);
  const QuantMap& qu = quant_map(QuantMapKind::unsigned_dynamic);
  const int64_t n = int64_t(p.size());
  for (int64_t b0 = 0, blk = 0; b0 < n; b0 += B, ++blk) {
    const int64_t len = std::min(B, n - b0);
    std::vector<float> m(static_cast<size_t>(len)), v(static_cast<size_t>(len));
    for (int64_t j = 0; j < len; ++j) {
      const size_t i = size_t(b0 + j);
      double mj = r32(double(qs[st.qm[i]]) * st.am[size_t(blk)]);
      double vj = r32(double(qu[st.qv[i]]) * st.av[size_t(blk)]);
      const double g = r32(double(grad[i]) * s.clip);
      const double p1 = r32(double(p[i]) * s.decay);
      mj = std::fma(float(g), s.one_minus_beta1, r32(mj * s.beta1));  // f32 FMAs: one rounding each
      vj = std::fma(r32(g * s.one_minus_beta2), float(g), r32(vj * s.beta2));
      const double d = r32(r32(r32(std::sqrt(vj)) / s.bc2_sqrt) + s.eps);
      p[i] = r32(p1 + r32(r32(s.neg_step_size * mj) / d));
      m[size_t(j)] = float(mj);
      v[size_t(j)] = float(vj);
    }
    float max_m = 0, max_v = 0;
    for (int64_t j = 0; j < len; ++j) {
      max_m = std::max(max_m, std::fabs(m[size_t(j)]));
      max_v = std::max(max_v, v[size_t(j)]);
    }
    if (max_m < FLT_MIN) max_m = 0;
    if (max_v < FLT_MIN) max_v = 0;
    st.am[size_t(blk)] = max_m;
    st.av[size_t(blk)] = max_v;
    const double inv_m = max_m > 0 ? r32(1.0 / max_m) : 0.0, inv_v = max_v > 0 ? r32(1.0 / max_v) : 0.0;
    for (int64_t j = 0; j < len; ++j) {
      const size_t i = size_t(b0 + j);
      st.qm[i] = brute_force_nearest(qs, r32(m[size_t(j)] * inv_m));
      uint8_t cv = brute_force_nearest(qu, r32(v[size_t(j)] * inv_v));
      if (guard == Guard::on && cv == 0 && v[size_t(j)] > 0 && max_v > 0) cv = 1;
      st.qv[i] = cv;
    }
  }
}

// Seeded gradients whose scale changes from block to block (by up to 10^6) and inside blocks, so absmax
// varies and the small codes are used; never zero.
std::vector<float> random_grad(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double scale = std::pow(10.0, -6.0 * double((i / 37) % 7) / 6.0) * std::pow(10.0, -2.0 * rng.uniform());
    g[size_t(i)] = float(rng.normal() * scale + 1e-9);
  }
  return g;
}

AdamWScalars scalars_for(int64_t step, float clip, double wd = 0.01) {
  return adamw_scalars(1e-3 * (1.0 + 0.1 * double(step)), 0.9, 0.999, 1e-8, wd, step, clip);
}

void run_kernel(VectorPath path, std::vector<float>& p, const std::vector<float>& g, State8& st, int64_t B,
                const AdamWScalars& s, std::vector<bf16_t>* copy = nullptr) {
  adamw8(path, {p.data(), g.data(), st.qm.data(), st.am.data(), st.qv.data(), st.av.data(),
                copy ? copy->data() : nullptr, int64_t(p.size()), B},
         s);
}

struct Case {
  int64_t n, B;
};

class FusedStep8 : public ::testing::TestWithParam<Case> {};

TEST_P(FusedStep8, EqualsReferenceCodeForCode) {
  const auto [n, B] = GetParam();
  const std::vector<VectorPath> paths = testing::available_paths();
  // Every path steps its own copy in lockstep with one reference.
  std::vector<float> p_ref = testing::random_vector(size_t(n), 5 + uint64_t(n));
  State8 st_ref(n, B);
  std::vector<std::vector<float>> p(paths.size(), p_ref);
  std::vector<State8> st(paths.size(), st_ref);
  std::vector<bf16_t> copy(static_cast<size_t>(n));
  for (int64_t step = 1; step <= 6; ++step) {
    const std::vector<float> g = random_grad(n, uint64_t(100 * n + step));
    const AdamWScalars s = scalars_for(step, step % 2 ? 1.0f : 0.37f, step == 3 ? 0.0 : 0.01);
    reference_step8(p_ref, g, st_ref, B, s);
    for (size_t k = 0; k < paths.size(); ++k) {
      SCOPED_TRACE(::testing::Message() << "path " << vector_path_name(paths[k]) << ", n=" << n << ", B=" << B
                                        << ", step " << step);
      run_kernel(paths[k], p[k], g, st[k], B, s, &copy);
      ASSERT_TRUE(testing::bits_equal(p[k], p_ref)) << "parameters differ";
      ASSERT_TRUE(st[k].qm == st_ref.qm) << "m codes differ";
      ASSERT_TRUE(st[k].qv == st_ref.qv) << "v codes differ";
      ASSERT_TRUE(testing::bits_equal(st[k].am, st_ref.am)) << "m absmax differs";
      ASSERT_TRUE(testing::bits_equal(st[k].av, st_ref.av)) << "v absmax differs";
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(copy[size_t(i)], f32_to_bf16(p[k][size_t(i)])) << "bf16 copy " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(OddLengths, FusedStep8,
                         ::testing::Values(Case{1, 256}, Case{15, 256}, Case{17, 256}, Case{255, 256},
                                           Case{257, 256}, Case{1000, 256}, Case{4099, 256}, Case{70001, 256},
                                           Case{333, 16}, Case{1001, 64}, Case{5000, 2048}, Case{9000, 4096}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return fmt::format("n{}_B{}", i.param.n, i.param.B);
                         });

// Requantisation at its edges, every path against the plain one: the f32 neighbours (+-40) of every midpoint of
// both maps (the lanes the arithmetic paths flag and look up exactly), of the region thresholds (exact compares;
// the signed map's negative side ties the other way), of powers of two (the binade-pair region lookup), the codes
// themselves, 1.0, +-0 and denormals. With beta1 = 0, 1 - beta1 = 1 the step's m' is the gradient bit for bit
// (fma(g, 1, 0)), and with beta2 = 0, 1 - beta2 = 1, v' = g · g rounded; each block's lane 0 holds g = 1, so
// absmax_m = absmax_v = 1 and m' / absmax, v' / absmax are those values exactly. A v target is reached through
// the f32 g nearest its square root whose square rounds to it (or the closest square where none does).
std::vector<float> edge_values(QuantMapKind kind) {
  const QuantMap& q = quant_map(kind);
  const QuantArith& qa = quant_arith(kind);
  std::vector<float> x;
  auto around = [&](float c, int k) {
    float lo = c, hi = c;
    x.push_back(c);
    for (int i = 0; i < k; ++i) {
      lo = std::nextafter(lo, -INFINITY);
      hi = std::nextafter(hi, INFINITY);
      x.push_back(lo);
      x.push_back(hi);
    }
  };
  for (int c = 0; c + 1 < 256; ++c) {
    const double mid = (double(q[size_t(c)]) + double(q[size_t(c) + 1])) / 2;
    around(float(mid), 40);
  }
  for (int c = 0; c < 256; ++c) around(q[size_t(c)], 2);
  for (int i = 0; i < 32; ++i)
    if (qa.T[i] < INFINITY) around(qa.T[i], 4);
  for (int e = -40; e <= 0; ++e) around(std::ldexp(1.0f, e), 1);
  for (float v : {0.0f, -0.0f, 1e-40f, -1e-40f, FLT_MIN, 1.0f}) x.push_back(v);
  const size_t positive = x.size();
  if (kind == QuantMapKind::signed_dynamic)
    for (size_t i = 0; i < positive; ++i) x.push_back(-x[i]);
  std::vector<float> kept;
  for (float v : x)
    if (std::fabs(v) <= 1.0f && (kind == QuantMapKind::signed_dynamic || v >= 0.0f)) kept.push_back(v);
  return kept;
}

// The f32 g whose rounded square is t, or the closest such square.
float root_of_square(float t) {
  float g = std::sqrt(t), best = g;
  double best_d = INFINITY;
  for (int i = 0; i < 6; ++i) g = std::nextafter(g, 0.0f);
  for (int i = 0; i < 13; ++i, g = std::nextafter(g, INFINITY)) {
    const double d = std::fabs(double(g * g) - double(t));
    if (d < best_d) best_d = d, best = g;
  }
  return best;
}

// How many of xs the arithmetic requantisation flags for the exact lookup (QuantArith, as the vector paths run
// it): the test must reach that fallback, not only the arithmetic.
int64_t flagged(QuantMapKind kind, const std::vector<float>& xs) {
  const QuantArith& q = quant_arith(kind);
  int64_t count = 0;
  for (float x : xs) {
    const float a = std::fabs(x);
    uint32_t bits;
    std::memcpy(&bits, &a, 4);
    const int32_t lo = q.region_lo[std::max<int32_t>(int32_t(bits >> 23) - QuantArith::kExpBase, 0) & 31];
    const int32_t r = lo + (a > q.T[lo + (x < 0 ? 16 : 0)]);
    count += QuantArith::ambiguous(int32_t(std::lrint(std::fma(a, q.A[r], q.B[r]))));
  }
  return count;
}

TEST(FusedStep8, RequantisationEdgesMatchPlain) {
  AdamWScalars s;  // clip 1, decay 1
  s.beta1 = 0.0f;
  s.one_minus_beta1 = 1.0f;
  s.beta2 = 0.0f;
  s.one_minus_beta2 = 1.0f;
  s.neg_step_size = -1e-3f;
  const std::vector<float> xm = edge_values(QuantMapKind::signed_dynamic);
  const std::vector<float> xv = edge_values(QuantMapKind::unsigned_dynamic);
  std::vector<float> targets = xm;
  for (float t : xv) targets.push_back(root_of_square(t));
  std::vector<float> squares;
  for (float g : targets) squares.push_back(g * g);
  EXPECT_GT(flagged(QuantMapKind::signed_dynamic, xm), 2000);
  EXPECT_GT(flagged(QuantMapKind::unsigned_dynamic, squares), 2000);
  for (int64_t B : {int64_t(16), int64_t(64), int64_t(256)}) {
    // Lane 0 of every block is 1 (the absmax); the targets fill the other lanes, then a short last block.
    std::vector<float> g;
    for (size_t t = 0; t < targets.size(); ++t) {
      if (int64_t(g.size()) % B == 0) g.push_back(1.0f);
      g.push_back(targets[t]);
    }
    for (int i = 0; i < 5; ++i) g.push_back(0.25f);
    if (int64_t(g.size()) % B == 1) g.push_back(0.5f);
    const int64_t n = int64_t(g.size());
    const std::vector<float> p0 = testing::random_vector(size_t(n), 77);
    std::vector<float> p_ref = p0;
    State8 st_ref(n, B);
    run_kernel(VectorPath::plain, p_ref, g, st_ref, B, s);
    for (size_t blk = 0; blk + 1 < st_ref.am.size(); ++blk) ASSERT_EQ(st_ref.am[blk], 1.0f) << "block " << blk;
    for (VectorPath path : testing::available_paths()) {
      for (bool with_copy : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "path " << vector_path_name(path) << ", B=" << B
                                          << (with_copy ? ", bf16 copy" : ""));
        std::vector<float> p = p0;
        State8 st(n, B);
        std::vector<bf16_t> copy(static_cast<size_t>(n));
        run_kernel(path, p, g, st, B, s, with_copy ? &copy : nullptr);
        ASSERT_TRUE(testing::bits_equal(p, p_ref)) << "parameters differ";
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(int(st.qm[size_t(i)]), int(st_ref.qm[size_t(i)])) << "m code " << i << ", m' = " << g[size_t(i)];
          ASSERT_EQ(int(st.qv[size_t(i)]), int(st_ref.qv[size_t(i)]))
              << "v code " << i << ", v' = " << g[size_t(i)] * g[size_t(i)];
        }
        ASSERT_TRUE(st == st_ref) << "absmax differs";
      }
    }
  }
}

// The f32 kernel against AdamW computed without any intermediate rounding (f64 throughout, m and v kept in
// f64 until requantised): the two differ only by f32 rounding, which may move a value across a midpoint
// between two codes. So codes agree but for rare neighbours, absmax and p to about an ulp.
TEST(FusedStep8, CloseToUnroundedF64) {
  const int64_t n = 50001, B = 256;
  std::vector<float> p = testing::random_vector(size_t(n), 9), p64 = p;
  State8 st(n, B), st64(n, B);
  const QuantMap& qs = quant_map(QuantMapKind::signed_dynamic);
  const QuantMap& qu = quant_map(QuantMapKind::unsigned_dynamic);
  int64_t code_diffs = 0, codes = 0;
  for (int64_t step = 1; step <= 5; ++step) {
    const std::vector<float> g = random_grad(n, uint64_t(7000 + step));
    const AdamWScalars s = scalars_for(step, 0.5f);
    run_kernel(best_vector_path(), p, g, st, B, s);
    for (int64_t b0 = 0, blk = 0; b0 < n; b0 += B, ++blk) {  // the unrounded reference, from its own state
      const int64_t len = std::min(B, n - b0);
      std::vector<double> m(static_cast<size_t>(len)), v(static_cast<size_t>(len));
      double max_m = 0, max_v = 0;
      for (int64_t j = 0; j < len; ++j) {
        const size_t i = size_t(b0 + j);
        const double gg = double(g[i]) * s.clip;
        m[size_t(j)] = double(qs[st64.qm[i]]) * st64.am[size_t(blk)] * s.beta1 + gg * s.one_minus_beta1;
        v[size_t(j)] = double(qu[st64.qv[i]]) * st64.av[size_t(blk)] * s.beta2 + gg * s.one_minus_beta2 * gg;
        const double d = std::sqrt(v[size_t(j)]) / s.bc2_sqrt + s.eps;
        p64[i] = float(double(p64[i]) * s.decay + s.neg_step_size * m[size_t(j)] / d);
        max_m = std::max(max_m, std::fabs(m[size_t(j)]));
        max_v = std::max(max_v, v[size_t(j)]);
      }
      st64.am[size_t(blk)] = float(max_m);
      st64.av[size_t(blk)] = float(max_v);
      for (int64_t j = 0; j < len; ++j) {
        const size_t i = size_t(b0 + j);
        uint8_t cm = 0, cv = 0;
        double best_m = INFINITY, best_v = INFINITY;
        for (int c = 0; c < 256; ++c) {
          const double dm = std::fabs(m[size_t(j)] / max_m - qs[size_t(c)]);
          const double dv = std::fabs(v[size_t(j)] / max_v - qu[size_t(c)]);
          if (dm < best_m) best_m = dm, cm = uint8_t(c);
          if (dv < best_v) best_v = dv, cv = uint8_t(c);
        }
        st64.qm[i] = cm;
        st64.qv[i] = cv == 0 && v[size_t(j)] > 0 ? 1 : cv;
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      const size_t k = size_t(i);
      ASSERT_LE(std::abs(int(st.qm[k]) - int(st64.qm[k])), 1) << "step " << step << " element " << i;
      ASSERT_LE(std::abs(int(st.qv[k]) - int(st64.qv[k])), 1) << "step " << step << " element " << i;
      code_diffs += (st.qm[k] != st64.qm[k]) + (st.qv[k] != st64.qv[k]);
      codes += 2;
      // p = p·decay + O(lr) update: both roundings are ulps of p (|p| ~ 0.5 here) plus ulps of the update.
      ASSERT_NEAR(p[k], p64[k], 1e-6 * std::fabs(p64[k]) + 1e-9) << "step " << step << " element " << i;
      // Copy the unrounded state's codes to ours' where they differ by one, so the next step compares steps.
      st64.qm[k] = st.qm[k];
      st64.qv[k] = st.qv[k];
      p64[k] = p[k];
    }
    for (size_t b = 0; b < st.am.size(); ++b) {
      ASSERT_NEAR(st.am[b], st64.am[b], 1e-6 * st64.am[b]) << "block " << b;
      ASSERT_NEAR(st.av[b], st64.av[b], 1e-6 * st64.av[b]) << "block " << b;
      st64.am[b] = st.am[b];
      st64.av[b] = st.av[b];
    }
  }
  EXPECT_LT(double(code_diffs) / double(codes), 1e-3) << code_diffs << " of " << codes << " codes differ";
}

// Through AdamWSlab: chunked into tasks (whole blocks) on 1 and 2 threads, the same bits as one kernel call
// over each whole tensor.
TEST(FusedStep8, SlabUpdateIndependentOfThreads) {
  AdamWConfig cfg;
  std::vector<OptimTensor> tensors;
  int64_t offset = 0;
  for (int64_t n : {int64_t(100003), int64_t(4096), int64_t(77)}) {
    OptimTensor t;
    t.name = fmt::format("t{}", n);
    t.shape = {n};
    t.param_offset = offset;
    t.precision = StatePrecision::q8;
    tensors.push_back(t);
    offset += (n * 4 + 63) / 64 * 64;
  }
  const std::vector<float> p0 = testing::random_vector(size_t(offset / 4), 21);
  std::vector<std::vector<float>> results;
  const int saved = num_threads();
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    AdamWSlab slab(tensors, cfg);
    std::vector<float> p = p0;
    for (int64_t step = 1; step <= 3; ++step) {
      const std::vector<float> g = random_grad(offset / 4, uint64_t(step));
      slab.update(reinterpret_cast<uint8_t*>(p.data()), reinterpret_cast<const uint8_t*>(g.data()),
                  {step, 1e-3, 0.8f});
    }
    results.push_back(p);
    // The same steps by the plain kernel over each whole tensor.
    std::vector<float> q = p0;
    for (size_t ti = 0; ti < tensors.size(); ++ti) {
      const OptimTensor& t = tensors[ti];
      State8 st(t.numel(), cfg.block_size);
      std::vector<float> pt(q.begin() + t.param_offset / 4, q.begin() + t.param_offset / 4 + t.numel());
      for (int64_t step = 1; step <= 3; ++step) {
        const std::vector<float> g = random_grad(offset / 4, uint64_t(step));
        const std::vector<float> gt(g.begin() + t.param_offset / 4, g.begin() + t.param_offset / 4 + t.numel());
        run_kernel(VectorPath::plain, pt, gt, st, cfg.block_size,
                   adamw_scalars(1e-3, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, step, 0.8f));
      }
      const AdamWSlab::TensorState s = slab.state(ti);
      EXPECT_EQ(std::memcmp(s.qm, st.qm.data(), st.qm.size()), 0) << t.name << " m codes, " << threads << " threads";
      EXPECT_EQ(std::memcmp(s.qv, st.qv.data(), st.qv.size()), 0) << t.name << " v codes, " << threads << " threads";
      EXPECT_EQ(std::memcmp(s.absmax_v, st.av.data(), st.av.size() * 4), 0) << t.name << " v absmax";
      EXPECT_EQ(std::memcmp(p.data() + t.param_offset / 4, pt.data(), pt.size() * 4), 0) << t.name << " params";
    }
  }
  set_num_threads(saved);
  EXPECT_TRUE(testing::bits_equal(results[0], results[1])) << "1 and 2 threads differ";
}

// The zero-point hazard: element 1 of a block whose absmax_v is set by a large gradient elsewhere has
// v / absmax_v = 1e-8, below the smallest code. Nearest rounding stores v = 0 while m keeps ~1e-5, so the next
// step divides m by sqrt(tiny) + eps: a step of ~70 lr where unquantised AdamW takes < 1 lr. The guard stores
// the smallest positive code instead, which can only overestimate v, so the step stays below AdamW's.
TEST(ZeroPointGuard, KeepsTheStepBounded) {
  const int64_t n = 256, B = 256;
  std::vector<float> p = testing::random_vector(size_t(n), 3);
  std::vector<float> g1 = testing::random_vector(size_t(n), 4, -1e-2f, 1e-2f);
  g1[0] = 1.0f;    // sets absmax_v = 1e-3
  g1[1] = 1e-4f;   // v = 1e-11: 1e-8 of absmax
  std::vector<float> g2 = testing::random_vector(size_t(n), 5, -1e-2f, 1e-2f);
  g2[0] = 1.0f;
  g2[1] = 1e-6f;   // small, not zero: v' = 0.999 v + 1e-15
  const AdamWScalars s1 = scalars_for(1, 1.0f), s2 = scalars_for(2, 1.0f);

  // Unquantised f32 AdamW (kernel adamw32) as the yardstick.
  std::vector<float> p32 = p, m32(static_cast<size_t>(n)), v32(static_cast<size_t>(n));
  adamw32_plain({p32.data(), g1.data(), m32.data(), v32.data(), nullptr, n}, s1);
  const float before32 = p32[1];
  adamw32_plain({p32.data(), g2.data(), m32.data(), v32.data(), nullptr, n}, s2);
  const double step32 = std::fabs(double(p32[1]) - before32);

  for (Guard guard : {Guard::on, Guard::off}) {
    std::vector<float> q = p;
    State8 st(n, B);
    reference_step8(q, g1, st, B, s1, guard);
    EXPECT_EQ(int(st.qv[1]), guard == Guard::on ? 1 : 0);
    EXPECT_NE(int(st.qm[1]), quant_zero_code(QuantMapKind::signed_dynamic));  // m survives quantisation
    const float before = q[1];
    reference_step8(q, g2, st, B, s2, guard);
    const double step8 = std::fabs(double(q[1]) - before);
    std::printf("  %s: element 1 moves %.3g, %.3g x unquantised AdamW's %.3g\n",
                guard == Guard::on ? "guarded" : "nearest", step8, step8 / step32, step32);
    if (guard == Guard::on) {
      EXPECT_LE(step8, step32) << "guarded step " << step8 << " vs AdamW " << step32;
    } else {
      EXPECT_GT(step8, 50 * step32) << "unguarded step " << step8 << " vs AdamW " << step32;
    }
  }

  // The fused kernels apply the guard on every path.
  for (VectorPath path : testing::available_paths()) {
    std::vector<float> q = p, q_ref = p;
    State8 st(n, B), st_ref(n, B);
    run_kernel(path, q, g1, st, B, s1);
    reference_step8(q_ref, g1, st_ref, B, s1, Guard::on);
    EXPECT_EQ(int(st.qv[1]), 1) << vector_path_name(path);
    EXPECT_TRUE(st == st_ref) << vector_path_name(path);
  }
}

TEST(ZeroPointGuard, ZeroStaysZero) {
  // v exactly 0 (a gradient that was always 0) keeps code 0; a block of only such values has absmax 0.
  const int64_t n = 40, B = 16;
  std::vector<float> p = testing::random_vector(size_t(n), 8);
  std::vector<float> g = testing::random_vector(size_t(n), 9);
  for (int64_t i = 16; i < 32; ++i) g[size_t(i)] = 0.0f;  // the second block: no gradient at all
  g[3] = 0.0f;
  for (VectorPath path : testing::available_paths()) {
    std::vector<float> q = p;
    State8 st(n, B);
    run_kernel(path, q, g, st, B, scalars_for(1, 1.0f));
    EXPECT_EQ(int(st.qv[3]), 0) << vector_path_name(path);
    EXPECT_EQ(st.av[1], 0.0f) << vector_path_name(path);
    EXPECT_EQ(st.am[1], 0.0f) << vector_path_name(path);
    for (int64_t i = 16; i < 32; ++i) {
      EXPECT_EQ(int(st.qv[size_t(i)]), 0);
      EXPECT_EQ(int(st.qm[size_t(i)]), quant_zero_code(QuantMapKind::signed_dynamic));
    }
  }
}

}  // namespace
}  // namespace lt
