// The emulated GPU's per-block shared-memory limit: the H100's unless a test emulates a smaller GPU.
#include "cuda_sim/cuda_sim.h"

namespace lt::cuda_sim {

ScopedSetting<size_t>& shared_memory_limit() {
  static ScopedSetting<size_t> limit{kMaxDynamicSharedBytes};
  return limit;
}

size_t max_dynamic_shared_bytes() { return shared_memory_limit().get(); }

}  // namespace lt::cuda_sim
