// cuda_sim/cuda_sim.h — "cuda-sim": CUDA kernel sources compiled and run on the host CPU, so every kernel
// can be tested here against the CPU ops. A kernel file includes this one header; under nvcc (__CUDACC__)
// the header only adds the two portable macros, on the host it supplies what nvcc would:
//
//   qualifiers        __global__ __device__ __host__ __forceinline__ __launch_bounds__ __align__ __constant__
//   __shared__        static thread_local: a block's threads are fibers on one OS thread and the blocks of a
//                     launch run one after another on it, so the block's threads share one copy
//   built-ins         threadIdx blockIdx blockDim gridDim (uint3 / dim3), warpSize, dim3
//   barriers          __syncthreads (and _count/_and/_or), __syncwarp
//   warp collectives  __shfl_sync __shfl_up_sync __shfl_down_sync __shfl_xor_sync, __ballot_sync __any_sync
//                     __all_sync, __activemask (32-lane warps over the linear thread index)
//   atomics           atomicAdd Sub Max Min CAS Exch (std::atomic_ref, relaxed, as CUDA's)
//   bf16, math       __nv_bfloat16 and its conversions, rsqrtf __expf __logf __fdividef __saturatef __ldg __popc
//                    (cuda_sim/device_math.h; under nvcc <cuda_bf16.h> and CUDA's own)
//   portable macros   LT_DYNAMIC_SHARED(T) (the launch's dynamic shared bytes as T*),
//                     LT_LAUNCH(kernel, grid, block, shared_bytes, stream, args...)
//
// Every thread of a block is a fiber; fibers run one at a time, each until it reaches a synchronisation
// point or exits, in an order chosen per launch (forward by default; reverse or seeded random to expose
// missing barriers). A sync point completes once every thread it names has arrived at the same one (same
// intrinsic, mask and call site); a thread that can never arrive (exited, or waiting elsewhere) ends the
// launch with an lt::Error naming the kernel, block, thread and the lane or thread that is missing.
// Rules for kernel sources and what is not modelled: docs/cuda-sim.md.
#pragma once

#include <cstddef>
#include <cstdint>

#ifdef __CUDACC__

#include <cuda_bf16.h>

// nvcc: the real built-ins. One unsized byte array for the dynamic shared memory of every kernel (one
// declaration per type would clash between instantiations), viewed as T*.
extern __shared__ __align__(16) unsigned char lt_dynamic_shared_bytes[];
#define LT_DYNAMIC_SHARED(T) (reinterpret_cast<T*>(lt_dynamic_shared_bytes))
#define LT_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  kernel<<<(grid), (block), (shared_bytes), (stream)>>>(__VA_ARGS__)

#else  // host compilation: the emulation

#include <atomic>
#include <cstring>
#include <optional>
#include <version>
#if __has_include(<source_location>)
#include <source_location>
#endif
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include "core/scoped_setting.h"
#include "cuda_sim/device_math.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __constant__
// Static shared memory. Valid because a block's threads all run on one OS thread and two blocks of a launch
// never interleave on it; the values a block leaves are what the next block on that OS thread finds (CUDA
// leaves shared memory uninitialised too). `extern __shared__` does not compile: use LT_DYNAMIC_SHARED.
#define __shared__ static thread_local

// CUDA's vector types, unless the CUDA headers already gave them.
#ifndef __VECTOR_TYPES_H__
struct uint3 {
  unsigned int x, y, z;
};
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};
#endif

inline constexpr int warpSize = 32;

