#include "server/optimizer/optimizer.h"

#include <cmath>
#include <cstdio>

namespace asyncps::server {
namespace {

#define ASYNCPS_RESTRICT __restrict__

// Every update loop gets an AVX2 clone picked at load time where the CPU has
// it (baseline x86-64 builds use SSE2 only). The clones run the same IEEE
// operations: -ffp-contract=off (ISO C++) keeps a * b + c two roundings, and
// this file is built with -fno-math-errno so sqrt vectorises (sqrtps is
// correctly rounded, like sqrtf).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(ASYNCPS_NO_IFUNC)
#define ASYNCPS_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define ASYNCPS_CLONES
#endif

// The loops take pointers already offset to the range's first element.

ASYNCPS_CLONES void SgdStep(float* ASYNCPS_RESTRICT w,
                            const float* ASYNCPS_RESTRICT g, size_t n,
                            float a) {
  for (size_t i = 0; i < n; ++i) w[i] -= a * g[i];
}

ASYNCPS_CLONES void SgdDecayStep(float* ASYNCPS_RESTRICT w,
                                 const float* ASYNCPS_RESTRICT g, size_t n,
                                 float a, float wd) {
  for (size_t i = 0; i < n; ++i) w[i] -= a * (g[i] + wd * w[i]);
}

ASYNCPS_CLONES void MomentumStep(float* ASYNCPS_RESTRICT w,
                                 float* ASYNCPS_RESTRICT v,
                                 const float* ASYNCPS_RESTRICT g, size_t n,
                                 float a, float mu, float wd) {
  for (size_t i = 0; i < n; ++i) {
    const float vi = mu * v[i] + (g[i] + wd * w[i]);
    v[i] = vi;
    w[i] -= a * vi;
  }
}

ASYNCPS_CLONES void NesterovStep(float* ASYNCPS_RESTRICT w,
                                 float* ASYNCPS_RESTRICT v,
                                 const float* ASYNCPS_RESTRICT g, size_t n,
                                 float a, float mu, float wd) {
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i] + wd * w[i];
    const float vi = mu * v[i] + gi;
    v[i] = vi;
    w[i] -= a * (gi + mu * vi);
  }
}

struct AdamCoefficients {
  float b1, b2, ob1, ob2, c1, c2, eps, wd;
};

ASYNCPS_CLONES void AdamStep(float* ASYNCPS_RESTRICT w,
                             float* ASYNCPS_RESTRICT m,
                             float* ASYNCPS_RESTRICT v,
                             const float* ASYNCPS_RESTRICT g, size_t n,
                             const AdamCoefficients k) {
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i] + k.wd * w[i];
    const float mi = k.b1 * m[i] + k.ob1 * gi;
    const float vi = k.b2 * v[i] + k.ob2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    w[i] -= k.c1 * mi / (std::sqrt(vi * k.c2) + k.eps);
  }
}

ASYNCPS_CLONES void AdaGradStep(float* ASYNCPS_RESTRICT w,
                                float* ASYNCPS_RESTRICT h,
                                const float* ASYNCPS_RESTRICT g, size_t n,
                                float a, float wd, float eps) {
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i] + wd * w[i];
    const float hi = h[i] + gi * gi;
    h[i] = hi;
    w[i] -= a * gi / (std::sqrt(hi) + eps);
  }
}

class Sgd final : public Optimizer {
 public:
  explicit Sgd(const OptimizerOptions& o) : Optimizer(o) {}
  size_t state_per_elem() const override { return 0; }
  bool exact_sparse() const override { return options_.weight_decay == 0.0f; }

  void ApplyRange(float* w, float* /*state*/, const float* g, size_t /*n*/,
                  size_t begin, size_t end, float lr_scale,
                  uint64_t /*step*/) const override {
    const float a = options_.lr * lr_scale;
    const float wd = options_.weight_decay;
    if (wd == 0.0f) {
      SgdStep(w + begin, g + begin, end - begin, a);
    } else {
      SgdDecayStep(w + begin, g + begin, end - begin, a, wd);
    }
  }
};

class Momentum final : public Optimizer {
 public:
  explicit Momentum(const OptimizerOptions& o) : Optimizer(o) {}
  size_t state_per_elem() const override { return 1; }

  // v = mu v + g';  w -= lr v  (heavy ball)  or  w -= lr (g' + mu v) (Nesterov)
  void ApplyRange(float* w, float* v, const float* g, size_t /*n*/,
                  size_t begin, size_t end, float lr_scale,
                  uint64_t /*step*/) const override {
    const float a = options_.lr * lr_scale;
    const float mu = options_.momentum;
    const float wd = options_.weight_decay;
    if (options_.nesterov) {
      NesterovStep(w + begin, v + begin, g + begin, end - begin, a, mu, wd);
    } else {
      MomentumStep(w + begin, v + begin, g + begin, end - begin, a, mu, wd);
    }
  }
};

