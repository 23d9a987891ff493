// Tests for model/config.h's Mixture-of-Experts models (qwen3_moe, qwen3_5_moe, gpt_oss): the released configs
// (Qwen3-30B-A3B, Qwen3.5-35B-A3B, GPT-OSS 20B and 120B), which layers are sparse, the classes' defaults, the round trip
// through model_config_to_json, and the refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "io/json_file.h"
#include "model/config.h"
#include "testing/error_testing.h"

namespace lt {
namespace {

using nlohmann::json;
using testing::expect_error;

json qwen3_30b_a3b() { return read_json_file(std::string(LT_SOURCE_DIR) + "/examples/qwen3-30b-a3b/config.json"); }
ModelConfig parse(const json& j) { return parse_model_config(j, "config.json"); }
json with(json j, const json& changes) {
  for (auto& [k, v] : changes.items()) j[k] = v;
  return j;
}

TEST(ModelConfigMoe, ParsesQwen3_30B_A3B) {
  const ModelConfig c = parse(qwen3_30b_a3b());
  EXPECT_EQ(c.type, ModelType::qwen3_moe);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias || c.o_bias || c.mlp_bias);
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 768);
  EXPECT_EQ(c.intermediate_size, 6144);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.num_sparse_layers(), 48);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.torch_dtype, DType::bf16);
}

// transformers: sparse iff not in mlp_only_layers and (l + 1) % decoder_sparse_step == 0.
TEST(ModelConfigMoe, SparseLayersByStepAndMlpOnlyLayers) {
  const ModelConfig c = parse(with(qwen3_30b_a3b(), {{"num_hidden_layers", 6}, {"decoder_sparse_step", 2},
                                                     {"mlp_only_layers", {3, 4}}}));
  const bool sparse[] = {false, true, false, false, false, true};
  for (int64_t l = 0; l < 6; ++l) EXPECT_EQ(c.sparse_layer(l), sparse[l]) << "layer " << l;
  EXPECT_EQ(c.num_sparse_layers(), 2);
}

TEST(ModelConfigMoe, AppliesQwen3MoeConfigDefaults) {
  json j = qwen3_30b_a3b();
  for (const char* key : {"num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
                          "decoder_sparse_step", "mlp_only_layers", "intermediate_size", "router_aux_loss_coef"})
    j.erase(key);
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 768);
  EXPECT_FALSE(c.norm_topk_prob);  // the class default; the released 30B-A3B sets true
  EXPECT_EQ(c.intermediate_size, 6144);
  EXPECT_EQ(c.router_aux_loss_coef, 0.001);
  EXPECT_EQ(c.num_sparse_layers(), 48);
}

TEST(ModelConfigMoe, RoundTripsThroughJson) {
  for (const json& j : {qwen3_30b_a3b(), with(qwen3_30b_a3b(), {{"mlp_only_layers", {0, 7}}, {"decoder_sparse_step", 3},
                                                                {"norm_topk_prob", false}, {"router_aux_loss_coef", 0.02}})}) {
    const ModelConfig c = parse(j);
    const json out = model_config_to_json(c);
    EXPECT_EQ(out["model_type"], "qwen3_moe");
    EXPECT_EQ(out["architectures"][0], "Qwen3MoeForCausalLM");
    EXPECT_EQ(parse(out), c);
  }
}

TEST(ModelConfigMoe, RefusesWhatItCannotRun) {
  expect_error([] { parse(with(qwen3_30b_a3b(), {{"num_experts_per_tok", 200}})); },
               {"config.json", "'num_experts_per_tok' 200 exceeds 'num_experts' 128"});
  expect_error([] { parse(with(qwen3_30b_a3b(), {{"mlp_only_layers", {48}}})); },
               {"config.json", "'mlp_only_layers' holds 48", "[0, 48)"});
  expect_error([] { parse(with(qwen3_30b_a3b(), {{"mlp_only_layers", "all"}})); },
               {"config.json", "'mlp_only_layers'", "expected a list"});
  expect_error([] { parse(with(qwen3_30b_a3b(), {{"num_experts", 0}})); },
               {"config.json", "'num_experts' is 0, expected a positive integer"});
  expect_error([] { parse(with(qwen3_30b_a3b(), {{"router_aux_loss_coef", -1}})); },
               {"config.json", "'router_aux_loss_coef'", ">= 0"});
  expect_error([] { parse(with(qwen3_30b_a3b(), {{"use_sliding_window", true}})); },
               {"config.json", "sliding-window attention is not supported"});
  // A dense model cannot carry experts into its config.json.
  ModelConfig dense = parse(with(qwen3_30b_a3b(), {{"model_type", "qwen3"}}));
  dense.num_experts = 4;
  expect_error([&] { model_config_to_json(dense); }, {"qwen3 config cannot hold mixture-of-experts layers"});
}

