// Tests for model/config.h on the Qwen3.5 / Qwen3.6 hybrid models: both checkpoint forms (vision-language
// qwen3_5 with text_config, text-only qwen3_5_text), layer_types against full_attention_interval, transformers'
// defaults, round trips, every refusal with the file and the key, the exact parameter count of Qwen3.6-27B, and
// the clear refusal of the components that handle uniform decoder layers only.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>

#include "core/error.h"
#include "io/json_file.h"
#include "model/block.h"
#include "model/config.h"
#include "model/layout.h"
#include "model/weights.h"
#include "testing/error_testing.h"

namespace lt {
namespace {

using nlohmann::json;
using testing::expect_error;

constexpr auto F = LayerKind::full_attention;
constexpr auto Lin = LayerKind::linear_attention;

// Layer i full attention iff (i + 1) % interval == 0, as names.
json interval_layer_types(int64_t layers, int64_t interval) {
  json out = json::array();
  for (int64_t i = 0; i < layers; ++i) out.push_back((i + 1) % interval == 0 ? "full_attention" : "linear_attention");
  return out;
}

// The shape of the released Qwen3.6-27B / Qwen3.5-27B config.json (vision-language form): REFERENCES §9's
// numbers, the outer keys of Qwen3_5Config, and the text_config keys the release writes (mtp_*, mamba_ssm_dtype,
// partial_rotary_factor at the top and in rope_parameters). The outer eos differs from text_config's, as released.
json qwen36_27b() {
  json text = json::parse(R"({
    "attention_bias": false,
    "attention_dropout": 0.0,
    "attn_output_gate": true,
    "bos_token_id": null,
    "dtype": "bfloat16",
    "eos_token_id": 248044,
    "full_attention_interval": 4,
    "head_dim": 256,
    "hidden_act": "silu",
    "hidden_size": 5120,
    "initializer_range": 0.02,
    "intermediate_size": 17408,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 48,
    "linear_value_head_dim": 128,
    "mamba_ssm_dtype": "float32",
    "max_position_embeddings": 262144,
    "mlp_only_layers": [],
    "model_type": "qwen3_5_text",
    "mtp_num_hidden_layers": 1,
    "mtp_use_dedicated_embeddings": false,
    "num_attention_heads": 24,
    "num_hidden_layers": 64,
    "num_key_value_heads": 4,
    "pad_token_id": null,
    "partial_rotary_factor": 0.25,
    "rms_norm_eps": 1e-06,
    "rope_parameters": {
      "mrope_interleaved": true,
      "mrope_section": [11, 11, 10],
      "partial_rotary_factor": 0.25,
      "rope_theta": 10000000,
      "rope_type": "default"
    },
    "tie_word_embeddings": false,
    "use_cache": true,
    "vocab_size": 248320
  })");
  text["layer_types"] = interval_layer_types(64, 4);
  json outer = json::parse(R"({
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5",
    "bos_token_id": null,
    "eos_token_id": 248046,
    "pad_token_id": 248044,
    "image_token_id": 248056,
    "video_token_id": 248057,
    "vision_start_token_id": 248053,
    "vision_end_token_id": 248054,
    "tie_word_embeddings": false,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.57.0.dev0",
    "vision_config": {
      "deepstack_visual_indexes": [],
      "depth": 27,
      "hidden_act": "gelu_pytorch_tanh",
      "hidden_size": 1152,
      "in_channels": 3,
      "initializer_range": 0.02,
      "intermediate_size": 4304,
      "model_type": "qwen3_5",
      "num_heads": 16,
      "num_position_embeddings": 2304,
      "out_hidden_size": 5120,
      "patch_size": 16,
      "spatial_merge_size": 2,
      "temporal_patch_size": 2
    }
  })");
  outer["text_config"] = text;
  return outer;
}

