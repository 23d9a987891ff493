// tests/testing/exec_testing.h — what the executor's tests share: small random models, batches and plans (every
// tier, dropped boundaries, kept or recomputed internals, transfer windows), the NVMe store a plan needs, and a
// bitwise comparison of gradient slabs.
#pragma once

#include <cmath>
#include <cstring>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "core/rng.h"
#include "device/device.h"
#include "exec/executor.h"
#include "io/nvme.h"
#include "model/batch.h"
#include "model/model.h"
#include "model/weights.h"
#include "ops/head.h"
#include "testing/model_testing.h"

namespace lt::testing {

// A small random model; `type` (0 qwen2, 1 qwen3, 2 llama) picks the architecture, -1 a random one.
inline ModelConfig random_config(Rng& rng, int type = -1) {
  ModelConfig c;
  const ModelType types[] = {ModelType::qwen2, ModelType::qwen3, ModelType::llama};
  c.type = types[rng.below(3)];
  if (type >= 0) c.type = types[type];
  c.vocab_size = 40 + int64_t(rng.below(30));
  c.num_kv_heads = 1 + int64_t(rng.below(2));
  c.num_heads = c.num_kv_heads * (1 + int64_t(rng.below(3)));
  c.head_dim = 8 * (1 + int64_t(rng.below(2)));
  c.hidden_size = c.type == ModelType::qwen2 ? c.num_heads * c.head_dim : 16 + 8 * int64_t(rng.below(3));
  c.intermediate_size = 24 + int64_t(rng.below(20));
  c.num_layers = 2 + int64_t(rng.below(5));
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.qkv_bias = c.type != ModelType::qwen3 && rng.below(2) == 0;
  if (c.type == ModelType::qwen2) c.qkv_bias = true;
  c.o_bias = c.type == ModelType::llama && c.qkv_bias;
  c.mlp_bias = c.type == ModelType::llama && rng.below(2) == 0;
  c.qk_norm = c.type == ModelType::qwen3;
  c.tie_word_embeddings = rng.below(2) == 0;
  c.max_position_embeddings = 256;
  return c;
}

// A small random Qwen3.5 hybrid: Gated DeltaNet and gated-attention layers (at least one of each), value heads a
// multiple of key heads, head dims not powers of two, partial RoPE.
inline ModelConfig random_hybrid_config(Rng& rng) {
  ModelConfig c;
  c.type = ModelType::qwen3_5;
  c.vocab_size = 40 + int64_t(rng.below(30));
  c.num_kv_heads = 1 + int64_t(rng.below(2));
  c.num_heads = c.num_kv_heads * (1 + int64_t(rng.below(2)));
  c.head_dim = 8 + 4 * int64_t(rng.below(2));  // 8 or 12
  c.hidden_size = 16 + 8 * int64_t(rng.below(3));
  c.intermediate_size = 24 + int64_t(rng.below(20));
  c.num_layers = 2 + int64_t(rng.below(4));
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.qk_norm = true;
  c.attn_output_gate = true;
  c.zero_centred_norms = true;
  c.partial_rotary_factor = 0.5;
  c.linear_num_key_heads = 1 + int64_t(rng.below(2));
  c.linear_num_value_heads = c.linear_num_key_heads * (1 + int64_t(rng.below(3)));
  c.linear_key_head_dim = 6 + int64_t(rng.below(5));
  c.linear_value_head_dim = 5 + int64_t(rng.below(5));
  c.linear_conv_kernel_dim = 4;
  for (int64_t l = 0; l < c.num_layers; ++l)
    c.layer_types.push_back(rng.below(2) ? LayerKind::linear_attention : LayerKind::full_attention);
  const int64_t full = int64_t(rng.below(uint64_t(c.num_layers)));
  const int64_t linear = (full + 1 + int64_t(rng.below(uint64_t(c.num_layers - 1)))) % c.num_layers;
  c.layer_types[size_t(full)] = LayerKind::full_attention;
  c.layer_types[size_t(linear)] = LayerKind::linear_attention;
  c.tie_word_embeddings = rng.below(2) == 0;
  c.max_position_embeddings = 256;
  return c;
}

// A small random Qwen3-MoE: sparse layers of 3..8 experts (1..3 per token, odd intermediate sizes), and, one time in
// two, a dense layer among them (mlp_only_layers).
inline ModelConfig random_moe_config(Rng& rng) {
  ModelConfig c = random_config(rng, 1);
  c.type = ModelType::qwen3_moe;
  c.num_experts = 3 + int64_t(rng.below(6));
  c.num_experts_per_tok = 1 + int64_t(rng.below(uint64_t(std::min<int64_t>(3, c.num_experts))));
  c.moe_intermediate_size = 7 + int64_t(rng.below(12));
  c.norm_topk_prob = rng.below(2) == 0;
  if (rng.below(2) == 0) c.mlp_only_layers = {int64_t(rng.below(uint64_t(c.num_layers)))};
  return c;
}

// A small random Qwen3.5-MoE: random_hybrid_config's layers, every MLP sparse (3..6 experts, 1..3 per token,
// renormalised) with a shared expert.
inline ModelConfig random_hybrid_moe_config(Rng& rng) {
  ModelConfig c = random_hybrid_config(rng);
  c.intermediate_size = 0;
  c.num_experts = 3 + int64_t(rng.below(4));
  c.num_experts_per_tok = 1 + int64_t(rng.below(3));
  c.moe_intermediate_size = 5 + int64_t(rng.below(10));
  c.shared_expert_intermediate_size = 6 + int64_t(rng.below(12));
  c.norm_topk_prob = true;
  return c;
}

// A small random GPT-OSS: sliding (window 3..8) and full layers in a random order, sinks, biases everywhere, YaRN,
// 3..6 experts (1..3 per token) with biases and a clamp low enough to be reached (random_model_params' weights).
inline ModelConfig random_gpt_oss_config(Rng& rng) {
  ModelConfig c = random_config(rng, 2);  // llama's plain attention: no q/k norm
  c.type = ModelType::gpt_oss;
  c.qkv_bias = c.o_bias = true;
  c.mlp_bias = false;
  c.attention_sinks = true;
  c.intermediate_size = 0;
  c.num_experts = 3 + int64_t(rng.below(4));
  c.num_experts_per_tok = 1 + int64_t(rng.below(3));
  c.moe_intermediate_size = 5 + int64_t(rng.below(10));
  c.swiglu_limit = 0.5 + 0.5 * double(rng.below(3));
  c.sliding_window = 3 + int64_t(rng.below(6));
  c.layer_types.clear();
  for (int64_t l = 0; l < c.num_layers; ++l)
    c.layer_types.push_back(rng.below(2) == 0 ? LayerKind::sliding_attention : LayerKind::full_attention);
  c.yarn_factor = 32.0;
  c.yarn_original_max_positions = 16;
  c.yarn_truncate = false;
  return c;
}

inline ModelSlabs random_params(const ModelConfig& cfg, uint64_t seed) { return random_model_params(cfg, seed); }

inline Batch random_batch(const ModelConfig& cfg, Rng& rng, bool packed) {
  Batch b;
  b.B = 1 + int64_t(rng.below(2));
  b.T = 5 + int64_t(rng.below(20));
  for (int64_t i = 0; i < b.N(); ++i) b.input_ids.push_back(int32_t(rng.below(uint64_t(cfg.vocab_size))));
  b.labels = b.input_ids;
  for (int64_t r = 0; r < b.B; ++r) b.labels[size_t(r * b.T)] = kIgnoreIndex;
  if (packed) {  // two documents per row, split at a random point
    for (int64_t r = 0; r < b.B; ++r) {
      int64_t split = 1 + int64_t(rng.below(uint64_t(b.T - 1)));
      for (int64_t t = 0; t < b.T; ++t) {
        b.positions.push_back(int32_t(t < split ? t : t - split));
        b.doc_ids.push_back(t < split ? 0 : 1);
      }
    }
  }
  return b;
}

// Right padding as the data loader adds it: each row's last 0..T/3 positions get attention_mask 0 and label -100
// (the first token stays, so some label counts).
inline void add_random_padding(Batch& b, Rng& rng) {
  b.attention_mask.assign(size_t(b.N()), 1);
  for (int64_t r = 0; r < b.B; ++r) {
    const int64_t pad = int64_t(rng.below(uint64_t(b.T / 3 + 1)));
    for (int64_t t = b.T - pad; t < b.T; ++t) {
      b.attention_mask[size_t(r * b.T + t)] = 0;
      b.labels[size_t(r * b.T + t)] = kIgnoreIndex;
    }
  }
}

inline Plan random_plan(int64_t L, Rng& rng) {
  Plan p;
  p.name = "random";
  for (int64_t i = 0; i <= L; ++i) {
    const Tier tiers[] = {Tier::device, Tier::host, Tier::nvme, Tier::drop};
    p.boundary.push_back(tiers[rng.below(4)]);
  }
  p.boundary[size_t(L)] = Tier::device;
  for (int64_t l = 0; l < L; ++l) p.keep_internals.push_back(p.stored(l) && rng.below(3) == 0);
  return p;
}

// Random transfer windows for the plan's host-tier copies, within what a ring of `ring` slots allows
// (Plan::validate_windows): one or two parts per copy with random fractions.
inline Plan with_random_windows(Plan p, Rng& rng, int ring = 3) {
  const int64_t L = p.num_layers();
  p.name += "+windows";
  p.offload_parts.assign(size_t(L + 1), {});
  p.reload_parts.assign(size_t(L + 1), {});
  auto split = [&](int lo, int hi) {
    std::vector<TransferPart> parts;
    std::vector<int> wins;
    for (int w = lo; w <= hi; ++w)
      if (rng.below(2) == 0 || (w == hi && wins.empty())) wins.push_back(w);
    double left = 1.0;
    for (size_t k = 0; k < wins.size(); ++k) {
      const double f = k + 1 == wins.size() ? left : left * (0.2 + 0.6 * rng.uniform());
      parts.push_back({wins[k], f});
      left -= f;
    }
    return parts;
  };
  for (int64_t i = 0; i < L; ++i) {
    const Tier t = p.boundary[size_t(i)];
    if (i > 0 && t == Tier::host) p.offload_parts[size_t(i)] = split(int(i), int(std::min<int64_t>(i + ring - 2, L - 1)));
    if (t == Tier::host && i > 0) {
      const int hi = int(2 * L - i) - 1;
      p.reload_parts[size_t(i)] = split(std::max(int(L), hi - (ring - 2)), hi);
    }
  }
  return p;
}

inline Plan random_host_plan(int64_t L, Rng& rng) {
  Plan p = random_plan(L, rng);
  for (int64_t i = 1; i < L; ++i)
    if (rng.below(2) == 0) p.boundary[size_t(i)] = Tier::host;
  for (int64_t l = 0; l < L; ++l) p.keep_internals[size_t(l)] = p.keep_internals[size_t(l)] && p.stored(l);
  return p;
}

// sqrt(Σ (a - b)²) / sqrt(Σ b²) over every gradient tensor.
inline double relative_error(const ModelSlabs& a, const ModelSlabs& b) {
  double num = 0, den = 0;
  auto A = a.named_tensors(), B = b.named_tensors();
  for (size_t t = 0; t < A.size(); ++t) {
    const float* x = A[t].view.ptr<float>();
    const float* y = B[t].view.ptr<float>();
    for (int64_t i = 0, n = A[t].view.numel(); i < n; ++i) {
      num += (double(x[i]) - double(y[i])) * (double(x[i]) - double(y[i]));
      den += double(y[i]) * double(y[i]);
    }
  }
  return std::sqrt(num / den);
}

inline void expect_bitwise_equal(const ModelSlabs& a, const ModelSlabs& b, const std::string& what) {
  auto A = a.named_tensors(), B = b.named_tensors();
  for (size_t t = 0; t < A.size(); ++t)
    ASSERT_EQ(0, std::memcmp(A[t].view.data, B[t].view.data, A[t].view.bytes())) << what << ": " << A[t].hf_name;
}

inline std::unique_ptr<NvmeStore> nvme_store_for(const ModelConfig& cfg, const Batch& batch, const Plan& plan,
                                                 const ExecOptions& o);

// The streaming executor on the CUDA block (under cuda-sim: ExecOptions::kernels cuda, bf16 storage) at one plan,
// on a device of just the predicted peak, through `link`; expects the measured peak to be the predicted one. `weights`
// is the compute copy (the masters themselves at f32 GEMMs); moe_aux: the load-balancing loss's weight. With frozen
// tensors (cfg.finetune) the executor gets what a run keeps: the trained tensors' masters, every tensor streamed, and
// `grads` are of the trained tensors (SlabSet::trained).
class CudaBlockSteps {
 public:
  CudaBlockSteps(const ModelConfig& cfg, const ModelSlabs& params, const Batch& batch, ComputeType compute,
                 double moe_aux = 0)
      : cfg_(cfg), params_(params), batch_(batch), copy_(cfg, DType::bf16), moe_aux_(moe_aux) {
    if (compute == ComputeType::bf16) make_compute_copy(copy_, params);
    if (!cfg.trains_all()) masters_ = trained_tensors(cfg, params);
    o_.kernels = LayerKernels::cuda;
    o_.compute = compute;
    o_.activations = DType::bf16;
  }
  StepStats run(const Plan& plan, LinkSpec link, ModelSlabs& grads, const std::string& what) const {
    const size_t predicted = predict_peak_device_bytes(cfg_, batch_.B, batch_.T, plan, o_);
    auto dev = make_cpu_device(predicted + 4096, link);
    std::unique_ptr<NvmeStore> nvme = nvme_store_for(cfg_, batch_, plan, o_);
    StreamingExecutor ex(cfg_, *dev, o_, nvme.get());
    GradTarget target;
    target.moe_aux_weight = moe_aux_;
    const ModelSlabs& weights = o_.compute == ComputeType::bf16 ? copy_ : params_;
    const StepStats st =
        ex.step(grads, cfg_.trains_all() ? params_ : masters_, weights, batch_, plan, nullptr, nullptr, target);
    EXPECT_EQ(st.peak_device_bytes, predicted) << what << " plan " << plan.to_json().dump();
    return st;
  }

