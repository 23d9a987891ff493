// model/block.cpp — the decoder block as a list of op calls, forward then backward in reverse.
#include "model/block.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/parallel.h"
#include "model/carver.h"
#include "model/finetune.h"
#include "ops/ops.h"

namespace lt {
namespace {

const float* f32_or_null(const SlabLayout& layout, const uint8_t* base, const char* name) {
  const SlabEntry* e = layout.find(name);
  if (!e) return nullptr;
  LT_CHECK(e->dtype == DType::f32, "slab vector '{}' must be f32", name);
  return reinterpret_cast<const float*>(base + e->offset);
}

const float* f32_required(const SlabLayout& layout, const uint8_t* base, const char* name) {
  const SlabEntry& e = layout.entry(name);
  LT_CHECK(e.dtype == DType::f32, "slab vector '{}' must be f32", name);
  return reinterpret_cast<const float*>(base + e.offset);
}

WeightRef matrix(const SlabLayout& layout, const uint8_t* base, const char* name) {
  const SlabEntry& e = layout.entry(name);
  return WeightRef{base + e.offset, e.dtype};
}

float* grad_or_null(const SlabLayout& layout, uint8_t* base, const char* name) {
  const SlabEntry* e = layout.find(name);
  if (!e) return nullptr;
  LT_CHECK(e->dtype == DType::f32, "gradient slab entries must be f32 ('{}')", name);
  return reinterpret_cast<float*>(base + e->offset);
}

// The LoRA adapter of the linear `prefix` ("mlp.experts.3.up_proj"), and its gradients: none where the layout has
// no "<prefix>.lora_A.weight".
LoraView lora_view(const SlabLayout& layout, const uint8_t* base, const std::string& prefix) {
  const SlabEntry* A = layout.find(prefix + ".lora_A.weight");
  if (!A) return {};
  return LoraView{WeightRef{base + A->offset, A->dtype}, matrix(layout, base, (prefix + ".lora_B.weight").c_str())};
}
LoraGrads lora_grads(const SlabLayout& layout, uint8_t* base, const std::string& prefix) {
  return LoraGrads{grad_or_null(layout, base, (prefix + ".lora_A.weight").c_str()),
                   grad_or_null(layout, base, (prefix + ".lora_B.weight").c_str())};
}

// Whether a layout holds any tensor of expert e (its matrices or, in a LoRA run's trained layout, its adapters).
bool has_expert(const SlabLayout& layout, int64_t e) {
  const std::string p = fmt::format("mlp.experts.{}.", e);
  for (const char* m : {"gate_proj.weight", "gate_proj.lora_A.weight", "up_proj.lora_A.weight", "down_proj.lora_A.weight"})
    if (layout.find(p + m)) return true;
  return false;
}
// Whether a layout holds a sparse MLP's tensors (any of them: a trained layout may have only some adapters).
bool has_sparse_mlp(const SlabLayout& layout) {
  for (const SlabEntry& e : layout.entries())
    for (const char* p : {"mlp.gate.", "mlp.router.", "mlp.experts.", "mlp.shared_expert"})
      if (e.name.rfind(p, 0) == 0) return true;
  return false;
}

// The gradients with every frozen vector's (null: model/finetune.h) pointed at a throwaway buffer: the ops that make
// a vector's gradient with an activation gradient (the norms, the mixer's convolution, gates and gated norm) write it
// there and it is dropped. A frozen matrix's stays null: linear_backward then skips its GEMMs.
BlockGrads with_dropped(const BlockGrads& g, const BlockShape& s) {
  thread_local std::vector<float> drop;
  const int64_t Dc = 2 * s.Hk * s.dk + s.Hv * s.dv;
  const size_t need = size_t(2 * s.C + 2 * s.D + Dc * s.K + 2 * s.Hv + s.dv);
  if (drop.size() < need) drop.assign(need, 0.0f);
  float* next = drop.data();
  auto take = [&](float*& p, int64_t n) {
    if (p == nullptr) p = next;
    next += n;
  };
  BlockGrads d = g;
  take(d.ln1, s.C);
  take(d.ln2, s.C);
  if (s.qk_norm) take(d.q_norm, s.D), take(d.k_norm, s.D);
  if (s.linear()) {
    take(d.delta.conv, Dc * s.K);
    take(d.delta.dt_bias, s.Hv);
    take(d.delta.A_log, s.Hv);
    take(d.delta.norm, s.dv);
  }
  return d;
}

void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

// y = a + b (the residual connection; a separate output keeps the boundary buffers immutable).
void add(float* y, const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

}  // namespace

DType activation_storage(const std::string& name, ComputeType compute, const std::string& what) {
  if (name == "auto") return compute == ComputeType::bf16 ? DType::bf16 : DType::f32;
  if (name == "bf16") return DType::bf16;
  if (name == "f32") return DType::f32;
  LT_FAIL("{}: '{}' is not an activation dtype (expected bf16, f32 or auto)", what, name);
}

BlockShape BlockShape::make(const ModelConfig& cfg, int64_t B, int64_t T, DType act, int64_t mlp_chunk) {
  LT_CHECK(act == DType::f32 || act == DType::bf16, "activation storage must be f32 or bf16, got {}",
           dtype_name(act));
  LT_CHECK(mlp_chunk >= 0 && mlp_chunk % kTokenSlice == 0,
           "MLP chunk of {} tokens: must be a multiple of {} (the token slice of the parameter gradients)", mlp_chunk,
           kTokenSlice);
  LT_CHECK(!cfg.attn_output_gate || cfg.qk_norm, "the attention output gate needs q_norm (model '{}')",
           model_type_name(cfg.type));
  const int64_t rotary = cfg.rotary_dim();
  LT_CHECK(rotary > 0 && rotary <= cfg.head_dim && rotary % 2 == 0,
           "RoPE over {} of {} head dims (partial_rotary_factor {}): must be even and at most the head dim", rotary,
           cfg.head_dim, cfg.partial_rotary_factor);
  BlockShape s{B,
               T,
               cfg.hidden_size,
               cfg.num_heads,
               cfg.num_kv_heads,
               cfg.head_dim,
               cfg.intermediate_size,
               float(cfg.rms_norm_eps),
               cfg.rope(),
               cfg.qk_norm,
               act,
               mlp_chunk};
  s.out_gate = cfg.attn_output_gate;
  s.zero_centred = cfg.zero_centred_norms;
  s.rotary = rotary;
  if (cfg.finetune && cfg.finetune->kind == FinetuneKind::lora)
    s.lora = LoraShape{cfg.finetune->rank, cfg.finetune->scale(), float(cfg.finetune->dropout)};
  if (cfg.num_linear_attention_layers() > 0) {
    const DeltaMixerShape m = DeltaMixerShape::make(cfg, B, T);
    s.Hk = m.Hk, s.Hv = m.Hv, s.dk = m.dk, s.dv = m.dv, s.K = m.K;
  }
  if (cfg.is_moe()) {
    s.E = cfg.num_experts, s.k = cfg.num_experts_per_tok, s.Ie = cfg.moe_intermediate_size;
    s.renorm_topk = cfg.norm_topk_prob;
    s.Is = cfg.shared_expert_intermediate_size;
    s.topk_softmax = cfg.gpt_oss();
    s.swiglu_limit = float(cfg.swiglu_limit);
  }
  s.sinks = cfg.attention_sinks;
  s.sliding_window = cfg.sliding_window;
  return s;
}

LoraSite BlockShape::lora_site(const TokenInfo& tok, Adapted a, int64_t row0) const {
  return LoraSite{lora.dropout > 0 ? lora_site_key(tok.dropout_key, layer, a) : 0, row0};
}

BlockView BlockView::bind(const SlabLayout& layout, const void* base_ptr) {
  LT_CHECK(layout.kind() == SlabKind::layer, "BlockView binds a layer slab");
  auto* base = static_cast<const uint8_t*>(base_ptr);
  BlockView w{};
  w.kind = layout.layer_kind();
  for (int a = 0; a < kAdapted; ++a)  // LoRA adapters, where the layout has them (model/finetune.h)
    w.lora.at[a] = lora_view(layout, base, adapted_entry(Adapted(a)));
  w.ln1 = f32_required(layout, base, "input_layernorm.weight");
  if (layout.find("linear_attn.in_proj_qkv.weight")) {
    w.delta = DeltaMixerView{matrix(layout, base, "linear_attn.in_proj_qkv.weight"),
                             matrix(layout, base, "linear_attn.in_proj_z.weight"),
                             matrix(layout, base, "linear_attn.in_proj_b.weight"),
                             matrix(layout, base, "linear_attn.in_proj_a.weight"),
                             matrix(layout, base, "linear_attn.out_proj.weight"),
                             f32_required(layout, base, "linear_attn.conv1d.weight"),
                             f32_required(layout, base, "linear_attn.dt_bias"),
                             f32_required(layout, base, "linear_attn.A_log"),
                             f32_required(layout, base, "linear_attn.norm.weight"), w.lora};
  } else {
    w.wq = matrix(layout, base, "self_attn.q_proj.weight");
    w.wk = matrix(layout, base, "self_attn.k_proj.weight");
    w.wv = matrix(layout, base, "self_attn.v_proj.weight");
    w.wo = matrix(layout, base, "self_attn.o_proj.weight");
    w.bq = f32_or_null(layout, base, "self_attn.q_proj.bias");
    w.bk = f32_or_null(layout, base, "self_attn.k_proj.bias");
    w.bv = f32_or_null(layout, base, "self_attn.v_proj.bias");
    w.bo = f32_or_null(layout, base, "self_attn.o_proj.bias");
    w.q_norm = f32_or_null(layout, base, "self_attn.q_norm.weight");
    w.k_norm = f32_or_null(layout, base, "self_attn.k_norm.weight");
    w.sinks = f32_or_null(layout, base, "self_attn.sinks");
  }
  w.ln2 = f32_required(layout, base, "post_attention_layernorm.weight");
  // A sparse layer: the router (gpt_oss: mlp.router, with a bias) and its experts (gpt_oss: with biases).
  const char* router = layout.find("mlp.router.weight") ? "mlp.router" : "mlp.gate";
  if (layout.find(std::string(router) + ".weight")) {
    w.moe.router = matrix(layout, base, (std::string(router) + ".weight").c_str());
    w.moe.router_bias = f32_or_null(layout, base, (std::string(router) + ".bias").c_str());
    for (int64_t e = 0;; ++e) {
      const std::string p = fmt::format("mlp.experts.{}.", e);
      if (!layout.find(p + "gate_proj.weight")) break;
      w.moe.experts.push_back({matrix(layout, base, (p + "gate_proj.weight").c_str()),
                               matrix(layout, base, (p + "up_proj.weight").c_str()),
                               matrix(layout, base, (p + "down_proj.weight").c_str()),
                               f32_or_null(layout, base, (p + "gate_proj.bias").c_str()),
                               f32_or_null(layout, base, (p + "up_proj.bias").c_str()),
                               f32_or_null(layout, base, (p + "down_proj.bias").c_str()),
                               lora_view(layout, base, p + "gate_proj"), lora_view(layout, base, p + "up_proj"),
                               lora_view(layout, base, p + "down_proj")});
    }
    w.moe.router_lora = w.lora[Adapted::router];
    if (layout.find("mlp.shared_expert_gate.weight")) {
      w.moe.shared = {matrix(layout, base, "mlp.shared_expert.gate_proj.weight"),
                      matrix(layout, base, "mlp.shared_expert.up_proj.weight"),
                      matrix(layout, base, "mlp.shared_expert.down_proj.weight"),
                      nullptr, nullptr, nullptr,
                      w.lora[Adapted::shared_gate_proj], w.lora[Adapted::shared_up_proj],
                      w.lora[Adapted::shared_down_proj]};
      w.moe.shared_gate = matrix(layout, base, "mlp.shared_expert_gate.weight");
      w.moe.shared_gate_lora = w.lora[Adapted::shared_expert_gate];
    }
    return w;
  }
  w.wgate = matrix(layout, base, "mlp.gate_proj.weight");
  w.wup = matrix(layout, base, "mlp.up_proj.weight");
  w.wdown = matrix(layout, base, "mlp.down_proj.weight");
  w.bgate = f32_or_null(layout, base, "mlp.gate_proj.bias");
  w.bup = f32_or_null(layout, base, "mlp.up_proj.bias");
  w.bdown = f32_or_null(layout, base, "mlp.down_proj.bias");
  return w;
}

BlockGrads BlockGrads::bind(const SlabLayout& layout, void* base_ptr) {
  // Every gradient may be absent: a trained layout (SlabLayout::trained) has only the tensors that train; the
  // backward skips a frozen matrix's weight gradient and drops a frozen vector's (with_dropped below).
  auto* base = static_cast<uint8_t*>(base_ptr);
  BlockGrads g{};
  for (int a = 0; a < kAdapted; ++a) g.lora.at[a] = lora_grads(layout, base, adapted_entry(Adapted(a)));
  g.ln1 = grad_or_null(layout, base, "input_layernorm.weight");
  if (layout.layer_kind() == LayerKind::linear_attention) {  // (a trained layout may hold none of its tensors)
    g.delta = DeltaMixerGrads{grad_or_null(layout, base, "linear_attn.in_proj_qkv.weight"),
                              grad_or_null(layout, base, "linear_attn.in_proj_z.weight"),
                              grad_or_null(layout, base, "linear_attn.in_proj_b.weight"),
                              grad_or_null(layout, base, "linear_attn.in_proj_a.weight"),
                              grad_or_null(layout, base, "linear_attn.out_proj.weight"),
                              grad_or_null(layout, base, "linear_attn.conv1d.weight"),
                              grad_or_null(layout, base, "linear_attn.dt_bias"),
                              grad_or_null(layout, base, "linear_attn.A_log"),
                              grad_or_null(layout, base, "linear_attn.norm.weight"), g.lora};
  } else {
    g.wq = grad_or_null(layout, base, "self_attn.q_proj.weight");
    g.wk = grad_or_null(layout, base, "self_attn.k_proj.weight");
    g.wv = grad_or_null(layout, base, "self_attn.v_proj.weight");
    g.wo = grad_or_null(layout, base, "self_attn.o_proj.weight");
    g.bq = grad_or_null(layout, base, "self_attn.q_proj.bias");
    g.bk = grad_or_null(layout, base, "self_attn.k_proj.bias");
    g.bv = grad_or_null(layout, base, "self_attn.v_proj.bias");
    g.bo = grad_or_null(layout, base, "self_attn.o_proj.bias");
    g.q_norm = grad_or_null(layout, base, "self_attn.q_norm.weight");
    g.k_norm = grad_or_null(layout, base, "self_attn.k_norm.weight");
    g.sinks = grad_or_null(layout, base, "self_attn.sinks");
  }
  g.ln2 = grad_or_null(layout, base, "post_attention_layernorm.weight");
  const char* router = layout.find("mlp.router.weight") ? "mlp.router" : "mlp.gate";
  // A sparse MLP's: a frozen one binds no experts (moe_backward skips their weight GEMMs); a LoRA run's trained
  // layout binds their adapters alone.
  if (has_sparse_mlp(layout)) {
    g.moe.router = grad_or_null(layout, base, (std::string(router) + ".weight").c_str());
    g.moe.router_bias = grad_or_null(layout, base, (std::string(router) + ".bias").c_str());
    for (int64_t e = 0; has_expert(layout, e); ++e) {
      const std::string p = fmt::format("mlp.experts.{}.", e);
      g.moe.experts.push_back({grad_or_null(layout, base, (p + "gate_proj.weight").c_str()),
                               grad_or_null(layout, base, (p + "up_proj.weight").c_str()),
                               grad_or_null(layout, base, (p + "down_proj.weight").c_str()),
                               grad_or_null(layout, base, (p + "gate_proj.bias").c_str()),
                               grad_or_null(layout, base, (p + "up_proj.bias").c_str()),
                               grad_or_null(layout, base, (p + "down_proj.bias").c_str()),
                               lora_grads(layout, base, p + "gate_proj"), lora_grads(layout, base, p + "up_proj"),
                               lora_grads(layout, base, p + "down_proj")});
    }
    g.moe.router_lora = g.lora[Adapted::router];
    g.moe.shared = {grad_or_null(layout, base, "mlp.shared_expert.gate_proj.weight"),
                    grad_or_null(layout, base, "mlp.shared_expert.up_proj.weight"),
                    grad_or_null(layout, base, "mlp.shared_expert.down_proj.weight"),
                    nullptr, nullptr, nullptr,
                    g.lora[Adapted::shared_gate_proj], g.lora[Adapted::shared_up_proj],
                    g.lora[Adapted::shared_down_proj]};
    g.moe.shared_gate = grad_or_null(layout, base, "mlp.shared_expert_gate.weight");
    g.moe.shared_gate_lora = g.lora[Adapted::shared_expert_gate];
    return g;
  }
  g.wgate = grad_or_null(layout, base, "mlp.gate_proj.weight");
  g.wup = grad_or_null(layout, base, "mlp.up_proj.weight");
  g.wdown = grad_or_null(layout, base, "mlp.down_proj.weight");
  g.bgate = grad_or_null(layout, base, "mlp.gate_proj.bias");
  g.bup = grad_or_null(layout, base, "mlp.up_proj.bias");
  g.bdown = grad_or_null(layout, base, "mlp.down_proj.bias");
  return g;
}

namespace {

// mlp_rows: the rows of gate / up / h (one chunk, or N for the full layout); x32 only in the working copy. A
// linear-attention layer's mixer internals take the attention fields' place.
WorkingCopy carve_acts(Carver& c, const BlockShape& s, int64_t mlp_rows, bool with_x32) {
  const int64_t N = s.N();
  WorkingCopy a{};
  a.n1 = c.take(N * s.C);
  a.rstd1 = c.take(N);
  if (s.linear()) {
    const DeltaMixerShape m = s.mixer();
    a.delta = DeltaMixerActs::bind(c.take(int64_t(DeltaMixerActs::floats(m))), m);
  } else {
    a.q = c.take(N * s.QD());
    a.k = c.take(N * s.KVD());
    a.v = c.take(N * s.KVD());
    if (s.qk_norm) {
      a.q_raw = c.take(N * s.QPD());
      a.k_raw = c.take(N * s.KVD());
      a.q_rstd = c.take(N * s.Hq);
      a.k_rstd = c.take(N * s.Hkv);
    }
    a.att = c.take(N * s.QD());
    if (s.out_gate) a.gated = c.take(N * s.QD());
    a.lse = c.take(s.B * s.Hq * s.T);
  }
  a.x_mid = c.take(N * s.C);
  a.n2 = c.take(N * s.C);
  a.rstd2 = c.take(N);
  a.gate = c.take(mlp_rows * s.mlp_width());
  a.up = c.take(mlp_rows * s.mlp_width());
  a.h = c.take(mlp_rows * s.mlp_width());
  if (with_x32) a.x32 = c.take(N * s.C);
  if (s.sparse) a.moe = MoeRouting::bind(c.take(int64_t(MoeRouting::floats(s))), s);
  a.mlp_rows = mlp_rows;
  return a;
}

BlockScratch carve_scratch(Carver& c, const BlockShape& s) {
  const int64_t N = s.N(), R = s.mlp_rows();
  BlockScratch b{};
  b.dn = c.take(N * s.C);
  b.dtmp = c.take(N * s.C);
  if (s.sparse) {
    b.moe = MoeScratch::bind(c.take(int64_t(MoeScratch::floats(s))), s);
  } else {
    b.dh = c.take(R * s.I);
    b.dgate = c.take(R * s.I);
    b.dup = c.take(R * s.I);
  }
  b.dx_mid = c.take(N * s.C);
  if (s.linear()) {
    const DeltaMixerShape m = s.mixer();
    b.delta = DeltaMixerScratch::bind(c.take(int64_t(DeltaMixerScratch::floats(m))), m);
    return b;
  }
  b.datt = c.take(N * s.QD());
  b.dq = c.take(N * s.QD());
  b.dk = c.take(N * s.KVD());
  b.dv = c.take(N * s.KVD());
  if (s.qk_norm) {
    b.dq_raw = c.take(N * s.QPD());
    b.dk_raw = c.take(N * s.KVD());
  }
  if (s.out_gate) b.qtmp = c.take(N * s.QD());
  return b;
}

// The norm weights a layer multiplies by: as stored, or 1 + w for the zero-centred norms of Qwen3.5 (computed
// in f32 as transformers does; their gradient is the stored weight's, d(1 + w)/dw = 1).
class NormWeights {
 public:
  NormWeights(const BlockView& w, const BlockShape& s) {
    ln1 = effective(w.ln1, s.C, s, 0);
    ln2 = effective(w.ln2, s.C, s, 1);
    q_norm = effective(w.q_norm, s.D, s, 2);
    k_norm = effective(w.k_norm, s.D, s, 3);
  }
  const float *ln1, *ln2, *q_norm, *k_norm;

