// model/layer_compute.h — the compute a streamed step launches for each layer and for the head, behind one
// interface, so the executor (exec/executor.h) issues the same schedule (exec/step_schedule.h) whatever
// computes: the CPU block and head (model/block.h, ops/head.h; make_cpu_layer_compute below) on the CPU device,
// or the CUDA block and head (cuda/layers.h; cuda/layers/compute.inl) on a CUDA device — or, under cuda-sim, on the
// CPU device, which is how the GPU path is tested without a GPU.
//
// Every call runs inside a Device::launch on the compute stream: the CPU compute does the work there; the GPU
// compute enqueues kernels on the compute stream and returns. All pointers are device pointers. The binding
// (shape, token metadata, scratch) is set once per step, before its first launch, and read by every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "model/block.h"
#include "model/config.h"
#include "model/layout.h"
#include "ops/head.h"
#include "ops/linear.h"

namespace lt {

// What a step hands the compute (device pointers into the step's working set; exec/working_set.h names them).
struct ComputeBinding {
  BlockShape shape{};
  TokenInfo tok{};                   // pos [N], doc_ids [B, T] or null; the MoE auxiliary loss (CPU compute)
  // CPU compute: the f32 working copy of a layer's internals ("working copy", WorkingCopy::floats) and the
  // backward's scratch ("backward scratch", BlockScratch::floats).
  float* working_copy = nullptr;
  float* backward_scratch = nullptr;
  // GPU compute: the block's scratch ("block scratch", cuda_block_scratch_bytes), the stored internals of a layer
  // that does not keep them ("recompute internals", block_recompute_stored_bytes), the head's workspace, the RoPE table
  // cos/sin [T, D/2] ("rope table"), and the GEMMs' workspace.
  void* block_scratch = nullptr;
  void* recompute_stored = nullptr;
  void* head_workspace = nullptr;
  const float* rope_cos = nullptr;
  const float* rope_sin = nullptr;
  void* gemm_workspace = nullptr;
};

// The fused head of one step: loss and gradients of the mean loss (ops/head.h's contract).
struct HeadCall {
  float* dx = nullptr;          // [N, C] written: the gradient into the last block's output
  void* grads = nullptr;        // the head's gradient buffer, grads_bytes, zeroed first (f32)
  size_t grads_bytes = 0;
  float* dnorm_w = nullptr;     // [C] in grads
  float* dlm_w = nullptr;       // [V, C] in grads (the embedding's part of it when tied)
  const void* x = nullptr;      // [N, C] the last block's output, in the activation storage dtype
  float* x32 = nullptr;         // [N, C] f32 scratch for x widened (when the storage is not f32)
  const int32_t* targets = nullptr;  // [N] shifted labels (-100: not counted), checked by the caller
  const float* norm_w = nullptr;     // [C]
  WeightRef lm_w{};                  // [V, C]
  float grad_scale = 1.0f;
  HeadShape shape{};
  double* loss = nullptr;       // one f64 of device memory: Σ CE over counted tokens (written)
};

// The device buffers a layer compute keeps beside the step's boundaries and kept internals, declared once by the
// compute (cpu_compute_buffers below; cuda::cuda_compute_buffers) and read by every user: the step's schedule
// (exec/step_schedule.h: its memory, and the executor's binding through bind_compute_buffers), the planner's
// instance (through the schedule) and the profiler's rig (plan/measure.cpp).
enum class ComputeBufferRole : uint8_t {
  working_copy,         // CPU: the f32 working copy of one layer's internals (WorkingCopy::floats)
  backward_scratch,     // CPU: the backward's temporaries (BlockScratch::floats)
  recompute_internals,  // GPU: the attention half of a layer that does not keep its own (block_recompute_stored_bytes)
  block_scratch,        // GPU: the block's carve, forward and backward (cuda_block_scratch_bytes)
  head_workspace,       // GPU: one logits chunk (head_workspace_bytes)
  loss,                 // GPU: the head's loss, one f64, downloaded
  rope_table,           // GPU: cos then sin [T, D/2] f32 each, uploaded with the tokens
  gemm_workspace,       // GPU: cuBLASLt's split-K reductions (kGemmWorkspaceBytes)
};
// The part of the step a compute buffer is reserved for: all of it, the backward windows, or the head's window.
enum class ComputeSpan : uint8_t { step, backward, head };
struct ComputeBuffer {
  ComputeBufferRole role;
  const char* tag;     // its name in the working set: "working copy", "block scratch", ...
  size_t bytes = 0;
  ComputeSpan span = ComputeSpan::step;
  bool only_when_recomputing = false;  // needed only by plans in which some layer recomputes its internals
};
// The CPU block's and head's (model/block.h, ops/head.h): the working copy (at f32 storage only when some layer
// recomputes: a kept layer computes in its own internals then) and the backward scratch, each for the largest of
// the model's layer kinds.
std::vector<ComputeBuffer> cpu_compute_buffers(const ModelConfig& cfg, const BlockShape& s);
// The binding's pointers for `buffers` at the device addresses `ptrs` (parallel to it; null: not allocated).
void bind_compute_buffers(ComputeBinding& binding, const std::vector<ComputeBuffer>& buffers,
                          const std::vector<void*>& ptrs);

// Where a HeadCall's norm, lm_head and their gradients are in the head's device buffers: the weights one buffer
// laid out as the head slab (compute copy) followed, with tied embeddings, by the embedding slab (lm_head is the
// embedding matrix); the gradients likewise in f32. Vectors and gradients are f32 in every layout; lm_head's dtype
// follows the compute copy.
struct HeadBuffers {
  const float* norm_w = nullptr;  // [C]
  WeightRef lm_w{};               // [V, C]
  float* dnorm_w = nullptr;       // [C]
  float* dlm_w = nullptr;         // [V, C]
  size_t weights_bytes = 0, grads_bytes = 0;  // of the two buffers
};
HeadBuffers bind_head_buffers(const ModelConfig& cfg, const SlabLayout& head_w, const SlabLayout& embed_w,
                              const SlabLayout& head_g, const SlabLayout& embed_g, const void* weights, void* grads);

class LayerCompute {
 public:
  virtual ~LayerCompute() = default;
  virtual const char* name() const = 0;  // "cpu", "cuda", "cuda-sim"
  // Before a step's first launch; the binding stays valid until the device is idle again.
  virtual void bind(const ComputeBinding& binding) = 0;

