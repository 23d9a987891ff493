// cuda/layers/moe.inl — a sparse layer's MLP on the GPU (qwen3_moe, qwen3_5_moe, gpt_oss): model/moe_ffn.cpp's route slice
// as kernel launches (cuda/kernels/moe.cuh) and one cuBLASLt call per expert and matrix. Host code compiled into
// both namespaces, like the block (cuda/layers/block.inl), which calls it slice by slice.
//
// The slice's steps and their order are the CPU's (model/moe_ffn.h), at bf16 storage as the GPU block stores: the
// router's logits from the stored n2, the routing and stable permutation, the grouped rows xp gathered from n2 (bf16:
// exact), each expert's gate / up GEMM rounded into the stored gate / up, h = silu(gate)·up stored, each expert's
// down GEMM, the weighted combine; the backward routes again from n2 (the same bits) and keeps no yp.
//
// The host sizes each expert's GEMMs, so it reads the slice's offsets [E + 1] back (with the router's error flag
// and the auxiliary loss's partials, one copy) and waits for the compute stream there: once per slice in the
// forward, the recompute and the backward. The GPU drains its queue at that point and idles for the copy's
// round trip (~10 µs) before the experts' GEMMs are enqueued — small beside a slice's GEMMs (4096 tokens). A
// grouped GEMM that reads the offsets on the device would remove the wait (ROADMAP: docs/moe.md).
//
// Scratch (MoeScratchCuda, carved after the block's; A = S·k grouped rows, S = the slice, W = mlp_width()):
// routing [S, E] ×2 and [A] ×4, the read-back area, xp [A, C] (bf16 or f32 as the expert weights), yp [A, C],
// f32 GEMM outputs [S·W], the bf16 GEMM operand, and the backward's dh / dgate / dup [S·W], dxp ×2 [A, C],
// dlogits, dweights, a recomputed slice's gate / up / h.
#pragma once

#include <algorithm>
#include <cstring>
#include <vector>

#include "cuda/layers/linear.inl"
#include "cuda/scratch.h"
#include "model/block.h"
#include "ops/swiglu.h"
#if LT_LAYERS_NATIVE
#include "cuda/native/cuda_check.h"
#endif

namespace lt::cuda::LT_KERNELS_NS {
namespace detail {

// Host <-> device copies that return once done (the host needs the routing's sizes before it enqueues the experts'
// GEMMs). Under cuda-sim device memory is host memory and every launch has already run.
inline void copy_to_host_now(Stream s, void* host, const void* device, size_t bytes) {
#if LT_LAYERS_NATIVE
  const auto stream = static_cast<cudaStream_t>(s);
  LT_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream), "MoE routing read-back");
  LT_CUDA_CHECK(cudaStreamSynchronize(stream), "MoE routing read-back");
#else
  (void)s;
  std::memcpy(host, device, bytes);
#endif
}
inline void copy_to_device_now(Stream s, void* device, const void* host, size_t bytes) {
#if LT_LAYERS_NATIVE
  const auto stream = static_cast<cudaStream_t>(s);
  LT_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream), "MoE mask upload");
  LT_CUDA_CHECK(cudaStreamSynchronize(stream), "MoE mask upload");
#else
  (void)s;
  std::memcpy(device, host, bytes);
#endif
}

struct MoeScratchCuda {
  float *logits, *probs, *weights;  // [S, E], [S, E], [A]
  int32_t *ids, *order, *row_of;    // [A]
  int64_t* readback;                // [E + 1 | 2E | 1]: offsets, the aux partials (f64), the router's error flag
  void* permute_ws;
  uint8_t* counted;                 // [S] the slice's attention mask
  float* dprobs;                    // [E] the auxiliary loss's gradient
  void* xp;                         // [A, C] bf16 (bf16 GEMMs) or f32
  float* yp;                        // [A, C] the experts' outputs; the backward's dyp
  float* out32;                     // [S·W] GEMM outputs before rounding; h widened (f32 GEMMs)
  bf16_t* operand;                  // [max(A·C, S·W)] an f32 gradient rounded for a bf16 GEMM
  float *dh, *dgate, *dup;          // [S·W]
  float *dxp, *dxp2;                // [A, C]
  float *dlogits, *dweights;        // [S, E], [A]
  float *sg, *dshared;              // [S] the shared expert's gate σ and its logit's gradient
  float* down_bias;                 // [E, C] the experts' down biases gathered (gpt_oss)
  bf16_t *gate_c, *up_c, *h_c;      // [S·W] a recomputed slice's internals
  int64_t* offsets() const { return readback; }
  double* aux(int64_t E) const { return reinterpret_cast<double*>(readback + E + 1); }
  int32_t* bad(int64_t E) const { return reinterpret_cast<int32_t*>(readback + 3 * E + 1); }
  static size_t readback_bytes(int64_t E) { return size_t(3 * E + 2) * 8; }

