// Factories of the concrete backends; private to worker/. Backend::Create()
// picks one of them.
#pragma once

#include <memory>

#include "worker/backend.h"

namespace asyncps::worker::internal {

StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(
    const BackendOptions& options);

#ifdef ASYNCPS_WITH_CUDA
// Defined in worker/cuda/cuda_backend.cu.
StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(
    const BackendOptions& options);
int CudaDeviceCount();
#endif

}  // namespace asyncps::worker::internal
