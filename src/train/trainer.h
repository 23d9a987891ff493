// train/trainer.h — `lazytrain train`: the loop on the solved plan.
//
//   load config -> model (fine-tune an HF directory, or random init from a config.json) -> tokenizer and
//   chat template -> datasets (tokenised, cached) -> loader -> plan (auto: profile + solve) -> device,
//   executor, Hybrid AdamW -> [resume] -> steps: gradient-accumulation micro-batches through the executor,
//   the optimizer update pipelined into the next step's forward -> logs, checkpoints -> summary.json
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "text/text.h"
#include "train/config.h"
#include "train/data_loader.h"

namespace lt {

struct TrainResult {
  int64_t steps = 0;
  int64_t tokens = 0;
  double seconds = 0;
  double final_loss = 0;
  std::string output_dir;
  // Stopped early by SIGTERM / SIGINT (train/stop_signal.h): its name, and the checkpoint saved then (empty when
  // save_on_signal is false). steps is then the steps done.
  std::string stopped_by;
  std::string stop_checkpoint;
  nlohmann::json summary;  // what summary.json holds
};

TrainResult run_training(const TrainConfig& cfg);

// The run's data exactly as `train` prepares it, for `lazytrain data`, which prepares it and stops: the chat
// template (the config's, or the model type's), the datasets tokenised into output_dir/data_cache, the loader.
ChatTemplateKind train_template_kind(const TrainConfig& c, ModelType type);
DataLoader load_train_data(const TrainConfig& c, const Tokenizer& tok, const ChatTemplate& tpl);

}  // namespace lt
