// cuda/devices.cpp — query_cuda(): the CUDA runtime's view of the machine, or "not built".
#include "cuda/devices.h"

#include <fmt/format.h>

#include <cstdlib>
#include <sstream>

#if LT_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace lt::cuda {
namespace {

#if LT_WITH_CUDA
std::string version_name(int v) { return v > 0 ? fmt::format("{}.{}", v / 1000, (v % 1000) / 10) : ""; }

// SASS for its exact architecture, or PTX of an architecture ≤ its own (the driver JIT-compiles it).
bool supported(int major, int minor, const std::string& architectures) {
  std::stringstream list(architectures);
  const int cc = major * 10 + minor;
  for (std::string item; std::getline(list, item, ',');)
    if (std::atoi(item.c_str()) <= cc) return true;  // PTX is embedded for every listed architecture
  return false;
}
#endif

}  // namespace

CudaInventory query_cuda() {
  CudaInventory inv;
#if LT_WITH_CUDA
  inv.built = true;
  inv.architectures = LT_CUDA_ARCHITECTURES;
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);  // 0 without a driver
  inv.runtime_version = version_name(runtime);
  inv.driver_version = version_name(driver);
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    inv.error = driver == 0 ? fmt::format("no NVIDIA driver on this machine ({})", cudaGetErrorName(status))
                            : fmt::format("{} ({})", cudaGetErrorString(status), cudaGetErrorName(status));
    cudaGetLastError();  // clear it
    return inv;
  }
  for (int i = 0; i < count; ++i) {
    GpuInfo g;
    g.index = i;
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
      inv.error = fmt::format("cudaGetDeviceProperties({}) failed", i);
      cudaGetLastError();
      continue;
    }
    g.name = prop.name;
    g.total_bytes = prop.totalGlobalMem;
    g.cc_major = prop.major, g.cc_minor = prop.minor;
    g.multiprocessors = prop.multiProcessorCount;
    char bus[32] = {};
    if (cudaDeviceGetPCIBusId(bus, sizeof(bus), i) == cudaSuccess) g.pci_bus_id = bus;
    size_t free_bytes = 0, total = 0;
    if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free_bytes, &total) == cudaSuccess)
      g.free_bytes = free_bytes;
    cudaGetLastError();
    g.supported = supported(g.cc_major, g.cc_minor, inv.architectures);
    inv.devices.push_back(g);
  }
#else
  inv.error = "this lazytrain was built without nvcc (the CUDA backend is built wherever CMake finds nvcc)";
#endif
  return inv;
}

}  // namespace lt::cuda
