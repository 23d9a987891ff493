// cuda-sim errors: an exception in one emulated thread, divergent barriers, collectives whose mask names an
// exited, missing or elsewhere-waiting lane, invalid shuffles and launch configurations. Each is an
// lt::Error naming the kernel, block and thread; none hangs (ctest's TIMEOUT guards that); suspended
// threads are unwound (their destructors run); the next launch works.
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "cuda_sim/cuda_sim.h"
#include "cuda_sim_testing.h"

namespace lt::cuda_sim {
namespace {

using testing::expect_launch_error;

Options forward(const char* name) { return Options{.order = Order::forward, .name = name}; }

int g_destroyed = 0;
struct Guard {
  ~Guard() { ++g_destroyed; }
};

__global__ void throw_in_one_thread(unsigned bad_block, unsigned bad_thread) {
  Guard guard;
  if (blockIdx.x == bad_block && threadIdx.x == bad_thread) throw std::runtime_error("boom from the kernel");
  __syncthreads();
}

__global__ void throw_a_non_exception() {
  if (threadIdx.x == 2) throw 42;
}

__global__ void check_in_kernel(int n) {
  LT_CHECK(threadIdx.x < unsigned(n), "thread {} is past n = {}", threadIdx.x, n);
}

__global__ void early_return_before_barrier(int* out) {
  if (threadIdx.x >= 20) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void two_different_barriers() {
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    __syncthreads();
  }
}

__global__ void shuffle_after_exit(int* out) {
  if (threadIdx.x == 31) return;
  out[threadIdx.x] = __shfl_sync(0xffffffffu, int(threadIdx.x), 0);
}

__global__ void full_mask_on_partial_warp(int* out) {
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, int(threadIdx.x), 1);
}

__global__ void mask_without_own_lane(unsigned* out) { out[threadIdx.x] = __ballot_sync(0x1u, 1); }

__global__ void width_not_power_of_two(float* out) { out[threadIdx.x] = __shfl_sync(0xffffffffu, 1.0f, 0, 12); }

__global__ void lanes_at_different_collectives(int* out) {
  if (threadIdx.x < 16)
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
  else
    out[threadIdx.x] = int(__ballot_sync(0xffffffffu, 1));
}

__global__ void trivial(int* out) { out[blockIdx.x * blockDim.x + threadIdx.x] = int(threadIdx.x); }

__global__ void launches_inside(int* out) { launch(trivial, 1, 1, 0, out); }

TEST(Errors, ExceptionInOneThreadNamesKernelBlockThreadAndUnwindsTheOthers) {
  g_destroyed = 0;
  // The counts below follow from the order, so it is pinned (LT_CUDA_SIM_ORDER must not change them).
  expect_launch_error([] { launch(forward("throw_in_one_thread"), throw_in_one_thread, 2, 64, 0, 1u, 5u); },
                      {"kernel 'throw_in_one_thread'", "block (1,0,0)", "thread (5,0,0)", "boom from the kernel"});
  // Block 0 ran to the end (64); in block 1, threads 0..4 waited at the barrier and were unwound (5), thread 5
  // threw (1) and threads 6..63 never started.
  EXPECT_EQ(g_destroyed, 70);

  g_destroyed = 0;
  const Options reverse{.order = Order::reverse, .name = "rev"};
  expect_launch_error([&] { launch(reverse, throw_in_one_thread, 2, 64, 0, 1u, 5u); },
                      {"kernel 'rev'", "block (1,0,0)", "thread (5,0,0)", "boom", "[order reverse]"});
  EXPECT_EQ(g_destroyed, 59);  // block 1 first, threads 63..6 waiting, then 5 threw

  expect_launch_error([] { LT_LAUNCH(throw_a_non_exception, 1, 4, 0, 0); },
                      {"throw_a_non_exception", "thread (2,0,0)", "not a std::exception"});
  try {
    launch(forward("check_in_kernel"), check_in_kernel, 1, 8, 0, 3);  // threads 3..7 fail; forward: 3 first
    ADD_FAILURE() << "LT_CHECK in the kernel did not fail the launch";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("thread (3,0,0): thread 3 is past n = 3"), std::string::npos) << e.what();
    EXPECT_NE(e.where().find("test_simt_errors.cpp"), std::string::npos) << "the kernel's check site is kept: " << e.where();
  }
}

TEST(Errors, DivergentBarriersAreReportedNotHung) {
  std::vector<int> out(32, 0);
  expect_launch_error([&] { LT_LAUNCH(early_return_before_barrier, 1, 32, 0, 0, out.data()); },
                      {"kernel 'early_return_before_barrier'", "block (0,0,0)", "thread (0,0,0)",
                       "waits forever at __syncthreads()", "thread (20,0,0) has exited"});
  for (const Options& o : testing::orders(3)) {
    SCOPED_TRACE(testing::describe(o));
    expect_launch_error([&] { launch(o, early_return_before_barrier, 2, 32, 0, out.data()); },
                        {"__syncthreads()", "has exited"});
  }
  expect_launch_error([] { LT_LAUNCH(two_different_barriers, 1, 32, 0, 0); },
                      {"two_different_barriers", "thread (0,0,0)", "thread (16,0,0) waits at __syncthreads()",
                       "test_simt_errors.cpp"});
}

