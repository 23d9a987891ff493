#include "model/config.h"

#include <filesystem>

#include "core/error.h"
#include "io/json_file.h"

namespace lt {

using nlohmann::json;

namespace {

// Typed access to one config.json object; every error names the file and the key. A key whose value is
// null counts as absent, as in transformers (configs write "rope_scaling": null, "sliding_window": null).
class Keys {
 public:
  Keys(const json& j, const std::string& source) : j_(j), source_(source) {}

  const json* find(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  bool has(const char* key) const { return find(key) != nullptr; }

  int64_t positive_int(const char* key) const {
    const json* v = find(key);
    LT_CHECK(v, "{}: missing required key '{}'", source_, key);
    return check_positive_int(key, *v);
  }
  int64_t positive_int(const char* key, int64_t fallback) const {
    const json* v = find(key);
    return v ? check_positive_int(key, *v) : fallback;
  }
  double positive_number(const json& v, const std::string& key) const {
    LT_CHECK(v.is_number(), "{}: '{}' is {} {}, expected a positive number", source_, key, v.type_name(), v.dump());
    double d = v.get<double>();
    LT_CHECK(d > 0, "{}: '{}' is {}, expected a positive number", source_, key, d);
    return d;
  }
  double positive_number(const char* key, double fallback) const {
    const json* v = find(key);
    return v ? positive_number(*v, key) : fallback;
  }
  bool boolean(const char* key, bool fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    LT_CHECK(v->is_boolean(), "{}: '{}' is {} {}, expected true or false", source_, key, v->type_name(), v->dump());
    return v->get<bool>();
  }
  std::optional<std::string> string(const char* key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    LT_CHECK(v->is_string(), "{}: '{}' is {} {}, expected a string", source_, key, v->type_name(), v->dump());
    return v->get<std::string>();
  }
  int64_t token_id(const json& v, const char* key) const {
    LT_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0,
             "{}: '{}' holds {} {}, expected a non-negative integer token id", source_, key, v.type_name(), v.dump());
    return v.get<int64_t>();
  }
  const std::string& source() const { return source_; }

 private:
  int64_t check_positive_int(const char* key, const json& v) const {
    LT_CHECK(v.is_number_integer(), "{}: '{}' is {} {}, expected a positive integer", source_, key, v.type_name(),
             v.dump());
    int64_t i = v.get<int64_t>();
    LT_CHECK(i > 0, "{}: '{}' is {}, expected a positive integer", source_, key, i);
    return i;
  }