  // Zeroes `bytes` (a multiple of 4) of f32 device memory.
  virtual void zero(void* ptr, size_t bytes) = 0;
  // Layer forward: x_out from x_in (the activation storage dtype). `kept` is the layer's kept internals
  // (block_stored_bytes), or null when the plan recomputes them.
  virtual void forward(void* x_out, void* kept, const void* x_in, const BlockView& w) = 0;
  // A layer's output again, for a recompute segment: forward's bits, nothing kept, and nothing added to the
  // batch's per-step sums (the MoE auxiliary loss counts each layer's routing once, in the forward).
  virtual void recompute(void* x_out, const void* x_in, const BlockView& w) = 0;
  // Before the backward of a layer that did not keep its internals: the attention half and n2 again.
  virtual void recompute_internals(const void* x_in, const BlockView& w) = 0;
  // The backward in the executor's two halves (model/block.h): the MLP half's gradients (the layer slab's tail
  // from kMlpGradsFirst) complete first, so they download while the attention half runs. Gradients accumulate
  // into g; dx_in is written.
  virtual void backward_mlp(BlockGrads& g, const float* dx_out, void* kept, const BlockView& w) = 0;
  virtual void backward_attention(float* dx_in, BlockGrads& g, const void* x_in, void* kept,
                                  const BlockView& w) = 0;
  virtual void head(const HeadCall& call) = 0;
  // The embedding backward's device half (ops/embedding.h embedding_grad_rows): rows[P, C] of each present id's
  // gradient from dx0[N, C] (f32), by the token groups start[P + 1], order[N] in device memory — P rows go to the
  // host instead of N.
  virtual void embedding_rows(float* rows, const float* dx0, const int32_t* start, const int32_t* order,
                              int64_t P) = 0;
};

// model/block.h and ops/head.h on the host ops (or the ops cuda-sim overrides, ops/override.h).
std::unique_ptr<LayerCompute> make_cpu_layer_compute();

}  // namespace lt
