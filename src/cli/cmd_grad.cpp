// cli/cmd_grad.cpp — `lazytrain grad`: loss and every parameter gradient of an HF model for one batch,
// on the in-memory reference path or (with --policy) streamed through a device by the executor. A GPU has no
// in-memory path: on --device cuda the default is the keep-all plan (exec/backend.h).
// Gradients go to an f32 safetensors file under the HF tensor names.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/device_options.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/timer.h"
#include "exec/backend.h"
#include "io/nvme.h"
#include "model/model.h"
#include "model/peft.h"

namespace lt::cli {
namespace {

struct GradOptions {
  std::string model_dir, batch_path, out_path, dtype = "f32", adapter;
  int threads = 0;
  double moe_aux_loss_coef = 0;
  DeviceOptions dev;
};

void run_grad(const GradOptions& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  const Backend backend = o.dev.backend();
  const KernelScope kernels = backend.kernels();
  ComputeType compute = o.dtype == "bf16" ? ComputeType::bf16 : ComputeType::f32;
  LoadedModel m = load_hf_model(o.model_dir);
  Batch batch = Batch::load(o.batch_path, m.config.vocab_size);
  LT_CHECK(o.moe_aux_loss_coef == 0 || m.config.is_moe(),
           "--moe-aux-loss-coef {}: {} is not a Mixture-of-Experts model (model_type {})", o.moe_aux_loss_coef,
           o.model_dir, model_type_name(m.config.type));
  // --adapter: the base frozen with a PEFT LoRA adapter on it (model/peft.h); the gradients are the adapter's.
  std::optional<ModelSlabs> adapter;
  if (!o.adapter.empty()) {
    ModelConfig cfg = m.config;
    cfg.finetune = std::make_shared<const Finetune>(finetune_of_adapter(cfg, read_peft_config(o.adapter), o.adapter));
    adapter.emplace(cfg, DType::f32, Fill::zero, SlabSet::trained);
    load_peft_adapter(o.adapter, *adapter);
    ModelSlabs all(cfg, DType::f32, Fill::none);
    copy_tensors_by_name(all, m.params);
    copy_tensors_by_name(all, *adapter);
    m.params = std::move(all);
    m.config = cfg;
  }
  ModelSlabs grads(m.config, DType::f32, Fill::zero, SlabSet::trained);
  nlohmann::json line;
  double ce = 0, aux = 0;
  if (o.dev.policy.empty() && backend.has_in_memory_path()) {
    Timer timer;
    LossResult r = model_forward_backward(grads, m.params, batch, o.dev.precision(compute), nullptr,
                                          o.moe_aux_loss_coef);
    line = {{"tokens", r.tokens}, {"seconds", timer.seconds()}};
    ce = r.loss();
    aux = r.moe_aux;
  } else {
    Plan plan = Plan::parse(o.dev.policy.empty() ? backend.reference_policy() : o.dev.policy, m.config.num_layers);
    std::unique_ptr<Device> device = o.dev.make_device();
    const ExecOptions eo = o.dev.exec_options(compute, &plan);
    std::optional<ModelSlabs> copy;
    const ModelSlabs* weights = &m.params;
    if (compute == ComputeType::bf16) {
      copy.emplace(m.config, DType::bf16);
      make_compute_copy(*copy, m.params);
      weights = &*copy;
    }
    std::unique_ptr<NvmeStore> nvme =
        o.dev.open_nvme(plan_working_set(m.config, batch.B, batch.T, plan, eo).nvme_bytes);
    StreamingExecutor ex(m.config, *device, eo, nvme.get());
    PinnedSlabs pins(*device);  // for a GPU's DMA (nothing on the CPU device)
    pins.pin(const_cast<ModelSlabs&>(*weights), "weights");
    pins.pin(grads, "gradients");
    TraceRecorder trace;
    GradTarget target;
    target.moe_aux_weight = o.moe_aux_loss_coef;
    const ModelSlabs& masters = adapter ? *adapter : m.params;
    StepStats st = ex.step(grads, masters, *weights, batch, plan, o.dev.trace_path.empty() ? nullptr : &trace,
                           nullptr, target);
    if (!o.dev.trace_path.empty()) trace.write_chrome_trace(o.dev.trace_path);
    line = st.to_json();
    line["seconds"] = st.step_s;
    line["policy"] = plan.name;
    ce = st.loss();
    aux = st.moe_aux_loss;
  }
  // The loss as transformers returns it: cross-entropy, plus coef · aux with output_router_logits (an MoE model's
  // parts beside it).
  line["loss"] = ce + o.moe_aux_loss_coef * aux;
  if (m.config.is_moe()) {
    line["ce_loss"] = ce;
    line["aux_loss"] = aux;
    line["moe_aux_loss_coef"] = o.moe_aux_loss_coef;
  }
  if (adapter) {  // under the adapter file's names (PEFT's)
    NamedTensors named;
    for (const auto& t : grads.named_tensors()) named[peft_name(t.hf_name)] = t.view;
    write_safetensors(o.out_path, named);
  } else {
    save_safetensors(grads, o.out_path, DType::f32);
  }
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
  cmd->add_option("--adapter", o->adapter,
                  "a PEFT LoRA adapter directory on the model: the loss with it, and its gradients under its names");
  cmd->add_option("--threads", o->threads, "CPU threads (default: all cores)")->check(CLI::PositiveNumber);
  cmd->add_option("--moe-aux-loss-coef", o->moe_aux_loss_coef,
                  "MoE models: add this times the load-balancing loss to the loss and its gradient, as transformers "
                  "does with output_router_logits (default 0: reported, not added)")
      ->check(CLI::NonNegativeNumber);
  o->dev.add_to(*cmd);
  cmd->callback([o]() { run_grad(*o); });
}

}  // namespace lt::cli