  const json& j_;
  const std::string& source_;
};

ModelType parse_model_type(const Keys& k) {
  std::optional<std::string> t = k.string("model_type");
  LT_CHECK(t, "{}: missing required key 'model_type'", k.source());
  if (*t == "qwen2") return ModelType::qwen2;
  if (*t == "qwen3") return ModelType::qwen3;
  if (*t == "llama") return ModelType::llama;
  LT_FAIL("{}: model_type '{}' is not supported (expected qwen2, qwen3 or llama)", k.source(), *t);
}

// rope_type must be absent, null or "default": scaled variants (llama3, yarn, linear, dynamic, ...)
// change the frequencies and we implement plain RoPE only.
void check_rope_type(const Keys& k, const json& obj, const char* field) {
  LT_CHECK(obj.is_object(), "{}: '{}' is {} {}, expected an object or null", k.source(), field, obj.type_name(),
           obj.dump());
  // Older configs spell rope_scaling's kind "type".
  for (const char* key : {"rope_type", "type"}) {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) continue;
    LT_CHECK(it->is_string() && *it == "default",
             "{}: {}.{} {} is not supported (only plain RoPE: null or \"default\")", k.source(), field, key,
             it->dump());
  }
}

double parse_rope_theta(const Keys& k) {
  if (const json* scaling = k.find("rope_scaling")) {
    check_rope_type(k, *scaling, "rope_scaling");
    LT_CHECK(scaling->contains("rope_type") || scaling->contains("type"),
             "{}: rope_scaling {} has no rope_type; only plain RoPE is supported", k.source(), scaling->dump());
  }
  double theta = k.positive_number("rope_theta", 10000.0);
  // Newer transformers (v5) write {"rope_parameters": {"rope_theta": ..., "rope_type": "default"}}.
  if (const json* params = k.find("rope_parameters")) {
    check_rope_type(k, *params, "rope_parameters");
    auto it = params->find("rope_theta");
    if (it != params->end() && !it->is_null()) {
      double inner = k.positive_number(*it, "rope_parameters.rope_theta");
      LT_CHECK(!k.has("rope_theta") || inner == theta,
               "{}: rope_theta {} and rope_parameters.rope_theta {} disagree", k.source(), theta, inner);
      theta = inner;
    }
  }
  return theta;
}

DType parse_torch_dtype(const Keys& k) {
  // transformers v5 renamed torch_dtype to dtype; a file with both must agree.
  std::optional<std::string> a = k.string("torch_dtype"), b = k.string("dtype");
  LT_CHECK(!a || !b || *a == *b, "{}: torch_dtype '{}' and dtype '{}' disagree", k.source(), *a, *b);
  std::optional<std::string> s = b ? b : a;
  if (!s) return DType::f32;
  if (*s == "float32") return DType::f32;
  if (*s == "bfloat16") return DType::bf16;
  if (*s == "float16") return DType::f16;
  LT_FAIL("{}: {} '{}' is not supported (expected float32, bfloat16 or float16)", k.source(),
          b ? "dtype" : "torch_dtype", *s);
}

void parse_token_ids(const Keys& k, ModelConfig& c) {
  if (const json* bos = k.find("bos_token_id")) c.bos_token_id = k.token_id(*bos, "bos_token_id");
  if (const json* eos = k.find("eos_token_id")) {
    if (eos->is_array()) {
      for (const json& v : *eos) c.eos_token_ids.push_back(k.token_id(v, "eos_token_id"));
    } else {
      c.eos_token_ids.push_back(k.token_id(*eos, "eos_token_id"));
    }
  }
  if (!c.eos_token_ids.empty()) c.eos_token_id = c.eos_token_ids.front();
}

int64_t parse_head_dim(const Keys& k, const ModelConfig& c) {
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

std::string_view architecture_name(ModelType t) {
  switch (t) {
    case ModelType::qwen2: return "Qwen2ForCausalLM";
    case ModelType::qwen3: return "Qwen3ForCausalLM";
    case ModelType::llama: return "LlamaForCausalLM";
  }
  LT_FAIL("unknown model type {}", int(t));
}

std::string_view hf_dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
    default: LT_FAIL("torch_dtype {} cannot be written to config.json (expected f32, bf16 or f16)", dtype_name(t));
  }
}

}  // namespace

std::string_view model_type_name(ModelType t) {
  switch (t) {
    case ModelType::qwen2: return "qwen2";
    case ModelType::qwen3: return "qwen3";
    case ModelType::llama: return "llama";
  }
  LT_FAIL("unknown model type {}", int(t));
}

ModelConfig parse_model_config(const json& j, const std::string& source) {
  LT_CHECK(j.is_object(), "{}: is a JSON {}, expected an object", source, j.type_name());
  Keys k(j, source);
  ModelConfig c;
  c.type = parse_model_type(k);
  c.vocab_size = k.positive_int("vocab_size");
  c.hidden_size = k.positive_int("hidden_size");
  c.intermediate_size = k.positive_int("intermediate_size");
  c.num_layers = k.positive_int("num_hidden_layers");
  c.num_heads = k.positive_int("num_attention_heads");
  c.num_kv_heads = k.positive_int("num_key_value_heads", c.num_heads);
  LT_CHECK(c.num_heads % c.num_kv_heads == 0, "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}",
           source, c.num_heads, c.num_kv_heads);
  c.head_dim = parse_head_dim(k, c);
  c.rms_norm_eps = k.positive_number("rms_norm_eps", 1e-6);
  c.rope_theta = parse_rope_theta(k);

  LT_CHECK(!k.boolean("use_sliding_window", false),
           "{}: use_sliding_window is true; sliding-window attention is not supported", source);
  if (std::optional<std::string> act = k.string("hidden_act"))
    LT_CHECK(*act == "silu", "{}: hidden_act '{}' is not supported (expected silu)", source, *act);

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
  }
  // Defaults of Qwen2Config, Qwen3Config and LlamaConfig (all three leave embeddings untied).
  c.tie_word_embeddings = k.boolean("tie_word_embeddings", false);
  c.max_position_embeddings = k.positive_int("max_position_embeddings", c.type == ModelType::llama ? 2048 : 32768);
  c.torch_dtype = parse_torch_dtype(k);
  parse_token_ids(k, c);
  return c;
}

