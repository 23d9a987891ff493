// device/cpu_device.cpp — the CPU device: an emulated accelerator behind device.h.
//
// What it is, and the choices it makes (a CUDA device keeps the same contract):
//
// Memory. One anonymous mmap of `capacity` bytes made up front (MAP_NORESERVE: untouched pages cost no host
//   RAM, so a large emulated capacity is free until used; touched pages stay resident until the device is
//   destroyed). A DeviceArena (device/arena.h) allocates inside it: 256-byte alignment, best fit, coalescing.
//   Device memory is not initialised (as cudaMalloc). free() does not wait for queued work that may still
//   use the block (cudaFree would): synchronize, or order the free after that work, before reusing memory.
//   Copies check at enqueue that the device side lies inside one live allocation and that the host side
//   does not point into the arena, so a stale or swapped pointer is an lt::Error at the call.
//
// Streams. compute, h2d and d2h are each one thread with a FIFO queue (mutex + condition variable);
//   operations on one stream run strictly in order. launch() and host_callback() run their function on the
//   stream's thread. A launched function may use OpenMP: it runs with the OpenMP thread count of the host
//   thread that launched it (libgomp gives a new thread the default count, not what lt::set_num_threads set).
//   Device calls that block the host (synchronize) are refused from a stream thread, since that can deadlock.
//
// Copies and the link: an emulated timeline. A copy is eligible once it is queued and its stream's earlier
//   work is done (emulated); its transfer begins at max(eligible, the link free) and ends at
//   max(begin + bytes / bandwidth, the real memcpy's end), plus the latency. The memcpy itself runs as soon
//   as the stream thread reaches the copy (possibly well before the emulated end). Each direction is one
//   link: copies in the same direction on different streams take turns; h2d and d2h overlap freely (the
//   full-duplex slowdown of real PCIe is not modelled). Bandwidth 0 = unlimited: the memcpy's time, plus
//   the latency if any. Every consumer respects the emulated end: a later op on the stream starts after
//   it, an event recorded after it completes at it (query() is false before), and synchronize(event) /
//   synchronize() return after it. So nothing can observe a copy early, and, like a DMA engine, the timing
//   does not depend on when a copy thread happens to be scheduled: on a loaded machine (OpenMP compute on
//   every core, exactly when the executor hides transfers) a copy thread that slept through its delay
//   would wake milliseconds late and fake exposed transfer time. Whoever must wait for a future time (a
//   launch, the host) sleeps to ~0.2 ms before it and spins the rest: accurate to a few µs when idle.
//
// Events. Each record() makes a fresh marker, queued on the stream; when the stream reaches it, it takes the
//   time the stream's earlier work completes (see above). The event points at its latest marker, so
//   re-recording moves the event and a wait() captures the record current when wait() is called (CUDA's
//   rule). A never-recorded event is complete. wait() on a marker already complete enqueues nothing.
//
// Wait records. When a stream reaches a wait whose event is not yet complete, it is blocked from the time it
//   got there (the wait queued and its earlier work done, emulated) until the event's completion time, and
//   the sink gets an OpRecord {name "wait <lane>", lane = the waiting stream, waited_on = the lane that
//   recorded the event, layer = the layer of the last copy/launch enqueued on that lane before the record}
//   covering exactly that interval. Only waits that blocked are reported (however briefly); a wait on a
//   complete event emits nothing. The executor sums these to get exposed transfer time.
//
// Errors. An exception from a launched function, a callback or the sink is caught and kept (the first one
//   wins), wrapped as an lt::Error that names the operation and stream. From then on every stream skips its
//   work (copies, launches, callbacks; waits do not block) but still completes event markers, so nothing
//   waits forever. synchronize(event) and synchronize() rethrow it; synchronize() first lets every stream
//   drain the work queued before the call, then clears the error, so the device is usable again after it.
//
// Destruction cancels: queued work that has not started is dropped (markers still complete, so events read
//   complete); a running launch or callback finishes; pending emulated delays are cut short. Then the
//   threads are joined. Destroy the device only after synchronize() if the queued work matters.
//
// Observability. Each copy, launch, callback and blocking wait goes to the sink with start/end on now()
//   (steady clock seconds since the device was created). A copy or wait is reported when its stream has
//   processed it, so its (emulated) end may still lie a little in the future when the sink sees it. Sink
//   calls are serialised by a mutex, and set_sink() returns only once no call into the old sink is in
//   flight, so a sink may be destroyed after set_sink(nullptr).
#include <pthread.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/parallel.h"
#include "device/arena.h"
#include "device/device.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LT_CPU_RELAX() _mm_pause()
#else
#define LT_CPU_RELAX() ((void)0)
#endif

