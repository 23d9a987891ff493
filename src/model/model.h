// model/model.h — the in-memory reference path: the whole model's forward and backward for one
// batch with every activation kept. Every streaming plan must reproduce its bits.
#pragma once

#include <cstdint>

#include "core/aligned.h"
#include "model/batch.h"
#include "model/block.h"
#include "model/weights.h"
#include "ops/linear.h"

namespace lt {

struct LossResult {
  double loss_sum = 0;  // Σ cross-entropy over counted tokens
  int64_t tokens = 0;   // counted tokens
  double moe_aux = 0;   // MoE models (model_forward_backward): the load-balancing loss (model/moe_ffn.h)
  double loss() const { return tokens ? loss_sum / double(tokens) : 0.0; }
};

// Loss only (evaluation). `ws` (optional) keeps the activation buffers across calls. precision: the GEMM
// operand type and the activation storage (a ComputeType alone means f32 storage).
LossResult model_forward(const ModelSlabs& params, const Batch& batch, Precision precision,
                         Workspace* ws = nullptr);

// Loss and every parameter gradient, accumulated (+=) into `grads` (f32 slabs of the same config).
// The gradient is of the mean loss over the batch's counted tokens plus, for MoE models, moe_aux_coef times the
// load-balancing loss (transformers' loss with output_router_logits; 0: its value alone). Errors if no token is
// counted.
LossResult model_forward_backward(ModelSlabs& grads, const ModelSlabs& params, const Batch& batch,
                                  Precision precision, Workspace* ws = nullptr, double moe_aux_coef = 0);

}  // namespace lt
