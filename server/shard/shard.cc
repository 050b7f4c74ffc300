// Shard: options, dispatch, clocks and timers. Registration is in
// shard_register.cc, pulls in shard_pull.cc, pushes in shard_push.cc,
// persistence in shard_persist.cc, the stats document in shard_stats.cc;
// the elastic epoch and freeze in shard_elastic.cc; kAssign and kMigrate
// requests go to the RequestHandlers the shard was built with (uploads,
// server/upload/; migration, server/migrate/), the rows of sparse tables to
// a SparseRequests (sparse_requests.h).
#include "server/shard/shard.h"

#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "server/internal/push_dedup.h"
#include "server/internal/task_pool.h"
#include "server/shard/shard_state.h"
#include "server/shard/shard_types.h"
#include "server/shard/sparse_requests.h"

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
  if (max_shm_bytes < (uint64_t{1} << 20))
    return Status::InvalidArgument("max_shm_bytes must be >= 1 MiB");
  if (max_parked_pulls < 1)
    return Status::InvalidArgument("max_parked_pulls must be >= 1");
  if (max_inflight_per_client < 1)
    return Status::InvalidArgument("max_inflight_per_client must be >= 1");
  if (sparse.max_keys_per_request < 1 || sparse.max_reply_bytes < 1)
    return Status::InvalidArgument(
        "sparse max_keys_per_request and max_reply_bytes must be >= 1");
  if (staleness > kMaxClock)
    return Status::InvalidArgument("staleness must be <= 2^62");
  if (max_park_time.count() < 1)
    return Status::InvalidArgument("max_park_time must be >= 1 ms");
  if (memory_budget_bytes < (uint64_t{1} << 20))
    return Status::InvalidArgument("memory_budget_bytes must be >= 1 MiB");
  if (max_unsent_bytes_per_client < 1)
    return Status::InvalidArgument("max_unsent_bytes_per_client must be >= 1");
  if (max_frame_bytes < 1024)
    return Status::InvalidArgument("max_frame_bytes must be >= 1024");
  if (max_clock_jump < 1 || max_clock_jump > kMaxClock)
    return Status::InvalidArgument("max_clock_jump must be in [1, 2^62]");
  if (apply_threads < 1 || apply_threads > 256)
    return Status::InvalidArgument("apply_threads must be in [1, 256]");
  RETURN_IF_ERROR(lr_schedule().Validate());
  RETURN_IF_ERROR(delay_compensation.Validate());
  if (delay_compensation.enabled() && consistency == Consistency::kBsp) {
    return Status::InvalidArgument(
        "delay compensation corrects stale gradients: it needs ssp or asp "
        "(BSP gradients are never stale)");
  }
  if (static_cast<int>(staleness_lr) > 2)
    return Status::InvalidArgument("unknown staleness_lr rule");
  if (!(max_lr >= 0.0f) || !std::isfinite(max_lr))
    return Status::InvalidArgument("max_lr must be finite and >= 0");
  return optimizer.Validate();
}

LrScheduleOptions ShardOptions::lr_schedule() const {
  LrScheduleOptions o;
  o.warmup_updates = lr_warmup_updates;
  o.warmup_start = lr_warmup_start;
  o.decay_updates = lr_decay_updates;
  o.final_fraction = lr_final;
  return o;
}

