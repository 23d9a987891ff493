#include "core/parallel.h"

#include <algorithm>

#include <omp.h>

#include <exception>
#include <mutex>

#include "core/error.h"

namespace lt {

void set_num_threads(int n) {
  LT_CHECK(n >= 1, "thread count must be at least 1, got {}", n);
  omp_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

bool in_parallel_region() { return omp_in_parallel(); }

void parallel_for(int64_t n_tasks, const std::function<void(int64_t)>& fn, int64_t grain) {
  if (n_tasks <= 0) return;
  if (n_tasks == 1 || omp_in_parallel() || omp_get_max_threads() == 1) {
    for (int64_t t = 0; t < n_tasks; ++t) fn(t);
    return;
  }
  std::exception_ptr error;
  std::mutex error_mutex;
  const int64_t chunk = std::max<int64_t>(grain, 1);
#pragma omp parallel for schedule(dynamic, chunk)
  for (int64_t t = 0; t < n_tasks; ++t) {
    try {
      fn(t);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

void parallel_chunks(int64_t n, int64_t chunk, const std::function<void(int64_t, int64_t)>& fn) {
  LT_CHECK(chunk > 0, "chunk size must be positive");
  int64_t tasks = (n + chunk - 1) / chunk;
  parallel_for(tasks, [&](int64_t t) {
    int64_t b = t * chunk;
    fn(b, b + chunk < n ? b + chunk : n);
  });
}

}  // namespace lt
