// cli/cmd_grad.cpp — `lazytrain grad`: loss and every parameter gradient of an HF model for one batch,
// on the in-memory reference path. Gradients go to an f32 safetensors file under the HF tensor names.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/timer.h"
#include "model/model.h"

namespace lt::cli {
namespace {

struct GradOptions {
  std::string model_dir, batch_path, out_path, dtype = "f32";
  int threads = 0;
};

void run_grad(const GradOptions& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  ComputeType compute = o.dtype == "bf16" ? ComputeType::bf16 : ComputeType::f32;
  LoadedModel m = load_hf_model(o.model_dir);
  Batch batch = Batch::load(o.batch_path, m.config.vocab_size);
  ModelSlabs grads(m.config, DType::f32);
  Timer timer;
  LossResult r = model_forward_backward(grads, m.params, batch, compute);
  double seconds = timer.seconds();
  save_safetensors(grads, o.out_path, DType::f32);
  nlohmann::json line = {{"loss", r.loss()}, {"tokens", r.tokens}, {"seconds", seconds}};
  std::printf("%s\n", line.dump().c_str());
}

}  // namespace

void register_grad(CLI::App& app) {
  auto o = std::make_shared<GradOptions>();
  auto* cmd = app.add_subcommand("grad", "compute the loss and all parameter gradients of a model for one batch");
  cmd->add_option("--model", o->model_dir, "Hugging Face model directory (config.json + safetensors)")->required();
  cmd->add_option("--batch", o->batch_path, "batch JSON: {\"input_ids\": [[...]], \"labels\": [[...]]}")->required();
  cmd->add_option("--out", o->out_path, "where to write the f32 gradients (.safetensors)")->required();
  cmd->add_option("--dtype", o->dtype, "compute dtype of the GEMMs")->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--threads", o->threads, "CPU threads (default: all cores)")->check(CLI::PositiveNumber);
  cmd->callback([o]() { run_grad(*o); });
}

}  // namespace lt::cli
