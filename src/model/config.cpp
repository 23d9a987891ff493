#include "model/config.h"

#include <algorithm>
#include <filesystem>
#include <tuple>

#include "core/error.h"
#include "io/json_file.h"
#include "io/paths.h"

namespace lt {

using nlohmann::json;

namespace {

// Typed access to one config.json object; every error names the file and the key. A key whose value is
// null counts as absent, as in transformers (configs write "rope_scaling": null, "sliding_window": null).
// `prefix` names the object within the file in errors ("text_config." for qwen3_5's text model).
class Keys {
 public:
  Keys(const json& j, const std::string& source, std::string prefix = "")
      : j_(j), source_(source), prefix_(std::move(prefix)) {}

  const json* find(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  bool has(const char* key) const { return find(key) != nullptr; }
  // The key as errors name it: "hidden_size", or "text_config.hidden_size".
  std::string name(std::string_view key) const { return prefix_ + std::string(key); }

  int64_t positive_int(const char* key) const {
    const json* v = find(key);
    LT_CHECK(v, "{}: missing required key '{}'", source_, name(key));
    return check_positive_int(key, *v);
  }
  int64_t positive_int(const char* key, int64_t fallback) const {
    const json* v = find(key);
    return v ? check_positive_int(key, *v) : fallback;
  }
  double positive_number(const json& v, std::string_view key) const {
    LT_CHECK(v.is_number(), "{}: '{}' is {} {}, expected a positive number", source_, name(key), v.type_name(),
             v.dump());
    double d = v.get<double>();
    LT_CHECK(d > 0, "{}: '{}' is {}, expected a positive number", source_, name(key), d);
    return d;
  }
  double positive_number(const char* key, double fallback) const {
    const json* v = find(key);
    return v ? positive_number(*v, key) : fallback;
  }
  bool boolean(const char* key, bool fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    LT_CHECK(v->is_boolean(), "{}: '{}' is {} {}, expected true or false", source_, name(key), v->type_name(),
             v->dump());
    return v->get<bool>();
  }
  std::optional<std::string> string(const char* key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    LT_CHECK(v->is_string(), "{}: '{}' is {} {}, expected a string", source_, name(key), v->type_name(), v->dump());
    return v->get<std::string>();
  }
  int64_t token_id(const json& v, const char* key) const {
    LT_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0,
             "{}: '{}' holds {} {}, expected a non-negative integer token id", source_, name(key), v.type_name(),
             v.dump());
    return v.get<int64_t>();
  }
  const std::string& source() const { return source_; }

 private:
  int64_t check_positive_int(const char* key, const json& v) const {
    LT_CHECK(v.is_number_integer(), "{}: '{}' is {} {}, expected a positive integer", source_, name(key),
             v.type_name(), v.dump());
    int64_t i = v.get<int64_t>();
    LT_CHECK(i > 0, "{}: '{}' is {}, expected a positive integer", source_, name(key), i);
    return i;
  }

  const json& j_;
  const std::string& source_;
  std::string prefix_;
};

// The outer keys of qwen3_5's vision-language config.json that ModelConfig holds itself; the rest of the outer
// object travels in outer_json.
constexpr const char* kOuterKeysHeld[] = {"text_config", "model_type",   "architectures", "tie_word_embeddings",
                                          "dtype",       "torch_dtype", "bos_token_id",  "eos_token_id"};

ModelType parse_model_type(const std::string& t, const std::string& source) {
  if (t == "qwen2") return ModelType::qwen2;
  if (t == "qwen3") return ModelType::qwen3;
  if (t == "llama") return ModelType::llama;
  if (t == "qwen3_5" || t == "qwen3_5_text") return ModelType::qwen3_5;
  if (t == "qwen3_moe") return ModelType::qwen3_moe;
  if (t == "qwen3_5_moe_text") return ModelType::qwen3_5;  // with experts (parse_text_model's moe)
  if (t == "gpt_oss") return ModelType::gpt_oss;
  LT_FAIL("{}: model_type '{}' is not supported (expected qwen2, qwen3, llama, qwen3_moe, gpt_oss, or qwen3_5 / "
          "qwen3_5_text / qwen3_5_moe / qwen3_5_moe_text for Qwen3.5 and Qwen3.6)",
          source, t);
}

// rope_type must be absent, null or "default" — or, where `yarn_ok` (gpt_oss), "yarn": the other scaled variants
// (llama3, linear, dynamic, ...) change the frequencies in ways we do not implement.
void check_rope_type(const Keys& k, const json& obj, const char* field, bool yarn_ok) {
  LT_CHECK(obj.is_object(), "{}: '{}' is {} {}, expected an object or null", k.source(), k.name(field),
           obj.type_name(), obj.dump());
  // Older configs spell rope_scaling's kind "type".
  for (const char* key : {"rope_type", "type"}) {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) continue;
    LT_CHECK(it->is_string() && (*it == "default" || (yarn_ok && *it == "yarn")),
             "{}: {}.{} {} is not supported (only plain RoPE: null or \"default\"{})", k.source(), k.name(field), key,
             it->dump(), yarn_ok ? ", or \"yarn\"" : "");
  }
}

double parse_rope_theta(const Keys& k, double fallback, bool yarn_ok) {
  if (const json* scaling = k.find("rope_scaling")) {
    check_rope_type(k, *scaling, "rope_scaling", yarn_ok);
    LT_CHECK(scaling->contains("rope_type") || scaling->contains("type"),
             "{}: {} {} has no rope_type; only plain RoPE is supported", k.source(), k.name("rope_scaling"),
             scaling->dump());
  }
  double theta = k.positive_number("rope_theta", fallback);
  // Newer transformers (v5) write {"rope_parameters": {"rope_theta": ..., "rope_type": "default"}}.
  if (const json* params = k.find("rope_parameters")) {
    check_rope_type(k, *params, "rope_parameters", yarn_ok);
    auto it = params->find("rope_theta");
    if (it != params->end() && !it->is_null()) {
      double inner = k.positive_number(*it, "rope_parameters.rope_theta");
      LT_CHECK(!k.has("rope_theta") || inner == theta, "{}: {} {} and {} {} disagree", k.source(),
               k.name("rope_theta"), theta, k.name("rope_parameters.rope_theta"), inner);
      theta = inner;
    }
  }
  return theta;
}

// The RoPE objects of a config: rope_parameters (transformers v5), then the legacy rope_scaling.
std::vector<std::pair<const json*, const char*>> rope_objects(const Keys& k) {
  std::vector<std::pair<const json*, const char*>> out;
  for (const char* field : {"rope_parameters", "rope_scaling"})
    if (const json* obj = k.find(field); obj && obj->is_object()) out.emplace_back(obj, field);
  return out;
}

// qwen3_5: RoPE covers the first int(D · partial_rotary_factor) dims of a head. The factor may sit at the top of
// the text config and in rope_parameters (released checkpoints write both); every copy must agree.
double parse_partial_rotary_factor(const Keys& k, int64_t head_dim, double fallback) {
  std::optional<double> factor;
  std::string from;
  auto take = [&](const json& v, const std::string& key) {
    double f = k.positive_number(v, key);
    LT_CHECK(!factor || *factor == f, "{}: {} {} and {} {} disagree", k.source(), from, *factor, k.name(key), f);
    factor = f;
    from = k.name(key);
  };
  if (const json* v = k.find("partial_rotary_factor")) take(*v, "partial_rotary_factor");
  for (const auto& [obj, field] : rope_objects(k)) {
    auto it = obj->find("partial_rotary_factor");
    if (it != obj->end() && !it->is_null()) take(*it, std::string(field) + ".partial_rotary_factor");
  }
  const double f = factor.value_or(fallback);
  if (from.empty()) from = "partial_rotary_factor (default)";
  const int64_t dims = int64_t(double(head_dim) * f);
  LT_CHECK(f <= 1 && dims > 0 && dims % 2 == 0,
           "{}: {} {} gives int({} x {}) = {} rotary dims of head_dim {}; RoPE needs an even number in [2, head_dim]",
           k.source(), from, f, head_dim, f, dims, head_dim);
  return f;
}

// qwen3_5's multimodal RoPE settings. Text-only positions give the three position rows (temporal, height,
// width) the same value, so mRoPE reduces to plain 1-D RoPE over rotary_dim(): we keep them only to write
// them back.
void parse_mrope(const Keys& k, ModelConfig& c) {
  for (const auto& [obj, field] : rope_objects(k)) {
    auto sec = obj->find("mrope_section");
    auto inter = obj->find("mrope_interleaved");
    bool any = false;
    if (sec != obj->end() && !sec->is_null()) {
      any = true;
      const std::string key = k.name(std::string(field) + ".mrope_section");
      LT_CHECK(sec->is_array(), "{}: '{}' is {} {}, expected a list of integers", k.source(), key, sec->type_name(),
               sec->dump());
      c.mrope_section.clear();
      for (const json& v : *sec) {
        LT_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0,
                 "{}: '{}' holds {} {}, expected non-negative integers", k.source(), key, v.type_name(), v.dump());
        c.mrope_section.push_back(v.get<int64_t>());
      }
    }
    if (inter != obj->end() && !inter->is_null()) {
      any = true;
      LT_CHECK(inter->is_boolean(), "{}: '{}' is {} {}, expected true or false", k.source(),
               k.name(std::string(field) + ".mrope_interleaved"), inter->type_name(), inter->dump());
      c.mrope_interleaved = inter->get<bool>();
    }
    if (any) return;  // the first object that has them wins (a config holds one RoPE object in practice)
  }
}