json qwen35_35b_a3b() { return read_json_file(std::string(LT_SOURCE_DIR) + "/examples/qwen3.5-35b-a3b/config.json"); }

// Qwen3.5-35B-A3B (Qwen3.6-35B-A3B has the same topology), the released vision-language form: 40 hybrid layers, every
// MLP 256 experts of 512 (8 per token, renormalised) and a shared expert of 512.
TEST(ModelConfigMoe, ParsesQwen35_35B_A3B) {
  const ModelConfig c = parse(qwen35_35b_a3b());
  EXPECT_EQ(c.type, ModelType::qwen3_5);
  EXPECT_TRUE(c.vision_language);
  EXPECT_TRUE(c.is_moe());
  EXPECT_EQ(c.num_experts, 256);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 512);
  EXPECT_EQ(c.shared_expert_intermediate_size, 512);
  EXPECT_TRUE(c.norm_topk_prob);  // always, in transformers' Qwen3.5-MoE
  EXPECT_EQ(c.intermediate_size, 0);
  EXPECT_EQ(c.num_sparse_layers(), 40);
  EXPECT_EQ(c.num_linear_attention_layers(), 30);
  // 35B in all, 3B active per token (the model card's figures; the MTP layer is not trained).
  EXPECT_NEAR(double(c.num_parameters()), 34.66e9, 0.01e9);
  EXPECT_NEAR(double(c.num_active_parameters()), 3.45e9, 0.01e9);
}

TEST(ModelConfigMoe, Qwen35MoeRoundTripsInBothForms) {
  const ModelConfig vl = parse(qwen35_35b_a3b());
  json out = model_config_to_json(vl);
  EXPECT_EQ(out["model_type"], "qwen3_5_moe");
  EXPECT_EQ(out["architectures"][0], "Qwen3_5MoeForConditionalGeneration");
  EXPECT_EQ(out["text_config"]["model_type"], "qwen3_5_moe_text");
  EXPECT_FALSE(out["text_config"].contains("intermediate_size"));
  EXPECT_EQ(parse(out), vl);
  // The text-only form: the text config at the top.
  json text = qwen35_35b_a3b()["text_config"];
  text["architectures"] = {"Qwen3_5MoeForCausalLM"};
  const ModelConfig t = parse(text);
  EXPECT_FALSE(t.vision_language);
  EXPECT_EQ(t.num_experts, 256);
  out = model_config_to_json(t);
  EXPECT_EQ(out["model_type"], "qwen3_5_moe_text");
  EXPECT_EQ(out["architectures"][0], "Qwen3_5MoeForCausalLM");
  EXPECT_EQ(parse(out), t);
}

TEST(ModelConfigMoe, Qwen35MoeDefaultsAndRefusals) {
  json text = qwen35_35b_a3b()["text_config"];
  for (const char* key : {"num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size"})
    text.erase(key);
  const ModelConfig c = parse(text);  // Qwen3_5MoeTextConfig's defaults
  EXPECT_EQ(c.num_experts, 256);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 512);
  EXPECT_EQ(c.shared_expert_intermediate_size, 512);
  expect_error([] { parse(with(qwen35_35b_a3b()["text_config"], {{"num_experts_per_tok", 300}})); },
               {"config.json", "'num_experts_per_tok' 300 exceeds 'num_experts' 256"});
  expect_error([] { parse(with(qwen35_35b_a3b()["text_config"], {{"shared_expert_intermediate_size", 0}})); },
               {"config.json", "'shared_expert_intermediate_size' is 0"});
}


json gpt_oss(const char* size) {
  return read_json_file(std::string(LT_SOURCE_DIR) + "/examples/gpt-oss-" + size + "/config.json");
}

