// The op harness (after ggml's test-backend-ops): one table of ops × backends × dtypes × odd shapes. Every row runs
// the op's host entry point (ops/*.h) on a backend — the plain loops, the AVX2 or AVX-512 paths (the CPU features
// capped in-process), the CUDA kernels under cuda-sim in each thread order, or natively on a GPU (the ops routed
// there, ops/override.h)
// — on seeded inputs (never all zero), into outputs with sentinels on both sides, and compares with the plain
// backend's outputs: bit for bit, or within a tolerance derived from the dtype and the length of the sums the op
// reorders. A failing row names the op, the backend, the dtype and the shape. Adding an op is one registration:
// shapes, dtypes, a run function and its tolerances (tests/ops/test_op_harness.cpp).
//
// Native CUDA is a row where a GPU is present (skipped elsewhere): the ops routed to nvcc's kernels and cuBLASLt on
// GPU 0, each call copying its operands there and its results back (cuda/native/native_ops.cpp).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "cuda/sim_ops.h"
#include "cuda_sim/cuda_sim.h"

namespace lt::testing {

enum class OpBackend { plain, avx2, avx512, cuda_sim_forward, cuda_sim_reverse, cuda_sim_warps, cuda_sim_random, cuda };
constexpr OpBackend kAllBackends[] = {OpBackend::plain,           OpBackend::avx2,           OpBackend::avx512,
                                      OpBackend::cuda_sim_forward, OpBackend::cuda_sim_reverse, OpBackend::cuda_sim_warps,
                                      OpBackend::cuda_sim_random,  OpBackend::cuda};

inline const char* backend_name(OpBackend b) {
  switch (b) {
    case OpBackend::plain: return "plain";
    case OpBackend::avx2: return "avx2";
    case OpBackend::avx512: return "avx512";
    case OpBackend::cuda_sim_forward: return "cuda_sim_forward";
    case OpBackend::cuda_sim_reverse: return "cuda_sim_reverse";
    case OpBackend::cuda_sim_warps: return "cuda_sim_warps";
    case OpBackend::cuda_sim_random: return "cuda_sim_random";
    case OpBackend::cuda: return "cuda";
  }
  return "?";
}
inline bool is_cuda_sim(OpBackend b) { return b >= OpBackend::cuda_sim_forward && b <= OpBackend::cuda_sim_random; }
// The CUDA kernels: under cuda-sim, or natively on a GPU.
inline bool is_cuda(OpBackend b) { return is_cuda_sim(b) || b == OpBackend::cuda; }

// Whether this host can run the backend's path (the probed features, as LT_MAX_ISA caps them).
inline bool backend_available(OpBackend b) {
  const IsaLevel level = isa_level(cpu_features());
  if (b == OpBackend::avx512) return level >= IsaLevel::avx512;
  if (b == OpBackend::avx2) return level >= IsaLevel::avx2;
  if (b == OpBackend::cuda) return cuda::cuda_native_available();
  return true;
}

// While it lives, the host ops run on the backend's path: the CPU features capped to it, the ops routed to the CUDA
// kernels under cuda-sim in the thread order it names, or to the native kernels on GPU 0. Everything goes back when
// it ends.
class BackendScope {
 public:
  explicit BackendScope(OpBackend b) {
    if (b == OpBackend::cuda) {
      cuda::use_cuda_native_kernels(true);
      native_ = true;
      return;
    }
    if (is_cuda_sim(b)) {
      using cuda_sim::Order;
      const cuda_sim::OrderSetting order = b == OpBackend::cuda_sim_forward   ? cuda_sim::OrderSetting{Order::forward, 0}
                                           : b == OpBackend::cuda_sim_reverse ? cuda_sim::OrderSetting{Order::reverse, 0}
                                           : b == OpBackend::cuda_sim_warps   ? cuda_sim::OrderSetting{Order::warps, 0}
                                                                              : cuda_sim::OrderSetting{Order::random, 11};
      cuda_sim::set_default_order(order);
      cuda::use_cuda_sim_kernels(true);
      sim_ = true;
      return;
    }
    features_ = b == OpBackend::plain  ? CpuFeatures{}
                : b == OpBackend::avx2 ? cap_features(cpu_features(), IsaLevel::avx2)
                                       : cpu_features();
    cpu_features_override(&features_);
  }
  ~BackendScope() {
    if (native_) {
      cuda::use_cuda_native_kernels(false);
    } else if (sim_) {
      cuda::use_cuda_sim_kernels(false);
      cuda_sim::clear_default_order();
    } else {
      cpu_features_override(nullptr);
    }
  }
  BackendScope(const BackendScope&) = delete;
  BackendScope& operator=(const BackendScope&) = delete;

 private:
  CpuFeatures features_{};
  bool sim_ = false, native_ = false;
};

// An op's outputs in one run: each in a buffer with sentinel elements on both sides (a write past either end shows
// as a changed sentinel), read back as doubles (floats and the head's f64 loss alike, exactly).
class OpOutputs {
 public:
  // n floats for output `name`, filled with `init` (an op that accumulates) or with NaN (an op that must write).
  float* add(const std::string& name, size_t n, const std::vector<float>& init = {}) {
    auto b = std::make_unique<Buffer>();
    b->name = name;
    b->data.assign(n + 2 * kGuard, kSentinel);
    float* p = b->data.data() + kGuard;
    if (init.empty()) std::fill(p, p + n, std::nanf(""));
    else std::memcpy(p, init.data(), n * sizeof(float));
    b->n = n;
    buffers_.push_back(std::move(b));
    return p;
  }
  // A scalar result (a loss).
  void scalar(const std::string& name, double v) { scalars_.push_back({name, v}); }

