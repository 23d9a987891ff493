#include "cli/device_options.h"

#include <CLI/CLI.hpp>

#include "core/error.h"
#include "core/units.h"
#include "exec/backend.h"
#include "io/nvme.h"

#include <algorithm>
#include <cstdio>

namespace lt::cli {

void DeviceOptions::add_to(CLI::App& cmd) {
  cmd.add_option("--plan,--policy", policy,
                 "run on the streaming executor with this plan: keep-all, every:K, host:K, nvme:K or a plan JSON file "
                 "(default: the in-memory reference path; --policy is its older name)");
  // What each device name runs: exec/backend.h. cuda-sim's kernels serve the in-memory path too (cuda/sim_ops.h).
  cmd.add_option("--device", device,
                 "device to run on: cpu; cuda (GPU 0; the streaming executor only: keep-all without --policy); or "
                 "cuda-sim (the CUDA kernels emulated on the CPU; small models)")
      ->check(CLI::IsMember(Backend::names()));
  cmd.add_option("--device-memory", device_memory, "device memory budget (bytes or with a unit: 512MiB, 8GiB, 80GB)");
  cmd.add_option("--link-gbps", link_gbps, "emulated host<->device bandwidth per direction, GB/s (0 = unlimited)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--h2d-gbps", h2d_gbps, "emulated host-to-device bandwidth, GB/s (overrides --link-gbps)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--d2h-gbps", d2h_gbps, "emulated device-to-host bandwidth, GB/s (overrides --link-gbps)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--link-latency-us", latency_us, "emulated latency added to every copy, microseconds")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--nvme-dir", nvme_dir, "directory for the NVMe activation tier");
  cmd.add_option("--trace", trace_path, "write the step's Chrome trace JSON here (chrome://tracing, Perfetto)");
  cmd.add_option("--weight-buffers", weight_buffers, "layer weight buffers on the device (2 = double buffering)")
      ->check(CLI::Range(1, 8));
  cmd.add_option("--mlp-chunk", mlp_chunk,
                 "tokens per MLP chunk (a multiple of 4096; 0: one chunk); bounds a layer's scratch, same bits "
                 "(default: the plan file's, else one chunk)");
  cmd.add_option("--activation-dtype", activation_dtype,
                 "storage of the activations kept for the backward: bf16, f32, or auto (bf16 when --dtype is bf16)")
      ->check(CLI::IsMember({"bf16", "f32", "auto"}));
  cmd.add_flag("--resident-head", resident_head,
               "keep the head's weights on the device all step (micro-batches after the first do not upload them)");
}

Backend DeviceOptions::backend() const { return Backend::parse(device, "--device"); }

Precision DeviceOptions::precision(ComputeType compute) const {
  return Precision(compute, backend().activation_storage(activation_dtype, compute, "--activation-dtype"));
}

ExecOptions DeviceOptions::exec_options(ComputeType compute, const Plan* plan) const {
  ExecOptions eo;
  eo.compute = compute;
  eo.activations = precision(compute).activations;
  eo.kernels = backend().layer_kernels(eo.activations);
  LT_CHECK(mlp_chunk < 0 || mlp_chunk % kTokenSlice == 0, "--mlp-chunk {}: must be a multiple of {} (0: one chunk)",
           mlp_chunk, kTokenSlice);
  eo.mlp_chunk_tokens = mlp_chunk >= 0 ? mlp_chunk : plan ? plan->mlp_chunk_tokens : 0;
  eo.weight_buffers = weight_buffers;
  eo.resident_head = resident_head;
  return eo;
}

LinkSpec DeviceOptions::link() const {
  return LinkSpec{h2d_gbps > 0 ? h2d_gbps : link_gbps, d2h_gbps > 0 ? d2h_gbps : link_gbps, latency_us * 1e-6};
}

std::unique_ptr<Device> DeviceOptions::make_device() const {
  return backend().open(parse_size(device_memory, "--device-memory"), link());
}

std::unique_ptr<NvmeStore> DeviceOptions::open_nvme(size_t bytes) const {
  if (bytes == 0) return nullptr;
  LT_CHECK(!nvme_dir.empty(), "policy '{}' puts {} of activations on NVMe: give a directory with --nvme-dir",
           policy, format_bytes(double(bytes)));
  NvmeOptions o;
  o.dir = nvme_dir;
  o.capacity_bytes = bytes + (size_t(64) << 20);  // + room for the start-up probe
  std::unique_ptr<NvmeStore> store = NvmeStore::open(o);
  NvmeProbe probe = store->probe(std::min<size_t>(size_t(64) << 20, o.capacity_bytes));
  std::fprintf(stderr, "nvme: %s; probe: %s\n", store->describe().c_str(), probe.describe().c_str());
  return store;
}

void DataParallelOptions::add_to(CLI::App& cmd) {
  cmd.add_option("--ranks", ranks, "data-parallel ranks (mpirun -np N), each this batch; the exchange is counted")
      ->check(CLI::Range(1, 1 << 20));
  cmd.add_option("--net-gbps", net_gbps, "network bandwidth per rank, GB/s each way (needed with --ranks > 1)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--optimizer-state-bits", optimizer_state_bits, "8 or 32: the host memory per rank it reports")
      ->check(CLI::IsMember({8, 32}));
}

void DataParallelOptions::apply_to(InstanceOptions& o) const {
  LT_CHECK(ranks == 1 || net_gbps > 0, "--ranks {}: give the network bandwidth per rank with --net-gbps", ranks);
  o.ranks = ranks;
  o.net_gbps = net_gbps;
  o.optimizer_state_bits = optimizer_state_bits;
}

}  // namespace lt::cli
