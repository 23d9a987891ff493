// cuda/sim_ops.cpp — the OpsOverride of `--device cuda-sim` (cuda/sim_ops.h): each op's arguments handed to
// the cuda-sim kernel launchers, with the host-side preparation a GPU executor does once per step done per
// call here (RoPE's cos/sin table, the embedding's token groups, bf16 copies of GEMM operands, workspaces).
#include "cuda/sim_ops.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "core/error.h"
#include "cuda/gemm.h"
#include "cuda/kernels.h"
#include "cuda/layers.h"
#include "ops/override.h"

namespace lt::cuda {
namespace {

constexpr Stream kSim = nullptr;  // cuda-sim launches run before they return; no stream

std::vector<bf16_t> rounded(const float* x, int64_t n) {
  std::vector<bf16_t> out(static_cast<size_t>(n));
  convert_f32_to_bf16(out.data(), x, size_t(n));
  return out;
}

MatType mat_type(const WeightRef& W) { return W.dtype == DType::bf16 ? MatType::bf16 : MatType::f32; }

void sim_rmsnorm_forward(float* out, float* rstd, const float* in, const float* weight, int64_t rows, int64_t C,
                         float eps) {
  sim::rmsnorm_forward(kSim, out, rstd, in, weight, rows, C, eps);
}

void sim_rmsnorm_backward(float* din, float* dweight, const float* dout, const float* in, const float* weight,
                          const float* rstd, int64_t rows, int64_t C) {
  std::vector<unsigned char> ws(rmsnorm_backward_workspace_bytes(rows, C));
  sim::rmsnorm_backward(kSim, din, dweight, dout, in, weight, rstd, rows, C, ws.data());
}

// cos/sin [P, D/2] for every position the call uses (ops' rope_table: the CPU op's angles). A row depends on
// its position alone, so one table per (D, theta) on each thread serves every call whose positions it covers
// (RoPE runs four times per layer and step; a GPU executor uploads the table once).
struct RopeTableCache {
  int64_t D = 0, P = 0;
  RopeSpec spec{0.0};
  std::vector<float> cos, sin;
  void cover(int64_t rows, int64_t d, const RopeSpec& rope) {
    const bool same = d == D && rope == spec;
    if (same && rows <= P) return;
    P = same ? std::max(rows, P) : rows;
    D = d, spec = rope;
    cos.resize(static_cast<size_t>(P * D / 2)), sin.resize(cos.size());
    rope_table(cos.data(), sin.data(), P, D, spec);
  }
};

void rope_sim(float* x, const int32_t* pos, int64_t N, int64_t H, int64_t D, const RopeSpec& rope, bool forward) {
  LT_CHECK(D > 0 && D % 2 == 0, "rope: head dimension D must be even and positive, got {}", D);
  int32_t max_pos = 0;
  for (int64_t n = 0; n < N; ++n) {
    LT_CHECK(pos[n] >= 0, "rope: negative position {} at token {}", pos[n], n);
    max_pos = std::max(max_pos, pos[n]);
  }
  thread_local RopeTableCache table;
  table.cover(int64_t(max_pos) + 1, D, rope);
  if (forward) sim::rope_forward(kSim, x, pos, table.cos.data(), table.sin.data(), N, H, D);
  else sim::rope_backward(kSim, x, pos, table.cos.data(), table.sin.data(), N, H, D);
}
void sim_rope_forward(float* x, const int32_t* pos, int64_t N, int64_t H, int64_t D, const RopeSpec& rope) {
  rope_sim(x, pos, N, H, D, rope, true);
}
void sim_rope_backward(float* dx, const int32_t* pos, int64_t N, int64_t H, int64_t D, const RopeSpec& rope) {
  rope_sim(dx, pos, N, H, D, rope, false);
}

void sim_swiglu_forward(float* out, const float* gate, const float* up, int64_t n) {
  sim::swiglu_forward(kSim, out, gate, up, n);
}
void sim_swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n) {
  sim::swiglu_backward(kSim, dgate, dup, dout, gate, up, n);
}

// Attention on bf16-exact inputs is bf16 storage: the CPU block at bf16 activations rounds q, k, v (and keeps
// the output rounded) where it stores them, as the CUDA block stores them in bf16. A GPU runs those on the bf16
// kernels, whose head dims 64 and 128 go to tensor cores with their own rounding points (attention_mma.cuh);
// so does this, on exact bf16 copies, so the in-memory path keeps the CUDA block's bits there too.
bool bf16_exact(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &x[i], 4);
    if (bits & 0xffffu) return false;
  }
  return true;
}
bool bf16_storage(const AttentionShape& s, const float* q, const float* k, const float* v) {
  const int64_t nq = s.B * s.T * s.Hq * s.D, nkv = s.B * s.T * s.Hkv * s.D;
  return attention_on_tensor_cores(s.D) && bf16_exact(q, nq) && bf16_exact(k, nkv) && bf16_exact(v, nkv);
}