  struct Output {
    std::string name;
    std::vector<double> values;
    bool guards_intact = true;
  };
  std::vector<Output> read() const {
    std::vector<Output> out;
    for (const auto& b : buffers_) {
      Output o{b->name, {}, true};
      const float* p = b->data.data() + kGuard;
      o.values.assign(p, p + b->n);
      for (size_t i = 0; i < kGuard; ++i) {
        o.guards_intact &= bits(b->data[i]) == bits(kSentinel);
        o.guards_intact &= bits(b->data[kGuard + b->n + i]) == bits(kSentinel);
      }
      out.push_back(std::move(o));
    }
    for (const auto& [name, v] : scalars_) out.push_back({name, {v}, true});
    return out;
  }

 private:
  static constexpr size_t kGuard = 32;
  static constexpr float kSentinel = 12345.678f;
  static uint32_t bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
  }
  struct Buffer {
    std::string name;
    std::vector<float> data;
    size_t n = 0;
  };
  std::vector<std::unique_ptr<Buffer>> buffers_;
  std::vector<std::pair<std::string, double>> scalars_;
};

// What a row must match the plain reference to: the same bits (both 0), or |got - want| <= relative × max |want| over
// the output + absolute (an output that is rounding noise of O(1) terms — a softmax gradient of one key, exactly 0
// in one order and 1e-6 in another — has no scale of its own: `absolute` is the inputs').
struct Tolerance {
  double relative = 0, absolute = 0;
  static Tolerance bitwise() { return {0, 0}; }
  // Sums of `terms` products in another order (another vector width, another kernel's blocking): each reordering
  // moves a sum by at most terms × u of its terms' magnitudes (u = 2^-24 in f32); 4× that, as the kernel tests.
  static Tolerance reordered_sums(int64_t terms) { return {4.0 * double(terms) * std::ldexp(1.0, -24), 0}; }
  static Tolerance of(double relative, double absolute = 0) { return {relative, absolute}; }
  bool is_bitwise() const { return relative == 0 && absolute == 0; }
};

using Shape = std::vector<int64_t>;
inline std::string shape_name(const Shape& s) {
  std::string n;
  for (int64_t d : s) {
    if (!n.empty()) n += 'x';
    n += std::to_string(d);
  }
  return n;
}

// One op of the table.
struct OpCase {
  std::string name;                // "rmsnorm_forward"
  std::vector<Shape> shapes;       // odd shapes: partial vector tails, partial blocks, one row, many
  std::vector<DType> dtypes;       // the operand dtype the op is run with (f32; bf16 where it takes bf16 weights)
  bool on_cuda_sim = true;         // the CUDA routing (cuda-sim and native) has a kernel for it (ops/override.h)
  // Runs the op once at (shape, dtype) on seeded inputs (the same every call), its outputs into `out`.
  std::function<void(OpOutputs& out, const Shape& shape, DType dtype)> run;
  // The row's tolerance against the plain reference.
  std::function<Tolerance(OpBackend, DType, const Shape&)> tolerance;
};

// Runs `op` at (shape, dtype) on `backend`.
inline std::vector<OpOutputs::Output> run_on(const OpCase& op, OpBackend backend, const Shape& shape, DType dtype) {
  const BackendScope scope(backend);
  OpOutputs out;
  op.run(out, shape, dtype);
  return out.read();
}

// Checks `got` against `want` (the plain backend's) within `tol`, and the sentinels; failures name `what`.
inline void expect_row(const std::vector<OpOutputs::Output>& got, const std::vector<OpOutputs::Output>& want,
                       Tolerance tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t k = 0; k < got.size(); ++k) {
    const auto& g = got[k];
    const auto& w = want[k];
    EXPECT_TRUE(g.guards_intact) << what << ": '" << g.name << "' wrote past its end";
    ASSERT_EQ(g.values.size(), w.values.size()) << what << ": " << g.name;
    double scale = 0;
    for (double v : w.values) scale = std::max(scale, std::abs(v));
    for (size_t i = 0; i < g.values.size(); ++i) {
      const bool same = std::memcmp(&g.values[i], &w.values[i], sizeof(double)) == 0;
      if (same) continue;
      if (tol.is_bitwise()) {
        ADD_FAILURE() << what << ": '" << g.name << "' differs from the plain reference first at element " << i << " ("
                      << g.values[i] << " vs " << w.values[i] << "; expected the same bits)";
        break;
      }
      if (!(std::abs(g.values[i] - w.values[i]) <= tol.relative * scale + tol.absolute)) {
        ADD_FAILURE() << what << ": '" << g.name << "' element " << i << " is " << g.values[i] << ", the plain reference "
                      << w.values[i] << " (tolerance " << tol.relative << " × " << scale << " + " << tol.absolute << ")";
        break;
      }
    }
  }
}

// Bit for bit: every cuda-sim thread order repeats the forward order's results.
inline void expect_same_bits(const std::vector<OpOutputs::Output>& got, const std::vector<OpOutputs::Output>& want,
                             const std::string& what) {
  expect_row(got, want, Tolerance::bitwise(), what);
}

}  // namespace lt::testing
