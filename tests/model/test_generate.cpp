// Greedy decoding with the KV cache equals argmax of a full forward over the same sequence.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/rng.h"
#include "model/block.h"
#include "model/generate.h"
#include "ops/ops.h"
#include "testing/exec_testing.h"

namespace lt {
namespace {

// Argmax of the logits at every position of `seq`, by the training kernels on the whole sequence.
std::vector<int32_t> full_forward_argmax(const ModelSlabs& p, const std::vector<int32_t>& seq) {
  const ModelConfig& cfg = p.config();
  const int64_t T = int64_t(seq.size()), C = cfg.hidden_size, V = cfg.vocab_size;
  BlockShape s = BlockShape::make(cfg, 1, T);
  std::vector<float> x(static_cast<size_t>(T * C)), y(static_cast<size_t>(T * C));
  size_t acts_floats = 0;
  for (int64_t l = 0; l < cfg.num_layers; ++l)
    acts_floats = std::max(acts_floats, WorkingCopy::floats(s.for_layer(cfg, l)));
  std::vector<float> acts(acts_floats);
  std::vector<int32_t> pos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = int32_t(t);
  embedding_forward(x.data(), seq.data(), p.tensor(SlabKind::embedding, 0, "embed_tokens.weight").ptr<float>(), T, C, V);
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    const BlockShape sl = s.for_layer(cfg, l);
    WorkingCopy a = WorkingCopy::bind(acts.data(), sl);
    block_forward(y.data(), a, x.data(), BlockView::bind(p.layout(SlabKind::layer, l), p.layer(l)),
                  TokenInfo{pos.data(), nullptr}, sl);
    std::swap(x, y);
  }
  std::vector<float> xn(static_cast<size_t>(T * C)), rstd(static_cast<size_t>(T)), logits(static_cast<size_t>(T * V));
  std::vector<float> norm_w(p.tensor(SlabKind::head, 0, "norm.weight").ptr<float>(),
                            p.tensor(SlabKind::head, 0, "norm.weight").ptr<float>() + C);
  if (cfg.zero_centred_norms)
    for (float& w : norm_w) w += 1.0f;  // Qwen3.5: x·rstd·(1 + w)
  rmsnorm_forward(xn.data(), rstd.data(), x.data(), norm_w.data(), T, C, float(cfg.rms_norm_eps));
  TensorView lm = p.lm_head();
  linear_forward(logits.data(), xn.data(), WeightRef{lm.data, lm.dtype}, nullptr, T, C, V);
  std::vector<int32_t> out;
  for (int64_t t = 0; t < T; ++t)
    out.push_back(int32_t(std::max_element(logits.begin() + t * V, logits.begin() + (t + 1) * V) - (logits.begin() + t * V)));
  return out;
}

class Generate : public ::testing::TestWithParam<ModelType> {};

TEST_P(Generate, KvCacheDecodeEqualsFullForward) {
  ModelConfig c;
  c.type = GetParam();
  c.vocab_size = 97;
  c.hidden_size = 48;
  c.intermediate_size = 64;
  c.num_layers = 3;
  c.num_heads = 6;
  c.num_kv_heads = 2;
  c.head_dim = c.type == ModelType::qwen3 ? 16 : 8;
  c.qkv_bias = c.type == ModelType::qwen2;
  c.qk_norm = c.type == ModelType::qwen3;
  c.tie_word_embeddings = c.type == ModelType::qwen3;
  c.max_position_embeddings = 128;
  ModelSlabs p(c);
  init_random(p, 5, 0.3f);  // large weights: sharp, varied predictions rather than one repeated token
  Rng rng(6);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 13; ++i) prompt.push_back(int32_t(rng.below(97)));
  GenerateOptions o;
  o.max_new_tokens = 12;
  std::vector<int32_t> out = generate_greedy(p, prompt, o);
  ASSERT_EQ(out.size(), 12u);
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), out.begin(), out.end() - 1);
  std::vector<int32_t> ref = full_forward_argmax(p, seq);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], ref[prompt.size() - 1 + i]) << "token " << i;
  // Stopping: generation ends right after a stop id.
  o.stop_ids = {out[3]};
  std::vector<int32_t> stopped = generate_greedy(p, prompt, o);
  EXPECT_LE(stopped.size(), 4u);
  EXPECT_EQ(stopped.back(), out[3]);
}

