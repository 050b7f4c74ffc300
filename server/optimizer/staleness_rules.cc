#include "server/optimizer/staleness_rules.h"

#include <cmath>
#include <cstdio>

namespace asyncps::server {

const char* StalenessLrName(StalenessLr rule) {
  switch (rule) {
    case StalenessLr::kNone:
      return "none";
    case StalenessLr::kOnePlus:
      return "one_plus";
    case StalenessLr::kInverse:
      return "inverse";
  }
  return "invalid";
}

StatusOr<StalenessLr> ParseStalenessLr(std::string_view name) {
  if (name == "none" || name == "false" || name == "0")
    return StalenessLr::kNone;
  if (name == "one_plus" || name == "true" || name == "1")
    return StalenessLr::kOnePlus;
  if (name == "inverse") return StalenessLr::kInverse;
  return Status::InvalidArgument(
      "unknown staleness learning-rate rule '" + std::string(name) +
      "' (valid: none, one_plus = lr/(1+s), inverse = lr/s as Zhang et al.)");
}

float StalenessLrScale(StalenessLr rule, uint64_t staleness) {
  switch (rule) {
    case StalenessLr::kNone:
      return 1.0f;
    case StalenessLr::kOnePlus:
      return 1.0f / (1.0f + static_cast<float>(staleness));
    case StalenessLr::kInverse:
      return staleness <= 1 ? 1.0f : 1.0f / static_cast<float>(staleness);
  }
  return 1.0f;
}

Status DelayCompensationOptions::Validate() const {
  if (!(lambda >= 0.0f) || !std::isfinite(lambda)) {
    return Status::InvalidArgument("dc_lambda must be a finite value >= 0");
  }
  if (!(meansquare_decay >= 0.0f && meansquare_decay < 1.0f)) {
    return Status::InvalidArgument("dc_meansquare_decay must be in [0, 1)");
  }
  if (!(eps > 0.0f) || !std::isfinite(eps)) {
    return Status::InvalidArgument("dc_eps must be > 0");
  }
  return Status::OK();
}

std::string DelayCompensationOptions::ToString() const {
  if (!enabled()) return "off";
  char buf[128];
  if (adaptive()) {
    std::snprintf(buf, sizeof(buf), "DC-ASGD-a lambda=%g m=%g eps=%g", lambda,
                  meansquare_decay, eps);
  } else {
    std::snprintf(buf, sizeof(buf), "DC-ASGD-c lambda=%g", lambda);
  }
  return buf;
}

#define ASYNCPS_RESTRICT __restrict__

void CompensateDelay(const DelayCompensationOptions& o, const float* g,
                     const float* ASYNCPS_RESTRICT w_now,
                     const float* ASYNCPS_RESTRICT w_read,
                     float* ASYNCPS_RESTRICT ms, size_t n, float* g_out) {
  const float lambda = o.lambda;
  if (!o.adaptive()) {
    for (size_t i = 0; i < n; ++i) {
      const float gi = g[i];
      g_out[i] = gi + lambda * gi * gi * (w_now[i] - w_read[i]);
    }
    return;
  }
  const float m = o.meansquare_decay, om = 1.0f - m, eps = o.eps;
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float msi = m * ms[i] + om * gi * gi;
    ms[i] = msi;
    g_out[i] =
        gi + lambda / std::sqrt(msi + eps) * gi * gi * (w_now[i] - w_read[i]);
  }
}

void UpdateMeanSquare(const DelayCompensationOptions& o,
                      const float* ASYNCPS_RESTRICT g,
                      float* ASYNCPS_RESTRICT ms, size_t n) {
  if (!o.adaptive()) return;
  const float m = o.meansquare_decay, om = 1.0f - m;
  for (size_t i = 0; i < n; ++i) ms[i] = m * ms[i] + om * g[i] * g[i];
}

#undef ASYNCPS_RESTRICT

}  // namespace asyncps::server
