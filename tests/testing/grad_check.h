// tests/testing/grad_check.h — helpers shared by the op tests: seeded random data and a
// central-difference gradient check.
//
// Finite differences of f32 code: with step h the truncation error is O(h^2 |f'''|) and the rounding
// error is about eps_f32 * |L| / h (eps_f32 = 6e-8). Losses here are projections sum(out * w) in double
// of O(1)-scaled data, so h = 1e-2 gives both terms near 1e-4 relative; checks use a relative error
// floor accordingly (each test states its bound and why).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/rng.h"

namespace lt::testing {

// n uniform values in [lo, hi), never all zero.
inline std::vector<float> random_vector(size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = rng.uniform(lo, hi);
  return v;
}

// Projection weights for turning a tensor output into a scalar loss.
inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * double(b[i]);
  return s;
}

struct GradCheckResult {
  double max_rel_error = 0;  // max over probed elements of |fd - an| / max(|fd| + |an|, floor)
  size_t worst_index = 0;
  double worst_fd = 0, worst_analytic = 0;
};

// Probes up to `probes` elements of `x` (all of them when x is small), comparing the central difference
// of loss() with analytic[i]. loss() must read x afresh each call.
inline GradCheckResult grad_check(std::vector<float>& x, const std::vector<float>& analytic,
                                  const std::function<double()>& loss, uint64_t seed, size_t probes = 64,
                                  float h = 1e-2f, double floor = 1e-2) {
  GradCheckResult r;
  Rng rng(seed);
  size_t n = x.size();
  for (size_t p = 0; p < std::min(probes, n); ++p) {
    size_t i = n <= probes ? p : size_t(rng.below(n));
    float saved = x[i];
    x[i] = saved + h;
    double lp = loss();
    x[i] = saved - h;
    double lm = loss();
    x[i] = saved;
    // Divide by the step actually taken in f32, not the nominal h.
    double step = double(saved + h) - double(saved - h);
    double fd = (lp - lm) / step;
    double err = std::fabs(fd - analytic[i]) / std::max(std::fabs(fd) + std::fabs(double(analytic[i])), floor);
    if (err > r.max_rel_error) {
      r.max_rel_error = err;
      r.worst_index = i;
      r.worst_fd = fd;
      r.worst_analytic = analytic[i];
    }
  }
  return r;
}

// Σ x² in double.
inline double dot_self(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
  return s;
}

// Same length and the same bits.
inline bool bits_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// Relative L2 error ||a - b|| / ||b||.
inline double rel_l2(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace lt::testing

#define EXPECT_GRAD_OK(result, bound, what)                                                                   \
  EXPECT_LE((result).max_rel_error, (bound))                                                                  \
      << what << ": worst element " << (result).worst_index << " finite difference " << (result).worst_fd \
      << " analytic " << (result).worst_analytic
