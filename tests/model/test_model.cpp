// The in-memory model: finite differences of the whole model, bf16 mode against f32, determinism,
// HF save/load round trip, and the batch's input checks. (The PyTorch comparison is model_vs_torch.*.)
#include <filesystem>

#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "ops/head.h"
#include "testing/grad_check.h"
#include "testing/model_testing.h"

namespace lt {
namespace {

ModelConfig tiny_config(ModelType type, bool tied) {
  // Qwen3: Hq*D (48) != C (24). Llama here carries every optional bias.
  ModelConfig c = testing::small_model_config(
      type, {.vocab = 29, .hidden = 24, .intermediate = 37, .layers = 2, .heads = 3, .kv_heads = 1,
             .head_dim = type == ModelType::qwen3 ? 16 : 8, .tied = tied, .max_positions = 128});
  c.qkv_bias = type == ModelType::qwen2 || type == ModelType::llama;
  c.o_bias = c.mlp_bias = type == ModelType::llama;
  if (type == ModelType::qwen3_moe) {  // a dense layer (0) before a sparse one: 5 experts of 11, 2 per token
    c.qk_norm = true;
    c.head_dim = 16;
    c.num_experts = 5;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 11;
    c.norm_topk_prob = tied;  // the tied case renormalises
    c.mlp_only_layers = {0};
  }
  return c;
}

// Weights large enough that every term of the gradient matters; norm weights and biases away from 1/0.
ModelSlabs random_params(const ModelConfig& cfg, uint64_t seed, double scale = 0.3) {
  return testing::random_model_params(cfg, seed, scale, 0.2);
}

Batch random_batch(const ModelConfig& cfg, int64_t B, int64_t T, uint64_t seed) {
  Rng rng(seed);
  Batch b;
  b.B = B;
  b.T = T;
  for (int64_t i = 0; i < B * T; ++i) b.input_ids.push_back(int32_t(rng.below(uint64_t(cfg.vocab_size))));
  b.labels = b.input_ids;
  for (int64_t r = 0; r < B; ++r) b.labels[size_t(r * T)] = kIgnoreIndex;  // a masked "prompt" token
  return b;
}

struct ModelCase {
  ModelType type;
  bool tied;
};

class Model : public ::testing::TestWithParam<ModelCase> {};

TEST_P(Model, GradientsMatchFiniteDifferences) {
  ModelConfig cfg = tiny_config(GetParam().type, GetParam().tied);
  ModelSlabs params = random_params(cfg, 11);
  Batch batch = random_batch(cfg, 2, 13, 12);
  ModelSlabs grads(cfg);
  model_forward_backward(grads, params, batch, ComputeType::f32);

  // Every tensor, a few elements each. The mean CE is O(1); f32 forward noise ~1e-6 relative, so with
  // h = 1e-2 the central difference is good to ~1e-3 relative (see grad_check.h); bound 2e-2.
  auto P = params.named_tensors();
  auto G = grads.named_tensors();
  for (size_t t = 0; t < P.size(); ++t) {
    float* p = P[t].view.ptr<float>();
    size_t n = size_t(P[t].view.numel());
    std::vector<float> x(p, p + n), g(G[t].view.ptr<float>(), G[t].view.ptr<float>() + n);
    auto loss = [&]() {
      std::copy(x.begin(), x.end(), p);
      return model_forward(params, batch, ComputeType::f32).loss();
    };
    auto r = testing::grad_check(x, g, loss, 100 + t, 4);
    std::copy(x.begin(), x.end(), p);
    EXPECT_GRAD_OK(r, 2e-2, P[t].hf_name);
  }
}

TEST_P(Model, ForwardLossEqualsBackwardLossBitwise) {
  ModelConfig cfg = tiny_config(GetParam().type, GetParam().tied);
  ModelSlabs params = random_params(cfg, 21);
  Batch batch = random_batch(cfg, 2, 11, 22);
  ModelSlabs grads(cfg);
  for (ComputeType ct : {ComputeType::f32, ComputeType::bf16}) {
    LossResult a = model_forward(params, batch, ct);
    LossResult b = model_forward_backward(grads, params, batch, ct);
    EXPECT_EQ(a.loss_sum, b.loss_sum);
    EXPECT_EQ(a.tokens, b.tokens);
  }
}

TEST_P(Model, Bf16CloseToF32) {
  ModelConfig cfg = tiny_config(GetParam().type, GetParam().tied);
  ModelSlabs params = random_params(cfg, 31, 0.1);  // a typical init scale (0.3 gives sharp softmaxes)
  Batch batch = random_batch(cfg, 2, 17, 32);
  ModelSlabs g32(cfg), g16(cfg);
  double l32 = model_forward_backward(g32, params, batch, ComputeType::f32).loss();
  double l16 = model_forward_backward(g16, params, batch, ComputeType::bf16).loss();
  // bf16 operand rounding is 2^-9 relative; over two layers the loss moves by well under 1%.
  EXPECT_NEAR(l16, l32, 1e-2 * std::fabs(l32));
  // Gradient error relative to max(tensor norm, 1% of the largest tensor norm): some gradients are
  // nearly zero in exact arithmetic (k_proj.bias: softmax is shift-invariant up to RoPE), and their
  // own relative error measures only noise. Each operand rounding is 2e-3; through two layers of
  // backward products the errors compound to a few percent: bound 5e-2.
  auto A = g16.named_tensors(), B = g32.named_tensors();
  double largest = 0;
  for (auto& t : B) largest = std::max(largest, std::sqrt(testing::dot_self(t.view.ptr<float>(), t.view.numel())));
  for (size_t t = 0; t < A.size(); ++t) {
    const float *a = A[t].view.ptr<float>(), *b = B[t].view.ptr<float>();
    int64_t n = A[t].view.numel();
    std::vector<float> diff(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) diff[size_t(i)] = a[i] - b[i];
    double err = std::sqrt(testing::dot_self(diff.data(), n));
    double ref = std::max(std::sqrt(testing::dot_self(b, n)), 1e-2 * largest);
    EXPECT_LT(err / ref, 5e-2) << A[t].hf_name;
  }
}

TEST_P(Model, BitsIndependentOfThreadCount) {
  ModelConfig cfg = tiny_config(GetParam().type, GetParam().tied);
  ModelSlabs params = random_params(cfg, 41);
  Batch batch = random_batch(cfg, 3, 19, 42);
  ModelSlabs g1(cfg), g2(cfg);
  int saved = num_threads();
  set_num_threads(1);
  LossResult r1 = model_forward_backward(g1, params, batch, ComputeType::f32);
  set_num_threads(2);
  LossResult r2 = model_forward_backward(g2, params, batch, ComputeType::f32);
  set_num_threads(saved);
  EXPECT_EQ(r1.loss_sum, r2.loss_sum);
  auto A = g1.named_tensors(), B = g2.named_tensors();
  for (size_t t = 0; t < A.size(); ++t) EXPECT_EQ(0, std::memcmp(A[t].view.data, B[t].view.data, A[t].view.bytes()));
}

TEST_P(Model, GradientsAccumulate) {
  ModelConfig cfg = tiny_config(GetParam().type, GetParam().tied);
  ModelSlabs params = random_params(cfg, 51);
  Batch batch = random_batch(cfg, 1, 9, 52);
  ModelSlabs once(cfg), twice(cfg);
  model_forward_backward(once, params, batch, ComputeType::f32);
  model_forward_backward(twice, params, batch, ComputeType::f32);
  model_forward_backward(twice, params, batch, ComputeType::f32);
  auto A = once.named_tensors(), B = twice.named_tensors();
  // x + x is exact, so two identical accumulations give exactly twice one — except the tied embedding,
  // which sums two contributions per step ((h + e) + h + e is not 2(h + e) in floating point).
  for (size_t t = 0; t < A.size(); ++t) {
    bool two_terms = cfg.tie_word_embeddings && A[t].hf_name == "model.embed_tokens.weight";
    for (int64_t i = 0; i < A[t].view.numel(); ++i) {
      float once2 = 2.f * A[t].view.ptr<float>()[i], twice = B[t].view.ptr<float>()[i];
      if (two_terms)
        ASSERT_NEAR(once2, twice, 1e-6f * std::fabs(once2) + 1e-12f) << A[t].hf_name;
      else
        ASSERT_EQ(once2, twice) << A[t].hf_name;
    }
  }
}

TEST_P(Model, HfDirectoryRoundTrip) {
  ModelConfig cfg = tiny_config(GetParam().type, GetParam().tied);
  ModelSlabs params = random_params(cfg, 61);
  std::string dir = ::testing::TempDir() + "lt_model_roundtrip_" + std::string(model_type_name(cfg.type)) +
                    (cfg.tie_word_embeddings ? "_tied" : "");
  std::filesystem::remove_all(dir);
  save_hf_model(params, dir, DType::f32, size_t(8) << 10);  // small shards: exercises the index
  LoadedModel m = load_hf_model(dir);
  EXPECT_EQ(m.config, cfg);
  auto A = params.named_tensors(), B = m.params.named_tensors();
  for (size_t t = 0; t < A.size(); ++t) EXPECT_EQ(0, std::memcmp(A[t].view.data, B[t].view.data, A[t].view.bytes()));
}

INSTANTIATE_TEST_SUITE_P(Arch, Model,
                         ::testing::Values(ModelCase{ModelType::qwen2, false}, ModelCase{ModelType::qwen3, false},
                                           ModelCase{ModelType::qwen3, true}, ModelCase{ModelType::llama, false},
                                           ModelCase{ModelType::qwen3_moe, false}, ModelCase{ModelType::qwen3_moe, true}),
                         [](const auto& info) {
                           return std::string(model_type_name(info.param.type)) + (info.param.tied ? "_tied" : "");
                         });

TEST(Layout, SlabsAlignedAndCoverEveryParameter) {
  ModelConfig cfg = tiny_config(ModelType::qwen3, false);
  ModelSlabs p(cfg);
  int64_t total = 0;
  for (SlabKind k : {SlabKind::embedding, SlabKind::layer, SlabKind::head}) {
    const SlabLayout& l = p.layout(k);
    EXPECT_EQ(l.bytes() % 4096, 0u);
    int64_t end = 0;
    for (const auto& e : l.entries()) {
      EXPECT_EQ(e.offset % 64, 0) << e.name;
      EXPECT_GE(e.offset, end) << e.name << " overlaps the previous entry";
      end = e.offset + e.numel() * 4;
    }
    EXPECT_LE(size_t(end), l.bytes());
    total += l.num_parameters() * (k == SlabKind::layer ? cfg.num_layers : 1);
  }
  EXPECT_EQ(total, cfg.num_parameters());
  for (int64_t i = 0; i < cfg.num_layers; ++i) EXPECT_EQ(reinterpret_cast<uintptr_t>(p.layer(i)) % 4096, 0u);
}

TEST(Load, MissingAndUnexpectedTensorsAreNamed) {
  ModelConfig cfg = tiny_config(ModelType::qwen2, false);
  ModelSlabs params = random_params(cfg, 71);
  std::string dir = ::testing::TempDir() + "lt_model_missing";
  std::filesystem::remove_all(dir);
  save_hf_model(params, dir, DType::bf16, size_t(1) << 30);
  // Drop one tensor and add a stray one.
  SafetensorsFile f = SafetensorsFile::open(dir + "/model.safetensors");
  NamedTensors kept;
  for (const auto& n : f.names())
    if (n != "model.layers.1.mlp.up_proj.weight") kept[n] = f.view(n);
  std::vector<float> stray(3, 1.f);
  kept["model.layers.9.mlp.extra.weight"] = TensorView::contiguous(stray.data(), DType::f32, {3});
  write_safetensors(dir + "/model.tmp.safetensors", kept);
  std::filesystem::rename(dir + "/model.tmp.safetensors", dir + "/model.safetensors");
  try {
    load_hf_model(dir);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.1.mlp.up_proj.weight"), std::string::npos) << e.what();
  }
  // Put the missing one back: now the stray tensor is the error.
  kept["model.layers.1.mlp.up_proj.weight"] = params.tensor(SlabKind::layer, 1, "mlp.up_proj.weight");
  write_safetensors(dir + "/model.safetensors", kept);
  try {
    load_hf_model(dir);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.9.mlp.extra.weight"), std::string::npos) << e.what();
  }
}

TEST(BatchInput, BadBatchesAreRefusedWithTheirPosition) {
  auto expect_error = [](const char* json, const char* needle) {
    try {
      Batch::from_json(nlohmann::json::parse(json), "batch.json", 10);
      ADD_FAILURE() << "expected an error for " << json;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(R"({"input_ids": [[1, 2, 3], [4, 5]]})", "input_ids[1] has 2 tokens");
  expect_error(R"({"input_ids": [[1, 2, 10]]})", "input_ids[0][2] = 10");
  expect_error(R"({"input_ids": [[1, -100]]})", "input_ids[0][1] = -100");
  expect_error(R"({"input_ids": [[1, 2]], "labels": [[1, 2, 3]]})", "labels are 1x3 but input_ids are 1x2");
  expect_error(R"({"input_ids": [[1, 2]], "labels": [[1, 11]]})", "labels[0][1] = 11");
  expect_error(R"({"labels": [[1, 2]]})", "missing \"input_ids\"");
  expect_error(R"({"input_ids": []})", "non-empty");
  expect_error(R"({"input_ids": [[1, "a"]]})", "input_ids[0][1] is not an integer");
  Batch ok = Batch::from_json(nlohmann::json::parse(R"({"input_ids": [[1, 2, 3]], "labels": [[-100, 2, 3]]})"),
                              "batch.json", 10);
  EXPECT_EQ(StepTokens::make(ok).count, 2);
}

TEST(BatchInput, NoCountedTokenIsAnError) {
  ModelConfig cfg = tiny_config(ModelType::llama, false);
  ModelSlabs params = random_params(cfg, 81), grads(cfg);
  Batch b = Batch::from_json(nlohmann::json::parse(R"({"input_ids": [[1, 2, 3]], "labels": [[1, -100, -100]]})"),
                             "batch.json", cfg.vocab_size);
  EXPECT_THROW(model_forward_backward(grads, params, b, ComputeType::f32), Error);
}

}  // namespace
}  // namespace lt