 private:
  const ModelConfig& cfg_;
  const ModelSlabs& params_;
  const Batch& batch_;
  ModelSlabs copy_, masters_;
  ExecOptions o_;
  double moe_aux_;
};

// Runs `batch` through the streaming executor under a list of plans (keep-all, every 1 and 2, host and NVMe tiers,
// random plans with transfer windows), on a device of just the predicted peak, through a slow link for odd seeds:
// each must give the in-memory path's loss and gradients bit for bit and measure the predicted peak.
// moe_aux_coef: MoE models, the load-balancing loss's coefficient (model_forward_backward; the executor's
// GradTarget::moe_aux_weight); its value must match bit for bit too.
// With frozen tensors (cfg.finetune, model/finetune.h) the executor gets what a run keeps: the masters of the trained
// tensors alone and the streamed weights of every one; the gradients are of the trained tensors.
inline void expect_every_plan_matches(const ModelConfig& cfg, const ModelSlabs& params, const Batch& batch,
                                      const Precision& precision, Rng& rng, uint64_t seed, double moe_aux_coef = 0) {
  ModelSlabs bf16(cfg, DType::bf16);
  const ModelSlabs* weights = &params;
  if (precision.compute == ComputeType::bf16) {
    make_compute_copy(bf16, params);
    weights = &bf16;
  }
  const ModelSlabs masters = cfg.trains_all() ? ModelSlabs() : trained_tensors(cfg, params);
  const ModelSlabs& exec_params = cfg.trains_all() ? params : masters;
  ModelSlabs ref_grads(cfg, DType::f32, Fill::zero, SlabSet::trained);
  const LossResult ref = model_forward_backward(ref_grads, params, batch, precision, nullptr, moe_aux_coef);
  const int64_t L = cfg.num_layers;
  const std::vector<Plan> plans = {Plan::keep_all(L), Plan::every(L, 1), Plan::every(L, 2),
                                   Plan::every(L, 2, Tier::host), Plan::every(L, 1, Tier::nvme),
                                   random_plan(L, rng), random_plan(L, rng),
                                   with_random_windows(random_host_plan(L, rng), rng)};
  for (const Plan& plan : plans) {
    const std::string what = "seed " + std::to_string(seed) + " activations " +
                             std::string(dtype_name(precision.activations)) + " plan " + plan.to_json().dump();
    ExecOptions o;
    o.compute = precision.compute;
    o.activations = precision.activations;
    const size_t predicted = predict_peak_device_bytes(cfg, batch.B, batch.T, plan, o);
    // Just the predicted bytes: a buffer sized for the wrong layer kind would overflow or be refused.
    auto dev = make_cpu_device(predicted + 4096, seed % 2 ? LinkSpec{2.0, 2.0, 20e-6} : LinkSpec{});
    std::unique_ptr<NvmeStore> nvme = nvme_store_for(cfg, batch, plan, o);
    StreamingExecutor ex(cfg, *dev, o, nvme.get());
    ModelSlabs grads(cfg, DType::f32, Fill::zero, SlabSet::trained);
    GradTarget target;
    target.moe_aux_weight = moe_aux_coef;
    const StepStats st = ex.step(grads, exec_params, *weights, batch, plan, nullptr, nullptr, target);
    EXPECT_EQ(st.loss_sum, ref.loss_sum) << what;
    EXPECT_EQ(st.moe_aux_loss, ref.moe_aux) << what;
    EXPECT_EQ(st.tokens, ref.tokens) << what;
    expect_bitwise_equal(grads, ref_grads, what);
    EXPECT_EQ(st.peak_device_bytes, predicted) << what;
    if (::testing::Test::HasFailure()) return;
  }
}

// The NVMe store a plan needs (null when it uses no NVMe tier), in the test's temporary directory.
inline std::unique_ptr<NvmeStore> nvme_store_for(const ModelConfig& cfg, const Batch& batch, const Plan& plan,
                                          const ExecOptions& o) {
  if (!plan.uses(Tier::nvme)) return nullptr;
  NvmeOptions no;
  no.dir = ::testing::TempDir();
  no.capacity_bytes = plan_working_set(cfg, batch.B, batch.T, plan, o).nvme_bytes + 4096;
  return NvmeStore::open(no);
}

}  // namespace lt::testing