// transformers v5 renamed torch_dtype to dtype; qwen3_5's vision-language form may carry either in the outer object
// and in text_config. Every copy present must agree. nullopt when there is none.
std::optional<DType> parse_torch_dtype(std::initializer_list<const Keys*> objects) {
  std::optional<DType> out;
  std::string from, from_value;
  for (const Keys* k : objects) {
    for (const char* key : {"torch_dtype", "dtype"}) {
      std::optional<std::string> s = k->string(key);
      if (!s) continue;
      DType t;
      if (*s == "float32")
        t = DType::f32;
      else if (*s == "bfloat16")
        t = DType::bf16;
      else if (*s == "float16")
        t = DType::f16;
      else
        LT_FAIL("{}: {} '{}' is not supported (expected float32, bfloat16 or float16)", k->source(), k->name(key),
                *s);
      LT_CHECK(!out || *s == from_value, "{}: {} '{}' and {} '{}' disagree", k->source(), from, from_value,
               k->name(key), *s);
      out = t;
      from = k->name(key);
      from_value = *s;
    }
  }
  return out;
}

// bos/eos ids: from the first object holding each key. For qwen3_5's vision-language form that is the outer
// object, then text_config, as transformers' GenerationConfig.from_model_config fills what the outer config leaves
// unset from the decoder's config.
void parse_token_ids(std::initializer_list<const Keys*> objects, ModelConfig& c) {
  for (const Keys* k : objects) {
    if (const json* bos = k->find("bos_token_id")) {
      c.bos_token_id = k->token_id(*bos, "bos_token_id");
      break;
    }
  }
  for (const Keys* k : objects) {
    const json* eos = k->find("eos_token_id");
    if (!eos) continue;
    if (eos->is_array()) {
      for (const json& v : *eos) c.eos_token_ids.push_back(k->token_id(v, "eos_token_id"));
    } else {
      c.eos_token_ids.push_back(k->token_id(*eos, "eos_token_id"));
    }
    break;
  }
  if (!c.eos_token_ids.empty()) c.eos_token_id = c.eos_token_ids.front();
}

int64_t parse_head_dim(const Keys& k, const ModelConfig& c) {
  // Qwen3_5TextConfig declares head_dim = 256, so an absent key means 256, not hidden / heads.
  if (c.type == ModelType::qwen3_5) return k.positive_int("head_dim", 256);
  bool divisible = c.hidden_size % c.num_heads == 0;
  int64_t derived = c.hidden_size / c.num_heads;
  if (c.type == ModelType::qwen2) {
    // transformers' Qwen2 derives head_dim; a different explicit value would mean another model.
    LT_CHECK(divisible, "{}: hidden_size {} is not a multiple of num_attention_heads {}", k.source(), c.hidden_size,
             c.num_heads);
    int64_t hd = k.positive_int("head_dim", derived);
    LT_CHECK(hd == derived, "{}: head_dim {} differs from hidden_size / num_attention_heads = {}, which qwen2 uses",
             k.source(), hd, derived);
    return derived;
  }
  LT_CHECK(divisible || k.has("head_dim"),
           "{}: hidden_size {} is not a multiple of num_attention_heads {} and there is no head_dim", k.source(),
           c.hidden_size, c.num_heads);
  return k.positive_int("head_dim", derived);
}

