// ops/override.h — a process-wide replacement of the ops' implementations, so a whole step (the in-memory
// path, the streaming executor, the profiler) can run other kernels without a second copy of the model.
// `--device cuda-sim` installs the CUDA kernels run under cuda-sim (cuda/sim_ops.h); nothing else does, and
// without one every op runs its CPU implementation. Each op reads the pointer at entry (one atomic load)
// and calls the replacement, when it has one for that op, with its own arguments.
#pragma once

#include "ops/attention.h"
#include "ops/embedding.h"
#include "ops/gated_delta.h"
#include "ops/head.h"
#include "ops/linear.h"
#include "ops/moe.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "ops/swiglu.h"

namespace lt {

struct OpsOverride {
  const char* name;  // for logs: "cuda-sim"
  decltype(&rmsnorm_forward) rmsnorm_forward_fn;
  decltype(&rmsnorm_backward) rmsnorm_backward_fn;
  decltype(&rope_forward) rope_forward_fn;
  decltype(&rope_backward) rope_backward_fn;
  decltype(&swiglu_forward) swiglu_forward_fn;
  decltype(&swiglu_backward) swiglu_backward_fn;
  decltype(&attention_forward) attention_forward_fn;
  decltype(&attention_backward) attention_backward_fn;
  decltype(&embedding_forward) embedding_forward_fn;
  decltype(&embedding_grad_rows) embedding_grad_rows_fn;
  decltype(&linear_forward) linear_forward_fn;
  decltype(&linear_backward) linear_backward_fn;
  decltype(&head_forward) head_forward_fn;
  decltype(&head_forward_backward) head_forward_backward_fn;
  // The chunked gated delta rule: the one Qwen3.5 / Qwen3.6 op whose CUDA kernel sums in another order than the
  // CPU op (its other ops' kernels give the CPU ops' bits), so the in-memory path and the CUDA block agree.
  decltype(&gated_delta_forward) gated_delta_forward_fn = nullptr;
  decltype(&gated_delta_backward) gated_delta_backward_fn = nullptr;
  // GPT-OSS's clamped SwiGLU (ops/swiglu.h) and attention sinks around the attention kernels (ops/attention.h).
  decltype(&clamped_swiglu_forward) clamped_swiglu_forward_fn = nullptr;
  decltype(&clamped_swiglu_backward) clamped_swiglu_backward_fn = nullptr;
  decltype(&attention_sinks_forward) attention_sinks_forward_fn = nullptr;
  decltype(&attention_sinks_backward) attention_sinks_backward_fn = nullptr;
  // Mixture-of-Experts routing and row shuffles (ops/moe.h; cuda/kernels/moe.cuh gives the CPU ops' bits).
  decltype(&router_forward) router_forward_fn = nullptr;
  decltype(&router_backward) router_backward_fn = nullptr;
  decltype(&moe_permute) moe_permute_fn = nullptr;
  decltype(&moe_gather) moe_gather_fn = nullptr;
  decltype(&moe_scatter_add) moe_scatter_add_fn = nullptr;
  decltype(&moe_combine_forward) moe_combine_forward_fn = nullptr;
  decltype(&moe_combine_backward) moe_combine_backward_fn = nullptr;
  decltype(&moe_weight_grads) moe_weight_grads_fn = nullptr;
  decltype(&aux_loss_accumulate) aux_loss_accumulate_fn = nullptr;
};

// The installed replacement, or nullptr (the CPU ops).
const OpsOverride* ops_override();
// Installs `o` (nullptr: back to the CPU ops). Not while a step runs.
void set_ops_override(const OpsOverride* o);

}  // namespace lt

// At the top of an op: `LT_OPS_OVERRIDE(rmsnorm_forward, out, rstd, in, weight, rows, C, eps);`
#define LT_OPS_OVERRIDE(op, ...)                                                        \
  do {                                                                                  \
    if (const ::lt::OpsOverride* lt_o = ::lt::ops_override(); lt_o && lt_o->op##_fn)    \
      return lt_o->op##_fn(__VA_ARGS__);                                                \
  } while (0)
