// device/device.h — the accelerator as LazyTrain sees it, modelled on CUDA's semantics so a CUDA device
// maps one to one:
//
//   Device::alloc / free            cudaMalloc / cudaFree (hard capacity; over budget is an lt::Error)
//   Stream (compute, h2d, d2h)      cudaStream_t; work on one stream runs in order
//   Device::copy_h2d / copy_d2h     cudaMemcpyAsync(..., cudaMemcpyHostToDevice / DeviceToHost, stream)
//   Device::launch(stream, fn)      a kernel launch on the stream (on the CPU device: fn runs there)
//   Event record / wait / sync      cudaEventRecord / cudaStreamWaitEvent / cudaEventSynchronize
//   Device::synchronize()           cudaDeviceSynchronize
//
// Every operation carries a name ("fwd L3", "h2d W3", ...) and its bytes, so the trace and the
// per-step summary can say what ran where and for how long.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace lt {

enum class StreamKind : uint8_t { compute = 0, h2d = 1, d2h = 2 };
constexpr int kNumStreams = 3;
const char* stream_kind_name(StreamKind k);  // "compute", "h2d", "d2h"

// One completed operation, as the trace and the step summary see it. Times in seconds since the
// device's epoch (steady clock).
struct OpRecord {
  std::string name;
  std::string lane;     // "compute", "h2d", "d2h" (or "nvme", "optimizer" from host-side recorders)
  double start = 0, end = 0;
  size_t bytes = 0;
  int layer = -1;
  // For waits on the compute stream: how long the stream was blocked, and on which lane's event.
  std::string waited_on;
};

// Receives every completed operation (thread-safe implementations only; called from stream threads).
class OpSink {
 public:
  virtual ~OpSink() = default;
  virtual void record(const OpRecord& op) = 0;
};

// An event: records a point in one stream's work; other streams (or the host) wait for it.
// Re-recording an event moves it to the new point, as in CUDA.
class Event {
 public:
  virtual ~Event() = default;
  virtual bool query() const = 0;  // cudaEventQuery: true once the recorded work has completed
};

struct DeviceMemoryStats {
  size_t capacity = 0;   // bytes the device may hand out
  size_t in_use = 0;
  size_t peak = 0;       // high-water mark since the last reset_peak()
  size_t allocations = 0;
  size_t largest_free = 0;  // the biggest request that would succeed now (fragmentation shows as
                            // largest_free < capacity - in_use)
};

// Live device memory of one tag (the `tag` given to alloc), for "where did device memory go" reports.
struct DeviceTagUsage {
  std::string tag;
  size_t bytes = 0;   // as reserved (each block rounded up to the 256-byte alignment)
  size_t blocks = 0;
};

struct LinkSpec {
  double h2d_gbps = 0;      // GB/s (1e9 bytes/s); 0 = unlimited (a plain memcpy)
  double d2h_gbps = 0;
  double latency_s = 0;     // added to every copy
};

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;

  // Memory (alignment 256 bytes, as cudaMalloc's). Over budget: lt::Error naming the request, the tag,
  // the bytes in use and the budget.
  virtual void* alloc(size_t bytes, const std::string& tag) = 0;
  virtual void free(void* ptr) = 0;
  virtual DeviceMemoryStats memory() const = 0;
  virtual void reset_peak() = 0;
  // Live memory per tag, largest first. Optional (default: empty).
  virtual std::vector<DeviceTagUsage> live_allocations() const { return {}; }

  // Asynchronous work, in order on each stream. `name`/`layer` label it for the trace.
  virtual void copy_h2d(void* dst_device, const void* src_host, size_t bytes, StreamKind stream,
                        const std::string& name, int layer = -1) = 0;
  virtual void copy_d2h(void* dst_host, const void* src_device, size_t bytes, StreamKind stream,
                        const std::string& name, int layer = -1) = 0;
  virtual void launch(StreamKind stream, std::function<void()> work, const std::string& name, int layer = -1) = 0;

  // Events.
  virtual std::unique_ptr<Event> create_event() = 0;
  virtual void record(Event& event, StreamKind stream) = 0;
  virtual void wait(StreamKind stream, Event& event) = 0;  // the stream waits; the host does not
  virtual void synchronize(Event& event) = 0;              // the host waits
  virtual void synchronize() = 0;                          // the host waits for every stream
  // Host work ordered on a stream (cudaLaunchHostFunc): runs after prior work on the stream.
  virtual void host_callback(StreamKind stream, std::function<void()> fn, const std::string& name) = 0;

  // Host memory the streams copy to or from, page-locked so copies run as DMA and overlap with compute (a GPU
  // copies pageable memory through a driver buffer, and an h2d copy then returns only once staged, which would
  // hold up the issuing thread). Returns the seconds it took. The CPU device has nothing to do. unpin_host
  // (by the same base) before the memory is freed; a device unpins what is left when destroyed.
  virtual double pin_host(void* base, size_t bytes, const std::string& what) {
    (void)base, (void)bytes, (void)what;
    return 0.0;
  }
  virtual void unpin_host(void* base) { (void)base; }

  // Observability: every completed operation goes to the sink (nullptr to stop).
  virtual void set_sink(OpSink* sink) = 0;
  // Seconds since the device's epoch, on the clock the OpRecords use.
  virtual double now() const = 0;
  // A fatal error in any stream's work (e.g. an exception from a launched function) is rethrown by the
  // next synchronize() (the CPU device: also by synchronize(event); synchronize() then clears it).
};

// The CPU device: an emulated accelerator. Its memory is a separate arena of `capacity` bytes; each
// stream is a thread running its queue in order; copies take the time the given link would take.
// Its exact semantics (emulated copy timeline, wait records, errors, shutdown) are in cpu_device.cpp.
std::unique_ptr<Device> make_cpu_device(size_t capacity, LinkSpec link = {});

// A few lines for users: capacity, in use, peak, largest free block, then live memory per tag.
std::string format_memory_report(const Device& device);
// "1.50 GiB", "12.0 MiB", "512 B" (binary units, three significant figures).
std::string format_bytes(size_t bytes);

}  // namespace lt