// The released GPT-OSS configs: the model card's parameter counts (116.83B and 20.91B; "active" there leaves the
// input embedding out: 5.13B and 3.61B), alternating sliding and full layers, YaRN, MXFP4 experts.
TEST(ModelConfigMoe, ParsesGptOss) {
  const ModelConfig big = parse(gpt_oss("120b")), small = parse(gpt_oss("20b"));
  for (const ModelConfig* c : {&big, &small}) {
    EXPECT_EQ(c->type, ModelType::gpt_oss);
    EXPECT_TRUE(c->qkv_bias && c->o_bias && c->attention_sinks && c->mxfp4_experts);
    EXPECT_FALSE(c->qk_norm || c->mlp_bias || c->norm_topk_prob);
    EXPECT_EQ(c->num_experts_per_tok, 4);
    EXPECT_EQ(c->moe_intermediate_size, 2880);
    EXPECT_EQ(c->intermediate_size, 0);
    EXPECT_EQ(c->num_sparse_layers(), c->num_layers);
    EXPECT_EQ(c->sliding_window, 128);
    EXPECT_EQ(c->swiglu_limit, 7.0);
    EXPECT_EQ(c->router_aux_loss_coef, 0.9);
    EXPECT_EQ(c->rms_norm_eps, 1e-5);
    for (int64_t l = 0; l < c->num_layers; ++l)
      EXPECT_EQ(c->layer_kind(l), l % 2 == 0 ? LayerKind::sliding_attention : LayerKind::full_attention) << l;
    const RopeSpec r = c->rope();
    EXPECT_EQ(r.theta, 150000.0);
    EXPECT_EQ(r.factor, 32.0);
    EXPECT_EQ(r.original_max_positions, 4096);
    EXPECT_FALSE(r.truncate);
    EXPECT_NEAR(r.attention_factor, 0.1 * std::log(32.0) + 1.0, 1e-15);
  }
  EXPECT_EQ(big.num_experts, 128);
  EXPECT_EQ(big.num_layers, 36);
  const int64_t embedding = big.vocab_size * big.hidden_size;
  EXPECT_EQ(big.num_parameters(), 116829156672);
  EXPECT_EQ(big.num_active_parameters() - embedding, 5132849472);
  EXPECT_EQ(small.num_experts, 32);
  EXPECT_EQ(small.num_parameters(), 20914757184);
  EXPECT_EQ(small.num_active_parameters() - embedding, 3608307264);
}

// GptOssConfig's defaults (its layer_types alternate from a sliding layer), and the round trip: written dequantised,
// without quantization_config.
TEST(ModelConfigMoe, GptOssDefaultsAndRoundTrip) {
  json j = gpt_oss("20b");
  for (const char* key : {"layer_types", "sliding_window", "swiglu_limit", "num_local_experts", "num_experts_per_tok",
                          "router_aux_loss_coef", "attention_bias", "rms_norm_eps", "rope_theta"})
    j.erase(key);
  const ModelConfig d = parse(j);
  EXPECT_EQ(d.num_experts, 128);
  EXPECT_EQ(d.layer_kind(0), LayerKind::sliding_attention);
  EXPECT_EQ(d.layer_kind(1), LayerKind::full_attention);
  EXPECT_EQ(d.sliding_window, 128);
  EXPECT_TRUE(d.qkv_bias);
  for (const json& src : {gpt_oss("120b"), with(gpt_oss("20b"), {{"layer_types", json::array({"full_attention",
      "sliding_attention", "full_attention", "full_attention", "sliding_attention", "full_attention", "full_attention",
      "sliding_attention", "full_attention", "full_attention", "sliding_attention", "full_attention", "full_attention",
      "sliding_attention", "full_attention", "full_attention", "sliding_attention", "full_attention", "full_attention",
      "sliding_attention", "full_attention", "full_attention", "sliding_attention", "full_attention"})}})}) {
    ModelConfig c = parse(src);
    const json out = model_config_to_json(c);
    EXPECT_EQ(out["model_type"], "gpt_oss");
    EXPECT_EQ(out["architectures"][0], "GptOssForCausalLM");
    EXPECT_FALSE(out.contains("quantization_config"));
    EXPECT_EQ(out["rope_scaling"]["rope_type"], "yarn");
    c.mxfp4_experts = false;  // the file written holds the dequantised experts
    EXPECT_EQ(parse(out), c);
  }
}

TEST(ModelConfigMoe, GptOssRefusals) {
  expect_error([] { parse(with(gpt_oss("20b"), {{"quantization_config", {{"quant_method", "fp8"}}}})); },
               {"config.json", "quantization_config.quant_method", "mxfp4"});
  expect_error([] { parse(with(gpt_oss("20b"), {{"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8}}}})); },
               {"config.json", "rope_scaling.rope_type", "llama3", "yarn"});
  expect_error([] { parse(with(gpt_oss("20b"), {{"layer_types", json::array({"linear_attention"})}})); },
               {"config.json", "'layer_types'"});
  expect_error([] { parse(with(gpt_oss("20b"), {{"num_experts_per_tok", 40}})); },
               {"config.json", "'num_experts_per_tok' 40 exceeds 'num_local_experts' 32"});
  // YaRN belongs to gpt_oss here; a qwen3 config with it is refused as before.
  expect_error([] { parse(with(qwen3_30b_a3b(), {{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4}}}})); },
               {"config.json", "rope_scaling.rope_type", "yarn"});
}

}  // namespace
}  // namespace lt
