// cli/cmd_export.cpp — `lazytrain export --model BASE --adapter DIR --out MERGED`: a LoRA adapter (PEFT's files,
// model/peft.h) merged into its base, W + s · B A, written as a Hugging Face model directory with the base's tokenizer.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "model/peft.h"
#include "model/weights.h"
#include "text/tokenizer.h"

namespace lt::cli {
namespace {

struct ExportOptions {
  std::string model, adapter, out, dtype = "bf16";
};

void run_export(const ExportOptions& o) {
  LoadedModel m = load_hf_model(o.model);
  merge_adapter_dir(m.params, o.adapter);
  save_hf_model(m.params, o.out, dtype_parse(o.dtype), size_t(5) << 30, m.extras);
  copy_tokenizer_files(o.model, o.out);
  nlohmann::json line = {{"out", o.out}, {"base", o.model}, {"adapter", o.adapter}, {"dtype", o.dtype}};
  std::printf("%s\n", line.dump().c_str());
}

}  // namespace

void register_export(CLI::App& app) {
  auto o = std::make_shared<ExportOptions>();
  auto* cmd = app.add_subcommand("export", "merge a PEFT LoRA adapter into its base model and write the merged model");
  cmd->add_option("--model", o->model, "the base model directory")->required();
  cmd->add_option("--adapter", o->adapter, "the PEFT adapter directory (adapter_config.json, adapter_model.safetensors)")
      ->required();
  cmd->add_option("--out", o->out, "the merged model directory to write")->required();
  cmd->add_option("--dtype", o->dtype, "dtype on disk")->check(CLI::IsMember({"f32", "bf16", "f16"}));
  cmd->callback([o]() { run_export(*o); });
}

}  // namespace lt::cli
