// Shard: dispatch, registration, pulls, clocks and stats. Pushes are in
// shard_push.cc, persistence in shard_persist.cc.
#include "server/shard.h"

#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "server/internal/shard_types.h"
#if ASYNCPS_SERVER_HAVE_COMPRESSION
#include "compression/codec.h"
#endif

namespace asyncps::server {

const char* ConsistencyName(Consistency c) {
  switch (c) {
    case Consistency::kBsp:
      return "bsp";
    case Consistency::kSsp:
      return "ssp";
    case Consistency::kAsp:
      return "asp";
  }
  return "invalid";
}

StatusOr<Consistency> ParseConsistency(std::string_view name) {
  if (name == "bsp") return Consistency::kBsp;
  if (name == "ssp") return Consistency::kSsp;
  if (name == "asp") return Consistency::kAsp;
  return Status::InvalidArgument("unknown consistency '" + std::string(name) +
                                 "' (valid: bsp, ssp, asp)");
}

Status ShardOptions::Validate() const {
  if (num_shards < 1 || num_shards > 4096) {
    return Status::InvalidArgument("num_shards must be in [1, 4096]");
  }
  if (shard_id < 0 || shard_id >= num_shards) {
    return Status::InvalidArgument("shard_id must be in [0, num_shards)");
  }
  if (num_workers < 1 || num_workers > (1 << 20)) {
    return Status::InvalidArgument("num_workers must be in [1, 2^20]");
  }
  if (staleness < 0) return Status::InvalidArgument("staleness must be >= 0");
  if (worker_timeout.count() < 0)
    return Status::InvalidArgument("worker_timeout must be >= 0");
  if (max_parked_pulls < 1)
    return Status::InvalidArgument("max_parked_pulls must be >= 1");
  if (max_inflight_per_client < 1)
    return Status::InvalidArgument("max_inflight_per_client must be >= 1");
  return optimizer.Validate();
}

Shard::Shard(const ShardOptions& options, Store* store,
             std::unique_ptr<Optimizer> optimizer, TimePoint now)
    : options_(options),
      store_(store),
      optimizer_(std::move(optimizer)),
      clocks_(options.num_workers, options.worker_timeout, now),
      last_read_(options.num_workers, 0),
      replicas_(options.num_workers),
      next_pull_seq_(
          1 +
          (static_cast<uint64_t>(
               std::chrono::system_clock::now().time_since_epoch().count()) &
           ((uint64_t{1} << 62) - 1))),
      dedup_(options.num_workers) {}

Shard::~Shard() = default;

StatusOr<std::unique_ptr<Shard>> Shard::Create(const ShardOptions& options,
                                               Store* store, TimePoint now) {
  RETURN_IF_ERROR(options.Validate());
  ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> opt,
                   Optimizer::Create(options.optimizer));
  std::unique_ptr<Shard> shard(new Shard(options, store, std::move(opt), now));
  if (store != nullptr) RETURN_IF_ERROR(shard->Recover());
  return shard;
}

Status Shard::Reject(RejectReason reason, Status s) {
  reject_reason_ = reason;
  return s;
}

void Shard::CountRejected(RejectReason reason) {
  ++counters_.rejected[static_cast<size_t>(reason)];
}

const std::vector<float>* Shard::weights(uint32_t chunk) const {
  if (chunk >= local_index_.size() || local_index_[chunk] < 0) return nullptr;
  return &chunks_[local_index_[chunk]]->w;
}

const std::vector<float>* Shard::optimizer_state(uint32_t chunk) const {
  if (chunk >= local_index_.size() || local_index_[chunk] < 0) return nullptr;
  return &chunks_[local_index_[chunk]]->state;
}

uint64_t Shard::chunk_version(uint32_t chunk) const {
  if (chunk >= local_index_.size() || local_index_[chunk] < 0) return 0;
  return chunks_[local_index_[chunk]]->version;
}

void Shard::FillCommon(const RequestHeader& req, ReplyHeader* reply) const {
  reply->id = req.id;
  reply->kind = req.kind;
  reply->shard_version = shard_version_;
  reply->min_clock = clocks_.MinLiveClock();
}

