// model/config.h — the model a HF config.json describes, with transformers' semantics and defaults.
//
// Supported: Qwen2 (Qwen2.5), Qwen3 and Llama decoders with plain RoPE, RMSNorm, SwiGLU MLP and GQA; the
// Qwen3.5 / Qwen3.6 hybrid text model (model_type qwen3_5 or qwen3_5_text), whose layers are either Gated
// DeltaNet (linear attention) or gated full attention; and Qwen3-MoE (qwen3_moe: Qwen3 attention, sparse layers
// of routed SwiGLU experts). Anything we do not implement (other model types, the other MoE families, scaled
// RoPE, sliding-window attention, activations other than SiLU) is refused with the file, the key and the value,
// never silently approximated.
//
// Where each flag comes from (transformers' modeling code):
//   qwen2: q,k,v biases always; o bias never; no q/k norm; head_dim = hidden / heads.
//   qwen3: attention_bias (default false) on q,k,v AND o; q/k RMSNorm over head_dim always;
//          head_dim key (default hidden / heads).
//   llama: attention_bias (default false) on q,k,v,o; mlp_bias (default false) on gate,up,down;
//          head_dim key (default hidden / heads).
//   qwen3_moe: qwen3's attention; layer l's MLP is sparse iff l ∉ mlp_only_layers and (l + 1) % decoder_sparse_step
//          == 0 (num_experts > 0): a router mlp.gate.weight [E, C] and E SwiGLU experts of moe_intermediate_size
//          (mlp.experts.{e}.{gate,up,down}_proj.weight [Ie, C], [Ie, C], [C, Ie]; or fused in transformers 5.x
//          checkpoints: mlp.experts.gate_up_proj [E, 2·Ie, C], mlp.experts.down_proj [E, C, Ie], model/weights.h);
//          dense layers keep intermediate_size. norm_topk_prob (default false) renormalises the top-k weights.
//   qwen3_5 with experts (model_type qwen3_5_moe_text, or qwen3_5_moe for the vision-language form): every layer's
//          MLP is sparse — qwen3_moe's router and experts (top-k always renormalised) plus a shared SwiGLU expert
//          mlp.shared_expert.{gate,up,down}_proj.weight [Is, C], [Is, C], [C, Is] whose output is scaled by
//          σ(x · mlp.shared_expert_gate.weightᵀ) ([1, C]); no intermediate_size.
//   qwen3_5: attention_bias (default false) on q,k,v,o of the full-attention layers; q/k norm always; q_proj
//          doubled for the output gate; zero-centred RMSNorms; RoPE on the first int(D · partial_rotary_factor)
//          dims (factor default 0.25); head_dim default 256, num_key_value_heads default 4 (Qwen3_5TextConfig).
//
// Qwen3.5 checkpoints come in two forms. The released one is vision-language (model_type qwen3_5,
// Qwen3_5ForConditionalGeneration): the text model's config sits under "text_config" (model_type
// qwen3_5_text), its weights under "model.language_model.", beside model.visual.* and mtp.* tensors we do not
// train. The text-only form (model_type qwen3_5_text, Qwen3_5ForCausalLM) has the text keys at the top and
// the weights under "model.". Qwen3.6 checkpoints use the same model types.
//
// Qwen3.5 text-model tensors (transformers models/qwen3_5/modeling_qwen3_5.py; prefix "model." for the text
// form, "model.language_model." for the vision-language form; Linear weights are [out, in]).
// Letters: C hidden, I intermediate, V vocab, Hq/Hkv query/KV heads of D dims, Hk/Hv linear key/value heads of
// dk/dv dims, K conv kernel.
//   embed_tokens.weight                                   [V, C]
//   layers.N.input_layernorm.weight                       [C]   zero-centred: x·rstd·(1 + w)
//   layers.N.post_attention_layernorm.weight              [C]   zero-centred
//   layers.N.mlp.{gate,up}_proj.weight                    [I, C]
//   layers.N.mlp.down_proj.weight                         [C, I]
//   full-attention layer N (Qwen3_5Attention):
//   layers.N.self_attn.q_proj.weight                      [2·Hq·D, C]  per head [query D | gate D]
//   layers.N.self_attn.{k,v}_proj.weight                  [Hkv·D, C]
//   layers.N.self_attn.o_proj.weight                      [C, Hq·D]
//   layers.N.self_attn.{q,k,v,o}_proj.bias                [2·Hq·D], [Hkv·D], [Hkv·D], [C]  only with attention_bias
//   layers.N.self_attn.{q,k}_norm.weight                  [D]   zero-centred, per head before RoPE
//   linear-attention layer N (Qwen3_5GatedDeltaNet, no biases):
//   layers.N.linear_attn.in_proj_qkv.weight               [2·Hk·dk + Hv·dv, C]  rows [Q | K | V]
//   layers.N.linear_attn.in_proj_z.weight                 [Hv·dv, C]
//   layers.N.linear_attn.in_proj_b.weight                 [Hv, C]
//   layers.N.linear_attn.in_proj_a.weight                 [Hv, C]
//   layers.N.linear_attn.conv1d.weight                    [2·Hk·dk + Hv·dv, 1, K]  depthwise, causal
//   layers.N.linear_attn.dt_bias                          [Hv]
//   layers.N.linear_attn.A_log                            [Hv]  (f32 in released checkpoints)
//   layers.N.linear_attn.norm.weight                      [dv]  plain (not zero-centred) gated RMSNorm
//   layers.N.linear_attn.out_proj.weight                  [C, Hv·dv]
//   norm.weight                                           [C]   zero-centred
//   lm_head.weight (no prefix)                            [V, C]  absent when tie_word_embeddings
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "ops/rope.h"