namespace lt {
namespace {

using Clock = std::chrono::steady_clock;

// Waits for a future time sleep until this long before it, then spin: Linux sleeps overshoot by 50-100 µs.
constexpr double kSpinSeconds = 200e-6;

double seconds_since(Clock::time_point epoch) {
  return std::chrono::duration<double>(Clock::now() - epoch).count();
}

// One record() of an event.
struct Marker {
  std::atomic<bool> reached{false};  // its stream has processed it: the work before it has really run
  double done_at = 0;                // and completes (emulated) at this device time; written before `reached`
  StreamKind lane = StreamKind::compute;
  int layer = -1;
  bool complete(double now) const { return reached.load(std::memory_order_acquire) && now >= done_at; }
};

class CpuEvent final : public Event {
 public:
  CpuEvent(const void* owner, Clock::time_point epoch, std::shared_ptr<const std::atomic<bool>> device_gone)
      : owner_(owner), epoch_(epoch), device_gone_(std::move(device_gone)) {}
  bool query() const override {
    std::shared_ptr<Marker> m = latest();
    return !m || device_gone_->load(std::memory_order_acquire) || m->complete(seconds_since(epoch_));
  }
  std::shared_ptr<Marker> latest() const {
    std::lock_guard<std::mutex> lock(mu_);
    return latest_;
  }
  void set_latest(std::shared_ptr<Marker> m) {
    std::lock_guard<std::mutex> lock(mu_);
    latest_ = std::move(m);
  }
  const void* owner() const { return owner_; }

 private:
  const void* owner_;  // the device that created it
  Clock::time_point epoch_;  // its clock (a copy: the event may outlive the device)
  std::shared_ptr<const std::atomic<bool>> device_gone_;  // set when the device is destroyed: all complete
  mutable std::mutex mu_;
  std::shared_ptr<Marker> latest_;  // held by the queued op too, so the event may die before it runs
};

enum class OpKind : uint8_t { copy_h2d, copy_d2h, launch, callback, record, wait };

struct Op {
  OpKind kind = OpKind::launch;
  std::string name;
  int layer = -1;
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
  std::function<void()> fn;
  std::shared_ptr<Marker> marker;
  int omp_threads = 0;     // of the launching host thread
  double enqueued_at = 0;  // device time of the call that queued it
};

struct Stream {
  StreamKind kind = StreamKind::compute;
  std::mutex mu;
  std::condition_variable work_cv;  // work arrived, or stopping
  std::condition_variable idle_cv;  // an op completed (synchronize() waits on it)
  std::deque<Op> queue;
  uint64_t submitted = 0, completed = 0;
  int last_layer = -1;  // of the last copy/launch enqueued, for the layer of wait records
  double ready_at = 0;  // when the ops processed so far complete (emulated); the stream thread's own
  double published_ready_at = 0;  // ready_at as of `completed`, under mu, for synchronize()
  std::thread thread;
};

// One direction of the emulated link: transfers in that direction take turns.
struct Link {
  double gbps = 0;
  std::mutex mu;
  double free_at = 0;  // device seconds when the link finishes its last reserved transfer
};

thread_local const void* t_stream_owner = nullptr;  // the device whose stream thread this is

class CpuDevice final : public Device {
 public:
  CpuDevice(size_t capacity, LinkSpec link) : epoch_(Clock::now()), capacity_(capacity), link_spec_(link) {
    LT_CHECK(link.h2d_gbps >= 0 && link.d2h_gbps >= 0 && link.latency_s >= 0,
             "link bandwidths and latency must be >= 0 (0 = unlimited), got h2d {} GB/s, d2h {} GB/s, latency {} s",
             link.h2d_gbps, link.d2h_gbps, link.latency_s);
    size_t map_bytes = std::max<size_t>(capacity, 1);
    void* base = ::mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    LT_CHECK(base != MAP_FAILED, "cannot reserve {} of address space for the emulated device: {}",
             format_bytes(capacity), std::strerror(errno));
    map_base_ = base;
    map_bytes_ = map_bytes;
    arena_ = std::make_unique<DeviceArena>(base, capacity);
    links_[0].gbps = link.h2d_gbps;
    links_[1].gbps = link.d2h_gbps;
    for (int i = 0; i < kNumStreams; ++i) streams_[i].kind = StreamKind(i);
    try {
      for (auto& s : streams_) s.thread = std::thread([this, &s] { run_stream(s); });
    } catch (...) {
      shutdown();
      ::munmap(map_base_, map_bytes_);
      throw;
    }
  }

