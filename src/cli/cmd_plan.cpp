// cli/cmd_plan.cpp — `lazytrain plan`: choose where every activation lives and when each transfer runs.
//
//   lazytrain plan --model DIR|config.json --hardware h800|h200|rtx3090|profile.json --batch B --seq S
//                  [--device-memory SIZE] [--host-act-memory SIZE] [--nvme SIZE] [--time-limit S]
//                  [--out plan.json] [--json] [--search-batch N]
//
// Prints the plan (per boundary: tier or recompute; per layer: internals kept), its predicted step time,
// tokens/s, TFLOPS (6·N·tokens and real), peak memory per tier, exposed transfer per link, the solve time and
// status, and the same predictions for keep-all, every:1, every:4 and host:1. docs/planner.md has the model.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/device_options.h"
#include "core/error.h"
#include "model/block.h"
#include "model/finetune.h"
#include "core/units.h"
#include "plan/hardware.h"
#include "plan/plan_file.h"
#include "plan/planner.h"

namespace lt::cli {
namespace {

struct PlanOptions {
  std::string model, hardware, device_memory, host_act_memory = "0", nvme = "0", out, memory_model = "executor";
  std::string activation_dtype = "auto", compute;
  // Freeze fine-tuning (model/finetune.h), as the training config's keys say it.
  std::string finetuning_type = "full";
  int64_t freeze_trainable_layers = 2;
  std::vector<std::string> freeze_trainable_modules = {"all"}, freeze_extra_modules;
  int64_t lora_rank = 8;
  std::vector<std::string> lora_target = {"all"};
  int64_t batch = 0, seq = 0, search_batch = 0;
  double time_limit = 10;
  int threads = 1, weight_buffers = 2;
  bool json = false, verbose = false, no_optimizer = false, in_process = false, resident_head = false;
  DataParallelOptions data_parallel;
};

void run_plan(const PlanOptions& o) {
  PlanRequest rq;
  rq.cfg = load_model_config(o.model);
  if (o.finetuning_type == "freeze")
    rq.cfg.finetune = std::make_shared<const Finetune>(make_freeze(
        rq.cfg, o.freeze_trainable_layers, o.freeze_trainable_modules, o.freeze_extra_modules, "--freeze"));
  if (o.finetuning_type == "lora")
    rq.cfg.finetune = std::make_shared<const Finetune>(
        make_lora(rq.cfg, o.lora_rank, 2.0 * double(o.lora_rank), 0, false, o.lora_target, {}));
  rq.model_name = o.model;
  rq.B = o.batch;
  rq.T = o.seq;
  LT_CHECK(o.batch >= 1 && o.seq >= 1, "--batch and --seq must be >= 1 (got {} and {})", o.batch, o.seq);
  rq.profile = resolve_profile(o.hardware, rq.cfg, o.batch, o.seq);
  const size_t dev = o.device_memory.empty() ? rq.profile.device_memory_bytes
                                             : parse_size(o.device_memory, "--device-memory");
  LT_CHECK(dev > 0, "--device-memory: the profile '{}' does not say how much device memory the machine has; give it",
           o.hardware);
  rq.budget = Budgets{dev, parse_size(o.host_act_memory, "--host-act-memory"), parse_size(o.nvme, "--nvme")};
  const std::string compute = o.compute.empty() ? rq.profile.compute : o.compute;
  LT_CHECK(compute == "f32" || compute == "bf16", "--compute {}: expected f32 or bf16", compute);
  rq.options.exec.compute = compute == "bf16" ? ComputeType::bf16 : ComputeType::f32;
  rq.options.exec.weight_buffers = o.weight_buffers;
  rq.options.exec.resident_head = o.resident_head;
  rq.options.include_optimizer = !o.no_optimizer;
  o.data_parallel.apply_to(rq.options);
  rq.profile.apply_to(rq.options.exec, o.activation_dtype, "--activation-dtype");
  rq.options.memory = o.memory_model == "lifetime" ? MemoryModel::lifetime : MemoryModel::executor;
  rq.milp.time_limit_s = o.time_limit;
  rq.milp.threads = o.threads;
  rq.milp.verbose = o.verbose;
  rq.milp.isolate = !o.in_process;

  PlanReport rep = make_plan(rq);
  nlohmann::json j = rep.to_json();
  if (o.search_batch > 0) j["batch_search"] = search_batch(rq, o.search_batch).to_json();
  if (!o.out.empty()) write_plan_file(o.out, rep.instance, rep.best.plan, rep.best.windows, &rep.best.prediction);
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("%s", rep.table().c_str());
  if (rq.budget.host_act_bytes == 0) std::printf("note: no host memory for activations (--host-act-memory): host tier off\n");
  if (o.search_batch > 0) {
    const auto& b = j["batch_search"];
    std::printf("batch search (up to %ld): largest batch that fits %ld; best predicted throughput at batch %ld "
                "(%.0f tokens/s, restricted DP)\n",
                long(o.search_batch), long(b["max_batch"].get<int64_t>()), long(b["best_batch"].get<int64_t>()),
                b["best_tokens_per_s"].get<double>());
  }
  if (!o.out.empty()) std::printf("plan written to %s\n", o.out.c_str());
}

}  // namespace

void register_plan(CLI::App& app) {
  auto o = std::make_shared<PlanOptions>();
  auto* cmd = app.add_subcommand("plan", "choose each activation's tier, recompute and transfer windows (MILP on CBC)");
  cmd->add_option("--model", o->model, "Hugging Face model directory or config.json")->required();
  cmd->add_option("--hardware", o->hardware, "built-in machine (h800, h200, rtx3090) or a profile JSON")->required();
  cmd->add_option("--batch", o->batch, "rows per step (B)")->required();
  cmd->add_option("--seq", o->seq, "tokens per row (T)")->required();
  cmd->add_option("--device-memory", o->device_memory, "device memory budget (default: the machine's)");
  cmd->add_option("--host-act-memory", o->host_act_memory, "host memory for activations (0 = host tier off)");
  cmd->add_option("--nvme", o->nvme, "NVMe space for activations (0 = NVMe tier off)");
  cmd->add_option("--time-limit", o->time_limit, "solver wall-clock limit, seconds")->check(CLI::PositiveNumber);
  cmd->add_option("--threads", o->threads, "solver threads")->check(CLI::Range(1, 64));
  cmd->add_option("--out", o->out, "write the plan (with its transfer windows) to this file");
  cmd->add_option("--memory-model", o->memory_model,
                  "device memory per window: executor (its working set, the default) or lifetime (finer; what-if)")
      ->check(CLI::IsMember({"executor", "lifetime"}));
  cmd->add_option("--activation-dtype", o->activation_dtype,
                  "storage of the activations kept for the backward: bf16, f32, or auto (bf16 with bf16 GEMMs)")
      ->check(CLI::IsMember({"f32", "bf16", "auto"}));
  cmd->add_option("--compute", o->compute, "GEMM compute type of the streamed weights (default: the profile's)");
  cmd->add_option("--weight-buffers", o->weight_buffers, "layer weight buffers on the device")->check(CLI::Range(1, 8));
  cmd->add_flag("--resident-head", o->resident_head, "the head's weights stay on the device all step");
  cmd->add_option("--search-batch", o->search_batch, "also search batches up to N: largest that fits, best throughput");
  cmd->add_flag("--no-optimizer", o->no_optimizer, "leave the host optimizer out of the objective");
  o->data_parallel.add_to(*cmd);
  cmd->add_flag("--in-process", o->in_process, "run CBC in this process (no child; the time limit is CBC's own)");
  cmd->add_option("--finetuning-type", o->finetuning_type,
                  "full, freeze or lora: frozen tensors cost their streamed bytes, adapters a trained tensor's")
      ->check(CLI::IsMember({"full", "freeze", "lora"}));
  cmd->add_option("--lora-rank", o->lora_rank, "lora: the adapters' rank (alpha 2 x rank)");
  cmd->add_option("--lora-target", o->lora_target, "lora: all, or linear names (q_proj, ...)")->delimiter(',');
  cmd->add_option("--freeze-trainable-layers", o->freeze_trainable_layers, "freeze: the last N layers train (-N: first)");
  cmd->add_option("--freeze-trainable-modules", o->freeze_trainable_modules, "freeze: all, or self_attn, mlp, ...")
      ->delimiter(',');
  cmd->add_option("--freeze-extra-modules", o->freeze_extra_modules, "freeze: embed_tokens, norm, lm_head")
      ->delimiter(',');
  cmd->add_flag("--json", o->json, "one JSON object");
  cmd->add_flag("--verbose", o->verbose, "CBC's log on stderr");
  cmd->callback([o]() { run_plan(*o); });
}

}  // namespace lt::cli
