// Helpers for the kernel tests: buffers with sentinel guards around them, seeded data, bf16 rounding of
// inputs, bitwise comparison. No CUDA or cuda-sim header, so native tests include it too; the thread orders
// of cuda-sim are in cuda/sim_orders.h.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"

namespace lt::cuda::testing {

// n elements with kGuard sentinel elements on each side; data() points past the front guard. A kernel that
// writes outside its output shows as a changed guard.
template <class T>
class Guarded {
 public:
  static constexpr size_t kGuard = 64;
  explicit Guarded(size_t n) : n_(n), buf_(n + 2 * kGuard) {
    std::memset(buf_.data(), kSentinelByte, buf_.size() * sizeof(T));
  }
  Guarded(const std::vector<T>& v) : Guarded(v.size()) { std::memcpy(data(), v.data(), v.size() * sizeof(T)); }
  T* data() { return buf_.data() + kGuard; }
  const T* data() const { return buf_.data() + kGuard; }
  size_t size() const { return n_; }
  std::vector<T> values() const { return std::vector<T>(data(), data() + n_); }
  // True when both guards still hold the sentinel.
  bool guards_intact() const {
    const auto* bytes = reinterpret_cast<const unsigned char*>(buf_.data());
    const size_t guard_bytes = kGuard * sizeof(T), tail = (kGuard + n_) * sizeof(T);
    for (size_t i = 0; i < guard_bytes; ++i)
      if (bytes[i] != kSentinelByte || bytes[tail + i] != kSentinelByte) return false;
    return true;
  }

 private:
  static constexpr unsigned char kSentinelByte = 0xa5;
  size_t n_;
  std::vector<T> buf_;
};

// Seeded values in [lo, hi), none exactly zero (never all-zero data).
inline std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -2.0f, float hi = 2.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) {
    x = rng.uniform(lo, hi);
    if (x == 0.0f) x = 0.5f;
  }
  return v;
}

inline std::vector<bf16_t> to_bf16(const std::vector<float>& v) {
  std::vector<bf16_t> out(v.size());
  convert_f32_to_bf16(out.data(), v.data(), v.size());
  return out;
}
inline std::vector<float> to_f32(const std::vector<bf16_t>& v) {
  std::vector<float> out(v.size());
  convert_bf16_to_f32(out.data(), v.data(), v.size());
  return out;
}

// Index of the first element whose bits differ, or -1.
template <class T>
long first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return long(i);
  return -1;
}

#define EXPECT_BITWISE_EQ(a, b)                                                                     \
  do {                                                                                              \
    const long lt_diff = ::lt::cuda::testing::first_difference((a), (b));                          \
    EXPECT_EQ(lt_diff, -1) << #a " and " #b " differ first at element " << lt_diff;                \
  } while (0)

// Σ a[i]·b[i] in double (a loss as a projection of a tensor output).
inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * double(b[i]);
  return s;
}

// Directional derivative of `loss` at x along v by central differences, in double.
inline double central_difference(const std::function<double(const std::vector<float>&)>& loss, std::vector<float> x,
                                 const std::vector<float>& v, float eps) {
  std::vector<float> plus = x, minus = x;
  for (size_t i = 0; i < x.size(); ++i) {
    plus[i] += eps * v[i];
    minus[i] -= eps * v[i];
  }
  return (loss(plus) - loss(minus)) / (2.0 * double(eps));
}

// Relative L2 distance ||a − b|| / ||b||, in double.
inline double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return std::sqrt(num / (den > 0 ? den : 1e-300));
}

// "rows=7 C=5"-style trace text for a shape.
inline std::string shape_name(std::initializer_list<int64_t> dims) {
  std::string s = "shape";
  for (int64_t d : dims) {
    s += ' ';
    s += std::to_string(d);
  }
  return s;
}

}  // namespace lt::cuda::testing
