// bench/bench_cuda_layer.cpp — one decoder layer's kernels and GEMMs on a GPU at Qwen2.5-7B shape (hidden 3584,
// 28 query / 4 kv heads of 128, intermediate 18944, T = 4096 tokens, bf16), timed with CUDA events:
//   layer_tflops      model FLOPs of forward + backward / the summed time of the layer's launches (GEMMs
//                     through the cuBLASLt wrapper, attention, norms, SwiGLU, adds); attention counted causal
//                     (forward 2 products over the lower triangle, backward 2.5x forward), as bench_layer.cpp
//   gemm_tflops       the wrapper's rate on the layer's GEMM shapes alone
//   peak_gemm_tflops  the wrapper's rate on an 8192^3 bf16 GEMM measured in the same run: the limit we compare
//                     to (spec_bf16_tflops: the data-sheet dense bf16 figure of known GPUs, for reference)
//   ratio             layer_tflops / peak_gemm_tflops (issue 17's target: >= 0.60)
//   attention_*_tflops the layer's attention alone (head dim 128); attention_forward_warp_rows its forward at head
//                     dims 64 and 128 by warps of 16 and of 32 query rows; attention_packed over 4 packed documents
//                     (TFLOPS of the pairs that attend); attention_d256 the same at Qwen3.6-27B's full
//                     attention (24 / 4 heads of 256, T = 4096); gated_delta the chunked gated delta rule at its
//                     linear attention's shape (16 / 48 heads of 128) over 8192 tokens, in ms beside FLA's;
//                     conv_l2norm its fused conv + q/k norms against the separate kernels, and in GB/s beside a copy
//   head              the fused LM head at the 7B's vocabulary over 4096 tokens: TFLOPS, ratio to the peak, and
//                     its cross-entropy's GB/s beside a device-to-device copy's
// One JSON line. Without a GPU (or a CUDA build) it prints {"skipped": reason} and exits 0.
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#if LT_WITH_CUDA
#include <cuda_runtime.h>

#include <functional>
#include <vector>

#include "core/rng.h"
#include "cuda/gemm.h"
#include "cuda/kernels.h"
#include "cuda/layers.h"
#include "cuda/native/cuda_check.h"
#include "ops/rope.h"