// One layer_types entry. qwen3_5 also takes the legacy names transformers remaps ("attention", "mamba"); qwen2 and
// qwen3 write "sliding_attention" for layers that use a window only when use_sliding_window is true (refused).
std::optional<LayerKind> layer_kind_from(const std::string& s, ModelType type) {
  if (s == "full_attention") return LayerKind::full_attention;
  if (type == ModelType::qwen3_5) {
    if (s == "linear_attention" || s == "mamba") return LayerKind::linear_attention;
    if (s == "attention") return LayerKind::full_attention;
  }
  if ((type == ModelType::qwen2 || type == ModelType::qwen3 || type == ModelType::qwen3_moe) && s == "sliding_attention")
    return LayerKind::full_attention;
  if (type == ModelType::gpt_oss && s == "sliding_attention") return LayerKind::sliding_attention;
  return std::nullopt;
}

// layer_types when given, else (qwen3_5) layer i is full attention iff (i + 1) % full_attention_interval == 0.
std::vector<LayerKind> parse_layer_types(const Keys& k, ModelType type, int64_t num_layers) {
  const json* v = k.find("layer_types");
  if (!v && type == ModelType::gpt_oss) {  // GptOssConfig's default: sliding, full, sliding, ...
    std::vector<LayerKind> kinds;
    for (int64_t i = 0; i < num_layers; ++i)
      kinds.push_back(i % 2 == 0 ? LayerKind::sliding_attention : LayerKind::full_attention);
    return kinds;
  }
  if (!v) {
    if (type != ModelType::qwen3_5) return std::vector<LayerKind>(size_t(num_layers), LayerKind::full_attention);
    const int64_t interval = k.positive_int("full_attention_interval", 4);
    std::vector<LayerKind> kinds;
    for (int64_t i = 0; i < num_layers; ++i)
      kinds.push_back((i + 1) % interval == 0 ? LayerKind::full_attention : LayerKind::linear_attention);
    return kinds;
  }
  const std::string key = k.name("layer_types");
  LT_CHECK(v->is_array(), "{}: '{}' is {} {}, expected a list of layer kinds", k.source(), key, v->type_name(),
           v->dump());
  LT_CHECK(int64_t(v->size()) == num_layers, "{}: '{}' lists {} layers but num_hidden_layers is {}", k.source(), key,
           v->size(), num_layers);
  const char* expected = type == ModelType::qwen3_5   ? "\"linear_attention\" or \"full_attention\""
                         : type == ModelType::gpt_oss ? "\"sliding_attention\" or \"full_attention\""
                                                      : "\"full_attention\" (no linear-attention layers in this model)";
  std::vector<LayerKind> kinds;
  for (size_t i = 0; i < v->size(); ++i) {
    const json& e = (*v)[i];
    std::optional<LayerKind> kind = e.is_string() ? layer_kind_from(e.get<std::string>(), type) : std::nullopt;
    LT_CHECK(kind, "{}: '{}'[{}] is {}, expected {}", k.source(), key, i, e.dump(), expected);
    kinds.push_back(*kind);
  }
  return kinds;
}

// router_aux_loss_coef: a number >= 0 (read and written back; training takes its coefficient from the settings).
double parse_router_aux_loss_coef(const Keys& k, double fallback) {
  const json* v = k.find("router_aux_loss_coef");
  if (!v) return fallback;
  LT_CHECK(v->is_number() && v->get<double>() >= 0, "{}: '{}' is {}, expected a number >= 0", k.source(),
           k.name("router_aux_loss_coef"), v->dump());
  return v->get<double>();
}

// qwen3_5_moe's experts (Qwen3_5MoeTextConfig's defaults): every layer sparse, top-k renormalised, a shared expert.
void parse_qwen3_5_experts(const Keys& k, ModelConfig& c) {
  c.num_experts = k.positive_int("num_experts", 256);
  c.num_experts_per_tok = k.positive_int("num_experts_per_tok", 8);
  LT_CHECK(c.num_experts_per_tok <= c.num_experts, "{}: '{}' {} exceeds '{}' {}", k.source(),
           k.name("num_experts_per_tok"), c.num_experts_per_tok, k.name("num_experts"), c.num_experts);
  c.moe_intermediate_size = k.positive_int("moe_intermediate_size", 512);
  c.shared_expert_intermediate_size = k.positive_int("shared_expert_intermediate_size", 512);
  c.norm_topk_prob = true;
  c.router_aux_loss_coef = parse_router_aux_loss_coef(k, c.router_aux_loss_coef);
}

// qwen3_5's gated attention and Gated DeltaNet settings, with Qwen3_5TextConfig's defaults; its experts when `moe`.
void parse_qwen3_5_layers(const Keys& k, ModelConfig& c, bool moe) {
  if (moe) {
    parse_qwen3_5_experts(k, c);
  } else {
    for (const char* key : {"num_experts", "num_local_experts", "moe_intermediate_size"}) {
      const json* v = k.find(key);
      LT_CHECK(!v || (v->is_number_integer() && v->get<int64_t>() == 0),
               "{}: '{}' is {}: a dense qwen3_5 model has no experts (model_type qwen3_5_moe / qwen3_5_moe_text "
               "has)",
               k.source(), k.name(key), v ? v->dump() : "");
    }
  }
  // transformers' Qwen3_5Attention always doubles q_proj for the gate; a config saying otherwise is another model.
  LT_CHECK(k.boolean("attn_output_gate", true),
           "{}: '{}' is false; qwen3_5's attention always gates its output (transformers ignores the key)",
           k.source(), k.name("attn_output_gate"));
  c.attn_output_gate = true;
  c.zero_centred_norms = true;
  c.qk_norm = true;
  c.qkv_bias = c.o_bias = k.boolean("attention_bias", false);
  c.linear_num_key_heads = k.positive_int("linear_num_key_heads", 16);
  c.linear_num_value_heads = k.positive_int("linear_num_value_heads", 32);
  c.linear_key_head_dim = k.positive_int("linear_key_head_dim", 128);
  c.linear_value_head_dim = k.positive_int("linear_value_head_dim", 128);
  c.linear_conv_kernel_dim = k.positive_int("linear_conv_kernel_dim", 4);
  LT_CHECK(c.linear_num_value_heads % c.linear_num_key_heads == 0,
           "{}: '{}' {} is not a multiple of '{}' {} (each key head serves a whole group of value heads)",
           k.source(), k.name("linear_num_value_heads"), c.linear_num_value_heads, k.name("linear_num_key_heads"),
           c.linear_num_key_heads);
  c.partial_rotary_factor = parse_partial_rotary_factor(k, c.head_dim, 0.25);
  parse_mrope(k, c);
}