  static MoeScratchCuda carve(ScratchCarver& c, const BlockShape& s) {
    const int64_t S = s.mlp_rows(), E = s.E, A = S * s.k, C = s.C, W = S * s.mlp_width();
    MoeScratchCuda m{};
    m.logits = c.take<float>(S * E), m.probs = c.take<float>(S * E), m.weights = c.take<float>(A);
    m.ids = c.take<int32_t>(A), m.order = c.take<int32_t>(A), m.row_of = c.take<int32_t>(A);
    m.readback = static_cast<int64_t*>(c.take_bytes(readback_bytes(E)));
    m.permute_ws = c.take_bytes(moe_permute_workspace_bytes(E));
    m.counted = c.take<uint8_t>(S), m.dprobs = c.take<float>(E);
    m.xp = c.take<float>(A * C), m.yp = c.take<float>(A * C), m.out32 = c.take<float>(W);
    m.operand = c.take<bf16_t>(std::max(A * C, W));
    m.dh = c.take<float>(W), m.dgate = c.take<float>(W), m.dup = c.take<float>(W);
    m.dxp = c.take<float>(A * C), m.dxp2 = c.take<float>(A * C);
    m.dlogits = c.take<float>(S * E), m.dweights = c.take<float>(A);
    m.sg = c.take<float>(S), m.dshared = c.take<float>(S);
    m.down_bias = c.take<float>(E * C);
    m.gate_c = c.take<bf16_t>(W), m.up_c = c.take<bf16_t>(W), m.h_c = c.take<bf16_t>(W);
    return m;
  }
};

// A sparse layer's adapters at one route slice (model/moe_ffn.h): the router's, each expert's on its grouped rows
// (masks by moe_lora_site on the device's order, the CPU block's rows), the shared expert's and its gate's. Without
// LoRA every call adds nothing.
struct MoeAdapters {
  const BlockShape* shape = nullptr;
  MoeRouting routing{};  // order (the device's), t0 and the batch's dropout key: what moe_lora_site reads
  LoraScratchCuda scratch{};
  AdapterCall at(const LoraView& view, Adapted a, const LoraGrads* grads = nullptr, int64_t expert = -1,
                 int64_t first = 0) const {
    AdapterCall c;
    c.view = view;
    if (!c.present()) return c;
    if (grads) c.grads = *grads;
    c.shape = shape->lora;
    c.site = moe_lora_site(routing, *shape, a, expert, first);
    c.scratch = scratch;
    return c;
  }
};

// An adapter on rows stored in the GEMM dtype t (xp, h widened or not, n2 widened or not).
inline void lora_forward_rows(const GemmContext& g, Stream s, float* out, const AdapterCall& a, const void* x, MatType t,
                              int64_t N, int64_t in_f, int64_t out_f) {
  if (!a.present()) return;
  if (t == MatType::bf16) lora_forward(g, s, out, a, static_cast<const bf16_t*>(x), N, in_f, out_f);
  else lora_forward(g, s, out, a, static_cast<const float*>(x), N, in_f, out_f);
}
inline void lora_backward_rows(const GemmContext& g, Stream s, float* din, const AdapterCall& a, const void* dy,
                               const void* x, MatType t, int64_t N, int64_t in_f, int64_t out_f) {
  if (!a.present()) return;
  if (t == MatType::bf16) lora_backward(g, s, din, a, dy, static_cast<const bf16_t*>(x), N, in_f, out_f);
  else lora_backward(g, s, din, a, dy, static_cast<const float*>(x), N, in_f, out_f);
}

