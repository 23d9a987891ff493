// cli/cmd_train.cpp — `lazytrain train CONFIG.yaml [key=value ...]`. SIGTERM / SIGINT stop it after the step in
// progress, with a checkpoint there (save_on_signal), and exit 143 / 130.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "dist/comm.h"
#include "train/trainer.h"

namespace lt::cli {

void register_train(CLI::App& app) {
  auto config = std::make_shared<std::string>();
  auto overrides = std::make_shared<std::vector<std::string>>();
  auto* cmd = app.add_subcommand("train", "train or fine-tune a model from a YAML config (LLaMA-Factory keys)");
  cmd->add_option("config", *config, "the YAML config")->required();
  cmd->add_option("overrides", *overrides, "key=value overrides of the config");
  cmd->callback([config, overrides]() {
    TrainResult r = run_training(load_train_config(*config, *overrides));
    if (Comm::world().rank() == 0) std::printf("%s\n", r.summary.dump().c_str());  // data parallel: rank 0 speaks
    // Stopped by a signal (after saving, unless save_on_signal is false): the exit status a shell or scheduler
    // expects of a process ended by it (128 + the signal), not success.
    if (!r.stopped_by.empty()) throw ExitStatus{r.stopped_by == "SIGINT" ? 130 : 143};
  });
}

}  // namespace lt::cli
