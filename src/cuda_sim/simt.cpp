// The SIMT scheduler: a launch's blocks one after another on the calling thread, each block's threads as
// fibers (Boost.Context) on stacks mapped once per launch. A block runs in phases: every ready thread runs,
// in the launch's order, until it arrives at a synchronisation point or exits; then every point that all
// its threads have reached completes and releases them into the next phase. A phase with nobody ready and
// nothing to complete is a divergence (an exited or elsewhere-waiting thread) and ends the launch.
#include <sys/mman.h>
#include <unistd.h>

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "cuda_sim/simt_internal.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define LT_SIM_ASAN 1
#else
#define LT_SIM_ASAN 0
#endif

namespace lt::cuda_sim::detail {
namespace {

namespace ctx = boost::context;

// The running thread and its block, for arrive() and __activemask().
thread_local ThreadCtx* tl_thread = nullptr;
thread_local ThreadCtx* tl_block_threads = nullptr;
thread_local unsigned tl_block_size = 0;
// The scheduler's stack, as AddressSanitizer reported it when the first fiber started.
thread_local const void* tl_sched_stack_bottom = nullptr;
thread_local size_t tl_sched_stack_size = 0;

// AddressSanitizer must be told about every switch between stacks (no-ops otherwise). `fake_stack`
// nullptr on the way out of a fiber that is ending.
void asan_start_switch([[maybe_unused]] void** fake_stack, [[maybe_unused]] const void* bottom,
                       [[maybe_unused]] size_t size) {
#if LT_SIM_ASAN
  __sanitizer_start_switch_fiber(fake_stack, bottom, size);
#endif
}
void asan_finish_switch([[maybe_unused]] void* fake_stack, [[maybe_unused]] const void** bottom_old,
                        [[maybe_unused]] size_t* size_old) {
#if LT_SIM_ASAN
  __sanitizer_finish_switch_fiber(fake_stack, bottom_old, size_old);
#endif
}

// One mapping for all of a launch's stacks, each with an inaccessible guard page below it so an overflow
// faults instead of writing into the neighbour. MAP_NORESERVE: only the pages a thread touches cost memory.
class Stacks {
 public:
  Stacks(size_t count, size_t bytes) : count_(count) {
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    bytes_ = (bytes + page - 1) / page * page;
    stride_ = bytes_ + page;
    total_ = count_ * stride_;
    void* p = mmap(nullptr, total_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    LT_CHECK(p != MAP_FAILED, "cuda-sim: cannot map {} fiber stacks of {} bytes", count_, bytes_);
    base_ = static_cast<char*>(p);
#if LT_SIM_ASAN
    // The shadow of an earlier launch's stacks at these addresses may still mark the redzones of frames that
    // never returned (Boost's fiber entry): clear it, or the first frame laid over one is a false report.
    __asan_unpoison_memory_region(base_, total_);
#endif
    for (size_t i = 0; i < count_; ++i) mprotect(base_ + i * stride_, page, PROT_NONE);
    guard_ = page;
  }
  ~Stacks() { munmap(base_, total_); }
  Stacks(const Stacks&) = delete;
  Stacks& operator=(const Stacks&) = delete;

  char* bottom(size_t i) const { return base_ + i * stride_ + guard_; }
  size_t bytes() const { return bytes_; }

 private:
  size_t count_, bytes_ = 0, stride_ = 0, total_ = 0, guard_ = 0;
  char* base_ = nullptr;
};

// Hands Boost.Context one slice of Stacks; the slice outlives the fiber, so deallocate does nothing.
struct SliceStack {
  char* bottom;
  size_t bytes;
  ctx::stack_context allocate() {
    ctx::stack_context s;
    s.size = bytes;
    s.sp = bottom + bytes;
    return s;
  }
  void deallocate(ctx::stack_context&) noexcept {}
};

// Inside a thread: back to the scheduler until it resumes us (or destroys us: forced_unwind).
void switch_to_scheduler(ThreadCtx& t) {
  asan_start_switch(&t.asan_fake_stack, tl_sched_stack_bottom, tl_sched_stack_size);
  try {
    t.sched = std::move(t.sched).resume();
  } catch (const ctx::detail::forced_unwind&) {
    asan_finish_switch(t.asan_fake_stack, nullptr, nullptr);
    throw;
  }
  asan_finish_switch(t.asan_fake_stack, nullptr, nullptr);
}

class Launch {
 public:
  Launch(const Options& options, const std::string& name, dim3 grid, dim3 block, size_t shared_bytes,
         KernelBody body)
      : name_(name), grid_(grid), block_(block), body_(body), rng_(0) {
    check_config(shared_bytes);
    const OrderSetting fallback = options.order && options.seed ? OrderSetting{} : default_order();
    order_ = options.order.value_or(fallback.order);
    seed_ = options.seed.value_or(fallback.seed);
    rng_ = Rng(seed_);
    LT_CHECK(options.stack_bytes >= 16 * 1024, "cuda-sim: kernel '{}': stack_bytes {} is below 16 KiB", name_,
             options.stack_bytes);
    n_ = block.x * block.y * block.z;
    stacks_ = std::make_unique<Stacks>(n_, options.stack_bytes);
    threads_.resize(n_);
    for (unsigned i = 0; i < n_; ++i) {
      ThreadCtx& t = threads_[i];
      t.linear = i;
      t.idx = uint3{i % block.x, i / block.x % block.y, i / (block.x * block.y)};
      t.stack_bottom = stacks_->bottom(i);
      t.stack_size = stacks_->bytes();
    }
    shared_bytes_ = shared_bytes;
    if (shared_bytes > 0)
      shared_.reset(static_cast<unsigned char*>(std::aligned_alloc(256, (shared_bytes + 255) / 256 * 256)));
  }

