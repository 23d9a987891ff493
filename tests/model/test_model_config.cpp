// Tests for model/config.h: real published config.json files, newer transformers spellings, round trips
// through model_config_to_json, and every refusal with its message.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>

#include "core/error.h"
#include "io/json_file.h"
#include "model/config.h"
#include "testing/error_testing.h"

namespace lt {
namespace {

using testing::expect_error;

using nlohmann::json;

// Qwen/Qwen2.5-0.5B config.json as published.
const json kQwen25_05B = json::parse(R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_mrope": false,
  "use_sliding_window": false,
  "vocab_size": 151936
})");

// Qwen/Qwen3-0.6B config.json as published.
const json kQwen3_06B = json::parse(R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})");

// meta-llama/Meta-Llama-3-8B-Instruct config.json as published.
const json kLlama3_8B = json::parse(R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128009,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 8192,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
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

ModelConfig parse(const json& j) { return parse_model_config(j, "config.json"); }

TEST(ModelConfig, ParsesQwen25_05B) {
  ModelConfig c = parse(kQwen25_05B);
  EXPECT_EQ(c.type, ModelType::qwen2);
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.hidden_size, 896);
  EXPECT_EQ(c.intermediate_size, 4864);
  EXPECT_EQ(c.num_layers, 24);
  EXPECT_EQ(c.num_heads, 14);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 64);  // 896 / 14
  EXPECT_EQ(c.q_dim(), 896);
  EXPECT_EQ(c.kv_dim(), 128);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_EQ(c.torch_dtype, DType::bf16);
  EXPECT_EQ(c.bos_token_id, 151643);
  EXPECT_EQ(c.eos_token_id, 151643);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{151643});
  // The published count: 494,032,768 (embeddings tied, so no lm_head).
  EXPECT_EQ(c.num_parameters(), 494032768);
}

TEST(ModelConfig, ParsesQwen3_06B) {
  ModelConfig c = parse(kQwen3_06B);
  EXPECT_EQ(c.type, ModelType::qwen3);
  EXPECT_EQ(c.head_dim, 128);  // explicit, not 1024 / 16 = 64
  EXPECT_EQ(c.q_dim(), 2048);
  EXPECT_EQ(c.kv_dim(), 1024);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_EQ(c.rope_theta, 1e6);  // an integer in the file
  EXPECT_EQ(c.max_position_embeddings, 40960);
  EXPECT_EQ(c.eos_token_id, 151645);
  // 155,582,464 embeddings + 28 x 15,730,944 per layer (incl. 2 x 128 q/k norm) + 1,024 final norm.
  EXPECT_EQ(c.num_parameters(), 596049920);
}

TEST(ModelConfig, ParsesLlama3_8B) {
  ModelConfig c = parse(kLlama3_8B);
  EXPECT_EQ(c.type, ModelType::llama);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_FALSE(c.qkv_bias || c.o_bias || c.mlp_bias || c.qk_norm || c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.eos_token_id, 128009);
  // The published count: 8,030,261,248 (untied lm_head included).
  EXPECT_EQ(c.num_parameters(), 8030261248);
}

TEST(ModelConfig, BiasFlagsFollowTransformers) {
  ModelConfig q3 = parse(with(kQwen3_06B, {{"attention_bias", true}}));
  EXPECT_TRUE(q3.qkv_bias && q3.o_bias);  // Qwen3's o_proj takes attention_bias too
  EXPECT_FALSE(q3.mlp_bias);
  ModelConfig l = parse(with(kLlama3_8B, {{"attention_bias", true}, {"mlp_bias", true}}));
  EXPECT_TRUE(l.qkv_bias && l.o_bias && l.mlp_bias);
  ModelConfig base = parse(kLlama3_8B);
  // q, k, v, o biases: 4096 + 2*1024 + 4096; gate, up, down biases: 2*14336 + 4096; per layer.
  EXPECT_EQ(l.num_parameters() - base.num_parameters(), 32 * (4096 + 2048 + 4096 + 2 * 14336 + 4096));
  // qwen2 ignores attention_bias: q,k,v always biased, o never.
  ModelConfig q2 = parse(with(kQwen25_05B, {{"attention_bias", false}}));
  EXPECT_TRUE(q2.qkv_bias);
  EXPECT_FALSE(q2.o_bias);
}

TEST(ModelConfig, AppliesDefaults) {
  json minimal = {{"model_type", "llama"},       {"vocab_size", 1000},       {"hidden_size", 64},
                  {"intermediate_size", 128},    {"num_hidden_layers", 2},   {"num_attention_heads", 4}};
  ModelConfig c = parse(minimal);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_EQ(c.torch_dtype, DType::f32);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.bos_token_id.has_value());
  EXPECT_FALSE(c.eos_token_id.has_value());
  EXPECT_TRUE(c.eos_token_ids.empty());
  ModelConfig q = parse(with(minimal, {{"model_type", "qwen2"}}));
  EXPECT_EQ(q.max_position_embeddings, 32768);
  EXPECT_EQ(parse(with(minimal, {{"model_type", "qwen3"}})).head_dim, 16);
}

