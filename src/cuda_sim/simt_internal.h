// cuda_sim/simt_internal.h — the scheduler's per-thread state (simt.cpp) and the pure rules of the
// synchronisation points (collectives.cpp): when two arrivals meet, what each thread gets back, and how a
// point is described in errors. Not for kernel sources.
#pragma once

#include <boost/context/fiber.hpp>

#include <cstdint>
#include <string>

#include "cuda_sim/cuda_sim.h"

namespace lt::cuda_sim::detail {

enum class ThreadState : uint8_t { ready, waiting, exited };

// What a waiting thread brought to its synchronisation point.
struct Arrival {
  Collective kind = Collective::syncthreads;
  unsigned mask = 0;     // warp collectives: the lanes named; block barriers: ~0u
  int value_bytes = 0;   // shuffles: 4 or 8
  int arg = 0;           // shuffles: srcLane / delta / laneMask
  int width = 0;         // shuffles: the segment width
  uint64_t value = 0;    // shuffles: the value's bits; votes and _count/_and/_or: the predicate (0/1)
  const char* file = "";
  uint32_t line = 0, column = 0;
};

// One emulated thread. Lives for the whole launch; its fiber is made afresh for each block.
struct ThreadCtx {
  uint3 idx{0, 0, 0};
  unsigned linear = 0;  // x + y * block.x + z * block.x * block.y; lane = linear % 32, warp = linear / 32
  ThreadState state = ThreadState::ready;
  bool started = false;  // its fiber exists (made at the first resume of a block)
  bool gone = false;     // had exited when the current phase began (what __activemask leaves out)
  Arrival at;            // valid while waiting
  uint64_t result = 0;   // the point's result for this thread, set when the point completes
  boost::context::fiber self;   // the suspended thread (empty while it runs and once it has exited)
  boost::context::fiber sched;  // while it runs: the scheduler it switches back to
  char* stack_bottom = nullptr;  // its stack (lowest address)
  size_t stack_size = 0;
  void* asan_fake_stack = nullptr;  // AddressSanitizer's fiber annotations
};

inline bool is_warp_collective(Collective kind) { return kind >= Collective::syncwarp; }
inline bool is_shuffle(Collective kind) { return kind >= Collective::shfl_idx && kind <= Collective::shfl_xor; }

// The same synchronisation point: intrinsic, mask, width, value size and call site.
bool same_point(const Arrival& a, const Arrival& b);
const char* collective_name(Collective kind);
// "__shfl_down_sync(mask 0x000000ff, width 8) at test_simt.cpp:120"
std::string describe(const Arrival& a);
std::string format_index(uint3 v);  // "(3,0,1)"

// The lane whose value `lane` receives from a shuffle, per PTX's shfl.sync (the CUDA header passes
// c = ((32 - width) << 8) | 0x1f, or (32 - width) << 8 for up): idx reads srcLane modulo width inside the
// caller's segment; up/down/xor that leave the segment read the caller's own value (xor may read an
// earlier segment, as the programming guide says).
unsigned shuffle_source(Collective kind, unsigned lane, int arg, int width);

// Completes a warp collective: every lane in `mask` of the warp starting at `warp` has arrived at the same
// point. Sets each lane's result. A shuffle from a lane outside the mask is undefined in CUDA; the
// emulation returns all bits set (NaN for float/double, -1, or the type's maximum) so a test notices.
void resolve_warp(ThreadCtx* warp, unsigned mask);
// Completes a block barrier that all `n` threads reached (results of _count/_and/_or).
void resolve_block(ThreadCtx* threads, unsigned n);

}  // namespace lt::cuda_sim::detail