// A tiny text-only checkpoint (Qwen3_5ForCausalLM): 3 linear + 1 full layer, tied embeddings.
const json kTinyText = json::parse(R"({
  "architectures": ["Qwen3_5ForCausalLM"],
  "model_type": "qwen3_5_text",
  "vocab_size": 300,
  "hidden_size": 64,
  "intermediate_size": 96,
  "num_hidden_layers": 4,
  "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "head_dim": 16,
  "linear_num_key_heads": 2,
  "linear_num_value_heads": 4,
  "linear_key_head_dim": 8,
  "linear_value_head_dim": 12,
  "linear_conv_kernel_dim": 4,
  "hidden_act": "silu",
  "rms_norm_eps": 1e-06,
  "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
  "max_position_embeddings": 4096,
  "tie_word_embeddings": true,
  "dtype": "float32",
  "bos_token_id": 256,
  "eos_token_id": 257
})");

// `base` with `patch` merged in; a null in the patch deletes the key.
json with(json base, const json& patch) {
  for (const auto& [k, v] : patch.items()) {
    if (v.is_null())
      base.erase(k);
    else
      base[k] = v;
  }
  return base;
}
// The same inside text_config.
json with_text(json base, const json& patch) {
  base["text_config"] = with(base["text_config"], patch);
  return base;
}

ModelConfig parse(const json& j) { return parse_model_config(j, "config.json"); }

TEST(HybridConfig, ParsesQwen36_27BVisionLanguage) {
  ModelConfig c = parse(qwen36_27b());
  EXPECT_EQ(c.type, ModelType::qwen3_5);
  EXPECT_EQ(model_type_name(c.type), "qwen3_5");
  EXPECT_TRUE(c.vision_language);
  EXPECT_EQ(c.vocab_size, 248320);
  EXPECT_EQ(c.hidden_size, 5120);
  EXPECT_EQ(c.intermediate_size, 17408);
  EXPECT_EQ(c.num_layers, 64);
  EXPECT_EQ(c.num_heads, 24);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.q_dim(), 24 * 256);
  EXPECT_EQ(c.q_proj_dim(), 2 * 24 * 256);  // [query | gate] per head
  EXPECT_EQ(c.kv_dim(), 4 * 256);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 1e7);  // an integer in the file
  EXPECT_EQ(c.partial_rotary_factor, 0.25);
  EXPECT_EQ(c.rotary_dim(), 64);
  EXPECT_EQ(c.mrope_section, (std::vector<int64_t>{11, 11, 10}));
  EXPECT_TRUE(c.mrope_interleaved);
  EXPECT_TRUE(c.attn_output_gate);
  EXPECT_TRUE(c.zero_centred_norms);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias || c.o_bias || c.mlp_bias);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.max_position_embeddings, 262144);
  EXPECT_EQ(c.torch_dtype, DType::bf16);
  // The outer object's eos wins (transformers' generation defaults); bos is null in both.
  EXPECT_EQ(c.eos_token_id, 248046);
  EXPECT_FALSE(c.bos_token_id.has_value());

  ASSERT_EQ(c.layer_types.size(), 64u);
  EXPECT_EQ(c.num_linear_attention_layers(), 48);
  EXPECT_EQ(c.num_full_attention_layers(), 16);
  EXPECT_TRUE(c.is_hybrid());
  EXPECT_EQ(c.layer_kind(0), Lin);
  EXPECT_EQ(c.layer_kind(2), Lin);
  EXPECT_EQ(c.layer_kind(3), F);
  EXPECT_EQ(c.layer_kind(63), F);

  EXPECT_EQ(c.linear_num_key_heads, 16);
  EXPECT_EQ(c.linear_num_value_heads, 48);
  EXPECT_EQ(c.linear_key_head_dim, 128);
  EXPECT_EQ(c.linear_value_head_dim, 128);
  EXPECT_EQ(c.linear_conv_kernel_dim, 4);
  EXPECT_EQ(c.linear_key_dim(), 2048);
  EXPECT_EQ(c.linear_value_dim(), 6144);
  EXPECT_EQ(c.linear_conv_dim(), 2 * 2048 + 6144);

  // The outer object without text_config and the keys ModelConfig holds.
  json outer = json::parse(c.outer_json);
  EXPECT_TRUE(outer.contains("vision_config"));
  EXPECT_EQ(outer["image_token_id"], 248056);
  EXPECT_EQ(outer["pad_token_id"], 248044);
  for (const char* held : {"text_config", "model_type", "architectures", "tie_word_embeddings", "torch_dtype",
                           "dtype", "bos_token_id", "eos_token_id"})
    EXPECT_FALSE(outer.contains(held)) << held;
}

