// cli/cmd_simulate.cpp — `lazytrain simulate`: the discrete-event simulator's prediction for a policy.
//
//   lazytrain simulate --profile FILE|h800|... --model DIR --batch B --seq S --policy P [--json] [--trace FILE]
//
// P is what the executor's --policy takes (keep-all, every:K, host:K, nvme:K, a plan file; a plan file's
// "windows" and MLP chunk are honoured, --mlp-chunk as `bench step` takes it). Prints the simulated step time,
// exposed time per link, peak memory per tier, and the cost model's prediction for the same plan next to it.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/device_options.h"
#include "core/error.h"
#include "model/block.h"
#include "core/units.h"
#include "io/json_file.h"
#include "plan/hardware.h"
#include "plan/plan_file.h"
#include "plan/simulate.h"

namespace lt::cli {
namespace {

struct SimulateOptions {
  std::string profile, model, policy, device_memory, host_act_memory = "1TiB", nvme = "1TiB", trace, compute;
  std::string activation_dtype = "auto";
  int64_t batch = 0, seq = 0, mlp_chunk = -1;
  int weight_buffers = 2;
  bool json = false, no_optimizer = false, resident_head = false;
  DataParallelOptions data_parallel;
};

void run_simulate(const SimulateOptions& o) {
  LT_CHECK(o.batch >= 1 && o.seq >= 1, "--batch and --seq must be >= 1 (got {} and {})", o.batch, o.seq);
  const ModelConfig cfg = load_model_config(o.model);
  const Profile prof = resolve_profile(o.profile, cfg, o.batch, o.seq);
  InstanceOptions io;
  const std::string compute = o.compute.empty() ? prof.compute : o.compute;
  LT_CHECK(compute == "f32" || compute == "bf16", "--compute {}: expected f32 or bf16", compute);
  io.exec.compute = compute == "bf16" ? ComputeType::bf16 : ComputeType::f32;
  prof.apply_to(io.exec, o.activation_dtype, "--activation-dtype");
  io.exec.weight_buffers = o.weight_buffers;
  io.exec.resident_head = o.resident_head;
  // The MLP chunk the executor would run this policy with (`bench step`'s rule): --mlp-chunk, else a plan file's,
  // else one chunk — so a plan file is simulated at the memory it was solved for.
  LT_CHECK(o.mlp_chunk < 0 || o.mlp_chunk % kTokenSlice == 0, "--mlp-chunk {}: must be a multiple of {} (0: one chunk)",
           o.mlp_chunk, kTokenSlice);
  io.exec.mlp_chunk_tokens = o.mlp_chunk >= 0 ? o.mlp_chunk : Plan::parse(o.policy, cfg.num_layers).mlp_chunk_tokens;
  io.include_optimizer = !o.no_optimizer;
  o.data_parallel.apply_to(io);
  const size_t dev = o.device_memory.empty() ? prof.device_memory_bytes : parse_size(o.device_memory, "--device-memory");
  const Budgets budget{dev, parse_size(o.host_act_memory, "--host-act-memory"), parse_size(o.nvme, "--nvme")};
  const Instance in = make_instance(cfg, o.batch, o.seq, prof, budget, io);
  const PolicyWithWindows pw = load_policy(o.policy, in);
  SimOptions so;
  so.record_ops = !o.trace.empty();
  const SimResult r = simulate(in, pw.plan, pw.windows, so);
  const Prediction model = evaluate(in, pw.plan, pw.windows);
  if (!o.trace.empty()) write_json_file(o.trace, r.chrome_trace(), -1);
  if (o.json) {
    nlohmann::json j = r.to_json();
    j["policy"] = o.policy;
    j["tokens_per_s"] = double(o.batch * o.seq) / r.iteration_s;
    j["fits"] = model.feasible;
    j["violations"] = model.violations;
    j["model_step_s"] = model.step_s;
    j["model_iteration_s"] = model.iteration_s;
    if (in.opt.ranks > 1) {
      j["ranks"] = in.opt.ranks;
      j["job_tokens_per_s"] = double(o.batch * o.seq) * in.opt.ranks / r.iteration_s;
      j["exchange_micro_bytes"] = in.exchange_micro_bytes;
      j["exchange_step_bytes"] = in.exchange_step_bytes;
    }
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("policy %s on %s, B=%ld T=%ld: simulated step %.4f s (+%.4f s optimizer exposed), %.0f tokens/s\n",
              o.policy.c_str(), in.profile_name.c_str(), long(o.batch), long(o.seq), r.step_s, r.optimizer_exposed_s,
              double(o.batch * o.seq) / r.iteration_s);
  std::printf("compute %.4f s (recompute %.4f s); exposed: h2d %.4f s, d2h %.4f s, host %.4f s, nvme %.4f s\n",
              r.compute_s, r.recompute_s, r.exposed_h2d_s, r.exposed_d2h_s, r.exposed_host_s, r.exposed_nvme_s);
  std::printf("traffic: h2d %s, d2h %s, NVMe read %s / write %s\n", format_bytes(r.h2d_bytes).c_str(),
              format_bytes(r.d2h_bytes).c_str(), format_bytes(r.nvme_read_bytes).c_str(),
              format_bytes(r.nvme_write_bytes).c_str());
  std::printf("memory: device %s (executor's packed working set; largest window %s, lifetime model %s), host "
              "activations %s, NVMe %s\n",
              format_bytes(double(r.peak_device_bytes)).c_str(), format_bytes(r.window_device_bytes).c_str(),
              format_bytes(r.lifetime_device_bytes).c_str(),
              format_bytes(r.host_act_bytes).c_str(), format_bytes(r.nvme_bytes).c_str());
  if (in.opt.ranks > 1)
    std::printf("data parallel: %d ranks over %.3g GB/s each way: per rank %s exchanged per micro-batch, %s per step "
                "(updated weights), counted above; the job %.0f tokens/s\n",
                in.opt.ranks, in.opt.net_gbps, format_bytes(in.exchange_micro_bytes).c_str(),
                format_bytes(in.exchange_step_bytes).c_str(), double(o.batch * o.seq) * in.opt.ranks / r.iteration_s);
  std::printf("cost model (windows): step %.4f s, iteration %.4f s (%+.1f%% vs simulated)%s\n", model.step_s,
              model.iteration_s, 100 * (model.iteration_s / r.iteration_s - 1),
              model.feasible ? "" : ("; does not fit: " + model.violations.front()).c_str());
}

}  // namespace

void register_simulate(CLI::App& app) {
  auto o = std::make_shared<SimulateOptions>();
  auto* cmd = app.add_subcommand("simulate", "predict a policy's step with the discrete-event simulator");
  cmd->add_option("--profile", o->profile, "profile JSON (`lazytrain profile`) or a built-in machine")->required();
  cmd->add_option("--model", o->model, "Hugging Face model directory or config.json")->required();
  cmd->add_option("--batch", o->batch, "rows per step (B)")->required();
  cmd->add_option("--seq", o->seq, "tokens per row (T)")->required();
  cmd->add_option("--plan,--policy", o->policy,
                  "the plan: keep-all, every:K, host:K, nvme:K or a plan file (--policy: its older name)")
      ->required();
  cmd->add_option("--device-memory", o->device_memory, "device memory budget (default: the profile's)");
  cmd->add_option("--host-act-memory", o->host_act_memory, "host memory for activations");
  cmd->add_option("--nvme", o->nvme, "NVMe space for activations");
  cmd->add_option("--compute", o->compute, "GEMM compute type (default: the profile's)");
  cmd->add_option("--activation-dtype", o->activation_dtype,
                  "storage of the activations kept for the backward: bf16, f32, or auto (bf16 with bf16 GEMMs)")
      ->check(CLI::IsMember({"bf16", "f32", "auto"}));
  cmd->add_option("--weight-buffers", o->weight_buffers, "layer weight buffers on the device")->check(CLI::Range(1, 8));
  cmd->add_option("--mlp-chunk", o->mlp_chunk,
                  "tokens per MLP chunk (a multiple of 4096; 0: one chunk), as `bench step` takes it (default: the "
                  "plan file's, else one chunk)");
  cmd->add_flag("--resident-head", o->resident_head, "the head's weights stay on the device all step");
  cmd->add_option("--trace", o->trace, "write the simulated step as Chrome trace JSON");
  cmd->add_flag("--no-optimizer", o->no_optimizer, "leave the host optimizer out");
  o->data_parallel.add_to(*cmd);
  cmd->add_flag("--json", o->json, "one JSON object");
  cmd->callback([o]() { run_simulate(*o); });
}

}  // namespace lt::cli
