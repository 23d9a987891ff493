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
  double device_memory_gbps = 0;       // the device's memory bandwidth (its memory-bound kernels: the embedding rows)
};

// The built-in machines: h800, h200, rtx3090.
const std::vector<Hardware>& builtin_hardware();
// nullptr if `name` is not built in.
const Hardware* find_hardware(const std::string& name);
// "h800, h200, rtx3090"
std::string hardware_names();

// FLOPs of one decoder layer's forward at B x T: 2·N per weight of its matrices and short convolutions (each
// is one multiply-add per token), plus its token mixer's own work — causal attention: half of the T x T scores
// and their product with V; Gated DeltaNet: the chunked delta rule's (delta_rule_flops). Backward = 2 x forward.
// `kind` picks the layer's token mixer (hybrid models); uniform models have full attention only.
// A Mixture-of-Experts layer's MLP counts the FLOPs a token routes through: its router and k experts, not all E.
double layer_forward_flops(const ModelConfig& cfg, int64_t B, int64_t T, LayerKind kind = LayerKind::full_attention);
double layer_forward_flops(const ModelConfig& cfg, int64_t B, int64_t T, int64_t layer);  // layer `layer`'s
// The down projections' share of that (what a recompute of the internals does not run): 2·N·C·I, or ·Ie·k.
double down_projection_flops(const ModelConfig& cfg, int64_t B, int64_t T, int64_t layer);
// The chunked gated delta rule's forward FLOPs (ops/gated_delta.h, chunks of c = kDeltaChunk tokens), per value
// head and token: K·Kᵀ, Q·Kᵀ and the WY product W = A·K (c·dk each), U = A·V and the in-chunk output (c·dv each),
// and the state's three products Q·S, W·S, Kᵀ·V' (dk·dv each) — 2 FLOPs per multiply-add.
double delta_rule_flops(const ModelConfig& cfg, int64_t B, int64_t T);
// Head forward + backward: 6·N·C·V.
double head_flops(const ModelConfig& cfg, int64_t B, int64_t T);
// The MLP's share of a layer's FLOPs: how much of its backward runs before the MLP gradients can go down
// (block_backward_mlp comes first).
double mlp_flops_share(const ModelConfig& cfg, int64_t B, int64_t T, LayerKind kind = LayerKind::full_attention);
double mlp_flops_share(const ModelConfig& cfg, int64_t B, int64_t T, int64_t layer);
// Parameters of one decoder layer of `kind` with a dense MLP (the paper's 6·N·tokens convention sums these,
// embeddings and head), or of layer `layer` — a sparse layer's all E experts (the bytes it streams and updates).
int64_t layer_parameters(const ModelConfig& cfg, LayerKind kind = LayerKind::full_attention);
int64_t layer_parameters(const ModelConfig& cfg, int64_t layer);

// The machine's profile for `cfg` at B x T with compute `compute` ("bf16" for the real machines).
Profile hardware_profile(const Hardware& hw, const ModelConfig& cfg, int64_t B, int64_t T);

// A built-in machine's name or a profile JSON file (`lazytrain profile --out`), for cfg at B x T. Unknown
// names that are not files are refused with the list of built-in machines.
Profile resolve_profile(const std::string& hardware_or_file, const ModelConfig& cfg, int64_t B, int64_t T);

}  // namespace lt
