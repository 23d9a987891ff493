// cuda/kernels/async_copy.cuh — global → shared copies that run behind compute: PTX cp.async on sm_80 and later
// (the copy engine of the SM writes shared memory while the warps work on the previous tile), a plain copy
// everywhere else (cuda-sim, where a copy "completes" when issued, so waiting is a no-op).
//
// Use: issue a tile's copies, async_commit() them as one group, and before reading that tile
// async_wait<n>() (at most n newer groups may still be in flight) followed by __syncthreads() (the other
// threads' copies). Copies are of 16 bytes (both addresses 16-byte aligned, .cg: bypassing L1) or 4 bytes;
// a copy marked invalid writes zeros and reads nothing (its source may be any valid address).
#pragma once

#include <cstring>

#include "cuda/kernels/common.cuh"

namespace lt::cuda::LT_KERNELS_NS {

__device__ __forceinline__ void copy16_async(void* shared_dst, const void* global_src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(shared_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(global_src), "r"(valid ? 16 : 0));
#else
  if (valid) std::memcpy(shared_dst, global_src, 16);
  else std::memset(shared_dst, 0, 16);
#endif
}

__device__ __forceinline__ void copy4_async(void* shared_dst, const void* global_src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(shared_dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(global_src), "r"(valid ? 4 : 0));
#else
  if (valid) std::memcpy(shared_dst, global_src, 4);
  else std::memset(shared_dst, 0, 4);
#endif
}

// Closes the group of copies issued since the last commit.
__device__ __forceinline__ void async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Waits until at most `pending` of this thread's committed groups are still in flight.
template <int pending>
__device__ __forceinline__ void async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending));
#endif
}

}  // namespace lt::cuda::LT_KERNELS_NS
