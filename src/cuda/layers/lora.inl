// cuda/layers/lora.inl — a LoRA adapter on the CUDA block's linears (model/lora.h's formula, order and rounding
// points): host code compiled into both namespaces, like the linear (cuda/layers/linear.inl) that calls it.
//
//   forward   u_s = s · (drop(x) · Aᵀ) [N, r]  (alpha = s: one f32 rounding of the sum, then one of the product, as
//             the CPU's GEMM then scale);  y += u_s · Bᵀ  (beta = 1: the update accumulated by the GEMM)
//   backward  u_s again;  du = s · (dy · B);  dB += dyᵀ · u_s;  dA += duᵀ · drop(x)  (kTokenSlice slices in order);
//             dx += du · A  (beta = 1), or with dropout into the scratch and added where the mask kept the input
//
// The operands are in the adapter's dtype (the streamed one, W's): bf16 GEMMs read drop(x), u_s and du rounded to
// bf16 as the CPU block's adapters do. The mask is model/lora_mask.h's (cuda/kernels/lora.cuh), so the CUDA block
// draws the CPU block's mask and a recomputed layer draws its forward's.
#pragma once

#include <type_traits>

#include "cuda/gemm.h"
#include "cuda/layers.h"
#include "cuda/layers/head.inl"
#include "cuda/scratch.h"
#include "model/lora.h"

