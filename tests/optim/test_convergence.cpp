// Convergence: least squares Y ≈ X·Wᵀ + b trained with 8-bit states for W (a 2-D matrix of 8192 elements) and
// f32 states for b, against the same run with f32 states throughout: after the same number of steps (a cosine
// schedule run to its end) the losses agree within 2%. The full pipeline runs: gradients accumulated with
// their partial sums of squares, the global norm, clipping (active early on), the fused update.
// Observed (printed): with 200 steps the runs track each other within 1% all the way. A 120-step schedule
// ends with the f32 loss still ~1.9x the noise floor and the 8-bit one 8% above it (v's quantisation error
// shows in the last, small steps), so the test runs the schedule until both reach the floor, which is what
// "reaches the same loss" asks. (A small tanh MLP was tried too: its
// losses differ by a few percent either way from trajectory to trajectory, non-convexity rather than the
// states, so it is not a stable 2% test.)
//
// Legend: N samples, I inputs, O outputs.
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
  OptimTensor w{.name = "weight", .shape = {O, I}};
  OptimTensor b{.name = "bias", .shape = {O}, .param_offset = O * I * 4};
  w.precision = choose_state_precision(cfg, w.name, w.shape);
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

}  // namespace
}  // namespace lt
