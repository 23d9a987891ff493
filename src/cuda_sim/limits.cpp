// The emulated GPU's per-block shared-memory limit: the H100's unless a test emulates a smaller GPU.
#include <atomic>

#include "cuda_sim/cuda_sim.h"

namespace lt::cuda_sim {
namespace {

std::atomic<size_t> g_max_dynamic_shared{kMaxDynamicSharedBytes};

}  // namespace

size_t max_dynamic_shared_bytes() { return g_max_dynamic_shared.load(std::memory_order_relaxed); }

SharedMemoryLimit::SharedMemoryLimit(size_t bytes) : saved_(g_max_dynamic_shared.exchange(bytes)) {}
SharedMemoryLimit::~SharedMemoryLimit() { g_max_dynamic_shared.store(saved_); }

}  // namespace lt::cuda_sim
