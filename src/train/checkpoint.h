// train/checkpoint.h — checkpoints that Hugging Face tools load and that resume bit for bit.
//
// output_dir/checkpoint-STEP/
//   LoRA runs: adapter_config.json, adapter_model.safetensors (PEFT's files, model/peft.h) in place of the model's
//   config.json, model.safetensors (or model-0000k-of-0000N.safetensors + index) in the save dtype (the
//     trained tensors; those the source checkpoint kept F32 stay F32) plus the tensors we do not train, carried
//     from the source checkpoint byte for byte (qwen3_5's vision tower and MTP head: model/weights.h SavedExtras),
//   the tokenizer files copied from the model directory (tokenizer.json, tokenizer_config.json, ...)
//   resume/params.safetensors     f32 master weights (the model files may be bf16: resume needs f32); of the trained
//                                 tensors alone under freeze fine-tuning (the frozen ones are the base model's)
//   resume/optimizer.safetensors  optimizer states (8-bit codes and absmax, or f32), step and skip counts
//   resume/state.json             step, data cursor, RNG state, loss history, the result-affecting config
// output_dir/latest               the name of the newest complete checkpoint
//
// Crash safety: a checkpoint is written into output_dir/.checkpoint-STEP.partial, every file fsynced,
// then renamed into place and the directory fsynced; `latest` is replaced atomically last. A run killed
// at any moment leaves either the previous checkpoint or the new one, never a torn one; leftovers
// (*.partial) are removed by the next save. Older checkpoints beyond save_total_limit are then removed.
#pragma once

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "model/weights.h"
#include "train/data_loader.h"

namespace lt {

class HybridAdamW;

struct CheckpointWriter {
  std::string output_dir;
  int64_t keep = 3;                   // checkpoints kept; <= 0 keeps all
  std::string save_dtype = "bf16";    // model files
  size_t max_shard_bytes = size_t(5) << 30;
  std::string tokenizer_dir;          // copy tokenizer files from here ("" = none)
  std::string base_model;             // LoRA: the adapter config's base_model_name_or_path
};

// Writes checkpoint-STEP atomically and returns its path. `state` is resume/state.json's content; `extras` what
// the source checkpoint held beyond the trained tensors (LoadedModel::extras; none for a model trained from scratch).
// `frozen`: with masters of the trained tensors alone, the streamed weights that hold the rest (save_hf_model).
std::string save_checkpoint(const CheckpointWriter& w, int64_t step, const ModelSlabs& params,
                            const HybridAdamW& optimizer, const nlohmann::json& state,
                            const SavedExtras& extras = {}, const ModelSlabs* frozen = nullptr);

// The checkpoint `latest` names in output_dir, or "" when there is none.
std::string latest_checkpoint(const std::string& output_dir);

// resume/state.json, checked (`source` names it in errors): the step, the data cursor, and the result-affecting
// config the run was saved with.
struct ResumeState {
  int64_t step = 0;
  Cursor cursor;
  nlohmann::json config;  // an object
};
ResumeState parse_resume_state(const nlohmann::json& state, const std::string& source);

// Restores params (f32 masters) and the optimizer from a checkpoint directory; returns its state.json.
// Errors name the checkpoint and what is missing or inconsistent. `only`: the masters' elements to read
// (load_hf_model's), the rest left unwritten.
nlohmann::json load_checkpoint(const std::string& dir, ModelSlabs& params, HybridAdamW& optimizer,
                               const TensorRanges* only = nullptr);

}  // namespace lt