TEST(HybridConfig, Qwen36_27BParameterCount) {
  ModelConfig c = parse(qwen36_27b());
  // Per full layer: q_proj 5120·12288 + k,v 2·5120·1024 + o_proj 6144·5120 + q,k norms 2·256
  //   = 62,914,560 + 10,485,760 + 31,457,280 + 512 = 104,858,112.
  // Per linear layer: in_proj_qkv 10240·5120 + in_proj_z 6144·5120 + in_proj_b, a 2·48·5120 + conv1d 10240·4
  //   + dt_bias, A_log 2·48 + norm 128 + out_proj 5120·6144 = 115,876,064.
  // Every layer: MLP 3·5120·17408 + 2 norms of 5120 = 267,397,120.
  // 16 · 372,255,232 + 48 · 383,273,184 + embeddings and lm_head 2·248320·5120 + final norm 5120.
  EXPECT_EQ(c.num_parameters(), int64_t(26895998464));
  EXPECT_NEAR(double(c.num_parameters()) / 1e9, 26.9, 0.05);  // REFERENCES §9: ~26.9B text parameters
  // Tied, the head is the embedding.
  json tied = qwen36_27b();
  tied["tie_word_embeddings"] = true;
  EXPECT_EQ(parse(tied).num_parameters(), int64_t(26895998464) - int64_t(248320) * 5120);
}

TEST(HybridConfig, ParsesTextForm) {
  ModelConfig c = parse(kTinyText);
  EXPECT_EQ(c.type, ModelType::qwen3_5);
  EXPECT_FALSE(c.vision_language);
  EXPECT_TRUE(c.outer_json.empty());
  EXPECT_EQ(c.layer_types, (std::vector<LayerKind>{Lin, Lin, Lin, F}));
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.rotary_dim(), 4);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.torch_dtype, DType::f32);
  EXPECT_EQ(c.bos_token_id, 256);
  EXPECT_EQ(c.eos_token_id, 257);
  EXPECT_TRUE(c.mrope_section.empty());
  EXPECT_FALSE(c.mrope_interleaved);
  EXPECT_EQ(c.linear_conv_dim(), 2 * 2 * 8 + 4 * 12);
  // Full layer 16,416 (q 64·128, k, v 2·64·32, o 64·64, q/k norms 2·16); linear layer 12,116 (qkv 80·64,
  // z 48·64, b, a 2·4·64, conv 80·4, dt_bias, A_log 2·4, norm 12, out 64·48); MLP + norms 18,560 each;
  // embeddings 300·64 (tied) and the final norm 64.
  EXPECT_EQ(c.num_parameters(), 146268);
  // attention_bias adds q (2·Hq·D), k, v (Hkv·D each) and o (C) biases to the full layer only.
  EXPECT_EQ(parse(with(kTinyText, {{"attention_bias", true}})).num_parameters(), 146268 + 128 + 2 * 32 + 64);
}

TEST(HybridConfig, VisionLanguageAndTextFormsDescribeTheSameTextModel) {
  // The text form holds text_config's keys at the top; the outer eos wins only in the vision-language form.
  json vl = qwen36_27b();
  json text = with(vl["text_config"], {{"architectures", {"Qwen3_5ForCausalLM"}}});
  ModelConfig a = parse(vl), b = parse(text);
  EXPECT_NE(a, b);
  b.vision_language = true;
  b.outer_json = a.outer_json;
  b.eos_token_ids = a.eos_token_ids;
  b.eos_token_id = a.eos_token_id;
  EXPECT_EQ(a, b);
}