namespace lt::cuda_sim {

// The order in which a block's runnable threads run between two synchronisation points (and the order of
// the blocks of a grid). forward: ascending linear index; reverse: descending; random: seeded shuffle; warps:
// warp by warp, each as far as it can go (to its next block-wide barrier) before the next, blocks ascending —
// a warp running ahead of the others past a missing __syncthreads, which the lockstep orders never show.
enum class Order : uint8_t { forward, reverse, random, warps };

constexpr size_t kDefaultStackBytes = 256 * 1024;
// A block's dynamic shared memory may not exceed this (H100/H200's per-block opt-in maximum, 227 KiB;
// beyond 48 KiB the device needs cudaFuncSetAttribute(..., MaxDynamicSharedMemorySize, ...)).
constexpr size_t kMaxDynamicSharedBytes = 227 * 1024;

// The per-block limit launches are held to, and what a launcher asking the device for its opt-in maximum is told:
// kMaxDynamicSharedBytes unless a SharedMemoryLimit emulates a GPU with less.
size_t max_dynamic_shared_bytes();
ScopedSetting<size_t>& shared_memory_limit();
// Within its lifetime (process-wide, not nested across threads), the emulated GPU's per-block limit is `bytes`.
struct SharedMemoryLimit : ScopedSetting<size_t>::Override {
  explicit SharedMemoryLimit(size_t bytes) : Override(shared_memory_limit(), bytes) {}
};

struct Options {
  std::optional<Order> order{};    // unset: the process default (see default_order)
  std::optional<uint64_t> seed{};  // Order::random's seed; unset: the process default's seed
  size_t stack_bytes = kDefaultStackBytes;  // per emulated thread; allocated once per launch
  const char* name = nullptr;    // the kernel's name in errors (LT_LAUNCH passes its spelling)
};

struct OrderSetting {
  Order order = Order::forward;
  uint64_t seed = 0;
};

// The process-wide order used when Options leaves it unset: set_default_order's, else the environment's
// LT_CUDA_SIM_ORDER=forward|reverse|random[:seed] (random without a seed draws one and prints it once to
// stderr), else forward. An invalid LT_CUDA_SIM_ORDER is an lt::Error at the first launch.
OrderSetting default_order();
void set_default_order(OrderSetting setting);
void clear_default_order();  // back to the environment's (or forward)
// Parses LT_CUDA_SIM_ORDER's syntax; lt::Error naming the text when it is not one of the forms above.
OrderSetting parse_order(const std::string& text);
const char* order_name(Order order);

namespace detail {

struct ThreadCtx;  // one emulated thread (simt.cpp)

// The current OS thread's emulated thread and its block, set by the scheduler before it resumes a fiber.
inline thread_local uint3 tl_thread_idx{0, 0, 0};
inline thread_local uint3 tl_block_idx{0, 0, 0};
inline thread_local dim3 tl_block_dim{1, 1, 1};
inline thread_local dim3 tl_grid_dim{1, 1, 1};
inline thread_local unsigned char* tl_dynamic_shared = nullptr;

enum class Collective : uint8_t {
  syncthreads, syncthreads_count, syncthreads_and, syncthreads_or,  // the block's barriers
  syncwarp, shfl_idx, shfl_up, shfl_down, shfl_xor, ballot, any, all  // warp collectives
};

// A call site (LT_SIM_HERE: a defaulted last parameter, so evaluated at the caller). std::source_location where
// the compiler provides it; clang 14 with libstdc++ 12 (the fuzzers' compiler) does not, and there the same from
// clang's builtins, which a default argument also evaluates at the caller.
#if defined(__clang__) && !defined(__cpp_lib_source_location)
struct CallSite {
  const char* file_ = "";
  unsigned line_ = 0, column_ = 0;
  const char* file_name() const { return file_; }
  unsigned line() const { return line_; }
  unsigned column() const { return column_; }
};
#define LT_SIM_CALL_SITE() ::lt::cuda_sim::detail::CallSite{__builtin_FILE(), __builtin_LINE(), __builtin_COLUMN()}
#else
using CallSite = std::source_location;
#define LT_SIM_CALL_SITE() std::source_location::current()
#endif

// The calling thread arrives at a synchronisation point and waits until everyone it names has arrived;
// returns its result (shuffled value bits, ballot, count). `value` holds `value_bytes` (0, 4 or 8) bytes.
uint64_t arrive(Collective kind, unsigned mask, uint64_t value, int value_bytes, int arg, int width,
                const CallSite& where);
unsigned active_mask();
[[noreturn]] void fail_misaligned(const void* address, size_t alignment, const char* op);

template <class T>
T shuffle(Collective kind, unsigned mask, T var, int arg, int width, const CallSite& where) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "warp shuffles move 4- or 8-byte values");
  uint64_t bits = 0;
  std::memcpy(&bits, &var, sizeof(T));
  bits = arrive(kind, mask, bits, int(sizeof(T)), arg, width, where);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

template <class T>
std::atomic_ref<T> atomic_at(T* address, const char* op) {
  if (reinterpret_cast<uintptr_t>(address) % std::atomic_ref<T>::required_alignment != 0) [[unlikely]]
    fail_misaligned(address, std::atomic_ref<T>::required_alignment, op);
  return std::atomic_ref<T>(*address);
}

template <class T>
T atomic_update(T* address, const char* op, auto&& update) {  // CAS loop for max/min
  auto ref = atomic_at(address, op);
  T old = ref.load(std::memory_order_relaxed);
  while (!ref.compare_exchange_weak(old, update(old), std::memory_order_relaxed)) {
  }
  return old;
}

// Type-erased kernel body: calls the kernel with the launch's arguments (each thread gets its own copies).
struct KernelBody {
  void (*call)(const void* self);
  const void* self;
};

void launch_erased(const Options& options, const std::string& name, dim3 grid, dim3 block,
                   size_t dynamic_shared_bytes, KernelBody body);
std::string unnamed_kernel(const std::type_info& type);

}  // namespace detail

