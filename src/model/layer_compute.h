// model/layer_compute.h — the compute a streamed step launches for each layer and for the head, behind one
// interface, so the executor (exec/executor.h) runs the same schedule of copies, events and launches whatever
// computes: the CPU block and head (model/block.h, ops/head.h; make_cpu_layer_compute below) on the CPU device,
// or the GPU block and head (cuda/layers.h; cuda/gpu_compute.h) on a CUDA device — or, under cuda-sim, on the
// CPU device, which is how the GPU path is tested without a GPU.
//
// Every call runs inside a Device::launch on the compute stream: the CPU compute does the work there; the GPU
// compute enqueues kernels on the compute stream and returns. All pointers are device pointers. The binding
// (shape, token metadata, scratch) is set once per step, before its first launch, and read by every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "model/block.h"
#include "ops/head.h"
#include "ops/linear.h"

namespace lt {

// What a step hands the compute (device pointers into the step's working set; exec/working_set.h names them).
struct ComputeBinding {
  BlockShape shape{};
  TokenInfo tok{};                   // pos [N], doc_ids [B, T] or null
  // CPU compute: the f32 working copy of a layer's internals ("internals scratch", BlockActs::floats) and
  // the backward's scratch ("backward scratch", BlockScratch::floats).
  float* acts = nullptr;
  float* backward_scratch = nullptr;
  // GPU compute: the block's scratch ("block scratch", gpu_block_scratch_bytes), the stored internals of a layer
  // that does not keep them ("recompute internals", block_stored_bytes), the head's workspace, the RoPE table
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
  // Before the backward of a layer that did not keep its internals: the attention half and n2 again.
  virtual void recompute_internals(const void* x_in, const BlockView& w) = 0;
  // The backward in the executor's two halves (model/block.h): the MLP half's gradients (the layer slab's tail
  // from kMlpGradsFirst) complete first, so they download while the attention half runs. Gradients accumulate
  // into g; dx_in is written.
  virtual void backward_mlp(BlockGrads& g, const float* dx_out, void* kept, const BlockView& w) = 0;
  virtual void backward_attention(float* dx_in, BlockGrads& g, const void* x_in, void* kept,
                                  const BlockView& w) = 0;
  virtual void head(const HeadCall& call) = 0;
};

// model/block.h and ops/head.h on the host ops (or the ops cuda-sim overrides, ops/override.h).
std::unique_ptr<LayerCompute> make_cpu_layer_compute();

}  // namespace lt
