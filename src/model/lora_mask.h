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

// The token row of an adapter input's row n: row0 + n, or, for a sparse layer's grouped rows (an expert's tokens,
// model/moe_ffn.h), row0 + gather[n] / per_token — gather holds each row's assignment t·k + j, so the mask of an
// expert's input row is its token's, whatever the routing put before it.
LT_HD_INLINE int64_t lora_row(int64_t row0, const int32_t* gather, int64_t per_token, int64_t n) {
  return gather ? row0 + int64_t(gather[n]) / per_token : row0 + n;
}

}  // namespace lt
