// The one place where CUDA runtime and cuBLAS error codes become Status.
// Private to worker/cuda; included only by .cu files.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "common/status.h"

namespace asyncps::worker::internal {

inline Status CudaToStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::OK();
  const std::string msg = std::string(what) + ": " + cudaGetErrorName(err) +
                          " (" + cudaGetErrorString(err) + ")";
  if (err == cudaErrorMemoryAllocation) return Status::ResourceExhausted(msg);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
      err == cudaErrorDevicesUnavailable) {
    return Status::Unavailable(msg);
  }
  return Status::Internal(msg);
}

inline Status CublasToStatus(cublasStatus_t err, const char* what) {
  if (err == CUBLAS_STATUS_SUCCESS) return Status::OK();
  const std::string msg =
      std::string(what) + ": cuBLAS status " + std::to_string(int(err));
  if (err == CUBLAS_STATUS_ALLOC_FAILED) return Status::ResourceExhausted(msg);
  if (err == CUBLAS_STATUS_NOT_INITIALIZED) return Status::Unavailable(msg);
  return Status::Internal(msg);
}

}  // namespace asyncps::worker::internal

#define CUDA_RETURN_IF_ERROR(expr) \
  RETURN_IF_ERROR(::asyncps::worker::internal::CudaToStatus((expr), #expr))
#define CUBLAS_RETURN_IF_ERROR(expr) \
  RETURN_IF_ERROR(::asyncps::worker::internal::CublasToStatus((expr), #expr))
