// Staleness-aware update rules of a shard under ASP/SSP, beside the plain
// optimizer (server/optimizer/optimizer.h): what a push's gradient is worth
// when the weights it was computed on are `staleness` updates old.
//
// 1. Learning rate by staleness (StalenessLr), s = shard version at apply
//    minus the version the pushing worker last read:
//      kOnePlus  lr / (1 + s)
//      kInverse  lr / s for s >= 1, lr for s = 0: the staleness-dependent
//                rate of Zhang, Gupta, Lian and Liu, "Staleness-aware
//                Async-SGD for Distributed Deep Learning" (IJCAI 2016).
//
// 2. Delay compensation (DC-ASGD: Zheng et al., "Asynchronous Stochastic
//    Gradient Descent with Delay Compensation", ICML 2017). The gradient g
//    a worker computed at the weights w_read it pulled is corrected towards
//    the gradient at the shard's current weights w_now with the diagonal of
//    the outer-product approximation of the Hessian:
//      g' = g + lambda * g * g * (w_now - w_read)        (element-wise)
//    DC-ASGD-c uses a constant lambda; DC-ASGD-a (meansquare_decay m > 0)
//    uses lambda_t = lambda / sqrt(ms_t + eps) with the running mean square
//    ms_t = m * ms_{t-1} + (1 - m) * g^2 per element, updated with every
//    gradient the chunk receives. g' then goes through the optimizer as
//    usual (SGD in the paper; momentum/Adam/weight decay work on g').
//
//    w_read: the shard keeps, per worker, the weights it sent in that
//    worker's pulls (the ref-counted pull snapshot of each chunk version,
//    shared with the reply and with every other worker that read the same
//    version; up to kDcReadSlots pulls per worker, keyed by the pull's
//    clock, so a worker that prefetches the next step's weights still finds
//    the ones its push was computed on). A push at clock c is compensated
//    against the snapshot of that worker's pull at clock c. Memory: at most
//    kDcReadSlots * num_workers copies of the shard's weights, in practice
//    about one per worker whose last read differs from the others' (under
//    ASP every pull tends to see a new version), all charged to the shard's
//    MemoryBudget as pull snapshots; ps_server refuses a registration whose
//    shard could not hold num_workers such copies. The adaptive variant adds
//    one float per weight (the mean square, kept and checkpointed with the
//    optimizer state).
//
// Thread safety: plain functions of their arguments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace asyncps::server {

enum class StalenessLr : uint8_t {
  kNone = 0,
  kOnePlus = 1,  // 1 / (1 + s)
  kInverse = 2,  // 1 / max(1, s)  (Zhang et al. 2016)
};

// "none", "one_plus", "inverse".
const char* StalenessLrName(StalenessLr rule);
// Parses the names above; "true"/"1" mean one_plus and "false"/"0" none
// (the earlier boolean --staleness_lr).
StatusOr<StalenessLr> ParseStalenessLr(std::string_view name);

// Multiplier of lr for a push of this staleness.
float StalenessLrScale(StalenessLr rule, uint64_t staleness);

// Pull snapshots kept per worker for delay compensation (its pulls at the
// last kDcReadSlots distinct clocks).
inline constexpr int kDcReadSlots = 2;

struct DelayCompensationOptions {
  // lambda >= 0 (variance-control parameter); 0 turns compensation off.
  // Default: 0.
  float lambda = 0.0f;
  // Mean-square decay m in [0, 1): 0 = DC-ASGD-c (constant lambda), > 0 =
  // DC-ASGD-a (lambda / sqrt(ms + eps)); the paper uses 0.95. Default: 0.
  float meansquare_decay = 0.0f;
  // Added to the mean square before the square root, > 0. Default: 1e-7.
  float eps = 1e-7f;

  bool enabled() const { return lambda > 0.0f; }
  bool adaptive() const { return enabled() && meansquare_decay > 0.0f; }
  // Floats of per-weight state the rule keeps (the mean square): 0 or 1.
  size_t state_per_elem() const { return adaptive() ? 1 : 0; }
  Status Validate() const;
  std::string ToString() const;
};

// g_out[i] = g[i] + lambda_i * g[i]^2 * (w_now[i] - w_read[i]) for i < n,
// lambda_i = lambda (constant) or lambda / sqrt(ms[i] + eps) after ms[i] is
// updated with g[i] (adaptive; `ms` has n floats, zero before the first
// gradient). g_out may equal g; other buffers must not overlap.
void CompensateDelay(const DelayCompensationOptions& options, const float* g,
                     const float* w_now, const float* w_read, float* ms,
                     size_t n, float* g_out);

// Adaptive variant without a read snapshot (a push whose pull the shard no
// longer holds): updates the mean square with g only, so it stays the mean
// over every gradient the chunk received.
void UpdateMeanSquare(const DelayCompensationOptions& options, const float* g,
                      float* ms, size_t n);

}  // namespace asyncps::server
