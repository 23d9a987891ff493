// cuda/native/cuda_check.h — every CUDA runtime and cuBLASLt error becomes an lt::Error naming the operation
// (host code of the native backend only; built when LT_WITH_CUDA).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "core/error.h"

// LT_CUDA_CHECK(cudaMalloc(&p, n), "cudaMalloc of {} bytes for '{}'", n, tag)
#define LT_CUDA_CHECK(call, ...)                                                                           \
  do {                                                                                                     \
    const cudaError_t lt_status = (call);                                                                  \
    if (lt_status != cudaSuccess) [[unlikely]]                                                             \
      ::lt::detail::throw_error(__FILE__, __LINE__, #call,                                               \
                                ::fmt::format("{}: CUDA error {} ({})", ::fmt::format(__VA_ARGS__),      \
                                              cudaGetErrorName(lt_status), cudaGetErrorString(lt_status))); \
  } while (0)

#define LT_CUBLAS_CHECK(call, ...)                                                                         \
  do {                                                                                                     \
    const cublasStatus_t lt_status = (call);                                                               \
    if (lt_status != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                                   \
      ::lt::detail::throw_error(__FILE__, __LINE__, #call,                                               \
                                ::fmt::format("{}: cuBLASLt error {} ({})", ::fmt::format(__VA_ARGS__),  \
                                              int(lt_status), cublasLtGetStatusString(lt_status)));      \
  } while (0)
