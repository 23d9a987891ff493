// cuda/native/native_ops.cpp — the ops on nvcc's kernels and cuBLASLt on GPU 0, as an OpsOverride (cuda/sim_ops.h:
// use_cuda_native_kernels): each op's host arguments copied to the device, the native launchers of cuda-sim's same
// sources run there, the outputs (and what an op accumulates into) copied back. For the op table's native rows
// (tests/testing/op_harness.h) — a GPU executor keeps its data on the device and never goes through here. Host code,
// built only with CUDA. The f32 paths only: attention's bf16 tensor-core route is the CUDA block's (cuda-sim's
// override takes it for bf16-exact inputs; this one does not).
#include <algorithm>
#include <memory>
#include <vector>

#include "core/error.h"
#include "cuda/gemm.h"
#include "cuda/kernels.h"
#include "cuda/layers.h"
#include "cuda/native/cuda_check.h"
#include "cuda/sim_ops.h"
#include "ops/override.h"

namespace lt::cuda {
namespace {

constexpr Stream kDefault = nullptr;  // the default stream; every call waits for its work before returning

// n elements of device memory, uploaded from `host` when given; download() copies them back.
template <class T>
class DeviceCopy {
 public:
  explicit DeviceCopy(size_t n, const T* host = nullptr) : n_(n) {
    LT_CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)), "op table: cudaMalloc of {} bytes", n * sizeof(T));
    if (host && n) LT_CUDA_CHECK(cudaMemcpy(p_, host, n * sizeof(T), cudaMemcpyHostToDevice), "op table: upload");
  }
  ~DeviceCopy() { cudaFree(p_); }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
  T* p() { return static_cast<T*>(p_); }
  void download(T* host) const {
    if (n_) LT_CUDA_CHECK(cudaMemcpy(host, p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "op table: download");
  }

 private:
  void* p_ = nullptr;
  size_t n_;
};
using Bytes = DeviceCopy<unsigned char>;

void finish(const char* op) {
  LT_CUDA_CHECK(cudaGetLastError(), "{} (native): launch", op);
  LT_CUDA_CHECK(cudaDeviceSynchronize(), "{} (native): kernel", op);
}

// One cuBLASLt handle and its workspace for the op table's GEMMs.
struct Gemm {
  native::CublasLt cublas;
  Bytes workspace{kGemmWorkspaceBytes};
  void run(const Matmul& mm) { cublas.run(mm, kDefault, workspace.p()); }
};
Gemm& gemm() {
  static Gemm g;
  return g;
}

size_t sz(int64_t n) { return size_t(n); }

void nat_rmsnorm_forward(float* out, float* rstd, const float* in, const float* w, int64_t rows, int64_t C, float eps) {
  DeviceCopy<float> d_in(sz(rows * C), in), d_w(sz(C), w), d_out(sz(rows * C)), d_rstd(sz(rows));
  native::rmsnorm_forward(kDefault, d_out.p(), d_rstd.p(), d_in.p(), d_w.p(), rows, C, eps);
  finish("rmsnorm_forward");
  d_out.download(out);
  d_rstd.download(rstd);
}

void nat_rmsnorm_backward(float* din, float* dw, const float* dout, const float* in, const float* w, const float* rstd,
                          int64_t rows, int64_t C) {
  DeviceCopy<float> d_din(sz(rows * C)), d_dw(sz(C), dw), d_dout(sz(rows * C), dout), d_in(sz(rows * C), in),
      d_w(sz(C), w), d_rstd(sz(rows), rstd);
  Bytes ws(rmsnorm_backward_workspace_bytes(rows, C));
  native::rmsnorm_backward(kDefault, d_din.p(), d_dw.p(), d_dout.p(), d_in.p(), d_w.p(), d_rstd.p(), rows, C, ws.p());
  finish("rmsnorm_backward");
  d_din.download(din);
  d_dw.download(dw);
}

