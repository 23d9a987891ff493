// The LM head on the CUDA kernels under cuda-sim (cross-entropy kernel, head_forward_backward's chunked
// sequence of launches and emulated cuBLASLt calls) against the CPU's fused head (ops/head.h): loss, dx,
// dnorm_w, dlm_w within f32 (f32 GEMMs) or bf16-operand (bf16 GEMMs) rounding; ignored targets; a last
// partial chunk; bitwise the same in every thread order; sentinel guards.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/rng.h"
#include "cuda/kernel_testing.h"
#include "cuda/kernels.h"
#include "cuda/layers.h"
#include "cuda/sim_orders.h"
#include "ops/head.h"

namespace lt::cuda {
namespace {

using testing::for_each_order;
using testing::Guarded;
using testing::random_floats;
using testing::to_bf16;

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 1e-30;
  for (float w : want) scale = std::max(scale, double(std::abs(w)));
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], tol * scale) << what << " element " << i;
}

TEST(CudaSimHead, CrossEntropyRowsMatchTheDefinition) {
  // V = 300: one element at a time (not a multiple of 8, nor of the 256 threads); V = 4104: packs of eight, a
  // thread taking two or three of them. Row 4 rises, so every element is a new running maximum.
  for (const int64_t V : {int64_t(300), int64_t(4104)}) {
    SCOPED_TRACE("V = " + std::to_string(V));
    const int64_t n = 5;
    auto z = random_floats(static_cast<size_t>(n * V), 1, -6.0f, 6.0f);
    for (int64_t i = 0; i < V; ++i) z[size_t(4 * V + i)] = -6.0f + 12.0f * float(i) / float(V);
    const std::vector<int32_t> targets{3, kIgnoreIndex, int32_t(V - 1), 0, int32_t(V / 2)};
    std::vector<double> want_loss(static_cast<size_t>(n));
    std::vector<float> want_grad(z.size());
    for (int64_t r = 0; r < n; ++r) {  // in double, the definition
      const float* row = z.data() + r * V;
      if (targets[size_t(r)] == kIgnoreIndex) continue;
      double m = -1e300, s = 0;
      for (int64_t i = 0; i < V; ++i) m = std::max(m, double(row[i]));
      for (int64_t i = 0; i < V; ++i) s += std::exp(double(row[i]) - m);
      want_loss[size_t(r)] = m + std::log(s) - row[targets[size_t(r)]];
      for (int64_t i = 0; i < V; ++i)
        want_grad[size_t(r * V + i)] = float(0.5 * (std::exp(double(row[i]) - m) / s - (i == targets[size_t(r)])));
    }
    std::vector<std::vector<float>> first;
    for_each_order([&] {
      // The f32 gradient in place of the logits, then the bf16 one into its own buffer (the logits kept).
      Guarded<float> logits(z), again(z);
      Guarded<bf16_t> grad_b(z.size());
      Guarded<double> loss(static_cast<size_t>(n)), loss_b(static_cast<size_t>(n)), total(1);
      total.data()[0] = 1.0;
      sim::cross_entropy(nullptr, logits.data(), nullptr, loss.data(), targets.data(), n, V, 0.5f);
      sim::cross_entropy(nullptr, again.data(), grad_b.data(), loss_b.data(), targets.data(), n, V, 0.5f);
      sim::sum_in_order(nullptr, total.data(), loss.data(), n);
      double sum = 1.0;
      for (int64_t r = 0; r < n; ++r) {
        // f64 sums of f32 exps: the loss to f32 rounding of its terms.
        EXPECT_NEAR(loss.data()[r], want_loss[size_t(r)], 1e-5 * (1 + std::abs(want_loss[size_t(r)]))) << "row " << r;
        EXPECT_EQ(loss_b.data()[r], loss.data()[r]) << "row " << r;
        sum += loss.data()[r];
      }
      EXPECT_EQ(total.data()[0], sum);  // in token order, onto what was there
      expect_close(logits.values(), want_grad, 1e-5, "dlogits");  // f32 exp and division: 1e-5 of the largest
      EXPECT_BITWISE_EQ(grad_b.values(), to_bf16(logits.values()));
      EXPECT_BITWISE_EQ(again.values(), z);
      EXPECT_TRUE(logits.guards_intact() && again.guards_intact() && grad_b.guards_intact() && loss.guards_intact() &&
                  loss_b.guards_intact() && total.guards_intact());
      if (first.empty()) first.push_back(logits.values());
      EXPECT_BITWISE_EQ(logits.values(), first[0]);
    });
  }
}

