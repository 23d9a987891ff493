// cuda/cuda_device.cpp — the parts of cuda/cuda_device.h that exist in every build: advise_huge_pages, and
// (without nvcc) the functions that say the CUDA backend is not built. With nvcc the CUDA ones are in
// cuda/native/cuda_device.cpp.
#include "cuda/cuda_device.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

#include "core/error.h"

namespace lt::cuda {

bool advise_huge_pages(void* base, size_t bytes) {
  const long page_size = ::sysconf(_SC_PAGESIZE);
  const auto page = uintptr_t(page_size > 0 ? page_size : 4096);
  const auto begin = reinterpret_cast<uintptr_t>(base);
  if (base == nullptr || bytes == 0 || begin > UINTPTR_MAX - bytes) return false;
  // madvise wants a page-aligned start; advise only the whole pages inside the range.
  const uintptr_t first = (begin + page - 1) / page * page;
  const uintptr_t last = (begin + bytes) / page * page;
  if (last <= first) return false;
  return ::madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE) == 0;
}

#if !LT_WITH_CUDA

namespace {
constexpr const char* kNotBuilt =
    "this lazytrain was built without nvcc (the CUDA backend is built wherever CMake finds nvcc)";
}  // namespace

std::unique_ptr<Device> make_cuda_device(const CudaDeviceOptions& options) {
  LT_FAIL("cannot open CUDA device {}: {}", options.gpu, kNotBuilt);
}

bool is_cuda_device(const Device&) { return false; }

void* cuda_native_stream(Device& device, StreamKind stream) {
  LT_FAIL("no {} stream of '{}': not a CUDA device ({})", stream_kind_name(stream), device.name(), kNotBuilt);
}

PinnedRegion pin_host_memory(void* base, size_t bytes, const std::string& what) {
  LT_FAIL("cannot pin {} ({} bytes at {}): {}", what, bytes, base, kNotBuilt);
}

void unpin_host_memory(const PinnedRegion& region) {
  if (region.chunks == 0) return;  // nothing was registered (pin_host_memory cannot succeed in this build)
  LT_FAIL("cannot unpin {} bytes at {}: {}", region.bytes, region.base, kNotBuilt);
}

#endif  // !LT_WITH_CUDA

}  // namespace lt::cuda