void sim_attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                           const int32_t* doc_ids, AttentionShape s) {
  if (!bf16_storage(s, q, k, v)) return sim::attention_forward(kSim, out, lse, q, k, v, doc_ids, s);
  const int64_t nq = s.B * s.T * s.Hq * s.D, nkv = s.B * s.T * s.Hkv * s.D;
  std::vector<bf16_t> out_b(static_cast<size_t>(nq));
  sim::attention_forward(kSim, out_b.data(), lse, rounded(q, nq).data(), rounded(k, nkv).data(),
                         rounded(v, nkv).data(), doc_ids, s);
  convert_bf16_to_f32(out, out_b.data(), size_t(nq));
}
void sim_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out, const float* lse,
                            const float* q, const float* k, const float* v, const int32_t* doc_ids,
                            AttentionShape s) {
  std::vector<unsigned char> ws(attention_backward_workspace_bytes(s));
  const int64_t nq = s.B * s.T * s.Hq * s.D, nkv = s.B * s.T * s.Hkv * s.D;
  if (!bf16_storage(s, q, k, v) || !bf16_exact(out, nq))
    return sim::attention_backward(kSim, dq, dk, dv, dout, out, lse, q, k, v, doc_ids, s, ws.data());
  sim::attention_backward(kSim, dq, dk, dv, dout, rounded(out, nq).data(), lse, rounded(q, nq).data(),
                          rounded(k, nkv).data(), rounded(v, nkv).data(), doc_ids, s, ws.data());
}

void sim_embedding_forward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C, int64_t V) {
  group_tokens_by_id(ids, N, V);  // checks every id against V, naming the first bad one
  sim::embedding_forward(kSim, out, ids, table, N, C);
}
void sim_embedding_grad_rows(float* rows, const float* dout, const int32_t* start, const int32_t* order, int64_t P,
                             int64_t C) {
  sim::embedding_grad_rows(kSim, rows, dout, start, order, P, C);
}

// The GEMMs in bf16 mode read bf16 copies of the activations, as cuBLASLt would on the GPU.
void sim_linear_forward(float* out, const float* in, WeightRef W, const float* bias, int64_t N, int64_t in_f,
                        int64_t out_f) {
  if (N == 0) return;
  const MatType t = mat_type(W);
  std::vector<bf16_t> in_b = t == MatType::bf16 ? rounded(in, N * in_f) : std::vector<bf16_t>{};
  const void* x = t == MatType::bf16 ? static_cast<const void*>(in_b.data()) : in;
  emulate_matmul(linear_forward_matmul(out, MatType::f32, x, W.data, t, bias, N, out_f, in_f));
}

void sim_linear_backward(float* din, float* dW, float* dbias, const float* dout, const float* in, WeightRef W,
                         int64_t N, int64_t in_f, int64_t out_f) {
  if (N == 0) return;
  const MatType t = mat_type(W);
  std::vector<bf16_t> dout_b, in_b;
  const void* dy = dout;
  const void* x = in;
  if (t == MatType::bf16) {
    dout_b = rounded(dout, N * out_f);
    if (dW) in_b = rounded(in, N * in_f);
    dy = dout_b.data(), x = in_b.data();
  }
  if (din) emulate_matmul(linear_dinput_matmul(din, dy, W.data, t, N, out_f, in_f));
  if (dW)
    for (const Matmul& mm : linear_dweight_matmuls(dW, dy, x, t, N, out_f, in_f)) emulate_matmul(mm);
  if (dbias) sim::bias_grad(kSim, dbias, dout, N, out_f);
}

