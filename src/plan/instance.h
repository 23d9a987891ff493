// plan/instance.h — one planning problem: a model at a batch shape, a profile, memory budgets, and the
// executor's buffer sizes, reduced to the numbers the cost model, the MILP, the DP and the simulator use.
//
// The step's timeline is cut into 2L + 1 windows, in the order the executor runs them (the same indices
// as WorkingSet::window_bytes):
//   F0 .. F(L-1)   forward of layer l          window l
//   H              head forward + backward     window L
//   B(L-1) .. B0   backward of layer k         window 2L - k
// Layers may differ (Qwen3.5 / Qwen3.6 interleave Gated DeltaNet and gated attention layers): each layer's kept
// internals, weight and gradient bytes, accumulation, optimizer update and FLOPs are its own ([L] vectors); the
// device buffers every layer passes through (weights, gradients, the working copy, scratch) have the largest
// layer's size, as the executor's schedule declares them (exec/step_schedule.h).
//
// Legend: L layers, B batch rows, T tokens per row, N = B*T, C hidden. The instance's short names, once:
//   A      one boundary [N, C] in the activation storage dtype (bytes; A_nvme: on NVMe, page-rounded)
//   W, G   the largest layer's weights (compute copy) and gradients (f32): one weight / gradient buffer
//   Wl, Gl [L] layer l's weights and gradients, as its uploads and downloads move them
//   HW, HG the head's weights and gradients (lm_head included when tied)
//   f, b, r [L] seconds of layer l's forward, backward, and what recomputing its internals adds
//   mem    the device memory per window, as linear terms of the plan (MemoryTerms)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "exec/plan.h"
#include "exec/working_set.h"
#include "model/config.h"
#include "plan/profile.h"

namespace lt {

// Which device-memory model the planner constrains, per window.
enum class MemoryModel : uint8_t {
  // The executor's: its schedule's buffers with their lifetimes, as linear terms of the plan (MemoryTerms): the
  // compute's recompute buffers over their span and the recompute cache (at the deepest run) over the backward
  // whenever any layer needs them.
  executor,
  // Finer lifetimes (what an executor that frees per window could reach): the scratch and recompute output
  // only in windows that recompute, the recompute cache only as deep as the run being rebuilt.
  lifetime,
};
const char* memory_model_name(MemoryModel m);

struct Budgets {
  size_t device_bytes = 0;     // device memory the plan may use
  size_t host_act_bytes = 0;   // host memory for host-tier activations (and NVMe staging)
  size_t nvme_bytes = 0;       // NVMe space for the nvme tier
};

struct InstanceOptions {
  ExecOptions exec;
  MemoryModel memory = MemoryModel::executor;
  bool allow_host = true;
  bool allow_nvme = true;          // needs a budget and a profile with NVMe bandwidth as well
  bool include_optimizer = true;   // add the host optimizer's exposed part to the objective
  // Windows a transfer may use. An offload of boundary i may spread over F(i) .. F(i + offload_span - 1),
  // a reload over the reload_span windows before B(i); NVMe writes and reads over nvme_span windows.
  // The executor's boundary ring (3 slots) holds exactly the boundaries in flight for spans of 2.
  int offload_span = 2;
  int reload_span = 2;
  int nvme_span = 8;
  // The restricted chain problem the DP solves exactly: device and host tiers only, each transfer in its
  // natural window (offload in F(i), reload in the window before B(i)), no optimizer term.
  bool restricted = false;
  // Data parallel (docs/distributed.md): `ranks` processes, each this instance's micro-batch, exchanging over a
  // network of `net_gbps` GB/s per rank in each direction. Each layer's host accumulation then also moves
  // (N-1)/N of its gradients each way (owners add all N contributions: the same adds as one process), the
  // embedding backward every rank's dx0 rows, and each slab's update covers 1/N of it, then allgathers the
  // updated masters and compute copy ((N-1)/N of them each way).
  int ranks = 1;
  double net_gbps = 0;
  int optimizer_state_bits = 8;  // the host memory line: 8-bit or f32 states for the large matrices
};

struct Instance {
  ModelConfig cfg;
  int64_t L = 0, B = 0, T = 0;
  InstanceOptions opt;
  MemoryModel memory = MemoryModel::executor;
  bool allow_host = true, allow_nvme = false, restricted = false;
  Budgets budget;

