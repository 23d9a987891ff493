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
// ModelConfig::finetune (model/config.h) carries a Finetune; null is full fine-tuning.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace lt {

enum class SlabKind : uint8_t;

enum class FinetuneKind : uint8_t { full, freeze };

struct Finetune {
  FinetuneKind kind = FinetuneKind::full;
  std::vector<char> layers;          // [L]: the layer trains its `modules`
  std::vector<std::string> modules;  // the trained layers' modules that train ("self_attn", "mlp", ...); empty: all
  bool embed_tokens = false;         // the embedding table trains (tied: it is lm_head too)
  bool norm = false;                 // the final norm
  bool lm_head = false;              // an untied lm_head

  // Whether entry `entry` (a slab entry's name, model/layout.h) of slab `kind` (layer `layer`) trains.
  bool trains(SlabKind kind, int64_t layer, const std::string& entry) const;
  // Whether layer `layer` trains anything.
  bool trains_layer(int64_t layer) const { return kind == FinetuneKind::full || layers.at(size_t(layer)) != 0; }
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

// The module a layer slab entry belongs to: its first name component ("self_attn" of "self_attn.q_proj.weight").
std::string layer_module(const std::string& entry);

}  // namespace lt
