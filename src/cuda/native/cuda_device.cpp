// cuda/native/cuda_device.cpp — the CUDA device: device/device.h on the CUDA runtime (host code, built only
// with nvcc present; cuda/cuda_device.cpp has the stand-ins of a build without it).
//
// It keeps the CPU device's contract (device/cpu_device.cpp) where a GPU allows, and differs where it cannot:
//
// Memory. ONE cudaMalloc of the capacity at construction (capacity 0: the free memory cudaMemGetInfo reports
//   less reserve_bytes), with a DeviceArena over it: the budget, the 256-byte alignment, the tags and the
//   refusal messages are the CPU device's, and nothing fragments the driver's heap during a run. free() does
//   not wait for queued work that may still use the block (cudaFree would): synchronize, or order the free
//   after that work, before reusing memory. Copies check at enqueue that the device side lies inside one live
//   allocation and that the host side does not point into the arena, as the CPU device does.
//
// Streams. compute, h2d and d2h are cudaStreams created with cudaStreamNonBlocking (no implicit sync with the
//   legacy default stream). copy_h2d / copy_d2h are cudaMemcpyAsync on the stream. Host memory should be
//   pinned (pin_host_memory): from pageable memory an h2d copy returns only once the source is staged, and a
//   d2h copy blocks the calling thread until the stream gets there.
//
// launch() differs from the CPU device: `fn` is host code that ENQUEUES kernels on cuda_native_stream(*this,
//   stream), and it runs on the calling thread, immediately (the CPU device runs it on the stream's thread,
//   in stream order). So fn must only enqueue: reading results it produces is the stream's job (a copy, an
//   event). The device is made current (cudaSetDevice) before fn runs, and after it the thread's last CUDA
//   error is checked, so a kernel that failed to launch is an error naming the launch.
//
// host_callback() is cudaLaunchHostFunc: fn runs on a CUDA driver thread once the stream's earlier work is
//   done, and the stream waits for it. CUDA forbids any CUDA API call inside it (this device refuses its own
//   CUDA-touching methods there with an lt::Error; alloc/free, which only keep books, are allowed). The
//   driver may run the callbacks of all streams on one thread, so a callback that blocks delays the others.
//
// Events. cudaEvents (timing disabled; blocking sync, so a waiting host thread sleeps instead of spinning a
//   core the host-side optimizer could use): record = cudaEventRecord, wait = cudaStreamWaitEvent,
//   synchronize(event) = cudaEventSynchronize, query = cudaEventQuery. Re-recording moves the event and a
//   never-recorded event is complete, as on the CPU device (CUDA's rules). An event belongs to the device
//   that created it; using it with another is an lt::Error.
//
// Errors. A CUDA API error is an lt::Error at the call, naming the operation and its name or tag. An exception
//   from a launched function (or the kernels it failed to launch), a callback or the sink is caught and kept
//   (the first one wins), wrapped as an lt::Error naming the operation and stream, as on the CPU device: from
//   then on copies, launches and callbacks are skipped (a callback already enqueued skips its function; work
//   already handed to the GPU still runs: a GPU cannot take it back) while events still record and wait, so
//   nothing waits forever. synchronize(event) rethrows it; synchronize() waits for everything, then rethrows
//   and clears it, so the device is usable again. An asynchronous CUDA error (a kernel fault) surfaces as the
//   CUDA error of the next call that reports it, usually a synchronize; it is sticky: the device is lost.
//
// Destruction waits for every stream (a GPU cannot drop enqueued work, so unlike the CPU device nothing is
//   cancelled), delivers the records still pending, then destroys the events and streams and frees the
//   arena. It never throws; errors on the way are ignored.
//
// Observability. When a sink is set, each copy, launch and callback is bracketed by two timing events (from a
//   pool) and handed to one recorder thread, which waits for them in submission order (cudaEventSynchronize),
//   turns them into an OpRecord {name, lane = the stream, start, end, bytes, layer} and calls the sink. Times
//   are seconds on now()'s clock: the epoch is an event recorded at construction, and now() counts from the
//   host steady-clock instant that event was seen complete (polled: off by a few µs).
//   cudaEventElapsedTime gives float milliseconds, whose resolution coarsens with the distance between the
//   two events; so the recorder measures from an anchor it moves forward every kReanchorMs (to the start of
//   the op it just timed), keeping records to about a µs over a run of any length. A launch's interval is the
//   GPU time of the kernels fn enqueued (between the events), not the host time fn took.
//   Waits that blocked a stream are NOT reported (the CPU device reports them as "wait <lane>"; CUDA has no
//   cheap way to time a cudaStreamWaitEvent), so sums of exposed transfer time built on them read zero here.
//   Sink calls come from the recorder thread only; set_sink() returns only once no call into the old sink is
//   in flight, so a sink may be destroyed after set_sink(nullptr). synchronize() also waits until every
//   record submitted before it has been delivered (as on the CPU device, where a synchronized op has been
//   reported); synchronize(event) does not (it would wait for other streams).
#include <cuda_runtime.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "cuda/cuda_device.h"
#include "cuda/native/cuda_check.h"
#include "device/arena.h"