TEST(HybridConfig, LayerTypesOrInterval) {
  json no_list = with_text(qwen36_27b(), {{"layer_types", nullptr}});
  EXPECT_EQ(parse(no_list), parse(qwen36_27b()));  // interval 4 gives the listed pattern
  EXPECT_EQ(parse(with_text(no_list, {{"full_attention_interval", nullptr}})), parse(qwen36_27b()));  // default 4
  ModelConfig two = parse(with_text(no_list, {{"full_attention_interval", 2}}));
  EXPECT_EQ(two.num_full_attention_layers(), 32);
  EXPECT_EQ(two.layer_kind(0), Lin);
  EXPECT_EQ(two.layer_kind(1), F);
  ModelConfig one = parse(with_text(no_list, {{"full_attention_interval", 1}}));
  EXPECT_FALSE(one.is_hybrid());  // every layer full attention: still qwen3_5's gated attention
  EXPECT_EQ(one.num_full_attention_layers(), 64);
  // A 5-layer model with interval 4: only layer 3 is full.
  ModelConfig five = parse(with(kTinyText, {{"layer_types", nullptr}, {"num_hidden_layers", 5}}));
  EXPECT_EQ(five.layer_types, (std::vector<LayerKind>{Lin, Lin, Lin, F, Lin}));
  // An explicit list wins over the interval (transformers ignores the interval then).
  ModelConfig listed = parse(with(kTinyText, {{"layer_types", {"full_attention", "linear_attention",
                                                               "full_attention", "linear_attention"}},
                                              {"full_attention_interval", 4}}));
  EXPECT_EQ(listed.layer_types, (std::vector<LayerKind>{F, Lin, F, Lin}));
  // transformers remaps the legacy names.
  ModelConfig legacy = parse(with(kTinyText, {{"layer_types", {"mamba", "mamba", "mamba", "attention"}}}));
  EXPECT_EQ(legacy.layer_types, parse(kTinyText).layer_types);
}

TEST(HybridConfig, AppliesTransformersDefaults) {
  json minimal = {{"model_type", "qwen3_5_text"}, {"vocab_size", 1000},      {"hidden_size", 64},
                  {"intermediate_size", 128},     {"num_hidden_layers", 8}, {"num_attention_heads", 8}};
  ModelConfig c = parse(minimal);
  EXPECT_EQ(c.num_kv_heads, 4);  // Qwen3_5TextConfig's default, not num_attention_heads
  EXPECT_EQ(c.head_dim, 256);    // declared default, not hidden / heads
  EXPECT_EQ(c.partial_rotary_factor, 0.25);
  EXPECT_EQ(c.rotary_dim(), 64);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_EQ(c.linear_num_key_heads, 16);
  EXPECT_EQ(c.linear_num_value_heads, 32);
  EXPECT_EQ(c.linear_key_head_dim, 128);
  EXPECT_EQ(c.linear_value_head_dim, 128);
  EXPECT_EQ(c.linear_conv_kernel_dim, 4);
  EXPECT_EQ(c.layer_types, (std::vector<LayerKind>{Lin, Lin, Lin, F, Lin, Lin, Lin, F}));
  EXPECT_FALSE(c.qkv_bias || c.o_bias || c.tie_word_embeddings);
  EXPECT_TRUE(c.attn_output_gate && c.zero_centred_norms && c.qk_norm);
  EXPECT_EQ(c.torch_dtype, DType::f32);
  EXPECT_FALSE(c.bos_token_id || c.eos_token_id);
  // The vision-language form: tie_word_embeddings from the outer object (default false) — text_config's flag is
  // not what transformers ties by.
  json vl = {{"model_type", "qwen3_5"}, {"text_config", with(minimal, {{"tie_word_embeddings", true}})}};
  EXPECT_FALSE(parse(vl).tie_word_embeddings);
  EXPECT_TRUE(parse(with(vl, {{"tie_word_embeddings", true}})).tie_word_embeddings);
  EXPECT_TRUE(parse(vl).outer_json.empty());
  // dtype from either object; eos from text_config when the outer object has none.
  EXPECT_EQ(parse(with_text(vl, {{"dtype", "bfloat16"}})).torch_dtype, DType::bf16);
  EXPECT_EQ(parse(with(vl, {{"dtype", "float16"}})).torch_dtype, DType::f16);
  EXPECT_EQ(parse(with_text(vl, {{"eos_token_id", 7}})).eos_token_id, 7);
  // Legacy spellings: rope_theta and partial_rotary_factor at the top.
  ModelConfig legacy = parse(with(minimal, {{"rope_theta", 1e7}, {"partial_rotary_factor", 0.5}}));
  EXPECT_EQ(legacy.rope_theta, 1e7);
  EXPECT_EQ(legacy.rotary_dim(), 128);
}

