// Shard statistics: request counters, rejected requests by reason, and the
// staleness histogram of applied pushes.
//
// Plain value types owned by the Shard; the Shard persists them in its
// checkpoints and renders them as JSON for the `stats` request.
// Thread safety: none (owned by one shard's event loop).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace asyncps::server {

// Why a request was rejected. Names appear in stats JSON; append only.
enum class RejectReason : uint8_t {
  kMalformed = 0,         // header could not be decoded (garbage, truncated)
  kVersion,               // wrong protocol version
  kOversize,              // message over max_message_bytes / frame limits
  kRank,                  // worker rank out of range or missing
  kNotRegistered,         // no layout registered yet
  kUnknownChunk,          // chunk id outside the layout / bad frame index
  kWrongShard,            // chunk held by another shard
  kSizeMismatch,          // byte_size / num_elems / frame size disagree
  kBadCodec,              // unknown codec or invalid payload
  kNonFinite,             // NaN or Inf in a gradient
  kRegistrationMismatch,  // re-registration with other specs or shard count
  kWrongClock,            // BSP push for a clock other than the current round
  kTooManyParked,         // parked-pull limit reached
  kStore,                 // persistence failed
  kOther,
  kTooManyInflight,  // per-client in-flight limit reached (appended: the
                     // persisted counters are indexed by this enum)
  kRepeatedChunk,    // a pull naming one chunk twice
  kBadClock,         // negative clock, or a jump over max_clock_jump
  kUnsentReplies,    // too many reply bytes to this client not yet sent
  kMemoryBudget,     // the shard's memory budget would be exceeded
  kParkExpired,      // a parked pull waited max_park_time (client resends)
  kAdminDenied,      // checkpoint/shutdown from a non-admin peer
  kSharedMemory,     // shared-memory attach refused, or a pull into it
  kNotPrimary,       // replica that is not its group's primary (or has no
                     // confirmed lease), or a stale replicate request
  kLrOutOfRange,     // a push's or clock's lr not in (0, max_lr], or NaN
  kUploadClaim,      // an upload (kAssign) without the shard's claim, or bad
  kStaleLayout,      // a push or pull routed by another elastic layout
                     // epoch, or held back while chunks move
  kOptimizerState,   // an optimizer state upload (kAssign phase 4) for
                     // another optimizer (name, floats per weight) or out
                     // of range (steps, negative sums of squares)
  kUntrusted,        // replica traffic (replicate, snapshot) from a sender
                     // not authenticated as its group's member
  kCount,
};
inline constexpr size_t kNumRejectReasons =
    static_cast<size_t>(RejectReason::kCount);
const char* RejectReasonName(RejectReason r);

// Histogram of non-negative integers: exact buckets for 0..63, then one
// bucket per power of two, [2^k, 2^(k+1)) for k = 6..63.
class StalenessHistogram {
 public:
  static constexpr size_t kExact = 64;
  static constexpr size_t kNumBuckets = kExact + 58;

  void Add(uint64_t value);
  uint64_t count() const { return count_; }
  uint64_t max() const { return max_; }
  // Smallest value v such that at least q (in [0,1]) of the samples are
  // <= v's bucket; exact below 64, the bucket's lower bound above. 0 if empty.
  uint64_t Quantile(double q) const;
  // Lower bound of bucket b.
  static uint64_t BucketLow(size_t b);
  static size_t BucketOf(uint64_t value);

  const std::array<uint64_t, kNumBuckets>& buckets() const { return buckets_; }
  // Restores from persisted fields.
  void Restore(const std::array<uint64_t, kNumBuckets>& buckets, uint64_t max);
  // {"count":..,"p50":..,"p99":..,"max":..,"buckets":[[low,count],...]}
  std::string ToJson() const;

 private:
  std::array<uint64_t, kNumBuckets> buckets_{};
  uint64_t count_ = 0;
  uint64_t max_ = 0;
};

struct ShardCounters {
  uint64_t pushes = 0;            // pushes applied (or accumulated in BSP)
  uint64_t duplicate_pushes = 0;  // resent pushes acknowledged without applying
  uint64_t skipped_pushes = 0;    // BSP: acknowledged, not counted (behind the
                                  // round, or a second push for the round)
  uint64_t pulls = 0;             // pull replies sent
  uint64_t bytes_in = 0;          // payload bytes of accepted pushes
  uint64_t bytes_in_raw = 0;      // the same pushes as dense fp32 (4 B/elem);
                                  // bytes_in_raw / bytes_in = wire ratio
  uint64_t validate_decode_ns = 0;  // time validating and decoding pushes
  uint64_t bytes_out = 0;           // payload bytes of pull replies
  uint64_t shm_bytes_out = 0;       // bytes pulls wrote into clients' shared
                                    // memory (not persisted)
  uint64_t checkpoints = 0;         // checkpoints written since start
  uint64_t checkpoint_ns = 0;       // time writing them (store writes)
  uint64_t durable_writes = 0;      // --durable writes (pushes, rounds, clocks)
  uint64_t durable_write_ns = 0;    // time in them
  uint64_t store_bytes_written = 0;  // keys + values handed to the store
  // Delay compensation (since start, not persisted): pushes corrected
  // against the weights their worker read, and pushes applied uncorrected
  // because the shard no longer held that read (e.g. after a restart).
  uint64_t dc_compensated = 0;
  uint64_t dc_uncompensated = 0;
  std::array<uint64_t, kNumRejectReasons> rejected{};
};

}  // namespace asyncps::server
