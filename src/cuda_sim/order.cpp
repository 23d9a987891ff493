// The process-wide thread order: set_default_order's, else LT_CUDA_SIM_ORDER's, else forward.
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>

#include "core/error.h"
#include "cuda_sim/cuda_sim.h"

namespace lt::cuda_sim {
namespace {

std::mutex g_mutex;
std::optional<OrderSetting> g_set;  // set_default_order's
std::optional<OrderSetting> g_env;  // LT_CUDA_SIM_ORDER's, once read

}  // namespace

const char* order_name(Order order) {
  switch (order) {
    case Order::forward: return "forward";
    case Order::reverse: return "reverse";
    case Order::random: return "random";
    case Order::warps: return "warps";
  }
  return "?";
}

OrderSetting parse_order(const std::string& text) {
  if (text == "forward") return {Order::forward, 0};
  if (text == "reverse") return {Order::reverse, 0};
  if (text == "warps") return {Order::warps, 0};
  if (text == "random") return {Order::random, uint64_t(std::random_device{}()) << 32 | std::random_device{}()};
  const std::string prefix = "random:";
  if (text.size() > prefix.size() && text.compare(0, prefix.size(), prefix) == 0) {
    uint64_t seed = 0;
    const char* first = text.data() + prefix.size();
    const char* last = text.data() + text.size();
    auto [end, ec] = std::from_chars(first, last, seed);
    if (ec == std::errc() && end == last) return {Order::random, seed};
  }
  LT_FAIL("cuda-sim: thread order '{}' is not forward, reverse, warps, random or random:<seed> (a decimal uint64)", text);
}

OrderSetting default_order() {
  std::lock_guard lock(g_mutex);
  if (g_set) return *g_set;
  if (!g_env) {
    const char* text = std::getenv("LT_CUDA_SIM_ORDER");
    if (text == nullptr || *text == '\0') {
      g_env = OrderSetting{};
    } else {
      g_env = parse_order(text);
      // A drawn seed is useless unless it is seen: say it once, with how to repeat the run.
      if (std::string(text) == "random")
        std::fprintf(stderr, "cuda-sim: LT_CUDA_SIM_ORDER=random uses seed %llu (random:%llu repeats it)\n",
                     static_cast<unsigned long long>(g_env->seed), static_cast<unsigned long long>(g_env->seed));
    }
  }
  return *g_env;
}

void set_default_order(OrderSetting setting) {
  std::lock_guard lock(g_mutex);
  g_set = setting;
}

void clear_default_order() {
  std::lock_guard lock(g_mutex);
  g_set.reset();
}

}  // namespace lt::cuda_sim