// Runs kernel(args...) over the grid and returns when every block has finished (CUDA launches are
// asynchronous; the emulated ones are synchronous). Blocks run one after another on the calling thread.
// Invalid configurations (a dim of 0, more than 1024 threads per block, block.z > 64, grid.y/z > 65535,
// too much dynamic shared memory) and any error inside the kernel are lt::Error naming the kernel.
template <class... P, class... A>
void launch(const Options& options, void (*kernel)(P...), dim3 grid, dim3 block, size_t dynamic_shared_bytes,
            A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "launch: the kernel takes a different number of arguments");
  using Params = std::tuple<std::decay_t<P>...>;
  struct Bound {
    void (*kernel)(P...);
    Params params;
  };
  const Bound bound{kernel, Params(std::forward<A>(args)...)};
  auto call = [](const void* self) {
    const auto& b = *static_cast<const Bound*>(self);
    std::apply(b.kernel, b.params);
  };
  std::string name = options.name ? std::string(options.name) : detail::unnamed_kernel(typeid(kernel));
  detail::launch_erased(options, name, grid, block, dynamic_shared_bytes, detail::KernelBody{call, &bound});
}

template <class... P, class... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t dynamic_shared_bytes, A&&... args) {
  launch(Options{}, kernel, grid, block, dynamic_shared_bytes, std::forward<A>(args)...);
}

}  // namespace lt::cuda_sim

// ---- built-ins ----
#define threadIdx (static_cast<const uint3&>(::lt::cuda_sim::detail::tl_thread_idx))
#define blockIdx (static_cast<const uint3&>(::lt::cuda_sim::detail::tl_block_idx))
#define blockDim (static_cast<const dim3&>(::lt::cuda_sim::detail::tl_block_dim))
#define gridDim (static_cast<const dim3&>(::lt::cuda_sim::detail::tl_grid_dim))