  void run() {
    struct Restore {  // the built-ins read as outside a kernel again, however the launch ends
      ~Restore() {
        tl_thread_idx = uint3{0, 0, 0};
        tl_block_idx = uint3{0, 0, 0};
        tl_block_dim = dim3{};
        tl_grid_dim = dim3{};
        tl_dynamic_shared = nullptr;
        tl_thread = nullptr;
        tl_block_threads = nullptr;
        tl_block_size = 0;
      }
    } restore;
    tl_block_dim = block_;
    tl_grid_dim = grid_;
    tl_dynamic_shared = shared_.get();
    tl_block_threads = threads_.data();
    tl_block_size = n_;

    const uint64_t blocks = uint64_t(grid_.x) * grid_.y * grid_.z;
    std::vector<uint64_t> permutation;
    if (order_ == Order::random) {
      permutation.resize(blocks);
      std::iota(permutation.begin(), permutation.end(), uint64_t{0});
      shuffle(permutation);
    }
    for (uint64_t k = 0; k < blocks; ++k) {
      uint64_t b = order_ == Order::reverse ? blocks - 1 - k : order_ == Order::random ? permutation[k] : k;
      run_block(uint3{unsigned(b % grid_.x), unsigned(b / grid_.x % grid_.y),
                      unsigned(b / (uint64_t(grid_.x) * grid_.y))});
    }
  }

 private:
  void check_config(size_t shared_bytes) const {
    LT_CHECK(block_.x > 0 && block_.y > 0 && block_.z > 0, "cuda-sim: kernel '{}': block {} has a dimension of 0",
             name_, format_index(block_));
    LT_CHECK(grid_.x > 0 && grid_.y > 0 && grid_.z > 0, "cuda-sim: kernel '{}': grid {} has a dimension of 0", name_,
             format_index(grid_));
    const uint64_t threads = uint64_t(block_.x) * block_.y * block_.z;
    LT_CHECK(threads <= 1024, "cuda-sim: kernel '{}': block {} has {} threads; CUDA allows at most 1024", name_,
             format_index(block_), threads);
    LT_CHECK(block_.z <= 64, "cuda-sim: kernel '{}': block {} exceeds CUDA's per-dimension limits (1024, 1024, 64)",
             name_, format_index(block_));
    LT_CHECK(grid_.x <= 2147483647u && grid_.y <= 65535 && grid_.z <= 65535,
             "cuda-sim: kernel '{}': grid {} exceeds CUDA's limits (2^31-1, 65535, 65535)", name_, format_index(grid_));
    LT_CHECK(shared_bytes <= max_dynamic_shared_bytes(),
             "cuda-sim: kernel '{}': {} bytes of dynamic shared memory exceed the per-block maximum of {}", name_,
             shared_bytes, max_dynamic_shared_bytes());
  }

