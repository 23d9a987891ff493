// ops/embedding.h — token embedding lookup.
#pragma once

#include <cstdint>
#include <vector>

namespace lt {

// out[N, C] = table[ids[n], :]. ids are checked against V (an id out of range is an error naming it).
void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C, int64_t V);

// dtable[V, C] += scatter of dout[N, C] by ids (accumulated; deterministic order).
void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t N, int64_t C, int64_t V);

// Token positions grouped by id, the backward's deterministic order (a stable counting sort): the ids
// present, ascending, and for present[i] its positions order[start[i] .. start[i+1]), ascending. int32 so a
// GPU reads it as is (N < 2^31 is checked). Every id is checked against V.
struct TokenGroups {
  std::vector<int32_t> present;  // [P]
  std::vector<int32_t> start;    // [P + 1]
  std::vector<int32_t> order;    // [N]
};
TokenGroups group_tokens_by_id(const int32_t* ids, int64_t N, int64_t V);

// embedding_backward restricted to the table's elements [first, last) (row-major [V, C]): each of them receives
// exactly what embedding_backward adds to it, the rest are untouched. A data-parallel owner of part of the
// table replays every rank's scatter into its part (dist/data_parallel.h).
void embedding_backward_range(float* dtable, const float* dout, const TokenGroups& groups, int64_t C, int64_t first,
                              int64_t last);

}  // namespace lt
