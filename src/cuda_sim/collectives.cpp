#include <fmt/format.h>

#include <cstring>
#include <string_view>

#include "cuda_sim/simt_internal.h"

namespace lt::cuda_sim::detail {

bool same_point(const Arrival& a, const Arrival& b) {
  return a.kind == b.kind && a.mask == b.mask && a.width == b.width && a.value_bytes == b.value_bytes &&
         a.line == b.line && a.column == b.column && (a.file == b.file || std::strcmp(a.file, b.file) == 0);
}

const char* collective_name(Collective kind) {
  switch (kind) {
    case Collective::syncthreads: return "__syncthreads";
    case Collective::syncthreads_count: return "__syncthreads_count";
    case Collective::syncthreads_and: return "__syncthreads_and";
    case Collective::syncthreads_or: return "__syncthreads_or";
    case Collective::syncwarp: return "__syncwarp";
    case Collective::shfl_idx: return "__shfl_sync";
    case Collective::shfl_up: return "__shfl_up_sync";
    case Collective::shfl_down: return "__shfl_down_sync";
    case Collective::shfl_xor: return "__shfl_xor_sync";
    case Collective::ballot: return "__ballot_sync";
    case Collective::any: return "__any_sync";
    case Collective::all: return "__all_sync";
  }
  return "?";
}

std::string describe(const Arrival& a) {
  std::string_view file = a.file;
  if (size_t slash = file.rfind('/'); slash != std::string_view::npos) file.remove_prefix(slash + 1);
  std::string args;
  if (is_shuffle(a.kind)) {
    args = fmt::format("(mask {:#010x}, width {})", a.mask, a.width);
  } else if (is_warp_collective(a.kind)) {
    args = fmt::format("(mask {:#010x})", a.mask);
  } else {
    args = "()";
  }
  return fmt::format("{}{} at {}:{}", collective_name(a.kind), args, file, a.line);
}

std::string format_index(uint3 v) { return fmt::format("({},{},{})", v.x, v.y, v.z); }

unsigned shuffle_source(Collective kind, unsigned lane, int arg, int width) {
  const unsigned segmask = unsigned(32 - width) & 31u;  // the segment's bits of a lane index
  const unsigned b = unsigned(arg) & 31u;               // the instruction reads 5 bits
  const unsigned min_lane = lane & segmask;
  const unsigned max_lane = kind == Collective::shfl_up ? min_lane : (min_lane | (31u & ~segmask));
  int j = int(lane);
  bool inside = true;
  switch (kind) {
    case Collective::shfl_up: j = int(lane) - int(b); inside = j >= int(max_lane); break;
    case Collective::shfl_down: j = int(lane + b); inside = j <= int(max_lane); break;
    case Collective::shfl_xor: j = int(lane ^ b); inside = j <= int(max_lane); break;
    case Collective::shfl_idx: j = int(min_lane | (b & ~segmask)); break;
    default: break;
  }
  return inside ? unsigned(j) : lane;
}

void resolve_warp(ThreadCtx* warp, unsigned mask) {
  const Arrival& first = warp[__builtin_ctz(mask)].at;
  if (is_shuffle(first.kind)) {
    const uint64_t poison = first.value_bytes == 8 ? ~uint64_t{0} : uint64_t{0xffffffffu};
    for (unsigned m = mask; m; m &= m - 1) {
      ThreadCtx& t = warp[__builtin_ctz(m)];
      unsigned src = shuffle_source(first.kind, t.linear % 32, t.at.arg, first.width);
      t.result = (mask >> src & 1u) ? warp[src].at.value : poison;
    }
    return;
  }
  unsigned ballot = 0;
  for (unsigned m = mask; m; m &= m - 1) {
    unsigned lane = unsigned(__builtin_ctz(m));
    if (warp[lane].at.value) ballot |= 1u << lane;
  }
  uint64_t result = 0;
  switch (first.kind) {
    case Collective::ballot: result = ballot; break;
    case Collective::any: result = ballot != 0; break;
    case Collective::all: result = ballot == mask; break;
    default: break;  // __syncwarp
  }
  for (unsigned m = mask; m; m &= m - 1) warp[__builtin_ctz(m)].result = result;
}

void resolve_block(ThreadCtx* threads, unsigned n) {
  unsigned count = 0;
  for (unsigned i = 0; i < n; ++i) count += threads[i].at.value != 0;
  uint64_t result = 0;
  switch (threads[0].at.kind) {
    case Collective::syncthreads_count: result = count; break;
    case Collective::syncthreads_and: result = count == n; break;
    case Collective::syncthreads_or: result = count != 0; break;
    default: break;  // __syncthreads
  }
  for (unsigned i = 0; i < n; ++i) threads[i].result = result;
}

}  // namespace lt::cuda_sim::detail
