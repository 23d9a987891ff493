// cli/device_options.h — the options every command that runs the streaming executor shares:
// --policy, --device, --device-memory, --link-gbps (or per direction), --nvme-dir, --trace,
// --weight-buffers, --resident-head.
#pragma once

#include <memory>
#include <string>

#include "device/device.h"
#include "exec/backend.h"
#include "exec/executor.h"
#include "plan/instance.h"

namespace CLI {
class App;
}

namespace lt {
class NvmeStore;
}

namespace lt::cli {

struct DeviceOptions {
  std::string policy;            // empty: the in-memory reference path
  std::string activation_dtype = "auto";  // --activation-dtype: bf16 | f32 | auto (bf16 with bf16 GEMMs)
  std::string device = "cpu";
  std::string device_memory = "8GiB";
  double link_gbps = 0, h2d_gbps = 0, d2h_gbps = 0, latency_us = 0;
  std::string nvme_dir;
  std::string trace_path;
  int weight_buffers = 2;
  bool resident_head = false;
  int64_t mlp_chunk = -1;  // --mlp-chunk: tokens per MLP chunk; -1: the plan file's, else one chunk

  void add_to(CLI::App& cmd);
  Backend backend() const;  // --device, parsed
  // The executor's options; `plan` supplies the MLP chunk when --mlp-chunk is not given.
  ExecOptions exec_options(ComputeType compute, const Plan* plan = nullptr) const;
  // The GEMM compute type with the activation storage --activation-dtype resolves to for it.
  Precision precision(ComputeType compute) const;
  LinkSpec link() const;
  // The device (under cuda-sim, run its work inside backend().kernels()).
  std::unique_ptr<Device> make_device() const;
  // The NVMe store for a plan that needs `bytes` of it (null when bytes == 0); refuses a plan that
  // needs one without --nvme-dir. Logs the I/O path in use and its probed bandwidth to stderr.
  std::unique_ptr<NvmeStore> open_nvme(size_t bytes) const;
};

// `plan` and `simulate` on paper for a data-parallel job: --ranks, --net-gbps, --optimizer-state-bits.
struct DataParallelOptions {
  int ranks = 1;
  double net_gbps = 0;
  int optimizer_state_bits = 8;
  void add_to(CLI::App& cmd);
  void apply_to(InstanceOptions& o) const;
};

}  // namespace lt::cli
