// The CUDA device (cuda/cuda_device.h). Without a GPU (or without nvcc) only the refusals are checked: opening
// the device is an lt::Error naming the reason, never a crash. With a GPU (a CUDA build and
// cudaGetDeviceCount > 0): the arena's budget, copies across streams ordered by an event, launch and host
// callback semantics, sink records, and pinning.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "cuda/cuda_device.h"
#include "device/device.h"
#include "device/device_test_util.h"

#if LT_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace lt::cuda {
namespace {

using lt::testing::random_bytes;
using lt::testing::RecordingSink;
using lt::testing::Watchdog;

constexpr size_t MiB = 1024 * 1024;

// Why this process cannot open a GPU, or "" when it can; and a word the device's refusal must contain.
struct GpuAvailability {
  std::string reason;
  std::string expected_in_error;
};

GpuAvailability gpu_availability() {
#if LT_WITH_CUDA
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    return {fmt::format("{} ({})", cudaGetErrorName(status), cudaGetErrorString(status)), cudaGetErrorName(status)};
  }
  if (count == 0) return {"the driver lists no GPU", "GPU"};
  return {};
#else
  return {"built without nvcc", "built without nvcc"};
#endif
}

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not an lt::Error: ") + e.what();
  }
  return "(no exception)";
}

// ---- every build, every machine ----

TEST(CudaDevice, OpeningIsAnErrorNamingTheReasonWhenThereIsNoGpu) {
  const GpuAvailability gpu = gpu_availability();
  if (gpu.reason.empty()) {
    auto dev = make_cuda_device({.gpu = 0, .capacity = 16 * MiB});
    EXPECT_EQ(dev->name().rfind("cuda:0 ", 0), 0u) << dev->name();
    return;
  }
  const std::string msg = message_of([] { make_cuda_device({}); });
  std::printf("refused as: %s\n", msg.c_str());
  EXPECT_NE(msg.find(gpu.expected_in_error), std::string::npos) << msg;
  EXPECT_NE(msg.find("CUDA device 0"), std::string::npos) << msg;
}

TEST(CudaDevice, NativeStreamOfAnotherDeviceIsAnError) {
  auto cpu = make_cpu_device(MiB);
  const std::string msg = message_of([&] { cuda_native_stream(*cpu, StreamKind::compute); });
  EXPECT_NE(msg.find("not a CUDA device"), std::string::npos) << msg;
}

TEST(CudaDevice, PinningWithoutAGpuIsAnErrorNamingTheRegion) {
  const GpuAvailability gpu = gpu_availability();
  if (gpu.reason.empty()) GTEST_SKIP() << "a GPU is present: pinning is tested below";
  std::vector<uint8_t> slab(3 * MiB);
  const std::string msg = message_of([&] { pin_host_memory(slab.data(), slab.size(), "the test slab"); });
  std::printf("refused as: %s\n", msg.c_str());
  EXPECT_NE(msg.find("the test slab"), std::string::npos) << msg;
  EXPECT_NE(msg.find(gpu.expected_in_error), std::string::npos) << msg;
}

TEST(CudaDevice, AdviseHugePages) {
  const size_t bytes = 8 * MiB;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  if (std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good()) {
    EXPECT_TRUE(advise_huge_pages(p, bytes));
    EXPECT_TRUE(advise_huge_pages(static_cast<char*>(p) + 100, bytes - 200));  // the whole pages inside
  }
  EXPECT_FALSE(advise_huge_pages(nullptr, bytes));
  EXPECT_FALSE(advise_huge_pages(p, 0));
  EXPECT_FALSE(advise_huge_pages(static_cast<char*>(p) + 1, 100));  // no whole page
  ::munmap(p, bytes);
}

// ---- with a GPU ----
#if LT_WITH_CUDA

class CudaGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    const GpuAvailability gpu = gpu_availability();
    if (!gpu.reason.empty()) GTEST_SKIP() << "no GPU: " << gpu.reason;
  }
  Watchdog watchdog_{60, ::testing::UnitTest::GetInstance()->current_test_info()->name()};
};

TEST_F(CudaGpu, AllocBeyondTheBudgetIsRefused) {
  auto dev = make_cuda_device({.gpu = 0, .capacity = 64 * MiB});
  EXPECT_NE(dev->name().find("64.0 MiB arena"), std::string::npos) << dev->name();
  void* w = dev->alloc(40 * MiB, "weights");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w) % 256, 0u);
  const std::string msg = message_of([&] { dev->alloc(40 * MiB, "grads"); });
  EXPECT_NE(msg.find("grads"), std::string::npos) << msg;
  const DeviceMemoryStats m = dev->memory();
  EXPECT_EQ(m.capacity, 64 * MiB);
  EXPECT_EQ(m.in_use, 40 * MiB);
  ASSERT_EQ(dev->live_allocations().size(), 1u);
  EXPECT_EQ(dev->live_allocations()[0].tag, "weights");
  dev->free(w);
  EXPECT_EQ(dev->memory().in_use, 0u);
  void* again = dev->alloc(64 * MiB, "all");  // the whole budget, once the rest is free
  dev->free(again);
}

