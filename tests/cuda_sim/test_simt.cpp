// cuda-sim: block barriers, static and dynamic shared memory, the index built-ins over 1D/2D/3D grids,
// atomics across blocks, thread orders (a kernel missing a barrier goes wrong; the same kernel with it is
// right in every order), options and the process-wide order. Kernels are written as CUDA sources.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "cuda_sim/cuda_sim.h"
#include "cuda_sim_testing.h"

namespace lt::cuda_sim {
namespace {

using testing::describe;
using testing::float_bits;
using testing::orders;
using testing::small_ints;

// ---- kernels ----

// One float per thread summed over the block by a tree in static shared memory; any block size <= 1024.
__global__ void block_sum(const float* __restrict__ x, float* __restrict__ out, int n) {
  __shared__ float s[1024];
  const unsigned t = threadIdx.x;
  const unsigned i = blockIdx.x * blockDim.x + t;
  s[t] = i < unsigned(n) ? x[i] : 0.0f;
  __syncthreads();
  unsigned half = 1;
  while (half < blockDim.x) half <<= 1;
  for (half >>= 1; half > 0; half >>= 1) {
    if (t < half && t + half < blockDim.x) s[t] += s[t + half];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = s[0];
}

// Every thread writes what it sees of the built-ins at its global (x, y, z) position.
struct Seen {
  unsigned block[3], thread[3], block_dim[3], grid_dim[3];
};
__global__ void record_indices(Seen* out) {
  const unsigned gx = blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned gy = blockIdx.y * blockDim.y + threadIdx.y;
  const unsigned gz = blockIdx.z * blockDim.z + threadIdx.z;
  const unsigned width = gridDim.x * blockDim.x, height = gridDim.y * blockDim.y;
  Seen& s = out[(size_t(gz) * height + gy) * width + gx];
  s = Seen{{blockIdx.x, blockIdx.y, blockIdx.z},
           {threadIdx.x, threadIdx.y, threadIdx.z},
           {blockDim.x, blockDim.y, blockDim.z},
           {gridDim.x, gridDim.y, gridDim.z}};
}

// out[t] = in[(t + 1) % n] through shared memory: right only with the barrier between write and read.
__global__ void rotate_through_shared(const int* in, int* out, int with_barrier) {
  __shared__ int s[256];
  const unsigned t = threadIdx.x;
  s[t] = in[t];
  if (with_barrier) __syncthreads();
  out[t] = s[(t + 1) % blockDim.x];
}

// out[t] = in[(t + 32) % n] through shared memory, the warp synchronising with itself first: every thread has
// written before any reads in the lockstep orders, so only the warp-by-warp order shows the missing barrier.
__global__ void swap_warps_through_shared(const int* in, int* out, int with_barrier) {
  __shared__ int s[256];
  const unsigned t = threadIdx.x;
  s[t] = in[t];
  __syncwarp();
  if (with_barrier) __syncthreads();
  out[t] = s[(t + 32) % blockDim.x];
}

// Reverses each block's slice through dynamic shared memory; each thread moves `per_thread` floats.
__global__ void reverse_in_dynamic_shared(const float* in, float* out, int per_thread) {
  float* s = LT_DYNAMIC_SHARED(float);
  const unsigned n = blockDim.x * unsigned(per_thread);
  const float* src = in + size_t(blockIdx.x) * n;
  for (unsigned k = threadIdx.x; k < n; k += blockDim.x) s[k] = src[k];
  __syncthreads();
  float* dst = out + size_t(blockIdx.x) * n;
  for (unsigned k = threadIdx.x; k < n; k += blockDim.x) dst[k] = s[n - 1 - k];
}

// Two arrays of different types carved out of one dynamic allocation, as kernels do.
__global__ void split_dynamic_shared(const double* in, double* out, int* counts) {
  double* values = LT_DYNAMIC_SHARED(double);
  int* hits = reinterpret_cast<int*>(values + blockDim.x);
  values[threadIdx.x] = in[threadIdx.x];
  hits[threadIdx.x] = int(threadIdx.x) * 3;
  __syncthreads();
  const unsigned other = blockDim.x - 1 - threadIdx.x;
  out[threadIdx.x] = values[other];
  counts[threadIdx.x] = hits[other];
}

// What a block's dynamic shared memory holds before anyone writes it.
__global__ void read_fresh_dynamic_shared(unsigned* out) {
  out[threadIdx.x] = LT_DYNAMIC_SHARED(unsigned)[threadIdx.x];
}

__global__ void atomic_sums(const int* x, int n, int* i_sum, unsigned* u_sum, unsigned long long* ull_sum,
                            float* f_sum, double* d_sum, int* i_down, unsigned* u_down) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= unsigned(n)) return;
  atomicAdd(i_sum, x[i]);
  atomicAdd(u_sum, unsigned(x[i] + 100));
  atomicAdd(ull_sum, (unsigned long long)(x[i] + 100) << 33);
  atomicAdd(f_sum, float(x[i]));
  atomicAdd(d_sum, double(x[i]) * 0.5);
  atomicSub(i_down, x[i]);
  atomicSub(u_down, 1u);
}

__global__ void atomic_extremes(const int* x, int n, int* i_max, int* i_min, unsigned* u_max, unsigned* u_min) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= unsigned(n)) return;
  atomicMax(i_max, x[i]);
  atomicMin(i_min, x[i]);
  atomicMax(u_max, unsigned(x[i] + 1000));
  atomicMin(u_min, unsigned(x[i] + 1000));
}