 private:
  const float* effective(const float* w, int64_t n, const BlockShape& s, int slot) {
    if (!s.zero_centred || w == nullptr) return w;
    std::vector<float>& v = shifted_[slot];
    v.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = 1.0f + w[i];
    return v.data();
  }
  std::vector<float> shifted_[4];
};

}  // namespace

size_t WorkingCopy::floats(const BlockShape& s) {
  Carver c{nullptr};
  carve_acts(c, s, s.mlp_rows(), s.act != DType::f32);
  return c.used;
}

WorkingCopy WorkingCopy::bind(float* buffer, const BlockShape& s) {
  Carver c{buffer};
  return carve_acts(c, s, s.mlp_rows(), s.act != DType::f32);
}

size_t WorkingCopy::full_floats(const BlockShape& s) {
  Carver c{nullptr};
  carve_acts(c, s, s.N(), false);
  return c.used;
}

WorkingCopy WorkingCopy::bind_full(float* buffer, const BlockShape& s) {
  Carver c{buffer};
  return carve_acts(c, s, s.N(), false);
}

size_t BlockScratch::floats(const BlockShape& s) {
  Carver c{nullptr};
  carve_scratch(c, s);
  return c.used;
}

BlockScratch BlockScratch::bind(float* buffer, const BlockShape& s) {
  Carver c{buffer};
  return carve_scratch(c, s);
}

// ---- bf16 storage ---------------------------------------------------------------------------------------

namespace {

constexpr int64_t kConvertChunk = 4096;  // elements per conversion task (a stack buffer of bf16)

// The activations a layer keeps for its backward, in the order of the stored buffer: the working copy's field
// (a block internal, or one of a Gated DeltaNet mixer's in WorkingCopy::delta), its elements per token (or in all,
// for lse), whether it is stored as bf16 (activations) or f32 (statistics and gates that need range), and whether
// the MLP computes it chunk by chunk.
struct StoredField {
  float* WorkingCopy::*field;      // null for a mixer field
  float* DeltaMixerActs::*mixer;  // null for a block field
  int64_t n;       // elements in all
  int64_t row;     // elements per token
  bool bf16;
  bool mlp;
  size_t offset = 0;  // in the stored buffer, 64-byte aligned
  size_t bytes() const { return (size_t(n) * (bf16 ? 2 : 4) + 63) / 64 * 64; }  // with the alignment padding
  float* in(const WorkingCopy& a) const { return field ? a.*field : a.delta.*mixer; }
};

std::vector<StoredField> stored_fields(const BlockShape& s) {
  const int64_t N = s.N();
  auto f_ = [&](float* WorkingCopy::*field, int64_t row, bool bf16, bool mlp = false) {
    return StoredField{field, nullptr, N * row, row, bf16, mlp};
  };
  auto m_ = [&](float* DeltaMixerActs::*field, int64_t row, bool bf16) {
    return StoredField{nullptr, field, N * row, row, bf16, false};
  };
  std::vector<StoredField> f = {f_(&WorkingCopy::n1, s.C, true), f_(&WorkingCopy::rstd1, 1, false)};
  if (s.linear()) {
    // Gated DeltaNet: the projections, conv output, normalised q / k, delta-rule output and out_proj's input
    // as bf16 activations; the L2 and RMS norms' statistics and the gates (b, a, β and the decay g, which the
    // delta rule compounds over a chunk) f32.
    const DeltaMixerShape m = s.mixer();
    for (StoredField x :
         {m_(&DeltaMixerActs::qkv_pre, m.conv_dim(), true), m_(&DeltaMixerActs::qkv, m.conv_dim(), true),
          m_(&DeltaMixerActs::qk_hat, 2 * m.key_dim(), true), m_(&DeltaMixerActs::q_rnorm, m.Hk, false),
          m_(&DeltaMixerActs::k_rnorm, m.Hk, false), m_(&DeltaMixerActs::z, m.value_dim(), true),
          m_(&DeltaMixerActs::b, m.Hv, false), m_(&DeltaMixerActs::a, m.Hv, false),
          m_(&DeltaMixerActs::beta, m.Hv, false), m_(&DeltaMixerActs::g, m.Hv, false),
          m_(&DeltaMixerActs::o, m.value_dim(), true), m_(&DeltaMixerActs::rstd, m.Hv, false),
          m_(&DeltaMixerActs::y, m.value_dim(), true)})
      f.push_back(x);
  } else {
    for (StoredField x : {f_(&WorkingCopy::q, s.QD(), true), f_(&WorkingCopy::k, s.KVD(), true),
                          f_(&WorkingCopy::v, s.KVD(), true)})
      f.push_back(x);
    if (s.qk_norm) {
      f.push_back(f_(&WorkingCopy::q_raw, s.QPD(), true));  // with the output gate's rows
      f.push_back(f_(&WorkingCopy::k_raw, s.KVD(), true));
      f.push_back(f_(&WorkingCopy::q_rstd, s.Hq, false));
      f.push_back(f_(&WorkingCopy::k_rstd, s.Hkv, false));
    }
    f.push_back(f_(&WorkingCopy::att, s.QD(), true));
    // lse is [B, Hq, T]: not token-major.
    f.push_back(StoredField{&WorkingCopy::lse, nullptr, s.B * s.Hq * s.T, 0, false, false});
  }
  for (StoredField x : {f_(&WorkingCopy::x_mid, s.C, true), f_(&WorkingCopy::n2, s.C, true),
                        f_(&WorkingCopy::rstd2, 1, false), f_(&WorkingCopy::gate, s.mlp_width(), true, true),
                        f_(&WorkingCopy::up, s.mlp_width(), true, true), f_(&WorkingCopy::h, s.mlp_width(), true, true)})
    f.push_back(x);
  size_t offset = 0;
  for (StoredField& x : f) {
    x.offset = offset;
    offset += x.bytes();
  }
  return f;
}

// x[n] rounded to bf16 in place (round to nearest even, as f32_to_bf16), the bits also written to store[n]
// when it is given.
void round_to_bf16(float* x, bf16_t* store, int64_t n) {
  parallel_chunks(n, kConvertChunk, [&](int64_t b, int64_t e) {
    bf16_t tmp[kConvertChunk];
    bf16_t* dst = store ? store + b : tmp;
    convert_f32_to_bf16(dst, x + b, size_t(e - b));
    convert_bf16_to_f32(x + b, dst, size_t(e - b));
  });
}

void widen(float* dst, const bf16_t* src, int64_t n) { parallel_convert_to_f32(dst, src, DType::bf16, size_t(n)); }

// The stored internals: where each field lives, and the forward's hook at each stored activation — at bf16
// storage it rounds the working copy and stores it (or only rounds it, when the internals are not kept);
// statistics are copied. At f32 storage, nothing. The Gated DeltaNet mixer calls it through DeltaMixerStorage.
class Storage final : public DeltaMixerStorage {
 public:
  Storage(const BlockShape& s, const void* stored)
      : base_(static_cast<uint8_t*>(const_cast<void*>(stored))), on_(s.act == DType::bf16) {
    if (on_) fields_ = stored_fields(s);
  }
  bool on() const { return on_; }
  const std::vector<StoredField>& fields() const { return fields_; }
  // Rows [t0, t0 + rows) of a token-major field, x pointing at them (rows = -1: the whole field from x).
  void keep(float* WorkingCopy::*member, float* x, int64_t t0 = 0, int64_t rows = -1) const {
    if (on_) keep(find([&](const StoredField& f) { return f.field == member; }), x, t0, rows);
  }
  void keep(float* DeltaMixerActs::*member, float* x) const override {
    if (on_) keep(find([&](const StoredField& f) { return f.mixer == member; }), x, 0, -1);
  }
  // The stored rows of f back into x (widened).
  void load(const StoredField& f, float* x, int64_t t0 = 0, int64_t rows = -1) const {
    const int64_t n = rows < 0 ? f.n : rows * f.row;
    const uint8_t* src = base_ + f.offset + size_t(t0 * f.row) * (f.bf16 ? 2 : 4);
    if (f.bf16) widen(x, reinterpret_cast<const bf16_t*>(src), n);
    else std::memcpy(x, src, size_t(n) * 4);
  }
  void load(float* WorkingCopy::*member, float* x, int64_t t0 = 0, int64_t rows = -1) const {
    load(find([&](const StoredField& f) { return f.field == member; }), x, t0, rows);
  }