void nat_rope(float* x, const int32_t* pos, int64_t N, int64_t H, int64_t D, const RopeSpec& rope, bool forward) {
  LT_CHECK(D > 0 && D % 2 == 0, "rope: head dimension D must be even and positive, got {}", D);
  int32_t max_pos = 0;
  for (int64_t n = 0; n < N; ++n) max_pos = std::max(max_pos, pos[n]);
  const int64_t P = int64_t(max_pos) + 1;
  std::vector<float> cos(sz(P * D / 2)), sin(cos.size());
  rope_table(cos.data(), sin.data(), P, D, rope);
  DeviceCopy<float> d_x(sz(N * H * D), x), d_cos(cos.size(), cos.data()), d_sin(sin.size(), sin.data());
  DeviceCopy<int32_t> d_pos(sz(N), pos);
  if (forward) native::rope_forward(kDefault, d_x.p(), d_pos.p(), d_cos.p(), d_sin.p(), N, H, D);
  else native::rope_backward(kDefault, d_x.p(), d_pos.p(), d_cos.p(), d_sin.p(), N, H, D);
  finish("rope");
  d_x.download(x);
}
void nat_rope_forward(float* x, const int32_t* pos, int64_t N, int64_t H, int64_t D, const RopeSpec& rope) {
  nat_rope(x, pos, N, H, D, rope, true);
}
void nat_rope_backward(float* dx, const int32_t* pos, int64_t N, int64_t H, int64_t D, const RopeSpec& rope) {
  nat_rope(dx, pos, N, H, D, rope, false);
}

void nat_swiglu_forward(float* out, const float* gate, const float* up, int64_t n) {
  DeviceCopy<float> d_out(sz(n)), d_gate(sz(n), gate), d_up(sz(n), up);
  native::swiglu_forward(kDefault, d_out.p(), d_gate.p(), d_up.p(), n);
  finish("swiglu_forward");
  d_out.download(out);
}
void nat_swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n) {
  DeviceCopy<float> d_dgate(sz(n)), d_dup(sz(n)), d_dout(sz(n), dout), d_gate(sz(n), gate), d_up(sz(n), up);
  native::swiglu_backward(kDefault, d_dgate.p(), d_dup.p(), d_dout.p(), d_gate.p(), d_up.p(), n);
  finish("swiglu_backward");
  d_dgate.download(dgate);
  d_dup.download(dup);
}

void nat_attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                           const int32_t* doc_ids, AttentionShape s) {
  const int64_t nq = s.B * s.T * s.Hq * s.D, nkv = s.B * s.T * s.Hkv * s.D, nlse = s.B * s.Hq * s.T;
  DeviceCopy<float> d_out(sz(nq)), d_lse(sz(nlse)), d_q(sz(nq), q), d_k(sz(nkv), k), d_v(sz(nkv), v);
  DeviceCopy<int32_t> d_doc(doc_ids ? sz(s.B * s.T) : 0, doc_ids);
  native::attention_forward(kDefault, d_out.p(), d_lse.p(), d_q.p(), d_k.p(), d_v.p(), doc_ids ? d_doc.p() : nullptr, s);
  finish("attention_forward");
  d_out.download(out);
  d_lse.download(lse);
}
void nat_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out, const float* lse,
                            const float* q, const float* k, const float* v, const int32_t* doc_ids, AttentionShape s) {
  const int64_t nq = s.B * s.T * s.Hq * s.D, nkv = s.B * s.T * s.Hkv * s.D, nlse = s.B * s.Hq * s.T;
  DeviceCopy<float> d_dq(sz(nq)), d_dk(sz(nkv)), d_dv(sz(nkv)), d_dout(sz(nq), dout), d_out(sz(nq), out),
      d_lse(sz(nlse), lse), d_q(sz(nq), q), d_k(sz(nkv), k), d_v(sz(nkv), v);
  DeviceCopy<int32_t> d_doc(doc_ids ? sz(s.B * s.T) : 0, doc_ids);
  Bytes ws(attention_backward_workspace_bytes(s));
  native::attention_backward(kDefault, d_dq.p(), d_dk.p(), d_dv.p(), d_dout.p(), d_out.p(), d_lse.p(), d_q.p(), d_k.p(),
                             d_v.p(), doc_ids ? d_doc.p() : nullptr, s, ws.p());
  finish("attention_backward");
  d_dq.download(dq);
  d_dk.download(dk);
  d_dv.download(dv);
}