TEST_F(CudaGpu, RoundTripAcrossStreamsOrderedByAnEvent) {
  auto dev = make_cuda_device({.gpu = 0, .capacity = 64 * MiB});
  const size_t n = 4 * MiB + 13;
  const std::vector<uint8_t> src = random_bytes(n, 7);
  std::vector<uint8_t> back(n, 0);
  auto* d = static_cast<uint8_t*>(dev->alloc(n + 64, "rt"));
  auto ev = dev->create_event();
  EXPECT_TRUE(ev->query());  // never recorded: complete
  dev->copy_h2d(d + 13, src.data(), n, StreamKind::h2d, "up");
  dev->record(*ev, StreamKind::h2d);
  dev->wait(StreamKind::d2h, *ev);
  dev->copy_d2h(back.data(), d + 13, n, StreamKind::d2h, "down");
  dev->synchronize();
  EXPECT_TRUE(ev->query());
  EXPECT_EQ(std::memcmp(back.data(), src.data(), n), 0);
  // A device range outside every live allocation is refused at the call (past the block the arena reserved,
  // which is the request rounded up to its alignment: the CPU device's test allows the rounded tail too).
  const std::vector<uint8_t> big(2 * n, 1);
  const std::string msg = message_of([&] { dev->copy_h2d(d + 32, big.data(), 2 * n, StreamKind::h2d, "over"); });
  EXPECT_NE(msg.find("not inside one live device allocation"), std::string::npos) << msg;
  dev->free(d);
}

TEST_F(CudaGpu, LaunchRunsHereAndEnqueuesOnTheStream) {
  auto dev = make_cuda_device({.gpu = 0, .capacity = 16 * MiB});
  const size_t n = 3 * MiB;
  void* d = dev->alloc(n, "buf");
  std::thread::id ran_on;
  dev->launch(StreamKind::compute, [&] {
    ran_on = std::this_thread::get_id();
    auto stream = static_cast<cudaStream_t>(cuda_native_stream(*dev, StreamKind::compute));
    ASSERT_EQ(cudaMemsetAsync(d, 0x5A, n, stream), cudaSuccess);
  }, "memset", 2);
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  std::vector<uint8_t> back(n, 0);
  dev->copy_d2h(back.data(), d, n, StreamKind::compute, "down");  // same stream: after the memset
  dev->synchronize();
  EXPECT_EQ(back.front(), 0x5A);
  EXPECT_EQ(back.back(), 0x5A);
  // An exception from the function is kept for the next synchronize, which clears it.
  dev->launch(StreamKind::compute, [] { throw std::runtime_error("boom"); }, "bad launch");
  const std::string msg = message_of([&] { dev->synchronize(); });
  EXPECT_NE(msg.find("bad launch"), std::string::npos) << msg;
  EXPECT_NE(msg.find("boom"), std::string::npos) << msg;
  dev->synchronize();
  dev->free(d);
}

TEST_F(CudaGpu, HostCallbacksRunInStreamOrder) {
  auto dev = make_cuda_device({.gpu = 0, .capacity = 16 * MiB});
  std::vector<int> order;  // only the driver's callback thread writes it before synchronize
  const std::vector<uint8_t> src = random_bytes(MiB, 3);
  void* d = dev->alloc(MiB, "buf");
  for (int i = 0; i < 4; ++i) {
    dev->host_callback(StreamKind::h2d, [&order, i] { order.push_back(i); }, "cb");
    dev->copy_h2d(d, src.data(), src.size(), StreamKind::h2d, "up");
  }
  dev->synchronize();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
  // A callback that throws, or calls CUDA (refused), surfaces at synchronize naming it.
  dev->host_callback(StreamKind::d2h, [] { throw std::runtime_error("cb failed"); }, "throwing cb");
  std::string msg = message_of([&] { dev->synchronize(); });
  EXPECT_NE(msg.find("throwing cb"), std::string::npos) << msg;
  Device* raw = dev.get();
  dev->host_callback(StreamKind::d2h, [raw] { raw->synchronize(); }, "syncing cb");
  msg = message_of([&] { dev->synchronize(); });
  EXPECT_NE(msg.find("inside a host callback"), std::string::npos) << msg;
  dev->synchronize();  // cleared
  dev->free(d);
}