 private:
  template <class Match>
  const StoredField& find(Match match) const {
    for (const StoredField& f : fields_)
      if (match(f)) return f;
    LT_FAIL("block: an activation with no stored slot");
  }
  void keep(const StoredField& f, float* x, int64_t t0, int64_t rows) const {
    const int64_t n = rows < 0 ? f.n : rows * f.row;
    const size_t at = f.offset + size_t(t0 * f.row) * (f.bf16 ? 2 : 4);
    if (f.bf16) round_to_bf16(x, base_ ? reinterpret_cast<bf16_t*>(base_ + at) : nullptr, n);
    else if (base_) std::memcpy(base_ + at, x, size_t(n) * 4);
  }
  uint8_t* base_;
  bool on_;
  std::vector<StoredField> fields_;
};

// q_proj's output rows [query D | gate D] per head (out_gate): the query halves into q[N, Hq, D] and back.
void gather_queries(float* q, const float* q_proj, const BlockShape& s) {
  for (int64_t r = 0; r < s.N() * s.Hq; ++r) std::memcpy(q + r * s.D, q_proj + r * 2 * s.D, size_t(s.D) * 4);
}
void scatter_queries(float* q_proj, const float* q, const BlockShape& s) {
  for (int64_t r = 0; r < s.N() * s.Hq; ++r) std::memcpy(q_proj + r * 2 * s.D, q + r * s.D, size_t(s.D) * 4);
}

// The token mixer's output (before the residual) into o, from n1: full attention (with q_proj's gate, q/k
// norms and partial RoPE where the shape says), with the storage hooks.
void attention_forward_half(float* o, WorkingCopy& a, const BlockView& w, const NormWeights& nw, const TokenInfo& tok,
                            const BlockShape& s, const Storage& st, const MixerOverride* mixer) {
  const int64_t N = s.N(), C = s.C, QD = s.QD(), KVD = s.KVD();
  if (s.qk_norm) {
    adapted_forward(a.q_raw, a.n1, w.wq, w.bq, w.lora[Adapted::q_proj], s.lora, s.lora_site(tok, Adapted::q_proj), N,
                    C, s.QPD());
    adapted_forward(a.k_raw, a.n1, w.wk, w.bk, w.lora[Adapted::k_proj], s.lora, s.lora_site(tok, Adapted::k_proj), N,
                    C, KVD);
    st.keep(&WorkingCopy::q_raw, a.q_raw);
    st.keep(&WorkingCopy::k_raw, a.k_raw);
    const float* q_in = a.q_raw;
    if (s.out_gate) {  // att is free until the attention writes it
      gather_queries(a.att, a.q_raw, s);
      q_in = a.att;
    }
    rmsnorm_forward(a.q, a.q_rstd, q_in, nw.q_norm, N * s.Hq, s.D, s.eps);  // per head: rows N*Hq of D
    rmsnorm_forward(a.k, a.k_rstd, a.k_raw, nw.k_norm, N * s.Hkv, s.D, s.eps);
    st.keep(&WorkingCopy::q_rstd, a.q_rstd);
    st.keep(&WorkingCopy::k_rstd, a.k_rstd);
  } else {
    adapted_forward(a.q, a.n1, w.wq, w.bq, w.lora[Adapted::q_proj], s.lora, s.lora_site(tok, Adapted::q_proj), N, C,
                    QD);
    adapted_forward(a.k, a.n1, w.wk, w.bk, w.lora[Adapted::k_proj], s.lora, s.lora_site(tok, Adapted::k_proj), N, C,
                    KVD);
  }
  adapted_forward(a.v, a.n1, w.wv, w.bv, w.lora[Adapted::v_proj], s.lora, s.lora_site(tok, Adapted::v_proj), N, C,
                  KVD);
  rope_partial_forward(a.q, tok.pos, N, s.Hq, s.D, s.rotary, s.rope);
  rope_partial_forward(a.k, tok.pos, N, s.Hkv, s.D, s.rotary, s.rope);
  st.keep(&WorkingCopy::q, a.q);
  st.keep(&WorkingCopy::k, a.k);
  st.keep(&WorkingCopy::v, a.v);
  const AttentionShape as{s.B, s.T, s.Hq, s.Hkv, s.D, s.window};
  if (mixer && mixer->attention) {
    mixer->attention(a.att, a.q, a.k, a.v);
  } else {
    attention_forward(a.att, a.lse, a.q, a.k, a.v, tok.doc_ids, as);
    if (w.sinks) attention_sinks_forward(a.att, a.lse, w.sinks, as);  // out and lse as the sink softmax has them
  }
  st.keep(&WorkingCopy::att, a.att);
  st.keep(&WorkingCopy::lse, a.lse);
  const float* o_in = a.att;
  if (s.out_gate) {
    sigmoid_gate_forward(a.gated, a.att, a.q_raw + s.D, N, s.Hq, s.D, s.QPD(), 2 * s.D);
    o_in = a.gated;
  }
  adapted_forward(o, o_in, w.wo, w.bo, w.lora[Adapted::o_proj], s.lora, s.lora_site(tok, Adapted::o_proj), N, QD, C);
}

// The attention half and n2 (everything before the MLP), with the storage hooks; x_in as f32 (widened into
// a.x32 at bf16 storage). Returns the f32 input. `o` takes the token mixer's output for a moment.
const float* forward_attention_half(WorkingCopy& a, const void* x_in_ptr, const BlockView& w, const TokenInfo& tok,
                                    const BlockShape& s, const Storage& st, float* o,
                                    const MixerOverride* mixer = nullptr) {
  const int64_t N = s.N(), C = s.C;
  LT_CHECK(w.kind == s.kind, "block: a {} layer's weights with a {} shape", layer_kind_name(w.kind),
           layer_kind_name(s.kind));
  const NormWeights nw(w, s);
  const float* x_in = static_cast<const float*>(x_in_ptr);
  if (st.on()) {
    widen(a.x32, static_cast<const bf16_t*>(x_in_ptr), N * C);
    x_in = a.x32;
  }
  rmsnorm_forward(a.n1, a.rstd1, x_in, nw.ln1, N, C, s.eps);
  st.keep(&WorkingCopy::n1, a.n1);
  st.keep(&WorkingCopy::rstd1, a.rstd1);
  // The mixer's output into o (x_out for a moment at f32 storage, x_mid's working copy at bf16), then the residual.
  if (s.linear() && mixer && mixer->linear) mixer->linear(o, a.n1);
  else if (s.linear()) delta_mixer_forward(o, a.delta, a.n1, w.delta, tok, s.mixer(), &st);
  else attention_forward_half(o, a, w, nw, tok, s, st, mixer);
  add(a.x_mid, x_in, o, N * C);
  st.keep(&WorkingCopy::x_mid, a.x_mid);
  rmsnorm_forward(a.n2, a.rstd2, a.x_mid, nw.ln2, N, C, s.eps);
  st.keep(&WorkingCopy::n2, a.n2);
  st.keep(&WorkingCopy::rstd2, a.rstd2);
  return x_in;
}

// gate, up and h of tokens [t0, t0 + n) into gate / up / h (one chunk's rows), with the storage hooks. A sparse
// layer routes the tokens first (a.moe) and computes its experts' grouped rows.
void mlp_internals(float* gate, float* up, float* h, WorkingCopy& a, const BlockView& w, const TokenInfo& tok,
                   const BlockShape& s, const Storage& st, int64_t t0, int64_t n) {
  const float* n2 = a.n2 + t0 * s.C;
  if (s.sparse) {
    moe_route(a.moe, n2, w.moe, s, n, t0, tok.dropout_key);
    moe_gate_up(gate, up, a.moe, n2, w.moe, s, n);
  } else {
    adapted_forward(gate, n2, w.wgate, w.bgate, w.lora[Adapted::gate_proj], s.lora,
                    s.lora_site(tok, Adapted::gate_proj, t0), n, s.C, s.I);
    adapted_forward(up, n2, w.wup, w.bup, w.lora[Adapted::up_proj], s.lora, s.lora_site(tok, Adapted::up_proj, t0), n,
                    s.C, s.I);
  }
  st.keep(&WorkingCopy::gate, gate, t0, n);
  st.keep(&WorkingCopy::up, up, t0, n);
  if (s.swiglu_limit > 0) clamped_swiglu_forward(h, gate, up, n * s.mlp_width(), kClampedSwigluAlpha, s.swiglu_limit);
  else swiglu_forward(h, gate, up, n * s.mlp_width());
  st.keep(&WorkingCopy::h, h, t0, n);
}

// Rows of tokens [t0, t0 + n) of a gate / up / h field: at t0 in a full layout, at 0 in a one-chunk working copy.
float* mlp_row(float* field, const WorkingCopy& a, const BlockShape& s, int64_t t0) {
  return a.mlp_rows == s.N() ? field + t0 * s.mlp_width() : field;
}

}  // namespace

size_t block_stored_bytes(const BlockShape& s) {
  if (s.act == DType::f32) return WorkingCopy::full_floats(s) * 4;
  const std::vector<StoredField> f = stored_fields(s);
  return f.back().offset + f.back().bytes();
}

size_t block_recompute_stored_bytes(const BlockShape& s) {
  if (s.act == DType::f32) return block_stored_bytes(s);
  const std::vector<StoredField> f = stored_fields(s);
  for (const StoredField& x : f)
    if (x.mlp) return x.offset;
  return f.back().offset + f.back().bytes();
}

StoredOffsets block_stored_offsets(const BlockShape& s) {
  LT_CHECK(s.act == DType::bf16, "block_stored_offsets: the stored internals are for bf16 storage");
  StoredOffsets o;
  const std::pair<float* WorkingCopy::*, int64_t StoredOffsets::*> map[] = {
      {&WorkingCopy::n1, &StoredOffsets::n1},       {&WorkingCopy::rstd1, &StoredOffsets::rstd1},
      {&WorkingCopy::q, &StoredOffsets::q},         {&WorkingCopy::k, &StoredOffsets::k},
      {&WorkingCopy::v, &StoredOffsets::v},         {&WorkingCopy::q_raw, &StoredOffsets::q_raw},
      {&WorkingCopy::k_raw, &StoredOffsets::k_raw}, {&WorkingCopy::q_rstd, &StoredOffsets::q_rstd},
      {&WorkingCopy::k_rstd, &StoredOffsets::k_rstd}, {&WorkingCopy::att, &StoredOffsets::att},
      {&WorkingCopy::lse, &StoredOffsets::lse},     {&WorkingCopy::x_mid, &StoredOffsets::x_mid},
      {&WorkingCopy::n2, &StoredOffsets::n2},       {&WorkingCopy::rstd2, &StoredOffsets::rstd2},
      {&WorkingCopy::gate, &StoredOffsets::gate},   {&WorkingCopy::up, &StoredOffsets::up},
      {&WorkingCopy::h, &StoredOffsets::h}};
  const std::pair<float* DeltaMixerActs::*, int64_t StoredOffsets::*> mixer_map[] = {
      {&DeltaMixerActs::qkv_pre, &StoredOffsets::qkv_pre}, {&DeltaMixerActs::qkv, &StoredOffsets::qkv},
      {&DeltaMixerActs::qk_hat, &StoredOffsets::qk_hat},   {&DeltaMixerActs::q_rnorm, &StoredOffsets::q_rnorm},
      {&DeltaMixerActs::k_rnorm, &StoredOffsets::k_rnorm}, {&DeltaMixerActs::z, &StoredOffsets::z},
      {&DeltaMixerActs::b, &StoredOffsets::b},             {&DeltaMixerActs::a, &StoredOffsets::a},
      {&DeltaMixerActs::beta, &StoredOffsets::beta},       {&DeltaMixerActs::g, &StoredOffsets::g},
      {&DeltaMixerActs::o, &StoredOffsets::o},             {&DeltaMixerActs::rstd, &StoredOffsets::rstd_o},
      {&DeltaMixerActs::y, &StoredOffsets::y}};
  for (const StoredField& f : stored_fields(s)) {
    for (const auto& [field, slot] : map)
      if (f.field && f.field == field) o.*slot = int64_t(f.offset);
    for (const auto& [field, slot] : mixer_map)
      if (f.mixer && f.mixer == field) o.*slot = int64_t(f.offset);
  }
  return o;
}

LayerInternals bind_internals(void* kept, float* work, const BlockShape& s) {
  if (kept == nullptr) return {WorkingCopy::bind(work, s), nullptr, Saved::recompute};
  if (s.act == DType::f32) return {WorkingCopy::bind_full(static_cast<float*>(kept), s), nullptr, Saved::in_working_copy};
  return {WorkingCopy::bind(work, s), kept, Saved::stored};
}

namespace {

void forward_layer(void* x_out_ptr, WorkingCopy& a, const void* x_in_ptr, const BlockView& w, const TokenInfo& tok,
                   const BlockShape& s, void* stored, const MixerOverride* mixer) {
  const int64_t N = s.N(), C = s.C, I = s.I, R = s.mlp_rows();
  const bool b16 = s.act == DType::bf16;
  LT_CHECK(b16 || stored == nullptr, "block_forward: stored internals are for bf16 storage only");
  LT_CHECK(a.mlp_rows == R || a.mlp_rows == N, "block_forward: the internals hold {} MLP rows, the shape {} or {}",
           a.mlp_rows, R, N);
  const Storage st(s, stored);
  float* o = b16 ? a.x_mid : static_cast<float*>(x_out_ptr);  // x_out is bf16 at bf16 storage
  forward_attention_half(a, x_in_ptr, w, tok, s, st, o, mixer);
  // The MLP over token chunks; its output y in x_out (f32) or in x32 (bf16: the widened input is free again).
  float* y = b16 ? a.x32 : static_cast<float*>(x_out_ptr);
  for (int64_t t0 = 0; t0 < N; t0 += R) {
    const int64_t n = std::min(R, N - t0);
    float* h = mlp_row(a.h, a, s, t0);
    mlp_internals(mlp_row(a.gate, a, s, t0), mlp_row(a.up, a, s, t0), h, a, w, tok, s, st, t0, n);
    if (s.sparse && tok.moe_aux) tok.moe_aux->add(a.moe, s, t0, n);
    if (s.sparse) moe_down_combine(y + t0 * C, a.moe, h, a.n2 + t0 * C, w.moe, s, n);
    else adapted_forward(y + t0 * C, h, w.wdown, w.bdown, w.lora[Adapted::down_proj], s.lora,
                         s.lora_site(tok, Adapted::down_proj, t0), n, I, C);
  }
  add_inplace(y, a.x_mid, N * C);
  if (b16) parallel_convert_from_f32(x_out_ptr, DType::bf16, y, size_t(N * C));
}

}  // namespace

void block_forward(void* x_out, WorkingCopy& a, const void* x_in, const BlockView& w, const TokenInfo& tok,
                   const BlockShape& s, void* stored) {
  forward_layer(x_out, a, x_in, w, tok, s, stored, nullptr);
}

void block_forward_with(float* x_out, WorkingCopy& a, const float* x_in, const BlockView& w, const TokenInfo& tok,
                        const BlockShape& s, const MixerOverride& mixer) {
  LT_CHECK(s.act == DType::f32, "block_forward_with: f32 activation storage only, not {}", dtype_name(s.act));
  forward_layer(x_out, a, x_in, w, tok, s, nullptr, &mixer);
}

void block_recompute_internals(WorkingCopy& a, const void* x_in, const BlockView& w, const TokenInfo& tok,
                               const BlockShape& s) {
  const Storage st(s, nullptr);  // rounds as the forward did, stores nothing
  // o_proj's output goes to x_mid's working copy (add() reads it element by element before writing).
  forward_attention_half(a, x_in, w, tok, s, st, a.x_mid);
}

void block_backward(float* dx_in, BlockGrads& g, BlockScratch& b, const float* dx_out, const void* x_in,
                    const WorkingCopy& a, const BlockView& w, const TokenInfo& tok, const BlockShape& s, Saved saved,
                    const void* stored) {
  block_backward_mlp(g, b, dx_out, a, w, tok, s, saved, stored);
  block_backward_attention(dx_in, g, b, x_in, a, w, tok, s);
}

void block_backward_mlp(BlockGrads& trained, BlockScratch& b, const float* dx_out, const WorkingCopy& a,
                        const BlockView& w, const TokenInfo& tok, const BlockShape& s, Saved saved, const void* stored) {
  BlockGrads g = with_dropped(trained, s);
  const int64_t N = s.N(), C = s.C, I = s.I, R = s.mlp_rows();
  const Storage st(s, saved == Saved::stored ? stored : nullptr);
  if (saved == Saved::stored) {
    LT_CHECK(s.act == DType::bf16 && stored != nullptr, "block_backward: stored internals are for bf16 storage");
    for (const StoredField& f : st.fields())
      if (!f.mlp) st.load(f, f.in(a));
  }
  LT_CHECK(saved != Saved::in_working_copy || a.mlp_rows == N,
           "block_backward: the internals hold the MLP of {} of {} tokens; a chunked layer needs bind_full",
           a.mlp_rows, N);
  // x_out = x_mid + down(h), chunk by chunk: each chunk's gate / up / h from where they are (or recomputed,
  // rounded as the forward did), its dn rows and its share of the MLP's parameter gradients (token slices in
  // order, ops/linear.h).
  const Storage rounding(s, nullptr);
  WorkingCopy& work = const_cast<WorkingCopy&>(a);  // a sparse layer routes again into its routing scratch
  for (int64_t t0 = 0; t0 < N; t0 += R) {
    const int64_t n = std::min(R, N - t0);
    float *gate = mlp_row(a.gate, a, s, t0), *up = mlp_row(a.up, a, s, t0), *h = mlp_row(a.h, a, s, t0);
    if (saved == Saved::stored) {
      st.load(&WorkingCopy::gate, gate, t0, n);
      st.load(&WorkingCopy::up, up, t0, n);
      st.load(&WorkingCopy::h, h, t0, n);
    } else if (saved == Saved::recompute) {
      mlp_internals(gate, up, h, work, w, tok, s, rounding, t0, n);
    }
    const float* n2 = a.n2 + t0 * C;
    if (s.sparse) {
      if (saved != Saved::recompute) moe_route(work.moe, n2, w.moe, s, n, t0, tok.dropout_key);
      moe_backward(b.dn + t0 * C, b.dtmp + t0 * C, g.moe, b.moe, a.moe, dx_out + t0 * C, n2, gate, up, h, w.moe, s, n,
                   tok.moe_aux);
      continue;
    }
    adapted_backward(b.dh, g.wdown, g.bdown, g.lora[Adapted::down_proj], dx_out + t0 * C, h, w.wdown,
                     w.lora[Adapted::down_proj], s.lora, s.lora_site(tok, Adapted::down_proj, t0), n, I, C);
    swiglu_backward(b.dgate, b.dup, b.dh, gate, up, n * I);
    adapted_backward(b.dn + t0 * C, g.wgate, g.bgate, g.lora[Adapted::gate_proj], b.dgate, n2, w.wgate,
                     w.lora[Adapted::gate_proj], s.lora, s.lora_site(tok, Adapted::gate_proj, t0), n, C, I);
    adapted_backward(b.dtmp + t0 * C, g.wup, g.bup, g.lora[Adapted::up_proj], b.dup, n2, w.wup,
                     w.lora[Adapted::up_proj], s.lora, s.lora_site(tok, Adapted::up_proj, t0), n, C, I);
  }
  add_inplace(b.dn, b.dtmp, N * C);
  const NormWeights nw(w, s);
  rmsnorm_backward(b.dx_mid, g.ln2, b.dn, a.x_mid, nw.ln2, a.rstd2, N, C);
  add_inplace(b.dx_mid, dx_out, N * C);
}

namespace {

// From dx_mid to the mixer input's gradient b.dn: full attention (o_proj, the output gate, attention, RoPE, q/k
// norms, q/k/v projections).
void attention_backward_half(BlockGrads& g, BlockScratch& b, const WorkingCopy& a, const BlockView& w,
                             const NormWeights& nw, const TokenInfo& tok, const BlockShape& s) {
  const int64_t N = s.N(), C = s.C, QD = s.QD(), KVD = s.KVD();
  float* datt = b.datt;
  if (s.out_gate) {
    // o_proj read gated = att × σ(gate) (not kept: recomputed, the same bits); datt first holds d gated.
    sigmoid_gate_forward(b.qtmp, a.att, a.q_raw + s.D, N, s.Hq, s.D, s.QPD(), 2 * s.D);
    adapted_backward(b.datt, g.wo, g.bo, g.lora[Adapted::o_proj], b.dx_mid, b.qtmp, w.wo, w.lora[Adapted::o_proj],
                     s.lora, s.lora_site(tok, Adapted::o_proj), N, QD, C);
    sigmoid_gate_backward(b.qtmp, b.dq_raw + s.D, b.datt, a.att, a.q_raw + s.D, N, s.Hq, s.D, s.QPD(), 2 * s.D);
    datt = b.qtmp;  // d att
  } else {
    adapted_backward(b.datt, g.wo, g.bo, g.lora[Adapted::o_proj], b.dx_mid, a.att, w.wo, w.lora[Adapted::o_proj],
                     s.lora, s.lora_site(tok, Adapted::o_proj), N, QD, C);
  }
  const AttentionShape as{s.B, s.T, s.Hq, s.Hkv, s.D, s.window};
  attention_backward(b.dq, b.dk, b.dv, datt, a.att, a.lse, a.q, a.k, a.v, tok.doc_ids, as);
  if (w.sinks && g.sinks) {  // the sinks' gradient, from the same out and lse (ops/attention.h); none when frozen
    std::vector<float> dsinks(static_cast<size_t>(s.Hq));
    attention_sinks_backward(dsinks.data(), datt, a.att, a.lse, w.sinks, as);
    for (int64_t h = 0; h < s.Hq; ++h) g.sinks[h] += dsinks[size_t(h)];
  }
  rope_partial_backward(b.dq, tok.pos, N, s.Hq, s.D, s.rotary, s.rope);
  rope_partial_backward(b.dk, tok.pos, N, s.Hkv, s.D, s.rotary, s.rope);
  const float* dq_proj = b.dq;
  const float* dk_proj = b.dk;
  if (s.qk_norm) {
    if (s.out_gate) {
      // The query before q_norm from q_proj's rows into qtmp; its gradient through datt into the query halves.
      gather_queries(b.qtmp, a.q_raw, s);
      rmsnorm_backward(b.datt, g.q_norm, b.dq, b.qtmp, nw.q_norm, a.q_rstd, N * s.Hq, s.D);
      scatter_queries(b.dq_raw, b.datt, s);
    } else {
      rmsnorm_backward(b.dq_raw, g.q_norm, b.dq, a.q_raw, nw.q_norm, a.q_rstd, N * s.Hq, s.D);
    }
    rmsnorm_backward(b.dk_raw, g.k_norm, b.dk, a.k_raw, nw.k_norm, a.k_rstd, N * s.Hkv, s.D);
    dq_proj = b.dq_raw;
    dk_proj = b.dk_raw;
  }
  adapted_backward(b.dn, g.wq, g.bq, g.lora[Adapted::q_proj], dq_proj, a.n1, w.wq, w.lora[Adapted::q_proj], s.lora,
                   s.lora_site(tok, Adapted::q_proj), N, C, s.QPD());
  adapted_backward(b.dtmp, g.wk, g.bk, g.lora[Adapted::k_proj], dk_proj, a.n1, w.wk, w.lora[Adapted::k_proj], s.lora,
                   s.lora_site(tok, Adapted::k_proj), N, C, KVD);
  add_inplace(b.dn, b.dtmp, N * C);
  adapted_backward(b.dtmp, g.wv, g.bv, g.lora[Adapted::v_proj], b.dv, a.n1, w.wv, w.lora[Adapted::v_proj], s.lora,
                   s.lora_site(tok, Adapted::v_proj), N, C, KVD);
  add_inplace(b.dn, b.dtmp, N * C);
}

}  // namespace

void block_backward_attention(float* dx_in, BlockGrads& trained, BlockScratch& b, const void* x_in_ptr,
                              const WorkingCopy& a, const BlockView& w, const TokenInfo& tok, const BlockShape& s) {
  BlockGrads g = with_dropped(trained, s);
  const int64_t N = s.N(), C = s.C;
  const NormWeights nw(w, s);
  const float* x_in = static_cast<const float*>(x_in_ptr);
  if (s.act == DType::bf16) {
    widen(a.x32, static_cast<const bf16_t*>(x_in_ptr), N * C);
    x_in = a.x32;
  }
  // x_mid = x_in + mixer(n1), from dx_mid (the MLP half's).
  if (s.linear()) {
    delta_mixer_backward(b.dn, g.delta, b.delta, b.dx_mid, a.n1, a.delta, w.delta, tok, s.mixer());
  } else {
    attention_backward_half(g, b, a, w, nw, tok, s);
  }
  rmsnorm_backward(dx_in, g.ln1, b.dn, x_in, nw.ln1, a.rstd1, N, C);
  add_inplace(dx_in, b.dx_mid, N * C);
}

}  // namespace lt