#define LT_DYNAMIC_SHARED(T) (reinterpret_cast<T*>(::lt::cuda_sim::detail::tl_dynamic_shared))
#define LT_LAUNCH(kernel, grid, block, shared_bytes, stream, ...)                                        \
  (static_cast<void>(stream),                                                                            \
   ::lt::cuda_sim::launch(::lt::cuda_sim::Options{.name = #kernel}, kernel, grid, block, shared_bytes \
                              __VA_OPT__(, ) __VA_ARGS__))

// ---- barriers ----
// Each intrinsic takes its call site as a defaulted last parameter: threads meet only at the same one.
#define LT_SIM_HERE const ::lt::cuda_sim::detail::CallSite& lt_where = LT_SIM_CALL_SITE()
#define LT_SIM_ARRIVE(kind, ...) \
  ::lt::cuda_sim::detail::arrive(::lt::cuda_sim::detail::Collective::kind, __VA_ARGS__, lt_where)

inline void __syncthreads(LT_SIM_HERE) { LT_SIM_ARRIVE(syncthreads, ~0u, 0, 0, 0, 0); }
inline int __syncthreads_count(int predicate, LT_SIM_HERE) {
  return int(LT_SIM_ARRIVE(syncthreads_count, ~0u, predicate != 0, 0, 0, 0));
}
inline int __syncthreads_and(int predicate, LT_SIM_HERE) {
  return int(LT_SIM_ARRIVE(syncthreads_and, ~0u, predicate != 0, 0, 0, 0));
}
inline int __syncthreads_or(int predicate, LT_SIM_HERE) {
  return int(LT_SIM_ARRIVE(syncthreads_or, ~0u, predicate != 0, 0, 0, 0));
}
inline void __syncwarp(unsigned mask = 0xffffffffu, LT_SIM_HERE) { LT_SIM_ARRIVE(syncwarp, mask, 0, 0, 0, 0); }

// ---- warp collectives ----
inline unsigned __ballot_sync(unsigned mask, int predicate, LT_SIM_HERE) {
  return unsigned(LT_SIM_ARRIVE(ballot, mask, predicate != 0, 0, 0, 0));
}
inline int __any_sync(unsigned mask, int predicate, LT_SIM_HERE) {
  return int(LT_SIM_ARRIVE(any, mask, predicate != 0, 0, 0, 0));
}
inline int __all_sync(unsigned mask, int predicate, LT_SIM_HERE) {
  return int(LT_SIM_ARRIVE(all, mask, predicate != 0, 0, 0, 0));
}
// The lanes of the caller's warp that exist and had not exited when the current phase began (the last time
// a synchronisation point of the block completed), so the answer does not depend on the thread order. The
// emulation has no divergent branches to leave out: compute masks explicitly (docs/cuda-sim.md).
inline unsigned __activemask() { return ::lt::cuda_sim::detail::active_mask(); }

// One overload per CUDA type, as CUDA declares them, so arguments convert the same way.
#define LT_SIM_SHUFFLES(T)                                                                             \
  inline T __shfl_sync(unsigned mask, T var, int srcLane, int width = warpSize, LT_SIM_HERE) {         \
    return ::lt::cuda_sim::detail::shuffle(::lt::cuda_sim::detail::Collective::shfl_idx, mask, var,    \
                                           srcLane, width, lt_where);                                  \
  }                                                                                                    \
  inline T __shfl_up_sync(unsigned mask, T var, unsigned int delta, int width = warpSize, LT_SIM_HERE) { \
    return ::lt::cuda_sim::detail::shuffle(::lt::cuda_sim::detail::Collective::shfl_up, mask, var,     \
                                           int(delta & 31u), width, lt_where);                         \
  }                                                                                                    \
  inline T __shfl_down_sync(unsigned mask, T var, unsigned int delta, int width = warpSize, LT_SIM_HERE) { \
    return ::lt::cuda_sim::detail::shuffle(::lt::cuda_sim::detail::Collective::shfl_down, mask, var,   \
                                           int(delta & 31u), width, lt_where);                         \
  }                                                                                                    \
  inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = warpSize, LT_SIM_HERE) {    \
    return ::lt::cuda_sim::detail::shuffle(::lt::cuda_sim::detail::Collective::shfl_xor, mask, var,    \
                                           laneMask, width, lt_where);                                 \
  }