  ~CpuDevice() override {
    shutdown();
    gone_->store(true, std::memory_order_release);
    ::munmap(map_base_, map_bytes_);
  }

  std::string name() const override {
    auto gbps = [](double g) { return g > 0 ? fmt::format("{:g} GB/s", g) : std::string("unlimited"); };
    return fmt::format("cpu (emulated: {}, h2d {}, d2h {}, latency {:g} us)", format_bytes(capacity_),
                       gbps(link_spec_.h2d_gbps), gbps(link_spec_.d2h_gbps), link_spec_.latency_s * 1e6);
  }

  void* alloc(size_t bytes, const std::string& tag) override { return arena_->alloc(bytes, tag); }
  void free(void* ptr) override { arena_->free(ptr); }
  DeviceMemoryStats memory() const override { return arena_->stats(); }
  void reset_peak() override { arena_->reset_peak(); }
  std::vector<DeviceTagUsage> live_allocations() const override { return arena_->usage_by_tag(); }

  void copy_h2d(void* dst_device, const void* src_host, size_t bytes, StreamKind stream, const std::string& name,
                int layer) override {
    arena_->check_copy("copy_h2d", name, dst_device, "destination", src_host, "source", bytes);
    Op op{OpKind::copy_h2d, name, layer, dst_device, src_host, bytes, {}, {}, 0};
    enqueue(stream, std::move(op));
  }

  void copy_d2h(void* dst_host, const void* src_device, size_t bytes, StreamKind stream, const std::string& name,
                int layer) override {
    arena_->check_copy("copy_d2h", name, src_device, "source", dst_host, "destination", bytes);
    Op op{OpKind::copy_d2h, name, layer, dst_host, src_device, bytes, {}, {}, 0};
    enqueue(stream, std::move(op));
  }

  void launch(StreamKind stream, std::function<void()> work, const std::string& name, int layer) override {
    LT_CHECK(bool(work), "launch '{}': empty function", name);
    Op op{OpKind::launch, name, layer, nullptr, nullptr, 0, std::move(work), {}, num_threads()};
    enqueue(stream, std::move(op));
  }

  void host_callback(StreamKind stream, std::function<void()> fn, const std::string& name) override {
    LT_CHECK(bool(fn), "host_callback '{}': empty function", name);
    Op op{OpKind::callback, name, -1, nullptr, nullptr, 0, std::move(fn), {}, num_threads()};
    enqueue(stream, std::move(op));
  }

  std::unique_ptr<Event> create_event() override { return std::make_unique<CpuEvent>(this, epoch_, gone_); }