inline void check_gpu_sparse_layer(const BlockShape& sh, const MoeView& w) {
  LT_CHECK(int64_t(w.experts.size()) == sh.E, "sparse layer: {} experts bound, the shape has {}", w.experts.size(), sh.E);
}

// h = silu(gate)·up, or GPT-OSS's clamped SwiGLU, over n elements (stored bf16), and its backward.
inline void expert_swiglu(Stream s, const BlockShape& sh, bf16_t* h, const bf16_t* gate, const bf16_t* up, int64_t n) {
  if (sh.swiglu_limit > 0) clamped_swiglu_forward(s, h, gate, up, n, kClampedSwigluAlpha, sh.swiglu_limit);
  else swiglu_forward(s, h, gate, up, n);
}
inline void expert_swiglu_backward(Stream s, const BlockShape& sh, float* dgate, float* dup, const float* dh,
                                   const bf16_t* gate, const bf16_t* up, int64_t n) {
  if (sh.swiglu_limit > 0) clamped_swiglu_backward(s, dgate, dup, dh, gate, up, n, kClampedSwigluAlpha, sh.swiglu_limit);
  else swiglu_backward(s, dgate, dup, dh, gate, up, n);
}

// x's rows [first, first + rows) of width `width` in the GEMM dtype t (bf16 or f32 storage behind one pointer).
inline const void* rows_at(const void* x, MatType t, int64_t first, int64_t width) {
  const size_t elem = t == MatType::bf16 ? 2 : 4;
  return static_cast<const char*>(x) + size_t(first * width) * elem;
}

// Calls f(e, first grouped row, rows) for every expert with rows in this slice, in expert order.
template <class F>
void for_each_expert(const std::vector<int64_t>& offsets, F&& f) {
  for (size_t e = 0; e + 1 < offsets.size(); ++e)
    if (offsets[e + 1] > offsets[e]) f(int64_t(e), offsets[e], offsets[e + 1] - offsets[e]);
}

// Routes the slice's n tokens (n2 [n, C] bf16): logits, routing, permutation, xp; with `aux`, adds the forward's
// partials to it (t0: the slice's first token). Returns the offsets [E + 1] read back. `widened` [n, C] f32: n2
// for an f32 router.
inline std::vector<int64_t> moe_route_slice(const GemmContext& g, Stream s, const BlockShape& sh, const MoeView& w,
                                            const MoeScratchCuda& m, const bf16_t* n2, int64_t n, MoeAuxLoss* aux,
                                            int64_t t0, float* widened, const MoeAdapters& ad) {
  const int64_t E = sh.E, k = sh.k, C = sh.C, A = n * k;
  gpu_linear(g, s, m.logits, n2, w.router, w.router_bias, n, C, E, widened, ad.at(w.router_lora, Adapted::router));
  moe_router_forward(s, m.ids, m.weights, m.probs, m.bad(E), m.logits, n, E, k, sh.topk_softmax, sh.renorm_topk);
  moe_permute(s, m.offsets(), m.order, m.row_of, m.ids, n, k, E, m.permute_ws);
  const uint8_t* mask = aux ? aux->counted(t0) : nullptr;
  if (mask) copy_to_device_now(s, m.counted, mask, size_t(n));
  if (aux) moe_aux_partials(s, m.aux(E), m.aux(E) + E, m.ids, m.probs, mask ? m.counted : nullptr, n, E, k);
  if (weight_type(w.experts.front().gate) == MatType::bf16) {
    moe_gather(s, static_cast<bf16_t*>(m.xp), n2, m.order, A, k, C);
  } else {
    moe_gather(s, static_cast<float*>(m.xp), n2, m.order, A, k, C);
  }
  std::vector<int64_t> back(size_t(3 * E + 2));
  copy_to_host_now(s, back.data(), m.readback, MoeScratchCuda::readback_bytes(E));
  const int32_t bad = *reinterpret_cast<const int32_t*>(back.data() + 3 * E + 1);
  LT_CHECK(bad == INT32_MAX, "router: token {} has a non-finite router logit (inf or NaN): the layer's input or its "
           "router weights have diverged", t0 + bad);
  if (aux) {
    const double* partials = reinterpret_cast<const double*>(back.data() + E + 1);
    aux->add_partials(partials, partials + E, t0, n);
  }
  back.resize(size_t(E + 1));
  return back;
}

