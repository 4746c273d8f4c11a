// CUDA_CHECK and CUBLAS_CHECK: a failed runtime or cuBLAS call aborts with the call, the library's
// own words for the error, and file and line (core/check.h's convention). Host code only.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

namespace tessera::kernels::cuda::detail {
[[noreturn]] inline void cuda_failed(const char* call, const char* why, const char* file, int line) {
  std::fprintf(stderr, "CUDA call failed: %s at %s:%d: %s\n", call, file, line, why);
  std::fflush(stderr);
  std::abort();
}

// cuBLASLt has no status string of its own (cublasGetStatusString lives in libcublas, which the
// GEMMs do not otherwise need).
inline const char* cublas_status_name(cublasStatus_t st) {
  switch (st) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    default:
      return "cuBLAS error";
  }
}
}  // namespace tessera::kernels::cuda::detail

#define CUDA_CHECK(call)                                                                                 \
  do {                                                                                                   \
    const cudaError_t st_ = (call);                                                                      \
    if (st_ != cudaSuccess)                                                                              \
      ::tessera::kernels::cuda::detail::cuda_failed(#call, cudaGetErrorString(st_), __FILE__, __LINE__); \
  } while (0)

#define CUBLAS_CHECK(call)                                                                                            \
  do {                                                                                                                \
    const cublasStatus_t st_ = (call);                                                                                \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                                                 \
      ::tessera::kernels::cuda::detail::cuda_failed(#call, ::tessera::kernels::cuda::detail::cublas_status_name(st_), \
                                                    __FILE__, __LINE__);                                              \
  } while (0)

// After a kernel launch: a bad configuration shows here, a fault in the kernel at the next sync.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
