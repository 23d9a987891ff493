// model/layer_compute.cpp — the CPU layer compute: model/block.h's block and ops/head.h's fused head, run where
// the launch runs (the CPU device's compute stream).
#include "model/layer_compute.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "ops/embedding.h"

namespace lt {
namespace {

class CpuLayerCompute final : public LayerCompute {
 public:
  const char* name() const override { return "cpu"; }
  void bind(const ComputeBinding& binding) override { b_ = binding; }

  void zero(void* ptr, size_t bytes) override { std::memset(ptr, 0, bytes); }

  // Each layer computes with its own kind's shape (hybrid models: the view says which mixer it has) and index.
  BlockShape shape_of(const BlockView& w) const {
    BlockShape s = b_.shape.for_layer(w.kind, w.sparse());
    s.layer = w.layer;
    return s;
  }
  void forward(void* x_out, void* kept, const void* x_in, const BlockView& w) override {
    const BlockShape s = shape_of(w);
    LayerInternals li = bind_internals(kept, b_.working_copy, s);
    block_forward(x_out, li.working, x_in, w, b_.tok, s, li.stored);
  }
  void recompute(void* x_out, const void* x_in, const BlockView& w) override {
    const BlockShape s = shape_of(w);
    LayerInternals li = bind_internals(nullptr, b_.working_copy, s);
    TokenInfo tok = b_.tok;
    tok.moe_aux = nullptr;
    block_forward(x_out, li.working, x_in, w, tok, s, li.stored);
  }
  void recompute_internals(const void* x_in, const BlockView& w) override {
    const BlockShape s = shape_of(w);
    LayerInternals li = bind_internals(nullptr, b_.working_copy, s);
    block_recompute_internals(li.working, x_in, w, b_.tok, s);
  }
  void backward_mlp(BlockGrads& g, const float* dx_out, void* kept, const BlockView& w) override {
    const BlockShape s = shape_of(w);
    LayerInternals li = bind_internals(kept, b_.working_copy, s);
    BlockScratch sc = BlockScratch::bind(b_.backward_scratch, s);
    block_backward_mlp(g, sc, dx_out, li.working, w, b_.tok, s, li.saved, li.stored);
  }
  void backward_attention(float* dx_in, BlockGrads& g, const void* x_in, void* kept, const BlockView& w) override {
    const BlockShape s = shape_of(w);
    LayerInternals li = bind_internals(kept, b_.working_copy, s);
    BlockScratch sc = BlockScratch::bind(b_.backward_scratch, s);
    block_backward_attention(dx_in, g, sc, x_in, li.working, w, b_.tok, s);
  }
  void head(const HeadCall& h) override {
    std::memset(h.grads, 0, h.grads_bytes);
    const float* x = static_cast<const float*>(h.x);
    if (b_.shape.act != DType::f32) {
      parallel_convert_to_f32(h.x32, h.x, b_.shape.act, size_t(h.shape.N * h.shape.C));
      x = h.x32;
    }
    const float* norm_w = h.norm_w;
    std::vector<float> shifted;  // Qwen3.5's zero-centred final norm multiplies by 1 + w (its gradient is w's)
    if (b_.shape.zero_centred) {
      shifted.assign(h.norm_w, h.norm_w + h.shape.C);
      for (float& v : shifted) v += 1.0f;
      norm_w = shifted.data();
    }
    *h.loss = head_forward_backward(h.dx, h.dnorm_w, h.dlm_w, x, h.targets, norm_w, h.lm_w, h.grad_scale, h.shape);
  }
  void embedding_rows(float* rows, const float* dx0, const int32_t* start, const int32_t* order, int64_t P) override {
    embedding_grad_rows(rows, dx0, start, order, P, b_.shape.C);
  }

 private:
  ComputeBinding b_;
};

}  // namespace

std::unique_ptr<LayerCompute> make_cpu_layer_compute() { return std::make_unique<CpuLayerCompute>(); }

std::vector<ComputeBuffer> cpu_compute_buffers(const ModelConfig& cfg, const BlockShape& s) {
  size_t working = 0, scratch = 0;
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    const BlockShape sl = s.for_layer(cfg, l);
    working = std::max(working, WorkingCopy::floats(sl) * sizeof(float));
    scratch = std::max(scratch, BlockScratch::floats(sl) * sizeof(float));
  }
  return {{ComputeBufferRole::working_copy, "working copy", working, ComputeSpan::step, s.act == DType::f32},
          {ComputeBufferRole::backward_scratch, "backward scratch", scratch, ComputeSpan::backward}};
}

HeadBuffers bind_head_buffers(const ModelConfig& cfg, const SlabLayout& head_w, const SlabLayout& embed_w,
                              const SlabLayout& head_g, const SlabLayout& embed_g, const void* weights, void* grads) {
  const bool tied = cfg.tie_word_embeddings;
  const auto* w = static_cast<const uint8_t*>(weights);
  auto* g = static_cast<uint8_t*>(grads);
  HeadBuffers h;
  h.weights_bytes = head_w.bytes() + (tied ? embed_w.bytes() : 0);
  h.grads_bytes = head_g.bytes() + (tied ? embed_g.bytes() : 0);
  h.norm_w = reinterpret_cast<const float*>(w + head_w.entry("norm.weight").offset);
  // A frozen gradient (absent from the trained layouts, model/finetune.h) stays null: the head skips it.
  auto grad = [&](const SlabLayout& layout, size_t base, const char* name) -> float* {
    const SlabEntry* e = layout.find(name);
    return e ? reinterpret_cast<float*>(g + base + size_t(e->offset)) : nullptr;
  };
  h.dnorm_w = grad(head_g, 0, "norm.weight");
  if (tied) {
    const SlabEntry& e = embed_w.entry("embed_tokens.weight");
    h.lm_w = WeightRef{w + head_w.bytes() + e.offset, e.dtype};
    h.dlm_w = grad(embed_g, head_g.bytes(), "embed_tokens.weight");
  } else {
    const SlabEntry& e = head_w.entry("lm_head.weight");
    h.lm_w = WeightRef{w + e.offset, e.dtype};
    h.dlm_w = grad(head_g, 0, "lm_head.weight");
  }
  return h;
}

void bind_compute_buffers(ComputeBinding& b, const std::vector<ComputeBuffer>& buffers, const std::vector<void*>& ptrs) {
  for (size_t i = 0; i < buffers.size(); ++i) {
    void* p = ptrs[i];
    switch (buffers[i].role) {
      case ComputeBufferRole::working_copy: b.working_copy = static_cast<float*>(p); break;
      case ComputeBufferRole::backward_scratch: b.backward_scratch = static_cast<float*>(p); break;
      case ComputeBufferRole::recompute_internals: b.recompute_stored = p; break;
      case ComputeBufferRole::block_scratch: b.block_scratch = p; break;
      case ComputeBufferRole::head_workspace: b.head_workspace = p; break;
      case ComputeBufferRole::loss: break;  // the head call's, not the binding's
      case ComputeBufferRole::rope_table: {
        // cos [T, D/2] at the table, sin after it
        const size_t half = buffers[i].bytes / 2 / sizeof(float);
        b.rope_cos = static_cast<const float*>(p);
        b.rope_sin = p ? static_cast<const float*>(p) + half : nullptr;
        break;
      }
      case ComputeBufferRole::gemm_workspace: b.gemm_workspace = p; break;
    }
  }
}

}  // namespace lt
