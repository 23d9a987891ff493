// The LoRA adapter on a linear (model/lora.h): against a plain double-precision reference of
// y = x Wᵀ + b + s (drop(x) Aᵀ) Bᵀ and its gradients, central differences, the bf16 GEMM mode's rounding points,
// row chunks drawing their part of one dropout mask, and the mask's statistics.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "model/lora.h"
#include "ops/gemm.h"
#include "testing/grad_check.h"

namespace lt {
namespace {

using testing::grad_check;
using testing::random_vector;

struct Sizes {
  int64_t N, in, out, r;
  float p;  // dropout
};

// The plain reference in double: y [N, out], and from dy: dx [N, in], dA [r, in], dB [out, r].
struct Reference {
  std::vector<double> y, dx, dA, dB;
};
Reference reference(const Sizes& z, const std::vector<float>& x, const std::vector<float>& W,
                    const std::vector<float>& A, const std::vector<float>& B, float scale, LoraSite site,
                    const std::vector<float>& dy) {
  Reference r;
  const double keep_scale = 1.0 / (1.0 - double(z.p));
  std::vector<double> xd(size_t(z.N * z.in)), u(size_t(z.N * z.r), 0.0);
  for (int64_t n = 0; n < z.N; ++n)
    for (int64_t i = 0; i < z.in; ++i) {
      const bool keep = z.p == 0 || lora_keep(site.key, uint64_t((site.row0 + n) * z.in + i), z.p);
      xd[size_t(n * z.in + i)] = keep ? double(x[size_t(n * z.in + i)]) * (z.p == 0 ? 1.0 : keep_scale) : 0.0;
    }
  for (int64_t n = 0; n < z.N; ++n)
    for (int64_t k = 0; k < z.r; ++k)
      for (int64_t i = 0; i < z.in; ++i) u[size_t(n * z.r + k)] += xd[size_t(n * z.in + i)] * A[size_t(k * z.in + i)];
  r.y.assign(size_t(z.N * z.out), 0.0);
  for (int64_t n = 0; n < z.N; ++n)
    for (int64_t j = 0; j < z.out; ++j) {
      double acc = 0, lo = 0;
      for (int64_t i = 0; i < z.in; ++i) acc += double(x[size_t(n * z.in + i)]) * W[size_t(j * z.in + i)];
      for (int64_t k = 0; k < z.r; ++k) lo += u[size_t(n * z.r + k)] * B[size_t(j * z.r + k)];
      r.y[size_t(n * z.out + j)] = acc + scale * lo;
    }
  // du = s dy B; dB = s dyᵀ u; dA = duᵀ xd; dx = dy W + mask · du A / (1 - p)
  std::vector<double> du(size_t(z.N * z.r), 0.0);
  r.dB.assign(size_t(z.out * z.r), 0.0);
  r.dA.assign(size_t(z.r * z.in), 0.0);
  r.dx.assign(size_t(z.N * z.in), 0.0);
  for (int64_t n = 0; n < z.N; ++n)
    for (int64_t j = 0; j < z.out; ++j) {
      const double g = scale * double(dy[size_t(n * z.out + j)]);
      for (int64_t k = 0; k < z.r; ++k) {
        du[size_t(n * z.r + k)] += g * B[size_t(j * z.r + k)];
        r.dB[size_t(j * z.r + k)] += g * u[size_t(n * z.r + k)];
      }
      for (int64_t i = 0; i < z.in; ++i) r.dx[size_t(n * z.in + i)] += double(dy[size_t(n * z.out + j)]) * W[size_t(j * z.in + i)];
    }
  for (int64_t n = 0; n < z.N; ++n)
    for (int64_t k = 0; k < z.r; ++k)
      for (int64_t i = 0; i < z.in; ++i) {
        r.dA[size_t(k * z.in + i)] += du[size_t(n * z.r + k)] * xd[size_t(n * z.in + i)];
        const bool keep = z.p == 0 || lora_keep(site.key, uint64_t((site.row0 + n) * z.in + i), z.p);
        if (keep) r.dx[size_t(n * z.in + i)] += du[size_t(n * z.r + k)] * A[size_t(k * z.in + i)] * (z.p == 0 ? 1.0 : keep_scale);
      }
  return r;
}

double max_rel(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num = std::max(num, std::fabs(double(got[i]) - want[i]));
    den = std::max(den, std::fabs(want[i]));
  }
  return num / den;
}

// Odd sizes and ranks, with and without dropout: f32 GEMMs against the double reference.
TEST(Lora, AdaptedLinearMatchesThePlainReference) {
  const Sizes cases[] = {{7, 13, 11, 3, 0.f}, {33, 24, 40, 8, 0.1f}, {5, 9, 17, 1, 0.5f}, {64, 31, 29, 5, 0.f}};
  uint64_t seed = 1;
  for (const Sizes& z : cases) {
    ++seed;
    const std::vector<float> x = random_vector(size_t(z.N * z.in), seed), W = random_vector(size_t(z.out * z.in), seed + 1),
                             A = random_vector(size_t(z.r * z.in), seed + 2), B = random_vector(size_t(z.out * z.r), seed + 3),
                             dy = random_vector(size_t(z.N * z.out), seed + 4);
    const LoraShape s{z.r, 2.5f, z.p};
    const LoraSite site{lora_site_key(seed, 3, Adapted::v_proj), 0};
    const LoraView l{WeightRef{A.data(), DType::f32}, WeightRef{B.data(), DType::f32}};
    std::vector<float> y(size_t(z.N * z.out)), dx(size_t(z.N * z.in)), dA(A.size(), 0.f), dB(B.size(), 0.f);
    adapted_forward(y.data(), x.data(), WeightRef{W.data(), DType::f32}, nullptr, l, s, site, z.N, z.in, z.out);
    adapted_backward(dx.data(), nullptr, nullptr, LoraGrads{dA.data(), dB.data()}, dy.data(), x.data(),
                     WeightRef{W.data(), DType::f32}, l, s, site, z.N, z.in, z.out);
    const Reference ref = reference(z, x, W, A, B, 2.5f, site, dy);
    // f32 GEMMs over at most 64 terms of O(1) values against double: 1e-5 relative to the largest element.
    EXPECT_LT(max_rel(y, ref.y), 1e-5) << "N " << z.N;
    EXPECT_LT(max_rel(dx, ref.dx), 1e-5) << "N " << z.N;
    EXPECT_LT(max_rel(dA, ref.dA), 1e-5) << "N " << z.N;
    EXPECT_LT(max_rel(dB, ref.dB), 1e-5) << "N " << z.N;
  }
}

// Central differences of a projection of y in A, B and x (dropout on: the mask is a function of the key alone).
TEST(Lora, GradientsMatchCentralDifferences) {
  const Sizes z{9, 12, 10, 3, 0.25f};
  std::vector<float> x = random_vector(size_t(z.N * z.in), 11), W = random_vector(size_t(z.out * z.in), 12),
                     A = random_vector(size_t(z.r * z.in), 13), B = random_vector(size_t(z.out * z.r), 14);
  const std::vector<float> proj = random_vector(size_t(z.N * z.out), 15);
  const LoraShape s{z.r, 0.75f, z.p};
  const LoraSite site{lora_site_key(99, 0, Adapted::in_proj_qkv), 0};
  auto loss = [&] {
    std::vector<float> y(size_t(z.N * z.out));
    adapted_forward(y.data(), x.data(), WeightRef{W.data(), DType::f32}, nullptr,
                    LoraView{WeightRef{A.data(), DType::f32}, WeightRef{B.data(), DType::f32}}, s, site, z.N, z.in, z.out);
    return testing::dot(y, proj);
  };
  std::vector<float> dx(x.size()), dA(A.size(), 0.f), dB(B.size(), 0.f);
  adapted_backward(dx.data(), nullptr, nullptr, LoraGrads{dA.data(), dB.data()}, proj.data(), x.data(),
                   WeightRef{W.data(), DType::f32}, LoraView{WeightRef{A.data(), DType::f32}, WeightRef{B.data(), DType::f32}},
                   s, site, z.N, z.in, z.out);
  // h = 1e-2 on O(1) data (tests/testing/grad_check.h): 1e-3 relative holds both error terms.
  EXPECT_LT(grad_check(A, dA, loss, 1).max_rel_error, 1e-3);
  EXPECT_LT(grad_check(B, dB, loss, 2).max_rel_error, 1e-3);
  EXPECT_LT(grad_check(x, dx, loss, 3).max_rel_error, 1e-3);
}

// bf16 weights: each of the adapter's GEMMs reads its input rounded to bf16 (as every linear does), so the result is
// the f32 path's on rounded operands: u = bf16(x)·A, t = bf16(u)·B.
TEST(Lora, Bf16GemmsRoundEachInput) {
  const Sizes z{17, 20, 12, 4, 0.f};
  const std::vector<float> x = random_vector(size_t(z.N * z.in), 21), A = random_vector(size_t(z.r * z.in), 22),
                           B = random_vector(size_t(z.out * z.r), 23);
  std::vector<bf16_t> Ab(A.size()), Bb(B.size());
  convert_f32_to_bf16(Ab.data(), A.data(), A.size());
  convert_f32_to_bf16(Bb.data(), B.data(), B.size());
  std::vector<float> y(size_t(z.N * z.out), 0.f);
  const LoraShape s{z.r, 2.f, 0.f};
  lora_forward(y.data(), x.data(), LoraView{WeightRef{Ab.data(), DType::bf16}, WeightRef{Bb.data(), DType::bf16}}, s,
               LoraSite{}, z.N, z.in, z.out);
  for (int64_t n = 0; n < z.N; ++n)
    for (int64_t j = 0; j < z.out; ++j) {
      double t = 0;
      for (int64_t k = 0; k < z.r; ++k) {
        double u = 0;
        for (int64_t i = 0; i < z.in; ++i)
          u += double(round_to_bf16(x[size_t(n * z.in + i)])) * double(bf16_to_f32(Ab[size_t(k * z.in + i)]));
        t += double(round_to_bf16(float(u))) * double(bf16_to_f32(Bb[size_t(j * z.r + k)]));
      }
      // The f32 accumulation of 20 and 4 products of bf16 values against double: a few f32 ulps.
      EXPECT_NEAR(y[size_t(n * z.out + j)], 2.0 * t, 1e-5 * (1 + std::fabs(2.0 * t))) << n << "," << j;
    }
}

// A chunk of rows starting at row0 draws its rows' part of the whole batch's mask: chunked MLP rows give the bits of
// one call over every row. Chunks of kGemmRowBlock rows: the GEMMs' rows do not depend on how many there are in whole
// row blocks (ops/gemm.h; the MLP's chunks are multiples of kTokenSlice).
TEST(Lora, RowChunksDrawTheirPartOfOneMask) {
  const Sizes z{2 * kGemmRowBlock + 37, 16, 8, 2, 0.3f};
  const std::vector<float> x = random_vector(size_t(z.N * z.in), 31), A = random_vector(size_t(z.r * z.in), 32),
                           B = random_vector(size_t(z.out * z.r), 33);
  const LoraShape s{z.r, 1.f, z.p};
  const LoraView l{WeightRef{A.data(), DType::f32}, WeightRef{B.data(), DType::f32}};
  const uint64_t key = lora_site_key(7, 2, Adapted::down_proj);
  std::vector<float> whole(size_t(z.N * z.out), 0.f), parts(whole.size(), 0.f);
  lora_forward(whole.data(), x.data(), l, s, LoraSite{key, 0}, z.N, z.in, z.out);
  for (int64_t r0 = 0; r0 < z.N; r0 += kGemmRowBlock) {
    const int64_t n = std::min<int64_t>(kGemmRowBlock, z.N - r0);
    lora_forward(parts.data() + r0 * z.out, x.data() + r0 * z.in, l, s, LoraSite{key, r0}, n, z.in, z.out);
  }
  EXPECT_EQ(0, std::memcmp(whole.data(), parts.data(), whole.size() * 4));
  // Another layer's or linear's key draws another mask.
  std::vector<float> other(whole.size(), 0.f);
  lora_forward(other.data(), x.data(), l, s, LoraSite{lora_site_key(7, 3, Adapted::down_proj), 0}, z.N, z.in, z.out);
  EXPECT_NE(0, std::memcmp(whole.data(), other.data(), whole.size() * 4));
}

TEST(Lora, TheMaskKeepsOneMinusPOfTheElements) {
  for (const float p : {0.05f, 0.3f, 0.7f}) {
    int64_t kept = 0;
    const int64_t n = 200000;
    for (int64_t i = 0; i < n; ++i) kept += lora_keep(12345, uint64_t(i), p);
    // Binomial(n, 1 - p): the standard deviation is at most 112 elements here; 5 of them.
    EXPECT_NEAR(double(kept), double(n) * (1 - p), 5 * std::sqrt(double(n) * p * (1 - p))) << p;
  }
}

}  // namespace
}  // namespace lt