// qwen3_moe's experts and router, with Qwen3MoeConfig's defaults.
void parse_qwen3_moe(const Keys& k, ModelConfig& c) {
  c.qkv_bias = c.o_bias = k.boolean("attention_bias", false);
  c.qk_norm = true;
  c.num_experts = k.positive_int("num_experts", 128);
  c.num_experts_per_tok = k.positive_int("num_experts_per_tok", 8);
  LT_CHECK(c.num_experts_per_tok <= c.num_experts, "{}: '{}' {} exceeds '{}' {}", k.source(),
           k.name("num_experts_per_tok"), c.num_experts_per_tok, k.name("num_experts"), c.num_experts);
  c.moe_intermediate_size = k.positive_int("moe_intermediate_size", 768);
  c.norm_topk_prob = k.boolean("norm_topk_prob", false);
  c.decoder_sparse_step = k.positive_int("decoder_sparse_step", 1);
  if (const json* v = k.find("mlp_only_layers")) {
    const std::string key = k.name("mlp_only_layers");
    LT_CHECK(v->is_array(), "{}: '{}' is {} {}, expected a list of layer indices", k.source(), key, v->type_name(),
             v->dump());
    for (const json& e : *v) {
      LT_CHECK(e.is_number_integer() && e.get<int64_t>() >= 0 && e.get<int64_t>() < c.num_layers,
               "{}: '{}' holds {}, expected layer indices in [0, {})", k.source(), key, e.dump(), c.num_layers);
      c.mlp_only_layers.push_back(e.get<int64_t>());
    }
  }
  c.router_aux_loss_coef = parse_router_aux_loss_coef(k, c.router_aux_loss_coef);
}

// rope_scaling / rope_parameters of rope_type "yarn" (gpt_oss), as transformers' _compute_yarn_parameters reads it:
// factor; beta_fast 32 and beta_slow 1 by default; original_max_position_embeddings (default max_position_embeddings);
// truncate (default true); attention_factor, or from mscale / mscale_all_dim, or 0.1·ln(factor) + 1 (ops/rope.h).
void parse_yarn(const Keys& k, ModelConfig& c) {
  for (const auto& entry : rope_objects(k)) {
    const json* obj = entry.first;  // named, not a structured binding: clang 14's lambdas cannot capture those
    const char* field = entry.second;
    auto type = obj->find("rope_type");
    if (type == obj->end()) type = obj->find("type");
    if (type == obj->end() || type->is_null() || *type != "yarn") continue;
    auto number = [&](const char* key, double fallback) {
      auto it = obj->find(key);
      return it == obj->end() || it->is_null() ? fallback : k.positive_number(*it, std::string(field) + "." + key);
    };
    c.yarn_factor = number("factor", 0);
    LT_CHECK(c.yarn_factor >= 1, "{}: {}.factor is {}, expected a number >= 1 for YaRN", k.source(), k.name(field),
             c.yarn_factor);
    c.yarn_beta_fast = number("beta_fast", 32.0);
    c.yarn_beta_slow = number("beta_slow", 1.0);
    c.yarn_original_max_positions = int64_t(number("original_max_position_embeddings",
                                                   double(c.max_position_embeddings)));
    if (auto t = obj->find("truncate"); t != obj->end() && !t->is_null()) {
      LT_CHECK(t->is_boolean(), "{}: {}.truncate is {}, expected true or false", k.source(), k.name(field), t->dump());
      c.yarn_truncate = t->get<bool>();
    }
    c.yarn_attention_factor = number("attention_factor", 0);
    const double mscale = number("mscale", 0), mscale_all = number("mscale_all_dim", 0);
    if (c.yarn_attention_factor == 0 && mscale > 0 && mscale_all > 0) {
      auto get = [&](double m) { return c.yarn_factor <= 1 ? 1.0 : 0.1 * m * std::log(c.yarn_factor) + 1.0; };
      c.yarn_attention_factor = get(mscale) / get(mscale_all);
    }
    c.rope();  // checks the combination
    return;
  }
}

// gpt_oss (GptOssConfig's defaults): attention with biases and sinks, sliding and full layers, every MLP sparse.
// Its `intermediate_size` is an expert's; there is no dense MLP.
void parse_gpt_oss(const Keys& k, ModelConfig& c) {
  c.qkv_bias = c.o_bias = k.boolean("attention_bias", true);
  c.attention_sinks = true;
  c.num_experts = k.positive_int("num_local_experts", 128);
  c.num_experts_per_tok = k.positive_int("num_experts_per_tok", 4);
  LT_CHECK(c.num_experts_per_tok <= c.num_experts, "{}: '{}' {} exceeds '{}' {}", k.source(),
           k.name("num_experts_per_tok"), c.num_experts_per_tok, k.name("num_local_experts"), c.num_experts);
  c.moe_intermediate_size = k.positive_int("intermediate_size", 2880);
  c.intermediate_size = 0;
  c.sliding_window = k.positive_int("sliding_window", 128);
  c.swiglu_limit = k.positive_number("swiglu_limit", 7.0);
  c.router_aux_loss_coef = parse_router_aux_loss_coef(k, 0.9);
  if (const json* q = k.find("quantization_config")) {
    const std::string key = k.name("quantization_config");
    LT_CHECK(q->is_object(), "{}: '{}' is {}, expected an object", k.source(), key, q->dump());
    auto method = q->find("quant_method");
    LT_CHECK(method != q->end() && *method == "mxfp4",
             "{}: {}.quant_method is {}; only GPT-OSS's \"mxfp4\" experts are read (dequantised on load)", k.source(),
             key, method == q->end() ? "missing" : method->dump());
    c.mxfp4_experts = true;
  }
}