// gate, up (rounded, [n·W] in the slice's layout: the grouped rows, then the shared expert's) and h of the routed
// slice; `widened` [n, C] f32 (the shared expert's n2, f32 GEMMs).
inline void moe_internals(const GemmContext& g, Stream s, const BlockShape& sh, const MoeView& w,
                          const MoeScratchCuda& m, const std::vector<int64_t>& offsets, bf16_t* gate, bf16_t* up,
                          bf16_t* h, const bf16_t* n2, int64_t n, float* widened, const MoeAdapters& ad) {
  const int64_t C = sh.C, Ie = sh.Ie, shared = n * sh.k * Ie, width = n * sh.mlp_width();
  const MatType t = weight_type(w.experts.front().gate);
  auto project = [&](bf16_t* store, WeightRef ExpertView::*matrix, const float* ExpertView::*bias,
                     LoraView ExpertView::*lora, Adapted routed, Adapted shared_a) {
    for_each_expert(offsets, [&](int64_t e, int64_t first, int64_t rows) {
      const ExpertView& x = w.experts[size_t(e)];
      const void* xp = rows_at(m.xp, t, first, C);
      linear_gemms(g, s, m.out32 + first * Ie, xp, x.*matrix, x.*bias, rows, C, Ie);
      lora_forward_rows(g, s, m.out32 + first * Ie, ad.at(x.*lora, routed, nullptr, e, first), xp, t, rows, C, Ie);
    });
    if (sh.Is > 0)
      gpu_linear(g, s, m.out32 + shared, n2, w.shared.*matrix, nullptr, n, C, sh.Is, widened,
                 ad.at(w.shared.*lora, shared_a));
    convert(s, store, m.out32, width);
  };
  project(gate, &ExpertView::gate, &ExpertView::gate_bias, &ExpertView::gate_lora, Adapted::gate_proj,
          Adapted::shared_gate_proj);
  project(up, &ExpertView::up, &ExpertView::up_bias, &ExpertView::up_lora, Adapted::up_proj, Adapted::shared_up_proj);
  expert_swiglu(s, sh, h, gate, up, width);
}

// y[n, C] (f32, written): the experts' down projections of h, combined by the routing weights, plus the shared
// expert's output times its gate.
inline void moe_down_combine(const GemmContext& g, Stream s, const BlockShape& sh, const MoeView& w,
                             const MoeScratchCuda& m, const std::vector<int64_t>& offsets, float* y, const bf16_t* h,
                             const bf16_t* n2, int64_t n, float* widened, const MoeAdapters& ad) {
  const int64_t C = sh.C, Ie = sh.Ie, shared = n * sh.k * Ie;
  const MatType t = weight_type(w.experts.front().down);
  const void* hop = h;
  if (t == MatType::f32) {
    convert(s, m.out32, h, n * sh.mlp_width());
    hop = m.out32;
  }
  for_each_expert(offsets, [&](int64_t e, int64_t first, int64_t rows) {
    const ExpertView& x = w.experts[size_t(e)];
    const void* hr = rows_at(hop, t, first, Ie);
    linear_gemms(g, s, m.yp + first * C, hr, x.down, x.down_bias, rows, Ie, C);
    lora_forward_rows(g, s, m.yp + first * C, ad.at(x.down_lora, Adapted::down_proj, nullptr, e, first), hr, t, rows,
                      Ie, C);
  });
  moe_combine_forward(s, y, m.yp, m.weights, m.row_of, n, sh.k, C);
  if (sh.Is == 0) return;
  linear_gemms(g, s, m.yp, rows_at(hop, t, shared, 1), w.shared.down, nullptr, n, sh.Is, C);
  lora_forward_rows(g, s, m.yp, ad.at(w.shared.down_lora, Adapted::shared_down_proj), rows_at(hop, t, shared, 1), t, n,
                    sh.Is, C);
  gpu_linear(g, s, m.sg, n2, w.shared_gate, nullptr, n, C, 1, widened,
             ad.at(w.shared_gate_lora, Adapted::shared_expert_gate));
  moe_shared_gate(s, m.sg, n);
  moe_add_gated(s, y, m.yp, m.sg, n, C);
}

