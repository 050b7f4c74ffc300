#include "worker/backend.h"

#include <glog/logging.h>

#include "worker/internal/backends.h"
#include "worker/model.h"

namespace asyncps::worker {

StatusOr<DeviceKind> ParseDeviceKind(const std::string& text) {
  if (text == "auto") return DeviceKind::kAuto;
  if (text == "cpu") return DeviceKind::kCpu;
  if (text == "cuda" || text == "gpu") return DeviceKind::kCuda;
  return Status::InvalidArgument("unknown device '" + text +
                                 "' (want auto, cpu or cuda)");
}

bool BuiltWithCuda() {
#ifdef ASYNCPS_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int VisibleCudaDevices() {
#ifdef ASYNCPS_WITH_CUDA
  return internal::CudaDeviceCount();
#else
  return 0;
#endif
}

StatusOr<std::unique_ptr<Backend>> Backend::Create(
    const BackendOptions& options) {
  RETURN_IF_ERROR(ValidateLayers(options.layers));
  if (options.threads < 1) {
    return Status::InvalidArgument("backend threads must be >= 1, got " +
                                   std::to_string(options.threads));
  }
  DeviceKind kind = options.device;
  if (kind == DeviceKind::kAuto) {
    const int devices = VisibleCudaDevices();
    kind = devices > 0 ? DeviceKind::kCuda : DeviceKind::kCpu;
    LOG(INFO) << "device=auto: "
              << (BuiltWithCuda() ? "" : "built without CUDA, ") << devices
              << " CUDA device(s) visible, using "
              << (kind == DeviceKind::kCuda ? "CUDA" : "CPU");
  }
  std::unique_ptr<Backend> backend;
  if (kind == DeviceKind::kCuda) {
#ifdef ASYNCPS_WITH_CUDA
    if (internal::CudaDeviceCount() < 1) {
      return Status::Unavailable(
          "device=cuda requested but no CUDA device is visible");
    }
    ASSIGN_OR_RETURN(backend, internal::CreateCudaBackend(options));
#else
    return Status::Unavailable(
        "device=cuda requested but this binary was built without CUDA (no "
        "toolkit found at "
        "configure time); use --device=cpu or auto");
#endif
  } else {
    ASSIGN_OR_RETURN(backend, internal::CreateCpuBackend(options));
  }
  LOG(INFO) << "backend: " << backend->name() << ", model "
            << LayersToString(options.layers);
  return backend;
}

int64_t Backend::tensor_elems(size_t i) const {
  const size_t layer = i / 2;
  const int64_t out = layers_[layer + 1];
  return (i % 2 == 0) ? int64_t{layers_[layer]} * out : out;
}

StatusOr<float> Backend::ForwardBackwardLayered(
    const float* x, const uint8_t* y, int batch,
    const std::vector<float*>& host_grads, const LayerHooks& hooks) {
  (void)x, (void)y, (void)batch, (void)host_grads, (void)hooks;
  return Status::Unimplemented("the " + name() +
                               " backend has no layered step (--overlap)");
}

Status Backend::SetLayerParameters(int layer, const float* weight,
                                   const float* bias) {
  (void)layer, (void)weight, (void)bias;
  return Status::Unimplemented("the " + name() +
                               " backend has no layered step (--overlap)");
}

Status Backend::CheckLayeredStepArgs(
    const float* x, const uint8_t* y, int batch,
    const std::vector<float*>& host_grads) const {
  RETURN_IF_ERROR(CheckStepArgs(x, y, batch, host_grads.size(),
                                /*grads_optional=*/false));
  for (const float* g : host_grads) {
    if (g == nullptr) return Status::InvalidArgument("null gradient buffer");
  }
  return Status::OK();
}

Status Backend::CheckLayerParams(int layer, const float* weight,
                                 const float* bias) const {
  if (layer < 0 || static_cast<size_t>(layer) + 1 >= layers_.size()) {
    return Status::InvalidArgument("SetLayerParameters: no layer " +
                                   std::to_string(layer));
  }
  if (weight == nullptr || bias == nullptr)
    return Status::InvalidArgument("SetLayerParameters: null tensor");
  return Status::OK();
}

Status Backend::CheckParams(
    const std::vector<const float*>& host_tensors) const {
  if (host_tensors.size() != num_tensors()) {
    return Status::InvalidArgument(
        "SetParameters: expected " + std::to_string(num_tensors()) +
        " tensors, got " + std::to_string(host_tensors.size()));
  }
  for (size_t i = 0; i < host_tensors.size(); ++i) {
    if (host_tensors[i] == nullptr) {
      return Status::InvalidArgument("SetParameters: tensor " +
                                     std::to_string(i) + " is null");
    }
  }
  return Status::OK();
}

Status Backend::CheckStepArgs(const float* x, const uint8_t* y, int batch,
                              size_t num_grads, bool grads_optional) const {
  if (batch < 1)
    return Status::InvalidArgument("batch must be >= 1, got " +
                                   std::to_string(batch));
  if (x == nullptr || y == nullptr)
    return Status::InvalidArgument("null input or labels");
  if (!(grads_optional && num_grads == 0) && num_grads != num_tensors()) {
    return Status::InvalidArgument("expected " + std::to_string(num_tensors()) +
                                   " gradient buffers, got " +
                                   std::to_string(num_grads));
  }
  const int classes = layers_.back();
  for (int i = 0; i < batch; ++i) {
    if (y[i] >= classes) {
      return Status::InvalidArgument(
          "label " + std::to_string(y[i]) + " at " + std::to_string(i) +
          " is not below the " + std::to_string(classes) + " model outputs");
    }
  }
  return Status::OK();
}

}  // namespace asyncps::worker
