#include "plan/hardware.h"

#include <filesystem>
#include <fmt/format.h>

#include "core/error.h"

#include "io/paths.h"
#include "model/layout.h"
#include "ops/gated_delta.h"

namespace lt {
namespace {

constexpr double kGB = 1e9;

std::vector<Hardware> make_builtin() {
  std::vector<Hardware> v;
  {
    Hardware h;
    h.name = "h800";
    h.description = "NVIDIA H800 80 GB, PCIe Gen5 host link (the LazyTrain paper's machine)";
    h.device_memory_bytes = size_t(80e9);  // REFERENCES.md §1: "H800 80 GB"
    h.peak_tflops = 989;                   // H800 SXM = H100 SXM tensor cores: 989 TFLOPS dense BF16 (NVIDIA H100 datasheet)
    // Calibrated, not the peak: the rate at which this cost model reproduces MegaTrain's measured 171.92
    // TFLOPS (6·N·tokens convention) for Qwen2.5-14B, batch 96, seq 1024, every:4 on this machine
    // (REFERENCES.md §1; with the paper's bf16 activations): 265 gives 172.15 (docs/planner.md has the run).
    // The paper's PyTorch executor's per-layer kernels reach ~27% of peak.
    h.sustained_tflops = 265;
    h.link.h2d_gbps = 12;  // REFERENCES.md §1: "PCIe Gen5 x16 (measured 12 GB/s per direction)"
    h.link.d2h_gbps = 12;
    h.link.h2d_duplex_gbps = 12;  // the paper's figure is per direction with both in use (its windows share both)
    h.link.d2h_duplex_gbps = 12;
    h.link.latency_s = 10e-6;     // assumption: typical cudaMemcpyAsync launch + DMA set-up, not measured
    h.nvme_read_gbps = 2.83;      // REFERENCES.md §1: "NVMe 2.83 GB/s read / 3.35 GB/s write"
    h.nvme_write_gbps = 3.35;
    // Assumption (no published figure): 2x Xeon 6448Y with DDR5-4800, ~300 GB/s STREAM; accumulation
    // reads dst and src and writes dst, on the few threads the host worker gets: 50 GB/s of gradient.
    h.host_accumulate_gbps = 50;
    h.optimizer_params_per_s = 1.4e9;  // REFERENCES.md §5: DeepSpeed CPU Adam ~1.4 G params/s
    h.host_copy_gbps = 50;             // same assumption as accumulation (embedding gather / scatter)
    h.device_memory_gbps = 3350;       // H100 SXM datasheet: 3.35 TB/s HBM3 (the SXM part, as peak_tflops)
    v.push_back(h);
  }
  {
    Hardware h;
    h.name = "h200";
    h.description = "NVIDIA H200 141 GB, PCIe Gen5 host link";
    h.device_memory_bytes = size_t(141e9);  // NVIDIA H200 datasheet: 141 GB HBM3e
    h.peak_tflops = 989;                    // NVIDIA H200 datasheet: 989 TFLOPS dense BF16 (same tensor cores as H100)
    h.sustained_tflops = 265;               // same GH100 compute as the H800: the H800's calibrated rate
    h.link.h2d_gbps = 53;   // REFERENCES.md §6: "PCIe 5.0 ~35–53 GB/s (asymmetric)": the faster end up
    h.link.d2h_gbps = 35;   // and the slower end down (assumption on which direction is which)
    h.link.h2d_duplex_gbps = 26;  // assumption: about half of h2d when both directions are busy (REFERENCES.md
    h.link.d2h_duplex_gbps = 26;  // §6 reports 11–16 GB/s each on Gen4 under duplex load, ~half of alone)
    h.link.latency_s = 10e-6;     // assumption, as h800
    h.nvme_read_gbps = 7;         // REFERENCES.md §6: "NVMe Gen4 ~7 / 5 GB/s read/write" (a typical drive)
    h.nvme_write_gbps = 5;
    h.host_accumulate_gbps = 50;  // assumption, as h800
    h.optimizer_params_per_s = 1.4e9;  // REFERENCES.md §5 (DeepSpeed CPU Adam)
    h.host_copy_gbps = 50;
    h.device_memory_gbps = 4800;  // NVIDIA H200 datasheet: 4.8 TB/s HBM3e
    v.push_back(h);
  }
  {
    Hardware h;
    h.name = "rtx3090";
    h.description = "NVIDIA RTX 3090 24 GB, PCIe Gen4 x16 host link";
    h.device_memory_bytes = size_t(24e9);  // 24 GB GDDR6X (NVIDIA GA102 whitepaper, appendix A)
    h.peak_tflops = 71;                    // GA102 whitepaper: RTX 3090 BF16 tensor with FP32 accumulate, dense
    // Derived from MegaTrain's measured 33.18 TFLOPS (6·N·tokens) for Qwen2.5-3B at batch 7 on this card
    // (REFERENCES.md §1): every:4 runs 4.75/3 of the 6·N·tokens FLOPs, so the card sustained ~52.5 TFLOPS
    // (74% of peak). End to end this model predicts less (docs/planner.md): the host optimizer at §5's
    // 1.4 G params/s does not hide under a batch-7 forward.
    h.sustained_tflops = 52.5;
    h.link.h2d_gbps = 25;         // REFERENCES.md §6: "PCIe 4.0 x16 pinned 24–27 GB/s"
    h.link.d2h_gbps = 25;
    h.link.h2d_duplex_gbps = 13.5;  // REFERENCES.md §6: "both directions busy at once can drop to 11–16 GB/s each"
    h.link.d2h_duplex_gbps = 13.5;
    h.link.latency_s = 10e-6;
    h.nvme_read_gbps = 7;         // REFERENCES.md §6: "NVMe Gen4 ~7 / 5 GB/s read/write"
    h.nvme_write_gbps = 5;
    // Assumption: a desktop with dual-channel DDR4, ~40 GB/s STREAM: a third of it for accumulation.
    h.host_accumulate_gbps = 13;
    h.optimizer_params_per_s = 1.4e9;  // REFERENCES.md §5: DeepSpeed CPU Adam ~1.4 G params/s (hardware unstated)
    h.host_copy_gbps = 13;
    h.device_memory_gbps = 936;  // GA102 whitepaper, appendix A: RTX 3090 936 GB/s GDDR6X
    v.push_back(h);
  }
  return v;
}

}  // namespace

const std::vector<Hardware>& builtin_hardware() {
  static const std::vector<Hardware> hw = make_builtin();
  return hw;
}

const Hardware* find_hardware(const std::string& name) {
  for (const Hardware& h : builtin_hardware())
    if (h.name == name) return &h;
  return nullptr;
}

std::string hardware_names() {
  std::string s;
  for (const Hardware& h : builtin_hardware()) s += (s.empty() ? "" : ", ") + h.name;
  return s;
}

int64_t layer_parameters(const ModelConfig& cfg, LayerKind kind) {
  return SlabLayout::make(cfg, SlabKind::layer, DType::f32, kind).num_parameters();
}

int64_t layer_parameters(const ModelConfig& cfg, int64_t layer) {
  return SlabLayout::make_layer(cfg, layer).num_parameters();
}

namespace {

// A layer's MLP forward FLOPs per token: 2 per weight of the matrices a token multiplies — the dense MLP's three,
// or a sparse layer's router, its k routed experts' (not all E) and the shared expert with its gate.
double mlp_flops_per_token(const ModelConfig& cfg, bool sparse) {
  const double C = double(cfg.hidden_size);
  if (!sparse) return 6.0 * C * double(cfg.intermediate_size);
  const double Is = double(cfg.shared_expert_intermediate_size);
  return 2.0 * C * double(cfg.num_experts) +
         6.0 * C * double(cfg.moe_intermediate_size) * double(cfg.num_experts_per_tok) +
         (Is > 0 ? 6.0 * C * Is + 2.0 * C : 0.0);
}

}  // namespace

double delta_rule_flops(const ModelConfig& cfg, int64_t B, int64_t T) {
  const double c = double(kDeltaChunk), dk = double(cfg.linear_key_head_dim), dv = double(cfg.linear_value_head_dim);
  const double per_head_token = 2.0 * (3.0 * c * dk + 2.0 * c * dv + 3.0 * dk * dv);
  return double(B) * double(T) * double(cfg.linear_num_value_heads) * per_head_token;
}

namespace {

double forward_flops(const ModelConfig& cfg, int64_t B, int64_t T, LayerKind kind, bool sparse) {
  const double N = double(B) * double(T);
  double weights = 0;  // the token mixer's matrices and convolution kernels: one multiply-add per weight and token
  const SlabLayout layout = SlabLayout::make(cfg, SlabKind::layer, DType::f32, kind);
  for (const SlabEntry& e : layout.entries())
    if (e.shape.size() >= 2 && !e.name.starts_with("mlp.")) weights += double(e.numel());
  // Causal attention: Q·Kᵀ and P·V each 2·D per (query, key) pair and head, T²/2 pairs a row under the mask; a
  // sliding layer's query sees at most W keys: T·W − W²/2 pairs (T > W).
  const double Td = double(T), W = double(cfg.sliding_window);
  const double pairs = kind == LayerKind::sliding_attention && Td > W ? Td * W - W * W / 2 : Td * Td / 2;
  const double mixer = kind == LayerKind::linear_attention
                           ? delta_rule_flops(cfg, B, T)
                           : 4.0 * double(B) * double(cfg.num_heads) * pairs * double(cfg.head_dim);
  return 2.0 * N * weights + mixer + N * mlp_flops_per_token(cfg, sparse);
}

}  // namespace

double layer_forward_flops(const ModelConfig& cfg, int64_t B, int64_t T, LayerKind kind) {
  return forward_flops(cfg, B, T, kind, false);
}

double layer_forward_flops(const ModelConfig& cfg, int64_t B, int64_t T, int64_t layer) {
  return forward_flops(cfg, B, T, cfg.layer_kind(layer), cfg.sparse_layer(layer));
}

double mlp_flops_share(const ModelConfig& cfg, int64_t B, int64_t T, LayerKind kind) {
  return double(B) * double(T) * mlp_flops_per_token(cfg, false) / layer_forward_flops(cfg, B, T, kind);
}

double mlp_flops_share(const ModelConfig& cfg, int64_t B, int64_t T, int64_t layer) {
  return double(B) * double(T) * mlp_flops_per_token(cfg, cfg.sparse_layer(layer)) /
         layer_forward_flops(cfg, B, T, layer);
}

double down_projection_flops(const ModelConfig& cfg, int64_t B, int64_t T, int64_t layer) {
  const double per_token = cfg.sparse_layer(layer) ? double(cfg.moe_intermediate_size) *
                                                          double(cfg.num_experts_per_tok) +
                                                      double(cfg.shared_expert_intermediate_size)
                                                : double(cfg.intermediate_size);
  return 2.0 * double(B) * double(T) * double(cfg.hidden_size) * per_token;
}

double head_flops(const ModelConfig& cfg, int64_t B, int64_t T) {
  return 6.0 * double(B) * double(T) * double(cfg.hidden_size) * double(cfg.vocab_size);
}

Profile hardware_profile(const Hardware& hw, const ModelConfig& cfg, int64_t B, int64_t T) {
  Profile p;
  p.name = hw.name;
  p.source = fmt::format("built-in {}: compute = FLOPs / {:g} TFLOPS sustained (peak {:g}); links and disks from "
                         "published figures (src/plan/hardware.cpp)",
                         hw.name, hw.sustained_tflops, hw.peak_tflops);
  p.batch = B;
  p.seq = T;
  p.compute = "bf16";
  p.activations = "bf16";
  p.layer_kernels = LayerKernels::cuda;  // a GPU runs the CUDA block (bf16 activations)
  const double rate = hw.sustained_tflops * 1e12;
  // Recomputing a layer's internals runs its forward but the down projection (model/block.h).
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    const double fwd = layer_forward_flops(cfg, B, T, l) / rate;
    p.forward_s.push_back(fwd);
    p.recompute_s.push_back(fwd - down_projection_flops(cfg, B, T, l) / rate);
    p.backward_s.push_back(2.0 * fwd);
  }
  p.head_s = head_flops(cfg, B, T) / rate;
  const double act_bytes = double(B) * double(T) * double(cfg.hidden_size) * 4.0;
  p.embed_forward_s = act_bytes / (hw.host_copy_gbps * kGB);
  // The embedding rows read dx0 [N, C] f32 and write at most as much (P <= N ids); the host then adds them.
  p.embed_rows_s = 2 * act_bytes / (hw.device_memory_gbps * kGB);
  p.embed_backward_s = act_bytes / (hw.host_copy_gbps * kGB);
  p.accumulate_gbps = hw.host_accumulate_gbps;
  p.optimizer_params_per_s = hw.optimizer_params_per_s;
  p.optimizer_note = "built-in figure (src/plan/hardware.cpp)";
  p.link = hw.link;
  p.nvme_read_gbps = hw.nvme_read_gbps;
  p.nvme_write_gbps = hw.nvme_write_gbps;
  p.nvme_note = "built-in figure (src/plan/hardware.cpp)";
  p.device_memory_bytes = hw.device_memory_bytes;
  p.sustained_tflops = hw.sustained_tflops;
  return p;
}

Profile resolve_profile(const std::string& spec, const ModelConfig& cfg, int64_t B, int64_t T) {
  if (const Hardware* hw = find_hardware(spec)) return hardware_profile(*hw, cfg, B, T);
  LT_CHECK(path_exists(spec),
           "--hardware '{}' is neither a built-in machine ({}) nor a profile file (make one with `lazytrain profile`)",
           spec, hardware_names());
  Profile p = Profile::load(spec);
  LT_CHECK(p.num_layers() == cfg.num_layers, "profile {} has {} layers, the model has {}: profile this model", spec,
           p.num_layers(), cfg.num_layers);
  return scale_profile(p, B, T);
}

}  // namespace lt
