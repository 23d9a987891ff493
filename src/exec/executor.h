// exec/executor.h — the layer-streaming executor: one training step of a plan on a Device.
//
// Parameters, gradients and optimizer states live on the host (ModelSlabs). The device holds a few
// layers' weights (weight_buffers, double-buffered by default: layer l+1 uploads while l computes),
// the activations the plan keeps, and scratch. Forward streams layers 0..L-1, the head computes loss
// and its gradient, backward streams layers L-1..0 (re-streaming weights, fetching offloaded
// boundaries, recomputing dropped ones), and each layer's gradient goes device-to-host into a staging
// slab that a host worker adds into the f32 host gradients while the device moves on.
//
// Exactness: every kernel is deterministic and each plan only changes where a tensor lives or whether
// it is recomputed (by the same kernels on the same inputs), so loss and gradients are bitwise equal
// to model_forward_backward for every plan (tests/exec).
#pragma once

#include <cstdint>
#include <memory>

#include "core/aligned.h"
#include "device/device.h"
#include "exec/plan.h"
#include "exec/trace.h"
#include "exec/working_set.h"
#include "model/batch.h"
#include "model/weights.h"

namespace lt {

class NvmeStore;

struct StepStats {
  double loss_sum = 0;
  int64_t tokens = 0;
  double loss() const { return tokens ? loss_sum / double(tokens) : 0.0; }
  double step_s = 0;
  StepSummary summary;                 // measured from the trace
  size_t peak_device_bytes = 0;        // measured by the device
  size_t predicted_device_bytes = 0;   // predict_peak_device_bytes for this plan
  nlohmann::json to_json() const;
};

class StreamingExecutor {
 public:
  // `nvme` may be null; plans using the nvme tier then are refused.
  StreamingExecutor(const ModelConfig& cfg, Device& device, ExecOptions options, NvmeStore* nvme = nullptr);
  ~StreamingExecutor();

  // One step: loss of `batch` and gradients of the mean loss accumulated (+=) into `grads`.
  // `params` are the f32 masters (the embedding lookup reads them); `weights` the compute copy the
  // device streams (the same object in f32 mode, a bf16 ModelSlabs in bf16 mode).
  // A plan whose working set does not fit in the device's free memory is refused before any work,
  // with the predicted need in the message. `trace` (optional) receives every operation.
  StepStats step(ModelSlabs& grads, const ModelSlabs& params, const ModelSlabs& weights, const Batch& batch,
                 const Plan& plan, TraceRecorder* trace = nullptr);

  const ExecOptions& options() const { return options_; }

 private:
  struct Step;
  ModelConfig cfg_;
  Workspace host_ws_;  // host staging and host-tier activations, kept across steps
  Device& device_;
  ExecOptions options_;
  NvmeStore* nvme_;
};

}  // namespace lt
