// model/layout.h — where every parameter lives in host memory.
//
// Each decoder layer's parameters lie in ONE contiguous slab, 4 KiB-aligned, in a fixed order with
// named offsets, so a whole layer moves host->device (or to NVMe) as one copy. The same layout, with the
// same element offsets, serves the f32 master weights, the f32 gradients and the optimizer states.
// The embedding and the head (final norm + lm_head when untied) are slabs of their own.
//
// A "compute copy" layout stores the matrices in the compute dtype (bf16 in bf16 mode) and the vectors
// (norm weights, biases) in f32: it is what the executor streams to the device.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "model/config.h"

namespace lt {

enum class SlabKind : uint8_t { embedding, layer, head };

struct SlabEntry {
  std::string name;   // HF suffix within the slab, e.g. "self_attn.q_proj.weight"
  Shape shape;        // e.g. [Hq*D, C]
  DType dtype;        // f32, or the compute dtype for matrices in a compute-copy layout
  int64_t offset;     // bytes from the slab start, 64-byte aligned
  bool is_matrix() const { return shape.size() == 2; }
  int64_t numel() const { return shape_numel(shape); }
};

class SlabLayout {
 public:
  // matrix_dtype: f32 for master/grad/optimizer slabs; bf16 for the bf16 compute copy. A layer slab's entries
  // depend on its token mixer (hybrid models: model/config.h lists both kinds' tensors) and on whether its MLP is
  // sparse (MoE: the router and every expert's matrices); make_layer takes layer `layer`'s from the config.
  static SlabLayout make(const ModelConfig& cfg, SlabKind kind, DType matrix_dtype = DType::f32,
                         LayerKind layer_kind = LayerKind::full_attention, bool sparse = false);
  static SlabLayout make_layer(const ModelConfig& cfg, int64_t layer, DType matrix_dtype = DType::f32);
  // The trained state's layout of a slab (layer `layer` for SlabKind::layer): the entries cfg.trains, f32, in the
  // same order, packed (model/finetune.h) — what the f32 masters, the gradients and the optimizer states hold. Every
  // entry under full fine-tuning (make's f32 layout); none, 0 bytes, for a frozen slab.
  static SlabLayout trained(const ModelConfig& cfg, SlabKind kind, int64_t layer = 0);
  // These entries, in this order, where `whole` lays them out (each one's offset and dtype there; bytes() whole's):
  // a trained layout's tensors inside the streamed slab, to move them by the trained layout's chunks (dist/).
  SlabLayout placed_in(const SlabLayout& whole) const;

  SlabKind kind() const { return kind_; }
  LayerKind layer_kind() const { return layer_kind_; }  // a layer slab's token mixer
  const std::vector<SlabEntry>& entries() const { return entries_; }
  const SlabEntry& entry(const std::string& name) const;  // error naming the tensor if absent
  const SlabEntry* find(const std::string& name) const;   // nullptr if absent
  size_t bytes() const { return bytes_; }                   // padded to 4 KiB
  int64_t num_parameters() const;                           // Σ numel, padding excluded
  // A layer slab's MLP half (post_attention_layernorm and the MLP, the tail of the slab: the block's backward makes
  // its gradients first, model/block.h) starts here; bytes() when the slab has none of it.
  size_t mlp_offset() const;

  // HF name of an entry in layer `layer` ("model.layers.3.self_attn.q_proj.weight"), or of the
  // embedding / head entries ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"). `prefix` is
  // the text model's (hf_prefix below).
  static std::string hf_name(SlabKind kind, int64_t layer, const std::string& entry_name,
                             const std::string& prefix = "model.");

 private:
  SlabKind kind_ = SlabKind::layer;
  LayerKind layer_kind_ = LayerKind::full_attention;
  std::vector<SlabEntry> entries_;
  std::unordered_map<std::string, size_t> index_;  // entry by name (a sparse layer has 3·E + 3 of them)
  size_t bytes_ = 0;
};

// Where a checkpoint keeps the text model's tensors: "model.", or "model.language_model." in the released
// vision-language form of Qwen3.5 (lm_head.weight stays at the top in both).
std::string hf_prefix(const ModelConfig& cfg);

}  // namespace lt