  template <class T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng_.below(i)]);
  }

  // The phase order of the threads that are ready (given ascending). warps: only the lowest warp with ready
  // threads runs this phase; the others' turn is deferred (marked ready, so that release() does not resolve
  // their point again), so each warp runs as far as it can before the next one starts.
  void order_ready() {
    if (order_ == Order::reverse) std::reverse(ready_.begin(), ready_.end());
    if (order_ == Order::random) shuffle(ready_);
    if (order_ == Order::warps) {
      ready_.insert(ready_.end(), deferred_.begin(), deferred_.end());
      std::sort(ready_.begin(), ready_.end());
      const unsigned warp = ready_.front() / 32;
      const auto later = std::find_if(ready_.begin(), ready_.end(), [&](unsigned i) { return i / 32 != warp; });
      deferred_.assign(later, ready_.end());
      ready_.erase(later, ready_.end());
      for (unsigned i : deferred_) threads_[i].state = ThreadState::ready;
    }
  }

  void run_block(uint3 block_idx) {
    block_idx_ = block_idx;
    tl_block_idx = block_idx;
    // Fresh dynamic shared memory reads as NaN / -1, never as a previous block's values or zeros.
    if (shared_) std::memset(shared_.get(), 0xff, shared_bytes_);
    for (ThreadCtx& t : threads_) {
      t.state = ThreadState::ready;
      t.started = false;
      t.gone = false;
      t.result = 0;
    }
    ready_.resize(n_);
    std::iota(ready_.begin(), ready_.end(), 0u);
    deferred_.clear();
    order_ready();
    unsigned exited = 0;
    while (true) {
      for (ThreadCtx& t : threads_) t.gone = t.state == ThreadState::exited;
      for (unsigned i : ready_) {
        resume(threads_[i]);
        if (failed_) abort(threads_[i], failure_message_, failure_where_);
        exited += threads_[i].state == ThreadState::exited;
      }
      if (exited == n_) return;
      ready_.clear();
      release();
      if (ready_.empty() && deferred_.empty()) fail_stuck();
      order_ready();
    }
  }

  void resume(ThreadCtx& t) {
    if (!t.started) {
      t.started = true;
      t.self = ctx::fiber(std::allocator_arg, SliceStack{t.stack_bottom, t.stack_size},
                          [this, &t](ctx::fiber&& sched) { return thread_main(t, std::move(sched)); });
    }
    t.state = ThreadState::ready;
    tl_thread_idx = t.idx;
    tl_thread = &t;
    asan_start_switch(&sched_fake_stack_, t.stack_bottom, t.stack_size);
    t.self = std::move(t.self).resume();
    asan_finish_switch(sched_fake_stack_, nullptr, nullptr);
    tl_thread = nullptr;
  }

  ctx::fiber thread_main(ThreadCtx& t, ctx::fiber&& sched) {
    asan_finish_switch(nullptr, &tl_sched_stack_bottom, &tl_sched_stack_size);
    t.sched = std::move(sched);
    try {
      body_.call(body_.self);
    } catch (const ctx::detail::forced_unwind&) {  // the launch is being abandoned: let Boost unwind us
      asan_start_switch(nullptr, tl_sched_stack_bottom, tl_sched_stack_size);
      throw;
    } catch (const Error& e) {
      record_failure(e.what(), e.where());
    } catch (const std::exception& e) {
      record_failure(e.what(), "");
    } catch (...) {
      record_failure("an exception that is not a std::exception", "");
    }
    t.state = ThreadState::exited;
    asan_start_switch(nullptr, tl_sched_stack_bottom, tl_sched_stack_size);
    return std::move(t.sched);
  }