namespace lt::cuda {
namespace {

using Clock = std::chrono::steady_clock;

// The recorder moves its time anchor forward once an op starts this long after it: float milliseconds then
// still resolve ~1 µs (cudaEventElapsedTime's own resolution is ~0.5 µs).
constexpr float kReanchorMs = 10'000.0f;
// One cudaHostRegister at most this much: a single registration of hundreds of GiB fails on recent drivers.
constexpr size_t kPinChunkBytes = size_t(64) << 30;

// Set while a host callback (of any device) runs on this thread: CUDA forbids CUDA calls there.
thread_local bool t_in_host_callback = false;

double seconds_since(Clock::time_point epoch) {
  return std::chrono::duration<double>(Clock::now() - epoch).count();
}

// An lt::Error for an exception caught from `context` ("'fwd L3' on the compute stream"), keeping the origin
// (file:line) of an lt::Error.
std::exception_ptr wrap_error(const std::string& context, const std::string& where, std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return std::make_exception_ptr(Error(fmt::format("{} (in {})", err.what(), context), err.where()));
  } catch (const std::exception& err) {
    return std::make_exception_ptr(Error(fmt::format("{} failed: {}", context, err.what()), where));
  } catch (...) {
    return std::make_exception_ptr(Error(fmt::format("{} failed with a non-standard exception", context), where));
  }
}

// Friendlier than cudaSetDevice's error: says whether there is no driver, no GPU, or no such index.
void check_gpu_index(int gpu) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    int driver = 0;
    cudaDriverGetVersion(&driver);  // 0 without a driver
    cudaGetLastError();             // the failure is reported here; do not leave it for a later check
    LT_FAIL("cannot open CUDA device {}: {} ({}: {})", gpu,
            driver == 0 ? "no NVIDIA driver on this machine" : "the CUDA driver reports no usable GPU",
            cudaGetErrorName(status), cudaGetErrorString(status));
  }
  LT_CHECK(count > 0, "cannot open CUDA device {}: the CUDA driver lists no GPU", gpu);
  LT_CHECK(gpu >= 0 && gpu < count, "cannot open CUDA device {}: this machine has {} GPU(s), indices 0..{}", gpu,
           count, count - 1);
}

// The bytes the arena gets: the requested capacity, or all free memory less the reserve.
size_t arena_capacity(const CudaDeviceOptions& o, size_t free_bytes, size_t total_bytes) {
  if (o.capacity > 0) return o.capacity;
  LT_CHECK(free_bytes > o.reserve_bytes,
           "cuda:{} has {} free of {}, no more than the {} reserve: give the device capacity explicitly or a "
           "smaller reserve", o.gpu, format_bytes(free_bytes), format_bytes(total_bytes), format_bytes(o.reserve_bytes));
  return free_bytes - o.reserve_bytes;
}

// The chunks pin_host_memory registers: at most kPinChunkBytes each, every boundary between two on a page
// boundary so no page belongs to two registrations (the second would fail as already registered).
std::vector<std::pair<void*, size_t>> pin_chunks(void* base, size_t bytes) {
  const long page_size = ::sysconf(_SC_PAGESIZE);
  const auto page = uintptr_t(page_size > 0 ? page_size : 4096);
  const auto begin = reinterpret_cast<uintptr_t>(base), end = begin + bytes;
  std::vector<std::pair<void*, size_t>> chunks;
  for (uintptr_t at = begin; at < end;) {
    const uintptr_t next = std::min<uintptr_t>((at + kPinChunkBytes) / page * page, end);
    chunks.emplace_back(reinterpret_cast<void*>(at), size_t(next - at));
    at = next;
  }
  return chunks;
}