TEST(HybridConfig, OtherModelsHaveUniformFullAttentionLayers) {
  json qwen3 = {{"model_type", "qwen3"}, {"vocab_size", 1000},      {"hidden_size", 64}, {"intermediate_size", 128},
                {"num_hidden_layers", 3}, {"num_attention_heads", 4}, {"head_dim", 32}};
  for (const char* type : {"qwen2", "qwen3", "llama"}) {
    SCOPED_TRACE(type);
    json j = with(qwen3, {{"model_type", type}});
    if (std::string(type) == "qwen2") j.erase("head_dim");
    ModelConfig c = parse(j);
    EXPECT_EQ(c.layer_types, std::vector<LayerKind>(3, F));
    EXPECT_FALSE(c.is_hybrid());
    EXPECT_EQ(c.num_full_attention_layers(), 3);
    EXPECT_EQ(c.rotary_dim(), c.head_dim);
    EXPECT_EQ(c.q_proj_dim(), c.q_dim());
    EXPECT_FALSE(c.attn_output_gate || c.zero_centred_norms || c.vision_language);
    EXPECT_EQ(c.linear_conv_dim(), 0);
    // A config built in code leaves layer_types empty: the same model.
    ModelConfig built = c;
    built.layer_types.clear();
    EXPECT_EQ(built, c);
    EXPECT_EQ(built.layer_kind(2), F);
    EXPECT_EQ(built.num_parameters(), c.num_parameters());
  }
  // Newer transformers write layer_types for qwen2 / qwen3 too: all full (sliding only with use_sliding_window).
  json listed = with(qwen3, {{"layer_types", {"full_attention", "sliding_attention", "full_attention"}}});
  EXPECT_EQ(parse(listed).layer_types, std::vector<LayerKind>(3, F));
  ModelConfig hybrid = parse(kTinyText);
  ModelConfig cleared = hybrid;
  cleared.layer_types.clear();
  EXPECT_NE(cleared, hybrid);
}

TEST(HybridConfig, RoundTripsBothForms) {
  std::vector<json> cases = {
      qwen36_27b(),
      with_text(qwen36_27b(), {{"layer_types", nullptr}, {"attention_bias", true}, {"dtype", nullptr}}),
      with(with_text(qwen36_27b(), {{"dtype", nullptr}}), {{"torch_dtype", "float32"}, {"eos_token_id", nullptr}}),
      with(qwen36_27b(), {{"tie_word_embeddings", true}, {"eos_token_id", {248046, 248044}}, {"bos_token_id", 1}}),
      json{{"model_type", "qwen3_5"}, {"text_config", with(kTinyText, {{"architectures", nullptr}})}},
      kTinyText,
      with(kTinyText, {{"tie_word_embeddings", false}, {"rms_norm_eps", 1.2345678e-7}, {"eos_token_id", nullptr}}),
      with(kTinyText, {{"rope_parameters", {{"rope_theta", 5e6}, {"partial_rotary_factor", 0.5},
                                            {"mrope_section", {1, 1, 2}}, {"mrope_interleaved", false}}}}),
  };
  for (const json& j : cases) {
    ModelConfig c = parse(j);
    json out = model_config_to_json(c);
    SCOPED_TRACE(out.dump());
    EXPECT_EQ(parse(out), c);
    EXPECT_EQ(model_config_to_json(parse(out)), out);  // a second save writes the same file
    EXPECT_EQ(out["model_type"], j["model_type"]);
    if (c.vision_language) {
      EXPECT_EQ(out["architectures"][0], "Qwen3_5ForConditionalGeneration");
      EXPECT_EQ(out["text_config"]["model_type"], "qwen3_5_text");
      EXPECT_EQ(out["text_config"]["layer_types"].size(), size_t(c.num_layers));
      EXPECT_EQ(out["tie_word_embeddings"], c.tie_word_embeddings);
      // Everything else of the outer object comes back as it was.
      for (const auto& [key, value] : j.items()) {
        if (key != "text_config" && key != "torch_dtype" && key != "dtype" && !value.is_null()) {
          EXPECT_EQ(out[key], value) << key;
        }
      }
    } else {
      EXPECT_EQ(out["architectures"][0], "Qwen3_5ForCausalLM");
      EXPECT_FALSE(out.contains("text_config"));
      EXPECT_EQ(out["attn_output_gate"], true);
    }
  }
}