// The text model's keys of one config object (the whole file, or qwen3_5's text_config), except the ones the
// vision-language form takes from the outer object: tie_word_embeddings, the dtype and the token ids.
ModelConfig parse_text_model(const Keys& k, ModelType type, bool moe = false) {
  ModelConfig c;
  c.type = type;
  c.vocab_size = k.positive_int("vocab_size");
  c.hidden_size = k.positive_int("hidden_size");
  // Qwen3MoeConfig declares intermediate_size = 6144 (its dense layers'); qwen3_5_moe has no dense MLP; the others
  // require it.
  c.intermediate_size = type == ModelType::qwen3_moe ? k.positive_int("intermediate_size", 6144)
                        : moe || type == ModelType::gpt_oss ? 0  // gpt_oss: an expert's (parse_gpt_oss)
                                                            : k.positive_int("intermediate_size");
  c.num_layers = k.positive_int("num_hidden_layers");
  c.num_heads = k.positive_int("num_attention_heads");
  // Qwen3_5TextConfig declares num_key_value_heads = 4, GptOssConfig 8; the others default to multi-head attention.
  c.num_kv_heads = k.positive_int("num_key_value_heads", type == ModelType::qwen3_5   ? 4
                                                         : type == ModelType::gpt_oss ? 8
                                                                                      : c.num_heads);
  LT_CHECK(c.num_heads % c.num_kv_heads == 0, "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}",
           k.source(), c.num_heads, c.num_kv_heads);
  c.head_dim = parse_head_dim(k, c);
  const bool gpt_oss = type == ModelType::gpt_oss;
  c.rms_norm_eps = k.positive_number("rms_norm_eps", gpt_oss ? 1e-5 : 1e-6);
  c.rope_theta = parse_rope_theta(k, gpt_oss ? 150000.0 : 10000.0, gpt_oss);

  LT_CHECK(!k.boolean("use_sliding_window", false),
           "{}: use_sliding_window is true; sliding-window attention is not supported", k.source());
  // qwen3_5's Gated DeltaNet uses hidden_act for its conv too: silu there as well.
  if (std::optional<std::string> act = k.string("hidden_act"))
    LT_CHECK(*act == "silu", "{}: {} '{}' is not supported (expected silu)", k.source(), k.name("hidden_act"), *act);

  switch (c.type) {
    case ModelType::qwen2:
      c.qkv_bias = true;
      break;
    case ModelType::qwen3:
      c.qkv_bias = c.o_bias = k.boolean("attention_bias", false);
      c.qk_norm = true;
      break;
    case ModelType::llama:
      c.qkv_bias = c.o_bias = k.boolean("attention_bias", false);
      c.mlp_bias = k.boolean("mlp_bias", false);
      break;
    case ModelType::qwen3_5:
      parse_qwen3_5_layers(k, c, moe);
      break;
    case ModelType::qwen3_moe:
      parse_qwen3_moe(k, c);
      break;
    case ModelType::gpt_oss:
      parse_gpt_oss(k, c);
      break;
  }
  c.layer_types = parse_layer_types(k, c.type, c.num_layers);
  c.max_position_embeddings = k.positive_int("max_position_embeddings", c.type == ModelType::llama ? 2048
                                                                        : gpt_oss                  ? 131072
                                                                                                   : 32768);
  if (gpt_oss) parse_yarn(k, c);
  return c;
}

// model_type qwen3_5: the released vision-language checkpoint, the text model under "text_config".
ModelConfig parse_vision_language(const json& j, const Keys& outer) {
  const std::string& source = outer.source();
  const json* tc = outer.find("text_config");
  LT_CHECK(tc, "{}: missing required key 'text_config' (model_type qwen3_5 keeps the text model's config there)",
           source);
  LT_CHECK(tc->is_object(), "{}: 'text_config' is {} {}, expected an object", source, tc->type_name(), tc->dump());
  Keys text(*tc, source, "text_config.");
  const bool moe = outer.string("model_type") == "qwen3_5_moe";
  const char* text_type = moe ? "qwen3_5_moe_text" : "qwen3_5_text";
  if (std::optional<std::string> t = text.string("model_type"))
    LT_CHECK(*t == text_type, "{}: text_config.model_type '{}' does not go with model_type '{}' (expected {})", source,
             *t, moe ? "qwen3_5_moe" : "qwen3_5", text_type);
  ModelConfig c = parse_text_model(text, ModelType::qwen3_5, moe);
  c.vision_language = true;
  // transformers ties lm_head by the outer config (Qwen3_5Config.tie_word_embeddings, default false) and ignores
  // text_config's flag for Qwen3_5ForConditionalGeneration.
  c.tie_word_embeddings = outer.boolean("tie_word_embeddings", false);
  c.torch_dtype = parse_torch_dtype({&outer, &text}).value_or(DType::f32);
  parse_token_ids({&outer, &text}, c);
  json rest = j;
  for (const char* key : kOuterKeysHeld) rest.erase(key);
  c.outer_json = rest.empty() ? "" : rest.dump();
  return c;
}

std::string_view architecture_name(const ModelConfig& c) {
  switch (c.type) {
    case ModelType::qwen2: return "Qwen2ForCausalLM";
    case ModelType::qwen3: return "Qwen3ForCausalLM";
    case ModelType::llama: return "LlamaForCausalLM";
    case ModelType::qwen3_5:
      if (c.is_moe()) return c.vision_language ? "Qwen3_5MoeForConditionalGeneration" : "Qwen3_5MoeForCausalLM";
      return c.vision_language ? "Qwen3_5ForConditionalGeneration" : "Qwen3_5ForCausalLM";
    case ModelType::qwen3_moe: return "Qwen3MoeForCausalLM";
    case ModelType::gpt_oss: return "GptOssForCausalLM";
  }
  LT_FAIL("unknown model type {}", int(c.type));
}

std::string_view hf_dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
    default: LT_FAIL("torch_dtype {} cannot be written to config.json (expected f32, bf16 or f16)", dtype_name(t));
  }
}

bool all_full_attention(const std::vector<LayerKind>& kinds) {
  return std::all_of(kinds.begin(), kinds.end(), [](LayerKind k) { return k == LayerKind::full_attention; });
}

bool no_linear_attention(const std::vector<LayerKind>& kinds) {
  return std::none_of(kinds.begin(), kinds.end(), [](LayerKind k) { return k == LayerKind::linear_attention; });
}

