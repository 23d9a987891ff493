// model/model.cpp — embedding, L blocks, head; then the same in reverse. All activations kept, the MLP in one
// chunk: the boundaries in the storage dtype; every block's internals as a kept layer holds them (f32 storage:
// the full WorkingCopy; bf16: the stored internals, computed in and widened back into one f32 working copy).
#include "model/model.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "core/aligned.h"
#include "core/error.h"
#include "model/block.h"
#include "ops/ops.h"

namespace lt {
namespace {

// The weights the compute runs on: the master slabs in f32 mode, their bf16 copy in bf16 mode.
struct ComputeWeights {
  std::optional<ModelSlabs> copy;
  const ModelSlabs* w;
  ComputeWeights(const ModelSlabs& params, ComputeType compute) : w(&params) {
    if (compute == ComputeType::bf16) {
      copy.emplace(params.config(), DType::bf16);
      make_compute_copy(*copy, params);
      w = &*copy;
    }
  }
};

WeightRef weight_ref(const TensorView& v) { return WeightRef{v.data, v.dtype}; }

// The final norm's weight as the head multiplies by: as stored, or 1 + w (f32) for Qwen3.5's zero-centred norm,
// whose gradient is the stored weight's.
class FinalNormWeight {
 public:
  explicit FinalNormWeight(const ModelSlabs& w) : ptr_(w.tensor(SlabKind::head, 0, "norm.weight").ptr<float>()) {
    if (!w.config().zero_centred_norms) return;
    shifted_.resize(size_t(w.config().hidden_size));
    for (size_t i = 0; i < shifted_.size(); ++i) shifted_[i] = 1.0f + ptr_[i];
    ptr_ = shifted_.data();
  }
  const float* get() const { return ptr_; }