class Adam final : public Optimizer {
 public:
  explicit Adam(const OptimizerOptions& o) : Optimizer(o) {}
  size_t state_per_elem() const override { return 2; }

  // state = [m(0..n), v(0..n)].
  void ApplyRange(float* w, float* state, const float* g, size_t n,
                  size_t begin, size_t end, float lr_scale,
                  uint64_t step) const override {
    AdamCoefficients k;
    k.b1 = options_.beta1;
    k.b2 = options_.beta2;
    k.eps = options_.eps;
    k.wd = options_.weight_decay;
    const double t = static_cast<double>(step == 0 ? 1 : step);
    k.c1 = static_cast<float>(options_.lr * lr_scale /
                              (1.0 - std::pow(double{k.b1}, t)));
    k.c2 = static_cast<float>(1.0 / (1.0 - std::pow(double{k.b2}, t)));
    k.ob1 = 1.0f - k.b1;
    k.ob2 = 1.0f - k.b2;
    AdamStep(w + begin, state + begin, state + n + begin, g + begin,
             end - begin, k);
  }
};

class AdaGrad final : public Optimizer {
 public:
  explicit AdaGrad(const OptimizerOptions& o) : Optimizer(o) {}
  size_t state_per_elem() const override { return 1; }

  void ApplyRange(float* w, float* h, const float* g, size_t /*n*/,
                  size_t begin, size_t end, float lr_scale,
                  uint64_t /*step*/) const override {
    AdaGradStep(w + begin, h + begin, g + begin, end - begin,
                options_.lr * lr_scale, options_.weight_decay, options_.eps);
  }
};

#undef ASYNCPS_RESTRICT
#undef ASYNCPS_CLONES

}  // namespace

const char* OptimizerKindName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kMomentum:
      return "momentum";
    case OptimizerKind::kAdam:
      return "adam";
    case OptimizerKind::kAdaGrad:
      return "adagrad";
  }
  return "invalid";
}

StatusOr<OptimizerKind> ParseOptimizerKind(std::string_view name) {
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "momentum") return OptimizerKind::kMomentum;
  if (name == "adam") return OptimizerKind::kAdam;
  if (name == "adagrad") return OptimizerKind::kAdaGrad;
  return Status::InvalidArgument("unknown optimizer '" + std::string(name) +
                                 "' (valid: sgd, momentum, adam, adagrad)");
}

Status OptimizerOptions::Validate() const {
  if (!(lr > 0.0f) || !std::isfinite(lr))
    return Status::InvalidArgument("lr must be > 0");
  if (!(momentum >= 0.0f && momentum < 1.0f)) {
    return Status::InvalidArgument("momentum must be in [0, 1)");
  }
  if (!(weight_decay >= 0.0f) || !std::isfinite(weight_decay)) {
    return Status::InvalidArgument("weight_decay must be >= 0");
  }
  if (!(beta1 >= 0.0f && beta1 < 1.0f))
    return Status::InvalidArgument("beta1 must be in [0, 1)");
  if (!(beta2 >= 0.0f && beta2 < 1.0f))
    return Status::InvalidArgument("beta2 must be in [0, 1)");
  if (!(eps > 0.0f) || !std::isfinite(eps))
    return Status::InvalidArgument("eps must be > 0");
  if (static_cast<int>(kind) > 3)
    return Status::InvalidArgument("unknown optimizer kind");
  return Status::OK();
}

std::string OptimizerOptions::ToString() const {
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "%s lr=%g momentum=%g nesterov=%d weight_decay=%g beta1=%g "
                "beta2=%g eps=%g",
                OptimizerKindName(kind), lr, momentum, nesterov ? 1 : 0,
                weight_decay, beta1, beta2, eps);
  return buf;
}

void Optimizer::ApplySparse(float* w, const uint32_t* idx, const float* vals,
                            size_t k, float lr_scale) const {
  const float a = options_.lr * lr_scale;
  for (size_t i = 0; i < k; ++i) w[idx[i]] -= a * vals[i];
}

StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(
    const OptimizerOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  switch (options.kind) {
    case OptimizerKind::kSgd:
      return std::unique_ptr<Optimizer>(new Sgd(options));
    case OptimizerKind::kMomentum:
      return std::unique_ptr<Optimizer>(new Momentum(options));
    case OptimizerKind::kAdam:
      return std::unique_ptr<Optimizer>(new Adam(options));
    case OptimizerKind::kAdaGrad:
      return std::unique_ptr<Optimizer>(new AdaGrad(options));
  }
  return Status::InvalidArgument("unknown optimizer kind");
}

}  // namespace asyncps::server