// The checks model_config_to_json makes: config.json cannot express every combination of fields, so refuse
// rather than write a different model.
void check_expressible(const ModelConfig& c) {
  switch (c.type) {
    case ModelType::qwen2:
      LT_CHECK(c.qkv_bias && !c.o_bias && !c.mlp_bias && !c.qk_norm && c.q_dim() == c.hidden_size,
               "qwen2 config needs q,k,v biases, no o/mlp bias, no q/k norm and head_dim = hidden_size / heads");
      break;
    case ModelType::qwen3:
    case ModelType::qwen3_moe:
      LT_CHECK(c.qk_norm && c.qkv_bias == c.o_bias && !c.mlp_bias,
               "{} config needs q/k norm, one attention_bias for q,k,v,o and no mlp bias", model_type_name(c.type));
      break;
    case ModelType::llama:
      LT_CHECK(!c.qk_norm && c.qkv_bias == c.o_bias,
               "llama config needs no q/k norm and one attention_bias for q,k,v,o");
      break;
    case ModelType::qwen3_5:
      LT_CHECK(c.qk_norm && c.attn_output_gate && c.zero_centred_norms && c.qkv_bias == c.o_bias && !c.mlp_bias,
               "qwen3_5 config needs q/k norm, the attention output gate, zero-centred norms, one attention_bias for "
               "q,k,v,o and no mlp bias");
      LT_CHECK(c.layer_types.empty() || int64_t(c.layer_types.size()) == c.num_layers,
               "qwen3_5 config: layer_types has {} entries for {} layers", c.layer_types.size(), c.num_layers);
      LT_CHECK(c.linear_num_key_heads > 0 && c.linear_num_value_heads > 0 && c.linear_key_head_dim > 0 &&
                   c.linear_value_head_dim > 0 && c.linear_conv_kernel_dim > 0 &&
                   c.linear_num_value_heads % c.linear_num_key_heads == 0,
               "qwen3_5 config needs positive linear-attention sizes with value heads a multiple of key heads");
      LT_CHECK(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1 && c.rotary_dim() > 0 &&
                   c.rotary_dim() % 2 == 0,
               "qwen3_5 config: partial_rotary_factor {} gives {} rotary dims of {}", c.partial_rotary_factor,
               c.rotary_dim(), c.head_dim);
      break;
    case ModelType::gpt_oss:
      LT_CHECK(!c.qk_norm && c.qkv_bias == c.o_bias && !c.mlp_bias && c.attention_sinks && c.sliding_window > 0 &&
                   c.swiglu_limit > 0 && no_linear_attention(c.layer_kinds()),
               "gpt_oss config needs one attention_bias for q,k,v,o, sinks, a sliding window, the experts' "
               "swiglu_limit, no q/k norm, no mlp bias and only sliding / full attention layers");
      break;
  }
  if (c.type != ModelType::gpt_oss) {
    LT_CHECK(c.sliding_window == 0 && !c.attention_sinks && c.swiglu_limit == 0 && !c.mxfp4_experts &&
                 c.yarn_factor == 1.0 &&
                 std::count(c.layer_types.begin(), c.layer_types.end(), LayerKind::sliding_attention) == 0,
             "{} config cannot hold sliding windows, attention sinks, clamped experts, MXFP4 or YaRN (gpt_oss's)",
             model_type_name(c.type));
  }
  if (c.type != ModelType::qwen3_5 && c.type != ModelType::gpt_oss) {
    LT_CHECK(all_full_attention(c.layer_types) && !c.attn_output_gate && !c.zero_centred_norms &&
                 c.partial_rotary_factor == 1 && c.mrope_section.empty() && !c.mrope_interleaved &&
                 c.linear_num_key_heads == 0 && c.linear_num_value_heads == 0 && c.linear_key_head_dim == 0 &&
                 c.linear_value_head_dim == 0 && c.linear_conv_kernel_dim == 0,
             "{} config cannot hold linear-attention layers, an attention output gate, zero-centred norms or "
             "partial RoPE (those are qwen3_5's)",
             model_type_name(c.type));
    LT_CHECK(!c.vision_language && c.outer_json.empty(), "{} config has no vision-language form",
             model_type_name(c.type));
  }
  if (c.type == ModelType::gpt_oss) {
    LT_CHECK(!c.attn_output_gate && !c.zero_centred_norms && c.partial_rotary_factor == 1 && c.mrope_section.empty() &&
                 !c.vision_language && c.outer_json.empty() && c.num_experts > 0 && c.num_experts_per_tok > 0 &&
                 c.num_experts_per_tok <= c.num_experts && c.moe_intermediate_size > 0 && c.intermediate_size == 0 &&
                 c.decoder_sparse_step == 1 && c.mlp_only_layers.empty() && c.shared_expert_intermediate_size == 0 &&
                 !c.norm_topk_prob,
             "gpt_oss config needs every layer sparse with 0 < k <= E experts (no dense MLP, shared expert or "
             "renormalisation) and none of qwen3_5's features");
  } else if (c.type == ModelType::qwen3_moe) {
    LT_CHECK(c.num_experts > 0 && c.num_experts_per_tok > 0 && c.num_experts_per_tok <= c.num_experts &&
                 c.moe_intermediate_size > 0 && c.decoder_sparse_step > 0 && c.shared_expert_intermediate_size == 0,
             "qwen3_moe config needs experts (E > 0, 0 < k <= E, moe_intermediate_size > 0, decoder_sparse_step > 0) "
             "and no shared expert");
  } else if (c.type == ModelType::qwen3_5 && c.is_moe()) {
    LT_CHECK(c.num_experts_per_tok > 0 && c.num_experts_per_tok <= c.num_experts && c.moe_intermediate_size > 0 &&
                 c.shared_expert_intermediate_size > 0 && c.norm_topk_prob && c.decoder_sparse_step == 1 &&
                 c.mlp_only_layers.empty() && c.intermediate_size == 0,
             "qwen3_5_moe config needs every layer sparse with 0 < k <= E experts, renormalised top-k, a shared expert "
             "and no dense intermediate_size");
  } else {
    LT_CHECK(c.num_experts == 0 && c.num_experts_per_tok == 0 && c.moe_intermediate_size == 0 &&
                 c.mlp_only_layers.empty(),
             "{} config cannot hold mixture-of-experts layers", model_type_name(c.type));
    LT_CHECK(c.shared_expert_intermediate_size == 0, "{} config cannot hold a shared expert", model_type_name(c.type));
  }
  LT_CHECK(c.eos_token_id == (c.eos_token_ids.empty() ? std::nullopt : std::optional(c.eos_token_ids.front())),
           "eos_token_id must be the first of eos_token_ids");
}

void write_token_ids(const ModelConfig& c, json& j) {
  j["bos_token_id"] = c.bos_token_id ? json(*c.bos_token_id) : json(nullptr);
  if (c.eos_token_ids.size() > 1)
    j["eos_token_id"] = c.eos_token_ids;
  else
    j["eos_token_id"] = c.eos_token_id ? json(*c.eos_token_id) : json(nullptr);
}

// The expert keys qwen3_moe and qwen3_5_moe share.
void write_expert_keys(const ModelConfig& c, json& j) {
  j["num_experts"] = c.num_experts;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["router_aux_loss_coef"] = c.router_aux_loss_coef;
  j["output_router_logits"] = false;
}

