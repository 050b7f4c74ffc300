#include "server/optimizer/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace asyncps::server {

Status LrScheduleOptions::Validate() const {
  if (!(warmup_start >= 0.0f && warmup_start <= 1.0f)) {
    return Status::InvalidArgument("warmup_start must be in [0, 1]");
  }
  if (!(final_fraction >= 0.0f && final_fraction <= 1.0f)) {
    return Status::InvalidArgument("lr_final must be in [0, 1]");
  }
  if (decay_updates != 0 && warmup_updates != 0 &&
      decay_updates <= warmup_updates) {
    return Status::InvalidArgument(
        "the cosine decay ends at update " + std::to_string(decay_updates) +
        ", not after the warm-up of " + std::to_string(warmup_updates) +
        " updates: lr_decay_updates must exceed the warm-up");
  }
  return Status::OK();
}

std::string LrScheduleOptions::ToString() const {
  if (warmup_updates == 0 && decay_updates == 0) return "constant";
  char buf[160];
  std::snprintf(buf, sizeof(buf),
                "warm-up %llu updates from %g, cosine decay to %g ending at "
                "update %llu",
                static_cast<unsigned long long>(warmup_updates), warmup_start,
                final_fraction, static_cast<unsigned long long>(decay_updates));
  return buf;
}

float LrSchedule::Scale(uint64_t version) const {
  const LrScheduleOptions& o = options_;
  if (version < o.warmup_updates) {
    return static_cast<float>(
        o.warmup_start + (1.0 - o.warmup_start) * static_cast<double>(version) /
                             static_cast<double>(o.warmup_updates));
  }
  if (o.decay_updates == 0) return 1.0f;
  const double span = static_cast<double>(o.decay_updates - o.warmup_updates);
  const double t =
      std::min(1.0, static_cast<double>(version - o.warmup_updates) / span);
  const double cosine = 0.5 * (1.0 + std::cos(3.14159265358979323846 * t));
  return static_cast<float>(o.final_fraction +
                            (1.0 - o.final_fraction) * cosine);
}

}  // namespace asyncps::server