class CudaDevice;

// A user event (Device::create_event).
class CudaEvent final : public Event {
 public:
  CudaEvent(const CudaDevice* owner, int gpu) : owner_(owner), gpu_(gpu) {
    LT_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming | cudaEventBlockingSync),
                  "create_event on cuda:{}", gpu);
  }
  ~CudaEvent() override {
    cudaSetDevice(gpu_);
    cudaEventDestroy(event_);
  }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  bool query() const override {
    LT_CUDA_CHECK(cudaSetDevice(gpu_), "event query on cuda:{}", gpu_);
    const cudaError_t status = cudaEventQuery(event_);
    if (status == cudaErrorNotReady) return false;
    LT_CUDA_CHECK(status, "event query on cuda:{}", gpu_);
    return true;
  }
  cudaEvent_t handle() const { return event_; }
  const CudaDevice* owner() const { return owner_; }

 private:
  const CudaDevice* owner_;
  int gpu_;
  cudaEvent_t event_ = nullptr;
};

// Timing events, reused: creating an event per op would cost more than recording it. Blocking sync, so the
// recorder sleeps in cudaEventSynchronize instead of spinning a core. The caller has made the device current.
class EventPool {
 public:
  EventPool() = default;
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  ~EventPool() {
    for (cudaEvent_t e : all_) cudaEventDestroy(e);
  }
  cudaEvent_t take() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_.empty()) {
      cudaEvent_t e = free_.back();
      free_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    LT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventBlockingSync), "creating a timing event ({} made so far)",
                  all_.size());
    all_.push_back(e);
    return e;
  }
  void give(cudaEvent_t e) {
    if (e == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(e);
  }

 private:
  std::mutex mu_;
  std::vector<cudaEvent_t> free_, all_;
};

// One op on its way to the sink: the record without its times, and the events bracketing it.
struct TimedOp {
  OpRecord record;
  cudaEvent_t start = nullptr, end = nullptr;
};

// What cudaLaunchHostFunc carries to the driver thread; deleted there after it ran.
struct HostCall {
  CudaDevice* device = nullptr;
  std::function<void()> fn;
  std::string name;
  StreamKind stream = StreamKind::compute;
};

