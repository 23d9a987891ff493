// model/moe_ffn.h — a sparse layer's MLP (qwen3_moe): the router, the routed SwiGLU experts and their weighted
// combine, forward and backward, on the ops of ops/moe.h and ops/linear.h.
//
//   logits = n2 · W_routerᵀ [n, E];  ids, w = route(logits) (ops/moe.h: softmax, top-k, renormalised or not)
//   y[t] = Σ_j w[t, j] · down_e(silu(gate_e(n2[t])) · up_e(n2[t])),  e = ids[t, j]
//   qwen3_5_moe adds a shared expert on every token: y[t] += σ(n2[t] · w_sg) · down_s(silu(gate_s(n2[t])) · up_s(n2[t]))
//
// Route slices. The block runs a sparse layer's MLP over slices of S = min(kTokenSlice, N) tokens
// (BlockShape::mlp_rows). Each slice is routed, its n·k assignments grouped by expert in a stable order
// (moe_permute), and each expert's grouped rows multiplied by one GEMM per matrix (linear_forward / linear_backward
// on oneDNN: the CPU's grouped GEMM is one GEMM per expert). An expert's weight gradients add one GEMM per slice,
// slices in order, so neither the plan's MLP chunk nor the thread count changes a bit; experts no token chose add
// nothing (their gradient stays zero, and AdamW still updates them, as PyTorch does the fused expert tensors).
//
// What the backward keeps: like the dense MLP's gate / up / h, the grouped rows' gate, up and h [n·k, Ie] per slice,
// then the shared expert's [n, Is] — n·(k·Ie + Is) elements per field and slice (BlockShape::mlp_width() per token;
// token t's rows lie within its slice's, so "the rows of tokens [t0, t0 + n)" are elements [t0·width, (t0 + n)·width)). The
// routing is not kept: the backward routes the slice again from n2, whose bits the forward, a recompute and the
// backward share (model/block.h), so it gets the same ids and weights — the router is a deterministic function of
// n2 (as is the shared expert's gate logit). The experts' outputs are not kept either: the combine's weight gradient
// is (dout·W_down)·h (moe_weight_grads), and dout·W_down is the GEMM the down projection's input gradient needs anyway;
// the shared expert's gate gradient likewise.
//
// LoRA (model/lora.h): the router, each routed expert's three projections, the shared expert's and its gate may
// carry adapters (MoeView's LoraViews). An expert's adapter runs on its grouped rows beside its GEMM; its dropout mask
// is drawn per (token, expert): the linear's site key mixed with the expert, rows named by their tokens through
// `order` (moe_lora_site). With an adapter on a down projection the routing weight's gradient also reads dout·L(h),
// L(h) formed again in the backward (the shared expert's gate likewise).
//
// Legend: n tokens of the slice (≤ S), C hidden, E experts, k per token, Ie an expert's intermediate size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/lora.h"
#include "ops/linear.h"
#include "ops/moe.h"

