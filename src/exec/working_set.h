// exec/working_set.h — every device buffer one step of a plan needs, by name; the executor's memory
// model. The executor allocates exactly these buffers (and nothing else) on the device, so the
// planner's memory prediction and the executor's real usage come from one function.
//
// Legend: N = B*T tokens, C hidden, L layers, V vocab.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "exec/plan.h"
#include "model/block.h"
#include "model/config.h"
#include "ops/linear.h"

namespace lt {

struct ExecOptions {
  ComputeType compute = ComputeType::f32;
  int weight_buffers = 2;    // layer weight buffers on the device (2 = double buffering)
  int grad_buffers = 2;      // layer gradient buffers on the device (and host staging slabs)
  int boundary_ring = 3;     // transient boundary buffers (dropped / offloaded boundaries in flight)
};

struct DeviceBuffer {
  std::string tag;   // "weights", "boundary 3", "internals 5", ...
  size_t bytes;
  int count = 1;
};

struct WorkingSet {
  std::vector<DeviceBuffer> buffers;
  // Longest run of consecutive dropped boundaries a backward recompute must rebuild at once.
  int64_t recompute_depth = 0;
  // Bytes the device hands out for all of them (each allocation rounded to the device's 256 B): the
  // peak, max over window_bytes.
  size_t device_bytes() const;
  // Device bytes alive in each window of the step: forward windows F0..F(L-1) (index 0..L-1), the head
  // window (index L), backward windows B(L-1)..B0 (index L+1..2L). Today every buffer lives for the
  // whole step, so every window holds the same total; lifetime-aware reuse will make them differ.
  std::vector<size_t> window_bytes;
  // Host memory for activations (host tier) and staging; NVMe bytes for the nvme tier.
  size_t host_activation_bytes = 0;
  size_t nvme_bytes = 0;
};

constexpr size_t kDeviceAlign = 256;

WorkingSet plan_working_set(const ModelConfig& cfg, int64_t B, int64_t T, const Plan& plan, const ExecOptions& o);

// The executor's prediction of its peak device memory for a plan — what the planner and the refusal use.
inline size_t predict_peak_device_bytes(const ModelConfig& cfg, int64_t B, int64_t T, const Plan& plan,
                                        const ExecOptions& o) {
  return plan_working_set(cfg, B, T, plan, o).device_bytes();
}

}  // namespace lt
