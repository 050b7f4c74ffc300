// Private to compression/cuda: the one place where CUDA runtime errors
// become Status, and a grow-only device allocation. Included only by .cu
// files.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace asyncps::compression::internal {

inline Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::OK();
  std::string m = std::string(what) + ": " + cudaGetErrorName(e) + ": " +
                  cudaGetErrorString(e);
  cudaGetLastError();  // clear sticky-free errors
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
    return Status::Unavailable(m);
  }
  if (e == cudaErrorMemoryAllocation) return Status::ResourceExhausted(m);
  return Status::Internal(m);
}

inline constexpr int kThreads = 256;

// Grid size of a grid-stride loop over n elements (at least 1 block).
inline unsigned Blocks(uint64_t n) {
  const uint64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65536 * 16 ? (b == 0 ? 1 : b) : 65536 * 16);
}

// Grow-only device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  Status Reserve(size_t bytes) {
    if (bytes <= cap_) return Status::OK();
    if (p_) cudaFree(p_);
    p_ = nullptr;
    cap_ = 0;
    RETURN_IF_ERROR(CudaStatus(cudaMalloc(&p_, bytes), "cudaMalloc"));
    cap_ = bytes;
    return Status::OK();
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  size_t cap_ = 0;
};

}  // namespace asyncps::compression::internal

#define CUDA_RETURN_IF_ERROR(expr) \
  RETURN_IF_ERROR(::asyncps::compression::internal::CudaStatus((expr), #expr))
