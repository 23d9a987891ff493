// cuda/cuda_device.h — the CUDA device behind device/device.h, and the host-memory helpers it needs.
//
// make_cuda_device() gives a Device whose memory is one cudaMalloc (a DeviceArena keeps the books, so the
// budget, tags and refusals are the CPU device's), whose streams are cudaStreams and whose events are
// cudaEvents. Its contract, and where it differs from the CPU device (launch runs its function on the
// calling thread; blocking waits are not reported), is in cuda/native/cuda_device.cpp.
//
// In a build without nvcc (LT_WITH_CUDA undefined or 0) every function here but advise_huge_pages throws an
// lt::Error saying so, so callers need no #if of their own.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "device/device.h"

namespace lt::cuda {

struct CudaDeviceOptions {
  int gpu = 0;                            // the CUDA device index
  size_t capacity = 0;                    // bytes of the arena; 0 = all free memory minus reserve_bytes
  size_t reserve_bytes = size_t(1) << 30; // left to the CUDA context, cuBLASLt and other processes (capacity 0)
};

// lt::Error naming the reason when there is no usable GPU (no driver, no such device, built without nvcc,
// not enough free memory).
std::unique_ptr<Device> make_cuda_device(const CudaDeviceOptions& options);

// Whether `device` is a CUDA device (make_cuda_device); false in a build without nvcc.
bool is_cuda_device(const Device& device);

// The cudaStream_t behind `stream` of a CUDA device, for kernel launchers (cuda/kernels.h: Stream = void*)
// called from a launch() function. lt::Error if `device` is not a CUDA device.
void* cuda_native_stream(Device& device, StreamKind stream);

// Page-locked host memory, so copies run as DMA and overlap with compute (pageable memory is staged
// through a driver buffer, and an h2d copy from it returns only once staged).
struct PinnedRegion {
  void* base = nullptr;
  size_t bytes = 0;
  double seconds = 0;  // how long the registration took (pinning 100s of GiB takes seconds: worth reporting)
  int chunks = 0;      // cudaHostRegister calls made
};

// cudaHostRegister of [base, base + bytes) in chunks of at most 64 GiB (one huge registration fails on
// recent drivers), the chunk boundaries on page boundaries so no page is registered twice. A failure
// unregisters what was registered and throws an lt::Error naming `what`, the chunk and the CUDA error.
// bytes 0: nothing registered.
PinnedRegion pin_host_memory(void* base, size_t bytes, const std::string& what);
// Unregisters every chunk (all are tried); lt::Error naming the region and the first CUDA error.
void unpin_host_memory(const PinnedRegion& region);

// madvise(MADV_HUGEPAGE) over the whole pages of [base, base + bytes): host slabs of many GiB then take
// fewer TLB entries and pin faster. Works in every build; false when the kernel refuses (or no whole page).
bool advise_huge_pages(void* base, size_t bytes);

}  // namespace lt::cuda
