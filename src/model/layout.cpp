#include "model/layout.h"

#include <fmt/format.h>

#include "core/aligned.h"
#include "core/error.h"
#include "model/finetune.h"

namespace lt {
namespace {

class Builder {
 public:
  Builder(DType matrix_dtype) : matrix_dtype_(matrix_dtype) {}
  void add(std::string name, Shape shape) {
    DType dt = shape.size() == 2 ? matrix_dtype_ : DType::f32;
    offset_ = align_up(offset_, 64);
    int64_t bytes = shape_numel(shape) * int64_t(dtype_size(dt));
    entries.push_back({std::move(name), std::move(shape), dt, int64_t(offset_)});
    offset_ += size_t(bytes);
  }
  size_t bytes() const { return align_up(offset_, kPageAlign); }
  std::vector<SlabEntry> entries;

 private:
  DType matrix_dtype_;
  size_t offset_ = 0;
};

// A LoRA adapter's two matrices (model/finetune.h) right after the linear `prefix` ([out, in]) when it has one: A [r, in]
// and B [out, r], PEFT's names. In the slab's order, so an adapter of the MLP is in the MLP half.
void add_adapter(Builder& b, const ModelConfig& cfg, const std::string& prefix, int64_t in, int64_t out) {
  if (!cfg.finetune || !cfg.finetune->adapts(prefix)) return;
  b.add(prefix + ".lora_A.weight", {cfg.finetune->rank, in});
  b.add(prefix + ".lora_B.weight", {out, cfg.finetune->rank});
}

}  // namespace

SlabLayout SlabLayout::make(const ModelConfig& cfg, SlabKind kind, DType matrix_dtype, LayerKind layer_kind,
                            bool sparse) {
  LT_CHECK(matrix_dtype == DType::f32 || matrix_dtype == DType::bf16,
           "slab matrices are f32 or bf16, not {}", dtype_name(matrix_dtype));
  const int64_t C = cfg.hidden_size, I = cfg.intermediate_size, V = cfg.vocab_size, D = cfg.head_dim;
  const int64_t QPD = cfg.q_proj_dim(), QD = cfg.q_dim(), KVD = cfg.kv_dim();
  Builder b(matrix_dtype);
  switch (kind) {
    case SlabKind::embedding:
      b.add("embed_tokens.weight", {V, C});
      break;
    case SlabKind::head:
      b.add("norm.weight", {C});
      if (!cfg.tie_word_embeddings) b.add("lm_head.weight", {V, C});
      break;
    case SlabKind::layer:
      // Order follows the forward pass, so a reader of a slab dump sees the computation in order; the MLP is the
      // tail from post_attention_layernorm on (kMlpGradsFirst, model/block.h) whatever the token mixer.
      b.add("input_layernorm.weight", {C});
      if (layer_kind == LayerKind::linear_attention) {
        LT_CHECK(cfg.linear_conv_dim() > 0 && cfg.linear_conv_kernel_dim > 0,
                 "model '{}' has no Gated DeltaNet sizes: no linear-attention layer layout",
                 model_type_name(cfg.type));
        const int64_t Dc = cfg.linear_conv_dim(), VD = cfg.linear_value_dim(), Hv = cfg.linear_num_value_heads;
        b.add("linear_attn.in_proj_qkv.weight", {Dc, C});
        add_adapter(b, cfg, "linear_attn.in_proj_qkv", C, Dc);
        b.add("linear_attn.in_proj_z.weight", {VD, C});
        add_adapter(b, cfg, "linear_attn.in_proj_z", C, VD);
        b.add("linear_attn.in_proj_b.weight", {Hv, C});
        add_adapter(b, cfg, "linear_attn.in_proj_b", C, Hv);
        b.add("linear_attn.in_proj_a.weight", {Hv, C});
        add_adapter(b, cfg, "linear_attn.in_proj_a", C, Hv);
        b.add("linear_attn.conv1d.weight", {Dc, 1, cfg.linear_conv_kernel_dim});  // 3-D: an f32 vector here
        b.add("linear_attn.dt_bias", {Hv});
        b.add("linear_attn.A_log", {Hv});
        b.add("linear_attn.norm.weight", {cfg.linear_value_head_dim});
        b.add("linear_attn.out_proj.weight", {C, VD});
        add_adapter(b, cfg, "linear_attn.out_proj", VD, C);
      } else {
        b.add("self_attn.q_proj.weight", {QPD, C});  // [query D | gate D] per head with the output gate
        if (cfg.qkv_bias) b.add("self_attn.q_proj.bias", {QPD});
        add_adapter(b, cfg, "self_attn.q_proj", C, QPD);
        b.add("self_attn.k_proj.weight", {KVD, C});
        if (cfg.qkv_bias) b.add("self_attn.k_proj.bias", {KVD});
        add_adapter(b, cfg, "self_attn.k_proj", C, KVD);
        b.add("self_attn.v_proj.weight", {KVD, C});
        if (cfg.qkv_bias) b.add("self_attn.v_proj.bias", {KVD});
        add_adapter(b, cfg, "self_attn.v_proj", C, KVD);
        if (cfg.qk_norm) {
          b.add("self_attn.q_norm.weight", {D});
          b.add("self_attn.k_norm.weight", {D});
        }
        b.add("self_attn.o_proj.weight", {C, QD});
        if (cfg.o_bias) b.add("self_attn.o_proj.bias", {C});
        add_adapter(b, cfg, "self_attn.o_proj", QD, C);
        if (cfg.attention_sinks) b.add("self_attn.sinks", {cfg.num_heads});
      }
      b.add("post_attention_layernorm.weight", {C});
      if (sparse) {
        // The router, then each expert's three matrices together (mlp.experts.{e}.*, the per-expert checkpoint
        // names; fused checkpoints map onto them on load and save, model/weights.cpp).
        LT_CHECK(cfg.is_moe(), "model '{}' has no experts: no sparse layer layout", model_type_name(cfg.type));
        const int64_t E = cfg.num_experts, Ie = cfg.moe_intermediate_size;
        if (cfg.gpt_oss()) {  // the router and every expert with biases (GPT-OSS's fused tensors, per expert here)
          b.add("mlp.router.weight", {E, C});
          b.add("mlp.router.bias", {E});
          for (int64_t e = 0; e < E; ++e) {
            for (const char* m : {"gate_proj", "up_proj"}) {
              b.add(fmt::format("mlp.experts.{}.{}.weight", e, m), {Ie, C});
              b.add(fmt::format("mlp.experts.{}.{}.bias", e, m), {Ie});
            }
            b.add(fmt::format("mlp.experts.{}.down_proj.weight", e), {C, Ie});
            b.add(fmt::format("mlp.experts.{}.down_proj.bias", e), {C});
          }
          break;
        }
        b.add("mlp.gate.weight", {E, C});
        add_adapter(b, cfg, "mlp.gate", C, E);
        for (int64_t e = 0; e < E; ++e) {  // (a LoRA adapter beside each expert's matrix)
          const std::string p = fmt::format("mlp.experts.{}.", e);
          b.add(p + "gate_proj.weight", {Ie, C});
          add_adapter(b, cfg, p + "gate_proj", C, Ie);
          b.add(p + "up_proj.weight", {Ie, C});
          add_adapter(b, cfg, p + "up_proj", C, Ie);
          b.add(p + "down_proj.weight", {C, Ie});
          add_adapter(b, cfg, p + "down_proj", Ie, C);
        }
        if (const int64_t Is = cfg.shared_expert_intermediate_size) {  // qwen3_5_moe's shared expert and its gate
          b.add("mlp.shared_expert.gate_proj.weight", {Is, C});
          add_adapter(b, cfg, "mlp.shared_expert.gate_proj", C, Is);
          b.add("mlp.shared_expert.up_proj.weight", {Is, C});
          add_adapter(b, cfg, "mlp.shared_expert.up_proj", C, Is);
          b.add("mlp.shared_expert.down_proj.weight", {C, Is});
          add_adapter(b, cfg, "mlp.shared_expert.down_proj", Is, C);
          b.add("mlp.shared_expert_gate.weight", {1, C});
          add_adapter(b, cfg, "mlp.shared_expert_gate", C, 1);
        }
        break;
      }
      b.add("mlp.gate_proj.weight", {I, C});
      if (cfg.mlp_bias) b.add("mlp.gate_proj.bias", {I});
      add_adapter(b, cfg, "mlp.gate_proj", C, I);
      b.add("mlp.up_proj.weight", {I, C});
      if (cfg.mlp_bias) b.add("mlp.up_proj.bias", {I});
      add_adapter(b, cfg, "mlp.up_proj", C, I);
      b.add("mlp.down_proj.weight", {C, I});
      if (cfg.mlp_bias) b.add("mlp.down_proj.bias", {C});
      add_adapter(b, cfg, "mlp.down_proj", I, C);
      break;
  }
  SlabLayout layout;
  layout.kind_ = kind;
  layout.layer_kind_ = layer_kind;
  layout.entries_ = std::move(b.entries);
  layout.bytes_ = b.bytes();
  for (size_t i = 0; i < layout.entries_.size(); ++i) layout.index_.emplace(layout.entries_[i].name, i);
  return layout;
}

const SlabEntry* SlabLayout::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

const SlabEntry& SlabLayout::entry(const std::string& name) const {
  const SlabEntry* e = find(name);
  LT_CHECK(e != nullptr, "no tensor '{}' in this slab layout", name);
  return *e;
}

int64_t SlabLayout::num_parameters() const {
  int64_t n = 0;
  for (const auto& e : entries_) n += e.numel();
  return n;
}

SlabLayout SlabLayout::make_layer(const ModelConfig& cfg, int64_t layer, DType matrix_dtype) {
  return make(cfg, SlabKind::layer, matrix_dtype, cfg.layer_kind(layer), cfg.sparse_layer(layer));
}

SlabLayout SlabLayout::trained(const ModelConfig& cfg, SlabKind kind, int64_t layer) {
  SlabLayout all = kind == SlabKind::layer ? make_layer(cfg, layer) : make(cfg, kind);
  if (cfg.trains_all()) return all;
  Builder b(DType::f32);
  for (const SlabEntry& e : all.entries_)
    if (cfg.trains(kind, layer, e.name)) b.add(e.name, e.shape);
  SlabLayout layout;
  layout.kind_ = kind;
  layout.layer_kind_ = all.layer_kind_;
  layout.entries_ = std::move(b.entries);
  layout.bytes_ = b.bytes();
  for (size_t i = 0; i < layout.entries_.size(); ++i) layout.index_.emplace(layout.entries_[i].name, i);
  return layout;
}

SlabLayout SlabLayout::placed_in(const SlabLayout& whole) const {
  SlabLayout l = *this;
  for (SlabEntry& e : l.entries_) {
    const SlabEntry& w = whole.entry(e.name);
    LT_CHECK(w.shape == e.shape, "tensor '{}' is {} in one slab layout and {} in the other", e.name,
             shape_str(e.shape), shape_str(w.shape));
    e.offset = w.offset;
    e.dtype = w.dtype;
  }
  l.bytes_ = whole.bytes_;
  return l;
}

size_t SlabLayout::mlp_offset() const {
  for (const SlabEntry& e : entries_)
    if (e.name.rfind("post_attention_layernorm.", 0) == 0 || e.name.rfind("mlp.", 0) == 0) return size_t(e.offset);
  return bytes_;
}

std::string hf_prefix(const ModelConfig& cfg) { return cfg.vision_language ? "model.language_model." : "model."; }

std::string SlabLayout::hf_name(SlabKind kind, int64_t layer, const std::string& entry_name,
                                const std::string& prefix) {
  switch (kind) {
    case SlabKind::embedding: return prefix + entry_name;
    case SlabKind::head: return entry_name == "lm_head.weight" ? entry_name : prefix + entry_name;
    case SlabKind::layer: return fmt::format("{}layers.{}.{}", prefix, layer, entry_name);
  }
  LT_FAIL("unknown slab kind");
}

}  // namespace lt
