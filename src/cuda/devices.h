// cuda/devices.h — what `lazytrain devices` reports about CUDA: whether this binary has the CUDA backend, the
// runtime and driver, and every GPU the driver shows (name, memory, compute capability).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace lt::cuda {

struct GpuInfo {
  int index = 0;
  std::string name;
  size_t total_bytes = 0, free_bytes = 0;
  int cc_major = 0, cc_minor = 0;  // compute capability
  int multiprocessors = 0;
  std::string pci_bus_id;
  bool supported = false;  // this build has code for it (SASS for its architecture, or PTX it can JIT)
};

struct CudaInventory {
  bool built = false;          // the binary was built with nvcc (LT_WITH_CUDA)
  std::string architectures;   // the built architectures (SASS and PTX), "80,86,89,90"
  std::string runtime_version; // "13.0"
  std::string driver_version;  // "13.0", or "" without a driver
  std::vector<GpuInfo> devices;
  std::string error;           // why no devices were listed (no driver, ...), else ""
};

// Asks the CUDA runtime (cheap; creates no context beyond what cudaGetDeviceProperties/cudaMemGetInfo need).
CudaInventory query_cuda();

}  // namespace lt::cuda
