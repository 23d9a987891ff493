// bench/bench_embedding.cpp — the embedding's host ops at a Qwen2.5 shape against the memory bandwidth measured in the
// same run: the lookup, the backward's two halves (embedding_grad_rows: dx0 [N, C] summed per id into rows [P, C];
// embedding_add_rows: the rows added into the table) and the whole backward.
//
//   bench_embedding [N=16384] [C=3584] [V=152064] [REPS=5]
//
// Token ids are Zipf-distributed over the vocabulary (exponent 1, as word frequencies are), so P — the ids present —
// is what text gives, well under N. Each op's bytes are what it must move at least (the lookup: N rows read and
// written; the rows: N read, P written; the add: P rows read, P table rows read and written); the baseline is a
// memcpy of dx0 ([N, C] f32) on as many threads (parallel_chunks), its GB/s counting the read and the write. Prints
// the best of REPS for each, at one thread and at every thread.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "core/parallel.h"
#include "core/timer.h"
#include "ops/embedding.h"

using namespace lt;

namespace {

double best_seconds(int reps, const std::function<void()>& f) {
  f();  // first touch, page faults
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    Timer t;
    f();
    best = std::min(best, t.seconds());
  }
  return best;
}

// ids [N] drawn with P(v) ∝ 1 / (v + 1) over [0, V), then shuffled over the vocabulary (frequent ids anywhere).
std::vector<int32_t> zipf_ids(int64_t N, int64_t V, uint64_t seed) {
  std::vector<double> cdf(static_cast<size_t>(V));
  double s = 0;
  for (int64_t v = 0; v < V; ++v) cdf[size_t(v)] = (s += 1.0 / double(v + 1));
  std::vector<int32_t> perm(static_cast<size_t>(V));
  for (int64_t v = 0; v < V; ++v) perm[size_t(v)] = int32_t(v);
  std::mt19937_64 rng(seed);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::uniform_real_distribution<double> u(0.0, s);
  std::vector<int32_t> ids(static_cast<size_t>(N));
  for (auto& id : ids) id = perm[size_t(std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin())];
  return ids;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t N = argc > 1 ? std::atoll(argv[1]) : 16384;
  const int64_t C = argc > 2 ? std::atoll(argv[2]) : 3584;
  const int64_t V = argc > 3 ? std::atoll(argv[3]) : 152064;
  const int reps = argc > 4 ? std::atoi(argv[4]) : 5;
  if (N <= 0 || C <= 0 || V <= 0 || reps <= 0) {
    std::fprintf(stderr, "usage: bench_embedding [N>0] [C>0] [V>0] [REPS>0]\n");
    return 2;
  }
  const std::vector<int32_t> ids = zipf_ids(N, V, 1);
  const TokenGroups g = group_tokens_by_id(ids.data(), N, V);
  const int64_t P = int64_t(g.present.size());
  std::vector<float> table(size_t(V * C)), dtable(size_t(V * C), 0.0f), x(size_t(N * C)), dx(size_t(N * C)),
      copy(size_t(N * C)), rows(size_t(P * C));
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& v : dx) v = u(rng);
  for (int64_t i = 0; i < V * C; i += 97) table[size_t(i)] = u(rng);
  std::printf("embedding N %lld  C %lld  V %lld  ids present P %lld (%.1f%% of N)\n", (long long)N, (long long)C,
              (long long)V, (long long)P, 100.0 * double(P) / double(N));
  const double row = double(C) * 4, gb = 1e9;
  const int all = num_threads();
  for (const int threads : {1, all}) {
    set_num_threads(threads);
    const double base = best_seconds(reps, [&] {
      parallel_chunks(N, 64, [&](int64_t r0, int64_t r1) {
        std::memcpy(copy.data() + r0 * C, dx.data() + r0 * C, size_t((r1 - r0) * C) * 4);
      });
    });
    const double base_gbps = 2 * double(N) * row / base / gb;
    std::printf("\n%d thread(s): memcpy of dx0 %.2f ms, %.1f GB/s (read + write): the bandwidth baseline\n", threads,
                base * 1e3, base_gbps);
    auto report = [&](const char* what, double s, double bytes) {
      std::printf("  %-26s %8.2f ms  %6.1f GB/s  %.2f of memcpy\n", what, s * 1e3, bytes / s / gb,
                  bytes / s / gb / base_gbps);
    };
    report("lookup (N rows)", best_seconds(reps, [&] { embedding_forward(x.data(), ids.data(), table.data(), N, C, V); }),
           2 * double(N) * row);
    report("rows (N read, P written)", best_seconds(reps, [&] {
             embedding_grad_rows(rows.data(), dx.data(), g.start.data(), g.order.data(), P, C);
           }),
           double(N + P) * row);
    report("add rows (P)", best_seconds(reps, [&] {
             embedding_add_rows(dtable.data(), rows.data(), g.present.data(), P, C, 0, V * C);
           }),
           3 * double(P) * row);
    report("whole backward", best_seconds(reps, [&] {
             embedding_backward(dtable.data(), dx.data(), ids.data(), N, C, V);
           }),
           double(N + 3 * P) * row);
  }
  return 0;
}
