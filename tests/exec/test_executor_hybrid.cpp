// The streaming executor on Qwen3.5 hybrids (Gated DeltaNet and gated-attention layers, whose slabs and internals
// differ in size): every plan gives the in-memory path's loss and gradients bit for bit, and its measured peak is
// the predicted one; the GPU block refuses them by name.
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
    const Precision precision(ct, activations);
    ModelSlabs bf16(cfg, DType::bf16);
    const ModelSlabs* weights = &params;
    if (ct == ComputeType::bf16) {
      make_compute_copy(bf16, params);
      weights = &bf16;
    }
    ModelSlabs ref_grads(cfg);
    const LossResult ref = model_forward_backward(ref_grads, params, batch, precision);
    const int64_t L = cfg.num_layers;
    const std::vector<Plan> plans = {Plan::keep_all(L), Plan::every(L, 1), Plan::every(L, 2),
                                     Plan::every(L, 2, Tier::host), Plan::every(L, 1, Tier::nvme),
                                     random_plan(L, rng), random_plan(L, rng),
                                     with_random_windows(random_host_plan(L, rng), rng)};
    for (const Plan& plan : plans) {
      const std::string what = "seed " + std::to_string(seed) + " activations " + std::string(dtype_name(activations)) +
                               " plan " + plan.to_json().dump();
      ExecOptions o;
      o.compute = ct;
      o.activations = activations;
      const size_t predicted = predict_peak_device_bytes(cfg, batch.B, batch.T, plan, o);
      // Just the predicted bytes: a buffer sized for the wrong layer kind would overflow or be refused.
      auto dev = make_cpu_device(predicted + 4096, seed % 2 ? LinkSpec{2.0, 2.0, 20e-6} : LinkSpec{});
      std::unique_ptr<NvmeStore> nvme = nvme_store_for(cfg, batch, plan, o);
      StreamingExecutor ex(cfg, *dev, o, nvme.get());
      ModelSlabs grads(cfg);
      const StepStats st = ex.step(grads, params, *weights, batch, plan);
      EXPECT_EQ(st.loss_sum, ref.loss_sum) << what;
      EXPECT_EQ(st.tokens, ref.tokens) << what;
      expect_bitwise_equal(grads, ref_grads, what);
      EXPECT_EQ(st.peak_device_bytes, predicted) << what;
      if (::testing::Test::HasFailure()) return;
    }
  }
}

TEST(ExecutorHybrid, EveryPolicyMatchesInMemoryPathBitwise) { every_policy_matches(1, 6, DType::f32); }

// bf16 activation storage: the boundaries and each layer's kept internals bf16 (a Gated DeltaNet layer's mixer
// activations too), their statistics and gates f32; a kept layer widens what it stored, a recomputed one rounds
// as the forward did: the same bits either way.
TEST(ExecutorHybrid, EveryPolicyMatchesInMemoryPathBitwiseWithBf16Activations) {
  every_policy_matches(7, 12, DType::bf16);
}

TEST(ExecutorHybrid, TheGpuBlockRefusesQwen35LayersByName) {
  Rng rng(5);
  const ModelConfig cfg = random_hybrid_config(rng);
  ExecOptions o;
  o.kernels = LayerKernels::gpu;
  o.activations = DType::bf16;
  auto dev = make_cpu_device(size_t(1) << 30, LinkSpec{});
  try {
    StreamingExecutor ex(cfg, *dev, o, nullptr);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the GPU block"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("qwen3_5"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lt