// What the core lends its handlers (server/shard/shard_state.h): its
// private operations, called back by them.
class Shard::Services : public internal::ShardServices {
 public:
  explicit Services(Shard* shard) : shard_(shard) {}
  Status Reject(RejectReason reason, Status s) override {
    return shard_->Reject(reason, std::move(s));
  }
  Status Checkpoint() override { return shard_->Checkpoint(); }
  void PinUnsent(const std::string& peer, int rank, uint64_t fresh,
                 OutgoingReply* reply) override {
    shard_->PinUnsent(peer, rank, fresh, reply);
  }
  Status CheckRoute(const RequestHeader& req, ReplyHeader* reply) override {
    return shard_->CheckRoute(req, reply);
  }
  uint64_t layout_epoch() const override { return shard_->layout_epoch(); }
  void ApplyKeyRanges() override { shard_->ApplyKeyRanges(); }
  void EnterDegraded(const Status& cause) override {
    shard_->EnterDegraded(cause);
  }
  Status ChargeLayoutTables(const std::vector<TensorSpec>& tensors,
                            const LayoutOptions& options) override {
    return shard_->ChargeLayoutTables(tensors, options);
  }
  void ReleaseLayoutCharge() override { shard_->layout_charge_.Reset(); }
  void InstallImportedLayout(Layout layout,
                             const internal::ImportedClocks& state) override {
    shard_->InstallImportedLayout(std::move(layout), state);
  }
  void AddExportEntries(const std::vector<uint32_t>& ids,
                        std::vector<StoreEntry>* entries) override {
    shard_->AddLayoutEntry(entries);
    shard_->AddStateEntry(entries);
    for (uint32_t id : ids)
      shard_->AddChunkEntry(*shard_->chunks_[shard_->local_index_[id]],
                            entries);
  }
  std::vector<std::unique_ptr<Chunk>> TakeChunks() override {
    return std::move(shard_->chunks_);
  }
  void InstallChunks(std::vector<std::unique_ptr<Chunk>> chunks,
                     std::vector<int32_t> local, Layout layout, int num_shards,
                     uint64_t dropped_bytes) override {
    shard_->InstallChunks(std::move(chunks), std::move(local),
                          std::move(layout), num_shards, dropped_bytes);
  }
  void ReleaseForEpoch(std::vector<OutgoingReply>* out) override {
    shard_->ReleaseForEpoch(out);
  }

 private:
  Shard* shard_;
};

Shard::Shard(const ShardOptions& options, Store* store,
             std::unique_ptr<Optimizer> optimizer, TimePoint now,
             const ShardHandlers& handlers)
    : options_(options),
      store_(store),
      optimizer_(std::move(optimizer)),
      schedule_(options.lr_schedule()),
      state_per_elem_(optimizer_->state_per_elem() +
                      options.delay_compensation.state_per_elem()),
      budget_(MemoryBudget::Create(options.memory_budget_bytes)),
      bsp_pushed_round_(options.num_workers, -1),
      held_push_(options.num_workers),
      clocks_(options.num_workers, options.worker_timeout, now),
      last_read_(options.num_workers, 0),
      dedup_(std::make_unique<internal::PushDedup>(
          internal::PushDedup::Options{options.num_workers})),
      replicas_(options.num_workers),
      dc_reads_(options.delay_compensation.enabled() ? options.num_workers : 0),
      next_pull_seq_(
          1 +
          (static_cast<uint64_t>(
               std::chrono::system_clock::now().time_since_epoch().count()) &
           ((uint64_t{1} << 62) - 1))),
      unsent_total_(std::make_shared<UnsentBytes>(0)) {
  unsent_by_rank_.reserve(options.num_workers);
  for (int r = 0; r < options.num_workers; ++r)
    unsent_by_rank_.push_back(std::make_shared<UnsentBytes>(0));
  elastic_ = std::make_unique<internal::ElasticState>();
  rows_ = std::make_unique<internal::DecodedRows>();
  services_ = std::make_unique<Services>(this);
  sparse_requests_ =
      std::make_unique<SparseRequests>(LendState(), services_.get());
  if (handlers.assign) {
    uploads_ =
        handlers.assign(LendState(), services_.get(), sparse_requests_.get());
  }
  if (handlers.migrate) {
    migration_ =
        handlers.migrate(LendState(), services_.get(), sparse_requests_.get());
  }
}

Shard::~Shard() = default;

internal::ShardState Shard::LendState() {
  return internal::ShardState{options_,       store_,     *optimizer_,
                              *budget_,       layout_,    chunks_,
                              local_index_,   clocks_,    state_per_elem_,
                              shard_version_, bsp_round_, bsp_pushed_round_,
                              *elastic_,      sparse_,    stamp_,
                              frame_stamp_,   *rows_};
}

