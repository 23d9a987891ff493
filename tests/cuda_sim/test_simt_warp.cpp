// cuda-sim warp collectives: the four shuffles for every width and 4- and 8-byte types against the CUDA
// programming guide's description (written here independently of the emulation's PTX formula), warp
// reductions with __shfl_xor_sync / __shfl_down_sync, broadcast, scans with __shfl_up_sync, partial last
// warps with the right masks, votes, __syncwarp and __activemask.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cuda_sim/cuda_sim.h"
#include "cuda_sim_testing.h"

namespace lt::cuda_sim {
namespace {

using testing::describe;
using testing::orders;

enum Kind : int { kIdx = 0, kUp = 1, kDown = 2, kXor = 3 };

// The lane whose value `lane` gets, as the guide words it: idx reads srcLane modulo width in the caller's
// group of `width` lanes; up/down read `delta` lanes away and keep their own value where that leaves the
// group; xor may read an earlier group but reads its own value where the target is in a later one.
int guide_source(Kind kind, int lane, int arg, int width) {
  const int group = lane / width * width, pos = lane % width;
  switch (kind) {
    case kIdx: return group + ((arg % width) + width) % width;
    case kUp: return pos >= arg ? lane - arg : lane;
    case kDown: return pos + arg < width ? lane + arg : lane;
    case kXor: {
      const int target = lane ^ arg;
      return target / width > lane / width ? lane : target;
    }
  }
  return -1;
}

// idx uses a different srcLane per lane (some negative, some past the width); the others one argument.
__host__ __device__ int idx_source_lane(int arg, unsigned lane) { return (arg * int(lane) + 7) % 45 - 6; }

template <class T>
__global__ void shuffle_all(int kind, int arg, int width, const T* in, T* out) {
  const unsigned t = threadIdx.x;
  const T v = in[t];
  T r{};
  switch (kind) {
    case kIdx: r = __shfl_sync(0xffffffffu, v, idx_source_lane(arg, t % 32), width); break;
    case kUp: r = __shfl_up_sync(0xffffffffu, v, unsigned(arg), width); break;
    case kDown: r = __shfl_down_sync(0xffffffffu, v, unsigned(arg), width); break;
    case kXor: r = __shfl_xor_sync(0xffffffffu, v, arg, width); break;
  }
  out[t] = r;
}

// The lanes of this thread's warp that exist: a block that is not a multiple of 32 ends in a partial warp.
__device__ unsigned warp_mask() {
  const unsigned base = threadIdx.x / 32 * 32;
  const unsigned present = blockDim.x - base < 32 ? blockDim.x - base : 32;
  return present == 32 ? 0xffffffffu : (1u << present) - 1;
}

// Warp sums: by xor butterfly (every lane gets the sum; needs a power-of-2 warp) and by shifting down
// (lane 0 gets it; any warp size: a lane adds only what comes from a lane that exists).
__global__ void warp_sums(const int* x, int* by_xor, int* by_down, int use_xor) {
  const unsigned t = threadIdx.x, lane = t % 32;
  const unsigned mask = warp_mask();
  const unsigned present = unsigned(__builtin_popcount(mask));
  const int v = x[t];
  if (use_xor) {
    int a = v;
    for (unsigned off = 16; off > 0; off >>= 1)
      if (off < present) a += __shfl_xor_sync(mask, a, int(off));
    by_xor[t] = a;
  }
  int b = v;
  for (unsigned off = 16; off > 0; off >>= 1) {
    const int o = __shfl_down_sync(mask, b, off);
    if (lane + off < present) b += o;
  }
  by_down[t] = b;
}

// Sums over groups of `width` lanes with the width argument.
__global__ void segment_sums(const int* x, int* out, int width) {
  int a = x[threadIdx.x];
  for (int off = width / 2; off > 0; off /= 2) a += __shfl_xor_sync(0xffffffffu, a, off, width);
  out[threadIdx.x] = a;
}

// Inclusive prefix sums over groups of `width` lanes (Hillis-Steele with __shfl_up_sync).
__global__ void segment_scan(const int* x, int* out, int width) {
  const unsigned pos = threadIdx.x % unsigned(width);
  int s = x[threadIdx.x];
  for (int off = 1; off < width; off *= 2) {
    const int o = __shfl_up_sync(0xffffffffu, s, unsigned(off), width);
    if (pos >= unsigned(off)) s += o;
  }
  out[threadIdx.x] = s;
}

__global__ void broadcast(const float* x, float* out, int src) {
  out[threadIdx.x] = __shfl_sync(warp_mask(), x[threadIdx.x], src);
}

__global__ void votes(const int* x, unsigned* ballot, int* any, int* all, unsigned* active) {
  const unsigned t = threadIdx.x, mask = warp_mask();
  ballot[t] = __ballot_sync(mask, x[t] > 0);
  any[t] = __any_sync(mask, x[t] > 0);
  all[t] = __all_sync(mask, x[t] > 0);
  active[t] = __activemask();
}

// Neighbours in a warp exchange through shared memory: right only because of the __syncwarp.
__global__ void swap_pairs_with_syncwarp(const int* x, int* out) {
  __shared__ int s[64];
  const unsigned t = threadIdx.x;
  s[t] = x[t];
  __syncwarp();
  out[t] = s[t ^ 1u];
}

template <class T>
std::vector<T> random_values(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<T> v(n);
  for (auto& x : v) {
    const uint64_t bits = rng.next_u64();
    std::memcpy(&x, &bits, sizeof(T));  // every bit random: 8-byte types must move both halves
  }
  return v;
}

template <class T>
void check_every_shuffle(uint64_t seed) {
  const unsigned n = 64;  // two warps
  const std::vector<T> in = random_values<T>(n, seed);
  const std::vector<std::pair<Kind, std::vector<int>>> cases = {
      {kIdx, {0, 1, 3, 5, 31, 37}}, {kUp, {0, 1, 2, 3, 7, 16, 31}}, {kDown, {0, 1, 2, 3, 7, 16, 31}},
      {kXor, {0, 1, 2, 4, 8, 12, 16, 31}}};
  for (int width : {1, 2, 4, 8, 16, 32}) {
    for (const auto& [kind, args] : cases) {
      for (int arg : args) {
        SCOPED_TRACE("kind " + std::to_string(kind) + " arg " + std::to_string(arg) + " width " +
                     std::to_string(width));
        std::vector<T> out(n);
        LT_LAUNCH(shuffle_all<T>, 1, n, 0, 0, kind, arg, width, in.data(), out.data());
        for (unsigned t = 0; t < n; ++t) {
          const int lane = int(t % 32);
          const int src_arg = kind == kIdx ? idx_source_lane(arg, t % 32) : arg;
          const unsigned src = t / 32 * 32 + unsigned(guide_source(kind, lane, src_arg, width));
          ASSERT_EQ(std::memcmp(&out[t], &in[src], sizeof(T)), 0) << "thread " << t << " expected lane " << src % 32;
        }
      }
    }
  }
}

TEST(Shuffles, EveryKindWidthAndTypeFollowsTheGuide) {
  check_every_shuffle<int>(1);
  check_every_shuffle<unsigned>(2);
  check_every_shuffle<float>(3);
  check_every_shuffle<long>(4);
  check_every_shuffle<long long>(5);
  check_every_shuffle<unsigned long long>(6);
  check_every_shuffle<double>(7);
}

TEST(Shuffles, WarpReductionsIncludingPartialLastWarps) {
  for (unsigned block : {32u, 40u, 64u, 104u, 50u, 7u, 1u}) {
    const unsigned last = block % 32 == 0 ? 32 : block % 32;
    const bool pow2_warps = (last & (last - 1)) == 0;
    std::vector<int> x(block);
    Rng rng(block);
    for (auto& v : x) v = int(rng.below(2001)) - 1000;
    for (const Options& o : orders(3)) {
      SCOPED_TRACE(describe(o) + ", block " + std::to_string(block));
      std::vector<int> by_xor(block, 0), by_down(block, 0);
      launch(o, warp_sums, 1, block, 0, x.data(), by_xor.data(), by_down.data(), int(pow2_warps));
      for (unsigned base = 0; base < block; base += 32) {
        int sum = 0;
        for (unsigned t = base; t < std::min(base + 32, block); ++t) sum += x[t];
        ASSERT_EQ(by_down[base], sum) << "warp " << base / 32;
        if (pow2_warps) {
          for (unsigned t = base; t < std::min(base + 32, block); ++t) ASSERT_EQ(by_xor[t], sum) << "thread " << t;
        }
      }
    }
  }
}

TEST(Shuffles, SegmentSumsAndScansWithWidth) {
  const unsigned n = 96;
  std::vector<int> x(n);
  Rng rng(9);
  for (auto& v : x) v = int(rng.below(100));
  for (int width : {8, 16, 32}) {
    SCOPED_TRACE("width " + std::to_string(width));
    std::vector<int> sums(n), scans(n);
    LT_LAUNCH(segment_sums, 1, n, 0, 0, x.data(), sums.data(), width);
    LT_LAUNCH(segment_scan, 1, n, 0, 0, x.data(), scans.data(), width);
    for (unsigned g = 0; g < n; g += unsigned(width)) {
      int total = 0, running = 0;
      for (unsigned t = g; t < g + unsigned(width); ++t) total += x[t];
      for (unsigned t = g; t < g + unsigned(width); ++t) {
        running += x[t];
        ASSERT_EQ(sums[t], total) << "thread " << t;
        ASSERT_EQ(scans[t], running) << "thread " << t;
      }
    }
  }
}

TEST(Shuffles, BroadcastFromOneLane) {
  const unsigned n = 40;  // lanes 0..31 and a partial warp of 8
  std::vector<float> x(n), out(n);
  for (unsigned t = 0; t < n; ++t) x[t] = float(t) * 1.5f;
  LT_LAUNCH(broadcast, 1, n, 0, 0, x.data(), out.data(), 5);
  for (unsigned t = 0; t < n; ++t) ASSERT_EQ(out[t], x[t / 32 * 32 + 5]) << "thread " << t;
}

TEST(Votes, BallotAnyAllAndActiveMaskMatchAPlainComputation) {
  const unsigned n = 40;
  for (int pattern = 0; pattern < 4; ++pattern) {
    std::vector<int> x(n);
    Rng rng(uint64_t(pattern) + 11);
    for (unsigned t = 0; t < n; ++t)
      x[t] = pattern == 0 ? int(rng.below(3)) - 1 : pattern == 1 ? 1 : pattern == 2 ? 0 : (t >= 32 ? 1 : -1);
    for (const Options& o : orders(2)) {
      SCOPED_TRACE(describe(o) + ", pattern " + std::to_string(pattern));
      std::vector<unsigned> ballot(n), active(n);
      std::vector<int> any(n), all(n);
      launch(o, votes, 1, n, 0, x.data(), ballot.data(), any.data(), all.data(), active.data());
      for (unsigned base = 0; base < n; base += 32) {
        const unsigned present = std::min(32u, n - base);
        const unsigned mask = present == 32 ? ~0u : (1u << present) - 1;
        unsigned expect = 0;
        for (unsigned l = 0; l < present; ++l)
          if (x[base + l] > 0) expect |= 1u << l;
        for (unsigned t = base; t < base + present; ++t) {
          ASSERT_EQ(ballot[t], expect) << "thread " << t;
          ASSERT_EQ(any[t], expect != 0 ? 1 : 0) << "thread " << t;
          ASSERT_EQ(all[t], expect == mask ? 1 : 0) << "thread " << t;
          ASSERT_EQ(active[t], mask) << "thread " << t;
        }
      }
    }
  }
}

TEST(Syncwarp, OrdersSharedMemoryInsideAWarp) {
  const unsigned n = 64;
  std::vector<int> x(n);
  for (unsigned t = 0; t < n; ++t) x[t] = int(t * 7 + 3);
  for (const Options& o : orders(5)) {
    SCOPED_TRACE(describe(o));
    std::vector<int> out(n, -1);
    launch(o, swap_pairs_with_syncwarp, 1, n, 0, x.data(), out.data());
    for (unsigned t = 0; t < n; ++t) ASSERT_EQ(out[t], x[t ^ 1u]) << "thread " << t;
  }
}

}  // namespace
}  // namespace lt::cuda_sim
