// model/lora.h — a LoRA adapter on a linear layer (model/finetune.h): y = x · Wᵀ + b + s · (drop(x) · Aᵀ) · Bᵀ.
//
// A [r, in] and B [out, r] are entries of the layer slab beside W (PEFT's names: "<linear>.lora_A.weight"), in the
// streamed dtype: bf16 in bf16 compute, where each GEMM reads its activation operand rounded to bf16 as every linear
// does (ops/linear.h). The scale is folded into the rank-r intermediate, so the adapter adds its update through the
// GEMM's accumulation and never forms an [N, out] tensor (on the CPU, ops/gemm.h; the adapter's GEMMs are not routed
// through cuda-sim's linear override):
//
//   forward   u_s = s · (drop(x) · Aᵀ) [N, r];  y += u_s · Bᵀ
//   backward  u_s again (the same bits);  du = s · (dy · B),  dB += dyᵀ · u_s;  dA += duᵀ · drop(x);
//             dx += du · A (masked and × 1 / (1 - p) with dropout)
//   weight gradients by token slices of kTokenSlice in order, as linear_backward's (chunked rows: the same bits)
//
// Dropout (p = lora_dropout) is deterministic: element (token row, feature i) of an adapter's input is kept when
// lora_keep(key, row · in + i, p), a hash of the batch's dropout key (TokenInfo, by step and micro-batch), the layer
// and the linear, never a generator's state — so a recompute, every plan, every MLP chunk and a resumed run draw the
// same mask. Row is the token's index in the batch, so a chunk of rows draws its part of the same mask.
//
// Temporaries (u_s and du [N, r], bf16 copies of the GEMM operands, drop(x) [N, in] with dropout) are host scratch
// of the CPU block.
#pragma once

#include <cstdint>
#include <string>

#include "model/lora_mask.h"  // lora_keep: whether element row · in + i is kept
#include "ops/linear.h"

namespace lt {

// The linears an adapter may sit on, in the order model/finetune.h's adaptable_linears lists them. A sparse layer's
// routed experts use gate_proj / up_proj / down_proj (each expert's own adapter, its dropout key mixed with the
// expert: lora_expert_key); its router ("mlp.gate") and shared expert have their own.
enum class Adapted : uint8_t {
  q_proj, k_proj, v_proj, o_proj, in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj, gate_proj, up_proj,
  down_proj, router, shared_gate_proj, shared_up_proj, shared_down_proj, shared_expert_gate, count
};
inline constexpr int kAdapted = int(Adapted::count);
// Its slab entry prefix: "self_attn.q_proj", "linear_attn.in_proj_qkv", "mlp.down_proj", "mlp.gate",
// "mlp.shared_expert.up_proj", ... (a routed expert's: "mlp.experts.{e}." + the linear's name, expert_entry).
const char* adapted_entry(Adapted a);
std::string expert_entry(int64_t expert, Adapted a);

// One linear's adapter: A [r, in], B [out, r] (null: none).
struct LoraView {
  WeightRef A, B;
  bool present() const { return A.data != nullptr; }
};
// Their f32 gradients, accumulated (+=); null when not trained.
struct LoraGrads {
  float* A = nullptr;
  float* B = nullptr;
};
// Every adapter of a layer, by Adapted.
struct LayerAdapters {
  LoraView at[kAdapted];
  const LoraView& operator[](Adapted a) const { return at[int(a)]; }
};
struct LayerAdapterGrads {
  LoraGrads at[kAdapted];
  const LoraGrads& operator[](Adapted a) const { return at[int(a)]; }
};

// A model's LoRA settings (BlockShape::lora; rank 0: none) and where the dropout mask of one call comes from.
struct LoraShape {
  int64_t rank = 0;
  float scale = 0;    // s = α / r (α / √r with rsLoRA)
  float dropout = 0;  // p
};
struct LoraSite {
  uint64_t key = 0;  // the batch's dropout key mixed with the layer and the linear (lora_site_key)
  int64_t row0 = 0;  // the first row's token index in the batch (an MLP chunk starts at its t0)
  // An expert's grouped rows: row n is token row0 + gather[n] / per_token (model/lora_mask.h's lora_row); null:
  // consecutive tokens.
  const int32_t* gather = nullptr;
  int64_t per_token = 1;
  int64_t row(int64_t n) const { return lora_row(row0, gather, per_token, n); }
};
uint64_t lora_site_key(uint64_t batch_key, int64_t layer, Adapted a);
// A routed expert's key from its linear's site key: each expert draws its own mask on its tokens' rows, as each of
// PyTorch's expert modules applies its own dropout to its input.
uint64_t lora_expert_key(uint64_t site_key, int64_t expert);
// A training batch's key (Batch::dropout_key): micro-batch `micro` of optimizer step `step` of a run seeded `seed`.
uint64_t lora_batch_key(uint64_t seed, int64_t step, int64_t micro);

// out[N, out_f] += s · (drop(in) · Aᵀ) · Bᵀ. Nothing without an adapter.
void lora_forward(float* out, const float* in, const LoraView& l, const LoraShape& s, LoraSite site, int64_t N,
                  int64_t in_f, int64_t out_f);
// The adapter's part of the backward of y: din[N, in_f] += its input gradient (din null: none), dA and dB += theirs
// (null: not trained).
void lora_backward(float* din, const LoraGrads& g, const float* dout, const float* in, const LoraView& l,
                   const LoraShape& s, LoraSite site, int64_t N, int64_t in_f, int64_t out_f);

// The linear with its adapter: linear_forward, then lora_forward.
void adapted_forward(float* out, const float* in, WeightRef W, const float* bias, const LoraView& l,
                     const LoraShape& s, LoraSite site, int64_t N, int64_t in_f, int64_t out_f);
// linear_backward (din written, dW and dbias added; dW null: frozen), then lora_backward (din added).
void adapted_backward(float* din, float* dW, float* dbias, const LoraGrads& g, const float* dout, const float* in,
                      WeightRef W, const LoraView& l, const LoraShape& s, LoraSite site, int64_t N, int64_t in_f,
                      int64_t out_f);

}  // namespace lt
