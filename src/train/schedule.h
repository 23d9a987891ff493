// train/schedule.h — learning-rate schedules as transformers computes them (get_*_schedule_with_warmup):
// the rate for optimizer step k (0-based) is lr · λ(k), with a linear warmup λ = k / warmup for k < warmup,
// then linear decay to 0 at `total`, a half cosine to 0, or constant.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "core/error.h"

namespace lt {

struct LrSchedule {
  std::string type = "linear";  // linear | cosine | constant
  double lr = 0;
  int64_t warmup = 0;
  int64_t total = 1;

  double at(int64_t k) const {
    if (k < warmup) return lr * double(k) / double(std::max<int64_t>(1, warmup));
    if (type == "constant") return lr;
    double progress = double(k - warmup) / double(std::max<int64_t>(1, total - warmup));
    if (type == "linear") return lr * std::max(0.0, 1.0 - progress);
    if (type == "cosine") return lr * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * progress)));
    LT_FAIL("unknown lr_scheduler_type '{}' (expected linear, cosine or constant)", type);
  }
};

}  // namespace lt
