// The streaming executor on the GPU layer compute (model/layer_compute.h, cuda/layers.h), run here under cuda-sim
// on the CPU device — the same host code, schedule and kernels a CUDA device runs, with cuda-sim's kernels and
// the emulated cuBLASLt calls. Every plan gives the keep-all plan's loss and gradients bit for bit (the GPU's
// exactness: there is no separate in-memory path on a GPU), memory stays within the working set's prediction,
// and the result is the CPU block's to bf16 rounding.
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "device/device.h"
#include "exec/executor.h"
#include "model/model.h"
#include "testing/exec_testing.h"

namespace lt {
namespace {

ExecOptions gpu_options(ComputeType ct) {
  ExecOptions o;
  o.kernels = LayerKernels::cuda;
  o.compute = ct;
  o.activations = DType::bf16;
  return o;
}

struct GpuRun {
  StepStats stats;
  ModelSlabs grads;
};

GpuRun run_gpu(const ModelConfig& cfg, const ModelSlabs& params, const ModelSlabs& weights, const Batch& batch,
               const Plan& plan, const ExecOptions& o, LinkSpec link, double budget_slack) {
  const size_t predicted = predict_peak_device_bytes(cfg, batch.B, batch.T, plan, o);
  const size_t budget = size_t(double(predicted) * budget_slack) + 4096;
  auto dev = make_cpu_device(budget, link);
  std::unique_ptr<NvmeStore> nvme = testing::nvme_store_for(cfg, batch, plan, o);
  StreamingExecutor ex(cfg, *dev, o, nvme.get());
  GpuRun r{{}, ModelSlabs(cfg)};
  r.stats = ex.step(r.grads, params, weights, batch, plan);
  EXPECT_LE(r.stats.peak_device_bytes, budget);
  EXPECT_EQ(r.stats.peak_device_bytes, r.stats.predicted_device_bytes);  // one block, packed as predicted
  return r;
}

TEST(CudaExecutor, EveryPolicyGivesTheKeepAllBitsAndTheCpuBlockToBf16Rounding) {
  for (uint64_t seed = 301; seed <= 304; ++seed) {  // qwen2, qwen3, llama; bf16 and f32
    Rng rng(seed);
    ModelConfig cfg = testing::random_config(rng, int(seed % 3));  // qwen2, qwen3, llama in turn
    ModelSlabs params = testing::random_params(cfg, seed * 7);
    Batch batch = testing::random_batch(cfg, rng, seed % 2 == 0);
    const ComputeType ct = seed % 4 < 2 ? ComputeType::bf16 : ComputeType::f32;
    ModelSlabs bf16(cfg, DType::bf16);
    const ModelSlabs* weights = &params;
    if (ct == ComputeType::bf16) {
      make_compute_copy(bf16, params);
      weights = &bf16;
    }
    const ExecOptions o = gpu_options(ct);
    const int64_t L = cfg.num_layers;
    const GpuRun ref = run_gpu(cfg, params, *weights, batch, Plan::keep_all(L), o, {}, 1.0);
    if (HasFailure()) return;

    // The CPU block at the same precision: the CUDA block rounds where it does but sums its GEMMs and attention
    // in another f32 order, so values differ by f32 rounding and, rarely, a bf16 rounding falls the other way
    // (2^-8 of one element) and carries on. Measured on these seeds: loss within 1e-8, gradients within 7e-7
    // relative; the bounds leave room for a few such flips, not for a wrong op.
    ModelSlabs cpu(cfg);
    const LossResult cpu_loss = model_forward_backward(cpu, params, batch, Precision(ct, DType::bf16));
    EXPECT_EQ(ref.stats.tokens, cpu_loss.tokens);
    EXPECT_NEAR(ref.stats.loss_sum, cpu_loss.loss_sum, 1e-6 * std::fabs(cpu_loss.loss_sum)) << "seed " << seed;
    EXPECT_LT(testing::relative_error(ref.grads, cpu), 1e-4) << "seed " << seed;

    const std::vector<Plan> plans = {Plan::every(L, 1), Plan::every(L, 2), Plan::every(L, 3, Tier::host),
                                     Plan::every(L, 2, Tier::nvme), testing::random_plan(L, rng), testing::random_plan(L, rng),
                                     testing::with_random_windows(Plan::every(L, 1, Tier::host), rng),
                                     testing::with_random_windows(testing::random_host_plan(L, rng), rng)};
    for (const Plan& plan : plans) {
      const std::string what = fmt::format("seed {} plan {}", seed, plan.to_json().dump());
      // A slow link on some so copies and compute overlap (an ordering bug shows as other bits).
      const LinkSpec link = seed % 2 == 1 ? LinkSpec{1.0 + double(seed % 3), 2.0, 20e-6} : LinkSpec{};
      const GpuRun r = run_gpu(cfg, params, *weights, batch, plan, o, link, 1.0);
      EXPECT_EQ(r.stats.loss_sum, ref.stats.loss_sum) << what;
      testing::expect_bitwise_equal(r.grads, ref.grads, what);
      if (HasFatalFailure()) return;
    }
  }
}

// The CUDA block's MLP in token chunks (BlockShape::mlp_rows): the one-chunk keep-all bits under every kind of plan.
TEST(CudaExecutor, ChunkedMlpGivesTheOneChunkBits) {
  Rng rng(401);
  ModelConfig cfg = testing::random_config(rng, 1);
  cfg.num_layers = 3;
  cfg.max_position_embeddings = 8192;
  ModelSlabs params = testing::random_params(cfg, 401);
  ModelSlabs bf16(cfg, DType::bf16);
  make_compute_copy(bf16, params);
  Batch batch;
  batch.B = 1;
  batch.T = kTokenSlice + 37;
  for (int64_t i = 0; i < batch.N(); ++i) batch.input_ids.push_back(int32_t(rng.below(uint64_t(cfg.vocab_size))));
  batch.labels = batch.input_ids;
  batch.labels[0] = kIgnoreIndex;
  const ExecOptions whole = gpu_options(ComputeType::bf16);
  ExecOptions chunked = whole;
  chunked.mlp_chunk_tokens = kTokenSlice;
  const int64_t L = cfg.num_layers;
  const GpuRun ref = run_gpu(cfg, params, bf16, batch, Plan::keep_all(L), whole, {}, 1.0);
  for (const Plan& plan : {Plan::keep_all(L), Plan::every(L, 1), Plan::every(L, 2, Tier::host)}) {
    const GpuRun r = run_gpu(cfg, params, bf16, batch, plan, chunked, {}, 1.0);
    EXPECT_EQ(r.stats.loss_sum, ref.stats.loss_sum) << plan.name;
    testing::expect_bitwise_equal(r.grads, ref.grads, plan.name + " (chunked)");
  }
  EXPECT_LT(plan_working_set(cfg, batch.B, batch.T, Plan::keep_all(L), chunked).buffer("block scratch").bytes,
            plan_working_set(cfg, batch.B, batch.T, Plan::keep_all(L), whole).buffer("block scratch").bytes);
}

TEST(CudaExecutor, RefusesF32ActivationsAndBadTokensWithTheReason) {
  Rng rng(501);
  ModelConfig cfg = testing::random_config(rng, 0);
  ModelSlabs params = testing::random_params(cfg, 501);
  Batch batch = testing::random_batch(cfg, rng, false);
  ExecOptions f32_storage = gpu_options(ComputeType::f32);
  f32_storage.activations = DType::f32;
  auto dev = make_cpu_device(size_t(256) << 20);
  const Plan plan = Plan::keep_all(cfg.num_layers);
  try {
    StreamingExecutor ex(cfg, *dev, f32_storage);
    ModelSlabs grads(cfg);
    ex.step(grads, params, params, batch, plan);
    FAIL() << "f32 activation storage on the CUDA block was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the CUDA block stores bf16 activations"), std::string::npos) << e.what();
  }
  Batch bad = batch;
  bad.labels[1] = int32_t(cfg.vocab_size);  // the kernels would read past the logits row
  try {
    StreamingExecutor ex(cfg, *dev, gpu_options(ComputeType::f32));
    ModelSlabs grads(cfg);
    ex.step(grads, params, params, bad, plan);
    FAIL() << "a target outside the vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("target {} is outside the vocabulary", cfg.vocab_size)),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace lt
