// f32 AdamW against torch.optim.AdamW (Debian's torch, single-tensor path) over 10 steps, with and without
// torch.nn.utils.clip_grad_norm_ first; the vector paths against the plain kernel bit for bit; the bf16 copy.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/parallel.h"
#include "core/rng.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/kernels.h"
#include "optim_testing.h"

namespace lt {
namespace {

struct TorchCase {
  std::vector<int64_t> sizes = {1000, 37, 4099, 1, 333};
  int steps = 10;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  double max_grad_norm = 0;  // 0: no clipping
  double lr(int s) const { return 1e-3 * (1.0 - 0.05 * s); }  // a schedule: lr changes every step
};

struct Ours {
  std::vector<float> out;    // params, m, v concatenated, as the script writes them
  std::vector<float> clips;  // the clip coefficient of each step
};

// Our side: one AdamWSlab over the tensors (f32 states), gradients accumulated by accumulate_grad, whose
// partials give the norm and the clip coefficient.
Ours run_ours(const TorchCase& c, const std::vector<float>& input, VectorPath path) {
  const int64_t total = [&] { int64_t t = 0; for (int64_t n : c.sizes) t += n; return t; }();
  AdamWConfig cfg;
  cfg.beta1 = c.beta1;
  cfg.beta2 = c.beta2;
  cfg.eps = c.eps;
  cfg.weight_decay = c.weight_decay;
  cfg.max_grad_norm = c.max_grad_norm;
  std::vector<OptimTensor> tensors;
  int64_t at = 0;
  for (size_t i = 0; i < c.sizes.size(); ++i) {
    OptimTensor t;
    t.name = fmt::format("p{}", i);
    t.shape = {c.sizes[i]};
    t.param_offset = at * 4;
    t.precision = StatePrecision::f32;
    tensors.push_back(t);
    at += c.sizes[i];
  }
  AdamWSlab slab(tensors, cfg);
  std::vector<float> p(input.begin(), input.begin() + total), grad(static_cast<size_t>(total));
  std::vector<float> clips;
  for (int s = 0; s < c.steps; ++s) {
    const float* g = input.data() + total * (1 + s);
    double sumsq = 0;
    for (const OptimTensor& t : tensors)
      sumsq += accumulate_grad(grad.data() + t.param_offset / 4, g + t.param_offset / 4, t.numel(), GradMode::overwrite);
    const float clip = clip_coefficient(std::sqrt(sumsq), c.max_grad_norm);
    if (c.max_grad_norm > 0) {
      EXPECT_LT(clip, 0.1f) << "the case should clip";
    }
    clips.push_back(clip);
    slab.update(reinterpret_cast<uint8_t*>(p.data()), reinterpret_cast<const uint8_t*>(grad.data()),
                {s + 1, c.lr(s), clip}, nullptr, path);
  }
  std::vector<float> out = p;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const AdamWSlab::TensorState st = slab.state(i);
    out.insert(out.end(), st.m, st.m + tensors[i].numel());
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const AdamWSlab::TensorState st = slab.state(i);
    out.insert(out.end(), st.v, st.v + tensors[i].numel());
  }
  return {out, clips};
}

void compare_with_torch(const TorchCase& c) {
  int64_t total = 0;
  for (int64_t n : c.sizes) total += n;
  // Initial parameters in [-1, 1); gradients N(0, 1) scaled per step, never zero.
  std::vector<float> input = testing::random_vector(size_t(total), 42);
  Rng rng(43);
  for (int s = 0; s < c.steps; ++s)
    for (int64_t i = 0; i < total; ++i) input.push_back(float(rng.normal() * (0.5 + 0.1 * s) + 1e-4));
  testing::TempDir dir;
  testing::write_f32(dir.file("input.bin"), input);
  nlohmann::json j = {{"sizes", c.sizes}, {"steps", c.steps}, {"beta1", c.beta1}, {"beta2", c.beta2},
                      {"eps", c.eps}, {"weight_decay", c.weight_decay}};
  std::vector<double> lrs;
  for (int s = 0; s < c.steps; ++s) lrs.push_back(c.lr(s));
  j["lr"] = lrs;
  j["max_grad_norm"] = c.max_grad_norm > 0 ? nlohmann::json(c.max_grad_norm) : nlohmann::json(nullptr);
  std::ofstream(dir.file("case.json")) << j.dump();
  ASSERT_TRUE(testing::run_torch_reference("adamw --case " + dir.str()));
  const std::vector<float> ref = testing::read_f32(dir.file("torch.bin"));
  ASSERT_EQ(ref.size(), size_t(3 * total));
  for (VectorPath path : testing::available_paths()) {
    const Ours ours = run_ours(c, input, path);
    // Relative 1e-6 per element, against a floor where the result is a small difference of larger terms:
    //  param: 1e-3 of the largest |p| (p near 0 is p0 plus updates of size lr ~ 1e-3 whose ulps differ);
    //  exp_avg: its terms' magnitude Σ_s (1-β1) β1^(S-1-s) |g_s · clip_s| (with clipping our f64 norm gives a
    //    coefficient a few f32 ulps from torch's f32 norm, and m = Σ of ±terms can cancel far below them);
    //  exp_avg_sq: a sum of positive terms, no floor.
    float p_scale = 0;
    for (int64_t i = 0; i < total; ++i) p_scale = std::max(p_scale, std::fabs(ref[size_t(i)]));
    std::vector<double> m_terms(static_cast<size_t>(total), 0.0);
    for (int s = 0; s < c.steps; ++s)
      for (int64_t i = 0; i < total; ++i)
        m_terms[size_t(i)] += (1 - c.beta1) * std::pow(c.beta1, c.steps - 1 - s) *
                              std::fabs(double(input[size_t(total * (1 + s) + i)]) * ours.clips[size_t(s)]);
    const char* what[3] = {"param", "exp_avg", "exp_avg_sq"};
    for (int k = 0; k < 3; ++k) {
      double worst = 0;
      for (int64_t i = 0; i < total; ++i) {
        const double a = ours.out[size_t(k * total + i)], b = ref[size_t(k * total + i)];
        const double floor = k == 0 ? 1e-3 * p_scale : k == 1 ? m_terms[size_t(i)] : 0.0;
        const double rel = std::fabs(a - b) / std::max(std::fabs(b), floor);
        worst = std::max(worst, rel);
        ASSERT_LE(rel, 1e-6) << what[k] << " element " << i << ": ours " << a << ", torch " << b << " (path "
                             << vector_path_name(path) << ")";
      }
      std::printf("  %-10s %-6s worst relative difference from torch %.2e\n", what[k], vector_path_name(path), worst);
    }
  }
}

TEST(AdamW32, MatchesTorchAdamW) { compare_with_torch(TorchCase{}); }

TEST(AdamW32, MatchesTorchClipGradNormThenAdamW) {
  TorchCase c;
  c.max_grad_norm = 1.0;
  compare_with_torch(c);
}

TEST(AdamW32, VectorPathsGiveThePlainBits) {
  for (int64_t n : {1, 7, 8, 9, 15, 16, 17, 31, 33, 1000, 4099}) {
    const std::vector<float> p0 = testing::random_vector(size_t(n), 1), g = testing::random_vector(size_t(n), 2, -3, 3);
    const std::vector<float> m0 = testing::random_vector(size_t(n), 3, -0.1f, 0.1f);
    const std::vector<float> v0 = testing::random_vector(size_t(n), 4, 1e-9f, 1e-2f);
    std::vector<float> ref_p;
    std::vector<bf16_t> ref_copy;
    for (VectorPath path : testing::available_paths()) {
      std::vector<float> p = p0, m = m0, v = v0;
      std::vector<bf16_t> copy(static_cast<size_t>(n));
      for (int64_t step = 1; step <= 3; ++step)
        adamw32(path, {p.data(), g.data(), m.data(), v.data(), copy.data(), n},
                adamw_scalars(1e-3, 0.9, 0.95, 1e-8, 0.1, step, step == 2 ? 0.5f : 1.0f));
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(copy[size_t(i)], f32_to_bf16(p[size_t(i)])) << "bf16 copy";
      if (path == VectorPath::plain) {
        ref_p = p;
        ref_copy = copy;
      } else {
        EXPECT_TRUE(testing::bits_equal(p, ref_p)) << vector_path_name(path) << " n=" << n;
        EXPECT_TRUE(testing::bits_equal(copy, ref_copy)) << vector_path_name(path) << " n=" << n;
      }
    }
  }
}

TEST(AdamW32, ScalarsAsTorchComputesThem) {
  // Python floats (double) for 1 - lr·wd, bias corrections and the step size, rounded to f32 when applied.
  const AdamWScalars s = adamw_scalars(3e-4, 0.9, 0.999, 1e-8, 0.1, 5, 0.25f);
  EXPECT_EQ(s.decay, float(1.0 - 3e-4 * 0.1));
  EXPECT_EQ(s.one_minus_beta2, float(1.0 - 0.999));
  EXPECT_EQ(s.neg_step_size, float(-(3e-4 / (1.0 - std::pow(0.9, 5.0)))));
  EXPECT_EQ(s.bc2_sqrt, float(std::sqrt(1.0 - std::pow(0.999, 5.0))));
  EXPECT_EQ(s.clip, 0.25f);
  EXPECT_THROW(adamw_scalars(1e-3, 0.9, 0.999, 1e-8, 0, 0, 1.0f), Error);
}

}  // namespace
}  // namespace lt