// qwen3_5's text-model keys (Qwen3_5TextConfig), without the token ids.
json qwen3_5_text_json(const ModelConfig& c) {
  json rope = {
      {"rope_type", "default"}, {"rope_theta", c.rope_theta}, {"partial_rotary_factor", c.partial_rotary_factor}};
  if (!c.mrope_section.empty()) rope["mrope_section"] = c.mrope_section;
  if (c.mrope_interleaved) rope["mrope_interleaved"] = true;
  json layer_types = json::array();
  for (LayerKind k : c.layer_kinds()) layer_types.push_back(layer_kind_name(k));
  json j = {
      {"model_type", c.is_moe() ? "qwen3_5_moe_text" : "qwen3_5_text"},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_layers},
      {"num_attention_heads", c.num_heads},
      {"num_key_value_heads", c.num_kv_heads},
      {"head_dim", c.head_dim},
      {"hidden_act", "silu"},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_parameters", rope},
      {"max_position_embeddings", c.max_position_embeddings},
      {"attention_bias", c.qkv_bias},
      {"attn_output_gate", true},
      {"layer_types", layer_types},
      {"linear_num_key_heads", c.linear_num_key_heads},
      {"linear_num_value_heads", c.linear_num_value_heads},
      {"linear_key_head_dim", c.linear_key_head_dim},
      {"linear_value_head_dim", c.linear_value_head_dim},
      {"linear_conv_kernel_dim", c.linear_conv_kernel_dim},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"dtype", hf_dtype_name(c.torch_dtype)},
      {"attention_dropout", 0.0},
      {"initializer_range", 0.02},
      {"use_cache", true},
  };
  if (c.is_moe()) {  // Qwen3_5MoeTextConfig: no dense MLP
    j.erase("intermediate_size");
    write_expert_keys(c, j);
    j["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
  }
  return j;
}

json qwen3_5_to_json(const ModelConfig& c) {
  json text = qwen3_5_text_json(c);
  if (!c.vision_language) {
    text["architectures"] = {architecture_name(c)};
    write_token_ids(c, text);
    return text;
  }
  json outer = json::object();
  if (!c.outer_json.empty()) {
    outer = json::parse(c.outer_json, nullptr, /*allow_exceptions=*/false);
    LT_CHECK(outer.is_object(), "qwen3_5 config: outer_json is not a JSON object: {}", c.outer_json);
  }
  for (const char* key : kOuterKeysHeld)
    LT_CHECK(!outer.contains(key), "qwen3_5 config: outer_json holds '{}', which ModelConfig holds itself", key);
  outer["architectures"] = {architecture_name(c)};
  outer["model_type"] = c.is_moe() ? "qwen3_5_moe" : "qwen3_5";
  outer["tie_word_embeddings"] = c.tie_word_embeddings;
  outer["dtype"] = hf_dtype_name(c.torch_dtype);
  write_token_ids(c, outer);
  outer["text_config"] = std::move(text);
  return outer;
}

// GptOssConfig's keys. The experts are written dequantised (bf16 files, no quantization_config), whatever the
// checkpoint they were read from held.
json gpt_oss_to_json(const ModelConfig& c) {
  json rope = {{"rope_type", "yarn"},
               {"factor", c.yarn_factor},
               {"beta_fast", c.yarn_beta_fast},
               {"beta_slow", c.yarn_beta_slow},
               {"original_max_position_embeddings", c.yarn_original_max_positions},
               {"truncate", c.yarn_truncate}};
  if (c.yarn_factor == 1.0) rope = nullptr;
  else if (c.yarn_attention_factor > 0) rope["attention_factor"] = c.yarn_attention_factor;
  json layer_types = json::array();
  for (LayerKind k : c.layer_kinds()) layer_types.push_back(layer_kind_name(k));
  json j = {
      {"architectures", {architecture_name(c)}},
      {"model_type", "gpt_oss"},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.moe_intermediate_size},
      {"num_hidden_layers", c.num_layers},
      {"num_attention_heads", c.num_heads},
      {"num_key_value_heads", c.num_kv_heads},
      {"head_dim", c.head_dim},
      {"hidden_act", "silu"},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope_theta},
      {"rope_scaling", rope},
      {"max_position_embeddings", c.max_position_embeddings},
      {"attention_bias", c.qkv_bias},
      {"num_local_experts", c.num_experts},
      {"num_experts_per_tok", c.num_experts_per_tok},
      {"router_aux_loss_coef", c.router_aux_loss_coef},
      {"output_router_logits", false},
      {"sliding_window", c.sliding_window},
      {"layer_types", layer_types},
      {"swiglu_limit", c.swiglu_limit},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"torch_dtype", hf_dtype_name(c.torch_dtype)},
      {"attention_dropout", 0.0},
      {"initializer_range", 0.02},
      {"use_cache", true},
  };
  write_token_ids(c, j);
  return j;
}

}  // namespace

std::string_view model_type_name(ModelType t) {
  switch (t) {
    case ModelType::qwen2: return "qwen2";
    case ModelType::qwen3: return "qwen3";
    case ModelType::llama: return "llama";
    case ModelType::qwen3_5: return "qwen3_5";
    case ModelType::qwen3_moe: return "qwen3_moe";
    case ModelType::gpt_oss: return "gpt_oss";
  }
  LT_FAIL("unknown model type {}", int(t));
}

std::string_view layer_kind_name(LayerKind k) {
  switch (k) {
    case LayerKind::full_attention: return "full_attention";
    case LayerKind::linear_attention: return "linear_attention";
    case LayerKind::sliding_attention: return "sliding_attention";
  }
  LT_FAIL("unknown layer kind {}", int(k));
}

LayerKind ModelConfig::layer_kind(int64_t layer) const {
  LT_CHECK(layer >= 0 && layer < num_layers, "layer {} out of range (model has {})", layer, num_layers);
  if (layer_types.empty()) return LayerKind::full_attention;
  // A copy of a config cut to fewer layers (the profiler's one-layer model) keeps the first entries.
  LT_CHECK(layer < int64_t(layer_types.size()), "layer_types has {} entries, layer {} has none", layer_types.size(),
           layer);
  return layer_types[size_t(layer)];
}

std::vector<LayerKind> ModelConfig::layer_kinds() const {
  std::vector<LayerKind> kinds;
  for (int64_t i = 0; i < num_layers; ++i) kinds.push_back(layer_kind(i));
  return kinds;
}

int64_t ModelConfig::num_full_attention_layers() const {
  return num_layers - num_linear_attention_layers();
}

