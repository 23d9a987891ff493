// model/peft.h — LoRA adapters in PEFT's files, the format peft's PeftModel.from_pretrained reads:
//
//   DIR/adapter_config.json        peft_type LORA, task_type CAUSAL_LM, r, lora_alpha, lora_dropout, target_modules,
//                                  use_rslora, modules_to_save, base_model_name_or_path, bias "none", ...
//   DIR/adapter_model.safetensors  base_model.model.<HF name> of each adapter matrix (lora_A.weight [r, in],
//                                  lora_B.weight [out, r]) and of each whole trained module (modules_to_save:
//                                  base_model.model.model.embed_tokens.weight, ...), f32
//
// A run's adapters are the trained tensors of a LoRA Finetune (model/finetune.h): its masters (SlabSet::trained).
#pragma once

#include <string>
#include <vector>

#include "model/config.h"
#include "model/finetune.h"
#include "model/weights.h"

namespace lt {

struct PeftAdapterConfig {
  int64_t r = 0;
  double lora_alpha = 0;
  double lora_dropout = 0;
  bool use_rslora = false;
  std::vector<std::string> target_modules;   // linear names: q_proj, ..., in_proj_qkv, ...
  std::vector<std::string> modules_to_save;  // whole modules: embed_tokens, lm_head, model.norm
  std::string base_model_name_or_path;
};

// Reads DIR/adapter_config.json; errors name the file and the field (a peft_type other than LORA, a bias other than
// "none", DoRA, rank or alpha patterns: what LazyTrain does not compute).
PeftAdapterConfig read_peft_config(const std::string& dir);
// The Finetune an adapter's config describes on `cfg`'s model (its targets checked against the model's linears).
Finetune finetune_of_adapter(const ModelConfig& cfg, const PeftAdapterConfig& a, const std::string& dir);

// Writes DIR (created) with the adapters and whole trained modules of `trained` (the masters of a LoRA run): the
// config, then the tensors, each file atomically.
void save_peft_adapter(const ModelSlabs& trained, const std::string& dir, const std::string& base_model);
// Reads DIR's tensors into `trained` (its config's LoRA Finetune: the same adapters and modules), every one of them
// required and nothing else accepted; errors name the file and the tensor.
void load_peft_adapter(const std::string& dir, ModelSlabs& trained);

// A new adapter as PEFT initialises one: A ~ U(-1/√in, 1/√in) (kaiming_uniform_ with a = √5), B = 0, drawn from
// Rng(seed) in named_tensors() order; the whole trained modules are left as they are (the caller copies the base's).
void init_adapters(ModelSlabs& trained, uint64_t seed);

// W += s · B · A for every adapter of `trained` into `base` (f32 slabs of every tensor of the model without
// adapters), and the whole trained modules copied over: the merged model (lazytrain export --adapter).
void merge_adapters(ModelSlabs& base, const ModelSlabs& trained);

// Reads the adapter in DIR (its config and tensors) for `base`'s model and merges it into `base` (merge_adapters).
void merge_adapter_dir(ModelSlabs& base, const std::string& dir);

// The model in `base_dir` with the adapter in `adapter_dir` on it, unmerged: its config carries the adapter's LoRA,
// and the f32 slabs of every tensor hold the base's and the adapter's (the forward adds s · B A x: generate, eval).
LoadedModel load_hf_model_with_adapter(const std::string& base_dir, const std::string& adapter_dir);
// Whether `dir` is a PEFT adapter directory (has adapter_config.json).
bool is_adapter_dir(const std::string& dir);

// The PEFT name of a tensor's HF name: "base_model.model." + name.
std::string peft_name(const std::string& hf_name);

}  // namespace lt
