// plan/hardware.h — built-in machines, so that a run can be planned before the machine is rented, and the
// FLOP counts their compute times come from.
//
// A built-in machine gives per-layer times as FLOPs / a sustained rate (not the peak: the rate per-layer
// training kernels reach; how each was chosen is stated next to it in hardware.cpp), links and disks from
// published measurements. Only GEMM and attention FLOPs are counted; element-wise work (norms, RoPE,
// SwiGLU) is taken to hide inside the sustained rate.
//
// Legend: B batch rows, T tokens per row, N = B*T, C hidden, Hq heads, D head dim, QD = Hq*D,
// KVD = Hkv*D, I intermediate, V vocab.
#pragma once

#include <string>
#include <vector>

#include "model/config.h"
#include "plan/profile.h"

namespace lt {

struct Hardware {
  std::string name;                // "h800"
  std::string description;         // one line for the table
  size_t device_memory_bytes = 0;
  double peak_tflops = 0;          // dense bf16 (informative)
  double sustained_tflops = 0;     // what per-layer times are computed from
  LinkProfile link;
  double nvme_read_gbps = 0, nvme_write_gbps = 0;
  double host_accumulate_gbps = 0;     // gradient bytes per second added on the host
  double optimizer_params_per_s = 0;   // host AdamW
  double host_copy_gbps = 0;           // embedding lookup / scatter (bytes of [N, C] f32 per second)
};

// The built-in machines: h800, h200, rtx3090.
const std::vector<Hardware>& builtin_hardware();
// nullptr if `name` is not built in.
const Hardware* find_hardware(const std::string& name);
// "h800, h200, rtx3090"
std::string hardware_names();

// FLOPs of one decoder layer's forward at B x T (GEMMs: 2 per multiply-add; causal attention: half of
// the T x T scores and their product with V). Backward = 2 x forward.
double layer_forward_flops(const ModelConfig& cfg, int64_t B, int64_t T);
// Head forward + backward: 6·N·C·V.
double head_flops(const ModelConfig& cfg, int64_t B, int64_t T);
// The MLP's share of a layer's FLOPs: how much of its backward runs before the MLP gradients can go down
// (block_backward_mlp comes first).
double mlp_flops_share(const ModelConfig& cfg, int64_t B, int64_t T);
// Parameters of one decoder layer (the paper's 6·N·tokens convention sums these, embeddings and head).
int64_t layer_parameters(const ModelConfig& cfg);

// The machine's profile for `cfg` at B x T with compute `compute` ("bf16" for the real machines).
Profile hardware_profile(const Hardware& hw, const ModelConfig& cfg, int64_t B, int64_t T);

// A built-in machine's name or a profile JSON file (`lazytrain profile --out`), for cfg at B x T. Unknown
// names that are not files are refused with the list of built-in machines.
Profile resolve_profile(const std::string& hardware_or_file, const ModelConfig& cfg, int64_t B, int64_t T);

}  // namespace lt
