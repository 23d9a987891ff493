// model/weights.h — a model's parameters (or gradients, or any per-parameter state) as host slabs.
//
// ModelSlabs holds one slab per layer plus the embedding and head slabs, each laid out by
// model/layout.h. The same type holds the f32 master weights, the f32 gradients and (with a bf16
// matrix layout) the compute copy streamed to the device.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/aligned.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/layout.h"

namespace lt {

// Which tensors a ModelSlabs holds: every one (the model's weights, streamed or saved), or the trained ones alone
// (f32 masters and gradients, SlabLayout::trained: under freeze fine-tuning a frozen layer's slab is empty).
enum class SlabSet : uint8_t { all, trained };

class ModelSlabs {
 public:
  ModelSlabs() = default;
  // Zero-filled slabs for `cfg`, matrices stored as `matrix_dtype` (f32 or bf16; a trained set is f32).
  // `fill` none: the slabs' pages are not touched here (they fault in where first written): a data-parallel rank's
  // gradients, of which it only ever writes and reads the chunks it owns.
  ModelSlabs(const ModelConfig& cfg, DType matrix_dtype = DType::f32, Fill fill = Fill::zero, SlabSet set = SlabSet::all);

  const ModelConfig& config() const { return cfg_; }
  DType matrix_dtype() const { return matrix_dtype_; }
  SlabSet set() const { return set_; }
  // Whether slab `kind` (layer `layer`) holds entry `name`.
  bool has(SlabKind kind, int64_t layer, const std::string& name) const { return layout(kind, layer).find(name); }
  int64_t num_layers() const { return int64_t(layers_.size()); }

  // The layout of a slab; for SlabKind::layer, of layer `layer` (hybrid models: its token mixer's layout).
  const SlabLayout& layout(SlabKind kind, int64_t layer = 0) const;
  uint8_t* slab(SlabKind kind, int64_t layer = 0);
  const uint8_t* slab(SlabKind kind, int64_t layer = 0) const;
  uint8_t* layer(int64_t i) { return slab(SlabKind::layer, i); }
  const uint8_t* layer(int64_t i) const { return slab(SlabKind::layer, i); }

  // An entry of a slab as a view (e.g. tensor(SlabKind::layer, 3, "mlp.up_proj.weight")).
  TensorView tensor(SlabKind kind, int64_t layer, const std::string& name) const;
  // Every parameter with its HF name, in a fixed order (embedding, layers 0..L-1, head).
  struct Named {
    std::string hf_name;
    TensorView view;
  };
  std::vector<Named> named_tensors() const;
  // The embedding table doubles as lm_head when tied: the head's lm_head view resolves to it. A trained set without
  // it (frozen): an empty view (null data).
  TensorView lm_head() const;

  void zero();
  size_t total_bytes() const;

