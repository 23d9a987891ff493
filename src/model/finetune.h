// model/finetune.h — which of a model's tensors a run trains.
//
// Full fine-tuning trains every tensor. Freeze fine-tuning (LLaMA-Factory's `finetuning_type: freeze`) trains some
// layers' modules and, optionally, the embedding, the final norm or lm_head; the rest is frozen. A frozen tensor
// lives only in the weights the device streams (the compute copy, in the compute dtype: bf16 as a bf16 checkpoint
// stores it): it has no f32 master, no gradient, no optimizer state and no gradient traffic, and the backward skips
// its weight-gradient GEMMs while still computing the activation gradients through it. The trained tensors keep
// full fine-tuning's state, laid out by SlabLayout::trained (model/layout.h) — the masters, the gradients, the
// optimizer states, the device's gradient buffers and the planner's sizes all read that one layout.
//
// LoRA (`finetuning_type: lora`) freezes the whole base and adds to each target linear y = W x + b a low-rank update
// s · B (A dropout(x)), A [r, in] and B [out, r] trained (model/lora.h): the adapters are two more entries of the
// layer slab beside their linear ("self_attn.q_proj.lora_A.weight", PEFT's names), streamed with it, trained as any
// trained tensor; `additional_target` modules (PEFT's modules_to_save) train whole beside them.
//
// ModelConfig::finetune (model/config.h) carries a Finetune; null is full fine-tuning.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/config.h"

namespace lt {

enum class SlabKind : uint8_t;

enum class FinetuneKind : uint8_t { full, freeze, lora };

struct Finetune {
  FinetuneKind kind = FinetuneKind::full;
  // freeze
  std::vector<char> layers;          // [L]: the layer trains its `modules`
  std::vector<std::string> modules;  // the trained layers' modules that train ("self_attn", "mlp", ...); empty: all
  // freeze (freeze_extra_modules) and LoRA (additional_target): modules outside the layers that train whole
  bool embed_tokens = false;         // the embedding table trains (tied: it is lm_head too)
  bool norm = false;                 // the final norm
  bool lm_head = false;              // an untied lm_head
  // LoRA
  int64_t rank = 0;                  // r
  double alpha = 0;                  // lora_alpha
  double dropout = 0;                // lora_dropout: on the adapter's input, deterministic (model/lora.h)
  bool rslora = false;               // scale α / √r instead of α / r
  std::vector<std::string> targets;  // the adapted linears' names ("q_proj", "in_proj_qkv", ...), the model's order
  float scale() const;               // s
  // Whether the linear `entry_prefix` of a layer slab ("self_attn.q_proj") has an adapter.
  bool adapts(const std::string& entry_prefix) const;

  // Whether entry `entry` (a slab entry's name, model/layout.h) of slab `kind` (layer `layer`) trains.
  bool trains(SlabKind kind, int64_t layer, const std::string& entry) const;
  // Whether layer `layer` may train anything (freeze: its index is chosen; LoRA: every layer may have adapters).
  bool trains_layer(int64_t layer) const { return kind != FinetuneKind::freeze || layers.at(size_t(layer)) != 0; }
  // One line for the log: "freeze: layers 22-23 (all modules), embed_tokens trained; 10.5% of the parameters".
  std::string summary(const ModelConfig& cfg) const;
};

// LLaMA-Factory's freeze rules. `trainable_layers` N > 0: the last N layers train; N < 0: the first -N. `modules`:
// within them, "all" or module names among the model's layer modules (input_layernorm, self_attn, linear_attn,
// post_attention_layernorm, mlp — those its layers have); `extra`: embed_tokens, norm, lm_head (untied only). A name
// the model does not have is an error naming `what` (the config key) and the choices.
//
// Where LLaMA-Factory matches parameter names by substring, this selects by module: ".3." there also matches
// expert 3 of every MoE layer, and the extra module "norm" every layer's norms; here layer 3 means layer 3 and
// "norm" the final norm.
Finetune make_freeze(const ModelConfig& cfg, int64_t trainable_layers, const std::vector<std::string>& modules,
                     const std::vector<std::string>& extra, const std::string& what = "freeze");

// LLaMA-Factory's LoRA keys: `targets` "all" (every Linear module of the layers, as LLaMA-Factory finds them: the
// attention or Gated DeltaNet projections, the dense MLP's; a sparse layer's router `gate`, each routed expert's
// gate_proj / up_proj / down_proj, the shared expert's and its `shared_expert_gate`) or linear names (q_proj, ...,
// in_proj_qkv, ..., gate), `additional` embed_tokens, norm or lm_head. A name adapts every linear whose last
// component it is, as PEFT's target_modules does: gate_proj is each expert's, the shared expert's and a dense
// layer's. GPT-OSS's experts (fused 3-D tensors) and router (not a Linear) take no adapter, as in PEFT. Errors name
// the key (lora_rank, lora_target, ...) and the choices.
Finetune make_lora(const ModelConfig& cfg, int64_t rank, double alpha, double dropout, bool rslora,
                   const std::vector<std::string>& targets, const std::vector<std::string>& additional);

// The lowest layer whose backward a step runs: 0 when the embedding trains (full fine-tuning, or a trained table:
// its gradient is boundary 0's), else the lowest layer with a trained tensor (num_layers when none) — below it no
// tensor wants a gradient, so the backward stops there, as PyTorch's autograd does (exec/step_schedule.cpp).
int64_t lowest_backward_layer(const ModelConfig& cfg);

// The module a layer slab entry belongs to: its first name component ("self_attn" of "self_attn.q_proj.weight").
std::string layer_module(const std::string& entry);
// Whether a slab entry is a LoRA adapter's ("self_attn.q_proj.lora_A.weight").
bool is_adapter_entry(const std::string& entry);
// The linears of a layer an adapter may target, as (entry prefix, name): ("self_attn.q_proj", "q_proj"), ... — the
// layer's attention or mixer projections, a dense MLP's, a sparse MLP's router ("mlp.gate", "gate"), experts
// ("mlp.experts.3.up_proj", "up_proj") and shared expert (none for GPT-OSS).
std::vector<std::pair<std::string, std::string>> adaptable_linears(const ModelConfig& cfg, int64_t layer);

}  // namespace lt
