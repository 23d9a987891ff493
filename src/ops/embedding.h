// ops/embedding.h — token embedding lookup.
#pragma once

#include <cstdint>

namespace lt {

// out[N, C] = table[ids[n], :]. ids are checked against V (an id out of range is an error naming it).
void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C, int64_t V);

// dtable[V, C] += scatter of dout[N, C] by ids (accumulated; deterministic order).
void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t N, int64_t C, int64_t V);

}  // namespace lt