void CUDART_CB run_host_call(void* data);

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(const CudaDeviceOptions& options) : gpu_(options.gpu) {
    check_gpu_index(gpu_);
    LT_CUDA_CHECK(cudaSetDevice(gpu_), "making cuda:{} current", gpu_);
    cudaDeviceProp prop{};
    LT_CUDA_CHECK(cudaGetDeviceProperties(&prop, gpu_), "cudaGetDeviceProperties of cuda:{}", gpu_);
    gpu_name_ = prop.name;
    allocate_arena(options);
    // From here on a throw must undo what was made: the destructor does not run for a half-built object.
    try {
      for (int i = 0; i < kNumStreams; ++i)
        LT_CUDA_CHECK(cudaStreamCreateWithFlags(&streams_[i], cudaStreamNonBlocking), "creating the {} stream of {}",
                      stream_kind_name(StreamKind(i)), name());
      start_epoch();
      recorder_ = std::thread([this] { run_recorder(); });
    } catch (...) {
      release();
      throw;
    }
  }

  ~CudaDevice() override {
    cudaSetDevice(gpu_);
    for (cudaStream_t s : streams_)
      if (s) cudaStreamSynchronize(s);  // errors ignored: a destructor must not throw
    stop_recorder();
    for (const auto& [base, region] : pinned_) {
      try {
        unpin_host_memory(region);
      } catch (...) {
      }
    }
    release();
  }

  // Host memory on huge pages where the kernel allows, then registered (pin_host_memory: chunks of ≤ 64 GiB).
  double pin_host(void* base, size_t bytes, const std::string& what) override {
    if (bytes == 0) return 0.0;
    std::lock_guard<std::mutex> lock(pin_mutex_);
    LT_CHECK(!pinned_.count(base), "pin_host {}: {} is already pinned", what, base);
    advise_huge_pages(base, bytes);
    const PinnedRegion region = pin_host_memory(base, bytes, what);
    pinned_[base] = region;
    return region.seconds;
  }
  void unpin_host(void* base) override {
    std::lock_guard<std::mutex> lock(pin_mutex_);
    auto it = pinned_.find(base);
    if (it == pinned_.end()) return;
    const PinnedRegion region = it->second;
    pinned_.erase(it);
    unpin_host_memory(region);
  }

  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  std::string name() const override {
    return fmt::format("cuda:{} {}, {} arena", gpu_, gpu_name_, format_bytes(capacity_));
  }

  // Memory: the arena only keeps books, so these touch no CUDA API (and work inside host callbacks).
  void* alloc(size_t bytes, const std::string& tag) override { return arena_->alloc(bytes, tag); }
  void free(void* ptr) override { arena_->free(ptr); }
  DeviceMemoryStats memory() const override { return arena_->stats(); }
  void reset_peak() override { arena_->reset_peak(); }
  std::vector<DeviceTagUsage> live_allocations() const override { return arena_->usage_by_tag(); }

  void copy_h2d(void* dst_device, const void* src_host, size_t bytes, StreamKind stream, const std::string& name,
                int layer) override {
    arena_->check_copy("copy_h2d", name, dst_device, "destination", src_host, "source", bytes);
    copy(dst_device, src_host, bytes, cudaMemcpyHostToDevice, stream, name, layer);
  }

  void copy_d2h(void* dst_host, const void* src_device, size_t bytes, StreamKind stream, const std::string& name,
                int layer) override {
    arena_->check_copy("copy_d2h", name, src_device, "source", dst_host, "destination", bytes);
    copy(dst_host, src_device, bytes, cudaMemcpyDeviceToHost, stream, name, layer);
  }

  // Runs `work` here and now (see the header comment): it enqueues kernels on cuda_native_stream(*this, stream).
  void launch(StreamKind stream, std::function<void()> work, const std::string& name, int layer) override {
    LT_CHECK(bool(work), "launch '{}': empty function", name);
    enter("launch");
    if (failed()) return;
    Timing timing(*this, stream, name, 0, layer);
    cudaGetLastError();  // anything pending was already returned by the call that caused it
    try {
      work();
      LT_CUDA_CHECK(cudaGetLastError(), "launching the kernels of '{}'", name);
    } catch (...) {
      fail(fmt::format("'{}' on the {} stream", name, stream_kind_name(stream)), std::current_exception());
      return;
    }
    timing.commit();
  }

  void host_callback(StreamKind stream, std::function<void()> fn, const std::string& name) override {
    LT_CHECK(bool(fn), "host_callback '{}': empty function", name);
    enter("host_callback");
    if (failed()) return;
    auto call = std::make_unique<HostCall>(HostCall{this, std::move(fn), name, stream});
    Timing timing(*this, stream, name, 0, -1);
    LT_CUDA_CHECK(cudaLaunchHostFunc(native(stream), &run_host_call, call.get()), "host_callback '{}' on the {} stream",
                  name, stream_kind_name(stream));
    call.release();  // run_host_call owns it now
    timing.commit();
  }

  // On the CUDA driver thread, after the stream's earlier work. No CUDA call may happen here.
  void run_callback(const HostCall& call) noexcept {
    if (failed()) return;
    t_in_host_callback = true;
    try {
      call.fn();
    } catch (...) {
      fail(fmt::format("'{}' on the {} stream", call.name, stream_kind_name(call.stream)), std::current_exception());
    }
    t_in_host_callback = false;
  }

  std::unique_ptr<Event> create_event() override {
    enter("create_event");
    return std::make_unique<CudaEvent>(this, gpu_);
  }

  void record(Event& event, StreamKind stream) override {
    enter("record");
    LT_CUDA_CHECK(cudaEventRecord(own(event, "record").handle(), native(stream)), "recording an event on the {} stream",
                  stream_kind_name(stream));
  }

  void wait(StreamKind stream, Event& event) override {
    enter("wait");
    LT_CUDA_CHECK(cudaStreamWaitEvent(native(stream), own(event, "wait").handle(), 0),
                  "the {} stream waiting for an event", stream_kind_name(stream));
  }

  void synchronize(Event& event) override {
    enter("synchronize(event)");
    LT_CUDA_CHECK(cudaEventSynchronize(own(event, "synchronize").handle()), "synchronize(event) on {}", name());
    std::lock_guard<std::mutex> lock(err_mu_);
    if (error_) std::rethrow_exception(error_);
  }

  void synchronize() override {
    enter("synchronize()");
    uint64_t target = 0;
    {
      std::lock_guard<std::mutex> lock(rec_mu_);
      target = submitted_;
    }
    LT_CUDA_CHECK(cudaDeviceSynchronize(), "synchronize() on {}", name());
    wait_delivered(target);
    std::exception_ptr error;
    {
      std::lock_guard<std::mutex> lock(err_mu_);
      error = std::exchange(error_, nullptr);
      failed_.store(false, std::memory_order_release);
    }
    if (error) std::rethrow_exception(error);
  }

  void set_sink(OpSink* sink) override {
    std::lock_guard<std::mutex> lock(sink_mu_);  // the recorder holds it while calling the sink
    sink_.store(sink, std::memory_order_release);
  }

  double now() const override { return seconds_since(epoch_); }

  cudaStream_t native(StreamKind k) const {
    LT_CHECK(uint8_t(k) < kNumStreams, "unknown stream kind {}", int(k));
    return streams_[uint8_t(k)];
  }

 private:
  // Brackets one op with timing events while a sink is set (else does nothing). commit() records the end and
  // hands the op to the recorder; an op that threw before commit gives its events back.
  class Timing {
   public:
    Timing(CudaDevice& dev, StreamKind stream, const std::string& name, size_t bytes, int layer)
        : dev_(dev), stream_(stream) {
      if (dev.sink_.load(std::memory_order_acquire) == nullptr) return;
      op_.record.name = name;
      op_.record.lane = stream_kind_name(stream);
      op_.record.bytes = bytes;
      op_.record.layer = layer;
      try {
        op_.start = dev.pool_.take();
        op_.end = dev.pool_.take();
        LT_CUDA_CHECK(cudaEventRecord(op_.start, dev.native(stream)), "timing '{}' on the {} stream", name,
                      op_.record.lane);
      } catch (...) {  // a throwing constructor runs no destructor: give the events back here
        release();
        throw;
      }
    }
    ~Timing() { release(); }
    Timing(const Timing&) = delete;
    Timing& operator=(const Timing&) = delete;

    void commit() {
      if (op_.start == nullptr) return;
      LT_CUDA_CHECK(cudaEventRecord(op_.end, dev_.native(stream_)), "timing '{}' on the {} stream", op_.record.name,
                    op_.record.lane);
      dev_.submit(std::exchange(op_, TimedOp{}));
    }

   private:
    void release() {
      dev_.pool_.give(std::exchange(op_.start, nullptr));
      dev_.pool_.give(std::exchange(op_.end, nullptr));
    }

    CudaDevice& dev_;
    StreamKind stream_;
    TimedOp op_;
  };

  void allocate_arena(const CudaDeviceOptions& options) {
    size_t free_bytes = 0, total_bytes = 0;
    LT_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo on cuda:{}", gpu_);
    capacity_ = arena_capacity(options, free_bytes, total_bytes);
    LT_CUDA_CHECK(cudaMalloc(&base_, std::max<size_t>(capacity_, 1)), "cudaMalloc of the {} device arena on cuda:{} "
                  "({} free of {})", format_bytes(capacity_), gpu_, format_bytes(free_bytes), format_bytes(total_bytes));
    try {
      arena_ = std::make_unique<DeviceArena>(base_, capacity_);
    } catch (...) {
      cudaFree(base_);
      base_ = nullptr;
      throw;
    }
  }

  // The epoch: an event on an idle stream, and the host instant it was seen complete. Polled rather than
  // synchronized: a blocking-sync wake-up would shift every record by its latency (tens of µs), a poll by
  // about one query. The recorder's first anchor.
  void start_epoch() {
    anchor_ = pool_.take();
    LT_CUDA_CHECK(cudaEventRecord(anchor_, streams_[0]), "recording the epoch event of {}", name());
    cudaError_t status;
    while ((status = cudaEventQuery(anchor_)) == cudaErrorNotReady) {
    }
    epoch_ = Clock::now();
    LT_CUDA_CHECK(status, "waiting for the epoch event of {}", name());
    anchor_s_ = 0;
  }

  // Every public method that calls CUDA: not from a host callback, and on this device (the calling thread
  // may have another current, or none yet).
  void enter(const char* what) const {
    LT_CHECK(!t_in_host_callback,
             "{} called inside a host callback: CUDA forbids CUDA calls there; order the work with record/wait",
             what);
    LT_CUDA_CHECK(cudaSetDevice(gpu_), "{} on cuda:{}", what, gpu_);
  }

  CudaEvent& own(Event& event, const char* what) const {
    auto* e = dynamic_cast<CudaEvent*>(&event);
    LT_CHECK(e != nullptr && e->owner() == this, "{}: the event was not created by this device", what);
    return *e;
  }

  void copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, StreamKind stream, const std::string& name,
            int layer) {
    const char* what = kind == cudaMemcpyHostToDevice ? "copy_h2d" : "copy_d2h";
    enter(what);
    if (failed()) return;
    Timing timing(*this, stream, name, bytes, layer);
    if (bytes > 0)
      LT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, native(stream)), "{} '{}' of {} bytes on the {} stream",
                    what, name, bytes, stream_kind_name(stream));
    timing.commit();
  }

  bool failed() const { return failed_.load(std::memory_order_acquire); }

  void fail(const std::string& context, std::exception_ptr e) {
    std::exception_ptr wrapped = wrap_error(context, fmt::format("cuda:{} device", gpu_), e);
    std::lock_guard<std::mutex> lock(err_mu_);
    if (!error_) error_ = wrapped;
    failed_.store(true, std::memory_order_release);
  }

  // ---- the recorder ----

  void submit(TimedOp op) {
    {
      std::lock_guard<std::mutex> lock(rec_mu_);
      pending_.push_back(std::move(op));
      ++submitted_;
    }
    rec_cv_.notify_all();
  }

  void run_recorder() {
    pthread_setname_np(pthread_self(), "lt-cuda-rec");
    cudaSetDevice(gpu_);
    for (;;) {
      TimedOp op;
      {
        std::unique_lock<std::mutex> lock(rec_mu_);
        rec_cv_.wait(lock, [&] { return !pending_.empty() || stopping_; });
        if (pending_.empty()) return;  // stopping, and everything delivered
        op = std::move(pending_.front());
        pending_.pop_front();
      }
      deliver(op);
      pool_.give(op.start);
      pool_.give(op.end);
      {
        std::lock_guard<std::mutex> lock(rec_mu_);
        ++delivered_;
      }
      rec_cv_.notify_all();
    }
  }

  // Waits for the op's end, times it against the anchor and hands it to the sink (if one is still set).
  void deliver(TimedOp& op) {
    try {
      LT_CUDA_CHECK(cudaEventSynchronize(op.end), "waiting for '{}' on the {} stream", op.record.name, op.record.lane);
      float since_anchor_ms = 0, duration_ms = 0;
      LT_CUDA_CHECK(cudaEventElapsedTime(&since_anchor_ms, anchor_, op.start), "timing '{}'", op.record.name);
      LT_CUDA_CHECK(cudaEventElapsedTime(&duration_ms, op.start, op.end), "timing '{}'", op.record.name);
      op.record.start = anchor_s_ + double(since_anchor_ms) / 1e3;
      op.record.end = op.record.start + double(std::max(duration_ms, 0.0f)) / 1e3;
      if (since_anchor_ms > kReanchorMs) {  // the op's start becomes the anchor; the old one goes to the pool
        std::swap(anchor_, op.start);
        anchor_s_ = op.record.start;
      }
    } catch (...) {
      fail(fmt::format("recording '{}' on the {} stream", op.record.name, op.record.lane), std::current_exception());
      return;
    }
    std::lock_guard<std::mutex> lock(sink_mu_);
    OpSink* sink = sink_.load(std::memory_order_relaxed);
    if (sink == nullptr) return;
    try {
      sink->record(op.record);
    } catch (...) {
      fail(fmt::format("the sink recording '{}' on the {} stream", op.record.name, op.record.lane),
           std::current_exception());
    }
  }

  void wait_delivered(uint64_t target) {
    std::unique_lock<std::mutex> lock(rec_mu_);
    rec_cv_.wait(lock, [&] { return delivered_ >= target; });
  }

  void stop_recorder() {
    {
      std::lock_guard<std::mutex> lock(rec_mu_);
      stopping_ = true;
    }
    rec_cv_.notify_all();
    if (recorder_.joinable()) recorder_.join();
  }

  // Streams, events and the arena (the destructor, or a constructor that failed half-way). Never throws.
  void release() noexcept {
    for (cudaStream_t& s : streams_) {
      if (s) cudaStreamDestroy(s);
      s = nullptr;
    }
    pool_.give(std::exchange(anchor_, nullptr));  // the pool destroys it with the others
    arena_.reset();
    if (base_) cudaFree(base_);
    base_ = nullptr;
    cudaGetLastError();
  }

  const int gpu_;
  std::string gpu_name_;
  size_t capacity_ = 0;
  std::mutex pin_mutex_;
  std::map<void*, PinnedRegion> pinned_;  // pin_host's regions, by base
  void* base_ = nullptr;  // the one cudaMalloc
  std::unique_ptr<DeviceArena> arena_;
  cudaStream_t streams_[kNumStreams] = {};
  EventPool pool_;
  Clock::time_point epoch_;

  std::mutex err_mu_;
  std::exception_ptr error_;  // the first failure, until synchronize() takes it
  std::atomic<bool> failed_{false};

  std::mutex sink_mu_;  // held around every sink call
  std::atomic<OpSink*> sink_{nullptr};

  std::mutex rec_mu_;  // pending_, the counters, stopping_; rec_cv_ signals both directions
  std::condition_variable rec_cv_;
  std::deque<TimedOp> pending_;
  uint64_t submitted_ = 0, delivered_ = 0;
  bool stopping_ = false;
  cudaEvent_t anchor_ = nullptr;  // the recorder's: a completed timing event at device time anchor_s_
  double anchor_s_ = 0;
  std::thread recorder_;
};

