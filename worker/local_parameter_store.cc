#include "worker/local_parameter_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

namespace asyncps::worker {

Status ValidateSgdOptions(const SgdOptions& o) {
  if (!(o.lr > 0.0f) || !std::isfinite(o.lr)) {
    return Status::InvalidArgument("learning rate must be > 0, got " +
                                   std::to_string(o.lr));
  }
  if (!(o.momentum >= 0.0f && o.momentum < 1.0f)) {
    return Status::InvalidArgument("momentum must be in [0, 1), got " +
                                   std::to_string(o.momentum));
  }
  if (o.nesterov && o.momentum == 0.0f) {
    return Status::InvalidArgument("nesterov needs momentum > 0");
  }
  if (!(o.weight_decay >= 0.0f) || !std::isfinite(o.weight_decay)) {
    return Status::InvalidArgument("weight decay must be >= 0, got " +
                                   std::to_string(o.weight_decay));
  }
  if (o.decay_steps < 0) {
    return Status::InvalidArgument("decay_steps must be >= 0");
  }
  if (!(o.final_lr_fraction >= 0.0f && o.final_lr_fraction <= 1.0f)) {
    return Status::InvalidArgument("final_lr_fraction must be in [0, 1]");
  }
  return Status::OK();
}

float ScheduledLr(const SgdOptions& o, int64_t step) {
  if (o.decay_steps <= 0) return o.lr;
  const double t =
      static_cast<double>(std::min(step, o.decay_steps)) / o.decay_steps;
  const double f = o.final_lr_fraction;
  return static_cast<float>(o.lr *
                            (f + (1.0 - f) * 0.5 * (1.0 + std::cos(M_PI * t))));
}

void SgdUpdate(const SgdOptions& o, const float* __restrict grad, size_t n,
               float* __restrict w, float* __restrict v) {
  const float lr = o.lr, mu = o.momentum, wd = o.weight_decay;
  if (mu == 0.0f) {
    for (size_t i = 0; i < n; ++i) w[i] -= lr * (grad[i] + wd * w[i]);
  } else if (o.nesterov) {
    for (size_t i = 0; i < n; ++i) {
      const float g = grad[i] + wd * w[i];
      const float vi = mu * v[i] + g;
      v[i] = vi;
      w[i] -= lr * (g + mu * vi);
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      const float g = grad[i] + wd * w[i];
      const float vi = mu * v[i] + g;
      v[i] = vi;
      w[i] -= lr * vi;
    }
  }
}

LocalParameterStore::LocalParameterStore(std::vector<TensorSpec> specs,
                                         const SgdOptions& options)
    : specs_(std::move(specs)), options_(options) {}

StatusOr<std::unique_ptr<LocalParameterStore>> LocalParameterStore::Create(
    std::vector<TensorSpec> specs, const SgdOptions& options) {
  RETURN_IF_ERROR(ValidateSgdOptions(options));
  if (specs.empty())
    return Status::InvalidArgument("LocalParameterStore needs tensors");
  for (const auto& s : specs) {
    if (s.num_elements() < 1) {
      return Status::InvalidArgument("tensor '" + s.name + "' has no elements");
    }
  }
  std::unique_ptr<LocalParameterStore> store(
      new LocalParameterStore(std::move(specs), options));
  MutexLock lock(&store->mu_);  // not shared yet: for the analysis
  for (const auto& s : store->specs_) {
    store->weights_.emplace_back(s.num_elements());
    InitializeTensorRange(s, 0, store->weights_.back().size(),
                          store->weights_.back().data());
    store->velocity_.emplace_back(
        options.momentum > 0.0f ? s.num_elements() : 0, 0.0f);
  }
  return store;
}

Status LocalParameterStore::CheckCount(size_t n, const char* what) const {
  if (n != specs_.size()) {
    return Status::InvalidArgument(std::string(what) + ": expected " +
                                   std::to_string(specs_.size()) +
                                   " tensors, got " + std::to_string(n));
  }
  return Status::OK();
}

Status LocalParameterStore::Pull(int64_t clock,
                                 const std::vector<float*>& tensors) {
  RETURN_IF_ERROR(CheckCount(tensors.size(), "Pull"));
  MutexLock lock(&mu_);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i] == nullptr)
      return Status::InvalidArgument("Pull: null tensor buffer");
    std::memcpy(tensors[i], weights_[i].data(),
                weights_[i].size() * sizeof(float));
    traffic_.bytes_pulled += weights_[i].size() * sizeof(float);
  }
  return Status::OK();
}

Status LocalParameterStore::Push(int64_t clock,
                                 const std::vector<const float*>& grads) {
  RETURN_IF_ERROR(CheckCount(grads.size(), "Push"));
  for (const float* g : grads) {
    if (g == nullptr)
      return Status::InvalidArgument("Push: null gradient buffer");
  }
  MutexLock lock(&mu_);
  SgdOptions step_options = options_;
  step_options.lr = ScheduledLr(options_, version_);
  for (size_t i = 0; i < grads.size(); ++i) {
    SgdUpdate(step_options, grads[i], weights_[i].size(), weights_[i].data(),
              velocity_[i].empty() ? nullptr : velocity_[i].data());
    traffic_.bytes_pushed_raw += weights_[i].size() * sizeof(float);
    traffic_.bytes_pushed_wire += weights_[i].size() * sizeof(float);
  }
  traffic_.last_staleness = 0;
  ++version_;
  return Status::OK();
}

Status LocalParameterStore::Clock(int64_t new_clock) {
  if (new_clock < 0) {
    return Status::InvalidArgument("negative clock " +
                                   std::to_string(new_clock));
  }
  // Several in-process workers may share this store (the interface carries
  // no rank), so clocks only move the maximum forward.
  MutexLock lock(&mu_);
  clock_ = std::max(clock_, new_clock);
  return Status::OK();
}

TrafficStats LocalParameterStore::traffic() const {
  MutexLock lock(&mu_);
  return traffic_;
}

int64_t LocalParameterStore::version() const {
  MutexLock lock(&mu_);
  return version_;
}

}  // namespace asyncps::worker