TEST(ModelConfig, AcceptsRopeParametersAndDtypeKeys) {
  // transformers v5 spelling: rope_parameters and dtype instead of rope_theta and torch_dtype.
  json v5 = with(kQwen3_06B, {{"rope_theta", nullptr},
                              {"torch_dtype", nullptr},
                              {"rope_scaling", nullptr},
                              {"rope_parameters", {{"rope_theta", 1000000.0}, {"rope_type", "default"}}},
                              {"dtype", "bfloat16"}});
  EXPECT_EQ(parse(v5), parse(kQwen3_06B));
  EXPECT_EQ(parse(with(kQwen3_06B, {{"torch_dtype", nullptr}, {"dtype", "float16"}})).torch_dtype, DType::f16);
  EXPECT_EQ(parse(with(kQwen3_06B, {{"torch_dtype", "float32"}})).torch_dtype, DType::f32);
  // Both spellings present and agreeing is fine; so is rope_scaling naming the default explicitly.
  EXPECT_EQ(parse(with(kQwen3_06B, {{"dtype", "bfloat16"}})).torch_dtype, DType::bf16);
  EXPECT_EQ(parse(with(kLlama3_8B, {{"rope_scaling", {{"rope_type", "default"}}}})).rope_theta, 500000.0);
}

TEST(ModelConfig, TakesFirstOfEosList) {
  // Llama 3.1's list: <|end_of_text|>, <|eom_id|>, <|eot_id|>.
  ModelConfig c = parse(with(kLlama3_8B, {{"eos_token_id", {128001, 128008, 128009}}}));
  EXPECT_EQ(c.eos_token_id, 128001);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  ModelConfig none = parse(with(kLlama3_8B, {{"eos_token_id", json::array()}}));
  EXPECT_FALSE(none.eos_token_id.has_value());
}

TEST(ModelConfig, RoundTripsThroughJson) {
  std::vector<json> cases = {kQwen25_05B,
                             kQwen3_06B,
                             kLlama3_8B,
                             with(kQwen3_06B, {{"attention_bias", true}, {"torch_dtype", "float16"}}),
                             with(kLlama3_8B, {{"eos_token_id", {128001, 128009}}, {"bos_token_id", nullptr}}),
                             with(kLlama3_8B, {{"mlp_bias", true}, {"head_dim", 64}, {"rms_norm_eps", 1.2345678e-7}})};
  for (const json& j : cases) {
    ModelConfig c = parse(j);
    json out = model_config_to_json(c);
    SCOPED_TRACE(out.dump());
    EXPECT_EQ(parse(out), c);
    EXPECT_EQ(out["architectures"][0], j["architectures"][0]);
    EXPECT_EQ(out["model_type"], j["model_type"]);
    EXPECT_EQ(out["hidden_act"], "silu");
    EXPECT_EQ(out.contains("head_dim"), c.type != ModelType::qwen2);
  }
}

TEST(ModelConfig, ToJsonRefusesFlagsItsTypeCannotExpress) {
  ModelConfig c = parse(kQwen25_05B);
  c.o_bias = true;
  expect_error([&] { model_config_to_json(c); }, {"qwen2"});
  ModelConfig l = parse(kLlama3_8B);
  l.qk_norm = true;
  expect_error([&] { model_config_to_json(l); }, {"llama", "q/k norm"});
  ModelConfig e = parse(kLlama3_8B);
  e.eos_token_ids = {1, 2};
  expect_error([&] { model_config_to_json(e); }, {"eos_token_id"});
}

