// Convergence: two small problems trained with 8-bit states for the weight matrices (>= 4096 elements) and f32
// states for the biases, against the same runs with f32 states throughout: after the same number of steps the
// losses agree within 2%. The full pipeline runs: gradients accumulated with their partial sums of squares,
// the global norm, clipping (active early on), the fused update, a cosine learning-rate schedule.
//   least squares  Y ≈ X·Wᵀ + b (convex; stopped before the noise floor, while the loss still falls)
//   MLP            Y ≈ tanh(X·W1ᵀ + b1)·W2ᵀ + b2 fitted to a teacher network of the same shape (non-convex)
//
// Legend: N samples, I inputs, H hidden units, O outputs.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "core/rng.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim_testing.h"

namespace lt {
namespace {

constexpr int64_t N = 256, I = 128, O = 64;

struct Problem {
  std::vector<float> X;  // [N, I]
  std::vector<float> Y;  // [N, O]
  Problem() : X(static_cast<size_t>(N * I)), Y(static_cast<size_t>(N * O)) {
    Rng rng(5);
    std::vector<double> W(static_cast<size_t>(O * I)), b(static_cast<size_t>(O));
    for (auto& w : W) w = 0.1 * rng.normal();
    for (auto& v : b) v = 0.1 * rng.normal();
    for (auto& x : X) x = float(rng.normal());
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < O; ++o) {
        double y = b[size_t(o)] + 0.01 * rng.normal();  // noise floor: loss 0.5 · 1e-4
        for (int64_t i = 0; i < I; ++i) y += double(X[size_t(n * I + i)]) * W[size_t(o * I + i)];
        Y[size_t(n * O + o)] = float(y);
      }
  }