// An add built from atomicCAS (the classic loop), and atomicExch handing one slot from thread to thread.
__global__ void atomic_cas_and_exch(int* cas_sum, unsigned long long* cas_ull, unsigned* slot, unsigned* previous,
                                    float* fslot, float* fprevious) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  int old = *cas_sum, assumed;
  do {
    assumed = old;
    old = atomicCAS(cas_sum, assumed, assumed + int(i));
  } while (old != assumed);
  unsigned long long o = *cas_ull, a;
  do {
    a = o;
    o = atomicCAS(cas_ull, a, a + (1ull << 40));
  } while (o != a);
  previous[i] = atomicExch(slot, i + 1);
  fprevious[i] = atomicExch(fslot, float(i + 1));
}

// A histogram in shared memory (atomics on shared), flushed to global memory with atomics.
__global__ void shared_histogram(const int* x, int n, unsigned* histogram) {
  __shared__ unsigned bins[16];
  if (threadIdx.x < 16) bins[threadIdx.x] = 0;
  __syncthreads();
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < unsigned(n); i += gridDim.x * blockDim.x)
    atomicAdd(&bins[x[i] & 15], 1u);
  __syncthreads();
  if (threadIdx.x < 16) atomicAdd(&histogram[threadIdx.x], bins[threadIdx.x]);
}

__global__ void barrier_votes(const int* x, int* count, int* all, int* any) {
  const unsigned t = threadIdx.x;
  const int c = __syncthreads_count(x[t] > 0);
  const int a = __syncthreads_and(x[t] > 0);
  const int o = __syncthreads_or(x[t] > 0);
  count[t] = c;
  all[t] = a;
  any[t] = o;
}

// A 192 KiB local array: needs a bigger fiber stack than the default.
__global__ void big_stack_frame(unsigned* out) {
  volatile unsigned local[48 * 1024];
  for (unsigned k = 0; k < 48 * 1024; ++k) local[k] = k + threadIdx.x;
  __syncthreads();
  unsigned s = 0;
  for (unsigned k = 0; k < 48 * 1024; k += 1024) s += local[k];
  out[threadIdx.x] = s;
}

__global__ void no_arguments() {}

// ---- tests ----

TEST(Dim3, HasCudaDefaults) {
  const dim3 a, b(7), c(7, 5);
  EXPECT_EQ(a.x, 1u);
  EXPECT_EQ(a.y, 1u);
  EXPECT_EQ(a.z, 1u);
  EXPECT_EQ(b.x, 7u);
  EXPECT_EQ(b.y, 1u);
  EXPECT_EQ(c.y, 5u);
  EXPECT_EQ(c.z, 1u);
  EXPECT_EQ(warpSize, 32);
  LT_LAUNCH(no_arguments, 3, 5, 0, 0);  // no kernel arguments at all
}

TEST(Barriers, BlockSumIsExactForOddBlockSizesAndEveryOrder) {
  // Integer-valued floats: every partial sum is exact, so the tree's result must equal the plain sum bit
  // for bit whatever the order of additions.
  for (unsigned block : {97u, 33u, 1u, 1024u, 32u, 255u}) {
    for (int n : {1, 96, 1000, 5000}) {
      const std::vector<float> x = small_ints(size_t(n), uint64_t(block) * 7919 + uint64_t(n));
      const unsigned blocks = (unsigned(n) + block - 1) / block;
      for (const Options& o : orders(2)) {
        SCOPED_TRACE(describe(o) + ", block " + std::to_string(block) + ", n " + std::to_string(n));
        std::vector<float> out(blocks, -12345.0f);
        launch(o, block_sum, dim3(blocks), dim3(block), 0, x.data(), out.data(), n);
        for (unsigned b = 0; b < blocks; ++b) {
          float expect = 0;
          for (unsigned i = b * block; i < std::min<unsigned>((b + 1) * block, unsigned(n)); ++i) expect += x[i];
          ASSERT_EQ(float_bits(out[b]), float_bits(expect)) << "block " << b;
        }
      }
    }
  }
}