  void record_failure(std::string message, std::string where) {
    failed_ = true;
    failure_message_ = std::move(message);
    failure_where_ = std::move(where);
  }

  // Completes every point that all its threads have reached; their threads become ready (ascending).
  void release() {
    for (unsigned base = 0; base < n_; base += 32) {
      const unsigned present = std::min(32u, n_ - base);
      const unsigned present_mask = present == 32 ? ~0u : (1u << present) - 1;
      ThreadCtx* warp = &threads_[base];
      unsigned done = 0;
      for (unsigned lane = 0; lane < present; ++lane) {
        const ThreadCtx& t = warp[lane];
        if (t.state != ThreadState::waiting || !is_warp_collective(t.at.kind) || (done >> lane & 1u)) continue;
        const unsigned mask = t.at.mask;
        bool complete = (mask & ~present_mask) == 0;
        for (unsigned m = mask; complete && m; m &= m - 1) {
          const ThreadCtx& u = warp[__builtin_ctz(m)];
          complete = u.state == ThreadState::waiting && same_point(u.at, t.at);
        }
        if (!complete) continue;
        resolve_warp(warp, mask);
        done |= mask;
      }
      for (unsigned m = done; m; m &= m - 1) ready_.push_back(base + unsigned(__builtin_ctz(m)));
    }
    if (!ready_.empty()) return;
    const ThreadCtx& first = threads_[0];
    if (first.state != ThreadState::waiting || is_warp_collective(first.at.kind)) return;
    for (const ThreadCtx& u : threads_)
      if (u.state != ThreadState::waiting || !same_point(u.at, first.at)) return;
    resolve_block(threads_.data(), n_);
    for (unsigned i = 0; i < n_; ++i) ready_.push_back(i);
  }

  // Nobody is ready and no point can complete: explain why the lowest waiting thread waits forever.
  [[noreturn]] void fail_stuck() {
    auto waiting = std::find_if(threads_.begin(), threads_.end(),
                                [](const ThreadCtx& t) { return t.state == ThreadState::waiting; });
    ThreadCtx& t = *waiting;
    std::string why;
    if (!is_warp_collective(t.at.kind)) {
      for (const ThreadCtx& u : threads_) {
        if (u.state == ThreadState::waiting && same_point(u.at, t.at)) continue;
        why = u.state == ThreadState::exited
                  ? fmt::format("thread {} has exited without reaching it", format_index(u.idx))
                  : fmt::format("thread {} waits at {}", format_index(u.idx), describe(u.at));
        break;
      }
      why += "; every thread of a block must reach the same barrier";
    } else {
      const unsigned base = t.linear / 32 * 32, present = std::min(32u, n_ - base);
      for (unsigned m = t.at.mask; m; m &= m - 1) {
        const unsigned lane = unsigned(__builtin_ctz(m));
        if (lane >= present) {
          why = fmt::format("its mask names lane {}, which does not exist (this warp has {} lanes)", lane, present);
          break;
        }
        const ThreadCtx& u = threads_[base + lane];
        if (u.state == ThreadState::waiting && same_point(u.at, t.at)) continue;
        why = u.state == ThreadState::exited
                  ? fmt::format("its mask names lane {} (thread {}), which has exited", lane, format_index(u.idx))
                  : fmt::format("its mask names lane {} (thread {}), which waits at {}", lane, format_index(u.idx),
                                describe(u.at));
        break;
      }
    }
    abort(t, fmt::format("waits forever at {}: {}", describe(t.at), why), "");
  }

