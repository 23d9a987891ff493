// bench/bench_cuda_layer.cpp — one decoder layer's kernels and GEMMs on a GPU at Qwen2.5-7B shape (hidden 3584,
// 28 query / 4 kv heads of 128, intermediate 18944, T = 4096 tokens, bf16), timed with CUDA events:
//   layer_tflops      model FLOPs of forward + backward / the summed time of the layer's launches (GEMMs
//                     through the cuBLASLt wrapper, attention, norms, SwiGLU, adds); attention counted causal
//                     (forward 2 products over the lower triangle, backward 2.5x forward), as bench_layer.cpp
//   gemm_tflops       the wrapper's rate on the layer's GEMM shapes alone
//   peak_gemm_tflops  the wrapper's rate on an 8192^3 bf16 GEMM measured in the same run: the limit we compare
//                     to (spec_bf16_tflops: the data-sheet dense bf16 figure of known GPUs, for reference)
//   ratio             layer_tflops / peak_gemm_tflops (issue 17's target: >= 0.60)
// One JSON line. Without a GPU (or a CUDA build) it prints {"skipped": reason} and exits 0.
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

  const double attn_fwd_flops = 2.0 * 2.0 * double(Hq) * double(D) * double(T) * double(T + 1) / 2.0;
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