TEST(Indices, TwoAndThreeDimensionalGridsMapEveryThread) {
  const dim3 shapes[][2] = {{dim3(3, 2), dim3(5, 4)},        // 2D grid, 2D block
                            {dim3(2, 3, 2), dim3(4, 3, 5)},  // 3D grid, 3D block
                            {dim3(1, 1, 3), dim3(7, 1, 2)},
                            {dim3(4), dim3(3, 3, 3)}};
  for (const auto& shape : shapes) {
    const dim3 grid = shape[0], block = shape[1];
    SCOPED_TRACE("grid " + std::to_string(grid.x) + "x" + std::to_string(grid.y) + "x" + std::to_string(grid.z) +
                 " block " + std::to_string(block.x) + "x" + std::to_string(block.y) + "x" + std::to_string(block.z));
    const unsigned W = grid.x * block.x, H = grid.y * block.y, D = grid.z * block.z;
    std::vector<Seen> out(size_t(W) * H * D);
    std::memset(out.data(), 0xee, out.size() * sizeof(Seen));
    LT_LAUNCH(record_indices, grid, block, 0, 0, out.data());
    for (unsigned z = 0; z < D; ++z)
      for (unsigned y = 0; y < H; ++y)
        for (unsigned x = 0; x < W; ++x) {
          const Seen& s = out[(size_t(z) * H + y) * W + x];
          const unsigned want_block[3] = {x / block.x, y / block.y, z / block.z};
          const unsigned want_thread[3] = {x % block.x, y % block.y, z % block.z};
          const unsigned want_bdim[3] = {block.x, block.y, block.z}, want_gdim[3] = {grid.x, grid.y, grid.z};
          for (int d = 0; d < 3; ++d) {
            ASSERT_EQ(s.block[d], want_block[d]) << "at " << x << "," << y << "," << z << " dim " << d;
            ASSERT_EQ(s.thread[d], want_thread[d]) << "at " << x << "," << y << "," << z << " dim " << d;
            ASSERT_EQ(s.block_dim[d], want_bdim[d]);
            ASSERT_EQ(s.grid_dim[d], want_gdim[d]);
          }
        }
  }
}

TEST(Barriers, SyncthreadsCountAndOr) {
  for (int pattern = 0; pattern < 3; ++pattern) {
    const unsigned n = 77;
    std::vector<int> x(n);
    Rng rng(uint64_t(pattern) + 40);
    for (auto& v : x) v = pattern == 0 ? int(rng.below(3)) - 1 : pattern == 1 ? 1 : 0;
    const int count = int(std::count_if(x.begin(), x.end(), [](int v) { return v > 0; }));
    for (const Options& o : orders(2)) {
      SCOPED_TRACE(describe(o) + ", pattern " + std::to_string(pattern));
      std::vector<int> c(n, -1), a(n, -1), any(n, -1);
      launch(o, barrier_votes, 1, n, 0, x.data(), c.data(), a.data(), any.data());
      for (unsigned t = 0; t < n; ++t) {
        ASSERT_EQ(c[t], count);
        ASSERT_EQ(a[t], count == int(n) ? 1 : 0);
        ASSERT_EQ(any[t], count > 0 ? 1 : 0);
      }
    }
  }
}

TEST(Order, MissingBarrierGoesWrongWhileTheBarrierIsRightInEveryOrder) {
  const unsigned n = 64;
  uint64_t seed = 100;
  auto run = [&](const Options& o, int with_barrier) {
    // Fresh values every run, so what a previous launch left in shared memory cannot pass for the answer.
    std::vector<int> in(n), out(n, -1);
    Rng rng(seed++);
    for (auto& v : in) v = int(rng.below(1000000)) + 1;
    launch(o, rotate_through_shared, 1, n, 0, in.data(), out.data(), with_barrier);
    for (unsigned t = 0; t < n; ++t)
      if (out[t] != in[(t + 1) % n]) return false;
    return true;
  };
  for (const Options& o : orders(20)) {
    SCOPED_TRACE(describe(o));
    EXPECT_TRUE(run(o, 1));
  }
  EXPECT_FALSE(run(Options{.order = Order::reverse}, 0)) << "reverse order hides the missing barrier";
  int wrong = 0;
  for (uint64_t s = 1; s <= 20; ++s) wrong += !run(Options{.order = Order::random, .seed = s}, 0);
  EXPECT_GT(wrong, 0) << "no random seed in 1..20 exposed the missing barrier";
}

