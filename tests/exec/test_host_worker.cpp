// The host lane and its staging slots: jobs in order, the first error reported at drain, later jobs
// dropped — and no slot wait that can outlive a failure (a dropped job's guard releases its slot, a failed
// releaser or abort() ends a wait).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "core/error.h"
#include "device/device.h"
#include "exec/host_worker.h"

namespace lt {
namespace {

using namespace std::chrono_literals;

// Runs f on another thread; true if it returned within `limit`.
template <typename F>
bool finishes_within(F f, std::chrono::milliseconds limit) {
  auto done = std::async(std::launch::async, f);
  return done.wait_for(limit) == std::future_status::ready;
}

TEST(HostWorker, RunsInOrderAndReportsTheFirstError) {
  auto dev = make_cpu_device(1 << 20);
  HostWorker w("host", dev.get());
  std::vector<int> ran;
  w.submit([&] { ran.push_back(1); }, "one");
  w.submit([&] { LT_FAIL("job two broke"); }, "two");
  w.submit([&] { ran.push_back(3); }, "three");  // dropped: after a failure
  try {
    w.drain();
    FAIL() << "expected the job's error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("job two broke"), std::string::npos);
  }
  EXPECT_EQ(ran, std::vector<int>{1});
  EXPECT_FALSE(w.failed());  // drain reported it; the worker runs jobs again
  w.submit([&] { ran.push_back(4); }, "four");
  w.drain();
  EXPECT_EQ(ran, (std::vector<int>{1, 4}));
}

TEST(HostSlots, AcquireWaitsForTheRelease) {
  HostSlots slots(1);
  slots.acquire(0);
  std::atomic<bool> released{false};
  std::thread t([&] {
    std::this_thread::sleep_for(30ms);
    released = true;
    slots.release(0);
  });
  slots.acquire(0);
  EXPECT_TRUE(released);
  t.join();
}

TEST(HostSlots, ADroppedJobsGuardReleasesItsSlot) {
  auto dev = make_cpu_device(1 << 20);
  HostWorker w("host", dev.get());
  HostSlots slots(1);
  slots.acquire(0);
  std::atomic<bool> ran{false};
  w.submit([] { LT_FAIL("first job broke"); }, "first");
  w.submit([&, guard = slots.release_guard(0)] { ran = true; }, "consumer");  // dropped unrun
  EXPECT_TRUE(finishes_within([&] { slots.acquire(0); }, 2000ms));
  EXPECT_FALSE(ran);
  EXPECT_THROW(w.drain(), Error);
}

TEST(HostSlots, AWaitEndsWhenItsReleaserFailsOrOnAbort) {
  auto dev = make_cpu_device(1 << 20);
  HostWorker w("host", dev.get());
  HostSlots slots(2);
  slots.acquire(0);
  slots.acquire(1);
  w.submit([] { LT_FAIL("the releaser broke"); }, "releaser");
  EXPECT_TRUE(finishes_within([&] { slots.acquire(0, &w); }, 2000ms));  // would never be released
  EXPECT_THROW(w.drain(), Error);
  auto waiting = std::async(std::launch::async, [&] { slots.acquire(1); });
  EXPECT_EQ(waiting.wait_for(50ms), std::future_status::timeout);  // still busy: waits
  slots.abort();
  EXPECT_EQ(waiting.wait_for(2000ms), std::future_status::ready);
}

}  // namespace
}  // namespace lt
