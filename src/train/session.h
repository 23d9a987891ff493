// train/session.h — one training run between its settings and its summary: set up (model, data, the plan and its
// memory check, the device and executor, the optimizer, resume), then steps, checkpoints and evaluations on
// demand, then the summary. run_training (train/trainer.h) drives it: when to save, evaluate or stop is its.
//
// Data parallel: every rank holds a session; rank 0 alone writes (logs, checkpoints, evaluations, summary.json).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/timer.h"
#include "device/device.h"
#include "dist/comm.h"
#include "dist/data_parallel.h"
#include "exec/executor.h"
#include "io/nvme.h"
#include "model/weights.h"
#include "optim/adamw.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/run_log.h"
#include "train/schedule.h"
#include "train/settings.h"
#include "train/trainer.h"

namespace lt {

// The model: an HF directory to fine-tune, or a config.json to train from scratch (seeded init).
struct ModelSource {
  ModelConfig config;
  ModelSlabs params;   // the f32 masters: every tensor, or the trained ones alone under freeze (model/finetune.h)
  // Freeze fine-tuning: every tensor in the compute dtype, the weights the device streams (the frozen ones live only
  // here); made at load, then the session's compute copy.
  std::optional<ModelSlabs> weights;
  SavedExtras extras;  // written into every checkpoint: the untrained tensors, the F32-kept ones
  std::string dir;     // where config.json (and the tokenizer) live
  bool from_scratch = false;
  // Data parallel in bf16 compute: the masters' elements this rank keeps (dist/data_parallel.h), the only ones
  // loaded (from scratch: all are drawn, as one process draws them, and the rest released).
  std::optional<TensorRanges> owned_masters;
  const TensorRanges* only() const { return owned_masters ? &*owned_masters : nullptr; }
  static ModelSource load(const TrainConfig& c, const Comm& comm, ComputeType compute);
};

class TrainingSession {
 public:
  TrainingSession(const TrainSettings& s, const Comm& comm);

  int64_t step() const { return step_; }          // optimizer steps done
  int64_t total_steps() const { return total_steps_; }
  const TrainConfig& config() const { return s_.c; }
  RunLog& log() { return *log_; }

  // One optimizer step: every micro-batch through the executor (rank r runs a·N + r of them), the global gradient
  // norm, the update left pending for the next step's forward; its figures logged every logging_steps.
  void train_step();
  // A checkpoint at `at_step` (the pending update applied first); every rank takes part, rank 0 writes. Its path
  // (rank 0; empty elsewhere).
  std::string save(int64_t at_step);
  // Exact match on eval_dataset (rank 0, on the f32 masters), when there is one.
  void evaluate(int64_t at_step);
  // Whether any rank was asked to stop (a signal reaches the ranks at different moments: they stop together).
  bool any_rank_stopping(bool here) const;
  // summary.json's contents (rank 0 writes it); `steps` done, how it stopped.
  TrainResult result(int64_t steps, const std::string& stopped_by, const std::string& stop_checkpoint, double seconds);

 private:
  // Sum of the per-step measurements between two logging steps.
  struct Window {
    double loss_sum = 0, moe_aux_sum = 0;  // Σ CE over counted tokens; Σ the micro-batches' load-balancing loss
    int64_t counted = 0, tokens = 0, steps = 0, micro_batches = 0;
    double seconds = 0, grad_norm = 0;
    StepSummary time;
    void add(const StepStats& st);
  };

  void load_data();
  void choose_plan();
  void check_memory() const;
  void open_device();
  void make_optimizer();
  void resume();
  Plan solve_plan();
  void flush_update();  // the pending update now (before a save, an evaluation, the end)
  void log_progress(double lr);
  // The loss as transformers reports it: the window's cross-entropy plus the coefficient times its mean
  // load-balancing loss, and the two parts (MoE models).
  nlohmann::json window_loss() const;

  const TrainSettings s_;
  const Comm& comm_;
  ModelSource model_;
  std::optional<Tokenizer> tok_;
  std::optional<ChatTemplate> tpl_;
  std::optional<DataLoader> loader_;
  std::unique_ptr<RunLog> log_;
  int64_t micro_per_step_ = 1, steps_per_epoch_ = 1, total_steps_ = 0, step_ = 0;
  std::optional<LrSchedule> schedule_;
  double net_gbps_ = 0;
  ExecOptions exec_;
  Plan plan_;
  WorkingSet ws_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<NvmeStore> nvme_;
  std::unique_ptr<StreamingExecutor> executor_;
  std::optional<ModelSlabs> grads_, copy_;
  std::unique_ptr<PinnedSlabs> pins_;
  std::unique_ptr<DataParallelGrads> dp_;
  std::unique_ptr<HybridAdamW> opt_;
  StateReport states_;
  std::optional<CheckpointWriter> writer_;
  std::optional<PendingUpdate> pending_;
  uint64_t weights_version_ = 1;  // names the streamed weights' contents (StreamingExecutor::step): bumped on change
  std::vector<DatasetSpec> eval_specs_;
  nlohmann::json last_eval_;
  Window win_;
  double last_loss_ = 0;
  double moe_aux_coef_ = 0;  // the load-balancing loss's coefficient in effect (0: dense, or none asked)
  int64_t tokens_total_ = 0;
  Timer loop_timer_;
};

}  // namespace lt
