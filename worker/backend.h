// Backend: computes the MLP's loss, gradients and test metrics on a device.
//
// A Backend holds one copy of the model's parameters (see worker/model.h for
// the tensor order) in its own memory, plus persistent scratch buffers, so a
// training step allocates nothing once the largest batch has been seen.
// Implementations: CPU (OpenBLAS sgemm + vectorised loops) and CUDA (cuBLAS
// sgemm + own kernels, built only when the CUDA toolkit was found). No BLAS
// or CUDA type appears in this header.
//
// Thread safety: a Backend is used from one thread at a time.
// Note: the CPU backend sets OpenBLAS's thread count, which is process-wide.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace asyncps::worker {

enum class DeviceKind {
  kAuto,  // CUDA when built with CUDA and a device is visible, else CPU
  kCpu,
  kCuda,
};

// "auto" | "cpu" | "cuda" -> DeviceKind; InvalidArgument otherwise.
StatusOr<DeviceKind> ParseDeviceKind(const std::string& text);

struct BackendOptions {
  std::vector<int> layers;  // MLP sizes, e.g. {784, 256, 128, 10}. Required.
  DeviceKind device = DeviceKind::kAuto;  // Default: auto.
  int threads = 1;  // CPU: OpenBLAS threads (process-wide), >= 1. Default: 1.
  int cuda_device = 0;  // CUDA: device ordinal. Default: 0.
};

// Callbacks of a layered step (Backend::ForwardBackwardLayered), called on
// the calling thread; an error stops the step and is returned by it. Layer
// l (0-based) holds tensors 2l (weight) and 2l+1 (bias), see model.h.
struct LayerHooks {
  // Before layer l's forward, l = 0, 1, ..., L-1: may set the layer's
  // parameters (SetLayerParameters), e.g. once they arrived. Null: none.
  std::function<Status(int layer)> before_forward;
  // Once layer l's gradients are complete in host_grads[2l] and
  // host_grads[2l+1], l = L-1, ..., 0 (backward order): may read (push)
  // them while backward goes on with the layers below. Null: none.
  std::function<Status(int layer)> after_backward;
};

struct EvalResult {
  double loss = 0.0;      // mean softmax cross-entropy
  double accuracy = 0.0;  // fraction of argmax(logits) == label
  int64_t examples = 0;
};

class Backend {
 public:
  // Builds the backend chosen by options.device and logs which one (glog).
  // Requesting kCuda without a CUDA build or visible device: Unavailable.
  static StatusOr<std::unique_ptr<Backend>> Create(
      const BackendOptions& options);

  virtual ~Backend() = default;

  // "cpu" or "cuda:<ordinal> (<device name>)".
  virtual std::string name() const = 0;
  const std::vector<int>& layers() const { return layers_; }
  size_t num_tensors() const { return 2 * (layers_.size() - 1); }
  // Elements of tensor i (model.h order).
  int64_t tensor_elems(size_t i) const;

  // Copies the parameters in (one host buffer per tensor, model.h order and
  // shapes). The caller may reuse the buffers as soon as this returns.
  virtual Status SetParameters(
      const std::vector<const float*>& host_tensors) = 0;

  // One training step's math on `batch` examples: x is batch x layers[0]
  // floats (row-major), y holds labels < layers.back(). Returns the mean
  // cross-entropy and writes the gradients of that mean loss into
  // host_grads (one buffer per tensor). host_grads may be empty on a device
  // backend: the gradients then stay on the device (see device_grad()).
  virtual StatusOr<float> ForwardBackward(
      const float* x, const uint8_t* y, int batch,
      const std::vector<float*>& host_grads) = 0;

  // True when ForwardBackwardLayered and SetLayerParameters are
  // implemented (the CPU and CUDA backends). Default: false.
  virtual bool supports_layered_steps() const { return false; }

  // As ForwardBackward with host gradients (required), calling `hooks`
  // around each layer (LayerHooks); the loss and gradients are bitwise
  // those of ForwardBackward with the same parameters. Default:
  // Unimplemented.
  virtual StatusOr<float> ForwardBackwardLayered(
      const float* x, const uint8_t* y, int batch,
      const std::vector<float*>& host_grads, const LayerHooks& hooks);

  // As SetParameters for layer `layer`'s weight and bias only (host
  // buffers, model.h shapes; reusable once this returns). Default:
  // Unimplemented.
  virtual Status SetLayerParameters(int layer, const float* weight,
                                    const float* bias);

  // Loss and accuracy on n examples with the current parameters (forward
  // only, processed in chunks).
  virtual StatusOr<EvalResult> Evaluate(const float* x, const uint8_t* y,
                                        int64_t n) = 0;

  // Device address of tensor i's gradient from the last ForwardBackward, for
  // on-device gradient compression; nullptr on host backends.
  virtual const float* device_grad(size_t tensor) const { return nullptr; }

 protected:
  explicit Backend(std::vector<int> layers) : layers_(std::move(layers)) {}
  // Shared argument checks for ForwardBackward / SetParameters.
  Status CheckStepArgs(const float* x, const uint8_t* y, int batch,
                       size_t num_grads, bool grads_optional) const;
  Status CheckParams(const std::vector<const float*>& host_tensors) const;
  // ... for ForwardBackwardLayered (every gradient buffer required) and
  // SetLayerParameters.
  Status CheckLayeredStepArgs(const float* x, const uint8_t* y, int batch,
                              const std::vector<float*>& host_grads) const;
  Status CheckLayerParams(int layer, const float* weight,
                          const float* bias) const;

  const std::vector<int> layers_;
};

// Whether this build contains the CUDA backend and how many devices are
// visible (0 without CUDA or without a device).
bool BuiltWithCuda();
int VisibleCudaDevices();

}  // namespace asyncps::worker