  // loss = Σ (X·Wᵀ + b - Y)² / (2·N·O); writes dW [O, I] and db [O] into dgrad (W then b, as the params).
  double loss_and_grad(const float* W, const float* b, float* dW, float* db) const {
    std::vector<double> gW(static_cast<size_t>(O * I), 0.0), gb(static_cast<size_t>(O), 0.0);
    double loss = 0;
    const double scale = 1.0 / double(N * O);
    for (int64_t n = 0; n < N; ++n) {
      const float* x = X.data() + n * I;
      for (int64_t o = 0; o < O; ++o) {
        double r = b[o] - Y[size_t(n * O + o)];
        for (int64_t i = 0; i < I; ++i) r += double(x[i]) * W[o * I + i];
        loss += 0.5 * r * r * scale;
        gb[size_t(o)] += r * scale;
        for (int64_t i = 0; i < I; ++i) gW[size_t(o * I + i)] += r * scale * x[i];
      }
    }
    for (int64_t k = 0; k < O * I; ++k) dW[k] = float(gW[size_t(k)]);
    for (int64_t o = 0; o < O; ++o) db[o] = float(gb[size_t(o)]);
    return loss;
  }
};

// Trains from W = b = 0.01·noise for `steps` steps; returns the loss after each.
std::vector<double> train(const Problem& pr, StatePrecision matrix_states, int steps) {
  AdamWConfig cfg;
  cfg.matrix_states = matrix_states;
  cfg.weight_decay = 0.0;
  cfg.max_grad_norm = 0.05;
  OptimTensor w, b;
  w.name = "W";
  w.shape = {O, I};
  w.precision = choose_state_precision(cfg, w.name, w.shape);
  b.name = "b";
  b.shape = {O};
  b.param_offset = O * I * 4;
  b.precision = choose_state_precision(cfg, b.name, b.shape);
  EXPECT_EQ(w.precision, matrix_states);
  EXPECT_EQ(b.precision, StatePrecision::f32);
  AdamWSlab slab({w, b}, cfg);
  std::vector<float> params = testing::random_vector(size_t(O * I + O), 6, -0.01f, 0.01f);
  std::vector<float> grads(params.size()), incoming(params.size());
  std::vector<double> losses;
  int clipped = 0;
  for (int s = 0; s < steps; ++s) {
    losses.push_back(pr.loss_and_grad(params.data(), params.data() + O * I, incoming.data(), incoming.data() + O * I));
    const double sumsq = accumulate_grad(grads.data(), incoming.data(), O * I, GradMode::overwrite) +
                         accumulate_grad(grads.data() + O * I, incoming.data() + O * I, O, GradMode::overwrite);
    const float clip = clip_coefficient(std::sqrt(sumsq), cfg.max_grad_norm);
    clipped += clip < 1.0f;
    const double lr = 1e-4 + 0.5 * (1e-2 - 1e-4) * (1 + std::cos(M_PI * s / steps));
    slab.update(reinterpret_cast<uint8_t*>(params.data()), reinterpret_cast<const uint8_t*>(grads.data()),
                {s + 1, lr, clip});
  }
  losses.push_back(pr.loss_and_grad(params.data(), params.data() + O * I, incoming.data(), incoming.data() + O * I));
  EXPECT_GT(clipped, 0) << "clipping should be active in the first steps";
  return losses;
}

void report(const char* what, const std::vector<double>& l32, const std::vector<double>& l8) {
  const size_t steps = l32.size() - 1;
  for (size_t s : {size_t(0), steps / 8, steps / 4, steps / 2, 3 * steps / 4, steps})
    std::printf("  %s step %3zu  loss f32 %.6e  8-bit %.6e  ratio %.4f\n", what, s, l32[s], l8[s], l8[s] / l32[s]);
}

TEST(Convergence, LeastSquares8BitWithin2PercentOfF32) {
  const Problem pr;
  const int steps = 200;
  const std::vector<double> l32 = train(pr, StatePrecision::f32, steps);
  const std::vector<double> l8 = train(pr, StatePrecision::q8, steps);
  report("lsq", l32, l8);
  EXPECT_LT(l32.back(), 1e-3 * l32.front()) << "the f32 run must actually converge";
  EXPECT_NEAR(l8.back(), l32.back(), 0.02 * l32.back());
}

// ---------------------------------------------------------------------------------------------------------
// MLP
// ---------------------------------------------------------------------------------------------------------

constexpr int64_t kN = 128, kI = 32, kH = 128, kO = 32;
// Parameters, one buffer: W1 [H, I], b1 [H], W2 [O, H], b2 [O].
constexpr int64_t kW1 = 0, kB1 = kW1 + kH * kI, kW2 = kB1 + kH, kB2 = kW2 + kO * kH, kParams = kB2 + kO;

struct Mlp {
  std::vector<float> X, Y;  // [N, I], [N, O]
  Mlp() : X(static_cast<size_t>(kN * kI)), Y(static_cast<size_t>(kN * kO)) {
    Rng rng(11);
    std::vector<float> teacher(static_cast<size_t>(kParams));
    for (int64_t k = 0; k < kParams; ++k) teacher[size_t(k)] = float(rng.normal() * (k < kB1 ? 0.4 : 0.2));
    for (auto& x : X) x = float(rng.normal());
    std::vector<float> dummy(static_cast<size_t>(kParams));
    forward_backward(teacher.data(), nullptr, Y.data());
    for (auto& y : Y) y += float(0.01 * rng.normal());
  }

