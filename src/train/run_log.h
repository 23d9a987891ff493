// train/run_log.h — what a training run tells people: a progress bar on a terminal (step, loss, lr,
// tokens/s, ETA) or one plain line per logging step otherwise, output_dir/metrics.jsonl (one JSON object
// per logging step), and TensorBoard scalars (every number in that object).
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "train/tensorboard.h"

namespace lt {

class RunLog {
 public:
  // total_steps for the ETA; `resume` appends to an existing metrics.jsonl instead of starting it anew. `silent`:
  // shows and writes nothing (a data-parallel rank other than 0).
  RunLog(const std::string& output_dir, int64_t total_steps, bool resume, bool silent = false);
  ~RunLog();

  // A logging step: `m` must hold "step", "loss", "lr", "tokens_per_s"; every number goes to TensorBoard
  // under train/<key>, the object to metrics.jsonl, a summary to the terminal.
  void log_step(const nlohmann::json& m);
  // Evaluation results (eval/<key> in TensorBoard, an "eval" line in metrics.jsonl).
  void log_eval(int64_t step, const nlohmann::json& m);
  // A line of text that must not tangle with the progress bar.
  void message(const std::string& text);
  // Redraws the bar between logging steps (step counter and ETA).
  void tick(int64_t step, double elapsed_s);
  void finish();

 private:
  void draw(int64_t step, double elapsed_s, const std::string& tail);
  std::string dir_;
  int64_t total_;
  bool tty_;
  bool silent_;
  bool bar_drawn_ = false;
  std::string last_tail_;
  FILE* metrics_ = nullptr;
  std::unique_ptr<TensorBoardWriter> tb_;
};

}  // namespace lt