 private:
  ModelConfig cfg_;
  DType matrix_dtype_ = DType::f32;
  SlabSet set_ = SlabSet::all;
  SlabLayout embed_layout_, head_layout_;
  // By LayerKind, sparse (MoE) or dense MLP, and whether the layer trains (a trained set; 1 for every layer of the
  // full set): the model's kinds only.
  SlabLayout layer_layouts_[kLayerKinds][2][2];
  const SlabLayout& layer_layout(int64_t layer) const;
  AlignedBuffer<uint8_t> embed_, head_;
  std::vector<AlignedBuffer<uint8_t>> layers_;
};

// Tensors of a checkpoint that we load but do not train: qwen3_5's vision tower (model.visual.*) and
// multi-token-prediction head (mtp.*), in either checkpoint form. False for every other model type.
bool is_untrained_tensor(const ModelConfig& cfg, const std::string& hf_name);

// A tensor exactly as a checkpoint stores it, carried into saved checkpoints byte for byte.
struct RawTensor {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  std::vector<uint8_t> bytes;  // row-major, as in the file
};

// What a checkpoint holds beyond the trained f32 slabs, so a save writes the same kind of model back.
struct SavedExtras {
  std::vector<RawTensor> carried;  // the untrained tensors (is_untrained_tensor), sorted by name
  // Trained tensors the checkpoint stores as F32 although its torch_dtype is bf16 or f16 (qwen3_5's A_log and
  // gated norm): a half-precision save keeps them F32.
  std::set<std::string> keep_f32;
  // The checkpoint held a sparse layer's experts fused (transformers 5.x: mlp.experts.gate_up_proj [E, 2·Ie, C],
  // gate rows first, and mlp.experts.down_proj [E, C, Ie]) rather than one tensor per expert: a save writes them
  // fused again. The slabs hold them per expert either way (model/layout.h).
  bool fused_experts = false;
};

// The fused names of layer `layer`'s experts (hf_prefix included): {gate_up_proj, down_proj}.
std::pair<std::string, std::string> fused_expert_names(const ModelConfig& cfg, int64_t layer);

// Loads an HF model directory (config.json + model.safetensors or a sharded index) into f32 slabs.
// Weights on disk may be f32, bf16 or f16. Missing and unexpected tensors are errors naming them; untrained
// tensors are not unexpected: they are read raw into extras.carried.
struct LoadedModel {
  ModelConfig config;
  ModelSlabs params;
  SavedExtras extras;
};
// `only` (optional): the elements to read of the tensors it names (by HF name); the rest of those tensors is left
// unwritten and its pages untouched — a data-parallel rank's sharded f32 masters (dist/data_parallel.h).
using TensorRanges = std::map<std::string, ElementRange>;
LoadedModel load_hf_model(const std::string& dir, const TensorRanges* only = nullptr);
// The range of `name` in `only` (every element when either is absent).
ElementRange range_of(const TensorRanges* only, const std::string& name);

// Loads `dir` a slab at a time — the embedding and the head, then each layer (a checkpoint of fused experts: the layers
// in one pass) — each pass reading only its slabs' tensors into f32 slabs whose other pages are never touched, and
// handing them to `take` (the pass's f32 slabs, which slab) before they are released: a model read into other
// slabs (a frozen run's streamed weights and masters) without its f32 copy ever existing whole. `extras`: what
// load_hf_model's would be.
using SlabTaker = std::function<void(const ModelSlabs& pass, SlabKind kind, int64_t layer)>;
void load_hf_model_by_slab(const std::string& dir, const SlabTaker& take, SavedExtras* extras);
// copy_tensors_by_name for one slab (the entries of slab `kind` / `layer` both have).
size_t copy_slab_by_name(ModelSlabs& dst, const ModelSlabs& src, SlabKind kind, int64_t layer);

// Random initialisation for training from scratch: matrices N(0, std), norm weights 1, biases 0. qwen3_5 as
// transformers' Qwen3_5PreTrainedModel._init_weights: zero-centred norms (decoder, final, q/k) 0, the gated
// norm (linear_attn.norm) 1, linear_attn.A_log = log U(0.01, 16), linear_attn.dt_bias 1, conv1d N(0, std).
// One normal draw per N(0, std) element and one uniform draw per A_log element, in named_tensors() order, from
// one Rng(seed): init_random_reference draws them so, in turn; init_random gives the same bits in parallel chunks.
void init_random(ModelSlabs& params, uint64_t seed, float std = 0.02f);
void init_random_reference(ModelSlabs& params, uint64_t seed, float std = 0.02f);

// The bf16 (or f32) compute copy of f32 master slabs: matrices converted, vectors copied.
void make_compute_copy(ModelSlabs& dst, const ModelSlabs& master);

// Writes slabs as one safetensors file of HF names in `dtype` (f32 or bf16). Used for model files
// and for gradient dumps (`lazytrain grad`).
void save_safetensors(const ModelSlabs& slabs, const std::string& path, DType dtype);

// Writes an HF model directory: config.json and model.safetensors (sharded beyond max_shard_bytes). The trained
// tensors are written in `dtype` except extras.keep_f32 ones (F32), beside every extras.carried tensor as loaded.
// `params` a trained set (freeze fine-tuning, model/finetune.h): `frozen`, the streamed weights, gives the rest.
void save_hf_model(const ModelSlabs& params, const std::string& dir, DType dtype, size_t max_shard_bytes,
                   const SavedExtras& extras = {}, const ModelSlabs* frozen = nullptr);

// The tensors `cfg` trains (SlabSet::trained) from `all`, f32 slabs of every tensor (of `cfg`'s model, loaded before
// its fine-tuning was known): freeze fine-tuning's masters.
ModelSlabs trained_tensors(const ModelConfig& cfg, const ModelSlabs& all);
// Every tensor of `dst` that `src` has by HF name, converted to `dst`'s dtype (f32 / bf16 either way); the others
// untouched. Returns how many were copied.
size_t copy_tensors_by_name(ModelSlabs& dst, const ModelSlabs& src);

// Every tensor in f32: the trained ones from `trained`, the rest widened from `weights` (the streamed weights).
ModelSlabs merged_f32(const ModelSlabs& trained, const ModelSlabs& weights);

}  // namespace lt
