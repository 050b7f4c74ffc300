// cuBLAS, loaded with dlopen() when the first CUDA backend is made instead
// of linked: libcublas's own start-up (the relocations and static
// initialisers of libcublasLt) costs about 0.3 s of CPU time, which every
// ps_worker and ps_train_local paid at start before, on machines without a
// GPU too. Private to worker/cuda.
#pragma once

#include <cublas_v2.h>

#include "common/status.h"

namespace asyncps::worker::internal {

// The cuBLAS entry points the CUDA backend calls (the _v2 API that
// cublas_v2.h maps the plain names to).
struct CublasApi {
  decltype(&::cublasCreate_v2) create;
  decltype(&::cublasDestroy_v2) destroy;
  decltype(&::cublasSetStream_v2) set_stream;
  decltype(&::cublasSetMathMode) set_math_mode;
  decltype(&::cublasSgemm_v2) sgemm;
};

// Loads cuBLAS once (the SONAME of the toolkit built against, then the
// library's path at configure time) and resolves every entry point;
// Unavailable naming the library and dlerror() when it cannot. Thread-safe;
// the library stays loaded.
StatusOr<const CublasApi*> LoadCublas();

// Whether a LoadCublas() call has loaded it in this process.
bool CublasLoaded();

}  // namespace asyncps::worker::internal