// Qwen3.5 hybrids: the Gated DeltaNet cache (the conv's last inputs, the delta rule's state by the recurrence) and
// gated attention with partial RoPE. Prompts of 2 tokens (fewer than the conv's K-1 = 3: zero rows in the cache)
// and 70 (the prefill's chunked delta rule crosses a chunk of 64).
TEST(GenerateHybrid, StateCacheDecodeEqualsFullForward) {
  ModelConfig c;
  c.type = ModelType::qwen3_5;
  c.vocab_size = 97;
  c.hidden_size = 48;
  c.intermediate_size = 64;
  c.num_layers = 3;
  c.layer_types = {LayerKind::linear_attention, LayerKind::full_attention, LayerKind::linear_attention};
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 12;
  c.qk_norm = true;
  c.attn_output_gate = true;
  c.zero_centred_norms = true;
  c.partial_rotary_factor = 0.5;
  c.linear_num_key_heads = 2;
  c.linear_num_value_heads = 4;
  c.linear_key_head_dim = 10;
  c.linear_value_head_dim = 6;
  c.linear_conv_kernel_dim = 4;
  c.max_position_embeddings = 128;
  ModelSlabs p(c);
  init_random(p, 7, 0.3f);
  for (int64_t P : {2, 70}) {
    Rng rng(static_cast<uint64_t>(P));
    std::vector<int32_t> prompt;
    for (int64_t i = 0; i < P; ++i) prompt.push_back(int32_t(rng.below(97)));
    GenerateOptions o;
    o.max_new_tokens = 10;
    std::vector<int32_t> out = generate_greedy(p, prompt, o);
    ASSERT_EQ(out.size(), 10u);
    std::vector<int32_t> seq = prompt;
    seq.insert(seq.end(), out.begin(), out.end() - 1);
    std::vector<int32_t> ref = full_forward_argmax(p, seq);
    for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], ref[prompt.size() - 1 + i]) << "prompt " << P << " token " << i;
  }
}

// Mixture-of-Experts: Qwen3-MoE's sparse layers (a dense one among them), Qwen3.5-MoE's (Gated DeltaNet's state cache
// and a shared expert), and GPT-OSS's — sliding layers (window 4)
// and full ones, every head's sink in the cached softmax, YaRN, the biased router and clamped experts. Prompts of 2
// tokens (inside one window) and 19 (the window slides over the cache during the prefill and every decoded token).
TEST(GenerateMoe, KvCacheDecodeEqualsFullForward) {
  for (const ModelType type : {ModelType::qwen3_moe, ModelType::gpt_oss, ModelType::qwen3_5}) {
    SCOPED_TRACE(model_type_name(type));
    Rng rng(40 + uint64_t(type));
    ModelConfig c = type == ModelType::gpt_oss ? testing::random_gpt_oss_config(rng)
                    : type == ModelType::qwen3_5 ? testing::random_hybrid_moe_config(rng)
                                                 : testing::random_moe_config(rng);
    if (type == ModelType::gpt_oss) c.sliding_window = 4;
    c.max_position_embeddings = 128;
    ModelSlabs p(c);
    init_random(p, 9, 0.3f);
    for (int64_t P : {2, 19}) {
      std::vector<int32_t> prompt;
      for (int64_t i = 0; i < P; ++i) prompt.push_back(int32_t(rng.below(uint64_t(c.vocab_size))));
      GenerateOptions o;
      o.max_new_tokens = 10;
      const std::vector<int32_t> out = generate_greedy(p, prompt, o);
      ASSERT_EQ(out.size(), 10u);
      std::vector<int32_t> seq = prompt;
      seq.insert(seq.end(), out.begin(), out.end() - 1);
      const std::vector<int32_t> ref = full_forward_argmax(p, seq);
      for (size_t i = 0; i < out.size(); ++i)
        EXPECT_EQ(out[i], ref[prompt.size() - 1 + i]) << "prompt " << P << " token " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Arch, Generate, ::testing::Values(ModelType::qwen2, ModelType::qwen3, ModelType::llama));

}  // namespace
}  // namespace lt