  // Bytes (each rounded up to the device's 256-byte allocation unit, as the working set counts them).
  double A = 0;        // one boundary [N, C] in the activation storage dtype
  double dx0 = 0;      // the embedding rows' download, at its bound [N, C] f32, for the host's add (mem's)
  double A_nvme = 0;   // one boundary on NVMe (4 KiB pages)
  // The executor's device memory per window as linear terms of the plan (exec/working_set.h: memory_terms, read
  // off the executor's schedule): what every plan takes, each device boundary's and kept internals' bytes over
  // their spans (mem.internals[l]: layer l's kept internals), the compute's recompute buffers, the recompute cache.
  MemoryTerms mem;
  double fixed_window(int w) const { return mem.fixed[size_t(w)]; }  // what every plan takes in window w
  double fixed_peak() const;                                         // the largest of them
  double recompute_scratch() const { return mem.recompute; }         // what a plan adds when some layer recomputes
  double W = 0;        // the largest layer's weights (compute copy): one weight buffer
  double G = 0;        // the largest layer's gradients (f32): one gradient buffer
  std::vector<double> Wl, Gl;  // [L] layer l's weights and gradients, as its uploads and downloads move them
  double weights_of(int64_t a, int64_t b) const;  // Σ Wl over layers a .. b-1 (a recompute segment's uploads)
  double HW = 0, HG = 0;  // head weights / gradients (lm_head counted here when tied)
  double token_upload = 0;  // uploaded each step: positions, targets, the embedding's token groups (mem's)
  // Times (seconds).
  std::vector<double> f, b, r;  // [L] forward, backward, recompute
  double head = 0, embed_f = 0, embed_b = 0;
  double embed_rows = 0;  // device: the embedding backward's rows, after the last layer's backward
  std::vector<double> acc;             // [L] host accumulation of layer l's gradients
  double acc_head = 0;                 // ... of the head's
  double bw_h2d = 0, bw_d2h = 0;       // bytes/s
  double bw_sum = 0;                   // h2d + d2h bytes/s with both busy; 0 = no joint limit
  double latency = 0;
  double bw_nvme_r = 0, bw_nvme_w = 0; // bytes/s; 0 = no NVMe
  std::vector<double> opt_layer;      // [L] host optimizer seconds of layer l's slab (all 0 = off)
  double opt_embed = 0, opt_head = 0;  // ... of the embedding's and the head's
  // One process splits the embedding's update (exec/step_schedule.h split_embedding_update): the rows the batch
  // looks up first, at their bound min(N, V) of the V rows, then the rest after the layers'. 0: not split.
  double opt_embed_rows = 0;
  double opt_embed_first() const { return opt_embed_rows > 0 ? opt_embed_rows : opt_embed; }  // the lookup waits
  double opt_embed_rest() const { return opt_embed - opt_embed_first(); }  // after the layers', before the head's
  bool has_optimizer() const;
  // opt_embed_first + the updates of layers 0 .. l-1: when layer l's update can start
  double opt_before(int64_t l) const;
  // The executor's window fence at B(L-1): when its working set packs a backward buffer into memory that a
  // buffer the d2h stream read used (the head's gradients), B(L-1)'s compute waits for the head gradients'
  // download (WorkingSet::fence_waits; cost_model.h: the fence term).
  bool head_fence = false;
  int64_t parameters = 0;  // active per token (ModelConfig::num_active_parameters): the 6·N·D convention's N
  // Data parallel: bytes each rank sends (and receives) per micro-batch and per optimizer step.
  double exchange_micro_bytes = 0, exchange_step_bytes = 0;
  std::vector<double> layer_flops;           // [L] forward FLOPs of layer l
  double head_flops = 0;                     // head forward + backward
  std::vector<double> mlp_share;             // [L] of layer l's backward, the MLP half (mlp_flops_share)
  std::vector<double> mlp_grad_share;        // [L] of its gradient bytes, the MLP half's (downloaded first)
  std::string profile_name;

  int num_windows() const { return int(2 * L + 1); }
  int fwd(int64_t l) const { return int(l); }
  int head_window() const { return int(L); }
  int bwd(int64_t k) const { return int(2 * L - k); }
  std::string window_name(int w) const;  // "F3", "H", "B5"
  // The lowest layer the forward leaves in a weight buffer. The backward reuses those until its first upload
  // (exec/weight_buffers.h), so a backward window uploads no weights while the source boundary of what it
  // needs is at or above this layer.
  int64_t first_resident() const { return L > opt.exec.weight_buffers ? L - opt.exec.weight_buffers : 0; }
  int window_from_name(const std::string& name) const;  // -1 if not a window

  // What the download in backward window B(k) carries (the gradients of the layer above, or the head's), and
  // the host's accumulation of it; the epilogue takes layer 0's.
  double grads_down(int64_t k) const;
  double accumulate_in(int64_t k) const;
  // Host time of the step's prologue (embedding lookup, first uploads) and epilogue (layer 0's gradients out while
  // the device sums the embedding rows, the rows out while the host adds layer 0's, the host adds the rows).
  double prologue() const;
  double epilogue() const;
};

// Builds the instance; checks the profile matches the model (layer count) and the budgets are usable.
Instance make_instance(const ModelConfig& cfg, int64_t B, int64_t T, const Profile& profile, const Budgets& budget,
                       const InstanceOptions& options);

// Boundary 0 is the embedding output, which stays on the host: "drop" there means "host" (the executor
// uploads it again). Returns the plan with that spelled out.
Plan normalize_plan(const Plan& p);

}  // namespace lt
