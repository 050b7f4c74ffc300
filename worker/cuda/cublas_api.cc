#include "worker/cuda/cublas_api.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <string>

namespace asyncps::worker::internal {
namespace {

std::atomic<bool> loaded{false};

// Resolves `name` into *fn; appends to *missing when it is absent.
template <typename Fn>
void Resolve(void* lib, const char* name, Fn* fn, std::string* missing) {
  *fn = reinterpret_cast<Fn>(dlsym(lib, name));
  if (*fn == nullptr)
    *missing += std::string(missing->empty() ? "" : ", ") + name;
}

StatusOr<CublasApi> Load() {
  std::string tried;
  void* lib = nullptr;
  for (const char* path : {ASYNCPS_CUBLAS_SONAME, ASYNCPS_CUBLAS_PATH}) {
    if (*path == '\0') continue;
    lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) break;
    const char* err = dlerror();
    tried += std::string(tried.empty() ? "" : "; ") + (err ? err : path);
  }
  if (lib == nullptr)
    return Status::Unavailable("cannot load cuBLAS: " + tried);
  CublasApi api;
  std::string missing;
  Resolve(lib, "cublasCreate_v2", &api.create, &missing);
  Resolve(lib, "cublasDestroy_v2", &api.destroy, &missing);
  Resolve(lib, "cublasSetStream_v2", &api.set_stream, &missing);
  Resolve(lib, "cublasSetMathMode", &api.set_math_mode, &missing);
  Resolve(lib, "cublasSgemm_v2", &api.sgemm, &missing);
  if (!missing.empty()) {
    dlclose(lib);
    return Status::Unavailable(std::string("cuBLAS (") + ASYNCPS_CUBLAS_SONAME +
                               ") lacks " + missing);
  }
  return api;
}

}  // namespace

StatusOr<const CublasApi*> LoadCublas() {
  static std::mutex mu;
  static CublasApi api;
  static Status error;  // a failed load is not retried
  std::lock_guard<std::mutex> l(mu);
  if (loaded.load()) return &api;
  if (!error.ok()) return error;
  StatusOr<CublasApi> r = Load();
  if (!r.ok()) {
    error = r.status();
    return error;
  }
  api = *r;
  loaded.store(true);
  return &api;
}

bool CublasLoaded() { return loaded.load(); }

}  // namespace asyncps::worker::internal