namespace lt::cuda {
namespace {

struct Buffer {
  void* p = nullptr;
  explicit Buffer(size_t bytes) { LT_CUDA_CHECK(cudaMalloc(&p, bytes), "bench cudaMalloc of {} bytes", bytes); }
  ~Buffer() { cudaFree(p); }
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// Fills a bf16 buffer with seeded values in [-scale, scale).
void fill_bf16(Buffer& b, size_t n, uint64_t seed, float scale) {
  Rng rng(seed);
  std::vector<bf16_t> h(n);
  for (auto& x : h) x = f32_to_bf16(rng.uniform(-scale, scale));
  LT_CUDA_CHECK(cudaMemcpy(b.p, h.data(), n * 2, cudaMemcpyHostToDevice), "bench upload");
}

// Fills an f32 buffer with seeded values in [lo, hi).
void fill_f32(Buffer& b, size_t n, uint64_t seed, float lo, float hi) {
  Rng rng(seed);
  std::vector<float> h(n);
  for (auto& x : h) x = rng.uniform(lo, hi);
  LT_CUDA_CHECK(cudaMemcpy(b.p, h.data(), n * 4, cudaMemcpyHostToDevice), "bench upload");
}

// Milliseconds per call of fn (enqueued on the default stream), after one warm-up, averaged over reps.
double time_ms(const std::function<void()>& fn, int reps = 5) {
  fn();
  LT_CUDA_CHECK(cudaDeviceSynchronize(), "bench warm-up");
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a);
  for (int i = 0; i < reps; ++i) fn();
  cudaEventRecord(b);
  LT_CUDA_CHECK(cudaEventSynchronize(b), "bench timing");
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  LT_CUDA_CHECK(cudaGetLastError(), "bench kernels");
  return double(ms) / reps;
}

double spec_bf16_tflops(const std::string& name) {  // data-sheet dense bf16 (f32 accumulate), SXM parts
  if (name.find("H200") != std::string::npos || name.find("H100") != std::string::npos) return 989.4;
  if (name.find("H800") != std::string::npos) return 989.4;
  if (name.find("A100") != std::string::npos || name.find("A800") != std::string::npos) return 312.0;
  if (name.find("L40S") != std::string::npos) return 362.1;
  if (name.find("4090") != std::string::npos) return 165.2;
  return 0.0;
}

// Causal attention's model FLOPs: the forward's two products over the lower triangle (the backward is 2.5 times).
double attention_forward_flops(const AttentionShape& s) {
  return 2.0 * 2.0 * double(s.B) * double(s.Hq) * double(s.D) * double(s.T) * double(s.T + 1) / 2.0;
}

// Attention alone at a shape (bf16, causal; `documents` > 1: each row packs that many equal documents, and the FLOPs
// count the pairs that attend): forward and (with_backward) backward milliseconds and TFLOPS.
nlohmann::json time_attention(const AttentionShape& s, bool with_backward = true, int64_t documents = 1) {
  const int64_t nq = s.B * s.T * s.Hq * s.D, nkv = s.B * s.T * s.Hkv * s.D, nl = s.B * s.Hq * s.T;
  Buffer q(nq * 2), k(nkv * 2), v(nkv * 2), out(nq * 2), lse(nl * 4), dout(nq * 4), dq(nq * 4), dk(nkv * 4),
      dv(nkv * 4), ws(attention_backward_workspace_bytes(s)), docs(documents > 1 ? size_t(s.B * s.T) * 4 : 1);
  fill_bf16(q, nq, 31, 1.0f), fill_bf16(k, nkv, 32, 1.0f), fill_bf16(v, nkv, 33, 1.0f);
  fill_f32(dout, nq, 34, -1.0f, 1.0f);
  const int32_t* doc_ids = nullptr;
  if (documents > 1) {  // row position t in document t · documents / T
    std::vector<int32_t> ids(size_t(s.B * s.T));
    for (size_t n = 0; n < ids.size(); ++n) ids[n] = int32_t(int64_t(n) % s.T * documents / s.T);
    LT_CUDA_CHECK(cudaMemcpy(docs.p, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice), "bench upload");
    doc_ids = docs.as<int32_t>();
  }
  const double fwd = time_ms([&] {
    native::attention_forward(nullptr, out.as<bf16_t>(), lse.as<float>(), q.as<bf16_t>(), k.as<bf16_t>(),
                              v.as<bf16_t>(), doc_ids, s);
  });
  AttentionShape one_document = s;  // the attended pairs: `documents` causal triangles of T / documents
  one_document.T = s.T / documents;
  const double flops = double(documents) * attention_forward_flops(one_document);
  nlohmann::json r = {{"shape", {{"T", s.T}, {"Hq", s.Hq}, {"Hkv", s.Hkv}, {"D", s.D}, {"documents", documents}}},
                      {"forward_ms", fwd},
                      {"forward_tflops", flops / (fwd * 1e-3) / 1e12}};
  if (!with_backward) return r;
  const double bwd = time_ms([&] {
    native::attention_backward(nullptr, dq.as<float>(), dk.as<float>(), dv.as<float>(), dout.as<float>(),
                               out.as<bf16_t>(), lse.as<float>(), q.as<bf16_t>(), k.as<bf16_t>(), v.as<bf16_t>(),
                               doc_ids, s, ws.p);
  });
  r["backward_ms"] = bwd;
  r["backward_tflops"] = 2.5 * flops / (bwd * 1e-3) / 1e12;
  return r;
}

// The tensor-core forward at head dims 64 and 128 (the 7B layer's 28 / 4 heads, T tokens) by warps of 16 query rows
// and of 32 (AttentionForwardWarpRows: the same bits), TFLOPS each: the figure that says which the launcher should
// take (kAttentionForwardWarpRows). On a GPU where the 32-row block does not fit (sm_86 / sm_89 at 128) both are
// the 16-row kernel.
nlohmann::json time_forward_warp_rows(int64_t T) {
  nlohmann::json r;
  for (const int64_t D : {64, 128}) {
    nlohmann::json& by_rows = r[D == 64 ? "D64_tflops" : "D128_tflops"];
    for (const int rows : {16, 32}) {
      const AttentionForwardWarpRows setting(rows);
      by_rows[rows == 16 ? "rows16" : "rows32"] = time_attention(AttentionShape{1, T, 28, 4, D}, false)["forward_tflops"];
    }
  }
  return r;
}

// The chunked gated delta rule at the Qwen3.5 / 3.6-27B layer's shape (16 key heads, 48 value heads of 128) over
// T tokens, bf16 q, k, v: forward and backward milliseconds, beside FLA's Triton kernels on an H200 (0.665 /
// 1.444 ms at 8192 tokens, docs/cuda.md) and issue 35's targets (0.6 / 1.3 ms).
nlohmann::json time_gated_delta(int64_t T) {
  const DeltaShape s = DeltaShape::packed(1, T, 16, 48, 128, 128, float(1.0 / std::sqrt(128.0)));
  const int64_t nqk = T * s.Hk * s.dk, nv = T * s.Hv * s.dv, ng = T * s.Hv;
  Buffer q(nqk * 2), k(nqk * 2), v(nv * 2), o(nv * 2), beta(ng * 4), g(ng * 4), dout(nv * 4), dq(nqk * 4),
      dk(nqk * 4), dv(nv * 4), dbeta(ng * 4), dg(ng * 4);
  Buffer fws(gated_delta_forward_workspace_bytes(s)), bws(gated_delta_backward_workspace_bytes(s));
  // q and k as the layer hands them over: L2-normalised rows (values of 1/sqrt(dk)), gates in their ranges.
  const float unit = float(1.0 / std::sqrt(128.0));
  fill_bf16(q, nqk, 41, unit), fill_bf16(k, nqk, 42, unit), fill_bf16(v, nv, 43, 1.0f);
  fill_f32(beta, ng, 44, 0.0f, 1.0f), fill_f32(g, ng, 45, -0.2f, 0.0f), fill_f32(dout, nv, 46, -1.0f, 1.0f);
  const double fwd = time_ms([&] {
    native::gated_delta_forward(nullptr, o.as<bf16_t>(), q.as<bf16_t>(), k.as<bf16_t>(), v.as<bf16_t>(),
                                beta.as<float>(), g.as<float>(), nullptr, s, fws.p);
  });
  const double bwd = time_ms([&] {
    native::gated_delta_backward(nullptr, dq.as<float>(), dk.as<float>(), dv.as<float>(), dbeta.as<float>(),
                                 dg.as<float>(), dout.as<float>(), q.as<bf16_t>(), k.as<bf16_t>(), v.as<bf16_t>(),
                                 beta.as<float>(), g.as<float>(), nullptr, s, bws.p);
  });
  return {{"shape", {{"T", T}, {"Hk", s.Hk}, {"Hv", s.Hv}, {"dk", s.dk}, {"dv", s.dv}}},
          {"forward_ms", fwd},
          {"backward_ms", bwd},
          {"fla_triton_h200_ms", {0.665, 1.444}},
          {"target_ms", {0.6, 1.3}}};
}

// Gated DeltaNet's conv + q/k L2 norms at the Qwen3.6-27B mixer's shape (16 key and 48 value heads of 128, K 4)
// over 8192 tokens in four documents: the fused kernels (conv_l2norm.cuh) and the separate ones they replaced
// (convert, conv, the two norms; the norms' backward, then the conv's), forward and backward ms; the fused passes'
// least bytes moved over their time in GB/s beside a device-to-device copy's (read plus written) measured here, the
// limit of these memory-bound passes.
nlohmann::json time_conv_l2norm() {
  const int64_t N = 8192, Hk = 16, dk = 128, Hv = 48, dv = 128, K = 4, KD = Hk * dk, Cc = 2 * KD + Hv * dv;
  const float eps = 1e-6f;
  Buffer p(N * Cc * 4), w(Cc * K * 4), pre(N * Cc * 2), out(N * Cc * 2), qk(N * 2 * KD * 2), qrn(N * Hk * 4),
      krn(N * Hk * 4), doc(N * 4), dqk(N * 2 * KD * 4), dout(N * Cc * 4), dx(N * Cc * 4), dw(Cc * K * 4),
      ws(short_conv_backward_workspace_bytes(N, Cc, K));
  fill_f32(p, N * Cc, 61, -2.0f, 2.0f), fill_f32(w, Cc * K, 62, -1.0f, 1.0f);
  fill_f32(dqk, N * 2 * KD, 63, -1.0f, 1.0f), fill_f32(dout, N * Cc, 64, -1.0f, 1.0f);
  std::vector<int32_t> ids(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) ids[size_t(n)] = int32_t(n / (N / 4));
  LT_CUDA_CHECK(cudaMemcpy(doc.p, ids.data(), N * 4, cudaMemcpyHostToDevice), "bench upload");
  cudaMemset(dw.p, 0, Cc * K * 4);
  const auto d = doc.as<int32_t>();
  const double fused_fwd = time_ms([&] {
    native::conv_l2norm_forward(nullptr, pre.as<bf16_t>(), out.as<bf16_t>(), qk.as<bf16_t>(), qrn.as<float>(),
                                krn.as<float>(), p.as<float>(), w.as<float>(), d, N, N, Cc, K, Hk, dk, eps);
  });
  const double separate_fwd = time_ms([&] {
    native::convert(nullptr, pre.as<bf16_t>(), p.as<float>(), N * Cc);
    native::short_conv_forward(nullptr, out.as<bf16_t>(), pre.as<bf16_t>(), w.as<float>(), d, N, N, Cc, K);
    native::l2norm_forward(nullptr, qk.as<bf16_t>(), qrn.as<float>(), out.as<bf16_t>(), N, Hk, dk, 2 * KD, Cc, eps);
    native::l2norm_forward(nullptr, qk.as<bf16_t>() + KD, krn.as<float>(), out.as<bf16_t>() + KD, N, Hk, dk, 2 * KD,
                           Cc, eps);
  });
  // The fused backward rewrites dout's q and k channels (its scratch) on every rep from dqk alone.
  const double fused_bwd = time_ms([&] {
    native::conv_l2norm_backward(nullptr, dx.as<float>(), dw.as<float>(), dout.as<float>(), dqk.as<float>(),
                                 pre.as<bf16_t>(), qrn.as<float>(), krn.as<float>(), w.as<float>(), d, N, N, Cc, K, Hk,
                                 dk, ws.p);
  });
  const double separate_bwd = time_ms([&] {
    native::l2norm_backward(nullptr, dout.as<float>(), dqk.as<float>(), out.as<bf16_t>(), qrn.as<float>(), N, Hk, dk,
                            Cc, 2 * KD, Cc);
    native::l2norm_backward(nullptr, dout.as<float>() + KD, dqk.as<float>() + KD, out.as<bf16_t>() + KD,
                            krn.as<float>(), N, Hk, dk, Cc, 2 * KD, Cc);
    native::short_conv_backward(nullptr, dx.as<float>(), dw.as<float>(), dout.as<float>(), pre.as<bf16_t>(),
                                w.as<float>(), d, N, N, Cc, K, ws.p);
  });
  const double copy_ms = time_ms([&] { cudaMemcpyAsync(dx.p, dout.p, N * Cc * 4, cudaMemcpyDeviceToDevice); });
  const double all = double(N * Cc), qk_part = double(N * 2 * KD);
  const double fwd_bytes = all * (4 + 2 + 2) + qk_part * 2 + 2.0 * double(N * Hk) * 4;
  const double bwd_bytes = qk_part * (4 + 2 + 4) + all * (4 + 2 + 4);
  return {{"shape", {{"N", N}, {"Hk", Hk}, {"Hv", Hv}, {"dk", dk}, {"dv", dv}, {"K", K}}},
          {"fused_forward_ms", fused_fwd},
          {"separate_forward_ms", separate_fwd},
          {"fused_backward_ms", fused_bwd},
          {"separate_backward_ms", separate_bwd},
          {"fused_forward_gbps", fwd_bytes / (fused_fwd * 1e-3) / 1e9},
          {"fused_backward_gbps", bwd_bytes / (fused_bwd * 1e-3) / 1e9},
          {"copy_gbps", 2.0 * all * 4 / (copy_ms * 1e-3) / 1e9}};
}

// The fused LM head at Qwen2.5-7B's shape (C 3584, V 152064, bf16 lm_head) over 4096 tokens, in gpu_head_shape's
// chunks (1024 tokens, 1 GiB of logits each), as the executor runs it: ms and TFLOPS of its three GEMMs' model
// FLOPs (logits, dxn, dlm_w: 3 · 2·N·C·V) beside `peak` (issue 35: the head at >= 60% of the GEMM rate); and the
// cross-entropy of one chunk alone in GB/s (two f32 reads of the logits and one bf16 write of the gradient),
// beside a device-to-device copy measured here (its bytes read plus written), the limit it is bound by.
nlohmann::json time_head(double peak) {
  const int64_t N = 4096, C = 3584, V = 152064;
  const HeadShape shape = gpu_head_shape(HeadShape{N, C, V, 1e-6f});
  native::CublasLt lt;
  Buffer gemm_ws(lt.workspace_bytes()), ws(head_workspace_bytes(shape, DType::bf16));
  Buffer x(N * C * 4), normw(C * 4), lm(V * C * 2), dx(N * C * 4), dnorm(C * 4), dlm(V * C * 4), loss(8),
      targets(N * 4);
  fill_f32(x, N * C, 51, -1.0f, 1.0f), fill_f32(normw, C, 52, 0.5f, 1.5f), fill_bf16(lm, V * C, 53, 0.02f);
  std::vector<int32_t> t(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) t[size_t(i)] = int32_t((i * 7919) % V);
  cudaMemcpy(targets.p, t.data(), N * 4, cudaMemcpyHostToDevice);
  cudaMemset(dnorm.p, 0, C * 4), cudaMemset(dlm.p, 0, V * C * 4), cudaMemset(loss.p, 0, 8);
  HeadArgs a;
  a.dx = dx.as<float>(), a.dnorm_w = dnorm.as<float>(), a.dlm_w = dlm.as<float>(), a.loss = loss.as<double>();
  a.x = x.as<float>(), a.targets = targets.as<int32_t>(), a.norm_w = normw.as<float>(), a.lm_w = lm.p;
  a.lm_type = DType::bf16, a.grad_scale = 1.0f / float(N), a.shape = shape, a.workspace = ws.p;
  const double head_ms = time_ms([&] { native::head_forward_backward(GemmContext{&lt, gemm_ws.p}, nullptr, a); });
  const double flops = 3.0 * 2.0 * double(N) * double(C) * double(V);
  // One chunk's cross-entropy alone, on seeded logits (the bf16 path leaves them as they are, so every rep sees them).
  const int64_t n = shape.chunk_tokens;
  Buffer logits(n * V * 4), dlogits(n * V * 2), row_loss(n * 8);
  fill_f32(logits, n * V, 54, -8.0f, 8.0f);
  const double ce_ms = time_ms([&] {
    native::cross_entropy(nullptr, logits.as<float>(), dlogits.as<bf16_t>(), row_loss.as<double>(),
                          targets.as<int32_t>(), n, V, 1.0f / float(N));
  });
  const double ce_bytes = double(n) * double(V) * (4.0 + 4.0 + 2.0);
  const double copy_ms = time_ms([&] { cudaMemcpyAsync(dlm.p, logits.p, n * V * 4, cudaMemcpyDeviceToDevice); });
  const double tflops = flops / (head_ms * 1e-3) / 1e12;
  return {{"shape", {{"N", N}, {"C", C}, {"V", V}, {"chunk_tokens", n}}},
          {"ms", head_ms},
          {"tflops", tflops},
          {"ratio", tflops / peak},
          {"cross_entropy_chunk_ms", ce_ms},
          {"cross_entropy_gbps", ce_bytes / (ce_ms * 1e-3) / 1e9},
          {"copy_gbps", 2.0 * double(n * V * 4) / (copy_ms * 1e-3) / 1e9}};
}

nlohmann::json run() {
  cudaDeviceProp prop{};
  LT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  const int64_t T = 4096, C = 3584, Hq = 28, Hkv = 4, D = 128, I = 18944, QD = Hq * D, KVD = Hkv * D;
  native::CublasLt lt;
  Buffer ws(lt.workspace_bytes());
  auto mm = [&](const Matmul& m) { lt.run(m, nullptr, ws.p); };

  // Weights (bf16), activations (bf16 stored, f32 where the kernels write f32), gradients (f32).
  Buffer wq(QD * C * 2), wk(KVD * C * 2), wv(KVD * C * 2), wo(C * QD * 2), wg(I * C * 2), wu(I * C * 2), wd(C * I * 2);
  fill_bf16(wq, QD * C, 1, 0.02f), fill_bf16(wk, KVD * C, 2, 0.02f), fill_bf16(wv, KVD * C, 3, 0.02f);
  fill_bf16(wo, C * QD, 4, 0.02f), fill_bf16(wg, I * C, 5, 0.02f), fill_bf16(wu, I * C, 6, 0.02f);
  fill_bf16(wd, C * I, 7, 0.02f);
  Buffer x(T * C * 2), n1(T * C * 2), q(T * QD * 2), k(T * KVD * 2), v(T * KVD * 2), att(T * QD * 2), h(T * I * 2);
  Buffer gate(T * I * 2), up(T * I * 2), xo(T * C * 2), lse(T * Hq * 4), rstd(T * 4), normw(C * 4);
  fill_bf16(x, T * C, 8, 1.0f), fill_bf16(q, T * QD, 9, 1.0f), fill_bf16(k, T * KVD, 10, 1.0f);
  fill_bf16(v, T * KVD, 11, 1.0f), fill_bf16(gate, T * I, 12, 1.0f), fill_bf16(up, T * I, 13, 1.0f);
  fill_bf16(att, T * QD, 14, 1.0f), fill_bf16(h, T * I, 15, 1.0f), fill_bf16(n1, T * C, 16, 1.0f);
  std::vector<float> ones(size_t(C), 1.0f);
  cudaMemcpy(normw.p, ones.data(), C * 4, cudaMemcpyHostToDevice);
  Buffer y32(T * I * 4), g32(T * I * 4), g32b(T * I * 4), gb16(T * I * 2), dw(I * C * 4), dwn(C * 4);
  Buffer dq(T * QD * 4), dk(T * KVD * 4), dv(T * KVD * 4), dout(T * QD * 4);
  const AttentionShape as{1, T, Hq, Hkv, D};
  Buffer attn_ws(attention_backward_workspace_bytes(as)), norm_ws(rmsnorm_backward_workspace_bytes(T, C));
  cudaMemset(g32.p, 0, T * I * 4), cudaMemset(gb16.p, 0, T * I * 2), cudaMemset(dout.p, 0, T * QD * 4);
  const MatType bf = MatType::bf16;

  // The layer's GEMMs as (out, in, W) triples: forward Y = X·Wᵀ, backward dX = dY·W and dW += dYᵀ·X.
  struct Lin {
    const Buffer& in;
    const Buffer& w;
    int64_t in_f, out_f;
  };
  const Lin lins[] = {{n1, wq, C, QD}, {n1, wk, C, KVD}, {n1, wv, C, KVD}, {att, wo, QD, C},
                      {n1, wg, C, I},  {n1, wu, C, I},   {h, wd, I, C}};
  double gemm_ms = 0, gemm_flops = 0;
  for (const Lin& l : lins) {
    gemm_ms += time_ms(
        [&] { mm(linear_forward_matmul(y32.p, MatType::f32, l.in.p, l.w.p, bf, nullptr, T, l.out_f, l.in_f)); });
    gemm_ms += time_ms([&] { mm(linear_dinput_matmul(g32b.as<float>(), gb16.p, l.w.p, bf, T, l.out_f, l.in_f)); });
    gemm_ms += time_ms([&] {
      for (const Matmul& m : linear_dweight_matmuls(dw.as<float>(), gb16.p, l.in.p, bf, T, l.out_f, l.in_f)) mm(m);
    });
    gemm_flops += 3.0 * 2.0 * double(T) * double(l.in_f) * double(l.out_f);
  }
  // Attention, norms, SwiGLU, residual adds, conversions of the gradients to bf16 GEMM operands.
  const double attn_fwd_ms = time_ms([&] {
    native::attention_forward(nullptr, att.as<bf16_t>(), lse.as<float>(), q.as<bf16_t>(), k.as<bf16_t>(),
                              v.as<bf16_t>(), nullptr, as);
  });
  const double attn_bwd_ms = time_ms([&] {
    native::attention_backward(nullptr, dq.as<float>(), dk.as<float>(), dv.as<float>(), dout.as<float>(),
                               att.as<bf16_t>(), lse.as<float>(), q.as<bf16_t>(), k.as<bf16_t>(), v.as<bf16_t>(),
                               nullptr, as, attn_ws.p);
  });
  double other_ms = 0;
  other_ms += 2 * time_ms([&] {
                native::rmsnorm_forward(nullptr, n1.as<bf16_t>(), rstd.as<float>(), x.as<bf16_t>(), normw.as<float>(),
                                        T, C, 1e-6f);
              });
  other_ms += 2 * time_ms([&] {
                native::rmsnorm_backward(nullptr, g32b.as<float>(), dwn.as<float>(), g32.as<float>(), x.as<bf16_t>(),
                                         normw.as<float>(), rstd.as<float>(), T, C, norm_ws.p);
              });
  other_ms +=
      time_ms([&] { native::swiglu_forward(nullptr, h.as<bf16_t>(), gate.as<bf16_t>(), up.as<bf16_t>(), T * I); });
  other_ms += time_ms([&] {
    native::swiglu_backward(nullptr, g32.as<float>(), g32b.as<float>(), y32.as<float>(), gate.as<bf16_t>(),
                            up.as<bf16_t>(), T * I);
  });
  other_ms += 2 * time_ms([&] { native::add(nullptr, xo.as<bf16_t>(), x.as<bf16_t>(), n1.as<bf16_t>(), T * C); });
  other_ms += 7 * time_ms([&] { native::convert(nullptr, gb16.as<bf16_t>(), g32.as<float>(), T * C); });

  const double attn_fwd_flops = attention_forward_flops(as);
  const double layer_flops = gemm_flops + attn_fwd_flops * 3.5;
  const double layer_ms = gemm_ms + attn_fwd_ms + attn_bwd_ms + other_ms;

  // The limit, measured here: one large square bf16 GEMM through the same wrapper.
  const int64_t S = 8192;
  Buffer a(S * S * 2), b(S * S * 2), c(S * S * 4);
  fill_bf16(a, S * S, 21, 1.0f), fill_bf16(b, S * S, 22, 1.0f);
  const double big_ms = time_ms([&] { mm(linear_forward_matmul(c.p, MatType::f32, a.p, b.p, bf, nullptr, S, S, S)); });
  const double peak = 2.0 * double(S) * double(S) * double(S) / (big_ms * 1e-3) / 1e12;
  const double layer_tflops = layer_flops / (layer_ms * 1e-3) / 1e12;
  return {{"gpu", prop.name},
          {"shape", "Qwen2.5-7B layer, T=4096, bf16"},
          {"layer_ms", layer_ms},
          {"layer_tflops", layer_tflops},
          {"gemm_ms", gemm_ms},
          {"gemm_tflops", gemm_flops / (gemm_ms * 1e-3) / 1e12},
          {"attention_forward_ms", attn_fwd_ms},
          {"attention_backward_ms", attn_bwd_ms},
          {"attention_forward_tflops", attn_fwd_flops / (attn_fwd_ms * 1e-3) / 1e12},
          {"attention_backward_tflops", 2.5 * attn_fwd_flops / (attn_bwd_ms * 1e-3) / 1e12},
          // Qwen3.6-27B's full attention (24 query / 4 kv heads of 256) and its Gated DeltaNet's core.
          {"attention_forward_warp_rows", time_forward_warp_rows(T)},
          // The same attention over 4 packed documents of 1024: the blocks skip the tiles outside their documents,
          // so its TFLOPS (of the pairs that attend) should stay near the unpacked ones.
          {"attention_packed", time_attention(AttentionShape{1, T, 28, 4, 128}, true, 4)},
          {"attention_d256", time_attention(AttentionShape{1, T, 24, 4, 256})},
          {"gated_delta", time_gated_delta(8192)},
          {"conv_l2norm", time_conv_l2norm()},
          {"head", time_head(peak)},
          {"other_kernels_ms", other_ms},
          {"peak_gemm_tflops", peak},
          {"spec_bf16_tflops", spec_bf16_tflops(prop.name)},
          {"ratio", layer_tflops / peak}};
}

}  // namespace
}  // namespace lt::cuda

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("%s\n", nlohmann::json({{"skipped", "no GPU"}}).dump().c_str());
    return 0;
  }
  try {
    std::printf("%s\n", lt::cuda::run().dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_layer: %s\n", e.what());
    return 1;
  }
  return 0;
}

#else

int main() {
  std::printf("%s\n", nlohmann::json({{"skipped", "built without CUDA (no nvcc)"}}).dump().c_str());
  return 0;
}

#endif
