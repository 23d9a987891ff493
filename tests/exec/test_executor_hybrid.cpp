// The streaming executor on Qwen3.5 hybrids (Gated DeltaNet and gated-attention layers, whose slabs and internals
// differ in size): every plan gives the in-memory path's loss and gradients bit for bit, and its measured peak is
// the predicted one — on the CPU block, and on the CUDA block (cuda/layers/block.inl under cuda-sim).
#include <cmath>
#include <string>

#include "core/error.h"
#include "core/rng.h"
#include "device/device.h"
#include "exec/executor.h"
#include "io/nvme.h"
#include "model/model.h"
#include "testing/exec_testing.h"

namespace lt {
namespace {

using testing::expect_bitwise_equal;
using testing::nvme_store_for;
using testing::random_batch;
using testing::random_host_plan;
using testing::random_hybrid_config;
using testing::random_params;
using testing::random_plan;
using testing::with_random_windows;

// A batch whose rows cross the delta rule's chunk of 64 (the carried state), packed or not.
Batch long_batch(const ModelConfig& cfg, Rng& rng, bool packed) {
  Batch b = random_batch(cfg, rng, packed);
  if (rng.below(2) == 0) return b;
  Batch l;
  l.B = 1;
  l.T = 70 + int64_t(rng.below(30));
  for (int64_t t = 0; t < l.T; ++t) l.input_ids.push_back(int32_t(rng.below(uint64_t(cfg.vocab_size))));
  l.labels = l.input_ids;
  l.labels[0] = kIgnoreIndex;
  if (packed) {
    const int64_t split = 66;  // the second document starts inside the first chunk's successor
    for (int64_t t = 0; t < l.T; ++t) {
      l.positions.push_back(int32_t(t < split ? t : t - split));
      l.doc_ids.push_back(t < split ? 0 : 1);
    }
    l.labels[size_t(split)] = kIgnoreIndex;
  }
  return l;
}

// Seeds [first, last]: a third with bf16 GEMMs, half packed, half through a slow link.
void every_policy_matches(uint64_t first, uint64_t last, DType activations) {
  for (uint64_t seed = first; seed <= last; ++seed) {
    Rng rng(seed * 1009);
    const ModelConfig cfg = random_hybrid_config(rng);
    const ModelSlabs params = random_params(cfg, seed * 7);
    const Batch batch = long_batch(cfg, rng, seed % 2 == 0);
    const ComputeType ct = seed % 3 == 0 ? ComputeType::bf16 : ComputeType::f32;
    testing::expect_every_plan_matches(cfg, params, batch, Precision(ct, activations), rng, seed);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(ExecutorHybrid, EveryPolicyMatchesInMemoryPathBitwise) { every_policy_matches(1, 6, DType::f32); }

// bf16 activation storage: the boundaries and each layer's kept internals bf16 (a Gated DeltaNet layer's mixer
// activations too), their statistics and gates f32; a kept layer widens what it stored, a recomputed one rounds
// as the forward did: the same bits either way.
TEST(ExecutorHybrid, EveryPolicyMatchesInMemoryPathBitwiseWithBf16Activations) {
  every_policy_matches(7, 12, DType::bf16);
}

// The CUDA block on hybrids (bf16 storage, as the GPU stores): every plan the keep-all bits with the predicted
// peak, and the CPU block's results to the rounding of the delta rule's sums (cuda/kernels/gated_delta.cuh sums
// in another order than the CPU op's GEMMs; a bf16 rounding that then falls the other way carries on).
TEST(ExecutorHybrid, TheCudaBlockGivesTheKeepAllBitsUnderEveryPlanAndTheCpuBlockToRounding) {
  for (uint64_t seed = 21; seed <= 24; ++seed) {
    Rng rng(seed * 1009);
    const ModelConfig cfg = random_hybrid_config(rng);
    const ModelSlabs params = random_params(cfg, seed * 7);
    const Batch batch = long_batch(cfg, rng, seed % 2 == 0);
    const ComputeType ct = seed % 4 < 2 ? ComputeType::bf16 : ComputeType::f32;
    const testing::CudaBlockSteps steps(cfg, params, batch, ct);
    const int64_t L = cfg.num_layers;
    auto run = [&](const Plan& plan, LinkSpec link, ModelSlabs& grads) {
      return steps.run(plan, link, grads, "seed " + std::to_string(seed));
    };
    ModelSlabs ref_grads(cfg);
    const StepStats ref = run(Plan::keep_all(L), LinkSpec{}, ref_grads);
    ModelSlabs cpu(cfg);
    const LossResult cpu_loss = model_forward_backward(cpu, params, batch, Precision(ct, DType::bf16));
    EXPECT_EQ(ref.tokens, cpu_loss.tokens);
    // Measured on these seeds: loss within 1e-8 relative, gradients within 7.7e-6 (over all tensors); the bounds
    // leave room for a few more bf16 flips, not for a wrong op.
    EXPECT_NEAR(ref.loss_sum, cpu_loss.loss_sum, 1e-6 * std::fabs(cpu_loss.loss_sum)) << "seed " << seed;
    EXPECT_LT(testing::relative_error(ref_grads, cpu), 1e-4) << "seed " << seed;
    const std::vector<Plan> plans = {Plan::every(L, 1), Plan::every(L, 2, Tier::host), Plan::every(L, 1, Tier::nvme),
                                     random_plan(L, rng), with_random_windows(random_host_plan(L, rng), rng)};
    for (const Plan& plan : plans) {
      const std::string what = "seed " + std::to_string(seed) + " plan " + plan.to_json().dump();
      ModelSlabs grads(cfg);
      const StepStats st = run(plan, seed % 2 ? LinkSpec{2.0, 2.0, 20e-6} : LinkSpec{}, grads);
      EXPECT_EQ(st.loss_sum, ref.loss_sum) << what;
      expect_bitwise_equal(grads, ref_grads, what);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

}  // namespace
}  // namespace lt
