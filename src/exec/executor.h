// exec/executor.h — the layer-streaming executor: one training step of a plan on a Device.
//
// Parameters, gradients and optimizer states live on the host (ModelSlabs). The device holds a few
// layers' weights (weight_buffers, double-buffered by default: layer l+1 uploads while l computes),
// the activations the plan keeps, and the compute's buffers. Forward streams layers 0..L-1, the head computes
// loss and its gradient, backward streams layers L-1..0 (re-streaming weights, fetching offloaded
// boundaries, recomputing dropped ones), and each layer's gradient goes device-to-host into a staging
// slab that a host worker adds into the f32 host gradients while the device moves on. The order of all of it,
// what waits for what and every buffer's place is the step's schedule (exec/step_schedule.h), which step()
// builds and issues; the simulator times the same schedule.
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
#include "model/layer_compute.h"
#include "model/weights.h"
#include "optim/adamw.h"
#include "optim/clip.h"

namespace lt {

class NvmeStore;

struct StepStats {
  double loss_sum = 0;
  int64_t tokens = 0;
  double moe_aux_loss = 0;  // MoE models: the batch's load-balancing loss (model/moe_ffn.h; 0 for dense models)
  double loss() const { return tokens ? loss_sum / double(tokens) : 0.0; }
  double step_s = 0;
  StepSummary summary;                 // measured from the trace
  size_t peak_device_bytes = 0;        // measured by the device
  size_t predicted_device_bytes = 0;   // predict_peak_device_bytes for this plan
  nlohmann::json to_json() const;
};

// Data parallel (dist/data_parallel.h): each micro-batch's gradient, as it reaches host memory, goes to a reducer
// instead of being added into the host gradients here. Called on the executor's host lane, slab by slab in the
// same order on every rank (embedding last); the reducer keeps the norm partials of what it owns (GradTarget's
// partials are then not set by the executor). `mode` is the step's: overwrite for its first micro-batch.
class GradReducer {
 public:
  virtual ~GradReducer() = default;
  // A layer's or the head's gradient `src` (src_layout) for the f32 slab `dst` (dst_layout).
  virtual void slab(SlabKind kind, int64_t layer, uint8_t* dst, const SlabLayout& dst_layout, const uint8_t* src,
                    const SlabLayout& src_layout, GradMode mode) = 0;
  // The embedding table's gradient: with tied embeddings first lm_head's part (`tied_part`, the embedding slab's
  // layout; null when untied), then the embedding rows [P, C] added at their ids `present` [P] (ops/embedding.h
  // embedding_add_rows), as one process applies them micro-batch by micro-batch.
  virtual void embedding(uint8_t* table, const SlabLayout& layout, const uint8_t* tied_part, const float* rows,
                         const int32_t* present, int64_t P, GradMode mode) = 0;
};

// Where the step's gradients go. The executor adds each slab's gradient into the f32 host gradients with
// the optimizer's accumulate (which returns that slab's Σ g² in the same pass) and records the partials.
struct GradTarget {
  GradNormPartials* partials = nullptr;  // per slab Σ g² of the accumulated gradient (null: not needed)
  GradMode mode = GradMode::add;         // overwrite: the first micro-batch of a step (saves zeroing)
  // The loss is the mean over this many counted tokens (all micro-batches of the optimizer step, so the
  // loss is weighted by tokens across them); 0: this batch's own count.
  int64_t tokens_in_step = 0;
  GradReducer* reducer = nullptr;  // data parallel: the gradients go there (partials unset)
  // MoE models: ∂objective/∂aux of this batch's load-balancing loss — the coefficient over the step's micro-batches
  // (0: the loss is computed and reported, its gradient left out).
  double moe_aux_weight = 0;
};

// The previous step's optimizer update, run slab by slab on the host worker while this step's forward
// streams: the embedding before the lookup, layer l before layer l's upload, the head before the head's.
// Each slab is updated with the gradient of the previous step before this step's gradient touches it,
// so the pipeline is exact (the same bits as updating everything, then stepping), not stale.
struct PendingUpdate {
  HybridAdamW* optimizer = nullptr;
  StepArgs args;
  ModelSlabs* compute_copy = nullptr;  // the bf16 weights the device streams, rewritten in the same pass
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
  //
  // `weights_version` names the contents of `weights` after this step's pending update (0: unknown). When
  // a step has no pending update and the same non-zero version and weights object as the step before it
  // — the micro-batches of one optimizer step under gradient accumulation — the layers the previous
  // backward left in the weight buffers (its last layers: 1, 0 with two buffers) are not uploaded again:
  // the forward starts on them while the next ones stream in. The caller must change the version
  // whenever it changes the weights.
  StepStats step(ModelSlabs& grads, const ModelSlabs& params, const ModelSlabs& weights, const Batch& batch,
                 const Plan& plan, TraceRecorder* trace = nullptr, const PendingUpdate* update = nullptr,
                 GradTarget target = {}, uint64_t weights_version = 0);

  // The step's device block stays allocated between steps of the same plan and shape (its weight buffers
  // carry layers to the next micro-batch); this frees it.
  void release_device_memory();

  const ExecOptions& options() const { return options_; }

 private:
  struct Step;
  ModelConfig cfg_;
  Workspace host_ws_;  // host staging and host-tier activations, kept across steps (pinned: Device::pin_host)
  Device& device_;
  ExecOptions options_;
  NvmeStore* nvme_;
  std::unique_ptr<LayerCompute> compute_;  // options_.kernels' compute for device_
  // The packed working set of the last step, kept for the next one with the same plan and shape.
  void* block_ = nullptr;
  std::string block_key_;
  // What its weight buffers hold after the last step (-1: nothing usable), and for which weights.
  std::vector<int64_t> carried_;
  uint64_t carried_version_ = 0;
  const ModelSlabs* carried_weights_ = nullptr;
  bool carried_head_ = false;  // the head's weights too (ExecOptions::resident_head)
};

}  // namespace lt