LT_SIM_SHUFFLES(int)
LT_SIM_SHUFFLES(unsigned int)
LT_SIM_SHUFFLES(long)
LT_SIM_SHUFFLES(unsigned long)
LT_SIM_SHUFFLES(long long)
LT_SIM_SHUFFLES(unsigned long long)
LT_SIM_SHUFFLES(float)
LT_SIM_SHUFFLES(double)
#undef LT_SIM_SHUFFLES
#undef LT_SIM_ARRIVE
#undef LT_SIM_HERE

// ---- atomics (global and shared memory alike; each returns the old value) ----
#define LT_SIM_ATOMIC(ret, name, T, body)                                                  \
  inline ret name(T* address, T val) {                                                     \
    auto ref = ::lt::cuda_sim::detail::atomic_at(address, #name);                          \
    body;                                                                                  \
  }
LT_SIM_ATOMIC(int, atomicAdd, int, return ref.fetch_add(val, std::memory_order_relaxed))
LT_SIM_ATOMIC(unsigned int, atomicAdd, unsigned int, return ref.fetch_add(val, std::memory_order_relaxed))
LT_SIM_ATOMIC(unsigned long long, atomicAdd, unsigned long long,
              return ref.fetch_add(val, std::memory_order_relaxed))
LT_SIM_ATOMIC(float, atomicAdd, float, return ref.fetch_add(val, std::memory_order_relaxed))
LT_SIM_ATOMIC(double, atomicAdd, double, return ref.fetch_add(val, std::memory_order_relaxed))
LT_SIM_ATOMIC(int, atomicSub, int, return ref.fetch_sub(val, std::memory_order_relaxed))
LT_SIM_ATOMIC(unsigned int, atomicSub, unsigned int, return ref.fetch_sub(val, std::memory_order_relaxed))
LT_SIM_ATOMIC(int, atomicExch, int, return ref.exchange(val, std::memory_order_relaxed))
LT_SIM_ATOMIC(unsigned int, atomicExch, unsigned int, return ref.exchange(val, std::memory_order_relaxed))
LT_SIM_ATOMIC(unsigned long long, atomicExch, unsigned long long,
              return ref.exchange(val, std::memory_order_relaxed))
LT_SIM_ATOMIC(float, atomicExch, float, return ref.exchange(val, std::memory_order_relaxed))
#undef LT_SIM_ATOMIC

#define LT_SIM_ATOMIC_MINMAX(name, T, pick)                                                              \
  inline T name(T* address, T val) {                                                                     \
    return ::lt::cuda_sim::detail::atomic_update(address, #name, [val](T old) { return pick; });         \
  }
LT_SIM_ATOMIC_MINMAX(atomicMax, int, old < val ? val : old)
LT_SIM_ATOMIC_MINMAX(atomicMax, unsigned int, old < val ? val : old)
LT_SIM_ATOMIC_MINMAX(atomicMax, unsigned long long, old < val ? val : old)
LT_SIM_ATOMIC_MINMAX(atomicMin, int, val < old ? val : old)
LT_SIM_ATOMIC_MINMAX(atomicMin, unsigned int, val < old ? val : old)
LT_SIM_ATOMIC_MINMAX(atomicMin, unsigned long long, val < old ? val : old)
#undef LT_SIM_ATOMIC_MINMAX

#define LT_SIM_ATOMIC_CAS(T)                                                                   \
  inline T atomicCAS(T* address, T compare, T val) {                                           \
    T expected = compare;                                                                      \
    ::lt::cuda_sim::detail::atomic_at(address, "atomicCAS")                                    \
        .compare_exchange_strong(expected, val, std::memory_order_relaxed);                    \
    return expected; /* the old value whether or not it was swapped */                         \
  }
LT_SIM_ATOMIC_CAS(int)
LT_SIM_ATOMIC_CAS(unsigned int)
LT_SIM_ATOMIC_CAS(unsigned long long)
#undef LT_SIM_ATOMIC_CAS

// Memory fences: the emulated threads of a block share one OS thread; these order against other launches.
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_signal_fence(std::memory_order_seq_cst); }

#endif  // __CUDACC__
