// Helpers shared by the cuda-sim tests: the thread orders every correct kernel must pass under, seeded
// inputs, and a check that a launch fails with an lt::Error saying the right things.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "cuda_sim/cuda_sim.h"

namespace lt::cuda_sim::testing {

// forward, reverse, warp by warp and `random_seeds` seeded random orders (seeds 1..random_seeds).
inline std::vector<Options> orders(int random_seeds = 5) {
  std::vector<Options> out{Options{.order = Order::forward}, Options{.order = Order::reverse},
                           Options{.order = Order::warps}};
  for (int s = 1; s <= random_seeds; ++s) out.push_back(Options{.order = Order::random, .seed = uint64_t(s)});
  return out;
}

inline std::string describe(const Options& o) {
  std::string s = std::string("order ") + order_name(o.order.value_or(Order::forward));
  if (o.order == Order::random) s += " seed " + std::to_string(o.seed.value_or(0));
  return s;
}

// Small integers as floats: every sum below 2^24 is exact, in any order.
inline std::vector<float> small_ints(size_t n, uint64_t seed, int lo = -8, int hi = 8) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = float(lo + int(rng.below(uint64_t(hi - lo + 1))));
  return v;
}

inline uint32_t float_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// `launch` must throw lt::Error whose message contains every one of `parts`.
inline void expect_launch_error(const std::function<void()>& launch, const std::vector<std::string>& parts) {
  try {
    launch();
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& part : parts)
      EXPECT_NE(message.find(part), std::string::npos) << "missing '" << part << "' in: " << message;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected lt::Error, got another exception: " << e.what();
    return;
  }
  ADD_FAILURE() << "expected lt::Error, the launch succeeded";
}

}  // namespace lt::cuda_sim::testing
