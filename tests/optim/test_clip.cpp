// Gradient accumulation with its partial sums of squares (values, determinism across vector paths and thread
// counts, bf16 sources, whole slabs), the global norm from per-slab partials, the clip coefficient, and the
// non-finite-step policy: skipped steps leave parameters and states untouched; too many in a row is an error.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/parallel.h"
#include "model/weights.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim_testing.h"

namespace lt {
namespace {

using Vec = std::vector<float>;

// The CPU feature sets that force each vector path through the public entry points.
std::vector<CpuFeatures> forced_feature_sets() {
  std::vector<CpuFeatures> sets;
  sets.push_back(CpuFeatures{});
  const CpuFeatures& real = cpu_features();
  if (real.avx2 && real.fma) {
    CpuFeatures f;
    f.avx2 = f.fma = true;
    sets.push_back(f);
  }
  if (real.avx512f && real.avx512bw && real.avx512vl && real.fma) sets.push_back(real);
  return sets;
}

struct Accumulated {
  Vec dst;
  double sumsq;
};

TEST(Accumulate, AddsAndReturnsTheSumOfSquaresOfTheResult) {
  for (int64_t n : {1, 15, 16, 17, 1000, 32768, 32769, 100001}) {
    const Vec d0 = testing::random_vector(size_t(n), 1, -2, 2), src = testing::random_vector(size_t(n), 2, -3, 3);
    std::vector<Accumulated> results;
    const int saved = num_threads();
    for (const CpuFeatures& f : forced_feature_sets()) {
      cpu_features_override(&f);
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        Vec d = d0;
        const double s = accumulate_grad(d.data(), src.data(), n);
        results.push_back({d, s});
      }
    }
    cpu_features_override(nullptr);
    set_num_threads(saved);
    // Values: dst + src in f32; Σ x² against a sequential double sum, whose own rounding error is at most
    // n·2^-53 relative (positive terms), the bound used.
    double want = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float x = d0[size_t(i)] + src[size_t(i)];
      ASSERT_EQ(results[0].dst[size_t(i)], x);
      want += double(x) * double(x);
    }
    EXPECT_NEAR(results[0].sumsq, want, double(n) * 1.2e-16 * want) << "n=" << n;
    // Bits: the same whatever the path and thread count.
    for (const Accumulated& r : results) {
      EXPECT_TRUE(testing::bits_equal(r.dst, results[0].dst)) << "n=" << n;
      EXPECT_EQ(std::memcmp(&r.sumsq, &results[0].sumsq, sizeof(double)), 0) << "n=" << n;
    }
  }
}

TEST(Accumulate, OverwriteAndBf16Sources) {
  const int64_t n = 40001;
  const Vec src = testing::random_vector(size_t(n), 3, -5, 5);
  std::vector<bf16_t> src16(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) src16[size_t(i)] = f32_to_bf16(src[size_t(i)]);
  Vec rounded(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) rounded[size_t(i)] = bf16_to_f32(src16[size_t(i)]);
  for (const CpuFeatures& f : forced_feature_sets()) {
    cpu_features_override(&f);
    Vec a = testing::random_vector(size_t(n), 4), b = a;
    const double sa = accumulate_grad(a.data(), src16.data(), n, GradMode::add);
    const double sb = accumulate_grad(b.data(), rounded.data(), n, GradMode::add);
    EXPECT_TRUE(testing::bits_equal(a, b));
    EXPECT_EQ(sa, sb);
    Vec c = testing::random_vector(size_t(n), 5);
    const double sc = accumulate_grad(c.data(), src16.data(), n, GradMode::overwrite);
    EXPECT_TRUE(testing::bits_equal(c, rounded));
    Vec d(static_cast<size_t>(n), 0.0f);
    EXPECT_EQ(sc, accumulate_grad(d.data(), rounded.data(), n, GradMode::add));  // 0 + x = x
  }
  cpu_features_override(nullptr);
}

TEST(Accumulate, NonFiniteGradientGivesNonFiniteSum) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    Vec d = testing::random_vector(1000, 6), s = testing::random_vector(1000, 7);
    s[777] = bad;
    EXPECT_FALSE(std::isfinite(accumulate_grad(d.data(), s.data(), 1000)));
  }
  // Finite but huge values do not overflow the double sum (f32 squares would).
  Vec d(4, 0.0f), s(4, 3e38f);
  EXPECT_TRUE(std::isfinite(accumulate_grad(d.data(), s.data(), 4)));
}

