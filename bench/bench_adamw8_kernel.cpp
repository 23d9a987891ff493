// bench/bench_adamw8_kernel.cpp — single-thread timing of the fused AdamW kernels on one in-cache tensor, and
// a hash of the state after a fixed sequence of steps (to compare the bits of two builds or two paths).
//
//   bench_adamw8_kernel [N=65536] [REPS=400] [BLOCK=256]
//
// Prints, per path the CPU runs (LT_MAX_ISA=avx2 caps it at avx2; BENCH_PLAIN=1 adds plain), the best ns per
// parameter over REPS calls (after a warm-up) and an FNV-1a hash of p, codes, absmax and the bf16 copy after 20
// steps with varying gradients (the hash must not depend on the path). The arrays are 64-byte aligned, as the
// optimizer's slabs are.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "optim/kernels.h"

using namespace lt;

namespace {

// 64-byte aligned vectors, as the optimizer's slabs are (a 64-byte load or store that straddles two cache lines
// costs two).
template <typename T>
struct Align64 {
  using value_type = T;
  Align64() = default;
  template <typename U>
  Align64(const Align64<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64)); }
  void deallocate(T* p, size_t) { std::free(p); }
  template <typename U>
  bool operator==(const Align64<U>&) const { return true; }
};
template <typename T>
using AVec = std::vector<T, Align64<T>>;

uint64_t fnv(uint64_t h, const void* data, size_t bytes) {
  const auto* b = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

struct State {
  AVec<float> p, g, am, av;
  AVec<uint8_t> qm, qv;
  AVec<bf16_t> copy;
  AdamW8Args args(int64_t n, int64_t block, bool with_copy) {
    return {p.data(), g.data(), qm.data(), am.data(), qv.data(), av.data(), with_copy ? copy.data() : nullptr, n,
            block};
  }
};

State make_state(int64_t n, int64_t block) {
  State s;
  const int64_t blocks = (n + block - 1) / block;
  s.p.resize(size_t(n));
  s.g.resize(size_t(n));
  s.qm.assign(size_t(n), 127);
  s.qv.assign(size_t(n), 0);
  s.am.assign(size_t(blocks), 0.0f);
  s.av.assign(size_t(blocks), 0.0f);
  s.copy.resize(size_t(n));
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& x : s.p) x = 0.02f * nd(rng);
  return s;
}

void fill_grad(State& s, int64_t n, int64_t block, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ex(-6.0f, 0.0f);
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    const float scale = std::pow(10.0f, ex(rng));  // blocks of very different magnitudes
    for (int64_t i = b0; i < std::min(n, b0 + block); ++i) {
      float x = scale * nd(rng);
      if ((rng() & 1023) == 0) x *= 100.0f;  // a few outliers that set the absmax
      if ((rng() & 4095) == 0) x = 0.0f;
      s.g[size_t(i)] = x;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 65536;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 400;
  const int64_t block = argc > 3 ? std::atoll(argv[3]) : 256;
  const bool copy = std::getenv("BENCH_COPY") != nullptr;
  // The vector paths this CPU runs (as capped by LT_MAX_ISA), widest first.
  std::vector<VectorPath> paths;
  const VectorPath widest = best_vector_path();
  if (widest == VectorPath::avx512_vbmi) paths.push_back(VectorPath::avx512_vbmi);
  if (widest >= VectorPath::avx512) paths.push_back(VectorPath::avx512);
  if (widest >= VectorPath::avx2) paths.push_back(VectorPath::avx2);
  if (std::getenv("BENCH_PLAIN")) paths.push_back(VectorPath::plain);
  for (VectorPath path : paths) {
    // The hash: 20 steps with fresh gradients, an odd length to include a short block.
    {
      const int64_t hn = 3 * block * 7 + 48;
      State s = make_state(hn, block);
      for (int step = 1; step <= 20; ++step) {
        fill_grad(s, hn, block, uint32_t(step));
        const AdamWScalars sc = adamw_scalars(1e-3, 0.9, 0.999, 1e-8, 0.01, step, step % 3 == 0 ? 0.5f : 1.0f);
        adamw8(path, s.args(hn, block, true), sc);
      }
      uint64_t h = 14695981039346656037ull;
      h = fnv(h, s.p.data(), s.p.size() * 4);
      h = fnv(h, s.qm.data(), s.qm.size());
      h = fnv(h, s.qv.data(), s.qv.size());
      h = fnv(h, s.am.data(), s.am.size() * 4);
      h = fnv(h, s.av.data(), s.av.size() * 4);
      h = fnv(h, s.copy.data(), s.copy.size() * 2);
      std::printf("%-12s hash %016llx\n", vector_path_name(path), (unsigned long long)h);
    }
    State s = make_state(n, block);
    for (int step = 1; step <= 5; ++step) {
      fill_grad(s, n, block, uint32_t(100 + step));
      adamw8(path, s.args(n, block, copy), adamw_scalars(1e-3, 0.9, 0.999, 1e-8, 0.01, step, 1.0f));
    }
    const AdamWScalars sc = adamw_scalars(1e-3, 0.9, 0.999, 1e-8, 0.01, 6, 1.0f);
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      adamw8(path, s.args(n, block, copy), sc);
      const auto t1 = std::chrono::steady_clock::now();
      best = std::min(best, std::chrono::duration<double, std::nano>(t1 - t0).count() / double(n));
    }
    std::printf("%-12s adamw8 n=%lld block=%lld copy=%d: %.4f ns/param (%.2f G/s)\n", vector_path_name(path),
                (long long)n, (long long)block, int(copy), best, 1.0 / best);
  }
  if (std::getenv("BENCH_32")) {
    AVec<float> p(size_t(n), 0.01f), g(size_t(n), 1e-3f), m(size_t(n), 1e-4f), v(size_t(n), 1e-6f);
    const AdamWScalars sc = adamw_scalars(1e-3, 0.9, 0.999, 1e-8, 0.01, 6, 0.5f);
    double best32 = 1e30;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      adamw32(paths.front(), {p.data(), g.data(), m.data(), v.data(), nullptr, n}, sc);
      const auto t1 = std::chrono::steady_clock::now();
      best32 = std::min(best32, std::chrono::duration<double, std::nano>(t1 - t0).count() / double(n));
    }
    std::printf("%-12s adamw32 n=%lld: %.4f ns/param\n", vector_path_name(paths.front()), (long long)n, best32);
  }
  return 0;
}
