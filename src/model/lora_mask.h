// model/lora_mask.h — LoRA dropout's keep decision (model/lora.h), one formula for the CPU block and the CUDA kernels
// (cuda/kernels/lora.cuh), so both draw the same mask: element `index` (token row · in + feature) of an adapter's
// input is kept when 24 bits of a 64-bit mix of (key, index) are at least p — no generator state, so a recompute,
// every plan and a resumed run draw it again.
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "core/rng.h"

namespace lt {

LT_HD_INLINE bool lora_keep(uint64_t key, uint64_t index, float p) {
  const uint64_t h = splitmix64(key ^ splitmix64(index));
  return float(double(h >> 40) * 0x1.0p-24) >= p;  // 24 random bits: u in [0, 1) exactly representable in f32
}

}  // namespace lt