TEST(Accumulate, WholeSlabFromTheBf16ComputeLayout) {
  const ModelConfig cfg = testing::tiny_model_config();
  ModelSlabs grads(cfg, DType::f32), incoming(cfg, DType::f32), incoming16(cfg, DType::bf16);
  testing::random_grads(grads, 8);
  testing::random_grads(incoming, 9);
  make_compute_copy(incoming16, incoming);  // matrices bf16, vectors f32
  ModelSlabs expect(cfg, DType::f32);
  std::memcpy(expect.layer(1), grads.layer(1), grads.layout(SlabKind::layer).bytes());
  const SlabLayout& f32_layout = grads.layout(SlabKind::layer);
  const SlabLayout& bf16_layout = incoming16.layout(SlabKind::layer);
  const double got = accumulate_grad_slab(grads.layer(1), f32_layout, incoming16.layer(1), bf16_layout);
  double want = 0;
  for (const SlabEntry& e : f32_layout.entries()) {
    float* dst = reinterpret_cast<float*>(expect.layer(1) + e.offset);
    const SlabEntry& se = bf16_layout.entry(e.name);
    if (se.dtype == DType::bf16)
      want += accumulate_grad(dst, reinterpret_cast<const bf16_t*>(incoming16.layer(1) + se.offset), e.numel());
    else
      want += accumulate_grad(dst, reinterpret_cast<const float*>(incoming16.layer(1) + se.offset), e.numel());
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(std::memcmp(grads.layer(1), expect.layer(1), f32_layout.bytes()), 0);
  // Layouts of different models are refused.
  ModelConfig other = cfg;
  other.intermediate_size = 32;
  ModelSlabs wrong(other, DType::f32);
  EXPECT_THROW(accumulate_grad_slab(grads.layer(0), f32_layout, wrong.layer(0), wrong.layout(SlabKind::layer)), Error);
}

// Gradients copied straight into place (the executor's overwrite mode): the read-only sum of squares is bit for
// bit what accumulating them with overwrite returns, on every vector path, and the slab is left as it was.
TEST(Accumulate, SumOfSquaresInPlaceEqualsOverwriteOnEveryPath) {
  const ModelConfig cfg = testing::tiny_model_config();
  ModelSlabs g(cfg, DType::f32), scratch(cfg, DType::f32);
  testing::random_grads(g, 12);
  testing::random_grads(scratch, 13);
  const SlabLayout& layout = g.layout(SlabKind::layer);
  const std::vector<uint8_t> before(g.layer(0), g.layer(0) + layout.bytes());
  for (const CpuFeatures& f : forced_feature_sets()) {
    cpu_features_override(&f);
    const double in_place = grad_slab_sum_of_squares(g.layer(0), layout);
    const double copied = accumulate_grad_slab(scratch.layer(0), layout, g.layer(0), layout, GradMode::overwrite);
    EXPECT_EQ(std::memcmp(&in_place, &copied, sizeof(double)), 0);
    EXPECT_EQ(std::memcmp(g.layer(0), before.data(), before.size()), 0);
    EXPECT_EQ(std::memcmp(scratch.layer(0), before.data(), before.size()), 0);
  }
  cpu_features_override(nullptr);
}

TEST(GradNorm, PartialsInFixedOrderAndEverySlabRequired) {
  GradNormPartials p(2);
  p.set(SlabKind::layer, 1, 4.0);
  p.set(SlabKind::embedding, 0, 1.0);
  p.set(SlabKind::layer, 0, 2.0);
  EXPECT_THROW(p.sum_of_squares(), Error);  // the head is missing
  p.set(SlabKind::head, 0, 8.0);
  EXPECT_EQ(p.sum_of_squares(), 15.0);
  p.set(SlabKind::layer, 1, 0.5);  // a later accumulation replaces the earlier partial
  EXPECT_EQ(p.sum_of_squares(), 11.5);
  EXPECT_THROW(p.set(SlabKind::layer, 2, 1.0), Error);
  p.clear();
  EXPECT_THROW(p.sum_of_squares(), Error);
}

TEST(GradNorm, ClipCoefficientAsTorch) {
  EXPECT_EQ(clip_coefficient(0.5, 1.0), 1.0f);  // below max_norm: no clipping
  EXPECT_EQ(clip_coefficient(4.0, 1.0), float(1.0 / (4.0 + 1e-6)));
  EXPECT_EQ(clip_coefficient(1e30, 0.0), 1.0f);  // clipping off
  EXPECT_EQ(clip_coefficient(1.0, 1.0), float(1.0 / (1.0 + 1e-6)));  // just below 1: torch clips here too
}

// ---------------------------------------------------------------------------------------------------------
// Non-finite steps
// ---------------------------------------------------------------------------------------------------------

struct Model {
  ModelConfig cfg = testing::tiny_model_config();
  ModelSlabs params{cfg, DType::f32}, grads{cfg, DType::f32};
  Model() { init_random(params, 1, 0.5f); }
};

// Accumulates every slab of `incoming` into `grads` (overwriting) and returns the partials, as an executor does.
GradNormPartials accumulate_all(ModelSlabs& grads, const ModelSlabs& incoming) {
  GradNormPartials partials(grads.num_layers());
  auto acc = [&](SlabKind kind, int64_t layer) {
    const SlabLayout& l = grads.layout(kind);
    partials.set(kind, layer,
                 accumulate_grad_slab(grads.slab(kind, layer), l, incoming.slab(kind, layer), l, GradMode::overwrite));
  };
  acc(SlabKind::embedding, 0);
  for (int64_t i = 0; i < grads.num_layers(); ++i) acc(SlabKind::layer, i);
  acc(SlabKind::head, 0);
  return partials;
}

std::vector<uint8_t> snapshot(HybridAdamW& opt, const ModelSlabs& params) {
  std::vector<uint8_t> bytes;
  NamedTensors state;
  opt.slab_state(SlabKind::embedding).collect_state(state);
  for (int64_t i = 0; i < params.num_layers(); ++i) opt.slab_state(SlabKind::layer, i).collect_state(state);
  opt.slab_state(SlabKind::head).collect_state(state);
  for (const auto& [name, view] : state) {
    const uint8_t* p = static_cast<const uint8_t*>(view.data);
    bytes.insert(bytes.end(), p, p + view.bytes());
  }
  for (const auto& t : params.named_tensors()) {
    const uint8_t* p = static_cast<const uint8_t*>(t.view.data);
    bytes.insert(bytes.end(), p, p + t.view.bytes());
  }
  return bytes;
}

TEST(NonFiniteStep, SkipsLeavingEverythingUntouched) {
  Model m;
  HybridAdamW opt(m.params, m.grads, AdamWConfig{});
  ModelSlabs incoming(m.cfg, DType::f32);
  for (int step = 0; step < 2; ++step) {  // two good steps first, so the states are not zero
    testing::random_grads(incoming, uint64_t(10 + step));
    const StepPlan plan = opt.plan_step(accumulate_all(m.grads, incoming).sum_of_squares());
    ASSERT_FALSE(plan.skip);
    for (int64_t i = 0; i < m.params.num_layers(); ++i) opt.update(SlabKind::layer, i, {plan.step, 1e-3, plan.clip});
    opt.update(SlabKind::embedding, 0, {plan.step, 1e-3, plan.clip});
    opt.update(SlabKind::head, 0, {plan.step, 1e-3, plan.clip});
  }
  const std::vector<uint8_t> before = snapshot(opt, m.params);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    testing::random_grads(incoming, 20);
    reinterpret_cast<float*>(incoming.layer(1))[5] = bad;  // one element of one slab
    const StepPlan plan = opt.step(accumulate_all(m.grads, incoming), 1e-3);
    EXPECT_TRUE(plan.skip);
    EXPECT_FALSE(std::isfinite(plan.grad_norm));
    EXPECT_EQ(plan.step, 2);
    EXPECT_EQ(opt.steps_done(), 2);
    EXPECT_TRUE(before == snapshot(opt, m.params)) << "a skipped step changed parameters or states";
  }
  EXPECT_EQ(opt.consecutive_skips(), 2);
}

