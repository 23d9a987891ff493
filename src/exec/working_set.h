// exec/working_set.h — the device memory of one step of a plan: every device buffer of its schedule
// (exec/step_schedule.h), with its lifetime and its place in device memory — the executor's memory model.
//
// The step's timeline is cut into windows: forward windows F0..F(L-1) (index l), the head window H
// (index L), backward windows B(L-1)..B0 (index 2L - l). A buffer lives from the first window in which an
// operation of the schedule uses it to the last (or over the span it reserves). Buffers whose lifetimes do not
// overlap share memory: an offline first-fit packing (deterministic) gives every buffer an offset in one device
// block, and the block's size is the peak. The executor allocates exactly that block and uses exactly these
// offsets, so predict_peak_device_bytes() — what the planner and the refusal use — is the device's measured
// peak. memory_terms() is the same memory as linear terms of a plan's choices, for the planner's solvers.
//
// Legend: N = B*T tokens, C hidden, L layers, V vocab.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "device/device.h"
#include "exec/plan.h"
#include "model/config.h"
#include "ops/linear.h"

namespace lt {

// What computes a step's layers and head (model/layer_compute.h): the CPU block and head (model/block.h,
// ops/head.h), or the CUDA block and head (cuda/layers.h: on a CUDA device, or under cuda-sim), which keep
// different buffers — the schedule counts the ones the step launches.
enum class LayerKernels : uint8_t { cpu, cuda };

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

struct DeviceBuffer {
  std::string tag;           // "weights 1", "boundary 3", "internals 5", "recompute cache 0", ...
  size_t bytes = 0;          // rounded up to kDeviceAlign
  int first_window = 0;      // the window whose work first uses it
  int last_window = 0;       // the window whose work last uses it
  unsigned streams = 0;      // a bit per StreamKind: the streams whose operations touch it
  StreamKind first_writer = StreamKind::compute;  // the stream of the first operation using it
  int source = -1;           // its StepSchedule::buffers index
  size_t offset = 0;         // in the step's device block
  // Buffers that occupied this memory earlier end by this window (-1: fresh memory). The executor makes
  // the first writer wait for all work issued before window reuse_after + 1.
  int reuse_after = -1;
  std::vector<int> previous; // indices (in WorkingSet::buffers) of those earlier buffers
};

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
  size_t host_staging_bytes = 0;       // the executor's other host buffers: gradient staging, x0, dx0, NVMe staging
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

// The working set of `plan`'s schedule.
WorkingSet plan_working_set(const ModelConfig& cfg, int64_t B, int64_t T, const Plan& plan, const ExecOptions& o);

// A window range, first .. last (inclusive).
struct WindowSpan {
  int first = 0, last = -1;
  bool contains(int w) const { return w >= first && w <= last; }
};

// The device bytes of each window as linear terms of a plan's choices — what the planner's MILP, chain DP and cost
// model constrain — read off the schedule's buffers (memory_terms): for every plan, window_bytes(plan) is the
// schedule's own per-window bytes (tests/plan check it).
struct MemoryTerms {
  std::vector<double> fixed;              // [2L + 1] the buffers every plan has (weights, ring, gradients, ...)
  std::vector<double> boundary;           // [L] boundary i kept on the device (i < L; boundary L is fixed)
  std::vector<WindowSpan> boundary_span;  // [L] from its producer to its layer's backward
  std::vector<double> internals;          // [L] layer l keeps its internals
  std::vector<WindowSpan> internals_span; // [L]
  double recompute = 0;                   // the compute's buffers for a layer that recomputes its internals
  WindowSpan recompute_span;              //   (present when any layer does)
  double cache_slot = 0;                  // one slot of the recompute cache (a boundary), per dropped depth
  WindowSpan cache_span;
  // Not device memory, read off the same schedule: the bytes of the embedding rows' download (the embedding
  // output's gradient summed per token id, at its bound f32 [N, C]; 0 when the table is frozen and the step has
  // none) — what the planner's epilogue moves; and the tokens' upload (positions, targets, the token groups).
  double dx0_download = 0;
  double token_upload = 0;
  int num_windows() const { return int(fixed.size()); }
  // Per window: fixed, the plan's device boundaries and kept internals (what every memory model counts alike).
  std::vector<double> stored_bytes(const Plan& plan) const;
  // ... and the recompute buffers and cache: the executor's bytes.
  std::vector<double> window_bytes(const Plan& plan) const;
};
MemoryTerms memory_terms(const ModelConfig& cfg, int64_t B, int64_t T, const ExecOptions& o);

// The executor's prediction of its peak device memory for a plan — what the planner and the refusal use.
inline size_t predict_peak_device_bytes(const ModelConfig& cfg, int64_t B, int64_t T, const Plan& plan,
                                        const ExecOptions& o) {
  return plan_working_set(cfg, B, T, plan, o).device_bytes();
}

}  // namespace lt