TEST(HybridConfig, SavesTheVisionLanguageConfigTransformersReads) {
  json out = model_config_to_json(parse(qwen36_27b()));
  EXPECT_EQ(out["vision_config"], qwen36_27b()["vision_config"]);
  EXPECT_EQ(out["dtype"], "bfloat16");
  EXPECT_EQ(out["text_config"]["dtype"], "bfloat16");
  EXPECT_EQ(out["text_config"]["rope_parameters"]["rope_type"], "default");
  EXPECT_EQ(out["text_config"]["rope_parameters"]["partial_rotary_factor"], 0.25);
  EXPECT_EQ(out["text_config"]["rope_parameters"]["mrope_section"], json({11, 11, 10}));
  EXPECT_EQ(out["text_config"]["linear_num_value_heads"], 48);
  EXPECT_EQ(out["eos_token_id"], 248046);
}

// ---- refusals -----------------------------------------------------------------------------------------

TEST(HybridConfigRefuses, LayerTypes) {
  expect_error([] { parse(with_text(qwen36_27b(), {{"layer_types", interval_layer_types(3, 4)}})); },
               {"config.json", "'text_config.layer_types' lists 3 layers", "num_hidden_layers is 64"});
  json bad = interval_layer_types(64, 4);
  bad[5] = "sliding_attention";
  expect_error([&] { parse(with_text(qwen36_27b(), {{"layer_types", bad}})); },
               {"config.json", "'text_config.layer_types'[5]", "\"sliding_attention\"", "linear_attention"});
  bad[5] = 7;
  expect_error([&] { parse(with_text(qwen36_27b(), {{"layer_types", bad}})); },
               {"config.json", "'text_config.layer_types'[5] is 7"});
  expect_error([] { parse(with(kTinyText, {{"layer_types", "full_attention"}})); },
               {"config.json", "'layer_types'", "list"});
  json no_list = with_text(qwen36_27b(), {{"layer_types", nullptr}});
  expect_error([&] { parse(with_text(no_list, {{"full_attention_interval", 0}})); },
               {"config.json", "'text_config.full_attention_interval' is 0"});
  // qwen2 / qwen3 / llama have no linear-attention layers.
  json qwen3 = with(kTinyText, {{"model_type", "qwen3"}});
  expect_error([&] { parse(qwen3); }, {"config.json", "'layer_types'[0] is \"linear_attention\"", "full_attention"});
}

