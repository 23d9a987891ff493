// cli/cmd_bench.cpp — `lazytrain bench ...`: micro-benchmarks whose figures go into docs/.
//
//   bench optimizer --params N [--threads T] [--json]
//     AdamW with f32 states (adamw32) and blockwise 8-bit states (adamw8) on N random parameters (f32 master,
//     f32 gradients, clipping active: the coefficient from the gradient norm is < 1 and applied in the fused
//     pass), plus the gradient accumulation that yields the norm partials, and a STREAM triad measured in the
//     same run as the memory-bandwidth limit. One JSON line per implementation with --json.
//     The parameters are split into 1024 x 1024 matrices (the last one shorter), as bench/torch_optimizer.py
//     splits them for torch.optim.AdamW.
#include <immintrin.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/aligned.h"
#include "core/cpu_features.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "core/timer.h"
#include "optim/adamw.h"
#include "optim/clip.h"

namespace lt::cli {
namespace {

struct OptimizerBenchOptions {
  int64_t params = 50'000'000;
  int threads = 0;
  int reps = 5;
  int64_t block = 256;
  bool bf16_copy = false;
  bool json = false;
};

constexpr int64_t kBenchChunk = int64_t(1) << 20;  // elements per task of the triad and the initialisation

// a = b + s·c, one chunk; AVX2 where the CPU has it (the compiler's baseline is SSE2).
__attribute__((target("avx2"))) void triad_avx2(float* a, const float* b, const float* c, float s, int64_t n) {
  const __m256 vs = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(a + i, _mm256_add_ps(_mm256_loadu_ps(b + i), _mm256_mul_ps(vs, _mm256_loadu_ps(c + i))));
  for (; i < n; ++i) a[i] = b[i] + s * c[i];
}

void triad_chunk(float* a, const float* b, const float* c, float s, int64_t n) {
  if (cpu_features().avx2) return triad_avx2(a, b, c, s, n);
  for (int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

// STREAM's triad: best of `reps` timed passes after one warm-up, 24 bytes per element (2 reads, 1 write;
// the write's read-for-ownership is not counted, as in STREAM).
double triad_gb_per_s(float* a, const float* b, const float* c, int64_t n, int reps) {
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r <= reps; ++r) {
    Timer t;
    parallel_chunks(n, kBenchChunk, [&](int64_t b0, int64_t b1) { triad_chunk(a + b0, b + b0, c + b0, 3.0f, b1 - b0); });
    if (r > 0) best = std::min(best, t.seconds());
  }
  return 24.0 * double(n) / best / 1e9;
}

void fill_uniform(float* x, int64_t n, uint64_t seed, float lo, float hi) {
  parallel_chunks(n, kBenchChunk, [&](int64_t b0, int64_t b1) {
    Rng rng(seed + uint64_t(b0));
    for (int64_t i = b0; i < b1; ++i) x[i] = rng.uniform(lo, hi);
  });
}

// N parameters as 1024 x 1024 matrices (the last [rows, 1024] or a vector for the remainder), back to back.
std::vector<OptimTensor> bench_tensors(int64_t n, int64_t* padded) {
  std::vector<OptimTensor> out;
  int64_t offset = 0, left = n;
  while (left > 0) {
    OptimTensor t;
    t.name = fmt::format("w{}", out.size());
    const int64_t len = std::min<int64_t>(left, 1024 * 1024);
    t.shape = len % 1024 == 0 ? Shape{len / 1024, 1024} : Shape{len};
    t.param_offset = offset * 4;
    offset += len;  // 1024 x 1024 tensors: every one but the last starts 4 MiB-aligned
    left -= len;
    out.push_back(t);
  }
  *padded = offset;
  return out;
}

void run_optimizer_bench(const OptimizerBenchOptions& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  LT_CHECK(o.params >= 1, "--params must be positive");
  int64_t padded = 0;
  std::vector<OptimTensor> tensors = bench_tensors(o.params, &padded);
  AlignedBuffer<float> params(static_cast<size_t>(padded)), grads(static_cast<size_t>(padded)),
      incoming(static_cast<size_t>(padded));
  std::vector<nlohmann::json> lines;

  // The triad on the same buffers, before they are filled and again after the last timed step (when they are
  // no longer needed): the better of the two is this run's bandwidth limit, so a neighbour's burst during one
  // of them does not lower the bar.
  double triad = triad_gb_per_s(params.data(), grads.data(), incoming.data(), padded, 10);

  fill_uniform(params.data(), padded, 1, -1.0f, 1.0f);
  fill_uniform(incoming.data(), padded, 2, -1.0f, 1.0f);
  // The gradients arrive by accumulation, which returns the norm partials: timed as its own line.
  double sumsq = 0;
  double best_acc = std::numeric_limits<double>::infinity();
  for (int r = 0; r <= o.reps; ++r) {
    Timer t;
    // One call over the whole buffer (the tensors lie back to back): one fork-join, as accumulate_grad_slab
    // does per slab.
    sumsq = accumulate_grad(grads.data(), incoming.data(), padded, r == 0 ? GradMode::overwrite : GradMode::add);
    if (r > 0) best_acc = std::min(best_acc, t.seconds());
  }
  // After the timed passes the gradients are `reps + 1` times the incoming ones; the clip coefficient is
  // computed from their norm, as a training step would.
  const double norm = std::sqrt(sumsq);
  const float clip = clip_coefficient(norm, 1.0);
  LT_CHECK(clip < 1.0f, "benchmark gradients should be clipped (norm {})", norm);
  lines.push_back({{"impl", "accumulate"},
                   {"mparams_per_s", double(o.params) / best_acc / 1e6},
                   {"bytes_per_param", 12},
                   {"gb_per_s", 12.0 * double(o.params) / best_acc / 1e9}});

  AlignedBuffer<bf16_t> copy(o.bf16_copy ? static_cast<size_t>(padded) : size_t{0});
  for (StatePrecision precision : {StatePrecision::f32, StatePrecision::q8}) {
    AdamWConfig cfg;
    cfg.block_size = o.block;
    for (OptimTensor& t : tensors) t.precision = precision;
    for (OptimTensor& t : tensors) t.copy_offset = o.bf16_copy ? t.param_offset / 2 : -1;
    AdamWSlab slab(tensors, cfg);
    const StateReport report = slab.report();
    double best = std::numeric_limits<double>::infinity();
    for (int r = 0; r <= o.reps; ++r) {  // the first pass warms up (page faults of the fresh state)
      Timer t;
      slab.update(reinterpret_cast<uint8_t*>(params.data()), reinterpret_cast<const uint8_t*>(grads.data()),
                  {r + 1, 1e-5, clip}, o.bf16_copy ? reinterpret_cast<uint8_t*>(copy.data()) : nullptr);
      if (r > 0) best = std::min(best, t.seconds());
    }
    // Bytes that must move per parameter: p read + written, g read, states read + written, the bf16 copy.
    const double state_rw = precision == StatePrecision::f32 ? 16.0 : 4.0 + 16.0 / double(o.block);
    const double bytes = 12.0 + state_rw + (o.bf16_copy ? 2.0 : 0.0);
    const double gbs = bytes * double(o.params) / best / 1e9;
    lines.push_back({{"impl", precision == StatePrecision::f32 ? "adamw32" : "adamw8"},
                     {"mparams_per_s", double(o.params) / best / 1e6},
                     {"state_bytes_per_param", report.bytes_per_parameter()},
                     {"bytes_per_param", bytes},
                     {"gb_per_s", gbs}});
  }
  triad = std::max(triad, triad_gb_per_s(params.data(), grads.data(), incoming.data(), padded, 10));
  for (nlohmann::json& l : lines) {
    l["triad_gb_per_s"] = triad;
    l["fraction_of_triad"] = l["gb_per_s"].get<double>() / triad;
    l["params"] = o.params;
    l["threads"] = num_threads();
    l["vector_path"] = vector_path_name(best_vector_path());
    l["bf16_copy"] = o.bf16_copy;
  }
  if (o.json) {
    for (const nlohmann::json& l : lines) std::printf("%s\n", l.dump().c_str());
    return;
  }
  std::printf("%-11s %12s %12s %9s %9s %10s\n", "impl", "Mparams/s", "state B/par", "GB/s", "triad", "of triad");
  for (const nlohmann::json& l : lines) {
    const std::string state =
        l.contains("state_bytes_per_param") ? fmt::format("{:.3f}", l["state_bytes_per_param"].get<double>()) : "-";
    std::printf("%-11s %12.1f %12s %9.1f %9.1f %9.0f%%\n", l["impl"].get<std::string>().c_str(),
                l["mparams_per_s"].get<double>(), state.c_str(), l["gb_per_s"].get<double>(), triad,
                100.0 * l["gb_per_s"].get<double>() / triad);
  }
  std::printf("%lld parameters, %d threads, %s kernels, clip coefficient %.3g\n", static_cast<long long>(o.params),
              num_threads(), vector_path_name(best_vector_path()), double(clip));
}

void register_bench_optimizer(CLI::App& bench) {
  auto o = std::make_shared<OptimizerBenchOptions>();
  auto* cmd = bench.add_subcommand("optimizer", "AdamW (f32 and 8-bit states) throughput against a STREAM triad");
  cmd->add_option("--params", o->params, "number of parameters")->check(CLI::PositiveNumber);
  cmd->add_option("--threads", o->threads, "CPU threads (default: all cores)")->check(CLI::PositiveNumber);
  cmd->add_option("--reps", o->reps, "timed repetitions (best is reported)")->check(CLI::PositiveNumber);
  cmd->add_option("--block", o->block, "8-bit block size")->check(CLI::PositiveNumber);
  cmd->add_flag("--bf16-copy", o->bf16_copy, "also write the bf16 compute copy in the update pass");
  cmd->add_flag("--json", o->json, "one JSON line per implementation");
  cmd->callback([o]() { run_optimizer_bench(*o); });
}

}  // namespace

void register_bench(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "micro-benchmarks (figures for docs/)");
  bench->require_subcommand(1);
  register_bench_optimizer(*bench);
}

}  // namespace lt::cli