TEST(Order, WarpByWarpShowsAWarpRunningAheadOfAMissingBarrier) {
  const unsigned n = 64;
  int first = 7000;
  auto run = [&](const Options& o, int with_barrier) {
    // Fresh values every run: static shared memory keeps what the previous launch left.
    std::vector<int> in(n), out(n, -1);
    std::iota(in.begin(), in.end(), first);
    first += int(n);
    launch(o, swap_warps_through_shared, 1, n, 0, in.data(), out.data(), with_barrier);
    for (unsigned t = 0; t < n; ++t)
      if (out[t] != in[(t + 32) % n]) return false;
    return true;
  };
  for (const Options& o : orders(5)) {
    SCOPED_TRACE(describe(o));
    EXPECT_TRUE(run(o, 1));
  }
  EXPECT_TRUE(run(Options{.order = Order::forward}, 0)) << "lockstep forward order now shows it: update the comment";
  EXPECT_FALSE(run(Options{.order = Order::warps}, 0)) << "warp-by-warp order hides the missing barrier";
}

TEST(Order, ProcessDefaultAppliesToLtLaunch) {
  struct Reset {
    ~Reset() { clear_default_order(); }
  } reset;
  set_default_order(OrderSetting{Order::reverse, 0});
  EXPECT_EQ(default_order().order, Order::reverse);
  const unsigned n = 64;
  std::vector<int> in(n), out(n, -1);
  std::iota(in.begin(), in.end(), 1000);
  LT_LAUNCH(rotate_through_shared, 1, n, 0, 0, in.data(), out.data(), 0);
  bool right = true;
  for (unsigned t = 0; t < n; ++t) right = right && out[t] == in[(t + 1) % n];
  EXPECT_FALSE(right) << "LT_LAUNCH did not run in the process default's reverse order";
}

