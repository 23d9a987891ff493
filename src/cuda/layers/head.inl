// cuda/layers/head.inl — the fused LM head as a sequence of launches: host code, compiled by the host compiler
// into both namespaces (cuda/layers_sim.cpp, cuda/native/layers_native.cpp), so it calls that build's kernels: per chunk of tokens [n0, n0 + n)
//   xn = rmsnorm(x) → (bf16: rounded copy) → logits = xn · lm_wᵀ (f32) → cross-entropy → dlogits (bf16; f32 in place)
//   dxn = dlogits · lm_w,  dlm_w += dlogitsᵀ · xn (token slices), dx, dnorm_w from rmsnorm's backward
// Only one chunk's logits exist at a time ([chunk, V] f32 in the workspace). A null dnorm_w or dlm_w (frozen,
// model/finetune.h) is not made. dnorm_w is added per chunk
// (the CPU op sums it in f64 over all chunks first), so the two agree to f32 rounding.
#pragma once

#include "core/error.h"
#include "cuda/gemm.h"
#include "cuda/layers.h"
#include "cuda/scratch.h"

namespace lt::cuda::LT_KERNELS_NS {

// A Matmul on this build's GEMM: cuBLASLt natively, the emulation under cuda-sim.
inline void run_matmul(const GemmContext& gemm, const Matmul& mm, Stream s) {
#if LT_LAYERS_NATIVE
  LT_CHECK(gemm.cublas != nullptr, "{}: a native launch needs a cuBLASLt handle (GemmContext::cublas)", mm.name);
  static_cast<native::CublasLt*>(gemm.cublas)->run(mm, s, gemm.workspace);
#else
  (void)gemm, (void)s;
  emulate_matmul(mm);
#endif
}

namespace detail {

// The workspace of head_forward_backward, carved in this order (each piece 256-byte aligned).
struct HeadScratch {
  float* xn;         // [n_c, C]
  float* rstd;       // [n_c]
  bf16_t* xn_b;      // [n_c, C] (bf16 GEMMs)
  float* logits;     // [n_c, V]
  bf16_t* dlogits_b; // [n_c, V] (bf16 GEMMs)
  double* row_loss;  // [n_c]
  float* dxn;        // [n_c, C]
  void* norm_ws;     // rmsnorm_backward_workspace_bytes(n_c, C)
  size_t bytes;
  static HeadScratch carve(void* base, const HeadShape& s, DType lm_type) {
    const int64_t n_c = s.chunk_tokens < s.N ? s.chunk_tokens : s.N;
    const bool b16 = lm_type == DType::bf16;
    ScratchCarver c(base);
    HeadScratch h;
    h.xn = c.take<float>(n_c * s.C);
    h.rstd = c.take<float>(n_c);
    h.xn_b = b16 ? c.take<bf16_t>(n_c * s.C) : nullptr;
    h.logits = c.take<float>(n_c * s.V);
    h.dlogits_b = b16 ? c.take<bf16_t>(n_c * s.V) : nullptr;
    h.row_loss = c.take<double>(n_c);
    h.dxn = c.take<float>(n_c * s.C);
    h.norm_ws = c.take_bytes(rmsnorm_backward_workspace_bytes(n_c, s.C));
    h.bytes = c.bytes();
    return h;
  }
};

}  // namespace detail

void head_forward_backward(const GemmContext& gemm, Stream s, const HeadArgs& a) {
  const HeadShape& sh = a.shape;
  const detail::HeadScratch w = detail::HeadScratch::carve(a.workspace, sh, a.lm_type);
  const bool b16 = a.lm_type == DType::bf16;
  const MatType in_type = b16 ? MatType::bf16 : MatType::f32;
  for (int64_t n0 = 0; n0 < sh.N; n0 += sh.chunk_tokens) {
    const int64_t n = sh.N - n0 < sh.chunk_tokens ? sh.N - n0 : sh.chunk_tokens;
    const float* x = a.x + n0 * sh.C;
    rmsnorm_forward(s, w.xn, w.rstd, x, a.norm_w, n, sh.C, sh.eps);
    if (b16) convert(s, w.xn_b, w.xn, n * sh.C);
    const void* xn_op = b16 ? static_cast<const void*>(w.xn_b) : w.xn;
    run_matmul(gemm, linear_forward_matmul(w.logits, MatType::f32, xn_op, a.lm_w, in_type, nullptr, n, sh.V, sh.C),
               s);
    cross_entropy(s, w.logits, w.dlogits_b, w.row_loss, a.targets + n0, n, sh.V, a.grad_scale);
    sum_in_order(s, a.loss, w.row_loss, n);
    const void* dlogits_op = b16 ? static_cast<const void*>(w.dlogits_b) : w.logits;
    run_matmul(gemm, linear_dinput_matmul(w.dxn, dlogits_op, a.lm_w, in_type, n, sh.V, sh.C), s);
    if (a.dlm_w)  // null: a frozen lm_head (model/finetune.h)
      for (const Matmul& mm : linear_dweight_matmuls(a.dlm_w, dlogits_op, xn_op, in_type, n, sh.V, sh.C))
        run_matmul(gemm, mm, s);
    rmsnorm_backward(s, a.dx + n0 * sh.C, a.dnorm_w, w.dxn, x, a.norm_w, w.rstd, n, sh.C, w.norm_ws);
  }
}

}  // namespace lt::cuda::LT_KERNELS_NS