void nat_embedding_forward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C, int64_t V) {
  group_tokens_by_id(ids, N, V);  // checks every id against V, naming the first bad one
  DeviceCopy<float> d_out(sz(N * C)), d_table(sz(V * C), table);
  DeviceCopy<int32_t> d_ids(sz(N), ids);
  native::embedding_forward(kDefault, d_out.p(), d_ids.p(), d_table.p(), N, C);
  finish("embedding_forward");
  d_out.download(out);
}
void nat_embedding_grad_rows(float* rows, const float* dout, const int32_t* start, const int32_t* order, int64_t P,
                             int64_t C) {
  if (P == 0) return;
  // The ids' tokens are order[start[0] .. start[P]) (a batch of groups reads part of order), rows of dout below
  // the largest of them.
  int64_t dout_rows = 0;
  for (int64_t k = start[0]; k < start[P]; ++k) dout_rows = std::max<int64_t>(dout_rows, int64_t(order[k]) + 1);
  DeviceCopy<float> d_rows(sz(P * C)), d_dout(sz(dout_rows * C), dout);
  DeviceCopy<int32_t> d_start(sz(P + 1), start), d_order(sz(start[P]), order);
  native::embedding_grad_rows(kDefault, d_rows.p(), d_dout.p(), d_start.p(), d_order.p(), P, C);
  finish("embedding_grad_rows");
  d_rows.download(rows);
}

// The operands of a linear op on the device: bf16 weights read bf16 copies of the activations, as cuBLASLt does.
struct LinearOperands {
  MatType type;
  std::unique_ptr<DeviceCopy<float>> f32;
  std::unique_ptr<DeviceCopy<bf16_t>> b16;
  LinearOperands(const float* x, int64_t n, MatType t) : type(t) {
    if (t == MatType::f32) {
      f32 = std::make_unique<DeviceCopy<float>>(sz(n), x);
      return;
    }
    std::vector<bf16_t> r(sz(n));
    convert_f32_to_bf16(r.data(), x, sz(n));
    b16 = std::make_unique<DeviceCopy<bf16_t>>(sz(n), r.data());
  }
  const void* p() { return f32 ? static_cast<const void*>(f32->p()) : b16->p(); }
};
size_t weight_bytes(const WeightRef& W, int64_t n) { return sz(n) * (W.dtype == DType::bf16 ? 2 : 4); }

void nat_linear_forward(float* out, const float* in, WeightRef W, const float* bias, int64_t N, int64_t in_f,
                        int64_t out_f) {
  if (N == 0) return;
  const MatType t = W.dtype == DType::bf16 ? MatType::bf16 : MatType::f32;
  LinearOperands x(in, N * in_f, t);
  Bytes d_w(weight_bytes(W, out_f * in_f), static_cast<const unsigned char*>(W.data));
  DeviceCopy<float> d_out(sz(N * out_f)), d_bias(bias ? sz(out_f) : 0, bias);
  gemm().run(linear_forward_matmul(d_out.p(), MatType::f32, x.p(), d_w.p(), t, bias ? d_bias.p() : nullptr, N, out_f, in_f));
  finish("linear_forward");
  d_out.download(out);
}

void nat_linear_backward(float* din, float* dW, float* dbias, const float* dout, const float* in, WeightRef W, int64_t N,
                         int64_t in_f, int64_t out_f) {
  if (N == 0) return;
  const MatType t = W.dtype == DType::bf16 ? MatType::bf16 : MatType::f32;
  LinearOperands dy(dout, N * out_f, t), x(in, N * in_f, t);
  Bytes d_w(weight_bytes(W, out_f * in_f), static_cast<const unsigned char*>(W.data));
  DeviceCopy<float> d_din(din ? sz(N * in_f) : 0), d_dW(dW ? sz(out_f * in_f) : 0, dW), d_dbias(dbias ? sz(out_f) : 0, dbias),
      d_dout(sz(N * out_f), dout);
  if (din) gemm().run(linear_dinput_matmul(d_din.p(), dy.p(), d_w.p(), t, N, out_f, in_f));
  if (dW)
    for (const Matmul& mm : linear_dweight_matmuls(d_dW.p(), dy.p(), x.p(), t, N, out_f, in_f)) gemm().run(mm);
  if (dbias) native::bias_grad(kDefault, d_dbias.p(), d_dout.p(), N, out_f);
  finish("linear_backward");
  if (din) d_din.download(din);
  if (dW) d_dW.download(dW);
  if (dbias) d_dbias.download(dbias);
}