double sim_head_forward_backward(float* dx, float* dnorm_w, float* dlm_w, const float* x, const int32_t* targets,
                                 const float* norm_w, WeightRef lm_w, float grad_scale, HeadShape s) {
  s = gpu_head_shape(s);  // the GPU head's chunks, so this path sums dlm_w as the executor's CUDA head does
  std::vector<unsigned char> ws(head_workspace_bytes(s, lm_w.dtype));
  double loss = 0.0;
  HeadArgs a;
  a.dx = dx, a.dnorm_w = dnorm_w, a.dlm_w = dlm_w, a.loss = &loss;
  a.x = x, a.targets = targets, a.norm_w = norm_w, a.lm_w = lm_w.data, a.lm_type = lm_w.dtype;
  a.grad_scale = grad_scale, a.shape = s, a.workspace = ws.data();
  sim::head_forward_backward(GemmContext{}, kSim, a);
  return loss;
}

// The loss alone: the fused forward-backward into throwaway gradients (cuda-sim runs small models).
double sim_head_forward(const float* x, const int32_t* targets, const float* norm_w, WeightRef lm_w, HeadShape s) {
  std::vector<float> dx(static_cast<size_t>(s.N * s.C)), dnorm(static_cast<size_t>(s.C));
  std::vector<float> dlm(static_cast<size_t>(s.V * s.C));
  return sim_head_forward_backward(dx.data(), dnorm.data(), dlm.data(), x, targets, norm_w, lm_w, 1.0f, s);
}

// The rows of a strided [N, width] view packed into bf16, or nothing unless every value is bf16 exactly.
std::optional<std::vector<bf16_t>> packed_bf16(const float* x, int64_t N, int64_t width, int64_t ld) {
  std::vector<float> rows(static_cast<size_t>(N * width));
  for (int64_t n = 0; n < N; ++n) std::memcpy(&rows[size_t(n * width)], x + n * ld, size_t(width) * sizeof(float));
  if (!bf16_exact(rows.data(), N * width)) return std::nullopt;
  return rounded(rows.data(), N * width);
}

// At bf16 storage the CUDA block runs the rule on tensor cores (gated_delta_on_tensor_cores), with its own rounding
// points; so do these, on packed bf16 copies of exact-bf16 inputs, so the in-memory path keeps the block's bits.
struct Bf16DeltaInputs {
  std::vector<bf16_t> q, k, v;
  DeltaShape packed;  // the shape with contiguous rows: ldq = ldk = Hk·dk, ldv = Hv·dv
};
std::optional<Bf16DeltaInputs> bf16_delta_inputs(const float* q, const float* k, const float* v, const DeltaShape& s) {
  if (!gated_delta_on_tensor_cores(s)) return std::nullopt;
  const int64_t N = s.N(), KD = s.Hk * s.dk, VD = s.Hv * s.dv;
  auto qb = packed_bf16(q, N, KD, s.ldq), kb = packed_bf16(k, N, KD, s.ldk), vb = packed_bf16(v, N, VD, s.ldv);
  if (!qb || !kb || !vb) return std::nullopt;
  DeltaShape packed = s;
  packed.ldq = packed.ldk = KD, packed.ldv = VD;
  return Bf16DeltaInputs{std::move(*qb), std::move(*kb), std::move(*vb), packed};
}

