// LocalParameterStore: a ParameterStore that keeps the weights in this
// process and applies each pushed gradient immediately with an in-process
// optimizer (SGD with optional momentum / Nesterov and weight decay, the
// same update rule as PyTorch's torch.optim.SGD). Staleness is always 0.
//
// Weights start from InitializeTensorRange(spec, ...), exactly the values a
// parameter server initialises the same specs with.
//
// Thread safety: all methods may be called concurrently (one mutex), so
// several in-process trainers may share one store (asynchronous SGD: each
// push is applied when it arrives, pulls never wait).
#pragma once

#include <memory>
#include <vector>

#include "common/layout.h"
#include "common/mutex.h"
#include "worker/parameter_store.h"

namespace asyncps::worker {

struct SgdOptions {
  // Learning rate, > 0. Default: 0.05.
  float lr = 0.05f;
  // In [0, 1). Default: 0.9.
  float momentum = 0.9f;
  // Nesterov momentum (needs momentum > 0). Default: false.
  bool nesterov = false;
  // L2 coefficient added to the gradient, >= 0. Default: 0.
  float weight_decay = 0.0f;
  // Cosine learning-rate decay: push number t (0-based) uses
  //   lr * (f + (1 - f) * (1 + cos(pi * min(t, decay_steps) / decay_steps)) /
  //   2)
  // with f = final_lr_fraction. 0 = constant lr. Default: 0.
  int64_t decay_steps = 0;
  // In [0, 1]. Default: 0.
  float final_lr_fraction = 0.0f;
};

Status ValidateSgdOptions(const SgdOptions& options);

// The learning rate SgdOptions gives push number `step` (see decay_steps).
float ScheduledLr(const SgdOptions& options, int64_t step);

// One SGD step on n elements (PyTorch semantics):
//   g += wd * w;  v = mu * v + g;
//   step = nesterov ? g + mu * v : v;  w -= lr * step
// With momentum 0, `velocity` is not touched and may be null.
void SgdUpdate(const SgdOptions& options, const float* grad, size_t n,
               float* weights, float* velocity);

class LocalParameterStore final : public ParameterStore {
 public:
  static StatusOr<std::unique_ptr<LocalParameterStore>> Create(
      std::vector<TensorSpec> specs, const SgdOptions& options);

  Status Pull(int64_t clock, const std::vector<float*>& tensors) override;
  Status Push(int64_t clock, const std::vector<const float*>& grads) override;
  Status Clock(int64_t new_clock) override;
  TrafficStats traffic() const override;

  const std::vector<TensorSpec>& specs() const { return specs_; }
  // Pushes applied so far.
  int64_t version() const;

 private:
  LocalParameterStore(std::vector<TensorSpec> specs, const SgdOptions& options);
  Status CheckCount(size_t n, const char* what) const;

  const std::vector<TensorSpec> specs_;
  const SgdOptions options_;
  mutable Mutex mu_;
  std::vector<std::vector<float>> weights_ GUARDED_BY(mu_);
  std::vector<std::vector<float>> velocity_ GUARDED_BY(mu_);
  TrafficStats traffic_ GUARDED_BY(mu_);
  int64_t version_ GUARDED_BY(mu_) = 0;
  int64_t clock_ GUARDED_BY(mu_) = 0;
};

}  // namespace asyncps::worker