StatusOr<std::unique_ptr<Shard>> Shard::Create(const ShardOptions& options,
                                               Store* store, TimePoint now,
                                               const ShardHandlers& handlers) {
  RETURN_IF_ERROR(options.Validate());
  ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> opt,
                   Optimizer::Create(options.optimizer));
  std::unique_ptr<Shard> shard(
      new Shard(options, store, std::move(opt), now, handlers));
  if (options.apply_threads > 1) {
    shard->apply_pool_ =
        std::make_unique<internal::TaskPool>(options.apply_threads);
  }
  // Per-worker tables sized by the options, not by peers: charged once.
  const uint64_t fixed =
      shard->dedup_->MaxBytes() + static_cast<uint64_t>(options.num_workers) *
                                      (sizeof(PullReplica) + sizeof(DcReads) +
                                       4 * sizeof(int64_t) + 64 /* counters */);
  ASSIGN_OR_RETURN(
      shard->fixed_charge_,
      shard->budget_->Reserve(fixed, "the per-worker tables of " +
                                         std::to_string(options.num_workers) +
                                         " workers"));
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

uint64_t Shard::unsent_reply_bytes() const {
  return unsent_total_->load(std::memory_order_relaxed);
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
  const int rank = req.rank;
  bool parked = false;
  Status st = Admit(req, !data.empty());
  if (st.ok()) {
    // A backup (follower) takes an evicted worker back only where its
    // primary did: on a request replayed from it. The others a backup
    // sees with a rank are the workers' heartbeats (it redirects their
    // data requests), which only count as heard from.
    if (rank >= 0) {
      clocks_.Touch(rank, now,
                    req.kind == RequestKind::kPush ||
                        req.kind == RequestKind::kClock ||
                        req.kind == RequestKind::kRegister ||
                        req.kind == RequestKind::kAssign);
    }
    switch (req.kind) {
      case RequestKind::kRegister:
        st = HandleRegister(req, &r.header);
        if (st.ok()) held_push_[rank] = HeldPush{};  // a new process
        break;
      case RequestKind::kPush:
        st = HandlePush(req, data, &r.header);
        NoteHeldPush(req, st);
        break;
      case RequestKind::kPull:
        st = HandlePull(peer, req, data, now, &r, &parked);
        break;
      case RequestKind::kClock:
        // Routed by this layout (a clock must follow the pushes it counts:
        // the client sends a stale one again after re-routing them).
        st = CheckRoute(req, &r.header);
        if (st.ok()) st = CheckHeldPush(req, &r.header);
        if (st.ok()) st = CheckFrozen(req, &r.header);
        if (st.ok()) st = HandleClock(req);
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
      case RequestKind::kAttachShm:
        st = HandleAttachShm(req);
        break;
      case RequestKind::kAssign:
      case RequestKind::kMigrate: {
        RequestHandler* h = req.kind == RequestKind::kAssign ? uploads_.get()
                                                             : migration_.get();
        st = h != nullptr ? h->Handle(peer, req, data, now, &r, out)
                          : Reject(RejectReason::kOther,
                                   Status::Unimplemented(
                                       std::string(RequestKindName(req.kind)) +
                                       " is not served by this shard"));
        break;
      }
      case RequestKind::kReplicate:
      case RequestKind::kSnapshot:
        // The server unwraps these (server/replication/replicator.h).
        st = Reject(RejectReason::kNotPrimary,
                    Status::InvalidArgument("replicate request reached the "
                                            "shard itself"));
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

Status Shard::Admit(const RequestHeader& req, bool has_data) {
  const int rank = req.rank;
  if (req.version != kProtocolVersion) {
    return Reject(RejectReason::kVersion,
                  Status::FailedPrecondition("protocol version " +
                                             std::to_string(req.version) +
                                             ", this server speaks " +
                                             std::to_string(kProtocolVersion)));
  }
  if (rank < -1 || rank >= options_.num_workers) {
    return Reject(RejectReason::kRank,
                  Status::InvalidArgument(
                      "rank " + std::to_string(rank) + " out of range [0, " +
                      std::to_string(options_.num_workers) + ") for " +
                      RequestKindName(req.kind)));
  }
  // Observers (rank -1: tools, a dedicated evaluator) may pull (read-only)
  // and ask for stats; only workers register, push and move clocks.
  const bool worker_only =
      req.kind == RequestKind::kPush || req.kind == RequestKind::kClock ||
      req.kind == RequestKind::kRegister || req.kind == RequestKind::kAssign;
  if (rank == -1 && worker_only) {
    return Reject(
        RejectReason::kRank,
        Status::InvalidArgument(
            std::string("rank -1 (tools and observers) may not ") +
            RequestKindName(req.kind) +
            (req.kind == RequestKind::kRegister
                 ? ": the workers register the model; an observer computes "
                   "its layout and waits for them"
                 : ": only workers (rank >= 0) do")));
  }
  if (req.kind == RequestKind::kMigrate && rank != -1) {
    return Reject(
        RejectReason::kRank,
        Status::InvalidArgument("migrate requests come from tools (rank -1), "
                                "not from worker " +
                                std::to_string(rank)));
  }
  // Pushes carry chunks and rows; pulls may carry the keys of rows;
  // uploads carry values; imports (kMigrate) chunk records.
  if (req.kind != RequestKind::kPush && req.kind != RequestKind::kAssign &&
      req.kind != RequestKind::kMigrate &&
      !(req.kind == RequestKind::kPull && !req.rows.empty()) && has_data) {
    return Reject(
        RejectReason::kSizeMismatch,
        Status::InvalidArgument(std::string(RequestKindName(req.kind)) +
                                " request carries unexpected data frames"));
  }
  const bool clocked = req.kind == RequestKind::kPush ||
                       req.kind == RequestKind::kClock ||
                       req.kind == RequestKind::kPull;
  if (rank >= 0 && clocked) return CheckClock(rank, req.clock);
  return Status::OK();
}

Status Shard::CheckClock(int rank, int64_t clock) {
  if (clock < 0 || clock > kMaxClock) {
    return Reject(RejectReason::kBadClock,
                  Status::InvalidArgument("clock " + std::to_string(clock) +
                                          " out of range [0, 2^62]"));
  }
  const int64_t have = clocks_.clock(rank);
  if (clock > have && clock - have > options_.max_clock_jump) {
    return Reject(RejectReason::kBadClock,
                  Status::InvalidArgument(
                      "rank " + std::to_string(rank) +
                      " moves its clock from " + std::to_string(have) + " to " +
                      std::to_string(clock) + ", more than max_clock_jump (" +
                      std::to_string(options_.max_clock_jump) + ") at once"));
  }
  return Status::OK();
}

void Shard::NoteHeldPush(const RequestHeader& req, const Status& st) {
  HeldPush& h = held_push_[req.rank];
  if (st.code() == StatusCode::kUnavailable ||
      st.code() == StatusCode::kResourceExhausted) {
    // Nothing of it applied; the client sends it again after retry_ms.
    if (h.clock < 0 || h.incarnation != req.incarnation ||
        req.clock < h.clock) {
      h = HeldPush{req.clock, req.incarnation};
    }
  } else if (st.ok() && h.clock >= 0 &&
             (h.incarnation != req.incarnation || req.clock >= h.clock)) {
    h = HeldPush{};  // it came back (or the rank went on past it)
  }
}

void Shard::NoteRefusedPush(const RequestHeader& req) {
  if (req.kind != RequestKind::kPush || req.rank < 0 ||
      req.rank >= options_.num_workers || req.clock < 0 ||
      req.clock > kMaxClock)
    return;
  NoteHeldPush(req, Status::Unavailable("refused before the shard"));
}

Status Shard::CheckHeldPush(const RequestHeader& req, ReplyHeader* reply) {
  HeldPush& h = held_push_[req.rank];
  if (h.clock < 0) return Status::OK();
  if (h.incarnation != req.incarnation) {
    h = HeldPush{};  // another process of the rank: its held push is gone
    return Status::OK();
  }
  if (req.clock <= h.clock) return Status::OK();
  reply->retry_ms = internal::kRetryMs;
  return Reject(
      RejectReason::kWrongClock,
      Status::Unavailable(
          "clock " + std::to_string(req.clock) + " of rank " +
          std::to_string(req.rank) + " overtook its push for clock " +
          std::to_string(h.clock) +
          ", which this shard asked to be sent again: retry after it"));
}

Status Shard::HandleClock(const RequestHeader& req) {
  const bool durable = options_.durable && store_ != nullptr;
  if (durable && degraded_) {
    return Reject(RejectReason::kStore,
                  Status::Unavailable("the store is failing: clocks wait "
                                      "until a checkpoint succeeds; retry"));
  }
  RETURN_IF_ERROR(CheckWorkerLr(req));
  TakeWorkerLr(req);
  clocks_.Advance(req.rank, req.clock);
  if (!durable) return Status::OK();
  // Clocks survive kill -9 too (BSP round membership, SSP bounds).
  touched_.clear();
  Status s = WriteDurable(options_.durable_sync == SyncMode::kSync);
  if (s.ok()) return s;
  EnterDegraded(s);
  return Reject(RejectReason::kStore,
                Status::Unavailable("clock not persisted: " + s.ToString()));
}

void Shard::EnterDegraded(const Status& cause) {
  if (!degraded_) {
    LOG(ERROR) << "durable write failed (" << cause.ToString()
               << "): refusing pushes until a checkpoint succeeds";
  }
  degraded_ = true;
  repair_backoff_ = std::chrono::milliseconds(100);
  next_repair_ = TimePoint{};  // try at the next Tick
}

void Shard::TryRepair(TimePoint now) {
  if (!degraded_ || now < next_repair_) return;
  Status s = Checkpoint();  // ends the degraded state when it succeeds
  if (s.ok()) return;
  LOG_EVERY_N(ERROR, 10) << "repair checkpoint failed: " << s.ToString();
  next_repair_ = now + repair_backoff_;
  repair_backoff_ =
      std::min(repair_backoff_ * 2, std::chrono::milliseconds(5000));
}

void Shard::Tick(TimePoint now, std::vector<OutgoingReply>* out) {
  // A worker whose pull this shard is holding is waiting on us, not dead:
  // its silence does not count until the pull is answered.
  for (const auto& p : parked_) {
    if (p->req.rank >= 0) clocks_.Touch(p->req.rank, now);
  }
  if (clocks_.Expire(now) > 0) {
    FreeEvicted();
    OnClocksChanged(out);
  }
  TryRepair(now);
  if (bsp_round_retry_) OnClocksChanged(out);
  ReleaseParked(out);
  ExpireParked(now, out);
  PruneUnsent();
  if (uploads_) uploads_->Tick(now);
  if (migration_) migration_->Tick(now);
}

void Shard::OnClocksChanged(std::vector<OutgoingReply>* out) {
  if (sparse_) sparse_->AdvanceClock(clocks_.MinLiveClock());
  if (options_.consistency == Consistency::kBsp) {
    const int64_t min = clocks_.MinLiveClock();
    if (min > bsp_round_) {
      // One apply for the round that has contributions, then straight to the
      // minimum: rounds nobody pushed for are not walked one by one.
      if (min > bsp_round_ + 1) {
        LOG(INFO) << "BSP: every live worker is past round " << bsp_round_
                  << ": the round moves to " << min;
      }
      bool applied = false;
      Status s = ApplyBspRound(min, &applied);
      bsp_round_retry_ = !applied;
      if (!applied) {
        // Nothing of the round applied: its pulls wait, Tick tries again.
        LOG_EVERY_N(ERROR, 10)
            << "BSP round not applied, retrying: " << s.ToString();
        CountRejected(RejectReason::kStore);
      } else if (!s.ok()) {
        // The round is applied in memory; only its durable write failed.
        LOG(ERROR) << "BSP round applied, not persisted: " << s.ToString();
        CountRejected(RejectReason::kStore);
        EnterDegraded(s);
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
