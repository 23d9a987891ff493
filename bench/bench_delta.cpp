// bench/bench_delta.cpp — the chunked gated delta rule (Gated DeltaNet's core, ops/gated_delta.h) forward and
// backward on the CPU, against the GEMM library's rate.
//
// Shape: one Qwen3.6-27B linear-attention layer's heads scaled to the bench (key heads Hk, value heads 3·Hk, head
// dims 128), T tokens, B = 1; inputs as the layer feeds them (q, k L2-normalised, β ∈ (0, 1), g ≤ 0).
// Reports, best of `reps`:
//   fwd_ms, bwd_ms : one forward, one backward (the backward recomputes the chunk-start states itself)
//   fwd_gflops     : the planner's FLOPs of the forward (plan/hardware.h delta_rule_flops: 2·(3·c·dk + 2·c·dv +
//                    3·dk·dv) per value head and token, c = 64) / fwd time
//   step_gflops    : 3 × those FLOPs (forward + a backward of twice the forward, the convention of linear layers)
//                    / (fwd + bwd) time
//   gemm_gflops    : oneDNN f32 on [64, 128] x [128, 128], one thread per task as the kernel runs its chunks —
//                    the physical limit the chunk products could reach
// One JSON line. bench/run_delta.sh adds PyTorch (transformers' chunked torch implementation) in the same run.
//
// Usage: bench_delta [T] [Hk] [reps]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/cpu_features.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "core/timer.h"
#include "ops/gated_delta.h"
#include "ops/gemm.h"

namespace lt {
namespace {

double delta_flops(const DeltaShape& s) {
  const double c = double(kDeltaChunk), dk = double(s.dk), dv = double(s.dv);
  return 2.0 * (3 * c * dk + 2 * c * dv + 3 * dk * dv) * double(s.Hv) * double(s.N());
}

template <typename F>
double best_ms(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    Timer t;
    f();
    best = std::min(best, t.seconds() * 1e3);
  }
  return best;
}

// oneDNN on the chunk's typical product, as many independent tasks as threads, each single-threaded.
double gemm_rate(int reps) {
  const int64_t M = kDeltaChunk, N = 128, K = 128, per_task = 64;
  const int64_t tasks = 2 * num_threads();
  std::vector<float> a(size_t(M * K), 0.5f), b(size_t(K * N), 0.25f), c(size_t(tasks * M * N));
  const double ms = best_ms(reps, [&] {
    parallel_for(tasks, [&](int64_t t) {
      for (int64_t r = 0; r < per_task; ++r)
        gemm_f32(Trans::no, Trans::no, M, N, K, a.data(), K, b.data(), N, c.data() + t * M * N, N, Accumulate::no);
    });
  });
  return 2.0 * double(M * N * K) * double(tasks * per_task) / (ms * 1e6);
}

}  // namespace
}  // namespace lt

int main(int argc, char** argv) {
  using namespace lt;
  const int64_t T = argc > 1 ? std::atol(argv[1]) : 512;
  const int64_t Hk = argc > 2 ? std::atol(argv[2]) : 4;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 3;
  const DeltaShape s = DeltaShape::packed(1, T, Hk, 3 * Hk, 128, 128, 1.0f / std::sqrt(128.0f));
  Rng rng(1);
  auto uniform = [&](std::vector<float>& x, float lo, float hi) {
    for (float& v : x) v = lo + float(rng.uniform()) * (hi - lo);
  };
  std::vector<float> q(size_t(s.N() * Hk * 128)), k(q.size()), v(size_t(s.N() * s.Hv * 128));
  std::vector<float> beta(size_t(s.N() * s.Hv)), g(beta.size()), o(v.size()), dout(v.size());
  uniform(q, -1, 1), uniform(k, -1, 1), uniform(v, -1, 1), uniform(beta, 0.05f, 0.95f), uniform(g, -0.5f, -0.001f);
  uniform(dout, -1, 1);
  for (std::vector<float>* x : {&q, &k})  // unit rows per head, as the layer's L2 norm leaves them
    for (size_t r = 0; r < x->size(); r += 128) {
      double n = 0;
      for (size_t d = 0; d < 128; ++d) n += double((*x)[r + d]) * (*x)[r + d];
      for (size_t d = 0; d < 128; ++d) (*x)[r + d] = float((*x)[r + d] / std::sqrt(n));
    }
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size()), dbeta(beta.size()), dg(g.size());
  const double fwd = best_ms(reps, [&] {
    gated_delta_forward(o.data(), q.data(), k.data(), v.data(), beta.data(), g.data(), nullptr, s);
  });
  const double bwd = best_ms(reps, [&] {
    gated_delta_backward(dq.data(), dk.data(), dv.data(), dbeta.data(), dg.data(), dout.data(), q.data(), k.data(),
                         v.data(), beta.data(), g.data(), nullptr, s);
  });
  const double flops = delta_flops(s);
  const nlohmann::json out = {
      {"T", T},          {"Hk", Hk},
      {"Hv", s.Hv},      {"threads", num_threads()},
      {"fwd_ms", fwd},   {"bwd_ms", bwd},
      {"fwd_gflops", flops / (fwd * 1e6)},
      {"step_gflops", 3 * flops / ((fwd + bwd) * 1e6)},
      {"gemm_gflops", gemm_rate(reps)},
      {"vector_path", isa_name(isa_level(cpu_features()))},
  };
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