  // Loss Σ (out - Y)² / (2·N·O) and, when grad is not null, its gradient (all buffers [kParams]); when
  // out_only is not null, writes the outputs there instead and returns 0.
  double forward_backward(const float* p, float* grad, float* out_only = nullptr) const {
    std::vector<double> g(static_cast<size_t>(kParams), 0.0);
    double loss = 0;
    const double scale = 1.0 / double(kN * kO);
    std::vector<double> h(static_cast<size_t>(kH)), dh(static_cast<size_t>(kH));
    for (int64_t n = 0; n < kN; ++n) {
      const float* x = X.data() + n * kI;
      for (int64_t j = 0; j < kH; ++j) {
        double z = p[kB1 + j];
        for (int64_t i = 0; i < kI; ++i) z += double(p[kW1 + j * kI + i]) * x[i];
        h[size_t(j)] = std::tanh(z);
      }
      std::fill(dh.begin(), dh.end(), 0.0);
      for (int64_t o = 0; o < kO; ++o) {
        double y = p[kB2 + o];
        for (int64_t j = 0; j < kH; ++j) y += double(p[kW2 + o * kH + j]) * h[size_t(j)];
        if (out_only) {
          out_only[n * kO + o] = float(y);
          continue;
        }
        const double r = y - Y[size_t(n * kO + o)];
        loss += 0.5 * r * r * scale;
        g[size_t(kB2 + o)] += r * scale;
        for (int64_t j = 0; j < kH; ++j) {
          g[size_t(kW2 + o * kH + j)] += r * scale * h[size_t(j)];
          dh[size_t(j)] += r * scale * p[kW2 + o * kH + j];
        }
      }
      if (out_only) continue;
      for (int64_t j = 0; j < kH; ++j) {
        const double dz = dh[size_t(j)] * (1 - h[size_t(j)] * h[size_t(j)]);
        g[size_t(kB1 + j)] += dz;
        for (int64_t i = 0; i < kI; ++i) g[size_t(kW1 + j * kI + i)] += dz * x[i];
      }
    }
    if (grad)
      for (int64_t k = 0; k < kParams; ++k) grad[k] = float(g[size_t(k)]);
    return loss;
  }
};

std::vector<double> train_mlp(const Mlp& mlp, StatePrecision matrix_states, int steps) {
  AdamWConfig cfg;
  cfg.matrix_states = matrix_states;
  cfg.weight_decay = 0.01;
  cfg.max_grad_norm = 0.2;
  std::vector<OptimTensor> tensors;
  auto add = [&](const char* name, Shape shape, int64_t offset) {
    OptimTensor t;
    t.name = name;
    t.shape = std::move(shape);
    t.param_offset = offset * 4;
    t.precision = choose_state_precision(cfg, t.name, t.shape);
    tensors.push_back(t);
  };
  add("W1", {kH, kI}, kW1);
  add("b1", {kH}, kB1);
  add("W2", {kO, kH}, kW2);
  add("b2", {kO}, kB2);
  EXPECT_EQ(tensors[0].precision, matrix_states);
  EXPECT_EQ(tensors[2].precision, matrix_states);
  AdamWSlab slab(tensors, cfg);
  std::vector<float> p = testing::random_vector(size_t(kParams), 12, -0.1f, 0.1f);
  std::vector<float> grads(p.size()), incoming(p.size());
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    losses.push_back(mlp.forward_backward(p.data(), incoming.data()));
    double sumsq = 0;
    for (const OptimTensor& t : tensors)
      sumsq += accumulate_grad(grads.data() + t.param_offset / 4, incoming.data() + t.param_offset / 4, t.numel(),
                               GradMode::overwrite);
    const float clip = clip_coefficient(std::sqrt(sumsq), cfg.max_grad_norm);
    const double lr = 1e-4 + 0.5 * (1e-2 - 1e-4) * (1 + std::cos(M_PI * s / steps));
    slab.update(reinterpret_cast<uint8_t*>(p.data()), reinterpret_cast<const uint8_t*>(grads.data()),
                {s + 1, lr, clip});
  }
  losses.push_back(mlp.forward_backward(p.data(), nullptr));
  return losses;
}

TEST(Convergence, Mlp8BitWithin2PercentOfF32) {
  const Mlp mlp;
  const int steps = 600;
  const std::vector<double> l32 = train_mlp(mlp, StatePrecision::f32, steps);
  const std::vector<double> l8 = train_mlp(mlp, StatePrecision::q8, steps);
  report("mlp", l32, l8);
  EXPECT_LT(l32.back(), 0.1 * l32.front()) << "the f32 run must actually learn";
  EXPECT_NEAR(l8.back(), l32.back(), 0.02 * l32.back());
}

}  // namespace
}  // namespace lt
