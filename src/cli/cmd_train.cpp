// cli/cmd_train.cpp — `lazytrain train CONFIG.yaml [key=value ...]`.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "cli/commands.h"
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
    std::printf("%s\n", r.summary.dump().c_str());
  });
}

}  // namespace lt::cli