TEST(Errors, CollectivesWithAMaskNamingAnUnavailableLane) {
  std::vector<int> out(64, 0);
  expect_launch_error([&] { LT_LAUNCH(shuffle_after_exit, 1, 32, 0, 0, out.data()); },
                      {"shuffle_after_exit", "thread (0,0,0)", "__shfl_sync(mask 0xffffffff, width 32)",
                       "lane 31 (thread (31,0,0)), which has exited"});
  expect_launch_error([&] { LT_LAUNCH(full_mask_on_partial_warp, 1, 40, 0, 0, out.data()); },
                      {"thread (32,0,0)", "names lane 8, which does not exist (this warp has 8 lanes)"});
  expect_launch_error([&] { LT_LAUNCH(lanes_at_different_collectives, 1, 32, 0, 0, out.data()); },
                      {"__shfl_xor_sync", "which waits at __ballot_sync(mask 0xffffffff)"});
  std::vector<unsigned> u(32, 0);
  expect_launch_error([&] { launch(forward("mask_without_own_lane"), mask_without_own_lane, 1, 32, 0, u.data()); },
                      {"thread (1,0,0)", "the mask must name the calling lane 1"});
  std::vector<float> f(32, 0);
  expect_launch_error([&] { LT_LAUNCH(width_not_power_of_two, 1, 32, 0, 0, f.data()); },
                      {"width 12", "power of 2"});
}

TEST(Errors, InvalidLaunchConfigurations) {
  std::vector<int> out(4096, 0);
  int* p = out.data();
  expect_launch_error([&] { LT_LAUNCH(trivial, 1, 1025, 0, 0, p); },
                      {"kernel 'trivial'", "(1025,1,1) has 1025 threads", "at most 1024"});
  expect_launch_error([&] { LT_LAUNCH(trivial, 1, dim3(32, 32, 2), 0, 0, p); }, {"2048 threads"});
  expect_launch_error([&] { LT_LAUNCH(trivial, 1, dim3(1, 1, 65), 0, 0, p); }, {"(1,1,65)", "limits"});
  expect_launch_error([&] { LT_LAUNCH(trivial, dim3(1, 65536), 1, 0, 0, p); }, {"grid (1,65536,1)"});
  expect_launch_error([&] { LT_LAUNCH(trivial, 0, 32, 0, 0, p); }, {"grid (0,1,1) has a dimension of 0"});
  expect_launch_error([&] { LT_LAUNCH(trivial, 1, dim3(4, 0), 0, 0, p); }, {"block (4,0,1) has a dimension of 0"});
  expect_launch_error([&] { LT_LAUNCH(trivial, 1, 32, 300000, 0, p); }, {"300000 bytes of dynamic shared memory"});
  {  // an emulated sm_89: its blocks may opt into 99 KiB, and launchers asking are told so
    const cuda_sim::SharedMemoryLimit sm89(99 * 1024);
    EXPECT_EQ(cuda_sim::max_dynamic_shared_bytes(), size_t(99 * 1024));
    expect_launch_error([&] { LT_LAUNCH(trivial, 1, 32, 99 * 1024 + 16, 0, p); },
                        {"101392 bytes of dynamic shared memory", "maximum of 101376"});
    LT_LAUNCH(trivial, 1, 32, 99 * 1024, 0, p);
  }
  EXPECT_EQ(cuda_sim::max_dynamic_shared_bytes(), cuda_sim::kMaxDynamicSharedBytes);
  expect_launch_error([&] { launch(trivial, 1, 2000, 0, p); }, {"unnamed kernel of type void (*)(int*)"});
  expect_launch_error([&] { LT_LAUNCH(launches_inside, 1, 2, 0, 0, p); },
                      {"launched from inside a kernel", "launches_inside"});
}

TEST(Errors, TheNextLaunchWorksAndIntrinsicsOutsideAKernelFail) {
  expect_launch_error([] { LT_LAUNCH(two_different_barriers, 1, 32, 0, 0); }, {"two_different_barriers"});
  std::vector<int> out(64, -1);
  LT_LAUNCH(trivial, 2, 32, 0, 0, out.data());
  for (unsigned i = 0; i < 64; ++i) ASSERT_EQ(out[i], int(i % 32));
  EXPECT_EQ(threadIdx.x, 0u);  // outside a kernel the built-ins read as zeros / ones
  EXPECT_EQ(blockDim.x, 1u);
  expect_launch_error([] { __syncthreads(); }, {"__syncthreads called outside a kernel"});
}

}  // namespace
}  // namespace lt::cuda_sim