// PEFT's files (model/peft.h): written, read back and written again byte for byte; the config's fields; mistakes named.
#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "io/json_file.h"
#include "model/peft.h"
#include "testing/error_testing.h"
#include "testing/exec_testing.h"

namespace lt {
namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(PeftFiles, SaveLoadSaveIsByteForByte) {
  Rng rng(3);
  for (int k = 0; k < 4; ++k) {  // dense, hybrid, dense with lm_head, Qwen3.5-MoE (router, experts, shared expert)
    ModelConfig cfg = k == 1 ? testing::random_hybrid_config(rng)
                      : k == 3 ? testing::random_hybrid_moe_config(rng)
                               : testing::random_config(rng);
    cfg.tie_word_embeddings = k == 2 ? false : cfg.tie_word_embeddings;
    std::vector<std::string> extra = {"norm"};
    if (k == 2) extra.push_back("lm_head");
    cfg.finetune = std::make_shared<const Finetune>(make_lora(cfg, 3 + k, 7, 0.05, k == 1, {"all"}, extra));
    ModelSlabs a = testing::random_params(cfg, 100 + uint64_t(k));  // every tensor; the adapters among them
    ModelSlabs trained(cfg, DType::f32, Fill::zero, SlabSet::trained);
    copy_tensors_by_name(trained, a);
    const std::string d1 = ::testing::TempDir() + "peft_a" + std::to_string(k), d2 = d1 + "_again";
    save_peft_adapter(trained, d1, "some/base");
    ModelSlabs back(cfg, DType::f32, Fill::zero, SlabSet::trained);
    load_peft_adapter(d1, back);
    save_peft_adapter(back, d2, "some/base");
    for (const char* f : {"adapter_config.json", "adapter_model.safetensors"})
      EXPECT_EQ(read_bytes(d1 + "/" + f), read_bytes(d2 + "/" + f)) << f;
    const PeftAdapterConfig c = read_peft_config(d1);
    EXPECT_EQ(c.r, 3 + k);
    EXPECT_EQ(c.lora_alpha, 7);
    EXPECT_EQ(c.use_rslora, k == 1);
    EXPECT_EQ(c.base_model_name_or_path, "some/base");
    EXPECT_EQ(c.modules_to_save.back(), hf_prefix(cfg) + "norm");  // the final norm alone (PEFT matches by suffix)
    const nlohmann::json j = read_json_file(d1 + "/adapter_config.json");
    EXPECT_EQ(j["peft_type"], "LORA");
    EXPECT_EQ(j["task_type"], "CAUSAL_LM");
    // The adapter's names: base_model.model.<HF name>, A [r, in] and B [out, r].
    const SafetensorsFile f = SafetensorsFile::open(d1 + "/adapter_model.safetensors");
    const std::string l0 = k == 3 ? "mlp.experts.1.gate_proj"
                           : k == 1 && cfg.layer_kind(0) == LayerKind::linear_attention ? "linear_attn.in_proj_z"
                                                                                        : "mlp.up_proj";
    const SafetensorsTensorInfo& A = f.info("base_model.model.model.layers.0." + l0 + ".lora_A.weight");
    const SafetensorsTensorInfo& B = f.info("base_model.model.model.layers.0." + l0 + ".lora_B.weight");
    EXPECT_EQ(A.shape, (Shape{3 + k, cfg.hidden_size}));
    EXPECT_EQ(B.shape[1], 3 + k);
    EXPECT_TRUE(f.contains("base_model.model.model.norm.weight"));
    if (k == 3) {  // PEFT's names of the per-expert modules, the router and the shared expert's gate
      EXPECT_EQ(f.info("base_model.model.model.layers.0.mlp.gate.lora_B.weight").shape, (Shape{cfg.num_experts, 6}));
      EXPECT_EQ(f.info("base_model.model.model.layers.0.mlp.shared_expert_gate.lora_B.weight").shape, (Shape{1, 6}));
      EXPECT_TRUE(f.contains(fmt::format("base_model.model.model.layers.{}.mlp.experts.{}.down_proj.lora_A.weight",
                                         cfg.num_layers - 1, cfg.num_experts - 1)));
      EXPECT_TRUE(f.contains("base_model.model.model.layers.0.mlp.shared_expert.up_proj.lora_A.weight"));
    }
  }
}

TEST(PeftFiles, MistakesAreNamed) {
  Rng rng(4);
  ModelConfig cfg = testing::random_config(rng);
  cfg.finetune = std::make_shared<const Finetune>(make_lora(cfg, 2, 4, 0, false, {"q_proj", "v_proj"}, {}));
  ModelSlabs trained(cfg, DType::f32, Fill::zero, SlabSet::trained);
  const std::string d = ::testing::TempDir() + "peft_bad";
  save_peft_adapter(trained, d, "base");
  // Another model's adapter (a different rank): shapes named.
  ModelConfig other = cfg;
  other.finetune = std::make_shared<const Finetune>(make_lora(cfg, 3, 4, 0, false, {"q_proj", "v_proj"}, {}));
  ModelSlabs wrong(other, DType::f32, Fill::zero, SlabSet::trained);
  testing::expect_error([&] { load_peft_adapter(d, wrong); }, {"adapter_model.safetensors", "q_proj.lora_A.weight"});
  // More targets than the file has: the missing tensors named.
  ModelConfig more = cfg;
  more.finetune = std::make_shared<const Finetune>(make_lora(cfg, 2, 4, 0, false, {"q_proj", "v_proj", "o_proj"}, {}));
  ModelSlabs wider(more, DType::f32, Fill::zero, SlabSet::trained);
  testing::expect_error([&] { load_peft_adapter(d, wider); }, {"missing tensor", "o_proj.lora_A.weight"});
  // Fewer: the file's extra tensor named.
  ModelConfig fewer = cfg;
  fewer.finetune = std::make_shared<const Finetune>(make_lora(cfg, 2, 4, 0, false, {"q_proj"}, {}));
  ModelSlabs narrow(fewer, DType::f32, Fill::zero, SlabSet::trained);
  testing::expect_error([&] { load_peft_adapter(d, narrow); }, {"unexpected tensor", "v_proj.lora_A.weight"});
  // Configs LazyTrain does not compute.
  nlohmann::json j = read_json_file(d + "/adapter_config.json");
  j["use_dora"] = true;
  write_json_file(d + "/adapter_config.json", j);
  testing::expect_error([&] { read_peft_config(d); }, {"adapter_config.json", "use_dora"});
  j["use_dora"] = false;
  j["peft_type"] = "IA3";
  write_json_file(d + "/adapter_config.json", j);
  testing::expect_error([&] { read_peft_config(d); }, {"adapter_config.json", "IA3"});
  j["peft_type"] = "LORA";
  j["target_modules"] = {"q_proj", "gate"};
  write_json_file(d + "/adapter_config.json", j);
  testing::expect_error([&] { finetune_of_adapter(cfg, read_peft_config(d), d); }, {"lora_target", "'gate'"});
  testing::expect_error([&] { read_peft_config(d + "/nowhere"); }, {"nowhere", "adapter_config.json"});
}

// `merged` (layer 0's `linear`) is `all`'s W + s · B A (its adapter's, in `all`).
void expect_merged(const ModelSlabs& merged, const ModelSlabs& all, const std::string& linear, float s) {
  const TensorView W = merged.tensor(SlabKind::layer, 0, linear + ".weight");
  const TensorView W0 = all.tensor(SlabKind::layer, 0, linear + ".weight");
  const TensorView A = all.tensor(SlabKind::layer, 0, linear + ".lora_A.weight");
  const TensorView B = all.tensor(SlabKind::layer, 0, linear + ".lora_B.weight");
  for (int64_t i = 0; i < W.shape[0]; ++i)
    for (int64_t j = 0; j < W.shape[1]; ++j) {
      double d = 0;
      for (int64_t k = 0; k < A.shape[0]; ++k) d += double(B.get({i, k})) * double(A.get({k, j}));
      EXPECT_NEAR(W.get({i, j}), W0.get({i, j}) + s * d, 1e-5) << linear << " " << i << "," << j;
    }
}

// A random LoRA (every linear) of `base_cfg` and its base merged with it (merge_adapters).
struct MergedCase {
  ModelConfig cfg;     // with the LoRA
  ModelSlabs all;      // the base's tensors and the adapters, random
  ModelSlabs merged;   // the base with the adapters merged
};
MergedCase merge_random(const ModelConfig& base_cfg, int64_t r, double alpha, bool rslora,
                        const std::vector<std::string>& extra, uint64_t seed) {
  ModelConfig cfg = base_cfg;
  cfg.finetune = std::make_shared<const Finetune>(make_lora(cfg, r, alpha, 0, rslora, {"all"}, extra));
  ModelSlabs all = testing::random_params(cfg, seed);
  ModelSlabs trained(cfg, DType::f32, Fill::zero, SlabSet::trained);
  copy_tensors_by_name(trained, all);
  ModelSlabs merged(base_cfg);
  copy_tensors_by_name(merged, all);
  merge_adapters(merged, trained);
  return MergedCase{cfg, std::move(all), std::move(merged)};
}

// A merged model is W + s · B A: its linear gives the adapted linear's output.
TEST(PeftFiles, MergingAddsTheScaledProductToEachAdaptedWeight) {
  Rng rng(5);
  const MergedCase dense = merge_random(testing::random_config(rng), 3, 5, true, {"norm"}, 9);
  expect_merged(dense.merged, dense.all, "self_attn.o_proj", dense.cfg.finetune->scale());
  EXPECT_EQ(0, std::memcmp(dense.merged.tensor(SlabKind::head, 0, "norm.weight").data,
                           dense.all.tensor(SlabKind::head, 0, "norm.weight").data, size_t(dense.cfg.hidden_size) * 4));
  // A Mixture-of-Experts model: each expert's own adapter merged into its matrix, the router's into the router.
  ModelConfig moe_base = testing::random_moe_config(rng);
  moe_base.mlp_only_layers.clear();
  const MergedCase moe = merge_random(moe_base, 2, 3, false, {}, 10);
  expect_merged(moe.merged, moe.all, "mlp.gate", moe.cfg.finetune->scale());
  expect_merged(moe.merged, moe.all, fmt::format("mlp.experts.{}.down_proj", moe.cfg.num_experts - 1),
                moe.cfg.finetune->scale());
}

}  // namespace
}  // namespace lt
