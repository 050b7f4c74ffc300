// LrSchedule: the learning-rate multiplier a shard applies as a function of
// its own version (updates applied: one per push under ASP/SSP, one per round
// under BSP), so every worker sees one schedule whatever its own step count.
//
//   version v < warmup_updates:   scale = warmup_start + (1 - warmup_start) *
//                                         v / warmup_updates       (linear)
//   then, with decay_updates > 0: t = min(1, (v - warmup_updates) /
//                                          (decay_updates - warmup_updates))
//                                 scale = final + (1 - final) *
//                                         (1 + cos(pi t)) / 2      (cosine)
//   otherwise                     scale = 1.
//
// So the decay ends at update decay_updates whether or not there is a
// warm-up (as in the usual "cosine with warm-up" schedules), and without a
// warm-up the cosine runs over [0, decay_updates].
//
// Linear warm-up as in Goyal et al. 2017 ("Accurate, Large Minibatch SGD"):
// with W workers averaged by BSP and the linearly scaled rate W * lr, start
// at warmup_start = 1/W and reach W * lr after a few epochs' worth of
// updates.
//
// Thread safety: a plain value; Scale() is const.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace asyncps::server {

struct LrScheduleOptions {
  // Updates of linear warm-up (0: none). Default: 0.
  uint64_t warmup_updates = 0;
  // Fraction of lr at update 0 of the warm-up, in [0, 1]. Default: 0.
  float warmup_start = 0.0f;
  // Update at which the cosine decay ends (0: no decay); > warmup_updates
  // when both are set. Default: 0.
  uint64_t decay_updates = 0;
  // Fraction of lr the decay ends at, in [0, 1]. Default: 0.
  float final_fraction = 0.0f;

  // InvalidArgument naming the bad field.
  Status Validate() const;
  // One-line description for logs ("constant" when neither is set).
  std::string ToString() const;
};

class LrSchedule {
 public:
  explicit LrSchedule(const LrScheduleOptions& options) : options_(options) {}

  // Multiplier of lr for the update applied when the shard has applied
  // `version` updates before it.
  float Scale(uint64_t version) const;

  const LrScheduleOptions& options() const { return options_; }

 private:
  LrScheduleOptions options_;
};

}  // namespace asyncps::server
