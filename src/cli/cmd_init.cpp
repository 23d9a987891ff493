// cli/cmd_init.cpp — `lazytrain init`: a randomly initialised HF model directory from a config.json (with the
// tokenizer files beside it), for training from scratch, as a base to adapt, and for demos. Seeded, so the same command gives the same bytes.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "io/paths.h"
#include "model/weights.h"
#include "text/tokenizer.h"

namespace lt::cli {
namespace {

struct InitOptions {
  std::string config_path, out_dir, dtype = "f32";
  uint64_t seed = 0;
  float std = 0.02f;
};

void run_init(const InitOptions& o) {
  ModelConfig cfg = load_model_config(o.config_path);
  ModelSlabs params(cfg);
  init_random(params, o.seed, o.std);
  save_hf_model(params, o.out_dir, dtype_parse(o.dtype), size_t(5) << 30);
  // The tokenizer beside the config, when there is one: the directory is then a model to train or adapt as it is.
  const std::filesystem::path from = is_directory_path(o.config_path)
                                         ? std::filesystem::path(o.config_path)
                                         : std::filesystem::path(o.config_path).parent_path();
  if (!std::filesystem::equivalent(from, o.out_dir)) copy_tokenizer_files(from.string(), o.out_dir);
  nlohmann::json line = {{"out", o.out_dir}, {"parameters", cfg.num_parameters()}, {"dtype", o.dtype}};
  std::printf("%s\n", line.dump().c_str());
}

}  // namespace

void register_init(CLI::App& app) {
  auto o = std::make_shared<InitOptions>();
  auto* cmd = app.add_subcommand("init", "write a randomly initialised model directory from a config.json");
  cmd->add_option("--config", o->config_path, "config.json (or a directory holding one)")->required();
  cmd->add_option("--out", o->out_dir, "output model directory")->required();
  cmd->add_option("--seed", o->seed, "random seed");
  cmd->add_option("--std", o->std, "standard deviation of the matrices' normal init");
  cmd->add_option("--dtype", o->dtype, "dtype on disk")->check(CLI::IsMember({"f32", "bf16", "f16"}));
  cmd->callback([o]() { run_init(*o); });
}

}  // namespace lt::cli