TEST(CudaSimHead, FusedHeadMatchesTheCpuHead) {
  const HeadShape shape{37, 24, 50, 1e-6f, 16};  // chunks of 16, 16, 5 tokens
  Rng rng(7);
  std::vector<int32_t> targets(static_cast<size_t>(shape.N));
  for (auto& t : targets) t = int32_t(rng.below(uint64_t(shape.V)));
  targets[3] = targets[20] = kIgnoreIndex;
  const auto x = random_floats(static_cast<size_t>(shape.N * shape.C), 8);
  const auto norm_w = random_floats(static_cast<size_t>(shape.C), 9, 0.5f, 1.5f);
  const auto lm_w = random_floats(static_cast<size_t>(shape.V * shape.C), 10, -0.5f, 0.5f);
  const auto lm_b = to_bf16(lm_w);
  const float grad_scale = 1.0f / 35.0f;
  for (const DType lm_type : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(lm_type == DType::bf16 ? "bf16 GEMMs" : "f32 GEMMs");
    const void* lm = lm_type == DType::bf16 ? static_cast<const void*>(lm_b.data()) : lm_w.data();
    std::vector<float> want_dx(x.size()), want_dnorm = random_floats(norm_w.size(), 11);
    std::vector<float> want_dlm = random_floats(lm_w.size(), 12);
    const std::vector<float> dnorm0 = want_dnorm, dlm0 = want_dlm;
    const double want_loss =
        head_forward_backward(want_dx.data(), want_dnorm.data(), want_dlm.data(), x.data(), targets.data(),
                              norm_w.data(), WeightRef{lm, lm_type}, grad_scale, shape);
    // f32: sums in other orders, 2e-6 of the largest value. bf16 GEMMs round xn and dlogits to bf16 in
    // both, but one that lies near a rounding boundary may round the other way after an f32-level
    // difference: that moves one product of a dot by 2^-8 relative, diluted over its C or V terms: 2e-3.
    const double tol = lm_type == DType::bf16 ? 2e-3 : 2e-6;
    std::vector<std::vector<float>> first;
    for_each_order([&] {
      Guarded<float> dx(x.size()), dnorm(dnorm0), dlm(dlm0);
      Guarded<double> loss(1);
      loss.data()[0] = 0.0;
      Guarded<unsigned char> workspace(head_workspace_bytes(shape, lm_type));
      HeadArgs a;
      a.dx = dx.data(), a.dnorm_w = dnorm.data(), a.dlm_w = dlm.data(), a.loss = loss.data();
      a.x = x.data(), a.targets = targets.data(), a.norm_w = norm_w.data(), a.lm_w = lm, a.lm_type = lm_type;
      a.grad_scale = grad_scale, a.shape = shape, a.workspace = workspace.data();
      sim::head_forward_backward(GemmContext{}, nullptr, a);
      EXPECT_NEAR(loss.data()[0], want_loss, (lm_type == DType::bf16 ? 1e-3 : 1e-5) * want_loss);
      expect_close(dx.values(), want_dx, tol, "dx");
      expect_close(dnorm.values(), want_dnorm, tol, "dnorm_w");
      expect_close(dlm.values(), want_dlm, tol, "dlm_w");
      EXPECT_TRUE(dx.guards_intact() && dnorm.guards_intact() && dlm.guards_intact() && loss.guards_intact() &&
                  workspace.guards_intact());
      const std::vector<std::vector<float>> now{dx.values(), dnorm.values(), dlm.values()};
      if (first.empty()) first = now;
      for (size_t i = 0; i < now.size(); ++i) EXPECT_BITWISE_EQ(now[i], first[i]);
    });
  }
}

}  // namespace
}  // namespace lt::cuda
