#include "server/shard/stats.h"

#include <algorithm>

#include "server/shard/stats_json.h"

namespace asyncps::server {

const char* RejectReasonName(RejectReason r) {
  switch (r) {
    case RejectReason::kMalformed:
      return "malformed";
    case RejectReason::kVersion:
      return "protocol_version";
    case RejectReason::kOversize:
      return "oversize";
    case RejectReason::kRank:
      return "rank";
    case RejectReason::kNotRegistered:
      return "not_registered";
    case RejectReason::kUnknownChunk:
      return "unknown_chunk";
    case RejectReason::kWrongShard:
      return "wrong_shard";
    case RejectReason::kSizeMismatch:
      return "size_mismatch";
    case RejectReason::kBadCodec:
      return "bad_codec";
    case RejectReason::kNonFinite:
      return "non_finite";
    case RejectReason::kRegistrationMismatch:
      return "registration_mismatch";
    case RejectReason::kWrongClock:
      return "wrong_clock";
    case RejectReason::kTooManyParked:
      return "too_many_parked";
    case RejectReason::kStore:
      return "store";
    case RejectReason::kOther:
      return "other";
    case RejectReason::kTooManyInflight:
      return "too_many_inflight";
    case RejectReason::kRepeatedChunk:
      return "repeated_chunk";
    case RejectReason::kBadClock:
      return "bad_clock";
    case RejectReason::kUnsentReplies:
      return "unsent_replies";
    case RejectReason::kMemoryBudget:
      return "memory_budget";
    case RejectReason::kParkExpired:
      return "park_expired";
    case RejectReason::kAdminDenied:
      return "admin_denied";
    case RejectReason::kSharedMemory:
      return "shared_memory";
    case RejectReason::kNotPrimary:
      return "not_primary";
    case RejectReason::kLrOutOfRange:
      return "lr_out_of_range";
    case RejectReason::kUploadClaim:
      return "upload_claim";
    case RejectReason::kStaleLayout:
      return "stale_layout";
    case RejectReason::kOptimizerState:
      return "optimizer_state";
    case RejectReason::kUntrusted:
      return "untrusted";
    case RejectReason::kCount:
      break;
  }
  return "invalid";
}

size_t StalenessHistogram::BucketOf(uint64_t v) {
  if (v < kExact) return static_cast<size_t>(v);
  // v >= 64: floor(log2 v) >= 6.
  int lg = 63 - __builtin_clzll(v);
  return kExact + static_cast<size_t>(lg - 6);
}

uint64_t StalenessHistogram::BucketLow(size_t b) {
  if (b < kExact) return b;
  return uint64_t{1} << (b - kExact + 6);
}

void StalenessHistogram::Add(uint64_t v) {
  ++buckets_[BucketOf(v)];
  ++count_;
  max_ = std::max(max_, v);
}

uint64_t StalenessHistogram::Quantile(double q) const {
  if (count_ == 0) return 0;
  uint64_t rank = static_cast<uint64_t>(q * static_cast<double>(count_));
  if (rank >= count_) rank = count_ - 1;
  uint64_t seen = 0;
  for (size_t b = 0; b < kNumBuckets; ++b) {
    seen += buckets_[b];
    if (seen > rank) return BucketLow(b);
  }
  return max_;
}

void StalenessHistogram::Restore(
    const std::array<uint64_t, kNumBuckets>& buckets, uint64_t max) {
  buckets_ = buckets;
  count_ = 0;
  for (uint64_t c : buckets_) count_ += c;
  max_ = max;
}

namespace internal {

Json StalenessJson(const StalenessHistogram& h) {
  Json buckets = Json::array();
  for (size_t b = 0; b < StalenessHistogram::kNumBuckets; ++b) {
    if (h.buckets()[b] == 0) continue;
    buckets.push_back({StalenessHistogram::BucketLow(b), h.buckets()[b]});
  }
  return Json{{"count", h.count()},
              {"p50", h.Quantile(0.5)},
              {"p99", h.Quantile(0.99)},
              {"max", h.max()},
              {"buckets", std::move(buckets)}};
}

}  // namespace internal

std::string StalenessHistogram::ToJson() const {
  return internal::StalenessJson(*this).dump();
}

}  // namespace asyncps::server