TEST(ModelConfig, LoadsFromFileOrDirectory) {
  std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / ("lt_config_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  write_json_file((dir / "config.json").string(), kQwen3_06B);
  EXPECT_EQ(load_model_config(dir.string()), parse(kQwen3_06B));
  EXPECT_EQ(load_model_config((dir / "config.json").string()), parse(kQwen3_06B));

  write_file_atomic((dir / "config.json").string(), "{\n  \"model_type\": \"qwen3\",\n  \"vocab_size\": ,\n}");
  expect_error([&] { load_model_config(dir.string()); }, {(dir / "config.json").string(), "line 3"});
  write_json_file((dir / "config.json").string(), with(kQwen3_06B, {{"model_type", "gemma"}}));
  expect_error([&] { load_model_config(dir.string()); }, {(dir / "config.json").string(), "'gemma'"});
  std::filesystem::remove_all(dir);
  expect_error([&] { load_model_config(dir.string()); }, {dir.string(), "no such file", "config.json"});
}

// ---- refusals -----------------------------------------------------------------------------------------

TEST(ModelConfigRefuses, UnsupportedModelType) {
  expect_error([] { parse(with(kLlama3_8B, {{"model_type", "mistral"}})); },
               {"config.json: model_type 'mistral' is not supported (expected qwen2, qwen3, llama,"});
  expect_error([] { parse(with(kLlama3_8B, {{"model_type", nullptr}})); }, {"config.json", "'model_type'"});
}

TEST(ModelConfigRefuses, ScaledRope) {
  // Llama 3.1 / 3.2 ship this.
  json llama3 = {{"factor", 8.0},
                 {"high_freq_factor", 4.0},
                 {"low_freq_factor", 1.0},
                 {"original_max_position_embeddings", 8192},
                 {"rope_type", "llama3"}};
  expect_error([&] { parse(with(kLlama3_8B, {{"rope_scaling", llama3}})); },
               {"config.json", "rope_scaling.rope_type", "llama3"});
  expect_error([] { parse(with(kQwen3_06B, {{"rope_scaling", {{"type", "yarn"}, {"factor", 4.0}}}})); },
               {"config.json", "rope_scaling.type", "yarn"});
  expect_error([] { parse(with(kQwen3_06B, {{"rope_scaling", {{"factor", 4.0}}}})); }, {"rope_scaling", "rope_type"});
  expect_error([] { parse(with(kQwen3_06B, {{"rope_parameters", {{"rope_theta", 1e6}, {"rope_type", "yarn"}}}})); },
               {"config.json", "rope_parameters.rope_type", "yarn"});
  expect_error([] { parse(with(kQwen3_06B, {{"rope_parameters", {{"rope_theta", 1e4}}}})); },
               {"rope_theta", "rope_parameters.rope_theta", "disagree"});
}

TEST(ModelConfigRefuses, SlidingWindow) {
  expect_error([] { parse(with(kQwen25_05B, {{"use_sliding_window", true}})); }, {"config.json", "use_sliding_window"});
}

TEST(ModelConfigRefuses, MissingRequiredKey) {
  for (const char* key :
       {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"}) {
    SCOPED_TRACE(key);
    expect_error([&] { parse(with(kLlama3_8B, {{key, nullptr}})); },
                 {"config.json", "missing required key", std::string("'") + key + "'"});
  }
}

TEST(ModelConfigRefuses, WrongTypes) {
  expect_error([] { parse(with(kQwen25_05B, {{"hidden_size", "896"}})); },
               {"config.json", "'hidden_size'", "string", "positive integer"});
  expect_error([] { parse(with(kQwen25_05B, {{"hidden_size", 896.5}})); }, {"'hidden_size'", "896.5"});
  expect_error([] { parse(with(kQwen25_05B, {{"tie_word_embeddings", "yes"}})); }, {"'tie_word_embeddings'"});
  expect_error([] { parse(with(kQwen25_05B, {{"rms_norm_eps", "1e-6"}})); }, {"'rms_norm_eps'", "number"});
  expect_error([] { parse(with(kQwen25_05B, {{"eos_token_id", "x"}})); }, {"'eos_token_id'"});
  expect_error([] { parse(json::array()); }, {"config.json", "expected an object"});
}

TEST(ModelConfigRefuses, NonPositiveValues) {
  expect_error([] { parse(with(kQwen25_05B, {{"num_hidden_layers", 0}})); },
               {"config.json", "'num_hidden_layers' is 0", "positive"});
  expect_error([] { parse(with(kQwen25_05B, {{"vocab_size", -5}})); }, {"'vocab_size' is -5"});
  expect_error([] { parse(with(kQwen25_05B, {{"rope_theta", 0}})); }, {"'rope_theta'"});
}

TEST(ModelConfigRefuses, KvHeadsNotDividingHeads) {
  expect_error([] { parse(with(kQwen25_05B, {{"num_key_value_heads", 4}})); },
               {"config.json", "num_attention_heads 14", "num_key_value_heads 4"});
}

TEST(ModelConfigRefuses, InconsistentHeadDim) {
  expect_error([] { parse(with(kQwen25_05B, {{"head_dim", 128}})); }, {"config.json", "head_dim 128", "qwen2"});
  EXPECT_EQ(parse(with(kQwen25_05B, {{"head_dim", 64}})).head_dim, 64);  // the derived value is fine
  expect_error([] { parse(with(kLlama3_8B, {{"hidden_size", 4100}, {"head_dim", nullptr}})); },
               {"hidden_size 4100", "num_attention_heads 32"});
}

TEST(ModelConfigRefuses, OtherActivationOrDtype) {
  expect_error([] { parse(with(kLlama3_8B, {{"hidden_act", "gelu"}})); }, {"config.json", "hidden_act 'gelu'"});
  expect_error([] { parse(with(kLlama3_8B, {{"torch_dtype", "float64"}})); }, {"torch_dtype 'float64'"});
  expect_error([] { parse(with(kLlama3_8B, {{"dtype", "float16"}})); }, {"torch_dtype", "dtype", "disagree"});
}

}  // namespace
}  // namespace lt
