// cuda/kernels.cpp — host-side sizes shared by both kernel builds.
#include "cuda/kernels.h"

#include <algorithm>

#include "core/error.h"
#include "cuda/scratch.h"
#include "ops/rmsnorm.h"

namespace lt::cuda {

size_t rmsnorm_backward_workspace_bytes(int64_t rows, int64_t C) {
  if (rows <= 0 || C <= 0) return 0;
  const int64_t chunk_rows = rmsnorm_dweight_chunk_rows(rows);
  return size_t((rows + chunk_rows - 1) / chunk_rows) * size_t(C) * sizeof(double);
}

int64_t short_conv_dweight_chunk_tokens(int64_t N) { return std::max<int64_t>(32, (N + 63) / 64); }
int64_t delta_gates_param_chunk_tokens(int64_t N) { return std::max<int64_t>(256, (N + 63) / 64); }

size_t short_conv_backward_workspace_bytes(int64_t N, int64_t Cc, int64_t K) {
  if (N <= 0 || Cc <= 0 || K <= 0) return 0;
  const int64_t chunk = short_conv_dweight_chunk_tokens(N);
  return size_t((N + chunk - 1) / chunk) * size_t(K) * size_t(Cc) * sizeof(double);
}

size_t delta_gates_backward_workspace_bytes(int64_t N, int64_t Hv) {
  if (N <= 0 || Hv <= 0) return 0;
  const int64_t chunk = delta_gates_param_chunk_tokens(N);
  return size_t((N + chunk - 1) / chunk) * 2 * size_t(Hv) * sizeof(double);
}

size_t attention_backward_workspace_bytes(AttentionShape s) {
  if (attention_on_tensor_cores(s.D)) return AttentionMmaWorkspace::carve(nullptr, s).bytes;
  return size_t(s.B) * size_t(s.Hq) * size_t(s.T) * sizeof(float);
}

ScopedSetting<int64_t>& attention_partial_budget() {
  static ScopedSetting<int64_t> budget{kAttentionPartialBytes};
  return budget;
}

ScopedSetting<int>& attention_forward_warp_rows_setting() {
  static ScopedSetting<int> rows{kAttentionForwardWarpRows};
  return rows;
}

int64_t attention_partial_rows(AttentionShape s) {
  const int64_t row_bytes = 2 * (s.Hq / s.Hkv) * s.T * s.Hkv * s.D * int64_t(sizeof(float));
  const int64_t rows = row_bytes > 0 ? attention_partial_bytes() / row_bytes : s.B;
  return std::clamp<int64_t>(rows, 1, std::max<int64_t>(s.B, 1));
}

AttentionMmaWorkspace AttentionMmaWorkspace::carve(void* base, AttentionShape s) {
  ScratchCarver c(base);
  AttentionMmaWorkspace w;
  w.Di = c.take<float>(s.B * s.Hq * s.T);
  w.dout = c.take<bf16_t>(s.B * s.T * s.Hq * s.D);
  if (s.Hq > s.Hkv) {
    w.partial_rows = attention_partial_rows(s);
    const int64_t partials = (s.Hq / s.Hkv) * w.partial_rows * s.T * s.Hkv * s.D;
    w.dk_part = c.take<float>(partials);
    w.dv_part = c.take<float>(partials);
  }
  w.bytes = c.bytes();
  return w;
}

void check_attention_shape(const char* op, AttentionShape s) {
  LT_CHECK(s.B >= 0 && s.T >= 0 && s.Hq > 0 && s.Hkv > 0 && s.Hq % s.Hkv == 0,
           "{}: bad shape B={} T={} Hq={} Hkv={} (Hq must be a multiple of Hkv)", op, s.B, s.T, s.Hq, s.Hkv);
  LT_CHECK(s.B <= 65535 && s.Hq <= 65535 && s.T < (int64_t(1) << 31),
           "{}: B={} and Hq={} must be at most 65535 (CUDA grid limits), T={} below 2^31", op, s.B, s.Hq, s.T);
  LT_CHECK(s.window >= 0, "{}: sliding window {} (0: none)", op, s.window);
}

DeltaMmaWorkspace DeltaMmaWorkspace::carve(void* base, const DeltaShape& s, int64_t rows) {
  ScratchCarver c(base);
  const int64_t tiles = (s.T + kDeltaChunk - 1) / kDeltaChunk, slots = rows * s.Hv;
  DeltaMmaWorkspace w;
  w.rows = rows;
  w.W = c.take<bf16_t>(slots * tiles * kDeltaChunk * s.dk);
  w.UV = c.take<bf16_t>(slots * tiles * kDeltaChunk * s.dv);
  w.states = c.take<bf16_t>(slots * tiles * s.dk * s.dv);
  w.gates = c.take<unsigned char>(slots * tiles * kDeltaTileGatesBytes);
  w.bytes = c.bytes();
  return w;
}

DeltaMmaBackwardWorkspace DeltaMmaBackwardWorkspace::carve(void* base, const DeltaShape& s, int64_t rows) {
  DeltaMmaBackwardWorkspace w;
  w.rows = rows;
  w.forward = DeltaMmaWorkspace::carve(base, s, rows);  // the forward's quantities of the same rows
  ScratchCarver c(base ? static_cast<char*>(base) + w.forward.bytes : nullptr);
  const int64_t tiles = (s.T + kDeltaChunk - 1) / kDeltaChunk, tile_slots = w.rows * s.Hv * tiles;
  w.dstates = c.take<bf16_t>(tile_slots * s.dk * s.dv);
  w.dVp = c.take<float>(tile_slots * kDeltaChunk * s.dv);
  w.dq_part = c.take<float>(tile_slots * kDeltaChunk * s.dk);
  w.dk_part = c.take<float>(tile_slots * kDeltaChunk * s.dk);
  w.dA = c.take<float>(tile_slots * kDeltaChunk * kDeltaChunk);
  w.dgam = c.take<float>(tile_slots * kDeltaChunk);
  w.bytes = w.forward.bytes + c.bytes();
  return w;
}

ScopedSetting<int64_t>& gated_delta_workspace_budget() {
  static ScopedSetting<int64_t> budget{kDeltaWorkspaceBytes};
  return budget;
}

namespace {
// As many of the batch's rows as take at most the budget at `row_bytes` each, at least one.
int64_t delta_rows_within_budget(const DeltaShape& s, int64_t row_bytes) {
  if (s.B == 0 || row_bytes == 0) return s.B;
  return std::clamp<int64_t>(gated_delta_workspace_budget().get() / row_bytes, 1, s.B);
}
}  // namespace

// A row's share: the workspace carved for one row.
int64_t gated_delta_forward_rows(const DeltaShape& s) {
  return delta_rows_within_budget(s, int64_t(DeltaMmaWorkspace::carve(nullptr, s, 1).bytes));
}
int64_t gated_delta_backward_rows(const DeltaShape& s) {
  return delta_rows_within_budget(s, int64_t(DeltaMmaBackwardWorkspace::carve(nullptr, s, 1).bytes));
}

size_t gated_delta_forward_workspace_bytes(const DeltaShape& s) {
  const size_t cuda_cores = size_t(s.B * s.Hv) * size_t(gated_delta_forward_block_floats(s)) * sizeof(float);
  if (!gated_delta_on_tensor_cores(s)) return cuda_cores;
  return std::max(cuda_cores, DeltaMmaWorkspace::carve(nullptr, s, gated_delta_forward_rows(s)).bytes);
}

size_t gated_delta_backward_workspace_bytes(const DeltaShape& s) {
  const size_t cuda_cores = size_t(s.B * s.Hk) * size_t(gated_delta_backward_block_floats(s)) * sizeof(float);
  if (!gated_delta_on_tensor_cores(s)) return cuda_cores;
  return std::max(cuda_cores, DeltaMmaBackwardWorkspace::carve(nullptr, s, gated_delta_backward_rows(s)).bytes);
}

void check_gated_delta_shape(const char* op, const DeltaShape& s) {
  LT_CHECK(s.B >= 0 && s.T >= 0 && s.Hk > 0 && s.Hv > 0 && s.Hv % s.Hk == 0 && s.dk > 0 && s.dv > 0,
           "{}: bad shape B={} T={} Hk={} Hv={} dk={} dv={} (value heads must be a multiple of key heads)", op, s.B,
           s.T, s.Hk, s.Hv, s.dk, s.dv);
  const int64_t tiles = (s.T + kDeltaChunk - 1) / kDeltaChunk;
  LT_CHECK(s.B * s.Hv * std::max<int64_t>(tiles, 1) < (int64_t(1) << 31),
           "{}: B·Hv·⌈T/64⌉ = {} blocks exceed the CUDA grid", op, s.B * s.Hv * tiles);
}

void check_attention_alignment(const char* op, std::initializer_list<const void*> tensors) {
  for (const void* p : tensors)
    LT_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0,
             "{}: the tensor-core attention kernels need 16-byte aligned tensors, got {}", op, p);
}

void throw_unsupported_head_dim(const char* op, int64_t D) {
  LT_FAIL("{}: head dimension {} is not supported by the CUDA attention kernels (1 to 256)", op, D);
}

}  // namespace lt::cuda