ModelConfig load_model_config(const std::string& path_or_dir) {
  std::filesystem::path p(path_or_dir);
  LT_CHECK(std::filesystem::exists(p),
           "{}: no such file or directory (expected a config.json or a directory holding one)", path_or_dir);
  if (std::filesystem::is_directory(p)) p /= "config.json";
  return with_json_errors(p.string(), [&] { return parse_model_config(read_json_file(p.string()), p.string()); });
}

int64_t ModelConfig::num_parameters() const {
  const int64_t C = hidden_size, I = intermediate_size, V = vocab_size, D = head_dim;
  int64_t attn = C * q_dim() + 2 * C * kv_dim() + q_dim() * C;  // q, k, v, o weights
  if (qkv_bias) attn += q_dim() + 2 * kv_dim();
  if (o_bias) attn += C;
  if (qk_norm) attn += 2 * D;
  int64_t mlp = 3 * C * I;  // gate, up, down
  if (mlp_bias) mlp += 2 * I + C;
  int64_t layer = attn + mlp + 2 * C;  // + input_layernorm, post_attention_layernorm
  return V * C + num_layers * layer + C + (tie_word_embeddings ? 0 : V * C);
}

json model_config_to_json(const ModelConfig& c) {
  std::string_view type = model_type_name(c.type);
  // config.json cannot express every combination of flags: refuse rather than write a different model.
  switch (c.type) {
    case ModelType::qwen2:
      LT_CHECK(c.qkv_bias && !c.o_bias && !c.mlp_bias && !c.qk_norm && c.q_dim() == c.hidden_size,
               "qwen2 config needs q,k,v biases, no o/mlp bias, no q/k norm and head_dim = hidden_size / heads");
      break;
    case ModelType::qwen3:
      LT_CHECK(c.qk_norm && c.qkv_bias == c.o_bias && !c.mlp_bias,
               "qwen3 config needs q/k norm, one attention_bias for q,k,v,o and no mlp bias");
      break;
    case ModelType::llama:
      LT_CHECK(!c.qk_norm && c.qkv_bias == c.o_bias,
               "llama config needs no q/k norm and one attention_bias for q,k,v,o");
      break;
  }
  LT_CHECK(c.eos_token_id == (c.eos_token_ids.empty() ? std::nullopt : std::optional(c.eos_token_ids.front())),
           "eos_token_id must be the first of eos_token_ids");

  json j = {
      {"architectures", {architecture_name(c.type)}},
      {"model_type", type},
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
  j["bos_token_id"] = c.bos_token_id ? json(*c.bos_token_id) : json(nullptr);
  if (c.eos_token_ids.size() > 1)
    j["eos_token_id"] = c.eos_token_ids;
  else
    j["eos_token_id"] = c.eos_token_id ? json(*c.eos_token_id) : json(nullptr);
  if (c.type != ModelType::qwen2) {
    j["head_dim"] = c.head_dim;
    j["attention_bias"] = c.qkv_bias;
  }
  if (c.type == ModelType::llama) j["mlp_bias"] = c.mlp_bias;
  if (c.type != ModelType::llama) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.num_layers;
  }
  return j;
}

}  // namespace lt