namespace lt::cuda::LT_KERNELS_NS {
namespace detail {

// The adapters' temporaries in the block scratch (one adapter runs at a time): u_s and du [rows, r] in f32 and as
// bf16 operands; the input as A's operand (dropped, rounded or widened; [wide] of f32 bytes); with dropout, the
// input gradient before the mask ([wide] f32). rows: the most tokens a linear is called on; wide: the most
// elements of an adapted linear's input.
struct LoraScratchCuda {
  float *u = nullptr, *du = nullptr;
  bf16_t *ub = nullptr, *dub = nullptr;
  void* x = nullptr;
  float* dx = nullptr;
  static LoraScratchCuda carve(ScratchCarver& c, const LoraShape& l, int64_t rows, int64_t wide) {
    LoraScratchCuda s;
    if (l.rank == 0) return s;
    s.u = c.take<float>(rows * l.rank), s.du = c.take<float>(rows * l.rank);
    s.ub = c.take<bf16_t>(rows * l.rank), s.dub = c.take<bf16_t>(rows * l.rank);
    s.x = c.take<float>(wide);
    if (l.dropout > 0) s.dx = c.take<float>(wide);
    return s;
  }
};

// One linear's adapter at one call: the adapter (none: view.present() is false), its gradients (null: a forward, or
// not trained), the model's rank, scale and dropout, where the mask comes from, and the scratch.
struct AdapterCall {
  LoraView view{};
  LoraGrads grads{};
  LoraShape shape{};
  LoraSite site{};
  LoraScratchCuda scratch{};
  bool present() const { return view.present(); }
};

inline bool bf16_operands(const AdapterCall& a) { return a.view.A.dtype == DType::bf16; }

// x [N, in_f] (bf16 stored, or f32) as A's GEMM operand: dropped with the mask, rounded to bf16 or widened to f32 as
// the adapter's dtype needs (into the scratch), or x itself.
template <class T>
const void* lora_input(Stream s, const AdapterCall& a, const T* x, int64_t N, int64_t in_f) {
  const bool b16 = bf16_operands(a);
  if (a.shape.dropout > 0) {
    const LoraSite& t = a.site;
    if (b16) lora_dropout(s, static_cast<bf16_t*>(a.scratch.x), x, t.key, t.row0, t.gather, t.per_token, N, in_f,
                          a.shape.dropout);
    else lora_dropout(s, static_cast<float*>(a.scratch.x), x, t.key, t.row0, t.gather, t.per_token, N, in_f,
                      a.shape.dropout);
    return a.scratch.x;
  }
  constexpr bool in_bf16 = std::is_same_v<T, bf16_t>;
  if (b16 == in_bf16) return x;
  if constexpr (in_bf16) convert(s, static_cast<float*>(a.scratch.x), x, N * in_f);
  else convert(s, static_cast<bf16_t*>(a.scratch.x), x, N * in_f);
  return a.scratch.x;
}

// u_s = s · (drop(x) · Aᵀ) [N, r] into scratch.u; returns it as B's operand (rounded into scratch.ub for bf16).
inline const void* lora_down(const GemmContext& g, Stream s, const AdapterCall& a, const void* xop, int64_t N,
                             int64_t in_f) {
  const MatType t = bf16_operands(a) ? MatType::bf16 : MatType::f32;
  const int64_t r = a.shape.rank;
  Matmul mm = linear_forward_matmul(a.scratch.u, MatType::f32, xop, a.view.A.data, t, nullptr, N, r, in_f);
  mm.name = "lora A forward", mm.alpha = a.shape.scale;
  run_matmul(g, mm, s);
  if (t == MatType::f32) return a.scratch.u;
  convert(s, a.scratch.ub, a.scratch.u, N * r);
  return a.scratch.ub;
}

// out[N, out_f] += s · (drop(x) · Aᵀ) · Bᵀ.
template <class T>
void lora_forward(const GemmContext& g, Stream s, float* out, const AdapterCall& a, const T* x, int64_t N,
                  int64_t in_f, int64_t out_f) {
  if (!a.present() || N == 0) return;
  const MatType t = bf16_operands(a) ? MatType::bf16 : MatType::f32;
  const void* uop = lora_down(g, s, a, lora_input(s, a, x, N, in_f), N, in_f);
  Matmul mm = linear_forward_matmul(out, MatType::f32, uop, a.view.B.data, t, nullptr, N, out_f, a.shape.rank);
  mm.name = "lora B forward", mm.beta = 1.0f;
  run_matmul(g, mm, s);
}

// The adapter's part of y's backward: din[N, in_f] += its input gradient (din null: none), the adapter's gradients
// added where trained. dy: dout [N, out_f] as the GEMM operand (the linear's own: rounded to bf16 for bf16 GEMMs).
template <class T>
void lora_backward(const GemmContext& g, Stream s, float* din, const AdapterCall& a, const void* dy, const T* x,
                   int64_t N, int64_t in_f, int64_t out_f) {
  if (!a.present() || N == 0) return;
  const MatType t = bf16_operands(a) ? MatType::bf16 : MatType::f32;
  const int64_t r = a.shape.rank;
  const LoraScratchCuda& sc = a.scratch;
  const void* xop = lora_input(s, a, x, N, in_f);
  const void* uop = lora_down(g, s, a, xop, N, in_f);  // the forward's bits
  Matmul du = linear_dinput_matmul(sc.du, dy, a.view.B.data, t, N, out_f, r);
  du.name = "lora B dinput", du.alpha = a.shape.scale;
  run_matmul(g, du, s);
  if (a.grads.B)
    for (const Matmul& mm : linear_dweight_matmuls(a.grads.B, dy, uop, t, N, out_f, r)) run_matmul(g, mm, s);
  const void* duop = sc.du;
  if (t == MatType::bf16) {
    convert(s, sc.dub, sc.du, N * r);
    duop = sc.dub;
  }
  if (a.grads.A)
    for (const Matmul& mm : linear_dweight_matmuls(a.grads.A, duop, xop, t, N, r, in_f)) run_matmul(g, mm, s);
  if (!din) return;
  const bool masked = a.shape.dropout > 0;
  Matmul dx = linear_dinput_matmul(masked ? sc.dx : din, duop, a.view.A.data, t, N, r, in_f);
  dx.name = "lora A dinput", dx.beta = masked ? 0.0f : 1.0f;
  run_matmul(g, dx, s);
  if (masked)
    lora_dropout_backward(s, din, sc.dx, a.site.key, a.site.row0, a.site.gather, a.site.per_token, N, in_f,
                          a.shape.dropout);
}

}  // namespace detail
}  // namespace lt::cuda::LT_KERNELS_NS