bool ModelConfig::sparse_layer(int64_t layer) const {
  LT_CHECK(layer >= 0 && layer < num_layers, "layer {} out of range (model has {})", layer, num_layers);
  if (num_experts == 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

int64_t ModelConfig::num_sparse_layers() const {
  int64_t n = 0;
  for (int64_t l = 0; l < num_layers; ++l) n += sparse_layer(l);
  return n;
}

int64_t ModelConfig::num_linear_attention_layers() const {
  std::vector<LayerKind> kinds = layer_kinds();
  return int64_t(std::count(kinds.begin(), kinds.end(), LayerKind::linear_attention));
}

bool ModelConfig::operator==(const ModelConfig& o) const {
  // Every field: add a new one here too.
  auto fields = [](const ModelConfig& c) {
    return std::tie(c.type, c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads,
                    c.num_kv_heads, c.head_dim, c.rms_norm_eps, c.rope_theta, c.qkv_bias, c.o_bias, c.mlp_bias,
                    c.qk_norm, c.tie_word_embeddings, c.max_position_embeddings, c.torch_dtype, c.bos_token_id,
                    c.eos_token_id, c.eos_token_ids, c.attn_output_gate, c.zero_centred_norms,
                    c.partial_rotary_factor, c.mrope_section, c.mrope_interleaved, c.linear_num_key_heads,
                    c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim,
                    c.linear_conv_kernel_dim, c.vision_language, c.outer_json, c.num_experts,
                    c.num_experts_per_tok, c.moe_intermediate_size, c.norm_topk_prob, c.decoder_sparse_step,
                    c.mlp_only_layers, c.router_aux_loss_coef, c.shared_expert_intermediate_size, c.sliding_window,
                    c.attention_sinks, c.swiglu_limit, c.mxfp4_experts, c.yarn_factor, c.yarn_beta_fast,
                    c.yarn_beta_slow, c.yarn_attention_factor, c.yarn_original_max_positions, c.yarn_truncate);
  };
  // A config built in code leaves layer_types empty for "all full attention"; the parser lists them.
  const bool same_layers = layer_types.empty()   ? all_full_attention(o.layer_types)
                           : o.layer_types.empty() ? all_full_attention(layer_types)
                                                   : layer_types == o.layer_types;
  return same_layers && fields(*this) == fields(o);
}

ModelConfig parse_model_config(const json& j, const std::string& source) {
  LT_CHECK(j.is_object(), "{}: is a JSON {}, expected an object", source, j.type_name());
  Keys k(j, source);
  std::optional<std::string> type = k.string("model_type");
  LT_CHECK(type, "{}: missing required key 'model_type'", source);
  if (*type == "qwen3_5" || *type == "qwen3_5_moe") return parse_vision_language(j, k);
  ModelConfig c = parse_text_model(k, parse_model_type(*type, source), *type == "qwen3_5_moe_text");
  // Defaults of Qwen2Config, Qwen3Config, LlamaConfig and Qwen3_5TextConfig (all leave embeddings untied).
  c.tie_word_embeddings = k.boolean("tie_word_embeddings", false);
  c.torch_dtype = parse_torch_dtype({&k}).value_or(DType::f32);
  parse_token_ids({&k}, c);
  return c;
}

ModelConfig load_model_config(const std::string& path_or_dir) {
  std::filesystem::path p(path_or_dir);
  LT_CHECK(path_exists(p),
           "{}: no such file or directory (expected a config.json or a directory holding one)", path_or_dir);
  if (is_directory_path(p)) p /= "config.json";
  return with_json_errors(p.string(), [&] { return parse_model_config(read_json_file(p.string()), p.string()); });
}

int64_t ModelConfig::num_parameters() const {
  const int64_t C = hidden_size, I = intermediate_size, V = vocab_size, D = head_dim;
  // Full attention: q (doubled by the output gate), k, v, o weights.
  int64_t attn = C * q_proj_dim() + 2 * C * kv_dim() + q_dim() * C;
  if (qkv_bias) attn += q_proj_dim() + 2 * kv_dim();
  if (o_bias) attn += C;
  if (qk_norm) attn += 2 * D;
  if (attention_sinks) attn += num_heads;
  // Gated DeltaNet: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a; conv1d; dt_bias, A_log; norm; out_proj.
  const int64_t Hv = linear_num_value_heads;
  const int64_t linear = C * linear_conv_dim() + C * linear_value_dim() + 2 * C * Hv +
                         linear_conv_dim() * linear_conv_kernel_dim + 2 * Hv + linear_value_head_dim +
                         linear_value_dim() * C;
  int64_t mlp = 3 * C * I;  // gate, up, down
  if (mlp_bias) mlp += 2 * I + C;
  const int64_t Is = shared_expert_intermediate_size;  // a shared expert and its [1, C] gate
  // gpt_oss: the router's bias [E] and each expert's biases (gate and up [Ie] each, down [C]).
  const int64_t biases = gpt_oss() ? num_experts * (1 + 2 * moe_intermediate_size + C) : 0;
  const int64_t experts =
      num_experts * C + num_experts * 3 * C * moe_intermediate_size + biases + (Is ? 3 * C * Is + C : 0);
  const int64_t n_linear = num_linear_attention_layers(), n_sparse = num_sparse_layers();
  const int64_t layers = (num_layers - n_linear) * attn + n_linear * linear + (num_layers - n_sparse) * mlp +
                         n_sparse * experts + num_layers * 2 * C;  // + input_layernorm, post_attention_layernorm
  return V * C + layers + C + (tie_word_embeddings ? 0 : V * C);
}

int64_t ModelConfig::num_active_parameters() const {
  const int64_t idle = num_experts - num_experts_per_tok;  // experts a token does not route through
  const int64_t Ie = moe_intermediate_size, per_expert = 3 * hidden_size * Ie + (gpt_oss() ? 2 * Ie + hidden_size : 0);
  return num_parameters() - num_sparse_layers() * idle * per_expert;
}

json model_config_to_json(const ModelConfig& c) {
  check_expressible(c);
  if (c.type == ModelType::qwen3_5) return qwen3_5_to_json(c);
  if (c.type == ModelType::gpt_oss) return gpt_oss_to_json(c);
  json j = {
      {"architectures", {architecture_name(c)}},
      {"model_type", model_type_name(c.type)},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_layers},
      {"num_attention_heads", c.num_heads},
      {"num_key_value_heads", c.num_kv_heads},
      {"hidden_act", "silu"},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope_theta},
      {"rope_scaling", nullptr},
      {"max_position_embeddings", c.max_position_embeddings},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"torch_dtype", hf_dtype_name(c.torch_dtype)},
      {"attention_dropout", 0.0},
      {"initializer_range", 0.02},
      {"use_cache", true},
  };
  write_token_ids(c, j);
  if (c.type != ModelType::qwen2) {
    j["head_dim"] = c.head_dim;
    j["attention_bias"] = c.qkv_bias;
  }
  if (c.type == ModelType::llama) j["mlp_bias"] = c.mlp_bias;
  if (c.type == ModelType::qwen3_moe) {
    write_expert_keys(c, j);
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["decoder_sparse_step"] = c.decoder_sparse_step;
    j["mlp_only_layers"] = c.mlp_only_layers;
  }
  if (c.type != ModelType::llama) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.num_layers;
  }
  return j;
}

}  // namespace lt