double nat_head_forward_backward(float* dx, float* dnorm_w, float* dlm_w, const float* x, const int32_t* targets,
                                 const float* norm_w, WeightRef lm_w, float grad_scale, HeadShape s) {
  DeviceCopy<float> d_dx(sz(s.N * s.C)), d_dnorm(sz(s.C), dnorm_w), d_dlm(sz(s.V * s.C), dlm_w), d_x(sz(s.N * s.C), x),
      d_norm(sz(s.C), norm_w);
  DeviceCopy<int32_t> d_targets(sz(s.N), targets);
  Bytes d_lm(weight_bytes(lm_w, s.V * s.C), static_cast<const unsigned char*>(lm_w.data));
  Bytes ws(head_workspace_bytes(s, lm_w.dtype));
  const double zero = 0.0;
  DeviceCopy<double> d_loss(1, &zero);
  HeadArgs a;
  a.dx = d_dx.p(), a.dnorm_w = dnorm_w ? d_dnorm.p() : nullptr, a.dlm_w = dlm_w ? d_dlm.p() : nullptr;
  a.loss = d_loss.p();
  a.x = d_x.p(), a.targets = d_targets.p(), a.norm_w = d_norm.p(), a.lm_w = d_lm.p(), a.lm_type = lm_w.dtype;
  a.grad_scale = grad_scale, a.shape = s, a.workspace = ws.p();
  native::head_forward_backward(GemmContext{&gemm().cublas, gemm().workspace.p()}, kDefault, a);
  finish("head_forward_backward");
  d_dx.download(dx);
  if (dnorm_w) d_dnorm.download(dnorm_w);  // null: frozen, not made
  if (dlm_w) d_dlm.download(dlm_w);
  double loss = 0;
  d_loss.download(&loss);
  return loss;
}

double nat_head_forward(const float* x, const int32_t* targets, const float* norm_w, WeightRef lm_w, HeadShape s) {
  std::vector<float> dx(sz(s.N * s.C)), dnorm(sz(s.C)), dlm(sz(s.V * s.C));
  return nat_head_forward_backward(dx.data(), dnorm.data(), dlm.data(), x, targets, norm_w, lm_w, 1.0f, s);
}

// The chunked gated delta rule stays the CPU op's here (null: not overridden); its native kernel is held against
// cuda-sim's by tests/cuda/test_kernels_native.cpp.
void nat_attention_sinks_forward(float* out, float* lse, const float* sinks, AttentionShape s) {
  const int64_t nq = s.B * s.T * s.Hq * s.D, nlse = s.B * s.Hq * s.T;
  DeviceCopy<float> d_out(sz(nq), out), d_lse(sz(nlse), lse), d_sinks(sz(s.Hq), sinks);
  native::attention_sinks_forward(kDefault, d_out.p(), d_lse.p(), d_sinks.p(), s);
  finish("attention_sinks_forward");
  d_out.download(out);
  d_lse.download(lse);
}
void nat_attention_sinks_backward(float* dsinks, const float* dout, const float* out, const float* lse,
                                  const float* sinks, AttentionShape s) {
  const int64_t nq = s.B * s.T * s.Hq * s.D, nlse = s.B * s.Hq * s.T;
  DeviceCopy<float> d_ds(sz(s.Hq)), d_dout(sz(nq), dout), d_out(sz(nq), out), d_lse(sz(nlse), lse),
      d_sinks(sz(s.Hq), sinks);
  native::attention_sinks_backward(kDefault, d_ds.p(), d_dout.p(), d_out.p(), d_lse.p(), d_sinks.p(), s);
  finish("attention_sinks_backward");
  d_ds.download(dsinks);
}

