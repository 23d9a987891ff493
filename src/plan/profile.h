// plan/profile.h — what the planner knows about a machine: measured (or derived) costs at one batch shape.
//
// A Profile holds, for one model at one batch shape (B rows of T tokens), every cost the planner and the
// simulator use: per-layer forward / backward / recompute seconds on the device, the head, the embedding
// and gradient accumulation on the host, the host optimizer's throughput, the link per direction (alone
// and with both directions busy), NVMe read and write bandwidth, and the machine's memory.
//
// Two sources:
//   measure_profile()          on a device (the emulated CPU device, or a GPU), with the real kernels, through
//                              the executor's own paths (cmd `lazytrain profile`);
//   hardware_profile()         a built-in machine (h800, h200, rtx3090; plan/hardware.h): compute from FLOP
//                              counts over a stated sustained rate, links and disks from published figures.
//
// Legend: L layers, B batch rows, T tokens per row, N = B*T.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "exec/working_set.h"
#include "model/config.h"

namespace lt {

struct LinkProfile {
  double h2d_gbps = 0;         // GB/s (1e9 B/s), one direction busy
  double d2h_gbps = 0;
  double h2d_duplex_gbps = 0;  // each direction while the other is busy too (0: same as alone)
  double d2h_duplex_gbps = 0;
  double latency_s = 0;        // per copy
};

struct Profile {
  std::string name;     // "h800", "cpu (measured)", ...
  std::string source;   // one line: how the numbers were obtained
  std::string model;    // config it was made for (informative)
  int64_t batch = 0, seq = 0;            // the shape the per-layer times belong to (B, T)
  std::string compute = "f32";           // GEMM compute type: "f32" or "bf16"
  std::string activations = "f32";       // activation storage the times were measured with: "f32" or "bf16"
  // The layer compute the times are of ("cpu": the CPU block, "cuda": the CUDA block, ExecOptions::kernels), so the
  // executor's working set a plan is checked against is that compute's. Built-in GPU machines: "cuda". Files
  // written before the name was settled say "gpu", read as "cuda".
  LayerKernels layer_kernels = LayerKernels::cpu;
  std::vector<double> forward_s;         // [L] block_forward on the device
  std::vector<double> backward_s;        // [L] block_backward (parameter-gradient zeroing included)
  std::vector<double> recompute_s;       // [L] what recomputing internals adds to a backward (the forward but
                                         // the down projection: block_recompute_internals + the MLP per chunk)
  double head_s = 0;                     // fused norm + lm_head + cross-entropy, forward and backward
  double embed_forward_s = 0;            // host: embedding lookup
  double embed_rows_s = 0;               // device: the embedding backward's rows of dx0 (embedding_grad_rows)
  double embed_backward_s = 0;           // host: those rows added into the table (embedding_add_rows)
  double accumulate_gbps = 0;            // host: gradient bytes per second added into the f32 host grads
  double optimizer_params_per_s = 0;     // host optimizer update throughput; 0 = not measured
  std::string optimizer_note;            // how it was measured, or why not
  LinkProfile link;
  double nvme_read_gbps = 0, nvme_write_gbps = 0;  // through the executor's NVMe path; 0 = none measured
  std::string nvme_note;
  size_t device_memory_bytes = 0;        // the machine's device memory (default budget)
  double sustained_tflops = 0;           // built-in hardware: the compute rate the times come from

  int64_t num_layers() const { return int64_t(forward_s.size()); }
  // The same machine at another batch shape. Built-in hardware recomputes from FLOPs; a measured profile
  // scales its times by the token count (linear in N: attention's T² term is not rescaled — a warning
  // names it when T changes).
  nlohmann::json to_json() const;
  static Profile from_json(const nlohmann::json& j, const std::string& source);
  static Profile load(const std::string& path);
  void save(const std::string& path) const;
  // Checks the arrays match L layers and every rate is usable; the message names the field.
  void validate(int64_t L) const;
  // The executor options a plan for this machine uses: its layer compute, and the activation storage
  // `activation_dtype` (bf16, f32, auto) resolves to for e.compute — bf16 for the CUDA block, which refuses f32.
  void apply_to(ExecOptions& e, const std::string& activation_dtype, const std::string& what) const;
};

// A measured profile re-targeted to B x T (times scaled by N'/N). Notes the scaling in `source`.
Profile scale_profile(const Profile& p, int64_t B, int64_t T);

}  // namespace lt