void Shard::Handle(const std::string& peer, const RequestHeader& req,
                   const std::vector<ByteView>& data, TimePoint now,
                   std::vector<OutgoingReply>* out) {
  OutgoingReply r;
  r.peer = peer;
  reject_reason_ = RejectReason::kOther;
  // Observers (rank -1: tools, a dedicated evaluator) may register, pull and
  // ask for stats, but never push or move a clock.
  const bool worker_only =
      req.kind == RequestKind::kPush || req.kind == RequestKind::kClock;
  const int rank = req.rank;
  bool parked = false;
  Status st;
  if (req.version != kProtocolVersion) {
    st =
        Reject(RejectReason::kVersion,
               Status::FailedPrecondition(
                   "protocol version " + std::to_string(req.version) +
                   ", this server speaks " + std::to_string(kProtocolVersion)));
  } else if (rank < -1 || rank >= options_.num_workers ||
             (rank == -1 && worker_only)) {
    st = Reject(RejectReason::kRank,
                Status::InvalidArgument("rank " + std::to_string(rank) +
                                        " out of range [0, " +
                                        std::to_string(options_.num_workers) +
                                        ") for " + RequestKindName(req.kind)));
  } else if (req.kind != RequestKind::kPush && !data.empty()) {
    st = Reject(
        RejectReason::kSizeMismatch,
        Status::InvalidArgument(std::string(RequestKindName(req.kind)) +
                                " request carries unexpected data frames"));
  } else {
    if (rank >= 0) clocks_.Touch(rank, now);
    switch (req.kind) {
      case RequestKind::kRegister:
        st = HandleRegister(req, &r.header);
        break;
      case RequestKind::kPush:
        st = HandlePush(req, data, &r.header);
        break;
      case RequestKind::kPull:
        st = ValidatePullRequest(req);
        if (!st.ok()) break;
        // Rank -1 (an observer, such as a dedicated evaluator) reads the
        // current weights without taking part in the clocks.
        if (rank >= 0) clocks_.Advance(rank, req.clock);
        if (rank < 0 || PullReady(req.clock)) {
          st = AnswerPull(req, &r);
        } else if (IsParked(peer, req.id)) {
          parked = true;  // a resend of a pull that is already waiting
        } else if (parked_.size() >= options_.max_parked_pulls) {
          st = Reject(
              RejectReason::kTooManyParked,
              Status::ResourceExhausted("too many parked pulls (" +
                                        std::to_string(parked_.size()) + ")"));
        } else if (NumParked(peer) >= options_.max_inflight_per_client) {
          st = Reject(
              RejectReason::kTooManyInflight,
              Status::ResourceExhausted(
                  "too many requests in flight from this client (" +
                  std::to_string(options_.max_inflight_per_client) + ")"));
        } else {
          auto p = std::make_unique<ParkedPull>();
          p->peer = peer;
          p->req = req;
          parked_.push_back(std::move(p));
          parked = true;
        }
        break;
      case RequestKind::kClock:
        clocks_.Advance(rank, req.clock);
        if (options_.durable && store_ != nullptr) {
          // Clocks survive kill -9 too (BSP round membership, SSP bounds).
          touched_.clear();
          st = WriteDurable(options_.durable_sync == SyncMode::kSync);
          if (!st.ok()) reject_reason_ = RejectReason::kStore;
        }
        break;
      case RequestKind::kHeartbeat:
        break;
      case RequestKind::kStats:
        r.header.text = StatsJson();
        break;
      case RequestKind::kCheckpoint:
        st = Checkpoint();
        if (!st.ok()) reject_reason_ = RejectReason::kStore;
        break;
      case RequestKind::kShutdown:
        st = Checkpoint();
        if (!st.ok()) {
          reject_reason_ = RejectReason::kStore;
          LOG(ERROR) << "final checkpoint failed: " << st.ToString();
        }
        shutdown_requested_ = true;
        break;
    }
  }
  if (!st.ok()) {
    CountRejected(reject_reason_);
    r.header.chunks.clear();
    r.frames.clear();
    r.header.staleness = -1;
    r.header.created = false;
    r.header.status = st;
  }
  // Clocks may have moved: BSP rounds complete before this reply reports
  // min_clock, and parked pulls released go out after it.
  OnClocksChanged(nullptr);
  if (!parked) {
    FillCommon(req, &r.header);
    out->push_back(std::move(r));
  }
  ReleaseParked(out);
}

void Shard::Tick(TimePoint now, std::vector<OutgoingReply>* out) {
  // A worker whose pull this shard is holding is waiting on us, not dead:
  // its silence does not count until the pull is answered.
  for (const auto& p : parked_) {
    if (p->req.rank >= 0) clocks_.Touch(p->req.rank, now);
  }
  if (clocks_.Expire(now) > 0) OnClocksChanged(out);
  ReleaseParked(out);
}

void Shard::OnClocksChanged(std::vector<OutgoingReply>* out) {
  if (options_.consistency == Consistency::kBsp) {
    const int64_t min = clocks_.MinLiveClock();
    while (min > bsp_round_) {
      Status s = ApplyBspRound();
      if (!s.ok()) {
        // The round is applied in memory; only its durable write failed.
        LOG(ERROR) << "BSP round " << bsp_round_ - 1 << ": " << s.ToString();
        CountRejected(RejectReason::kStore);
      }
    }
  }
  if (out != nullptr) ReleaseParked(out);
}

bool Shard::PullReady(int64_t clock) const {
  const int64_t min = clocks_.MinLiveClock();
  switch (options_.consistency) {
    case Consistency::kBsp:
      return min >= clock && bsp_round_ >= clock;
    case Consistency::kSsp:
      return min >= clock - options_.staleness;
    case Consistency::kAsp:
      return true;
  }
  return true;
}

}  // namespace asyncps::server