namespace lt {

enum class ModelType { qwen2, qwen3, llama, qwen3_5, qwen3_moe, gpt_oss };

// The token mixer of one decoder layer: softmax attention, or Gated DeltaNet (qwen3_5's linear attention), or softmax
// attention over the last sliding_window keys (gpt_oss's sliding layers; the same weights as full attention).
enum class LayerKind : uint8_t { full_attention, linear_attention, sliding_attention };
enum class SlabKind : uint8_t;  // model/layout.h
struct Finetune;                // model/finetune.h
inline constexpr size_t kLayerKinds = 3;

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
  // rope_scaling (rope_parameters) of rope_type "yarn" (GPT-OSS; ops/rope.h): factor 1 is plain RoPE from rope_theta.
  double yarn_factor = 1.0, yarn_beta_fast = 32.0, yarn_beta_slow = 1.0;
  double yarn_attention_factor = 0;  // 0: transformers' default, 0.1·ln(factor) + 1
  int64_t yarn_original_max_positions = 0;
  bool yarn_truncate = true;
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

  // Per layer [L]. parse_model_config fills it for every model (all full_attention for qwen2, qwen3, llama).
  // A config built in code may leave it empty, meaning every layer is full attention: read it through
  // layer_kind(i), which handles both.
  std::vector<LayerKind> layer_types;
  bool attn_output_gate = false;     // q_proj gives per head [query D | gate D]; output · sigmoid(gate) before o_proj
  bool zero_centred_norms = false;   // decoder, final, q and k norms are x·rstd·(1 + w)
  double partial_rotary_factor = 1;  // RoPE on the first rotary_dim() = int(D · factor) dims of each head
  // Multimodal RoPE (qwen3_5), kept for writing the config back: with text-only positions the three position
  // rows are equal, so mRoPE is plain RoPE over rotary_dim() and these change nothing we compute.
  std::vector<int64_t> mrope_section;
  bool mrope_interleaved = false;
  // Gated DeltaNet sizes (qwen3_5; 0 for the other types).
  int64_t linear_num_key_heads = 0;    // Hk
  int64_t linear_num_value_heads = 0;  // Hv, a multiple of Hk: value head j reads key head j / (Hv/Hk)
  int64_t linear_key_head_dim = 0;     // dk
  int64_t linear_value_head_dim = 0;   // dv
  int64_t linear_conv_kernel_dim = 0;  // K, the causal depthwise conv1d's width
  // The vision-language checkpoint form (qwen3_5): weights under "model.language_model.", plus model.visual.*
  // and mtp.* tensors we do not train. outer_json is that config.json's outer object minus text_config and the
  // keys this struct holds (model_type, architectures, tie_word_embeddings, dtype, torch_dtype, bos/eos ids),
  // as nlohmann's dump() writes it ("" when nothing is left, and for the other forms), so saving writes back
  // vision_config and the rest unchanged.
  bool vision_language = false;
  std::string outer_json;
  // Mixture-of-Experts (qwen3_moe, and qwen3_5 with experts: model_type qwen3_5_moe / qwen3_5_moe_text, every layer
  // sparse, top-k renormalised, a shared expert; 0 / empty in dense models). Letters: E experts, k per token, Ie an expert's
  // intermediate size.
  int64_t num_experts = 0;            // E
  int64_t num_experts_per_tok = 0;    // k
  int64_t moe_intermediate_size = 0;  // Ie
  int64_t shared_expert_intermediate_size = 0;  // Is: qwen3_5_moe's shared expert, gated by σ(x · shared_expert_gate)
  bool norm_topk_prob = false;        // the k routing weights divided by their sum
  int64_t decoder_sparse_step = 1;    // layer l sparse iff (l + 1) % step == 0 and l ∉ mlp_only_layers
  std::vector<int64_t> mlp_only_layers;
  double router_aux_loss_coef = 0.001;  // written back; training takes its coefficient from the settings
  // GPT-OSS (gpt_oss): every layer sparse, routed by top-k of the router's logits (with a bias) then a softmax over
  // those k; experts with biases and the clamped SwiGLU; attention with q/k/v/o biases, per-head sinks, and sliding
  // layers. Letters as above; W the sliding window.
  int64_t sliding_window = 0;    // W: the keys a sliding_attention layer's query sees, its own included
  bool attention_sinks = false;  // self_attn.sinks [Hq]: a logit per head in every softmax row, dropped after
  double swiglu_limit = 0;       // the experts' clamp (7); 0: plain SwiGLU
  // The checkpoint's experts are MXFP4 (quantization_config quant_method "mxfp4"): dequantised on load; a save
  // writes bf16 and no quantization_config.
  bool mxfp4_experts = false;
  // Not from config.json: which tensors the run trains (model/finetune.h); null: every one (full fine-tuning). Every
  // layout of the trained state reads it (SlabLayout::trained). Not compared by operator==.
  std::shared_ptr<const Finetune> finetune;
  bool trains(SlabKind kind, int64_t layer, const std::string& entry) const;  // model/finetune.cpp
  bool trains_all() const;                                                    // full fine-tuning