  void record(Event& event, StreamKind stream) override {
    CpuEvent& e = own(event, "record");
    Stream& s = stream_of(stream);
    auto m = std::make_shared<Marker>();
    m->lane = stream;
    Op op;
    op.kind = OpKind::record;
    op.marker = m;
    std::lock_guard<std::mutex> lock(s.mu);  // last_layer and the queue position are read together
    m->layer = s.last_layer;
    e.set_latest(m);
    push_locked(s, std::move(op));
  }

  void wait(StreamKind stream, Event& event) override {
    std::shared_ptr<Marker> m = own(event, "wait").latest();
    Stream& s = stream_of(stream);
    if (!m || m->complete(now())) return;  // complete already: nothing to wait for
    Op op;
    op.kind = OpKind::wait;
    op.marker = std::move(m);
    std::lock_guard<std::mutex> lock(s.mu);
    push_locked(s, std::move(op));
  }

  void synchronize(Event& event) override {
    LT_CHECK(t_stream_owner != this, "synchronize(event) called from a stream thread (a launch or callback); "
                                     "that can deadlock: order the work with record/wait instead");
    std::shared_ptr<Marker> m = own(event, "synchronize").latest();
    if (m) {
      if (!m->reached.load(std::memory_order_acquire)) {
        std::unique_lock<std::mutex> lock(ev_mu_);
        ev_cv_.wait(lock, [&] { return m->reached.load(std::memory_order_acquire); });
      }
      wait_until(m->done_at);
    }
    std::lock_guard<std::mutex> lock(err_mu_);
    if (error_) std::rethrow_exception(error_);
  }

  void synchronize() override {
    LT_CHECK(t_stream_owner != this, "synchronize() called from a stream thread (a launch or callback); "
                                     "that deadlocks: order the work with record/wait instead");
    uint64_t target[kNumStreams];
    for (int i = 0; i < kNumStreams; ++i) {
      std::lock_guard<std::mutex> lock(streams_[i].mu);
      target[i] = streams_[i].submitted;
    }
    double done_at = 0;
    for (int i = 0; i < kNumStreams; ++i) {
      Stream& s = streams_[i];
      std::unique_lock<std::mutex> lock(s.mu);
      s.idle_cv.wait(lock, [&] { return s.completed >= target[i]; });
      done_at = std::max(done_at, s.published_ready_at);
    }
    wait_until(done_at);
    std::exception_ptr error;
    {
      std::lock_guard<std::mutex> lock(err_mu_);
      error = std::exchange(error_, nullptr);
      failed_.store(false, std::memory_order_release);
    }
    if (error) std::rethrow_exception(error);
  }

  void set_sink(OpSink* sink) override {
    std::lock_guard<std::mutex> lock(sink_mu_);
    sink_.store(sink, std::memory_order_release);
  }

  double now() const override { return seconds_since(epoch_); }

 private:
  Stream& stream_of(StreamKind k) {
    LT_CHECK(uint8_t(k) < kNumStreams, "unknown stream kind {}", int(k));
    return streams_[uint8_t(k)];
  }

  CpuEvent& own(Event& event, const char* what) {
    auto* e = dynamic_cast<CpuEvent*>(&event);
    LT_CHECK(e != nullptr && e->owner() == this, "{}: the event was not created by this device", what);
    return *e;
  }

  void enqueue(StreamKind stream, Op op) {
    Stream& s = stream_of(stream);
    std::lock_guard<std::mutex> lock(s.mu);
    if (op.kind != OpKind::callback) s.last_layer = op.layer;
    push_locked(s, std::move(op));
  }

  void push_locked(Stream& s, Op op) {
    op.enqueued_at = now();
    s.queue.push_back(std::move(op));
    ++s.submitted;
    s.work_cv.notify_one();
  }