void sim_gated_delta_forward(float* o, const float* q, const float* k, const float* v, const float* beta,
                             const float* g, const int32_t* doc_ids, const DeltaShape& s) {
  std::vector<unsigned char> ws(gated_delta_forward_workspace_bytes(s));
  if (auto in = bf16_delta_inputs(q, k, v, s)) {
    const size_t n = size_t(s.N() * s.Hv * s.dv);
    std::vector<bf16_t> ob(n);
    sim::gated_delta_forward(kSim, ob.data(), in->q.data(), in->k.data(), in->v.data(), beta, g, doc_ids, in->packed,
                             ws.data());
    convert_bf16_to_f32(o, ob.data(), n);
    return;
  }
  sim::gated_delta_forward(kSim, o, q, k, v, beta, g, doc_ids, s, ws.data());
}

void sim_gated_delta_backward(float* dq, float* dk, float* dv, float* dbeta, float* dg, const float* dout,
                              const float* q, const float* k, const float* v, const float* beta, const float* g,
                              const int32_t* doc_ids, const DeltaShape& s) {
  std::vector<unsigned char> ws(gated_delta_backward_workspace_bytes(s));
  if (auto in = bf16_delta_inputs(q, k, v, s)) {  // the gradients packed as the inputs, then to their strides
    const int64_t N = s.N(), KD = s.Hk * s.dk, VD = s.Hv * s.dv;
    std::vector<float> dqp(size_t(N * KD)), dkp(size_t(N * KD)), dvp(size_t(N * VD));
    sim::gated_delta_backward(kSim, dqp.data(), dkp.data(), dvp.data(), dbeta, dg, dout, in->q.data(), in->k.data(),
                              in->v.data(), beta, g, doc_ids, in->packed, ws.data());
    for (int64_t n = 0; n < N; ++n) {
      std::memcpy(dq + n * s.ldq, &dqp[size_t(n * KD)], size_t(KD) * sizeof(float));
      std::memcpy(dk + n * s.ldk, &dkp[size_t(n * KD)], size_t(KD) * sizeof(float));
      std::memcpy(dv + n * s.ldv, &dvp[size_t(n * VD)], size_t(VD) * sizeof(float));
    }
    return;
  }
  sim::gated_delta_backward(kSim, dq, dk, dv, dbeta, dg, dout, q, k, v, beta, g, doc_ids, s, ws.data());
}

void sim_clamped_swiglu_forward(float* out, const float* gate, const float* up, int64_t n, float alpha, float limit) {
  sim::clamped_swiglu_forward(kSim, out, gate, up, n, alpha, limit);
}
void sim_clamped_swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                                 int64_t n, float alpha, float limit) {
  sim::clamped_swiglu_backward(kSim, dgate, dup, dout, gate, up, n, alpha, limit);
}
void sim_attention_sinks_forward(float* out, float* lse, const float* sinks, AttentionShape s) {
  sim::attention_sinks_forward(kSim, out, lse, sinks, s);
}
void sim_attention_sinks_backward(float* dsinks, const float* dout, const float* out, const float* lse,
                                  const float* sinks, AttentionShape s) {
  sim::attention_sinks_backward(kSim, dsinks, dout, out, lse, sinks, s);
}

