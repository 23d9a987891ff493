// cli/cmd_bench_step.cpp — `lazytrain bench step`: time training steps of a plan on the device.
//
// Runs --steps steps (after one warm-up) of the streaming executor (or, with --policy in-memory, the
// reference path) on one batch and prints one JSON line of the best step's measurements:
//   step_s, compute_s, h2d_bytes, d2h_bytes, h2d_s, d2h_s, nvme_read_bytes, nvme_write_bytes,
//   exposed_s, optimizer_s, peak_device_bytes, recompute_s, tokens_per_s, tflops_6nd.
// With --accumulate M a step is one optimizer step of M micro-batches, as training with gradient accumulation
// runs it: the first micro-batch's forward runs the previous update, the others start on the layers the one
// before left on the device; times, bytes and tokens are those of all M.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/device_options.h"
#include "exec/backend.h"
#include "core/cpu_features.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/timer.h"
#include "io/nvme.h"
#include "model/finetune.h"
#include "model/model.h"
#include "model/peft.h"
#include "ops/gemm.h"
#include "optim/adamw.h"

namespace lt::cli {
namespace {

struct BenchStepOptions {
  std::string model_dir, batch_path, dtype = "f32", optimizer = "adamw8";
  int steps = 3, threads = 0;
  bool json = false;
  bool microbatches = false;
  int accumulate = 1;
  int64_t lora_rank = 0;          // > 0: LoRA of this rank on every linear (alpha 2 r), the base frozen
  int64_t freeze_layers = 0;      // != 0: freeze fine-tuning, the last N layers trained (LLaMA-Factory's rule)
  DeviceOptions dev;
};

// Seconds the host spent in optimizer updates (pipelined into the forward).
double optimizer_seconds(const TraceRecorder& trace) {
  double s = 0;
  for (const OpRecord& op : trace.ops())
    if (op.lane == "optimizer") s += op.end - op.start;
  return s;
}

// The micro-batches of one optimizer step as one line: seconds, bytes and counts added, peaks the largest.
void add_microbatch(nlohmann::json& sum, const nlohmann::json& line) {
  if (sum.is_null()) {
    sum = line;
    return;
  }
  for (auto& [key, value] : line.items()) {
    if (!value.is_number()) continue;
    if (key.find("peak") != std::string::npos || key.find("predicted") != std::string::npos)
      sum[key] = std::max(sum[key].get<double>(), value.get<double>());
    else
      sum[key] = sum[key].get<double>() + value.get<double>();
  }
}

// Seconds the compute stream spent recomputing (forward work done again in the backward).
double recompute_seconds(const TraceRecorder& trace) {
  double s = 0;
  for (const OpRecord& op : trace.ops())
    if (op.lane == "compute" && op.waited_on.empty() && op.name.rfind("recompute", 0) == 0) s += op.end - op.start;
  return s;
}

void run_bench_step(const BenchStepOptions& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  const Backend backend = o.dev.backend();
  const KernelScope kernels = backend.kernels();
  LT_CHECK(o.steps >= 1, "--steps must be at least 1");
  LT_CHECK(o.accumulate == 1 || (!o.dev.policy.empty() && o.dev.policy != "in-memory" && !o.microbatches),
           "--accumulate runs micro-batches on the streaming executor: give --policy, and not --microbatches");
  LT_CHECK(!o.microbatches || o.optimizer == "none",
           "--microbatches: the weights change with every optimizer step; use it with --optimizer none");
  const ComputeType compute = o.dtype == "bf16" ? ComputeType::bf16 : ComputeType::f32;
  LoadedModel m = load_hf_model(o.model_dir);
  Batch batch = Batch::load(o.batch_path, m.config.vocab_size);
  std::optional<ModelSlabs> copy;
  const ModelSlabs* weights = &m.params;
  // --lora-rank / --freeze-layers (model/finetune.h): the masters and gradients of the trained tensors alone, every
  // tensor in the streamed weights (in the compute dtype), as a LoRA or freeze run keeps them.
  if (o.lora_rank > 0 || o.freeze_layers != 0) {
    LT_CHECK(!o.dev.policy.empty() && o.dev.policy != "in-memory",
             "--lora-rank / --freeze-layers time the streamed step: give --policy");
    ModelConfig cfg = m.config;
    cfg.finetune = std::make_shared<const Finetune>(
        o.lora_rank > 0 ? make_lora(cfg, o.lora_rank, 2.0 * double(o.lora_rank), 0, false, {"all"}, {})
                        : make_freeze(cfg, o.freeze_layers, {"all"}, {}));
    ModelSlabs masters(cfg, DType::f32, Fill::zero, SlabSet::trained);
    copy_tensors_by_name(masters, m.params);
    init_adapters(masters, 1);
    copy.emplace(cfg, compute == ComputeType::bf16 ? DType::bf16 : DType::f32);
    copy_tensors_by_name(*copy, m.params);
    copy_tensors_by_name(*copy, masters);
    weights = &*copy;
    m.config = cfg;
    m.params = std::move(masters);
  } else if (compute == ComputeType::bf16) {
    copy.emplace(m.config, DType::bf16);
    make_compute_copy(*copy, m.params);
    weights = &*copy;
  }
  ModelSlabs grads(m.config, DType::f32, Fill::zero, SlabSet::trained);
  // A GPU has no in-memory path: keep-all is its reference (exec/backend.h).
  const std::string policy = !o.dev.policy.empty() ? o.dev.policy : backend.reference_policy();
  nlohmann::json best;
  double best_s = 1e300;
  // One device and one executor (or one workspace) for all steps, as in training: buffers and their
  // pages are set up once.
  Workspace ws;
  std::unique_ptr<Device> device;
  std::unique_ptr<StreamingExecutor> ex;
  std::unique_ptr<NvmeStore> nvme;
  std::optional<Plan> plan;
  std::unique_ptr<PinnedSlabs> pins;  // the streamed slabs, pinned for a GPU's DMA (nothing on the CPU device)
  if (policy != "in-memory") {
    plan = Plan::parse(policy, m.config.num_layers);
    device = o.dev.make_device();
    const ExecOptions eo = o.dev.exec_options(compute, &*plan);
    nvme = o.dev.open_nvme(plan_working_set(m.config, batch.B, batch.T, *plan, eo).nvme_bytes);
    ex = std::make_unique<StreamingExecutor>(m.config, *device, eo, nvme.get());
    pins = std::make_unique<PinnedSlabs>(*device);
    pins->pin(const_cast<ModelSlabs&>(*weights), "weights");
    pins->pin(grads, "gradients");
  }
  // The optimizer (streamed runs): each step's forward runs the previous step's update, as in training.
  std::unique_ptr<HybridAdamW> opt;
  std::optional<PendingUpdate> pending;
  if (policy != "in-memory" && o.optimizer != "none") {
    AdamWConfig ac;
    ac.matrix_states = o.optimizer == "adamw8" ? StatePrecision::q8 : StatePrecision::f32;
    opt = std::make_unique<HybridAdamW>(m.params, grads, ac, nullptr, copy ? copy->matrix_dtype() : DType::bf16);
  }
  for (int i = 0; i <= o.steps; ++i) {  // step 0 warms up (primitive creation, page faults)
    if (!opt) grads.zero();
    nlohmann::json line;
    double step_s;
    if (policy == "in-memory") {
      Timer t;
      LossResult r = model_forward_backward(grads, m.params, batch, o.dev.precision(compute), &ws);
      step_s = t.seconds();
      line = {{"loss", r.loss()}, {"step_s", step_s}, {"compute_s", step_s}, {"h2d_bytes", 0}, {"d2h_bytes", 0},
              {"h2d_s", 0}, {"d2h_s", 0}, {"nvme_read_bytes", 0}, {"nvme_write_bytes", 0}, {"exposed_s", 0},
              {"peak_device_bytes", 0}, {"recompute_s", 0}};
    } else {
      // One optimizer step of o.accumulate micro-batches (1 by default): the first runs the pending update and
      // overwrites the host gradients, as the trainer's does; the others add to them and start on the layers
      // the one before left on the device (the weights change with every optimizer step, version i + 1, not
      // between its micro-batches). With --microbatches every step is a further micro-batch of one optimizer
      // step: the same weights (version 1) and added gradients. The partial norms after the last micro-batch
      // are those of the accumulated gradients.
      ModelSlabs* copy_ptr = copy ? &*copy : nullptr;
      GradNormPartials partials(m.config.num_layers);
      const uint64_t version = o.microbatches ? 1 : uint64_t(i + 1);
      Timer t;
      for (int k = 0; k < o.accumulate; ++k) {
        TraceRecorder trace;
        const GradMode mode = k == 0 && !o.microbatches ? GradMode::overwrite : GradMode::add;
        StepStats st = ex->step(grads, m.params, *weights, batch, *plan, &trace, k == 0 && pending ? &*pending : nullptr,
                                GradTarget{&partials, mode}, version);
        nlohmann::json mb = st.to_json();
        mb["recompute_s"] = recompute_seconds(trace);
        mb["optimizer_s"] = optimizer_seconds(trace);
        add_microbatch(line, mb);
        // The trace of a carried micro-batch when there is one.
        if (i == o.steps && k == std::min(1, o.accumulate - 1) && !o.dev.trace_path.empty())
          trace.write_chrome_trace(o.dev.trace_path);
      }
      if (opt) {
        StepPlan sp = opt->plan_step(partials.sum_of_squares());
        pending = PendingUpdate{opt.get(), StepArgs{sp.step, 1e-5, sp.clip}, copy_ptr};
      }
      // Several micro-batches: the wall time of all of them (the gaps between the calls are the step's too).
      step_s = o.accumulate == 1 ? line["step_s"].get<double>() : t.seconds();
      line["step_s"] = step_s;
      line["loss"] = line["loss"].get<double>() / o.accumulate;
    }
    if (i > 0 && step_s < best_s) {
      best_s = step_s;
      best = line;
    }
  }
  best["bench"] = "step";
  best["policy"] = policy;
  best["dtype"] = o.dtype;
  best["activation_dtype"] = dtype_name(o.dev.precision(compute).activations);
  best["steps"] = o.steps;
  best["threads"] = num_threads();
  best["vector_path"] = isa_name(isa_level(cpu_features()));
  best["gemm_bf16"] = bf16_route_name(gemm_bf16_route());
  best["tokens_per_s"] = double(batch.N()) * o.accumulate / best_s;
  // The paper's convention (the planner's tflops_6nd): 6 · parameters · tokens / step time, recompute not counted.
  best["tflops_6nd"] = 6.0 * double(m.config.num_parameters()) * double(batch.N()) * o.accumulate / best_s / 1e12;
  best["finetune"] = m.config.finetune ? m.config.finetune->summary(m.config) : "full";
  best["trained_state_bytes"] = m.params.total_bytes() + grads.total_bytes() + (opt ? opt->state_report().state_bytes : 0);
  best["accumulate"] = o.accumulate;
  best["optimizer"] = policy == "in-memory" ? "none" : o.optimizer;
  best["microbatches"] = o.microbatches;
  if (!best.contains("optimizer_s")) best["optimizer_s"] = 0.0;
  const LinkSpec link = o.dev.link();
  best["h2d_gbps"] = link.h2d_gbps;
  best["d2h_gbps"] = link.d2h_gbps;
  if (o.json) {
    std::printf("%s\n", best.dump().c_str());
  } else {
    std::printf("policy %s: step %.4f s, compute %.4f s, exposed %.4f s, h2d %.1f MB, d2h %.1f MB, peak device %.1f MiB, "
                "%.0f tokens/s\n",
                policy.c_str(), best_s, best["compute_s"].get<double>(), best["exposed_s"].get<double>(),
                best["h2d_bytes"].get<double>() / 1e6, best["d2h_bytes"].get<double>() / 1e6,
                best["peak_device_bytes"].get<double>() / 1048576.0, double(batch.N()) * o.accumulate / best_s);
  }
}

}  // namespace

void add_bench_step(CLI::App& bench) {
  auto o = std::make_shared<BenchStepOptions>();
  auto* cmd = bench.add_subcommand("step", "time training steps of an activation policy on the device");
  cmd->add_option("--model", o->model_dir, "Hugging Face model directory")->required();
  cmd->add_option("--batch", o->batch_path, "batch JSON")->required();
  cmd->add_option("--dtype", o->dtype, "compute dtype of the GEMMs")->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--steps", o->steps, "timed steps (best reported), after one warm-up");
  cmd->add_option("--threads", o->threads, "CPU threads (default: all cores)")->check(CLI::PositiveNumber);
  cmd->add_flag("--json", o->json, "one JSON line");
  cmd->add_flag("--microbatches", o->microbatches,
                "the steps are micro-batches of one optimizer step (weights unchanged between them; --optimizer none)");
  cmd->add_option("--accumulate", o->accumulate,
                  "each timed step is one optimizer step of this many micro-batches (gradient accumulation)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--lora-rank", o->lora_rank, "LoRA of this rank on every linear, the base frozen (a streamed policy)");
  cmd->add_option("--freeze-layers", o->freeze_layers, "freeze fine-tuning: the last N layers trained (-N: the first)");
  cmd->add_option("--optimizer", o->optimizer,
                  "optimizer pipelined into each step's forward (streamed runs): adamw8, adamw32 or none")
      ->check(CLI::IsMember({"adamw8", "adamw32", "none"}));
  o->dev.add_to(*cmd);
  cmd->callback([o]() { run_bench_step(*o); });
}

}  // namespace lt::cli
