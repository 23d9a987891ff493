// model/carver.h — sub-buffers cut one after another from one caller-owned f32 buffer (the block's working copy
// and scratch, model/block.cpp; a sparse layer's routing and scratch, model/moe_ffn.cpp). Every sub-buffer starts
// 64-byte aligned (16 floats) so vector loads never straddle; a null base only counts the floats needed.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lt {

struct Carver {
  float* base;
  size_t used = 0;
  float* take(int64_t n) {
    float* p = base ? base + used : nullptr;
    used += (size_t(n) + 15) / 16 * 16;
    return p;
  }
  // n elements of a 4- or 8-byte type (expert ids, row indices, offsets) in float slots.
  template <class T>
  T* take_as(int64_t n) {
    static_assert(sizeof(T) % sizeof(float) == 0, "carve whole floats");
    return reinterpret_cast<T*>(take(n * int64_t(sizeof(T) / sizeof(float))));
  }
};

}  // namespace lt