 private:
  const float* ptr_;
  std::vector<float> shifted_;
};

HeadShape head_shape(const ModelConfig& cfg, int64_t N) {
  return HeadShape{N, cfg.hidden_size, cfg.vocab_size, float(cfg.rms_norm_eps)};
}

// Forward through embedding and blocks, keeping boundaries x[0..L] and every block's internals.
struct ForwardState {
  BlockShape shape;
  StepTokens tok;
  TokenInfo info;
  uint8_t* boundaries = nullptr;  // (L+1) x [N, C] in the storage dtype
  uint8_t* internals = nullptr;   // L x block_stored_bytes
  float* work = nullptr;          // the f32 working copy (WorkingCopy; bf16 storage only)
  float* x32 = nullptr;           // [N, C] f32: the embedding output and the head input at bf16 storage
  std::vector<LayerInternals> layers;  // [L] every layer's, kept (bind_internals)
  std::vector<size_t> offsets;     // [L] byte offset of each layer's internals in `internals`
  void* stored(int64_t l) { return internals + offsets[size_t(l)]; }
  void* boundary(int64_t i) { return boundaries + size_t(i) * shape.boundary_bytes(); }
  // Boundary i as f32 (widened into x32 at bf16 storage).
  const float* boundary_f32(int64_t i) {
    if (shape.act == DType::f32) return static_cast<const float*>(boundary(i));
    parallel_convert_to_f32(x32, boundary(i), shape.act, size_t(shape.N() * shape.C));
    return x32;
  }
};

// training: LoRA's dropout on (model/lora.h); off for a forward alone (an evaluation), as torch's eval mode.
void run_forward(ForwardState& st, const ModelSlabs& params, const ModelSlabs& cw, const Batch& batch,
                 DType activations, Workspace& ws, MoeAuxLoss* aux = nullptr, bool training = true) {
  const ModelConfig& cfg = params.config();
  const int64_t L = cfg.num_layers, N = batch.N(), C = cfg.hidden_size;
  st.shape = BlockShape::make(cfg, batch.B, batch.T, activations);
  if (!training) st.shape.lora.dropout = 0;
  st.tok = StepTokens::make(batch);
  st.info = TokenInfo{st.tok.pos.data(), batch.doc_ids.empty() ? nullptr : batch.doc_ids.data(), aux, batch.dropout_key};
  st.boundaries = ws.get<uint8_t>("boundaries", size_t(L + 1) * st.shape.boundary_bytes());
  // Each layer's internals by its kind (hybrid models: linear-attention layers hold the mixer's instead).
  size_t internals_bytes = 0, work_floats = 0;
  for (int64_t l = 0; l < L; ++l) {
    const BlockShape sl = st.shape.for_layer(cfg, l);
    st.offsets.push_back(internals_bytes);
    internals_bytes += align_up(block_stored_bytes(sl), 64);
    work_floats = std::max(work_floats, WorkingCopy::floats(sl));
  }
  st.internals = ws.get<uint8_t>("internals", internals_bytes);
  const bool b16 = activations != DType::f32;
  if (b16) st.work = ws.get<float>("working copy", work_floats);
  st.x32 = ws.get<float>("boundary f32", size_t(N * C));

  float* x0 = activations == DType::f32 ? static_cast<float*>(st.boundary(0)) : st.x32;
  embedding_forward(x0, batch.input_ids.data(), params.tensor(SlabKind::embedding, 0, "embed_tokens.weight").ptr<float>(),
                    N, C, cfg.vocab_size);
  if (activations != DType::f32) parallel_convert_from_f32(st.boundary(0), activations, x0, size_t(N * C));
  for (int64_t l = 0; l < L; ++l) {
    const BlockShape sl = st.shape.for_layer(cfg, l);
    st.layers.push_back(bind_internals(st.stored(l), st.work, sl));
    LayerInternals& li = st.layers.back();
    BlockView w = BlockView::bind(cw.layout(SlabKind::layer, l), cw.layer(l));
    block_forward(st.boundary(l + 1), li.working, st.boundary(l), w, st.info, sl, li.stored);
  }
  if (aux) aux->finish();
}

}  // namespace

LossResult model_forward(const ModelSlabs& params, const Batch& batch, Precision precision, Workspace* ws) {
  Workspace local;
  Workspace& w = ws ? *ws : local;
  ComputeWeights cw(params, precision.compute);
  ForwardState st;
  run_forward(st, params, *cw.w, batch, precision.activations, w, nullptr, /*training=*/false);
  const ModelConfig& cfg = params.config();
  double loss = head_forward(st.boundary_f32(cfg.num_layers), st.tok.targets.data(),
                             FinalNormWeight(*cw.w).get(),
                             weight_ref(cw.w->lm_head()), head_shape(cfg, batch.N()));
  return LossResult{loss, st.tok.count};
}

LossResult model_forward_backward(ModelSlabs& grads, const ModelSlabs& params, const Batch& batch,
                                  Precision precision, Workspace* ws, double moe_aux_coef) {
  Workspace local;
  Workspace& w = ws ? *ws : local;
  const ModelConfig& cfg = params.config();
  LT_CHECK(grads.num_layers() == cfg.num_layers && grads.matrix_dtype() == DType::f32,
           "gradient slabs must be f32 slabs of the same model");
  ComputeWeights cw(params, precision.compute);
  ForwardState st;
  std::optional<MoeAuxLoss> aux;
  if (cfg.is_moe())
    aux.emplace(cfg.num_experts, batch.attention_mask.empty() ? nullptr : batch.attention_mask.data(), moe_aux_coef);
  run_forward(st, params, *cw.w, batch, precision.activations, w, aux ? &*aux : nullptr);
  LT_CHECK(st.tok.count > 0,
           "the batch has no counted token: every label after the first position of each row is -100");

  const int64_t L = cfg.num_layers, N = batch.N(), C = cfg.hidden_size;
  float* dx = w.get<float>("dx", size_t(N * C));
  float* dx_prev = w.get<float>("dx_prev", size_t(N * C));
  // A frozen final norm or lm_head (model/finetune.h) has no gradient: the head skips it.
  float* dlm = static_cast<float*>(grads.lm_head().data);
  float* dnorm = grads.has(SlabKind::head, 0, "norm.weight") ? grads.tensor(SlabKind::head, 0, "norm.weight").ptr<float>()
                                                              : nullptr;
  double loss = head_forward_backward(dx, dnorm, dlm, st.boundary_f32(L), st.tok.targets.data(),
                                      FinalNormWeight(*cw.w).get(),
                                      weight_ref(cw.w->lm_head()), float(1.0 / double(st.tok.count)),
                                      head_shape(cfg, N));

  size_t scratch_floats = 0;
  for (int64_t l = 0; l < L; ++l)
    scratch_floats = std::max(scratch_floats, BlockScratch::floats(st.shape.for_layer(cfg, l)));
  float* scratch_buffer = w.get<float>("scratch", scratch_floats);
  for (int64_t l = L - 1; l >= 0; --l) {
    const BlockShape sl = st.shape.for_layer(cfg, l);
    BlockScratch scratch = BlockScratch::bind(scratch_buffer, sl);
    BlockView w = BlockView::bind(cw.w->layout(SlabKind::layer, l), cw.w->layer(l));
    BlockGrads g = BlockGrads::bind(grads.layout(SlabKind::layer, l), grads.layer(l));
    const LayerInternals& li = st.layers[size_t(l)];
    block_backward(dx_prev, g, scratch, dx, st.boundary(l), li.working, w, st.info, sl, li.saved, li.stored);
    std::swap(dx, dx_prev);
  }
  if (grads.has(SlabKind::embedding, 0, "embed_tokens.weight"))
    embedding_backward(grads.tensor(SlabKind::embedding, 0, "embed_tokens.weight").ptr<float>(), dx,
                       batch.input_ids.data(), N, C, cfg.vocab_size);
  return LossResult{loss, st.tok.count, aux ? aux->value() : 0.0};
}

}  // namespace lt
