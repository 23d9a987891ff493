// model/config.h — the model a HF config.json describes, with transformers' semantics and defaults.
//
// Supported: Qwen2 (Qwen2.5), Qwen3 and Llama decoders with plain RoPE, RMSNorm, SwiGLU MLP and GQA.
// Anything we do not implement (other model types, scaled RoPE, sliding-window attention, activations
// other than SiLU) is refused with the file, the key and the value, never silently approximated.
//
// Where each flag comes from (transformers' modeling code):
//   qwen2: q,k,v biases always; o bias never; no q/k norm; head_dim = hidden / heads.
//   qwen3: attention_bias (default false) on q,k,v AND o; q/k RMSNorm over head_dim always;
//          head_dim key (default hidden / heads).
//   llama: attention_bias (default false) on q,k,v,o; mlp_bias (default false) on gate,up,down;
//          head_dim key (default hidden / heads).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"

namespace lt {

enum class ModelType { qwen2, qwen3, llama };

struct ModelConfig {
  ModelType type = ModelType::llama;
  int64_t vocab_size = 0;         // V
  int64_t hidden_size = 0;        // C
  int64_t intermediate_size = 0;  // I
  int64_t num_layers = 0;         // L
  int64_t num_heads = 0;          // Hq
  int64_t num_kv_heads = 0;       // Hkv, divides Hq
  int64_t head_dim = 0;           // D
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool qkv_bias = false;  // q_proj, k_proj, v_proj
  bool o_bias = false;    // o_proj
  bool mlp_bias = false;  // gate_proj, up_proj, down_proj
  bool qk_norm = false;   // q_norm, k_norm: RMSNorm over D per head, before RoPE
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 0;
  DType torch_dtype = DType::f32;  // the dtype of the weights on disk
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> eos_token_id;  // the first of eos_token_ids
  std::vector<int64_t> eos_token_ids;   // HF allows a list (Llama 3.1: end_of_text, eom, eot)

  int64_t q_dim() const { return num_heads * head_dim; }      // Hq*D
  int64_t kv_dim() const { return num_kv_heads * head_dim; }  // Hkv*D
  // Exact parameter count: embeddings, every layer's weights, norms and biases, the final norm, and
  // lm_head when it is not tied to the embeddings.
  int64_t num_parameters() const;

  bool operator==(const ModelConfig&) const = default;
};

std::string_view model_type_name(ModelType t);  // "qwen2", "qwen3", "llama"

// Builds a ModelConfig from a parsed config.json; `source` (the path) names it in errors. Throws lt::Error.
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& source);

// Reads a config.json, given its path or the directory holding it.
ModelConfig load_model_config(const std::string& path_or_dir);

// A config.json transformers loads as the same model (architectures, model_type, every key it needs).
// parse_model_config(model_config_to_json(c), ...) == c. Refuses a config whose flags its model type
// cannot express (e.g. qwen2 without q,k,v biases).
nlohmann::json model_config_to_json(const ModelConfig& c);

}  // namespace lt