// dY [rows, out_f] f32 as the GEMM operand of type t: rounded into `operand` for bf16 GEMMs.
inline const void* gradient_operand(Stream s, MatType t, const float* dy, int64_t count, bf16_t* operand) {
  if (t == MatType::f32) return dy;
  convert(s, operand, dy, count);
  return operand;
}

// The slice's backward (model/moe_ffn.cpp's moe_backward, in its order): dn2 [n, C] the experts' input gradient and
// dn_router [n, C] the router's, both written; the parameter gradients accumulated. gate / up / h as the forward
// stored them; the slice routed again (moe_route_slice, offsets). aux (or null): its gradient on the slice's counted
// tokens.
inline void moe_backward(const GemmContext& g, Stream s, const BlockShape& sh, const MoeView& w, MoeGrads& gr,
                         const MoeScratchCuda& m, const std::vector<int64_t>& offsets, float* dn2, float* dn_router,
                         const float* dout, const bf16_t* n2, const bf16_t* gate, const bf16_t* up, const bf16_t* h,
                         int64_t n, const MoeAuxLoss* aux, int64_t t0, float* widened, const MoeAdapters& ad) {
  const int64_t E = sh.E, k = sh.k, C = sh.C, Ie = sh.Ie, Is = sh.Is, A = n * k, shared = A * Ie;
  const int64_t width = n * sh.mlp_width();
  // A frozen MLP (model/finetune.h) binds no expert gradients: every weight GEMM is skipped (null dW).
  ExpertGrads frozen{};
  auto grads_of = [&](int64_t e) -> ExpertGrads& { return gr.experts.empty() ? frozen : gr.experts[size_t(e)]; };
  // Every matrix of the layer is in the one compute dtype: h and n2 as GEMM operands (widened for f32 GEMMs).
  const MatType t = weight_type(w.experts.front().down);
  LT_CHECK(weight_type(w.router) == t, "sparse layer: the router's GEMM dtype differs from the experts'");
  const void *hop = h, *n2op = n2;
  if (t == MatType::f32) {
    convert(s, m.out32, h, width);
    convert(s, widened, n2, n * C);
    hop = m.out32, n2op = widened;
  }
  // g = dout·W_down per grouped row (dyp: each row's token's dout), the routing weights' gradient g·h, dh = w·g.
  moe_gather(s, m.yp, dout, m.order, A, k, C);
  const void* dy = gradient_operand(s, t, m.yp, A * C, m.operand);
  for_each_expert(offsets, [&](int64_t e, int64_t first, int64_t rows) {
    run_matmul(g, linear_dinput_matmul(m.dh + first * Ie, rows_at(dy, t, first, C), w.experts[size_t(e)].down.data, t,
                                       rows, C, Ie), s);
  });
  // gpt_oss: the combine multiplies down(h) + b_down, so the weights' gradient adds dout·b_down ([E, C] gathered).
  const bool down_bias = w.experts.front().down_bias != nullptr;
  if (down_bias) {
    zero(s, m.down_bias, E * C);
    for (int64_t e = 0; e < E; ++e) accumulate(s, m.down_bias + e * C, w.experts[size_t(e)].down_bias, C);
  }
  // LoRA on the experts' down projections: their adapters' outputs L(h) [A, C] into dxp (free until the input
  // gradients) for the weights' gradient, dout·L(h) (moe_adapter_dots, after moe_weight_grads as the CPU's).
  const bool down_adapted = w.experts.front().down_lora.present();
  if (down_adapted) {
    zero(s, m.dxp, A * C);
    for_each_expert(offsets, [&](int64_t e, int64_t first, int64_t rows) {
      lora_forward_rows(g, s, m.dxp + first * C, ad.at(w.experts[size_t(e)].down_lora, Adapted::down_proj, nullptr, e,
                                                        first),
                        rows_at(hop, t, first, Ie), t, rows, Ie, C);
    });
  }
  moe_weight_grads(s, m.dweights, m.dh, h, m.weights, m.order, m.ids, down_bias ? dout : nullptr,
                   down_bias ? m.down_bias : nullptr, A, k, Ie, C);
  if (down_adapted) moe_adapter_dots(s, m.dweights, m.yp, m.dxp, m.order, A, C);
  // W_down's gradient (and its bias's) from dyp = w·dout.
  moe_scale_rows(s, m.yp, m.weights, m.order, A, C);
  dy = gradient_operand(s, t, m.yp, A * C, m.operand);
  for_each_expert(offsets, [&](int64_t e, int64_t first, int64_t rows) {
    ExpertGrads& ge = grads_of(e);
    if (ge.down)
      for (const Matmul& mm : linear_dweight_matmuls(ge.down, rows_at(dy, t, first, C), rows_at(hop, t, first, Ie), t,
                                                     rows, C, Ie))
        run_matmul(g, mm, s);
    if (ge.down_bias) bias_grad(s, ge.down_bias, m.yp + first * C, rows, C);
    // dh (w·g already) += the adapter's input gradient; its gradients from w·dout.
    lora_backward_rows(g, s, m.dh + first * Ie,
                       ad.at(w.experts[size_t(e)].down_lora, Adapted::down_proj, &ge.down_lora, e, first),
                       rows_at(dy, t, first, C), rows_at(hop, t, first, Ie), t, rows, Ie, C);
  });
  if (Is > 0) {
    // The shared expert: σ again from n2, gs = dout·W_down_s, the gate logit's gradient, d hs = σ·gs, then W_down_s's
    // gradient from σ·dout.
    linear_gemms(g, s, m.sg, n2op, w.shared_gate, nullptr, n, C, 1);
    lora_forward_rows(g, s, m.sg, ad.at(w.shared_gate_lora, Adapted::shared_expert_gate), n2op, t, n, C, 1);
    moe_shared_gate(s, m.sg, n);
    float* gs = m.dh + shared;
    const void* hs = rows_at(hop, t, shared, 1);
    run_matmul(g, linear_dinput_matmul(gs, gradient_operand(s, t, dout, n * C, m.operand), w.shared.down.data, t, n,
                                       C, Is), s);
    // With an adapter on the shared down projection its output L_s(hs) (in dxp for a moment) joins the gate's
    // gradient.
    const AdapterCall down_lora = ad.at(w.shared.down_lora, Adapted::shared_down_proj, &gr.shared.down_lora);
    if (down_lora.present()) {
      zero(s, m.dxp, n * C);
      lora_forward_rows(g, s, m.dxp, down_lora, hs, t, n, Is, C);
    }
    moe_shared_gate_grad(s, m.dshared, gs, h + shared, m.sg, n, Is, dout, down_lora.present() ? m.dxp : nullptr, C);
    moe_scale_by_token(s, gs, gs, m.sg, n, Is);
    moe_scale_by_token(s, m.yp, dout, m.sg, n, C);
    if (gr.shared.down || down_lora.present()) {  // (σ·dout as the GEMM operand only where a GEMM reads it)
      const void* dys = gradient_operand(s, t, m.yp, n * C, m.operand);
      if (gr.shared.down)
        for (const Matmul& mm : linear_dweight_matmuls(gr.shared.down, dys, hs, t, n, C, Is)) run_matmul(g, mm, s);
      lora_backward_rows(g, s, gs, down_lora, dys, hs, t, n, Is, C);  // d hs += the adapter's input gradient
    }
  }
  expert_swiglu_backward(s, sh, m.dgate, m.dup, m.dh, gate, up, width);
  // The experts' input gradients (gate into dxp, up into dxp2) and their gate / up weight (and bias) gradients.
  auto experts_backward = [&](float* dx, const float* d, WeightRef ExpertView::*matrix, float* ExpertGrads::*grad,
                              float* ExpertGrads::*bias, LoraView ExpertView::*lora, LoraGrads ExpertGrads::*lgrad,
                              Adapted a) {
    const void* dop = gradient_operand(s, t, d, width, m.operand);
    for_each_expert(offsets, [&](int64_t e, int64_t first, int64_t rows) {
      ExpertGrads& ge = grads_of(e);
      const ExpertView& x = w.experts[size_t(e)];
      const void *dy = rows_at(dop, t, first, Ie), *xp = rows_at(m.xp, t, first, C);
      linear_backward_gemms(g, s, dx + first * C, ge.*grad, ge.*bias, d + first * Ie, dy, xp, x.*matrix, rows, C, Ie);
      lora_backward_rows(g, s, dx + first * C, ad.at(x.*lora, a, &(ge.*lgrad), e, first), dy, xp, t, rows, C, Ie);
    });
  };
  experts_backward(m.dxp, m.dgate, &ExpertView::gate, &ExpertGrads::gate, &ExpertGrads::gate_bias,
                   &ExpertView::gate_lora, &ExpertGrads::gate_lora, Adapted::gate_proj);
  experts_backward(m.dxp2, m.dup, &ExpertView::up, &ExpertGrads::up, &ExpertGrads::up_bias, &ExpertView::up_lora,
                   &ExpertGrads::up_lora, Adapted::up_proj);
  accumulate(s, m.dxp, m.dxp2, A * C);
  moe_scatter_add(s, dn2, m.dxp, m.row_of, n, k, C);
  if (Is > 0) {
    // The shared expert's input gradients (gate, up, then its gate's logit) into dxp's first n rows, added to dn2.
    auto shared_backward = [&](float* dx, const float* d, WeightRef ExpertView::*matrix, float* ExpertGrads::*grad,
                               LoraView ExpertView::*lora, LoraGrads ExpertGrads::*lgrad, Adapted a) {
      const void* dop = gradient_operand(s, t, d, n * Is, m.operand);
      linear_backward_gemms(g, s, dx, gr.shared.*grad, nullptr, nullptr, dop, n2op, w.shared.*matrix, n, C, Is);
      lora_backward_rows(g, s, dx, ad.at(w.shared.*lora, a, &(gr.shared.*lgrad)), dop, n2op, t, n, C, Is);
    };
    shared_backward(m.dxp, m.dgate + shared, &ExpertView::gate, &ExpertGrads::gate, &ExpertView::gate_lora,
                    &ExpertGrads::gate_lora, Adapted::shared_gate_proj);
    shared_backward(m.dxp2, m.dup + shared, &ExpertView::up, &ExpertGrads::up, &ExpertView::up_lora,
                    &ExpertGrads::up_lora, Adapted::shared_up_proj);
    accumulate(s, m.dxp, m.dxp2, n * C);
    const void* dsop = gradient_operand(s, t, m.dshared, n, m.operand);
    linear_backward_gemms(g, s, m.dxp2, gr.shared_gate, nullptr, nullptr, dsop, n2op, w.shared_gate, n, C, 1);
    lora_backward_rows(g, s, m.dxp2, ad.at(w.shared_gate_lora, Adapted::shared_expert_gate, &gr.shared_gate_lora),
                       dsop, n2op, t, n, C, 1);
    accumulate(s, m.dxp, m.dxp2, n * C);
    accumulate(s, dn2, m.dxp, n * C);
  }
  // The router: its weights' gradient through top-k and softmax (plus the auxiliary loss's), then the linear.
  const float* extra = aux ? aux->dprobs() : nullptr;
  const uint8_t* mask = extra ? aux->counted(t0) : nullptr;
  if (extra) copy_to_device_now(s, m.dprobs, extra, size_t(E) * sizeof(float));
  if (mask) copy_to_device_now(s, m.counted, mask, size_t(n));
  moe_router_backward(s, m.dlogits, m.dweights, extra ? m.dprobs : nullptr, mask ? m.counted : nullptr, m.ids,
                      m.weights, m.probs, n, E, k, sh.topk_softmax, sh.renorm_topk);
  const void* dlop = gradient_operand(s, t, m.dlogits, n * E, m.operand);
  linear_backward_gemms(g, s, dn_router, gr.router, gr.router_bias, m.dlogits, dlop, n2op, w.router, n, C, E);
  lora_backward_rows(g, s, dn_router, ad.at(w.router_lora, Adapted::router, &gr.router_lora), dlop, n2op, t, n, C, E);
}

}  // namespace detail
}  // namespace lt::cuda::LT_KERNELS_NS
