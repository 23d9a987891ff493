// cli/cmd_profile.cpp — `lazytrain profile`: measure the machine at the real shapes, for `lazytrain plan`.
//
//   lazytrain profile --model DIR --batch B --seq S [--device cpu|cuda|cuda-sim] [--device-memory SIZE] [--link-gbps G]
//                     [--nvme-dir DIR] [--dtype f32|bf16] --out profile.json
//
// Per-layer forward / backward / recompute on the device, the head, the embedding and gradient accumulation
// on the host, the link per direction alone and with both busy, NVMe through the executor's store, and the
// host optimizer's throughput (plan/measure.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "core/error.h"
#include "model/block.h"
#include "core/parallel.h"
#include "core/units.h"
#include "exec/backend.h"
#include "plan/measure.h"

namespace lt::cli {
namespace {

struct ProfileOptions {
  std::string model, device = "cpu", device_memory = "8GiB", dtype = "f32", nvme_dir, nvme_probe = "256MiB", out;
  std::string activation_dtype = "auto";
  int64_t batch = 0, seq = 0;
  double link_gbps = 0, h2d_gbps = 0, d2h_gbps = 0, latency_us = 0;
  int reps = 3, threads = 0;
  bool no_optimizer = false, json = false;
};

void run_profile(const ProfileOptions& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  LT_CHECK(o.batch >= 1 && o.seq >= 1, "--batch and --seq must be >= 1 (got {} and {})", o.batch, o.seq);
  const ModelConfig cfg = load_model_config(o.model);
  MeasureOptions mo;
  mo.backend = Backend::parse(o.device, "--device");
  mo.device_memory = parse_size(o.device_memory, "--device-memory");
  mo.link = LinkSpec{o.h2d_gbps > 0 ? o.h2d_gbps : o.link_gbps, o.d2h_gbps > 0 ? o.d2h_gbps : o.link_gbps,
                     o.latency_us * 1e-6};
  mo.compute = o.dtype == "bf16" ? ComputeType::bf16 : ComputeType::f32;
  mo.activations = mo.backend.activation_storage(o.activation_dtype, mo.compute, "--activation-dtype");
  mo.reps = o.reps;
  mo.nvme_dir = o.nvme_dir;
  mo.nvme_probe_bytes = parse_size(o.nvme_probe, "--nvme-probe");
  mo.optimizer = !o.no_optimizer;
  mo.model_name = o.model;
  Profile p = measure_profile(cfg, o.batch, o.seq, mo);
  if (!o.out.empty()) p.save(o.out);
  if (o.json) {
    std::printf("%s\n", p.to_json().dump().c_str());
    return;
  }
  double f = 0, b = 0, r = 0;
  for (int64_t l = 0; l < p.num_layers(); ++l) {
    f += p.forward_s[size_t(l)];
    b += p.backward_s[size_t(l)];
    r += p.recompute_s[size_t(l)];
  }
  const double L = double(p.num_layers());
  std::printf("%s\n", p.source.c_str());
  std::printf("per layer (mean of %ld): forward %.3f ms, backward %.3f ms, recompute %.3f ms; head %.3f ms\n",
              long(p.num_layers()), 1e3 * f / L, 1e3 * b / L, 1e3 * r / L, 1e3 * p.head_s);
  std::printf("embedding (host): forward %.3f ms, backward %.3f ms; gradient accumulation %.2f GB/s\n",
              1e3 * p.embed_forward_s, 1e3 * p.embed_backward_s, p.accumulate_gbps);
  std::printf("link: h2d %.2f GB/s, d2h %.2f GB/s alone; %.2f / %.2f GB/s both busy; latency %.1f us\n",
              p.link.h2d_gbps, p.link.d2h_gbps, p.link.h2d_duplex_gbps, p.link.d2h_duplex_gbps, 1e6 * p.link.latency_s);
  std::printf("optimizer: %.3g params/s (%s)\n", p.optimizer_params_per_s, p.optimizer_note.c_str());
  std::printf("NVMe: read %.2f GB/s, write %.2f GB/s (%s)\n", p.nvme_read_gbps, p.nvme_write_gbps, p.nvme_note.c_str());
  if (!o.out.empty()) std::printf("profile written to %s\n", o.out.c_str());
}

}  // namespace

void register_profile(CLI::App& app) {
  auto o = std::make_shared<ProfileOptions>();
  auto* cmd = app.add_subcommand("profile", "measure per-layer, link, NVMe and optimizer costs for the planner");
  cmd->add_option("--model", o->model, "Hugging Face model directory or config.json")->required();
  cmd->add_option("--batch", o->batch, "rows per step (B)")->required();
  cmd->add_option("--seq", o->seq, "tokens per row (T)")->required();
  cmd->add_option("--device", o->device, "device to measure: cpu, cuda (GPU 0) or cuda-sim (exec/backend.h)")
      ->check(CLI::IsMember(Backend::names()));
  cmd->add_option("--device-memory", o->device_memory, "device memory (the emulated device's capacity)");
  cmd->add_option("--link-gbps", o->link_gbps, "emulated host<->device bandwidth per direction, GB/s (0 = unlimited)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--h2d-gbps", o->h2d_gbps, "emulated host-to-device bandwidth, GB/s")->check(CLI::NonNegativeNumber);
  cmd->add_option("--d2h-gbps", o->d2h_gbps, "emulated device-to-host bandwidth, GB/s")->check(CLI::NonNegativeNumber);
  cmd->add_option("--link-latency-us", o->latency_us, "emulated latency per copy, microseconds")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--dtype", o->dtype, "compute dtype of the GEMMs")->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--activation-dtype", o->activation_dtype,
                  "storage of the activations kept for the backward: bf16, f32, or auto (bf16 when --dtype is bf16)")
      ->check(CLI::IsMember({"bf16", "f32", "auto"}));
  cmd->add_option("--reps", o->reps, "repetitions per measurement (fastest kept)")->check(CLI::Range(1, 100));
  cmd->add_option("--threads", o->threads, "CPU threads (default: all cores)")->check(CLI::PositiveNumber);
  cmd->add_option("--nvme-dir", o->nvme_dir, "directory for the NVMe probe (through the executor's NVMe store)");
  cmd->add_option("--nvme-probe", o->nvme_probe, "bytes written and read by the NVMe probe");
  cmd->add_flag("--no-optimizer", o->no_optimizer, "do not measure the host optimizer");
  cmd->add_option("--out", o->out, "write the profile JSON here");
  cmd->add_flag("--json", o->json, "print the profile JSON");
  cmd->callback([o]() { run_profile(*o); });
}

}  // namespace lt::cli
