// cuda/layers/compute.inl — the GPU layer compute (model/layer_compute.h) on this build's block and head
// (cuda/layers/block.inl, head.inl): host code compiled into both namespaces, like them. Natively every call
// enqueues on the CUDA device's compute stream and the GEMMs go through one cuBLASLt handle; under cuda-sim the
// calls run to completion where the launch runs them (the CPU device's compute stream).
//
// The CUDA block stores bf16 activations: a kept layer's internals go into its kept buffer; a layer that does
// not keep them writes its forward's attention half and n2 into the step's "recompute internals" buffer
// (overwritten layer by layer: only the output matters then; its MLP's go through the chunk scratch, so the buffer
// holds no [N, I] internals), where its backward recomputes them (block_recompute_internals, then the MLP per
// chunk with Saved::recompute), which gives the kept layer's bits.
#pragma once

#include <memory>

#include "core/error.h"
#include "cuda/layers.h"
#include "cuda/layers/block.inl"
#include "cuda/layers/head.inl"
#include "model/layer_compute.h"

namespace lt::cuda::LT_KERNELS_NS {
namespace detail {

class CudaLayerCompute final : public LayerCompute {
 public:
  explicit CudaLayerCompute(Stream stream) : s_(stream) {
#if LT_LAYERS_NATIVE
    cublas_ = std::make_unique<CublasLt>(kGemmWorkspaceBytes);
    gemm_.cublas = cublas_.get();
#endif
  }
  const char* name() const override { return LT_LAYERS_NATIVE ? "cuda" : "cuda-sim"; }

  void bind(const ComputeBinding& b) override {
    LT_CHECK(b.shape.act == DType::bf16,
             "the CUDA block stores bf16 activations; {} activation storage is the CPU block's (activation_dtype)",
             dtype_name(b.shape.act));
    LT_CHECK(b.block_scratch && b.head_workspace && b.rope_cos && b.rope_sin && (b.gemm_workspace || !LT_LAYERS_NATIVE),
             "GPU layer compute: the step's binding lacks the block scratch, head workspace, RoPE table or GEMM "
             "workspace");
    b_ = b;
    blk_ = CudaBlock{b.shape, BlockView{}, b.tok, b.rope_cos, b.rope_sin, b.block_scratch};
    gemm_.workspace = b.gemm_workspace;
  }

  void zero(void* ptr, size_t bytes) override {
    LT_CHECK(bytes % 4 == 0, "zero: {} bytes is not a whole number of f32", bytes);
    cuda::LT_KERNELS_NS::zero(s_, static_cast<float*>(ptr), int64_t(bytes / 4));
  }

  void forward(void* x_out, void* kept, const void* x_in, const BlockView& w) override {
    block_forward(gemm_, s_, with(w), static_cast<bf16_t*>(x_out), stored(kept), static_cast<const bf16_t*>(x_in),
                  kept ? Saved::stored : Saved::recompute);
  }
  // A recompute routes as the forward did but adds nothing to the auxiliary loss (model/moe_ffn.h).
  void recompute(void* x_out, const void* x_in, const BlockView& w) override {
    block_forward(gemm_, s_, with(w, false), static_cast<bf16_t*>(x_out), stored(nullptr),
                  static_cast<const bf16_t*>(x_in), Saved::recompute);
  }
  void recompute_internals(const void* x_in, const BlockView& w) override {
    block_recompute_internals(gemm_, s_, with(w), b_.recompute_stored, static_cast<const bf16_t*>(x_in));
  }
  void backward_mlp(BlockGrads& g, const float* dx_out, void* kept, const BlockView& w) override {
    block_backward_mlp(gemm_, s_, with(w), g, dx_out, stored(kept), kept ? Saved::stored : Saved::recompute);
  }
  void backward_attention(float* dx_in, BlockGrads& g, const void* x_in, void* kept, const BlockView& w) override {
    block_backward_attention(gemm_, s_, with(w), dx_in, g, static_cast<const bf16_t*>(x_in), stored(kept));
  }

  void head(const HeadCall& h) override {
    zero(h.grads, h.grads_bytes);
    zero(h.loss, sizeof(double));  // all-zero bits are 0.0; the head adds each chunk's losses to it
    convert(s_, h.x32, static_cast<const bf16_t*>(h.x), h.shape.N * h.shape.C);
    HeadArgs a;
    a.dx = h.dx, a.dnorm_w = h.dnorm_w, a.dlm_w = h.dlm_w, a.loss = h.loss, a.x = h.x32, a.targets = h.targets;
    a.norm_w = h.norm_w, a.lm_w = h.lm_w.data, a.lm_type = h.lm_w.dtype, a.grad_scale = h.grad_scale;
    if (b_.shape.zero_centred) {  // Qwen3.5's final norm multiplies by 1 + w (its gradient is w's), made in the
      // block scratch's norm-weight space, which no layer holds across the head
      float* shifted = BlockScratchCuda::carve(b_.block_scratch, b_.shape.for_layer(LayerKind::full_attention)).onew;
      norm_weight_one_plus(s_, shifted, h.norm_w, h.shape.C);
      a.norm_w = shifted;
    }
    a.shape = gpu_head_shape(h.shape), a.workspace = b_.head_workspace;  // the working set's chunks
    head_forward_backward(gemm_, s_, a);
  }
  void embedding_rows(float* rows, const float* dx0, const int32_t* start, const int32_t* order, int64_t P) override {
    embedding_grad_rows(s_, rows, dx0, start, order, P, b_.shape.C);
  }

 private:
  CudaBlock with(const BlockView& w, bool moe_aux = true) const {
    CudaBlock blk = blk_;
    blk.shape = b_.shape.for_layer(w.kind, w.sparse());  // a layer's own mixer kind and MLP (dense or sparse)
    blk.shape.layer = w.layer;                            // keys its adapters' dropout masks (model/lora.h)
    blk.weights = w;
    if (w.sparse()) detail::check_gpu_sparse_layer(blk.shape, w.moe);
    if (!moe_aux) blk.tok.moe_aux = nullptr;
    return blk;
  }
  void* stored(void* kept) const { return kept ? kept : b_.recompute_stored; }

  Stream s_;
  GemmContext gemm_;
  ComputeBinding b_;
  CudaBlock blk_;
#if LT_LAYERS_NATIVE
  std::unique_ptr<CublasLt> cublas_;
#endif
};

}  // namespace detail

std::unique_ptr<LayerCompute> make_layer_compute(Stream compute) {
  return std::make_unique<detail::CudaLayerCompute>(compute);
}

}  // namespace lt::cuda::LT_KERNELS_NS