TEST(HybridConfigRefuses, LinearAttentionSizes) {
  for (const char* key : {"linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                          "linear_value_head_dim", "linear_conv_kernel_dim"}) {
    SCOPED_TRACE(key);
    expect_error([&] { parse(with_text(qwen36_27b(), {{key, 0}})); },
                 {"config.json", std::string("'text_config.") + key + "' is 0", "positive integer"});
    expect_error([&] { parse(with(kTinyText, {{key, "4"}})); },
                 {"config.json", std::string("'") + key + "'", "string"});
  }
  expect_error([] { parse(with_text(qwen36_27b(), {{"linear_num_value_heads", 40}})); },
               {"config.json", "'text_config.linear_num_value_heads' 40", "'text_config.linear_num_key_heads' 16"});
}

// Experts belong to the qwen3_5_moe model types (tests/model/test_model_config_moe.cpp); the outer and text model
// types must agree.
TEST(HybridConfigRefuses, ExpertsOutsideTheMoeModelTypes) {
  expect_error([] { parse(with(qwen36_27b(), {{"model_type", "qwen3_5_moe"}})); },
               {"config.json", "text_config.model_type 'qwen3_5_text' does not go with model_type 'qwen3_5_moe'",
                "expected qwen3_5_moe_text"});
  expect_error([] { parse(with_text(qwen36_27b(), {{"model_type", "qwen3_5_moe_text"}})); },
               {"config.json", "'qwen3_5_moe_text' does not go with model_type 'qwen3_5'"});
  expect_error([] { parse(with_text(qwen36_27b(), {{"num_experts", 512}})); },
               {"config.json", "'text_config.num_experts' is 512", "a dense qwen3_5 model has no experts"});
  expect_error([] { parse(with(kTinyText, {{"moe_intermediate_size", 64}})); },
               {"config.json", "'moe_intermediate_size'", "qwen3_5_moe_text"});
  EXPECT_NO_THROW(parse(with(kTinyText, {{"num_experts", 0}})));
}

TEST(HybridConfigRefuses, ActivationRopeAndGate) {
  expect_error([] { parse(with_text(qwen36_27b(), {{"hidden_act", "gelu"}})); },
               {"config.json", "text_config.hidden_act 'gelu'", "silu"});
  json yarn = qwen36_27b()["text_config"]["rope_parameters"];
  yarn["rope_type"] = "yarn";
  expect_error([&] { parse(with_text(qwen36_27b(), {{"rope_parameters", yarn}})); },
               {"config.json", "text_config.rope_parameters.rope_type", "yarn"});
  expect_error([] { parse(with_text(qwen36_27b(), {{"partial_rotary_factor", 0.5}})); },
               {"config.json", "text_config.partial_rotary_factor 0.5",
                "text_config.rope_parameters.partial_rotary_factor 0.25", "disagree"});
  expect_error([] { parse(with(kTinyText, {{"rope_parameters", {{"partial_rotary_factor", 0.05}}}})); },
               {"config.json", "rope_parameters.partial_rotary_factor 0.05", "int(16 x 0.05) = 0"});
  expect_error([] { parse(with(kTinyText, {{"rope_parameters", {{"partial_rotary_factor", 0.2}}}})); },
               {"config.json", "rope_parameters.partial_rotary_factor 0.2", "= 3 rotary dims", "even"});
  expect_error([] { parse(with(kTinyText, {{"partial_rotary_factor", 1.5}, {"rope_parameters", nullptr}})); },
               {"config.json", "partial_rotary_factor 1.5"});
  expect_error([] { parse(with(kTinyText, {{"rope_parameters", {{"mrope_section", "11,11,10"}}}})); },
               {"config.json", "'rope_parameters.mrope_section'", "list of integers"});
  expect_error([] { parse(with(kTinyText, {{"rope_parameters", {{"mrope_interleaved", 1}}}})); },
               {"config.json", "'rope_parameters.mrope_interleaved'", "true or false"});
  expect_error([] { parse(with_text(qwen36_27b(), {{"attn_output_gate", false}})); },
               {"config.json", "'text_config.attn_output_gate' is false"});
}

TEST(HybridConfigRefuses, VisionLanguageStructure) {
  expect_error([] { parse(with(qwen36_27b(), {{"text_config", nullptr}})); },
               {"config.json", "missing required key 'text_config'"});
  expect_error([] { parse(with(qwen36_27b(), {{"text_config", "qwen3_5_text"}})); },
               {"config.json", "'text_config' is string", "object"});
  expect_error([] { parse(with_text(qwen36_27b(), {{"model_type", "qwen3"}})); },
               {"config.json", "text_config.model_type 'qwen3'", "qwen3_5_text"});
  for (const char* key :
       {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"}) {
    SCOPED_TRACE(key);
    expect_error([&] { parse(with_text(qwen36_27b(), {{key, nullptr}})); },
                 {"config.json", std::string("missing required key 'text_config.") + key + "'"});
  }
  expect_error([] { parse(with_text(qwen36_27b(), {{"num_key_value_heads", 5}})); },
               {"config.json", "num_attention_heads 24", "num_key_value_heads 5"});
  // The outer eos wins; without one, text_config's is read and checked.
  EXPECT_NO_THROW(parse(with_text(qwen36_27b(), {{"eos_token_id", "x"}})));
  expect_error([] { parse(with(with_text(qwen36_27b(), {{"eos_token_id", "x"}}), {{"eos_token_id", nullptr}})); },
               {"config.json", "'text_config.eos_token_id'"});
}

TEST(HybridConfigRefuses, DtypeDisagreement) {
  expect_error([] { parse(with(qwen36_27b(), {{"torch_dtype", "float32"}})); },
               {"config.json", "torch_dtype 'float32'", "text_config.dtype 'bfloat16'", "disagree"});
  expect_error([] { parse(with_text(qwen36_27b(), {{"dtype", "float64"}})); },
               {"config.json", "text_config.dtype 'float64'", "not supported"});
}

TEST(HybridConfigRefuses, UnknownModelTypeNamesTheSupportedOnes) {
  expect_error([] { parse(with(kTinyText, {{"model_type", "qwen3_next"}})); },
               {"config.json", "model_type 'qwen3_next' is not supported", "qwen3_5", "qwen3_5_text"});
}

TEST(HybridConfigRefuses, ToJsonOfInexpressibleConfigs) {
  ModelConfig q = parse(kTinyText);
  q.type = ModelType::qwen3;
  expect_error([&] { model_config_to_json(q); }, {"qwen3 config cannot hold linear-attention layers"});
  ModelConfig ungated = parse(kTinyText);
  ungated.attn_output_gate = false;
  expect_error([&] { model_config_to_json(ungated); }, {"qwen3_5 config needs", "output gate"});
  ModelConfig held = parse(qwen36_27b());
  held.outer_json = R"({"dtype": "float32"})";
  expect_error([&] { model_config_to_json(held); }, {"outer_json holds 'dtype'"});
  ModelConfig short_list = parse(kTinyText);
  short_list.layer_types.pop_back();
  expect_error([&] { model_config_to_json(short_list); }, {"layer_types has 3 entries for 4 layers"});
}

// ---- the block's storage of hybrid layers ---------------------------------------------------------------

TEST(HybridConfig, BlockStorageAndStoredOffsetsPerLayerKind) {
  ModelConfig c = parse(kTinyText);
  // The block computes Qwen3.5 layers at both activation storages; the stored offsets name each kind's fields.
  EXPECT_EQ(BlockShape::make(c, 1, 8, DType::f32).rotary, c.rotary_dim());
  const BlockShape b16 = BlockShape::make(c, 1, 8, DType::bf16);
  EXPECT_EQ(b16.act, DType::bf16);
  const BlockShape f32 = BlockShape::make(c, 1, 8, DType::f32);
  for (LayerKind k : {LayerKind::linear_attention, LayerKind::full_attention})  // bf16 activations, f32 statistics
    EXPECT_LT(block_stored_bytes(b16.for_layer(k)), block_stored_bytes(f32.for_layer(k)));
  const StoredOffsets lin = block_stored_offsets(b16.for_layer(LayerKind::linear_attention));
  const StoredOffsets full = block_stored_offsets(b16.for_layer(LayerKind::full_attention));
  EXPECT_GE(lin.qkv_pre, 0);
  EXPECT_GT(lin.y, lin.qkv_pre);
  EXPECT_EQ(lin.q, -1);
  EXPECT_EQ(lin.att, -1);
  EXPECT_GE(full.q_raw, 0);
  EXPECT_EQ(full.qkv, -1);
  EXPECT_GT(lin.h, lin.x_mid);
  // The released 27B config loads as a config without touching weights.
  std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / ("lt_hybrid_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  write_json_file((dir / "config.json").string(), qwen36_27b());
  EXPECT_EQ(load_model_config(dir.string()), parse(qwen36_27b()));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace lt