namespace lt {

struct BlockShape;

struct ExpertView {
  WeightRef gate, up, down;  // [Ie, C], [Ie, C], [C, Ie]
  const float *gate_bias = nullptr, *up_bias = nullptr, *down_bias = nullptr;  // [Ie], [Ie], [C] (gpt_oss)
  LoraView gate_lora{}, up_lora{}, down_lora{};  // LoRA adapters (model/lora.h; absent: none)
};
struct MoeView {
  WeightRef router;                 // [E, C] (mlp.gate.weight; gpt_oss: mlp.router.weight)
  const float* router_bias = nullptr;  // [E] (gpt_oss)
  std::vector<ExpertView> experts;  // [E]
  ExpertView shared;                // [Is, C], [Is, C], [C, Is] (qwen3_5_moe; null data: none)
  WeightRef shared_gate;            // [1, C]
  LoraView router_lora{}, shared_gate_lora{};
};
struct ExpertGrads {
  float *gate, *up, *down;
  float *gate_bias = nullptr, *up_bias = nullptr, *down_bias = nullptr;
  LoraGrads gate_lora{}, up_lora{}, down_lora{};
};
struct MoeGrads {
  float* router;
  float* router_bias = nullptr;
  std::vector<ExpertGrads> experts;
  ExpertGrads shared;  // null without a shared expert
  float* shared_gate;
  LoraGrads router_lora{}, shared_gate_lora{};
};

// One slice's routing and grouped rows (in the layer's working copy; a forward temporary, rebuilt by the backward).
struct MoeRouting {
  float* logits;     // [S, E]
  float* probs;      // [S, E]
  float* weights;    // [S, k]
  int32_t* ids;      // [S, k]
  int32_t* order;    // [S·k]  the assignment at each grouped row
  int32_t* row_of;   // [S·k]  the grouped row of each assignment
  int64_t* offsets;  // [E + 1] expert e's grouped rows
  float* xp;         // [S·k, C] the grouped rows' input (n2 of their tokens)
  float* yp;         // [S·k, C] the experts' outputs (forward), then the shared expert's [S, C]
  float* shared_gate;       // [S] σ(n2 · w_sg) (shared expert only)
  int32_t* identity;        // [S] 0, 1, ..: the shared expert's rows as moe_weight_grads' one assignment per token
  // Where the slice's adapters draw their dropout masks (moe_route sets them): its first token and the layer's
  // site keys, and the adapters' shape (model/lora.h).
  int64_t t0 = 0;
  uint64_t dropout_key = 0;
  static size_t floats(const BlockShape& s);
  static MoeRouting bind(float* buffer, const BlockShape& s);
};

// The backward's temporaries of one slice (in the layer's BlockScratch).
struct MoeScratch {
  float *dh, *dgate, *dup;  // [S·k, Ie]
  float *dyp, *dxp, *dxp2;  // [S·k, C]
  float* dlogits;           // [S, E]
  float* dweights;          // [S, k]
  float* dshared;           // [S]  the shared gate's gradient (shared expert only)
  static size_t floats(const BlockShape& s);
  static MoeScratch bind(float* buffer, const BlockShape& s);
};

RouterShape router_shape(const BlockShape& s, int64_t n);

// Routes the slice's n2 rows [n, C] (tokens [t0, t0 + n) of the batch whose dropout key is `dropout_key`, for the
// adapters' masks): r's logits .. xp.
void moe_route(MoeRouting& r, const float* n2, const MoeView& w, const BlockShape& s, int64_t n, int64_t t0 = 0,
               uint64_t dropout_key = 0);

// A sparse layer's adapter site (model/lora.h): linear `a` of the slice's tokens (the router, the shared expert and
// its gate) or, with `expert` >= 0, the expert's grouped rows from `first`.
LoraSite moe_lora_site(const MoeRouting& r, const BlockShape& s, Adapted a, int64_t expert = -1, int64_t first = 0);
// gate, up [n·k, Ie] of the grouped rows from r.xp, then the shared expert's [n, Is] from n2 (the caller computes
// h = silu(gate)·up between, with its storage hooks).
void moe_gate_up(float* gate, float* up, const MoeRouting& r, const float* n2, const MoeView& w, const BlockShape& s,
                 int64_t n);
// y[n, C] (written): each expert's down projection of its rows of h into r.yp, the weighted combine, then the shared
// expert's output times its gate.
void moe_down_combine(float* y, MoeRouting& r, const float* h, const float* n2, const MoeView& w, const BlockShape& s,
                      int64_t n);

// The load-balancing auxiliary loss of one batch: transformers' load_balancing_loss_func (ops/moe.h) over the tokens
// the batch's attention mask counts. The forward adds each sparse layer's routing, slice by slice; after the last
// layer finish() gives the value and, for a weight > 0, the gradient of weight · aux that every counted token's
// router probabilities receive in every sparse layer's backward. Only the forward adds: a recompute and the
// backward's routing again see none of it (their routing is the forward's, bit for bit).
class MoeAuxLoss {
 public:
  // E experts; counted[N] non-zero for the tokens the mask counts (null: every token; kept by pointer); weight
  // = ∂objective/∂aux (0: the value alone, no gradient).
  MoeAuxLoss(int64_t E, const uint8_t* counted, double weight);
  // Slice [t0, t0 + n)'s routing (r as moe_route left it).
  void add(const MoeRouting& r, const BlockShape& s, int64_t t0, int64_t n);
  // The same from a GPU block's partials of that slice (cuda/kernels/moe.cuh's moe_aux_partials: counts[E] and
  // prob_sums[E] over its counted tokens, in token order), added as aux_loss_accumulate adds its own: the same bits.
  void add_partials(const double* counts, const double* prob_sums, int64_t t0, int64_t n);
  // After the forward's last layer: aux (0 when no row was counted) and the gradient dprobs.
  double finish();
  double value() const { return value_; }
  double weight() const { return weight_; }
  // [E] ∂(weight · aux)/∂p of any counted row, after finish(); null when weight is 0.
  const float* dprobs() const { return weight_ > 0 ? dprobs_.data() : nullptr; }
  // The mask from token t0 on (null: every token counted).
  const uint8_t* counted(int64_t t0) const { return counted_ ? counted_ + t0 : nullptr; }

 private:
  const uint8_t* counted_;
  double weight_;
  std::vector<double> counts_, prob_sums_;  // [E]
  int64_t rows_ = 0;                        // layers · counted tokens so far
  std::vector<float> dprobs_;               // [E]
  double value_ = 0;
};

// The slice's backward from dout[n, C], with r routed again (moe_route) and gate, up, h as the forward had them:
// dn2[n, C] (written) the experts' input gradient, dn_router[n, C] (written) the router's; the parameter gradients
// accumulated. aux (or null): the auxiliary loss's gradient on the counted tokens of the slice [r.t0, r.t0 + n).
void moe_backward(float* dn2, float* dn_router, MoeGrads& g, MoeScratch& b, const MoeRouting& r, const float* dout,
                  const float* n2, const float* gate, const float* up, const float* h, const MoeView& w,
                  const BlockShape& s, int64_t n, const MoeAuxLoss* aux);

}  // namespace lt
