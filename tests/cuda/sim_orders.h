// The thread orders every kernel test under cuda-sim runs in: a correct kernel gives the same results in
// forward, reverse, warp-by-warp and seeded random order.
#pragma once

#include <functional>
#include <string>

#include "cuda/kernel_testing.h"
#include "cuda_sim/cuda_sim.h"

namespace lt::cuda::testing {

// Runs `check` once per thread order (forward, reverse, warp by warp, two seeded random orders), each under a trace
// naming the order.
inline void for_each_order(const std::function<void()>& check) {
  using cuda_sim::Order;
  const cuda_sim::OrderSetting settings[] = {
      {Order::forward, 0}, {Order::reverse, 0}, {Order::warps, 0}, {Order::random, 11}, {Order::random, 12}};
  for (const auto& setting : settings) {
    SCOPED_TRACE(std::string("thread order ") + cuda_sim::order_name(setting.order) + " seed " +
                 std::to_string(setting.seed));
    cuda_sim::set_default_order(setting);
    check();
  }
  cuda_sim::clear_default_order();
}

}  // namespace lt::cuda::testing