  void run_stream(Stream& s) {
    t_stream_owner = this;
    std::string thread_name = fmt::format("lt-{}", stream_kind_name(s.kind));
    pthread_setname_np(pthread_self(), thread_name.c_str());
    for (;;) {
      Op op;
      {
        std::unique_lock<std::mutex> lock(s.mu);
        s.work_cv.wait(lock, [&] { return !s.queue.empty() || stopping_.load(std::memory_order_acquire); });
        if (s.queue.empty()) return;  // stopping, and nothing left to drain
        op = std::move(s.queue.front());
        s.queue.pop_front();
      }
      execute(s, op);
      op = Op{};  // release the function and its captures before reporting completion
      {
        std::lock_guard<std::mutex> lock(s.mu);
        ++s.completed;
        s.published_ready_at = s.ready_at;
      }
      s.idle_cv.notify_all();
    }
  }

  bool skipping() const {
    return failed_.load(std::memory_order_acquire) || stopping_.load(std::memory_order_acquire);
  }

  void execute(Stream& s, Op& op) {
    if (op.kind == OpKind::record) {
      Marker& m = *op.marker;
      m.done_at = stopping_.load(std::memory_order_acquire) ? 0 : s.ready_at;
      {
        std::lock_guard<std::mutex> lock(ev_mu_);
        m.reached.store(true, std::memory_order_release);
      }
      ev_cv_.notify_all();
      return;
    }
    if (skipping()) return;
    try {
      switch (op.kind) {
        case OpKind::copy_h2d:
        case OpKind::copy_d2h: run_copy(s, op); break;
        case OpKind::launch:
        case OpKind::callback: run_function(s, op); break;
        case OpKind::wait: run_wait(s, op); break;
        case OpKind::record: break;
      }
    } catch (...) {
      fail(s, op, std::current_exception());
    }
  }

  // The transfer starts when it is eligible (queued, and the stream's earlier work done), not when this
  // thread got to it, as a DMA engine would; only a memcpy slower than the link pushes the end later.
  void run_copy(Stream& s, const Op& op) {
    double eligible = std::max(op.enqueued_at, s.ready_at);
    if (op.bytes > 0) std::memcpy(op.dst, op.src, op.bytes);
    double copied = now();
    Link& link = links_[op.kind == OpKind::copy_h2d ? 0 : 1];
    double wire = link.gbps > 0 ? double(op.bytes) / (link.gbps * 1e9) : 0;
    double begin, end;
    {
      std::lock_guard<std::mutex> lock(link.mu);
      begin = std::max(eligible, link.free_at);
      end = std::max(begin + wire, copied);
      link.free_at = end;
    }
    s.ready_at = end + link_spec_.latency_s;
    report(s, op, begin, s.ready_at, "");
  }

  void run_function(Stream& s, const Op& op) {
    wait_until(s.ready_at);  // earlier copies on this stream have landed (emulated)
    if (stopping_.load(std::memory_order_acquire)) return;
    if (op.omp_threads > 0 && num_threads() != op.omp_threads) set_num_threads(op.omp_threads);
    double start = now();
    op.fn();
    s.ready_at = now();
    report(s, op, start, s.ready_at, "");
  }

  // The stream is blocked from when it got there (the wait queued, its earlier work done) until the event's
  // completion time. The recording stream stamps that time when it reaches the record; until then this
  // thread really blocks.
  void run_wait(Stream& s, const Op& op) {
    Marker& m = *op.marker;
    double arrived = std::max(op.enqueued_at, s.ready_at);
    if (!m.reached.load(std::memory_order_acquire)) {
      std::unique_lock<std::mutex> lock(ev_mu_);
      ev_cv_.wait(lock, [&] { return m.reached.load(std::memory_order_acquire) || stopping_.load(); });
    }
    if (stopping_.load(std::memory_order_acquire)) return;
    if (m.done_at <= arrived) return;  // complete by the time the stream got there: no wait
    s.ready_at = m.done_at;
    Op labelled;
    labelled.kind = OpKind::wait;
    labelled.name = fmt::format("wait {}", stream_kind_name(m.lane));
    labelled.layer = m.layer;
    report(s, labelled, arrived, m.done_at, stream_kind_name(m.lane));
  }