TEST(Order, ParsesTheEnvironmentSyntax) {
  EXPECT_EQ(parse_order("forward").order, Order::forward);
  EXPECT_EQ(parse_order("reverse").order, Order::reverse);
  EXPECT_EQ(parse_order("warps").order, Order::warps);
  const OrderSetting r = parse_order("random:18446744073709551615");
  EXPECT_EQ(r.order, Order::random);
  EXPECT_EQ(r.seed, 18446744073709551615ull);
  EXPECT_EQ(parse_order("random").order, Order::random);
  for (const char* bad : {"", "Random", "random:", "random:12x", "random:-1", "sideways"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(parse_order(bad), Error);
  }
}

TEST(DynamicShared, ReversesThroughSeveralSizes) {
  // 4 B .. 48 KiB (the device's default limit) .. 200 KiB (needs the opt-in there).
  const std::pair<unsigned, int> cases[] = {{1, 1}, {128, 1}, {97, 3}, {1024, 12}, {256, 200}};
  for (auto [block, per_thread] : cases) {
    const size_t bytes = size_t(block) * unsigned(per_thread) * sizeof(float);
    const unsigned blocks = 3;
    const std::vector<float> in = small_ints(size_t(blocks) * block * unsigned(per_thread), bytes, -1000, 1000);
    for (const Options& o : orders(1)) {
      SCOPED_TRACE(describe(o) + ", " + std::to_string(bytes) + " bytes");
      std::vector<float> out(in.size(), -1.0f);
      launch(o, reverse_in_dynamic_shared, blocks, block, bytes, in.data(), out.data(), per_thread);
      const size_t n = size_t(block) * unsigned(per_thread);
      for (size_t b = 0; b < blocks; ++b)
        for (size_t k = 0; k < n; ++k) ASSERT_EQ(out[b * n + k], in[b * n + n - 1 - k]) << "block " << b << " k " << k;
    }
  }
}

TEST(DynamicShared, TwoTypesInOneAllocationAndFreshContentsArePoisoned) {
  const unsigned n = 40;
  std::vector<double> in(n), out(n);
  std::vector<int> counts(n, -1);
  for (unsigned i = 0; i < n; ++i) in[i] = 1.0 / (i + 1);
  LT_LAUNCH(split_dynamic_shared, 1, n, n * (sizeof(double) + sizeof(int)), 0, in.data(), out.data(), counts.data());
  for (unsigned i = 0; i < n; ++i) {
    ASSERT_EQ(out[i], in[n - 1 - i]);
    ASSERT_EQ(counts[i], int(n - 1 - i) * 3);
  }
  // Each block starts from all-ones bytes (NaN as float), not from zeros or the previous block's data.
  std::vector<unsigned> fresh(64, 0);
  LT_LAUNCH(read_fresh_dynamic_shared, 1, 64, 64 * sizeof(unsigned), 0, fresh.data());
  for (unsigned v : fresh) ASSERT_EQ(v, 0xffffffffu);
}

TEST(Atomics, SumsAcrossBlocksAreExact) {
  const int n = 10007;
  std::vector<int> x(static_cast<size_t>(n));
  Rng rng(5);
  for (auto& v : x) v = int(rng.below(201)) - 100;
  const long long sum = std::accumulate(x.begin(), x.end(), 0LL);
  for (const Options& o : orders(2)) {
    SCOPED_TRACE(describe(o));
    int i_sum = 0, i_down = 1000;
    unsigned u_sum = 0, u_down = 50000;
    unsigned long long ull_sum = 0;
    float f_sum = 0;
    double d_sum = 0;
    launch(o, atomic_sums, (n + 255) / 256, 256, 0, x.data(), n, &i_sum, &u_sum, &ull_sum, &f_sum, &d_sum, &i_down,
           &u_down);
    EXPECT_EQ(i_sum, sum);
    EXPECT_EQ(u_sum, unsigned(sum + 100LL * n));
    EXPECT_EQ(ull_sum, (unsigned long long)(sum + 100LL * n) << 33);
    EXPECT_EQ(f_sum, float(sum));  // integers below 2^24: exact in any order
    EXPECT_EQ(d_sum, double(sum) * 0.5);
    EXPECT_EQ(i_down, 1000 - sum);
    EXPECT_EQ(u_down, 50000u - unsigned(n));
  }
}

TEST(Atomics, MaxMinCasExchAndSharedMemory) {
  const int n = 3001;
  std::vector<int> x(static_cast<size_t>(n));
  Rng rng(6);
  for (auto& v : x) v = int(rng.below(2001)) - 1000;
  int i_max = -5000, i_min = 5000;
  unsigned u_max = 0, u_min = ~0u;
  LT_LAUNCH(atomic_extremes, (n + 127) / 128, 128, 0, 0, x.data(), n, &i_max, &i_min, &u_max, &u_min);
  EXPECT_EQ(i_max, *std::max_element(x.begin(), x.end()));
  EXPECT_EQ(i_min, *std::min_element(x.begin(), x.end()));
  EXPECT_EQ(u_max, unsigned(i_max + 1000));
  EXPECT_EQ(u_min, unsigned(i_min + 1000));

  const unsigned threads = 4 * 96;
  int cas_sum = 0;
  unsigned long long cas_ull = 0;
  unsigned slot = 0;
  float fslot = 0;
  std::vector<unsigned> previous(threads);
  std::vector<float> fprevious(threads);
  LT_LAUNCH(atomic_cas_and_exch, 4, 96, 0, 0, &cas_sum, &cas_ull, &slot, previous.data(), &fslot, fprevious.data());
  EXPECT_EQ(cas_sum, int(threads * (threads - 1) / 2));
  EXPECT_EQ(cas_ull, (unsigned long long)threads << 40);
  // The exchanged values form one chain: the old values plus the final one are 0..threads exactly once.
  std::vector<unsigned> seen(previous);
  seen.push_back(slot);
  std::sort(seen.begin(), seen.end());
  for (unsigned k = 0; k <= threads; ++k) ASSERT_EQ(seen[k], k);
  std::vector<float> fseen(fprevious);
  fseen.push_back(fslot);
  std::sort(fseen.begin(), fseen.end());
  for (unsigned k = 0; k <= threads; ++k) ASSERT_EQ(fseen[k], float(k));

  std::vector<unsigned> histogram(16, 0), expect(16, 0);
  for (int v : x) ++expect[unsigned(v) & 15];
  LT_LAUNCH(shared_histogram, 5, 64, 0, 0, x.data(), n, histogram.data());
  EXPECT_EQ(histogram, expect);
}

TEST(Options, StackSizeIsConfigurable) {
  std::vector<unsigned> out(4, 0);
  launch(Options{.stack_bytes = 512 * 1024}, big_stack_frame, 2, 4, 0, out.data());
  for (unsigned t = 0; t < 4; ++t) {
    unsigned s = 0;
    for (unsigned k = 0; k < 48 * 1024; k += 1024) s += k + t;
    ASSERT_EQ(out[t], s);
  }
}

}  // namespace
}  // namespace lt::cuda_sim
