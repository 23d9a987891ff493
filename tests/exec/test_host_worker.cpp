// The host lanes: jobs in order, each after what it waits for (the executor's deps on other lanes), the first
// error reported at drain, later jobs dropped — and no wait that can outlive a failure.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
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

// A job waits for what it is given to wait for before it starts, and its recorded time starts after the wait (the
// trace shows the lane's work, not its waiting).
TEST(HostWorker, AJobStartsAfterItsWaitsAndItsTimeExcludesThem) {
  auto dev = make_cpu_device(1 << 20);
  HostWorker w("host", dev.get());
  struct Sink : OpSink {
    std::vector<OpRecord> ops;
    std::mutex m;
    void record(const OpRecord& op) override {
      std::lock_guard<std::mutex> lock(m);
      ops.push_back(op);
    }
  } sink;
  w.set_sink(&sink);
  std::promise<void> gate;
  std::atomic<bool> ran{false};
  w.submit([&] { ran = true; }, "gated", -1, 0, {gate.get_future().share()});
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(ran);  // still waiting
  gate.set_value();
  w.drain();
  EXPECT_TRUE(ran);
  ASSERT_EQ(sink.ops.size(), 1u);
  EXPECT_LT(sink.ops[0].end - sink.ops[0].start, 0.025);  // the job itself, not the 50 ms it waited
}

// A wait whose promise breaks (its producer was dropped after a failure) or carries an error fails the job: nothing
// waits forever, and drain reports it.
TEST(HostWorker, ABrokenOrFailedWaitFailsTheJob) {
  auto dev = make_cpu_device(1 << 20);
  HostWorker w("host", dev.get());
  std::atomic<int> ran{0};
  {
    auto producer = std::make_shared<std::promise<void>>();
    w.submit([&] { ++ran; }, "consumer", -1, 0, {producer->get_future().share()});
    producer.reset();  // dropped unrun: its promise breaks
  }
  EXPECT_TRUE(finishes_within([&] { EXPECT_THROW(w.drain(), std::future_error); }, 2000ms));
  std::promise<void> failed;
  failed.set_exception(std::make_exception_ptr(Error("the producer broke", "test")));
  w.submit([&] { ++ran; }, "consumer 2", -1, 0, {failed.get_future().share()});
  w.submit([&] { ++ran; }, "after it");  // dropped: after a failure
  try {
    w.drain();
    FAIL() << "expected the producer's error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the producer broke"), std::string::npos);
  }
  EXPECT_EQ(ran, 0);
}

}  // namespace
}  // namespace lt
