// exec/working_set.h — every device buffer one step of a plan needs, by name, with its lifetime and
// its place in device memory: the executor's memory model.
//
// The step's timeline is cut into windows: forward windows F0..F(L-1) (index l), the head window H
// (index L), backward windows B(L-1)..B0 (index 2L - l). Each buffer lives from the window whose work
// first writes it to the window whose work last reads it. Buffers whose lifetimes do not overlap share
// memory: an offline first-fit packing (largest first, deterministic) gives every buffer an offset in one
// device block, and the block's size is the peak. The executor allocates exactly that block and uses
// exactly these offsets, so predict_peak_device_bytes() — what the planner and the refusal use — is the
// device's measured peak, and the packing is the memory plan the planner's per-window model bounds.
//
// Legend: N = B*T tokens, C hidden, L layers, V vocab.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "device/device.h"
#include "exec/plan.h"
#include "model/block.h"
#include "model/config.h"
#include "ops/linear.h"

namespace lt {

// What computes a step's layers and head (model/layer_compute.h): the CPU block and head (model/block.h,
// ops/head.h), or the GPU block and head (cuda/layers.h: on a CUDA device, or under cuda-sim), which keep
// different scratch — the working set counts the one the step launches.
enum class LayerKernels : uint8_t { cpu, gpu };

struct ExecOptions {
  ComputeType compute = ComputeType::f32;
  LayerKernels kernels = LayerKernels::cpu;
  DType activations = DType::f32;  // activation storage (model/block.h): boundaries and kept internals
  int64_t mlp_chunk_tokens = 0;    // tokens per MLP chunk (model/block.h; a multiple of kTokenSlice), 0: one
  int weight_buffers = 2;    // layer weight buffers on the device (2 = double buffering)
  int grad_buffers = 2;      // layer gradient buffers on the device (and host staging slabs)
  int boundary_ring = 3;     // transient boundary buffers (dropped / offloaded boundaries in flight)
  // The head's weights in memory of their own for the whole step (not shared with the backward's buffers),
  // so that the micro-batches of one optimizer step after the first do not upload them again.
  bool resident_head = false;
};

// A model's layer sizes where its layers may differ (Qwen3.5 / 3.6 hybrids: Gated DeltaNet and attention layers):
// the weight and gradient buffers hold the largest layer slab; each kept layer holds its own kind's internals; the
// CPU block's working copy and backward scratch fit the largest kind. One place for the working set and the
// executor. `s` is the model-wide block shape (BlockShape::make).
struct LayerBytes {
  size_t weights = 0;          // max over layers of the compute-copy slab
  size_t grads = 0;            // max over layers of the f32 slab
  std::vector<size_t> stored;  // [L] block_stored_bytes of each layer's shape
  size_t acts_floats = 0;      // max BlockActs::floats (the CPU working copy)
  size_t scratch_floats = 0;   // max BlockScratch::floats
  static LayerBytes make(const ModelConfig& cfg, const BlockShape& s, DType matrices);
};

// The GPU layer compute's buffers beside the layers' kept internals, in bytes (cuda/layers.h's sizes): one place for
// the working set, the executor's binding (ComputeBinding), the profiler and the planner's memory model.
struct GpuComputeBytes {
  size_t block_scratch = 0;        // gpu_block_scratch_bytes: forward and backward
  size_t recompute_internals = 0;  // block_stored_bytes: a layer that does not keep its internals
  size_t head_workspace = 0;       // head_workspace_bytes: one logits chunk
  size_t loss = sizeof(double);    // the head's loss, downloaded
  int64_t rope_half = 0;           // T·D/2: the RoPE table is cos then sin, [T, D/2] f32 each
  size_t rope_table = 0;           // 2·rope_half f32
  size_t gemm_workspace = 0;       // kGemmWorkspaceBytes: cuBLASLt's split-K reductions
  static GpuComputeBytes make(const ModelConfig& cfg, const BlockShape& s, DType matrices);
};

struct DeviceBuffer {
  std::string tag;           // "weights 1", "boundary 3", "internals 5", "recompute cache 0", ...
  size_t bytes = 0;          // rounded up to kDeviceAlign
  int first_window = 0;      // the window whose work first writes it
  int last_window = 0;       // the window whose work last reads it
  size_t offset = 0;         // in the step's device block
  // Buffers that occupied this memory earlier end by this window (-1: fresh memory). The executor makes
  // the first writer wait for all work issued before window reuse_after + 1.
  int reuse_after = -1;
  std::vector<int> previous; // indices (in WorkingSet::buffers) of those earlier buffers
  int count = 1;             // always 1 (kept for readers that sum count * bytes)
};

// Which streams touch a buffer (a bit per StreamKind) and which one writes it first — the executor's
// use of each buffer, by tag. An unknown tag touches every stream.
unsigned buffer_streams(const std::string& tag);
StreamKind buffer_first_writer(const std::string& tag);

// A window fence: when window `window` begins, stream `writer` waits until stream `on` has finished all
// work issued before window `after` + 1 — because a buffer `writer` first writes in this window takes
// memory that an earlier buffer, which `on` touched, used until window `after`. Only the first writer
// waits (the new buffer's readers wait for its writer anyway) and only for streams that touched the
// previous occupant, so everything else keeps prefetching across the window.
struct FenceWait {
  StreamKind writer, on;
  int after;
};

struct WorkingSet {
  std::vector<DeviceBuffer> buffers;
  size_t peak_bytes = 0;               // the packed block: max over buffers of offset + bytes
  // Device bytes taken in each window (Σ of the live buffers, and of a downloaded buffer one window past its
  // last, which nothing starting then may reuse; index as above). The packed peak is at least their max
  // (packing can leave holes), and equals it in the common cases.
  std::vector<size_t> window_bytes;
  // Longest run of consecutive dropped boundaries a backward recompute must rebuild at once.
  int64_t recompute_depth = 0;
  size_t host_activation_bytes = 0;    // host-tier boundaries
  size_t nvme_bytes = 0;               // nvme-tier boundaries
  size_t device_bytes() const { return peak_bytes; }
  // [window] the fences each window's beginning needs (see FenceWait), one per (writer, on) pair.
  std::vector<std::vector<FenceWait>> fence_waits() const;
  const DeviceBuffer& buffer(const std::string& tag) const;  // error naming the tag if absent
};

constexpr size_t kDeviceAlign = 256;

// Window indices of the step timeline.
inline int forward_window(int64_t l) { return int(l); }
inline int head_window(int64_t L) { return int(L); }
inline int backward_window(int64_t L, int64_t l) { return int(2 * L - l); }
// Their names in plan files and messages: "F3", "H", "B5"; window_parse gives -1 for anything else.
std::string window_name(int w, int64_t L);
int window_parse(const std::string& name, int64_t L);

WorkingSet plan_working_set(const ModelConfig& cfg, int64_t B, int64_t T, const Plan& plan, const ExecOptions& o);

// The executor's prediction of its peak device memory for a plan — what the planner and the refusal use.
inline size_t predict_peak_device_bytes(const ModelConfig& cfg, int64_t B, int64_t T, const Plan& plan,
                                        const ExecOptions& o) {
  return plan_working_set(cfg, B, T, plan, o).device_bytes();
}

}  // namespace lt
