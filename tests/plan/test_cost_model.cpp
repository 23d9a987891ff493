// The cost model against the executor's own functions (its per-window working set), the built-in machines
// against their published figures, profiles and plan files through JSON, and the memory lower bound.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "exec/working_set.h"
#include "io/json_file.h"
#include "plan/chain_dp.h"
#include "plan/hardware.h"
#include "plan/plan_file.h"
#include "plan/planner.h"
#include "plan_testing.h"
#include "testing/exec_testing.h"
#include "testing/files_testing.h"

namespace lt {
namespace {

Plan random_plan(int64_t L, Rng& rng, bool nvme) {
  Plan p;
  p.name = "random";
  for (int64_t i = 0; i <= L; ++i) {
    const Tier tiers[] = {Tier::device, Tier::host, Tier::drop, Tier::nvme};
    p.boundary.push_back(tiers[rng.below(nvme ? 4 : 3)]);
  }
  p.boundary[0] = rng.below(2) ? Tier::device : Tier::host;
  p.boundary[size_t(L)] = Tier::device;
  for (int64_t l = 0; l < L; ++l) p.keep_internals.push_back(p.stored(l) && rng.below(3) == 0);
  return p;
}

// Window by window, the instance's executor-model bytes for `p` are plan_working_set's; the lifetime model is never
// above them and the packed block never below.
void expect_windows_are_the_working_set(const Instance& in, const Plan& p, uint64_t seed) {
  const WorkingSet ws = plan_working_set(in.cfg, in.B, in.T, p, in.opt.exec);
  const std::vector<double> mine = window_device_bytes(in, p, MemoryModel::executor);
  ASSERT_EQ(mine.size(), ws.window_bytes.size());
  for (size_t w = 0; w < mine.size(); ++w)
    EXPECT_EQ(size_t(mine[w]), ws.window_bytes[w]) << "seed " << seed << " window " << in.window_name(int(w));
  const std::vector<double> life = window_device_bytes(in, p, MemoryModel::lifetime);
  for (size_t w = 0; w < mine.size(); ++w) EXPECT_LE(life[w], mine[w]) << "seed " << seed;
  EXPECT_GE(double(ws.device_bytes()), *std::max_element(mine.begin(), mine.end()));
}

// The MILP's per-window device bytes are the executor's (plan_working_set) exactly, for every plan, with the CPU
// block at f32 and bf16 activation storage and with the CUDA block (its own scratch).
TEST(CostModel, ExecutorWindowBytesEqualTheWorkingSet) {
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    Rng rng(seed);
    const int64_t L = 1 + int64_t(rng.below(9));
    ModelConfig cfg = testing::tiny_plan_config(L, seed);
    cfg.tie_word_embeddings = rng.below(2) == 0;
    const int64_t B = 1 + int64_t(rng.below(3)), T = 8 + int64_t(rng.below(40));
    InstanceOptions o;
    o.exec.compute = rng.below(2) ? ComputeType::bf16 : ComputeType::f32;
    o.exec.weight_buffers = 1 + int(rng.below(3));
    o.exec.resident_head = seed % 4 == 0;
    if (seed % 3 != 0) o.exec.activations = DType::bf16;
    if (seed % 3 == 2) o.exec.kernels = LayerKernels::cuda;
    Profile prof = testing::synthetic_profile(cfg, B, T, rng);
    Instance in = make_instance(cfg, B, T, prof, Budgets{size_t(1) << 40, 0, 0}, o);
    for (int k = 0; k < 5; ++k) expect_windows_are_the_working_set(in, random_plan(L, rng, true), seed);
  }
}

// The same for Qwen3.5 hybrids: each layer's kept internals its own size, the buffers the largest layer's; the
// CPU block at f32 and bf16 storage, and the CUDA block's (its carve the larger of the two layer kinds').
TEST(CostModel, ExecutorWindowBytesEqualTheWorkingSetHybrid) {
  for (uint64_t seed = 1; seed <= 30; ++seed) {
    Rng rng(seed + 500);
    const ModelConfig cfg = testing::random_hybrid_config(rng);
    const int64_t L = cfg.num_layers, B = 1 + int64_t(rng.below(2)), T = 8 + int64_t(rng.below(80));
    InstanceOptions o;
    o.exec.compute = rng.below(2) ? ComputeType::bf16 : ComputeType::f32;
    o.exec.weight_buffers = 1 + int(rng.below(3));
    if (seed % 3 != 0) o.exec.activations = DType::bf16;
    if (seed % 3 == 2) o.exec.kernels = LayerKernels::cuda;
    Profile prof = testing::synthetic_profile(cfg, B, T, rng);
    Instance in = make_instance(cfg, B, T, prof, Budgets{size_t(1) << 40, 0, 0}, o);
    bool differ = false;
    for (int64_t l = 0; l < L; ++l) {
      differ |= in.mem.internals[size_t(l)] != in.mem.internals[0];
      EXPECT_LE(in.Wl[size_t(l)], in.W);
      EXPECT_LE(in.Gl[size_t(l)], in.G);
    }
    EXPECT_TRUE(differ) << "seed " << seed << ": Gated DeltaNet and attention layers keep different internals";
    for (int k = 0; k < 5; ++k) expect_windows_are_the_working_set(in, random_plan(L, rng, true), seed);
  }
}

TEST(CostModel, KeepAllIsFastestWhenItFits) {
  for (uint64_t seed = 100; seed < 110; ++seed) {
    Rng rng(seed);
    Instance in = testing::realistic_instance(rng, 6, MemoryModel::executor);
    in.budget.device_bytes = size_t(1) << 40;
    const double keep = evaluate(in, Plan::keep_all(6)).iteration_s;
    for (int k = 0; k < 20; ++k) {
      Plan p = random_plan(6, rng, false);
      EXPECT_GE(evaluate(in, p).iteration_s, keep * (1 - 1e-12)) << "seed " << seed;
    }
  }
}

TEST(CostModel, WindowsOutsideTheirRangeAreRefused) {
  Rng rng(200);
  Instance in = testing::realistic_instance(rng, 6, MemoryModel::executor);
  in.budget = Budgets{size_t(1) << 40, size_t(1) << 40, 0};
  Plan p = Plan::every(6, 1, Tier::host);
  TransferWindows tw = TransferWindows::natural(in, p);
  EXPECT_TRUE(tw.is_natural(in, p));
  EXPECT_TRUE(evaluate(in, p, tw).feasible);
  tw.offload[2] = {{in.fwd(5), 1.0}};  // three windows late: outside offload_span
  Prediction bad = evaluate(in, p, tw);
  EXPECT_FALSE(bad.feasible);
  tw = TransferWindows::natural(in, p);
  tw.offload[2] = {{in.fwd(2), 0.5}, {in.fwd(3), 0.5}};
  EXPECT_TRUE(evaluate(in, p, tw).feasible);
  EXPECT_FALSE(tw.is_natural(in, p));
}

TEST(CostModel, PlanFileKeepsItsWindows) {
  Rng rng(300);
  Instance in = testing::realistic_instance(rng, 5, MemoryModel::executor);
  Plan p = Plan::every(5, 1, Tier::host);
  TransferWindows tw = TransferWindows::natural(in, p);
  tw.offload[3] = {{in.fwd(3), 0.25}, {in.fwd(4), 0.75}};
  const std::string path = ::testing::TempDir() + "lt_plan_windows_" + std::to_string(::getpid()) + ".json";
  const Prediction pred = evaluate(in, p, tw);
  write_plan_file(path, in, p, tw, &pred);
  PolicyWithWindows back = load_policy(path, in);
  std::filesystem::remove(path);
  EXPECT_EQ(back.plan.boundary, normalize_plan(p).boundary);
  EXPECT_NEAR(evaluate(in, back.plan, back.windows).iteration_s, pred.iteration_s, 1e-12);
  ASSERT_EQ(back.windows.offload[3].size(), 2u);
  EXPECT_NEAR(back.windows.offload[3][1].fraction, 0.75, 1e-12);
  // The executor's parser reads the same file (it ignores "windows").
  EXPECT_NO_THROW(Plan::from_json(plan_file_json(in, p, tw, &pred), "test", 5));
}

TEST(Hardware, BuiltInMachinesCarryThePublishedFigures) {
  const Hardware* h800 = find_hardware("h800");
  ASSERT_NE(h800, nullptr);
  EXPECT_EQ(h800->device_memory_bytes, size_t(80e9));
  EXPECT_DOUBLE_EQ(h800->link.h2d_gbps, 12);
  EXPECT_DOUBLE_EQ(h800->link.d2h_gbps, 12);
  EXPECT_DOUBLE_EQ(h800->nvme_read_gbps, 2.83);
  EXPECT_DOUBLE_EQ(h800->nvme_write_gbps, 3.35);
  ASSERT_NE(find_hardware("h200"), nullptr);
  EXPECT_EQ(find_hardware("h200")->device_memory_bytes, size_t(141e9));
  ASSERT_NE(find_hardware("rtx3090"), nullptr);
  EXPECT_EQ(find_hardware("rtx3090")->device_memory_bytes, size_t(24e9));
  EXPECT_EQ(find_hardware("a100"), nullptr);
  EXPECT_EQ(hardware_names(), "h800, h200, rtx3090");
}

// A Gated DeltaNet layer's FLOPs: 2 per multiply-add over its matrices and convolution kernels, plus the chunked
// delta rule's; a gated attention layer's q_proj has twice the query rows. The built-in profile of a hybrid gives
// each layer its own kind's times.
TEST(Hardware, HybridLayersHaveTheirOwnFlops) {
  const ModelConfig cfg = load_model_config(std::string(LT_SOURCE_DIR) + "/examples/qwen3.6-27b/config.json");
  const int64_t B = 2, T = 256;
  const double C = double(cfg.hidden_size), Ik = double(cfg.intermediate_size);
  const double key = double(cfg.linear_num_key_heads * cfg.linear_key_head_dim);
  const double value = double(cfg.linear_num_value_heads * cfg.linear_value_head_dim);
  const double Hv = double(cfg.linear_num_value_heads);
  const double conv = (2 * key + value) * double(cfg.linear_conv_kernel_dim);
  const double linear_weights = C * (2 * key + value) + C * value + 2 * C * Hv + value * C + conv + 3 * C * Ik;
  EXPECT_DOUBLE_EQ(layer_forward_flops(cfg, B, T, LayerKind::linear_attention),
                   2.0 * B * T * linear_weights + delta_rule_flops(cfg, B, T));
  // 27B's sizes: dk = dv = 128, chunks of 64, 48 value heads.
  EXPECT_DOUBLE_EQ(delta_rule_flops(cfg, B, T), double(B * T) * 48 * 2 * (3 * 64 * 128 + 2 * 64 * 128 + 3 * 128 * 128));
  const double QD = double(cfg.q_dim()), KVD = double(cfg.kv_dim());
  const double full_weights = C * 2 * QD + 2 * C * KVD + QD * C + 3 * C * Ik;
  const double attention = 2.0 * B * cfg.num_heads * double(T) * T * cfg.head_dim;
  EXPECT_DOUBLE_EQ(layer_forward_flops(cfg, B, T, LayerKind::full_attention), 2.0 * B * T * full_weights + attention);
  EXPECT_EQ(layer_parameters(cfg, LayerKind::linear_attention) * 48 + layer_parameters(cfg, LayerKind::full_attention) * 16 +
                2 * cfg.vocab_size * cfg.hidden_size + cfg.hidden_size,
            cfg.num_parameters());
  const Profile p = hardware_profile(*find_hardware("h800"), cfg, B, T);
  const double rate = find_hardware("h800")->sustained_tflops * 1e12;
  for (int64_t l = 0; l < cfg.num_layers; ++l)
    EXPECT_NEAR(p.forward_s[size_t(l)], layer_forward_flops(cfg, B, T, cfg.layer_kind(l)) / rate, 1e-15) << "layer " << l;
  EXPECT_NE(p.forward_s[0], p.forward_s[3]);  // linear, then full attention every 4th
  EXPECT_EQ(p.forward_s[0], p.forward_s[1]);
}

// Qwen3-30B-A3B: a sparse layer streams and updates all 128 experts, but a token computes through its router and 8.
TEST(Hardware, SparseLayersCountEveryExpertsWeightsAndTheRoutedFlops) {
  const ModelConfig cfg = load_model_config(std::string(LT_SOURCE_DIR) + "/examples/qwen3-30b-a3b/config.json");
  ASSERT_EQ(cfg.num_sparse_layers(), 48);
  const int64_t B = 2, T = 1024;
  const double C = 2048, E = 128, k = 8, Ie = 768, QD = 32 * 128, KVD = 4 * 128;
  const double attention_weights = C * QD + 2 * C * KVD + QD * C;
  const double attention = 2.0 * B * 32 * double(T) * T * 128;
  EXPECT_DOUBLE_EQ(layer_forward_flops(cfg, B, T, int64_t(0)),
                   2.0 * B * T * (attention_weights + C * E + 3 * C * Ie * k) + attention);
  EXPECT_DOUBLE_EQ(down_projection_flops(cfg, B, T, 0), 2.0 * B * T * C * Ie * k);
  EXPECT_EQ(layer_parameters(cfg, int64_t(0)), int64_t(attention_weights + 2 * 128 + 2 * C + C * E + 3 * C * Ie * E));
  // 30.5B in all (the model card's figure), 3.3B of them active per token.
  EXPECT_NEAR(double(cfg.num_parameters()), 30.53e9, 0.01e9);
  EXPECT_NEAR(double(cfg.num_active_parameters()), 3.35e9, 0.01e9);
  const Profile p = hardware_profile(*find_hardware("h800"), cfg, B, T);
  EXPECT_NEAR(p.forward_s[0], layer_forward_flops(cfg, B, T, int64_t(0)) / (find_hardware("h800")->sustained_tflops * 1e12),
              1e-15);
}

// GPT-OSS-120B: a sliding layer's query sees at most W = 128 keys (T·W − W²/2 pairs a head and row against T²/2), and
// a layer's parameters count the attention's biases and sinks, the router's bias and every expert's biases.
TEST(Hardware, GptOssSlidingLayersAndBiasedExperts) {
  const ModelConfig cfg = load_model_config(std::string(LT_SOURCE_DIR) + "/examples/gpt-oss-120b/config.json");
  ASSERT_EQ(cfg.layer_kind(0), LayerKind::sliding_attention);
  ASSERT_EQ(cfg.layer_kind(1), LayerKind::full_attention);
  const int64_t B = 2, T = 1024;
  const double H = 64, D = 64, W = 128;
  EXPECT_DOUBLE_EQ(layer_forward_flops(cfg, B, T, int64_t(1)) - layer_forward_flops(cfg, B, T, int64_t(0)),
                   4.0 * B * H * D * (double(T) * T / 2 - (double(T) * W - W * W / 2)));
  EXPECT_DOUBLE_EQ(layer_forward_flops(cfg, B, 100, int64_t(0)), layer_forward_flops(cfg, B, 100, int64_t(1)));
  const int64_t C = 2880, E = 128, Ie = 2880, QD = 64 * 64, KVD = 8 * 64;
  const int64_t attention = C * QD + 2 * C * KVD + QD * C + QD + 2 * KVD + C + 64;  // weights, biases, sinks
  const int64_t experts = E * C + E + E * (3 * C * Ie + 2 * Ie + C);               // router (+ bias), experts
  EXPECT_EQ(layer_parameters(cfg, int64_t(0)), attention + experts + 2 * C);
  EXPECT_EQ(layer_parameters(cfg, int64_t(0)), layer_parameters(cfg, int64_t(1)));
}

TEST(Hardware, FlopsAndProfileFromThem) {
  ModelConfig cfg = load_model_config(std::string(LT_SOURCE_DIR) + "/examples/bench-25m/config.json");
  const int64_t B = 2, T = 128;
  // GEMMs: 2 FLOPs per multiply-add over every weight matrix of the layer, per token.
  const double matrices = double(cfg.hidden_size) * double(cfg.q_dim()) * 2 + double(cfg.hidden_size) * double(cfg.kv_dim()) * 2 +
                          3.0 * double(cfg.hidden_size) * double(cfg.intermediate_size);
  const double attention = 2.0 * B * cfg.num_heads * double(T) * T * cfg.head_dim;
  EXPECT_DOUBLE_EQ(layer_forward_flops(cfg, B, T), 2.0 * B * T * matrices + attention);
  Profile p = hardware_profile(*find_hardware("h800"), cfg, B, T);
  EXPECT_NEAR(p.forward_s[0], layer_forward_flops(cfg, B, T) / (find_hardware("h800")->sustained_tflops * 1e12), 1e-15);
  EXPECT_NEAR(p.backward_s[0], 2 * p.forward_s[0], 1e-15);
  p.validate(cfg.num_layers);
  // JSON round trip.
  Profile q = Profile::from_json(p.to_json(), "test");
  EXPECT_EQ(q.forward_s, p.forward_s);
  EXPECT_EQ(q.link.h2d_gbps, p.link.h2d_gbps);
  EXPECT_EQ(q.nvme_write_gbps, p.nvme_write_gbps);
  // Re-targeting a measured profile scales its times with the tokens.
  Profile s = scale_profile(q, 2 * B, T);
  EXPECT_NEAR(s.forward_s[0], 2 * q.forward_s[0], 1e-15);
  EXPECT_THROW(resolve_profile("tpu-v9", cfg, B, T), Error);
  EXPECT_THROW(Profile::from_json(nlohmann::json{{"format", "other"}}, "x"), Error);
  // A count out of an integer's range, fractional or negative (fuzz_profile found 1.6e54 converted with undefined
  // behaviour): an error naming the field.
  for (const double bad : {1.62222e54, 2.5, -1.0}) {
    nlohmann::json j = p.to_json();
    j["batch"] = bad;
    const std::string e = testing::error_of([&] { Profile::from_json(j, "p.json"); });
    EXPECT_NE(e.find("p.json: \"batch\" is"), std::string::npos) << e;
    EXPECT_NE(e.find("expected a whole number >= 0"), std::string::npos) << e;
  }
}

// A profile says which layer compute its times are of; a plan for it uses that compute's working set. A GPU's
// (the built-in machines, or one measured on cuda / cuda-sim at bf16) stores bf16 activations and refuses f32.
TEST(Hardware, ProfilesCarryTheirLayerCompute) {
  ModelConfig cfg = load_model_config(std::string(LT_SOURCE_DIR) + "/examples/bench-25m/config.json");
  Profile gpu = hardware_profile(*find_hardware("h200"), cfg, 2, 128);
  EXPECT_EQ(gpu.layer_kernels, LayerKernels::cuda);
  EXPECT_EQ(gpu.to_json()["layer_kernels"], "cuda");
  EXPECT_EQ(Profile::from_json(gpu.to_json(), "test").layer_kernels, LayerKernels::cuda);
  ExecOptions e;
  e.compute = ComputeType::bf16;
  gpu.apply_to(e, "auto", "--activation-dtype");
  EXPECT_EQ(e.kernels, LayerKernels::cuda);
  EXPECT_EQ(e.activations, DType::bf16);
  try {
    gpu.apply_to(e, "f32", "--activation-dtype");
    FAIL() << "f32 activations accepted for the CUDA block";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("stores bf16 activations"), std::string::npos) << err.what();
  }
  Profile cpu = gpu;
  cpu.layer_kernels = LayerKernels::cpu;
  e.compute = ComputeType::f32;
  cpu.apply_to(e, "auto", "--activation-dtype");
  EXPECT_EQ(e.kernels, LayerKernels::cpu);
  EXPECT_EQ(e.activations, DType::f32);
  nlohmann::json j = cpu.to_json();
  j.erase("layer_kernels");  // profiles from before the field: the CPU block's
  EXPECT_EQ(Profile::from_json(j, "old").layer_kernels, LayerKernels::cpu);
  j["layer_kernels"] = "gpu";  // the spelling before "cuda" was settled
  EXPECT_EQ(Profile::from_json(j, "old").layer_kernels, LayerKernels::cuda);
  j["layer_kernels"] = "tpu";
  EXPECT_THROW(Profile::from_json(j, "bad"), Error);
  // The CUDA block's working set differs from the CPU block's: its own scratch, no f32 working copy.
  ExecOptions cpu_block, gpu_block;
  cpu_block.activations = gpu_block.activations = DType::bf16;
  gpu_block.kernels = LayerKernels::cuda;
  const Plan every = Plan::every(cfg.num_layers, 1);
  const WorkingSet a = plan_working_set(cfg, 2, 128, every, cpu_block), b = plan_working_set(cfg, 2, 128, every, gpu_block);
  EXPECT_NO_THROW(a.buffer("working copy"));
  EXPECT_THROW(b.buffer("working copy"), Error);
  EXPECT_NO_THROW(b.buffer("block scratch"));
  // A layer that does not keep its internals holds only their attention half there (the MLP's stay in scratch).
  const BlockShape shape = BlockShape::make(cfg, 2, 128, DType::bf16);
  EXPECT_EQ(b.buffer("recompute internals").bytes, align_up(block_recompute_stored_bytes(shape), kDeviceAlign));
  EXPECT_LE(block_recompute_stored_bytes(shape) + 3 * size_t(shape.N() * shape.I) * 2, block_stored_bytes(shape));
}

TEST(Planner, MinimumMemoryIsALowerBound) {
  int checked = 0;
  for (uint64_t seed = 400; seed < 440; ++seed) {
    Rng rng(seed);
    Instance in = restrict_instance(testing::realistic_instance(rng, 2 + int64_t(rng.below(7)), MemoryModel::executor));
    const ChainResult dp = chain_dp(in);
    const MemoryNeed need = minimum_device_memory(in);
    if (dp.feasible) {
      ++checked;
      EXPECT_LE(need.device_bytes, evaluate(in, dp.plan).model_device_bytes * (1 + 1e-12)) << "seed " << seed;
    }
    // With exactly the minimum, some plan fits.
    Instance tight = in;
    tight.budget.device_bytes = size_t(std::ceil(need.device_bytes));
    EXPECT_TRUE(chain_dp(tight).feasible) << "seed " << seed;
  }
  EXPECT_GE(checked, 10);
}

}  // namespace
}  // namespace lt
