// Freeze and LoRA fine-tuning (model/finetune.h, model/lora.h) on the in-memory path and the streaming executor: the
// trained tensors' gradients are bit for bit the full run's (freeze), every plan gives the in-memory path's bits with
// the predicted peak (freeze and LoRA, dropout included), a frozen tensor moves no gradient (the schedule downloads and
// adds only trained bytes), and LLaMA-Factory's selection rules.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "core/error.h"
#include "core/rng.h"
#include "exec/step_schedule.h"
#include "model/finetune.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "testing/error_testing.h"
#include "testing/exec_testing.h"

namespace lt {
namespace {

using testing::random_batch;
using testing::random_params;

// A random freeze for `cfg`: the last or the first n layers, every module or a random non-empty subset of the
// model's, each extra module with probability 1/2.
std::shared_ptr<const Finetune> random_freeze(const ModelConfig& cfg, Rng& rng) {
  const int64_t L = cfg.num_layers;
  int64_t n = 1 + int64_t(rng.below(uint64_t(L)));
  if (rng.below(2)) n = -n;
  std::vector<std::string> modules = {"all"};
  if (rng.below(2)) {
    std::set<std::string> have;
    for (int64_t l = 0; l < L; ++l)
      for (const SlabLayout layout = SlabLayout::make_layer(cfg, l); const SlabEntry& e : layout.entries())
      have.insert(layer_module(e.name));
    modules.clear();
    for (const std::string& m : have)
      if (rng.below(2)) modules.push_back(m);
    if (modules.empty()) modules.push_back(*have.begin());
  }
  std::vector<std::string> extra;
  for (const char* m : {"embed_tokens", "norm", "lm_head"})
    if (rng.below(2) && !(cfg.tie_word_embeddings && std::string(m) == "lm_head")) extra.push_back(m);
  return std::make_shared<const Finetune>(make_freeze(cfg, n, modules, extra));
}

// The frozen tensors as a bf16 checkpoint holds them (the streamed weights keep them so in bf16 compute).
void round_frozen_to_bf16(ModelSlabs& params) {
  const ModelConfig& cfg = params.config();
  auto round = [&](SlabKind kind, int64_t layer) {
    for (const SlabEntry& e : params.layout(kind, layer).entries()) {
      if (cfg.trains(kind, layer, e.name)) continue;
      float* p = params.tensor(kind, layer, e.name).ptr<float>();
      for (int64_t i = 0; i < e.numel(); ++i) p[i] = round_to_bf16(p[i]);
    }
  };
  round(SlabKind::embedding, 0);
  for (int64_t l = 0; l < cfg.num_layers; ++l) round(SlabKind::layer, l);
  round(SlabKind::head, 0);
}

// LoRA's seeds 6 mod 8 take a Qwen3.5-MoE hybrid (adapters on its shared expert and gate too).
ModelConfig config_for(uint64_t seed, Rng& rng, bool lora) {
  switch (seed % 4) {
    case 0: return testing::random_config(rng);
    case 1: return testing::random_hybrid_config(rng);
    case 2: return lora && seed % 8 == 6 ? testing::random_hybrid_moe_config(rng) : testing::random_moe_config(rng);
    default: return testing::random_gpt_oss_config(rng);
  }
}

// A random LoRA for `cfg`: odd ranks, all or a random subset of the linears, rsLoRA half the time, dropout a third
// of the time, an additional target half the time.
std::shared_ptr<const Finetune> random_lora(const ModelConfig& cfg, Rng& rng) {
  std::vector<std::string> have, targets;
  for (int64_t l = 0; l < cfg.num_layers; ++l)
    for (const auto& [prefix, name] : adaptable_linears(cfg, l))
      if (std::find(have.begin(), have.end(), name) == have.end()) have.push_back(name);
  if (rng.below(2)) {
    targets = {"all"};
  } else {
    for (const std::string& n : have)
      if (rng.below(2)) targets.push_back(n);
    if (targets.empty()) targets.push_back(have.back());
  }
  std::vector<std::string> extra;
  if (rng.below(2)) extra.push_back(rng.below(2) ? "norm" : "embed_tokens");
  const int64_t r = 1 + 2 * int64_t(rng.below(3));  // 1, 3, 5
  return std::make_shared<const Finetune>(make_lora(cfg, r, 0.5 + double(rng.below(16)), rng.below(3) == 0 ? 0.2 : 0.0,
                                                    rng.below(2) == 0, targets, extra));
}

struct Case {
  ModelConfig cfg;  // with its freeze
  ModelSlabs params;
  Batch batch;
  Precision precision;
};

// `lora`: a random LoRA (the base and the adapters random: B is not zero, so the adapters count), else a freeze.
Case make_case(uint64_t seed, bool lora = false) {
  Rng rng(seed * 7919);
  Case c;
  c.cfg = config_for(seed, rng, lora);
  c.cfg.finetune = lora ? random_lora(c.cfg, rng) : random_freeze(c.cfg, rng);
  c.params = random_params(c.cfg, seed * 31);
  c.batch = random_batch(c.cfg, rng, seed % 2 == 0);
  c.batch.dropout_key = rng.next_u64();
  c.precision = Precision(seed % 3 == 0 ? ComputeType::f32 : ComputeType::bf16,
                          seed % 5 < 2 ? DType::f32 : DType::bf16);
  if (c.precision.compute == ComputeType::bf16) round_frozen_to_bf16(c.params);
  return c;
}

// The frozen tensors change nothing but which gradients are made: the trained ones are the full run's bits.
TEST(Freeze, TrainedGradientsAreTheFullRunsBitwise) {
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    const Case c = make_case(seed, false);
    const std::string what = "seed " + std::to_string(seed) + ": " + c.cfg.finetune->summary(c.cfg);
    ModelConfig full_cfg = c.cfg;
    full_cfg.finetune = nullptr;
    ModelSlabs full(full_cfg);
    const LossResult ref = model_forward_backward(full, c.params, c.batch, c.precision);
    ModelSlabs frozen(c.cfg, DType::f32, Fill::zero, SlabSet::trained);
    const LossResult got = model_forward_backward(frozen, c.params, c.batch, c.precision);
    EXPECT_EQ(got.loss_sum, ref.loss_sum) << what;
    std::map<std::string, TensorView> by_name;
    for (const auto& t : full.named_tensors()) by_name.emplace(t.hf_name, t.view);
    size_t trained = 0;
    for (const auto& t : frozen.named_tensors()) {
      const TensorView& r = by_name.at(t.hf_name);
      ASSERT_EQ(t.view.bytes(), r.bytes()) << what << ": " << t.hf_name;
      EXPECT_EQ(0, std::memcmp(t.view.data, r.data, r.bytes())) << what << ": " << t.hf_name;
      ++trained;
    }
    EXPECT_LT(trained, full.named_tensors().size()) << what;  // something is frozen
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(ExecutorFreeze, EveryPlanMatchesTheInMemoryPathBitwise) {
  for (uint64_t seed = 13; seed <= 24; ++seed) {
    Case c = make_case(seed, false);
    Rng rng(seed);
    testing::expect_every_plan_matches(c.cfg, c.params, c.batch, c.precision, rng, seed,
                                       c.cfg.is_moe() ? 0.01 : 0.0);
    if (::testing::Test::HasFailure()) return;
  }
}

// LoRA: adapters beside frozen linears (dense, hybrid: the Gated DeltaNet projections, MoE: the router, the routed
// and shared experts), dropout by the batch's key — every plan gives the in-memory path's bits, recomputed layers
// drawing the same masks.
TEST(ExecutorLora, EveryPlanMatchesTheInMemoryPathBitwise) {
  for (uint64_t seed = 43; seed <= 54; ++seed) {
    Case c = make_case(seed, /*lora=*/true);
    Rng rng(seed);
    testing::expect_every_plan_matches(c.cfg, c.params, c.batch, c.precision, rng, seed,
                                       c.cfg.is_moe() ? 0.01 : 0.0);
    if (::testing::Test::HasFailure()) return;
  }
}

// The CUDA block (cuda/layers/*.inl under cuda-sim, bf16 storage) with frozen tensors and adapters: its kernels skip a
// frozen tensor's gradient and its linears add the adapters (cuBLASLt's alpha and beta, the CPU block's dropout mask).
// Every plan gives the keep-all bits with the predicted peak; the result is the CPU block's to f32 rounding carried
// through bf16 storage; a freeze's trained gradients are the CUDA block's full run's bit for bit.
TEST(ExecutorFinetune, TheCudaBlockGivesTheKeepAllBitsUnderEveryPlanAndTheCpuBlockToRounding) {
  // Freezes of a hybrid, a Qwen3-MoE and a dense model; LoRAs of a hybrid, a dense model and two Qwen3.5-MoE hybrids
  // (seed 70: the experts' and shared expert's up_proj with dropout, masks on each expert's token rows; seed 78: every
  // linear — the router, the routed experts, the shared expert and its gate) (make_case's kinds by seed % 4; the CPU
  // block's every-plan tests take every pairing, GPT-OSS's LoRA included).
  for (const uint64_t seed : {61, 62, 64, 65, 68, 70, 78}) {
    Case c = make_case(seed, /*lora=*/seed >= 65);
    Rng rng(seed);
    const ComputeType ct = c.precision.compute;
    const std::string what = "seed " + std::to_string(seed) + ": " + c.cfg.finetune->summary(c.cfg);
    const testing::CudaBlockSteps steps(c.cfg, c.params, c.batch, ct);
    const int64_t L = c.cfg.num_layers;
    auto run = [&](const Plan& plan, LinkSpec link, ModelSlabs& grads) { return steps.run(plan, link, grads, what); };
    ModelSlabs ref_grads(c.cfg, DType::f32, Fill::zero, SlabSet::trained);
    const StepStats ref = run(Plan::keep_all(L), LinkSpec{}, ref_grads);
    ModelSlabs cpu(c.cfg, DType::f32, Fill::zero, SlabSet::trained);
    const LossResult cpu_loss = model_forward_backward(cpu, c.params, c.batch, Precision(ct, DType::bf16));
    EXPECT_EQ(ref.tokens, cpu_loss.tokens) << what;
    // As the full models' CUDA-block tests (test_executor_cuda, _hybrid, _moe) bound them, looser at bf16 GEMMs for
    // sparse models and LoRA: a bf16 operand's flip carries into every layer below. Seed 62 (Qwen3-MoE, freeze): 7.0e-4
    // on the trained tensors, 7.2e-4 over its full run's — the freeze adds nothing (its trained gradients are that
    // run's bits, checked below). Seed 68 (dense, rsLoRA scale 2 with random B: layer 0's gradients 100× the last
    // layer's): 9.3e-4 under an earlier dropout key (4.7e-8 now): amplified flips; its f32 GEMMs 3e-7, and each
    // layer alone (CudaSimBlock.LoraAdaptersMatchTheCpuBlock) 4e-5.
    const bool loose = (c.cfg.is_moe() || c.cfg.finetune->kind == FinetuneKind::lora) && ct == ComputeType::bf16;
    const double rel = testing::relative_error(ref_grads, cpu);
    const double loss_rel = std::fabs(ref.loss_sum - cpu_loss.loss_sum) / std::fabs(cpu_loss.loss_sum);
    EXPECT_LT(loss_rel, 1e-6) << what;  // measured at most 3e-9
    EXPECT_LT(rel, loose ? 2e-3 : 1e-4) << what;
    std::printf("%s: CUDA block vs CPU block: loss %.2e, gradients %.2e relative\n", what.c_str(), loss_rel, rel);
    if (c.cfg.finetune->kind == FinetuneKind::freeze) {
      ModelConfig full_cfg = c.cfg;
      full_cfg.finetune = nullptr;
      const testing::CudaBlockSteps full_steps(full_cfg, c.params, c.batch, ct);
      ModelSlabs full(full_cfg);
      EXPECT_EQ(full_steps.run(Plan::keep_all(L), LinkSpec{}, full, what).loss_sum, ref.loss_sum) << what;
      std::map<std::string, TensorView> by_name;
      for (const auto& t : full.named_tensors()) by_name.emplace(t.hf_name, t.view);
      for (const auto& t : ref_grads.named_tensors())
        EXPECT_EQ(0, std::memcmp(t.view.data, by_name.at(t.hf_name).data, t.view.bytes())) << what << ": " << t.hf_name;
    }
    // Recomputed layers (their adapters' masks drawn again), host-tier boundaries with transfer windows (the NVMe
    // tier's frozen runs are ExecutorFreeze's and ExecutorLora's, on the CPU block).
    const std::vector<Plan> plans = {Plan::every(L, 1),
                                     testing::with_random_windows(testing::random_host_plan(L, rng), rng)};
    for (const Plan& plan : plans) {
      ModelSlabs grads(c.cfg, DType::f32, Fill::zero, SlabSet::trained);
      const StepStats st = run(plan, seed % 2 ? LinkSpec{2.0, 2.0, 20e-6} : LinkSpec{}, grads);
      EXPECT_EQ(st.loss_sum, ref.loss_sum) << what << " plan " << plan.to_json().dump();
      testing::expect_bitwise_equal(grads, ref_grads, what + " plan " + plan.to_json().dump());
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// The schedule moves exactly the trained gradients: none for a frozen layer, a frozen head or a frozen embedding; and
// with a frozen embedding its backward ends at the lowest trained layer.
TEST(ExecutorFreeze, TheScheduleMovesOnlyTrainedGradients) {
  for (uint64_t seed = 25; seed <= 36; ++seed) {
    const Case c = make_case(seed, false);
    const int64_t L = c.cfg.num_layers;
    ExecOptions o;
    o.compute = c.precision.compute;
    o.activations = c.precision.activations;
    const StepSchedule s = build_step_schedule(c.cfg, c.batch.B, c.batch.T, Plan::every(L, 2), o);
    std::vector<size_t> down(size_t(L), 0), added(size_t(L), 0);
    size_t head_down = 0;
    bool dx0 = false;
    int64_t lowest_backward = L;
    for (const StepOp& op : s.ops) {
      if (op.kind == OpKind::backward_mlp) lowest_backward = std::min(lowest_backward, op.layer);
      if (op.kind == OpKind::download_grads) down[size_t(op.layer)] += op.bytes;
      if (op.kind == OpKind::accumulate_grads) added[size_t(op.layer)] += op.bytes;
      if (op.kind == OpKind::download_head_grads) head_down += op.bytes;
      if (op.kind == OpKind::download_embedding_rows) dx0 = true;
    }
    const std::string what = "seed " + std::to_string(seed) + ": " + c.cfg.finetune->summary(c.cfg);
    for (int64_t l = 0; l < L; ++l) {
      const size_t trained = SlabLayout::trained(c.cfg, SlabKind::layer, l).bytes();
      EXPECT_EQ(down[size_t(l)], trained) << what << " layer " << l;
      EXPECT_EQ(added[size_t(l)], trained) << what << " layer " << l;
      if (!c.cfg.finetune->trains_layer(l)) {
        EXPECT_EQ(trained, 0u) << what;
      }
    }
    size_t head = SlabLayout::trained(c.cfg, SlabKind::head).bytes();
    if (c.cfg.tie_word_embeddings) head += SlabLayout::trained(c.cfg, SlabKind::embedding).bytes();
    EXPECT_EQ(head_down, head) << what;
    EXPECT_EQ(dx0, c.cfg.finetune->embed_tokens) << what;
    // The backward stops at the lowest trained layer when the embedding is frozen: nothing below wants a gradient.
    int64_t lowest = c.cfg.finetune->embed_tokens ? 0 : L;
    for (int64_t l = L - 1; l >= 0 && !c.cfg.finetune->embed_tokens; --l)
      if (SlabLayout::trained(c.cfg, SlabKind::layer, l).bytes() > 0) lowest = l;
    EXPECT_EQ(lowest_backward, lowest) << what;
    EXPECT_EQ(lowest_backward_layer(c.cfg), lowest) << what;
  }
}

// Steps of freeze training — the executor with the previous step's update pending, 8-bit states, weight decay — equal
// full training on the in-memory path in which every frozen tensor's gradient is zeroed and its update dropped.
TEST(ExecutorFreeze, TrainingEqualsFullTrainingWithTheFrozenUpdatesDropped) {
  for (uint64_t seed = 37; seed <= 42; ++seed) {
    Case c = make_case(seed, false);
    const ModelConfig& cfg = c.cfg;
    const int64_t L = cfg.num_layers;
    ModelConfig full_cfg = cfg;
    full_cfg.finetune = nullptr;
    AdamWConfig ac;
    ac.weight_decay = 0.1;
    ac.min_q8_numel = 64;
    ac.max_grad_norm = 1e6;  // the clipping path, at a coefficient of 1: the two norms' last bits may differ
    const std::string what = "seed " + std::to_string(seed) + ": " + cfg.finetune->summary(cfg);

    // The freeze run: masters of the trained tensors, streamed weights of every one, the update pipelined.
    ModelSlabs masters = trained_tensors(cfg, c.params);
    const DType mdt = c.precision.compute == ComputeType::bf16 ? DType::bf16 : DType::f32;
    ModelSlabs weights(cfg, mdt);
    make_compute_copy(weights, c.params);
    ModelSlabs grads(cfg, DType::f32, Fill::zero, SlabSet::trained);
    HybridAdamW opt(masters, grads, ac, nullptr, mdt);
    ExecOptions o;
    o.compute = c.precision.compute;
    o.activations = c.precision.activations;
    const Plan plan = Plan::every(L, 2, Tier::host);
    auto dev = make_cpu_device(size_t(1) << 30, LinkSpec{});
    StreamingExecutor ex(cfg, *dev, o);

    // The full run, frozen updates dropped.
    ModelSlabs full(full_cfg);
    {
      const auto from = c.params.named_tensors(), to = full.named_tensors();
      for (size_t i = 0; i < to.size(); ++i) std::memcpy(to[i].view.data, from[i].view.data, to[i].view.bytes());
    }
    ModelSlabs full_grads(full_cfg);
    HybridAdamW full_opt(full, full_grads, ac);
    auto drop_frozen = [&](ModelSlabs& slabs, const ModelSlabs* restore) {
      auto slab = [&](SlabKind kind, int64_t layer) {
        for (const SlabEntry& e : slabs.layout(kind, layer).entries()) {
          if (cfg.trains(kind, layer, e.name)) continue;
          const TensorView v = slabs.tensor(kind, layer, e.name);
          if (restore) std::memcpy(v.data, restore->tensor(kind, layer, e.name).data, v.bytes());
          else std::memset(v.data, 0, v.bytes());
        }
      };
      slab(SlabKind::embedding, 0);
      for (int64_t l = 0; l < L; ++l) slab(SlabKind::layer, l);
      slab(SlabKind::head, 0);
    };

    std::optional<PendingUpdate> pending;
    Rng rng(seed);
    for (int step = 0; step < 3; ++step) {
      const Batch batch = random_batch(cfg, rng, step % 2 == 1);
      GradNormPartials partials(L);
      GradTarget target{&partials, GradMode::overwrite};
      const StepStats st = ex.step(grads, masters, weights, batch, plan, nullptr, pending ? &*pending : nullptr, target);
      const StepPlan sp = opt.plan_step(partials.sum_of_squares());
      pending = PendingUpdate{&opt, StepArgs{sp.step, 1e-2, sp.clip}, &weights};

      full_grads.zero();  // the in-memory path adds into the gradients
      const LossResult ref = model_forward_backward(full_grads, full, batch, c.precision);
      EXPECT_EQ(st.loss_sum, ref.loss_sum) << what << " step " << step;
      drop_frozen(full_grads, nullptr);
      double sq = 0;  // the coefficient is 1 either way (max_grad_norm above): a plain sum will do
      for (const auto& t : full_grads.named_tensors())
        for (int64_t i = 0; i < t.view.numel(); ++i) sq += double(t.view.ptr<float>()[i]) * t.view.ptr<float>()[i];
      const StepPlan fp = full_opt.plan_step(sq);
      EXPECT_EQ(fp.clip, sp.clip) << what;
      full_opt.update_all(StepArgs{fp.step, 1e-2, fp.clip});
      drop_frozen(full, &c.params);
    }
    opt.update_all(pending->args, &weights);
    std::map<std::string, TensorView> trained;
    for (const auto& t : masters.named_tensors()) trained.emplace(t.hf_name, t.view);
    for (const auto& t : full.named_tensors()) {
      const auto it = trained.find(t.hf_name);
      if (it == trained.end()) continue;
      EXPECT_EQ(0, std::memcmp(t.view.data, it->second.data, t.view.bytes())) << what << ": " << t.hf_name;
    }
    // The streamed weights: the frozen tensors as they were, the trained ones the masters' copy.
    ModelSlabs expect(cfg, mdt);
    make_compute_copy(expect, full);
    const auto w = weights.named_tensors(), e = expect.named_tensors();
    for (size_t i = 0; i < w.size(); ++i)
      EXPECT_EQ(0, std::memcmp(w[i].view.data, e[i].view.data, w[i].view.bytes())) << what << ": " << w[i].hf_name;
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(Freeze, LlamaFactorysRulesPickTheLayersAndModules) {
  Rng rng(5);
  ModelConfig cfg = testing::random_hybrid_config(rng);
  cfg.num_layers = 6;
  using K = LayerKind;
  cfg.layer_types = {K::linear_attention, K::linear_attention, K::linear_attention, K::full_attention,
                     K::linear_attention, K::full_attention};
  const Finetune last2 = make_freeze(cfg, 2, {"all"}, {});
  EXPECT_EQ(last2.layers, (std::vector<char>{0, 0, 0, 0, 1, 1}));
  const Finetune first3 = make_freeze(cfg, -3, {"mlp", "self_attn"}, {"embed_tokens"});
  EXPECT_EQ(first3.layers, (std::vector<char>{1, 1, 1, 0, 0, 0}));
  EXPECT_TRUE(first3.trains(SlabKind::layer, 1, "mlp.up_proj.weight"));
  EXPECT_FALSE(first3.trains(SlabKind::layer, 1, "linear_attn.in_proj_z.weight"));
  EXPECT_FALSE(first3.trains(SlabKind::layer, 1, "input_layernorm.weight"));
  EXPECT_FALSE(first3.trains(SlabKind::layer, 4, "mlp.up_proj.weight"));
  EXPECT_TRUE(first3.trains(SlabKind::embedding, 0, "embed_tokens.weight"));
  EXPECT_FALSE(first3.trains(SlabKind::head, 0, "norm.weight"));
  EXPECT_EQ(make_freeze(cfg, 100, {"all"}, {}).layers, std::vector<char>(6, 1));  // more than L: every layer
  testing::expect_error([&] { make_freeze(cfg, 2, {"attn"}, {}); },
                        {"freeze_trainable_modules", "'attn'", "linear_attn", "self_attn", "mlp"});
  testing::expect_error([&] { make_freeze(cfg, 2, {"all", "mlp"}, {}); }, {"freeze_trainable_modules", "all"});
  testing::expect_error([&] { make_freeze(cfg, 0, {"all"}, {}); }, {"freeze_trainable_layers", "0"});
  cfg.tie_word_embeddings = true;
  testing::expect_error([&] { make_freeze(cfg, 2, {"all"}, {"lm_head"}); },
                        {"freeze_extra_modules", "'lm_head'", "embed_tokens"});
  // The trained layout of a frozen layer is empty; a trained one's MLP half starts at its first MLP entry.
  cfg.tie_word_embeddings = false;
  cfg.finetune = std::make_shared<const Finetune>(make_freeze(cfg, 1, {"mlp"}, {}));
  EXPECT_EQ(SlabLayout::trained(cfg, SlabKind::layer, 0).bytes(), 0u);
  const SlabLayout t5 = SlabLayout::trained(cfg, SlabKind::layer, 5);
  EXPECT_EQ(t5.mlp_offset(), 0u);
  EXPECT_EQ(t5.entries().front().name, "mlp.gate_proj.weight");
  EXPECT_EQ(SlabLayout::trained(cfg, SlabKind::head).bytes(), 0u);
}

TEST(Lora, LlamaFactorysRulesPickTheLinears) {
  Rng rng(6);
  ModelConfig hybrid = testing::random_hybrid_config(rng);
  const Finetune all = make_lora(hybrid, 8, 16, 0, false, {"all"}, {});
  std::vector<std::string> got = all.targets;  // in the model's order (its first layer's kind first)
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<std::string>{"down_proj", "gate_proj", "in_proj_a", "in_proj_b", "in_proj_qkv",
                                           "in_proj_z", "k_proj", "o_proj", "out_proj", "q_proj", "up_proj", "v_proj"}));
  EXPECT_FLOAT_EQ(all.scale(), 2.0f);
  EXPECT_FLOAT_EQ(make_lora(hybrid, 16, 8, 0, true, {"q_proj"}, {}).scale(), 2.0f);  // rsLoRA: 8 / √16
  EXPECT_TRUE(all.trains(SlabKind::layer, 0, "linear_attn.in_proj_z.lora_B.weight"));
  EXPECT_FALSE(all.trains(SlabKind::layer, 0, "linear_attn.in_proj_z.weight"));
  EXPECT_FALSE(all.trains(SlabKind::embedding, 0, "embed_tokens.weight"));
  testing::expect_error([&] { make_lora(hybrid, 8, 16, 0, false, {"qkv_proj"}, {}); },
                        {"lora_target", "'qkv_proj'", "in_proj_qkv", "q_proj"});
  testing::expect_error([&] { make_lora(hybrid, 0, 16, 0, false, {"all"}, {}); }, {"lora_rank"});
  testing::expect_error([&] { make_lora(hybrid, 8, 16, 1.0, false, {"all"}, {}); }, {"lora_dropout"});
  testing::expect_error([&] { make_lora(hybrid, 8, 16, 0, false, {"all"}, {"layers"}); },
                        {"additional_target", "'layers'", "embed_tokens"});
  // A MoE model: "all" is every Linear module, as LLaMA-Factory finds them (the router `gate` and each expert's
  // projections); a name adapts every linear it ends (gate_proj: each expert's); GPT-OSS's fused experts take none.
  ModelConfig moe = testing::random_moe_config(rng);
  moe.mlp_only_layers.clear();
  EXPECT_EQ(make_lora(moe, 4, 8, 0, false, {"all"}, {}).targets,
            (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate", "gate_proj", "up_proj",
                                      "down_proj"}));
  moe.finetune = std::make_shared<const Finetune>(make_lora(moe, 3, 6, 0, false, {"gate", "down_proj"}, {}));
  const SlabLayout sparse = SlabLayout::make_layer(moe, 0);
  const int64_t E = moe.num_experts, C = moe.hidden_size, Ie = moe.moe_intermediate_size;
  EXPECT_EQ(sparse.entry("mlp.gate.lora_B.weight").shape, (Shape{E, 3}));
  EXPECT_EQ(sparse.entry(fmt::format("mlp.experts.{}.down_proj.lora_A.weight", E - 1)).shape, (Shape{3, Ie}));
  EXPECT_EQ(sparse.entry("mlp.experts.0.down_proj.lora_B.weight").shape, (Shape{C, 3}));
  EXPECT_EQ(sparse.find("mlp.experts.0.up_proj.lora_A.weight"), nullptr);
  EXPECT_EQ(SlabLayout::trained(moe, SlabKind::layer, 0).entries().size(), size_t(2 + 2 * E));
  ModelConfig gpt_oss = testing::random_gpt_oss_config(rng);
  testing::expect_error([&] { make_lora(gpt_oss, 4, 8, 0, false, {"q_proj", "down_proj"}, {}); },
                        {"lora_target", "'down_proj'", "fused", "q_proj"});
  EXPECT_EQ(make_lora(gpt_oss, 4, 8, 0, false, {"all"}, {}).targets,
            (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj"}));
  // The layout: A [r, in] and B [out, r] right after their linear, so an MLP adapter is in the MLP half.
  ModelConfig dense = testing::random_config(rng);
  dense.finetune = std::make_shared<const Finetune>(make_lora(dense, 3, 6, 0, false, {"v_proj", "down_proj"}, {}));
  const SlabLayout l = SlabLayout::make_layer(dense, 0);
  EXPECT_EQ(l.entry("self_attn.v_proj.lora_A.weight").shape, (Shape{3, dense.hidden_size}));
  EXPECT_EQ(l.entry("mlp.down_proj.lora_B.weight").shape, (Shape{dense.hidden_size, 3}));
  const SlabLayout t = SlabLayout::trained(dense, SlabKind::layer, 0);
  EXPECT_EQ(t.entries().size(), 4u);
  EXPECT_EQ(t.mlp_offset(), size_t(t.entry("mlp.down_proj.lora_A.weight").offset));
}

}  // namespace
}  // namespace lt