// Mixture-of-Experts (ops/moe.h): integer and float operands alike copied over and back.
void nat_router_forward(int32_t* ids, float* weights, float* probs, const float* logits, const RouterShape& s) {
  DeviceCopy<int32_t> d_ids(sz(s.N * s.k)), d_bad(1);
  DeviceCopy<float> d_w(sz(s.N * s.k)), d_p(sz(s.N * s.E)), d_logits(sz(s.N * s.E), logits);
  native::moe_router_forward(kDefault, d_ids.p(), d_w.p(), d_p.p(), d_bad.p(), d_logits.p(), s.N, s.E, s.k,
                             s.kind == RouterKind::topk_softmax, s.renormalize);
  finish("router_forward");
  int32_t bad = 0;
  d_bad.download(&bad);
  LT_CHECK(bad == INT32_MAX, "router_forward: token {} has a non-finite router logit", bad);
  d_ids.download(ids);
  d_w.download(weights);
  d_p.download(probs);
}
void nat_router_backward(float* dlogits, const float* dweights, const float* dprobs_extra, const uint8_t* counted,
                         const int32_t* ids, const float* weights, const float* probs, const RouterShape& s) {
  DeviceCopy<float> d_dz(sz(s.N * s.E)), d_dw(sz(s.N * s.k), dweights), d_extra(dprobs_extra ? sz(s.E) : 0, dprobs_extra),
      d_w(sz(s.N * s.k), weights), d_p(sz(s.N * s.E), probs);
  DeviceCopy<uint8_t> d_counted(counted ? sz(s.N) : 0, counted);
  DeviceCopy<int32_t> d_ids(sz(s.N * s.k), ids);
  native::moe_router_backward(kDefault, d_dz.p(), d_dw.p(), dprobs_extra ? d_extra.p() : nullptr,
                              counted ? d_counted.p() : nullptr, d_ids.p(), d_w.p(), d_p.p(), s.N, s.E, s.k,
                              s.kind == RouterKind::topk_softmax, s.renormalize);
  finish("router_backward");
  d_dz.download(dlogits);
}
void nat_moe_permute(int64_t* offsets, int32_t* order, int32_t* row_of, const int32_t* ids, int64_t N, int64_t k,
                     int64_t E) {
  DeviceCopy<int64_t> d_off(sz(E + 1));
  DeviceCopy<int32_t> d_order(sz(N * k)), d_row(sz(N * k)), d_ids(sz(N * k), ids);
  Bytes ws(moe_permute_workspace_bytes(E));
  native::moe_permute(kDefault, d_off.p(), d_order.p(), d_row.p(), d_ids.p(), N, k, E, ws.p());
  finish("moe_permute");
  d_off.download(offsets);
  d_order.download(order);
  d_row.download(row_of);
}
void nat_moe_gather(float* xp, const float* x, const int32_t* order, int64_t A, int64_t k, int64_t C) {
  DeviceCopy<float> d_xp(sz(A * C)), d_x(sz(A / k * C), x);
  DeviceCopy<int32_t> d_order(sz(A), order);
  native::moe_gather(kDefault, d_xp.p(), d_x.p(), d_order.p(), A, k, C);
  finish("moe_gather");
  d_xp.download(xp);
}
void nat_moe_scatter_add(float* dx, const float* dxp, const int32_t* row_of, int64_t N, int64_t k, int64_t C) {
  DeviceCopy<float> d_dx(sz(N * C)), d_dxp(sz(N * k * C), dxp);
  DeviceCopy<int32_t> d_row(sz(N * k), row_of);
  native::moe_scatter_add(kDefault, d_dx.p(), d_dxp.p(), d_row.p(), N, k, C);
  finish("moe_scatter_add");
  d_dx.download(dx);
}
void nat_moe_combine_forward(float* out, const float* yp, const float* weights, const int32_t* row_of, int64_t N,
                             int64_t k, int64_t C) {
  DeviceCopy<float> d_out(sz(N * C)), d_yp(sz(N * k * C), yp), d_w(sz(N * k), weights);
  DeviceCopy<int32_t> d_row(sz(N * k), row_of);
  native::moe_combine_forward(kDefault, d_out.p(), d_yp.p(), d_w.p(), d_row.p(), N, k, C);
  finish("moe_combine_forward");
  d_out.download(out);
}
void nat_moe_combine_backward(float* dyp, float* dweights, const float* dout, const float* yp, const float* weights,
                              const int32_t* row_of, int64_t N, int64_t k, int64_t C) {
  DeviceCopy<float> d_dyp(sz(N * k * C)), d_dw(sz(N * k)), d_dout(sz(N * C), dout), d_yp(sz(N * k * C), yp),
      d_w(sz(N * k), weights);
  DeviceCopy<int32_t> d_row(sz(N * k), row_of);
  native::moe_combine_backward(kDefault, d_dyp.p(), d_dw.p(), d_dout.p(), d_yp.p(), d_w.p(), d_row.p(), N, k, C);
  finish("moe_combine_backward");
  d_dyp.download(dyp);
  d_dw.download(dweights);
}
void nat_moe_weight_grads(float* dweights, float* g, const float* h, const float* weights, const int32_t* order,
                          const int32_t* ids, const float* dout, const float* down_bias, int64_t A, int64_t k,
                          int64_t I, int64_t C) {
  int32_t max_id = 0;
  for (int64_t a = 0; a < A; ++a) max_id = std::max(max_id, ids[a]);
  DeviceCopy<float> d_dw(sz(A)), d_g(sz(A * I), g), d_h(sz(A * I), h), d_w(sz(A), weights),
      d_dout(down_bias ? sz(A / k * C) : 0, dout), d_bias(down_bias ? sz((max_id + 1) * C) : 0, down_bias);
  DeviceCopy<int32_t> d_order(sz(A), order), d_ids(sz(A), ids);
  native::moe_weight_grads(kDefault, d_dw.p(), d_g.p(), d_h.p(), d_w.p(), d_order.p(), d_ids.p(),
                           down_bias ? d_dout.p() : nullptr, down_bias ? d_bias.p() : nullptr, A, k, I, C);
  finish("moe_weight_grads");
  d_dw.download(dweights);
  d_g.download(g);
}
int64_t nat_aux_loss_accumulate(double* counts, double* prob_sums, const int32_t* ids, const float* probs,
                                const uint8_t* counted, int64_t N, int64_t E, int64_t k) {
  DeviceCopy<double> d_part(sz(2 * E));
  DeviceCopy<int32_t> d_ids(sz(N * k), ids);
  DeviceCopy<float> d_p(sz(N * E), probs);
  DeviceCopy<uint8_t> d_counted(counted ? sz(N) : 0, counted);
  native::moe_aux_partials(kDefault, d_part.p(), d_part.p() + E, d_ids.p(), d_p.p(), counted ? d_counted.p() : nullptr,
                           N, E, k);
  finish("aux_loss_accumulate");
  std::vector<double> part(sz(2 * E));
  d_part.download(part.data());
  for (int64_t e = 0; e < E; ++e) counts[e] += part[sz(e)], prob_sums[e] += part[sz(E + e)];
  return counted ? std::count_if(counted, counted + N, [](uint8_t m) { return m != 0; }) : N;
}

const OpsOverride kNativeOps{"cuda",
                             nat_rmsnorm_forward,
                             nat_rmsnorm_backward,
                             nat_rope_forward,
                             nat_rope_backward,
                             nat_swiglu_forward,
                             nat_swiglu_backward,
                             nat_attention_forward,
                             nat_attention_backward,
                             nat_embedding_forward,
                             nat_embedding_grad_rows,
                             nat_linear_forward,
                             nat_linear_backward,
                             nat_head_forward,
                             nat_head_forward_backward,
                             nullptr,
                             nullptr,
                             nullptr,
                             nullptr,
                             nat_attention_sinks_forward,
                             nat_attention_sinks_backward,
                             nat_router_forward,
                             nat_router_backward,
                             nat_moe_permute,
                             nat_moe_gather,
                             nat_moe_scatter_add,
                             nat_moe_combine_forward,
                             nat_moe_combine_backward,
                             nat_moe_weight_grads,
                             nat_aux_loss_accumulate};

}  // namespace

bool cuda_native_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

void use_cuda_native_kernels(bool on) { set_ops_override(on ? &kNativeOps : nullptr); }

}  // namespace lt::cuda
