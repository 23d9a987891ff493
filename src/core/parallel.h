// core/parallel.h — deterministic parallel loops.
//
// Work is cut into a fixed number of tasks chosen by the caller from the problem size, never from the
// thread count; each task writes disjoint outputs, and reductions combine per-task partials in task
// order. So results are bit-identical whatever the number of threads (OpenMP underneath).
#pragma once

#include <cstdint>
#include <functional>

namespace lt {

// Threads used by parallel_for and the kernels (default: OMP_NUM_THREADS or the core count).
void set_num_threads(int n);
int num_threads();

// Runs fn(task) for task in [0, n_tasks), spread over the threads. fn must not throw across tasks;
// an exception in any task is rethrown here after all tasks end. Threads take `grain` consecutive tasks at
// a time (which thread runs a task never changes its result): a streaming kernel then keeps reading on
// from where it was, and the hardware prefetcher stays ahead of it.
void parallel_for(int64_t n_tasks, const std::function<void(int64_t task)>& fn, int64_t grain = 1);

// Splits [0, n) into chunks of `chunk` (the last may be shorter) and runs fn(begin, end) per chunk.
void parallel_chunks(int64_t n, int64_t chunk, const std::function<void(int64_t begin, int64_t end)>& fn);

// True inside a parallel_for task (kernels then run their inner work single-threaded).
bool in_parallel_region();

}  // namespace lt