TEST_F(CudaGpu, SinkRecordsEveryCopyAndLaunchOnTheDeviceClock) {
  auto dev = make_cuda_device({.gpu = 0, .capacity = 16 * MiB});
  RecordingSink sink;
  const size_t n = 2 * MiB;
  const std::vector<uint8_t> src = random_bytes(n, 5);
  void* d = dev->alloc(n, "buf");
  const double before = dev->now();
  dev->set_sink(&sink);
  dev->copy_h2d(d, src.data(), n, StreamKind::h2d, "up", 3);
  auto ev = dev->create_event();
  dev->record(*ev, StreamKind::h2d);
  dev->wait(StreamKind::compute, *ev);
  dev->launch(StreamKind::compute, [&] {
    cudaMemsetAsync(d, 0, n, static_cast<cudaStream_t>(cuda_native_stream(*dev, StreamKind::compute)));
  }, "zero", 4);
  dev->synchronize();  // every record submitted before it has been delivered
  const double after = dev->now();
  dev->set_sink(nullptr);
  const auto up = sink.named("up"), zero = sink.named("zero");
  ASSERT_EQ(up.size(), 1u);
  ASSERT_EQ(zero.size(), 1u);
  EXPECT_EQ(up[0].lane, "h2d");
  EXPECT_EQ(up[0].bytes, n);
  EXPECT_EQ(up[0].layer, 3);
  EXPECT_EQ(zero[0].lane, "compute");
  EXPECT_EQ(zero[0].layer, 4);
  for (const OpRecord& r : {up[0], zero[0]}) {
    EXPECT_LE(r.start, r.end) << r.name;
    EXPECT_GE(r.start, before - 1e-3) << r.name;  // the epoch is matched to a few µs
    EXPECT_LE(r.end, after + 1e-3) << r.name;
  }
  EXPECT_LE(up[0].end, zero[0].start + 1e-5);  // the compute stream waited for the upload
  dev->free(d);
}

TEST_F(CudaGpu, PinHostMemory) {
  const size_t bytes = 3 * MiB;
  const long page = ::sysconf(_SC_PAGESIZE);
  void* slab = std::aligned_alloc(size_t(page), bytes);
  ASSERT_NE(slab, nullptr);
  const PinnedRegion r = pin_host_memory(slab, bytes, "the test slab");
  EXPECT_EQ(r.base, slab);
  EXPECT_EQ(r.bytes, bytes);
  EXPECT_EQ(r.chunks, 1);
  EXPECT_GE(r.seconds, 0.0);
  const std::string msg = message_of([&] { pin_host_memory(slab, bytes, "the slab again"); });
  EXPECT_NE(msg.find("the slab again"), std::string::npos) << msg;  // already registered
  {
    auto dev = make_cuda_device({.gpu = 0, .capacity = 16 * MiB});
    void* d = dev->alloc(bytes, "buf");
    std::memset(slab, 0x3C, bytes);
    std::vector<uint8_t> back(bytes, 0);
    dev->copy_h2d(d, slab, bytes, StreamKind::h2d, "up");
    dev->copy_d2h(back.data(), d, bytes, StreamKind::h2d, "down");
    dev->synchronize();
    EXPECT_EQ(back[bytes / 2], 0x3C);
    dev->free(d);
  }
  unpin_host_memory(r);
  EXPECT_EQ(pin_host_memory(slab, 0, "nothing").chunks, 0);
  std::free(slab);
}

// Device::pin_host keeps the region by its base: a second pin of it is refused naming it, unpin_host releases it
// (a plain pin_host_memory of it then succeeds), and the device unpins what is left when destroyed.
TEST_F(CudaGpu, DevicePinsHostMemoryByBase) {
  const size_t bytes = 2 * MiB;
  void* a = std::aligned_alloc(4096, bytes);
  void* b = std::aligned_alloc(4096, bytes);
  {
    auto dev = make_cuda_device({.gpu = 0, .capacity = 16 * MiB});
    EXPECT_GE(dev->pin_host(a, bytes, "slab a"), 0.0);
    EXPECT_GE(dev->pin_host(b, bytes, "slab b"), 0.0);
    EXPECT_NE(message_of([&] { dev->pin_host(a, bytes, "slab a again"); }).find("already pinned"), std::string::npos);
    dev->unpin_host(a);
    const PinnedRegion r = pin_host_memory(a, bytes, "slab a by hand");
    unpin_host_memory(r);
  }  // b unpinned by the device
  const PinnedRegion r = pin_host_memory(b, bytes, "slab b after the device");
  unpin_host_memory(r);
  std::free(a);
  std::free(b);
}

#endif  // LT_WITH_CUDA

}  // namespace
}  // namespace lt::cuda