void CUDART_CB run_host_call(void* data) {
  std::unique_ptr<HostCall> call(static_cast<HostCall*>(data));
  call->device->run_callback(*call);
}

}  // namespace

std::unique_ptr<Device> make_cuda_device(const CudaDeviceOptions& options) {
  return std::make_unique<CudaDevice>(options);
}

bool is_cuda_device(const Device& device) { return dynamic_cast<const CudaDevice*>(&device) != nullptr; }

void* cuda_native_stream(Device& device, StreamKind stream) {
  auto* cuda = dynamic_cast<CudaDevice*>(&device);
  LT_CHECK(cuda != nullptr, "no {} stream of '{}': not a CUDA device", stream_kind_name(stream), device.name());
  return cuda->native(stream);
}

PinnedRegion pin_host_memory(void* base, size_t bytes, const std::string& what) {
  PinnedRegion region{base, bytes, 0, 0};
  if (bytes == 0) return region;
  LT_CHECK(base != nullptr, "cannot pin {}: a null address for {} bytes", what, bytes);
  const auto chunks = pin_chunks(base, bytes);
  const Clock::time_point t0 = Clock::now();
  for (size_t i = 0; i < chunks.size(); ++i) {
    const auto [ptr, len] = chunks[i];
    try {
      LT_CUDA_CHECK(cudaHostRegister(ptr, len, cudaHostRegisterPortable), "pinning {} ({}): chunk {} of {} ({} at {})",
                    what, format_bytes(bytes), i + 1, chunks.size(), format_bytes(len), ptr);
    } catch (...) {  // leave nothing half-pinned
      for (size_t j = 0; j < i; ++j) cudaHostUnregister(chunks[j].first);
      cudaGetLastError();
      throw;
    }
    ++region.chunks;
  }
  region.seconds = seconds_since(t0);
  return region;
}

void unpin_host_memory(const PinnedRegion& region) {
  if (region.chunks == 0) return;
  const auto chunks = pin_chunks(region.base, region.bytes);
  cudaError_t first_error = cudaSuccess;  // every chunk is tried; the first failure is reported
  size_t failed_chunk = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const cudaError_t status = cudaHostUnregister(chunks[i].first);
    if (status != cudaSuccess && first_error == cudaSuccess) {
      first_error = status;
      failed_chunk = i;
    }
  }
  if (first_error != cudaSuccess) cudaGetLastError();  // reported here; not for a later launch check
  LT_CUDA_CHECK(first_error, "unpinning {} at {}: chunk {} of {}", format_bytes(region.bytes), region.base,
                failed_chunk + 1, chunks.size());
}

}  // namespace lt::cuda