  int64_t q_dim() const { return num_heads * head_dim; }      // Hq*D: attention output, o_proj input
  int64_t kv_dim() const { return num_kv_heads * head_dim; }  // Hkv*D
  int64_t q_proj_dim() const { return attn_output_gate ? 2 * q_dim() : q_dim(); }  // q_proj rows
  int64_t rotary_dim() const { return int64_t(double(head_dim) * partial_rotary_factor); }  // as transformers: int()
  int64_t linear_key_dim() const { return linear_num_key_heads * linear_key_head_dim; }        // Hk*dk
  int64_t linear_value_dim() const { return linear_num_value_heads * linear_value_head_dim; }  // Hv*dv
  int64_t linear_conv_dim() const { return 2 * linear_key_dim() + linear_value_dim(); }  // conv1d channels [Q|K|V]

  LayerKind layer_kind(int64_t layer) const;  // error when out of range
  std::vector<LayerKind> layer_kinds() const;  // [L], layer_types or all full_attention
  int64_t num_full_attention_layers() const;
  int64_t num_linear_attention_layers() const;
  bool is_hybrid() const { return num_linear_attention_layers() > 0; }
  bool is_moe() const { return num_experts > 0; }
  bool gpt_oss() const { return type == ModelType::gpt_oss; }  // router and experts with biases, clamped SwiGLU
  // The rotary embedding's frequencies: rope_theta, with YaRN when yarn_factor > 1.
  RopeSpec rope() const {
    if (yarn_factor == 1.0) return RopeSpec(rope_theta);
    return RopeSpec::yarn(rope_theta, yarn_factor, yarn_beta_fast, yarn_beta_slow, yarn_original_max_positions,
                          yarn_truncate, yarn_attention_factor);
  }
  bool sparse_layer(int64_t layer) const;  // its MLP is the routed experts (error when out of range)
  int64_t num_sparse_layers() const;

  // Exact parameter count of the trained text model: embeddings, every layer's weights (per its kind), norms and
  // biases, the final norm, and lm_head when it is not tied to the embeddings. Vision and MTP tensors excluded.
  int64_t num_parameters() const;
  // The parameters one token computes through: num_parameters() with a sparse layer's experts counted k, not E, times
  // (the MoE convention for 6·N·D FLOPs: Qwen3-30B-A3B has 3.3B active of 30.5B).
  int64_t num_active_parameters() const;

  // Field by field, except that an empty layer_types equals the all-full_attention list it stands for.
  bool operator==(const ModelConfig& other) const;
};

std::string_view model_type_name(ModelType t);  // "qwen2", "qwen3", "llama", "qwen3_5", "qwen3_moe", "gpt_oss"
std::string_view layer_kind_name(LayerKind k);  // "full_attention", "linear_attention", "sliding_attention"

// Builds a ModelConfig from a parsed config.json; `source` (the path) names it in errors. Throws lt::Error.
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& source);

// Reads a config.json, given its path or the directory holding it.
ModelConfig load_model_config(const std::string& path_or_dir);

// A config.json transformers loads as the same model (architectures, model_type, every key it needs; for the
// vision-language form the outer object with text_config inside). parse_model_config(model_config_to_json(c),
// ...) == c. Refuses a config whose flags its model type cannot express (e.g. qwen2 without q,k,v biases).
nlohmann::json model_config_to_json(const ModelConfig& c);


}  // namespace lt