  // Sleeps until `target` (device seconds) less kSpinSeconds, then spins; cut short by shutdown.
  void wait_until(double target) {
    double sleep_to = target - kSpinSeconds;
    if (now() < sleep_to) {
      auto deadline = epoch_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(sleep_to));
      std::unique_lock<std::mutex> lock(stop_mu_);
      stop_cv_.wait_until(lock, deadline, [&] { return stopping_.load(std::memory_order_acquire); });
    }
    while (now() < target && !stopping_.load(std::memory_order_relaxed)) LT_CPU_RELAX();
  }

  void report(Stream& s, const Op& op, double start, double end, const char* waited_on) {
    if (sink_.load(std::memory_order_acquire) == nullptr) return;
    OpRecord r;
    r.name = op.name;
    r.lane = stream_kind_name(s.kind);
    r.start = start;
    r.end = end;
    r.bytes = op.bytes;
    r.layer = op.layer;
    r.waited_on = waited_on;
    std::lock_guard<std::mutex> lock(sink_mu_);
    if (OpSink* sink = sink_.load(std::memory_order_relaxed)) sink->record(r);
  }

  void fail(Stream& s, const Op& op, std::exception_ptr e) {
    std::string context = fmt::format("'{}' on the {} stream", op.name, stream_kind_name(s.kind));
    std::string where = fmt::format("device stream {}", stream_kind_name(s.kind));
    std::exception_ptr wrapped;
    try {
      std::rethrow_exception(e);
    } catch (const Error& err) {  // keep the origin: file:line of the failed check
      wrapped = std::make_exception_ptr(Error(fmt::format("{} (in {})", err.what(), context), err.where()));
    } catch (const std::exception& err) {
      wrapped = std::make_exception_ptr(Error(fmt::format("{} failed: {}", context, err.what()), where));
    } catch (...) {
      wrapped = std::make_exception_ptr(Error(fmt::format("{} failed with a non-standard exception", context), where));
    }
    std::lock_guard<std::mutex> lock(err_mu_);
    if (!error_) error_ = wrapped;
    failed_.store(true, std::memory_order_release);
  }

  void shutdown() {
    stopping_.store(true, std::memory_order_release);
    for (auto& s : streams_) {
      { std::lock_guard<std::mutex> lock(s.mu); }
      s.work_cv.notify_all();
    }
    { std::lock_guard<std::mutex> lock(ev_mu_); }
    ev_cv_.notify_all();
    { std::lock_guard<std::mutex> lock(stop_mu_); }
    stop_cv_.notify_all();
    for (auto& s : streams_)
      if (s.thread.joinable()) s.thread.join();
  }

  const Clock::time_point epoch_;
  const size_t capacity_;
  const LinkSpec link_spec_;
  void* map_base_ = nullptr;
  size_t map_bytes_ = 0;
  std::unique_ptr<DeviceArena> arena_;

  Stream streams_[kNumStreams];
  Link links_[2];  // h2d, d2h

  std::mutex ev_mu_;  // marker completion; waiters on ev_cv_
  std::condition_variable ev_cv_;
  std::mutex stop_mu_;  // emulated copy delays sleep on stop_cv_, so shutdown cuts them short
  std::condition_variable stop_cv_;
  std::atomic<bool> stopping_{false};
  std::shared_ptr<std::atomic<bool>> gone_ = std::make_shared<std::atomic<bool>>(false);

  std::mutex err_mu_;
  std::exception_ptr error_;  // the first failure, until synchronize() takes it
  std::atomic<bool> failed_{false};

  std::mutex sink_mu_;
  std::atomic<OpSink*> sink_{nullptr};
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(size_t capacity, LinkSpec link) {
  return std::make_unique<CpuDevice>(capacity, link);
}

}  // namespace lt
