// The optimizer pipelined into the next step's forward gives the same parameters, bit for bit, as the
// plain loop: in-memory gradients, then the whole update, then the next step.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "core/rng.h"
#include "device/device.h"
#include "exec/executor.h"
#include "model/model.h"
#include "ops/head.h"
#include "testing/model_testing.h"

namespace lt {
namespace {

ModelConfig small_config(bool tied, ModelType type) {
  return testing::small_model_config(type, {.vocab = 53, .intermediate = 48, .layers = 3, .tied = tied,
                                            .max_positions = 128});
}

Batch random_batch(const ModelConfig& cfg, uint64_t seed) {
  Rng rng(seed);
  Batch b;
  b.B = 2;
  b.T = 11;
  for (int64_t i = 0; i < b.N(); ++i) b.input_ids.push_back(int32_t(rng.below(uint64_t(cfg.vocab_size))));
  b.labels = b.input_ids;
  b.labels[0] = kIgnoreIndex;
  return b;
}

// The plain loop's partial norms, with the same functions the executor uses.
GradNormPartials reference_partials(const ModelSlabs& grads) {
  const ModelConfig& cfg = grads.config();
  GradNormPartials p(cfg.num_layers);
  auto slab_partial = [&](SlabKind kind, int64_t layer) {
    const SlabLayout& l = grads.layout(kind);
    AlignedBuffer<uint8_t> scratch(l.bytes());
    return accumulate_grad_slab(scratch.data(), l, grads.slab(kind, layer), l, GradMode::overwrite);
  };
  for (int64_t l = 0; l < cfg.num_layers; ++l) p.set(SlabKind::layer, l, slab_partial(SlabKind::layer, l));
  p.set(SlabKind::head, 0, slab_partial(SlabKind::head, 0));
  TensorView emb = grads.tensor(SlabKind::embedding, 0, "embed_tokens.weight");
  p.set(SlabKind::embedding, 0, grad_sum_of_squares(emb.ptr<float>(), emb.numel()));
  return p;
}

struct Case {
  bool tied;
  ModelType type;
  ComputeType compute;
  const char* policy;
};

class Pipeline : public ::testing::TestWithParam<Case> {};

TEST_P(Pipeline, PipelinedUpdateEqualsPlainLoopBitwise) {
  const Case c = GetParam();
  ModelConfig cfg = small_config(c.tied, c.type);
  const int64_t L = cfg.num_layers;
  const bool bf16 = c.compute == ComputeType::bf16;
  AdamWConfig ocfg;
  ocfg.max_grad_norm = 0.5;  // small enough that clipping engages
  ocfg.min_q8_numel = 256;   // so the small matrices get 8-bit states
  const double lr = 3e-3;
  const int steps = 3;

  ModelSlabs p_ref(cfg), p_str(cfg), g_ref(cfg), g_str(cfg);
  init_random(p_ref, 7, 0.1f);
  init_random(p_str, 7, 0.1f);
  ModelSlabs copy_ref(cfg, DType::bf16), copy_str(cfg, DType::bf16);
  make_compute_copy(copy_str, p_str);

  // The plain loop.
  HybridAdamW opt_ref(p_ref, g_ref, ocfg);
  std::vector<double> loss_ref;
  for (int k = 0; k < steps; ++k) {
    g_ref.zero();
    loss_ref.push_back(model_forward_backward(g_ref, p_ref, random_batch(cfg, 100 + uint64_t(k)), c.compute).loss_sum);
    StepPlan plan = opt_ref.plan_step(reference_partials(g_ref).sum_of_squares());
    ASSERT_FALSE(plan.skip);
    opt_ref.update_all(StepArgs{plan.step, lr, plan.clip}, bf16 ? &copy_ref : nullptr);
  }

  // The streamed loop: each step's forward runs the previous step's update slab by slab.
  HybridAdamW opt_str(p_str, g_str, ocfg);
  auto dev = make_cpu_device(size_t(256) << 20, LinkSpec{4.0, 4.0, 10e-6});
  ExecOptions eo;
  eo.compute = c.compute;
  StreamingExecutor ex(cfg, *dev, eo);
  Plan plan = Plan::parse(c.policy, L);
  std::optional<PendingUpdate> pending;
  for (int k = 0; k < steps; ++k) {
    GradNormPartials partials(L);
    TraceRecorder trace;
    StepStats st = ex.step(g_str, p_str, bf16 ? copy_str : p_str, random_batch(cfg, 100 + uint64_t(k)), plan, &trace,
                           pending ? &*pending : nullptr, GradTarget{&partials, GradMode::overwrite});
    EXPECT_EQ(st.loss_sum, loss_ref[size_t(k)]) << "step " << k;
    // The update runs on its own lane: every slab (L layers, head; the embedding in two parts: the rows this
    // batch looks up, before the lookup, and the others after the layers') there, none on the host lane.
    int on_optimizer = 0;
    double batch_rows_end = -1, lookup_start = -2, other_rows_start = -1, last_layer_end = -1;
    for (const OpRecord& op : trace.ops()) {
      on_optimizer += op.lane == "optimizer" && op.name.rfind("update", 0) == 0;
      EXPECT_FALSE(op.lane == "host" && op.name.rfind("update", 0) == 0) << op.name;
      if (op.name == "update embedding (batch rows)") batch_rows_end = op.end;
      if (op.name == "update embedding (other rows)") other_rows_start = op.start;
      if (op.name == fmt::format("update L{}", L - 1)) last_layer_end = op.end;
      if (op.name == "fwd L0") lookup_start = op.start;  // after the lookup (the issuing thread's, untraced)
    }
    EXPECT_EQ(on_optimizer, k == 0 ? 0 : int(L) + 3) << "step " << k;
    if (k > 0) {
      EXPECT_GE(batch_rows_end, 0) << "step " << k;
      EXPECT_GE(other_rows_start, last_layer_end) << "step " << k;
      EXPECT_LE(batch_rows_end, lookup_start) << "step " << k;
    }
    EXPECT_EQ(st.summary.optimizer_s > 0, k > 0) << "step " << k;
    StepPlan sp = opt_str.plan_step(partials.sum_of_squares());
    pending = PendingUpdate{&opt_str, StepArgs{sp.step, lr, sp.clip}, bf16 ? &copy_str : nullptr};
  }
  opt_str.update_all(pending->args, pending->compute_copy);

  auto A = p_ref.named_tensors(), B = p_str.named_tensors();
  for (size_t t = 0; t < A.size(); ++t)
    ASSERT_EQ(0, std::memcmp(A[t].view.data, B[t].view.data, A[t].view.bytes())) << A[t].hf_name;
  if (bf16) {  // the streamed bf16 copy, written by the fused update, is the RNE rounding of the masters
    make_compute_copy(copy_ref, p_ref);
    auto X = copy_ref.named_tensors(), Y = copy_str.named_tensors();
    for (size_t t = 0; t < X.size(); ++t)
      ASSERT_EQ(0, std::memcmp(X[t].view.data, Y[t].view.data, X[t].view.bytes())) << X[t].hf_name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, Pipeline,
    ::testing::Values(Case{false, ModelType::qwen2, ComputeType::f32, "every:2"},
                      Case{true, ModelType::qwen3, ComputeType::f32, "keep-all"},
                      Case{true, ModelType::qwen3, ComputeType::bf16, "host:2"},
                      Case{false, ModelType::llama, ComputeType::bf16, "every:1"}),
    [](const auto& info) {
      std::string name = std::string(model_type_name(info.param.type)) + (info.param.tied ? "_tied_" : "_") +
                         (info.param.compute == ComputeType::bf16 ? "bf16_" : "f32_") + info.param.policy;
      for (char& ch : name)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return name;
    });

}  // namespace
}  // namespace lt