// Mixture-of-Experts: the kernels on the ops' host buffers (the routing's error flag read back as the CUDA block does).
void sim_router_forward(int32_t* ids, float* weights, float* probs, const float* logits, const RouterShape& s) {
  int32_t bad = 0;
  sim::moe_router_forward(kSim, ids, weights, probs, &bad, logits, s.N, s.E, s.k,
                          s.kind == RouterKind::topk_softmax, s.renormalize);
  LT_CHECK(bad == INT32_MAX, "router_forward: token {} has a non-finite router logit", bad);
}
void sim_router_backward(float* dlogits, const float* dweights, const float* dprobs_extra, const uint8_t* counted,
                         const int32_t* ids, const float* weights, const float* probs, const RouterShape& s) {
  sim::moe_router_backward(kSim, dlogits, dweights, dprobs_extra, counted, ids, weights, probs, s.N, s.E, s.k,
                           s.kind == RouterKind::topk_softmax, s.renormalize);
}
void sim_moe_permute(int64_t* offsets, int32_t* order, int32_t* row_of, const int32_t* ids, int64_t N, int64_t k,
                     int64_t E) {
  std::vector<unsigned char> ws(moe_permute_workspace_bytes(E));
  sim::moe_permute(kSim, offsets, order, row_of, ids, N, k, E, ws.data());
}
void sim_moe_gather(float* xp, const float* x, const int32_t* order, int64_t A, int64_t k, int64_t C) {
  sim::moe_gather(kSim, xp, x, order, A, k, C);
}
void sim_moe_scatter_add(float* dx, const float* dxp, const int32_t* row_of, int64_t N, int64_t k, int64_t C) {
  sim::moe_scatter_add(kSim, dx, dxp, row_of, N, k, C);
}
void sim_moe_combine_forward(float* out, const float* yp, const float* weights, const int32_t* row_of, int64_t N,
                             int64_t k, int64_t C) {
  sim::moe_combine_forward(kSim, out, yp, weights, row_of, N, k, C);
}
void sim_moe_combine_backward(float* dyp, float* dweights, const float* dout, const float* yp, const float* weights,
                              const int32_t* row_of, int64_t N, int64_t k, int64_t C) {
  sim::moe_combine_backward(kSim, dyp, dweights, dout, yp, weights, row_of, N, k, C);
}
void sim_moe_weight_grads(float* dweights, float* g, const float* h, const float* weights, const int32_t* order,
                          const int32_t* ids, const float* dout, const float* down_bias, int64_t A, int64_t k,
                          int64_t I, int64_t C) {
  sim::moe_weight_grads(kSim, dweights, g, h, weights, order, ids, dout, down_bias, A, k, I, C);
}
// The kernel's per-call partials added to the running totals, as the CPU op adds its own.
int64_t sim_aux_loss_accumulate(double* counts, double* prob_sums, const int32_t* ids, const float* probs,
                                const uint8_t* counted, int64_t N, int64_t E, int64_t k) {
  std::vector<double> part(static_cast<size_t>(2 * E));
  sim::moe_aux_partials(kSim, part.data(), part.data() + E, ids, probs, counted, N, E, k);
  for (int64_t e = 0; e < E; ++e) counts[e] += part[size_t(e)], prob_sums[e] += part[size_t(E + e)];
  return counted ? std::count_if(counted, counted + N, [](uint8_t m) { return m != 0; }) : N;
}

const OpsOverride kCudaSimOps{"cuda-sim",
                              sim_rmsnorm_forward,
                              sim_rmsnorm_backward,
                              sim_rope_forward,
                              sim_rope_backward,
                              sim_swiglu_forward,
                              sim_swiglu_backward,
                              sim_attention_forward,
                              sim_attention_backward,
                              sim_embedding_forward,
                              sim_embedding_grad_rows,
                              sim_linear_forward,
                              sim_linear_backward,
                              sim_head_forward,
                              sim_head_forward_backward,
                              sim_gated_delta_forward,
                              sim_gated_delta_backward,
                              sim_clamped_swiglu_forward,
                              sim_clamped_swiglu_backward,
                              sim_attention_sinks_forward,
                              sim_attention_sinks_backward,
                              sim_router_forward,
                              sim_router_backward,
                              sim_moe_permute,
                              sim_moe_gather,
                              sim_moe_scatter_add,
                              sim_moe_combine_forward,
                              sim_moe_combine_backward,
                              sim_moe_weight_grads,
                              sim_aux_loss_accumulate};

}  // namespace

void use_cuda_sim_kernels(bool on) { set_ops_override(on ? &kCudaSimOps : nullptr); }

#if !LT_WITH_CUDA
// Without CUDA there are no native kernels (cuda/native/native_ops.cpp has them in a CUDA build).
bool cuda_native_available() { return false; }
void use_cuda_native_kernels(bool on) {
  LT_CHECK(!on, "the native CUDA kernels are not in this build (configured without CUDA)");
  set_ops_override(nullptr);
}
#endif
bool using_cuda_sim_kernels() { return ops_override() == &kCudaSimOps; }

}  // namespace lt::cuda