  // Ends the launch: unwinds every suspended thread (their destructors run) and throws.
  [[noreturn]] void abort(const ThreadCtx& culprit, const std::string& message, std::string where) {
    for (ThreadCtx& t : threads_) {
      if (!t.self) continue;
      asan_start_switch(&sched_fake_stack_, t.stack_bottom, t.stack_size);
      t.self = ctx::fiber{};
      asan_finish_switch(sched_fake_stack_, nullptr, nullptr);
    }
    std::string order;
    if (order_ == Order::reverse) order = " [order reverse]";
    if (order_ == Order::warps) order = " [order warps]";
    if (order_ == Order::random) order = fmt::format(" [order random, seed {}]", seed_);
    throw Error(fmt::format("cuda-sim: kernel '{}' block {} thread {}: {}{}", name_, format_index(block_idx_),
                            format_index(culprit.idx), message, order),
                where.empty() ? std::string("src/cuda_sim/simt.cpp") : std::move(where));
  }

  struct FreeDeleter {
    void operator()(unsigned char* p) const { std::free(p); }
  };

  std::string name_;
  dim3 grid_, block_;
  KernelBody body_;
  Order order_ = Order::forward;
  uint64_t seed_ = 0;
  Rng rng_;
  unsigned n_ = 0;  // threads per block
  std::unique_ptr<Stacks> stacks_;
  std::vector<ThreadCtx> threads_;
  std::vector<unsigned> ready_;
  std::vector<unsigned> deferred_;  // Order::warps: ready, their warp's turn still to come
  std::unique_ptr<unsigned char, FreeDeleter> shared_;
  size_t shared_bytes_ = 0;
  uint3 block_idx_{0, 0, 0};
  bool failed_ = false;
  std::string failure_message_, failure_where_;
  void* sched_fake_stack_ = nullptr;
};

}  // namespace

uint64_t arrive(Collective kind, unsigned mask, uint64_t value, int value_bytes, int arg, int width,
                const CallSite& where) {
  ThreadCtx* t = tl_thread;
  LT_CHECK(t != nullptr, "cuda-sim: {} called outside a kernel launched by cuda-sim", collective_name(kind));
  Arrival a{kind, mask, value_bytes, arg, width, value, where.file_name(), where.line(), where.column()};
  if (is_warp_collective(kind)) {
    const unsigned lane = t->linear % 32;
    LT_CHECK(mask >> lane & 1u, "cuda-sim: {}: the mask must name the calling lane {}", describe(a), lane);
  }
  if (is_shuffle(kind)) {
    LT_CHECK(width >= 1 && width <= 32 && (width & (width - 1)) == 0,
             "cuda-sim: {}: width must be a power of 2 from 1 to 32", describe(a));
  }
  t->at = a;
  t->state = ThreadState::waiting;
  switch_to_scheduler(*t);
  return t->result;
}

unsigned active_mask() {
  ThreadCtx* t = tl_thread;
  LT_CHECK(t != nullptr, "cuda-sim: __activemask called outside a kernel launched by cuda-sim");
  const unsigned base = t->linear / 32 * 32, present = std::min(32u, tl_block_size - base);
  unsigned mask = 0;
  for (unsigned lane = 0; lane < present; ++lane)
    if (!tl_block_threads[base + lane].gone) mask |= 1u << lane;
  return mask;
}

void fail_misaligned(const void* address, size_t alignment, const char* op) {
  LT_FAIL("cuda-sim: {} on address {} that is not {}-byte aligned", op, address, alignment);
}

void launch_erased(const Options& options, const std::string& name, dim3 grid, dim3 block,
                   size_t dynamic_shared_bytes, KernelBody body) {
  LT_CHECK(tl_thread == nullptr, "cuda-sim: kernel '{}' launched from inside a kernel (dynamic parallelism is not "
           "emulated)", name);
  Launch(options, name, grid, block, dynamic_shared_bytes, body).run();
}

std::string unnamed_kernel(const std::type_info& type) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(abi::__cxa_demangle(type.name(), nullptr, nullptr, &status),
                                                   std::free);
  return fmt::format("unnamed kernel of type {}", status == 0 && demangled ? demangled.get() : type.name());
}

}  // namespace lt::cuda_sim::detail
