// ops/embedding.h — token embedding lookup.
#pragma once

#include <cstdint>
#include <vector>

namespace lt {

// out[N, C] = table[ids[n], :]. ids are checked against V (an id out of range is an error naming it).
void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C, int64_t V);

// dtable[V, C] += scatter of dout[N, C] by ids (accumulated; deterministic order): embedding_grad_rows then
// embedding_add_rows below.
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

// The backward in the streamed step's two halves (exec/step_schedule.h): on the device, each present id's
// gradient row — rows[i, :] for id present[i] is its one token's dout row as is, or its tokens' rows summed in f64
// in token order and rounded once — then, on the host, those rows added into the table. embedding_backward is the
// two in turn, so a step that downloads P rows instead of dx0's N gives its bits. start [P + 1] and order are
// group_tokens_by_id's (on the device under the CUDA kernels), or a run of its groups: start + i0 with the whole
// order (id i's tokens are order[start[i] .. start[i+1]), rows of dout [N, C]); rows [P, C] written.
void embedding_grad_rows(float* rows, const float* dout, const int32_t* start, const int32_t* order, int64_t P,
                         int64_t C);
// dtable[present[i], :] += rows[i, :], restricted to the table's elements [first, last) (row-major [V, C]) — a
// data-parallel owner of part of the table adds every rank's rows into its part (dist/data_parallel.h); the
// whole table is [0, V·C).
void embedding_add_rows(float* dtable, const float* rows, const int32_t* present, int64_t P, int64_t C,
                        int64_t first, int64_t last);

}  // namespace lt