TEST(NonFiniteStep, ConsecutiveSkipsAreAnErrorAndAGoodStepResetsTheCount) {
  Model m;
  AdamWConfig cfg;
  cfg.max_consecutive_skips = 3;
  HybridAdamW opt(m.params, m.grads, cfg);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(opt.plan_step(nan).skip);
  EXPECT_TRUE(opt.plan_step(INFINITY).skip);
  EXPECT_FALSE(opt.plan_step(4.0).skip);  // a finite step: the count starts again
  EXPECT_EQ(opt.consecutive_skips(), 0);
  EXPECT_EQ(opt.steps_done(), 1);
  EXPECT_TRUE(opt.plan_step(nan).skip);
  EXPECT_TRUE(opt.plan_step(nan).skip);
  try {
    opt.plan_step(nan);
    FAIL() << "the third non-finite step in a row must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 steps in a row"), std::string::npos) << e.what();
  }
  // The clip coefficient of a good step: norm 2 (sumsq 4), max_norm 1.
  Model m2;
  HybridAdamW opt2(m2.params, m2.grads, cfg);
  const StepPlan plan = opt2.plan_step(4.0);
  EXPECT_EQ(plan.step, 1);
  EXPECT_EQ(plan.grad_norm, 2.0);
  EXPECT_EQ(plan.clip, clip_coefficient(2.0, 1.0));
}

}  // namespace
}  // namespace lt
