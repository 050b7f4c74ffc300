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
  if (sparse.max_keys_per_request < 1 || sparse.max_reply_bytes < 1)
    return Status::InvalidArgument(
        "sparse max_keys_per_request and max_reply_bytes must be >= 1");
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
  } else if (req.kind != RequestKind::kPush &&
             !(req.kind == RequestKind::kPull && !req.rows.empty()) &&
             !data.empty()) {
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
        if (st.ok()) st = ValidateSparsePull(req, data);
        if (!st.ok()) break;
        // Rank -1 (an observer, such as a dedicated evaluator) reads the
        // current weights without taking part in the clocks.
        if (rank >= 0) clocks_.Advance(rank, req.clock);
        if (rank < 0 || PullReady(req.clock)) {
          st = AnswerPull(req, data, &r);
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
          p->data = data;
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

size_t Shard::NumParked(const std::string& peer) const {
  size_t n = 0;
  for (const auto& p : parked_) n += p->peer == peer;
  return n;
}

bool Shard::IsParked(const std::string& peer, uint64_t id) const {
  for (const auto& p : parked_) {
    if (p->req.id == id && p->peer == peer) return true;
  }
  return false;
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
  if (sparse_) sparse_->AdvanceClock(clocks_.MinLiveClock());
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

void Shard::ReleaseParked(std::vector<OutgoingReply>* out) {
  if (parked_.empty()) return;
  size_t keep = 0;
  for (size_t i = 0; i < parked_.size(); ++i) {
    ParkedPull& p = *parked_[i];
    if (!PullReady(p.req.clock)) {
      parked_[keep++] = std::move(parked_[i]);
      continue;
    }
    OutgoingReply r;
    r.peer = std::move(p.peer);
    reject_reason_ = RejectReason::kOther;
    Status st = AnswerPull(p.req, p.data, &r);
    if (!st.ok()) {
      CountRejected(reject_reason_);
      r.header.chunks.clear();
      r.frames.clear();
      r.header.status = st;
    }
    FillCommon(p.req, &r.header);
    out->push_back(std::move(r));
  }
  parked_.resize(keep);
}

void Shard::FailParked(const Status& status, std::vector<OutgoingReply>* out) {
  for (auto& p : parked_) {
    OutgoingReply r;
    r.peer = std::move(p->peer);
    FillCommon(p->req, &r.header);
    r.header.status = status;
    out->push_back(std::move(r));
  }
  parked_.clear();
}

Status Shard::HandleRegister(const RequestHeader& req, ReplyHeader* reply) {
  if (req.layout.num_shards != options_.num_shards) {
    return Reject(
        RejectReason::kRegistrationMismatch,
        Status::InvalidArgument("registration is for " +
                                std::to_string(req.layout.num_shards) +
                                " shards, this server is one of " +
                                std::to_string(options_.num_shards)));
  }
  if (layout_) {
    const auto& have = layout_->tensors();
    for (size_t i = 0; i < std::max(have.size(), req.tensors.size()); ++i) {
      if (i >= have.size() || i >= req.tensors.size() ||
          have[i] != req.tensors[i]) {
        const std::string& name =
            i < req.tensors.size() ? req.tensors[i].name : have[i].name;
        return Reject(RejectReason::kRegistrationMismatch,
                      Status::AlreadyExists(
                          "tensor '" + name + "' (index " + std::to_string(i) +
                          ") does not match the registered layout"));
      }
    }
    if (req.layout.chunk_elems != layout_->options().chunk_elems ||
        req.layout.min_chunk_elems != layout_->options().min_chunk_elems) {
      return Reject(
          RejectReason::kRegistrationMismatch,
          Status::AlreadyExists("chunk_elems/min_chunk_elems differ from the "
                                "registered layout"));
    }
    RETURN_IF_ERROR(RegisterTables(req.tables, /*created=*/false));
    reply->created = false;
    return Status::OK();
  }
  StatusOr<Layout> layout = Layout::Create(req.tensors, req.layout);
  if (!layout.ok()) return Reject(RejectReason::kOther, layout.status());
  layout_ = std::move(layout).value();
  Status st = AllocateChunks();
  if (st.ok()) st = RegisterTables(req.tables, /*created=*/true);
  if (st.ok() && store_ != nullptr) st = Checkpoint();
  if (!st.ok()) {
    layout_.reset();
    chunks_.clear();
    local_index_.clear();
    sparse_.reset();
    return Reject(st.code() == StatusCode::kInvalidArgument
                      ? RejectReason::kRegistrationMismatch
                      : RejectReason::kStore,
                  st.WithContext("registration"));
  }
  LOG(INFO) << "registered " << layout_->tensors().size() << " tensors, "
            << layout_->chunks().size() << " chunks; this shard holds "
            << chunks_.size() << " chunks, "
            << layout_->ShardBytes()[options_.shard_id] << " bytes";
  reply->created = true;
  return Status::OK();
}

Status Shard::AllocateChunks() {
  const Layout& l = *layout_;
  const size_t spe = optimizer_->state_per_elem();
  const auto& mine = l.shard_chunks(options_.shard_id);
  chunks_.clear();
  chunks_.reserve(mine.size());
  local_index_.assign(l.chunks().size(), -1);
  for (uint32_t id : mine) {
    const ChunkSpec& spec = l.chunks()[id];
    auto c = std::make_unique<Chunk>();
    c->id = id;
    c->n = spec.num_elems;
    c->w.resize(c->n);
    InitializeTensorRange(l.tensors()[spec.tensor], spec.offset, spec.num_elems,
                          c->w.data());
    c->state.assign(c->n * spe, 0.0f);
    if (options_.consistency == Consistency::kBsp) c->acc.assign(c->n, 0.0f);
    local_index_[id] = static_cast<int32_t>(chunks_.size());
    chunks_.push_back(std::move(c));
  }
  pending_.reserve(chunks_.size());
  touched_.reserve(chunks_.size());
  return Status::OK();
}

Status Shard::ValidatePullRequest(const RequestHeader& req) {
  if (!layout_) {
    return Reject(
        RejectReason::kNotRegistered,
        Status::FailedPrecondition("no layout registered: register first"));
  }
  for (uint32_t id : req.pull_chunks) {
    if (id >= local_index_.size()) {
      return Reject(RejectReason::kUnknownChunk,
                    Status::NotFound("unknown chunk " + std::to_string(id)));
    }
    if (local_index_[id] < 0) {
      return Reject(RejectReason::kWrongShard,
                    Status::InvalidArgument(
                        "chunk " + std::to_string(id) + " belongs to shard " +
                        std::to_string(layout_->chunks()[id].shard) + ", not " +
                        std::to_string(options_.shard_id)));
    }
  }
  if (!req.pull_codec.empty() && req.pull_codec != "none") {
#if ASYNCPS_SERVER_HAVE_COMPRESSION
    StatusOr<compression::CodecSpec> spec =
        compression::CodecSpec::Parse(req.pull_codec);
    if (!spec.ok()) return Reject(RejectReason::kBadCodec, spec.status());
#else
    return Reject(RejectReason::kBadCodec,
                  Status::Unimplemented("pull codec '" + req.pull_codec +
                                        "' needs the compression library"));
#endif
  }
  return Status::OK();
}

Status Shard::AnswerPull(const RequestHeader& req,
                         const std::vector<ByteView>& data,
                         OutgoingReply* reply) {
  RETURN_IF_ERROR(ValidatePullRequest(req));
  static const std::vector<uint32_t> kNoChunks;
  const std::vector<uint32_t>& ids =
      !req.pull_dense            ? kNoChunks
      : req.pull_chunks.empty() ? layout_->shard_chunks(options_.shard_id)
                                : req.pull_chunks;
#if ASYNCPS_SERVER_HAVE_COMPRESSION
  std::unique_ptr<compression::Codec> codec;
  if (!req.pull_codec.empty() && req.pull_codec != "none") {
    ASSIGN_OR_RETURN(compression::CodecSpec spec,
                     compression::CodecSpec::Parse(req.pull_codec));
    if (spec.id != compression::CodecId::kNone) {
      StatusOr<std::unique_ptr<compression::Codec>> c =
          compression::CreateCodec(spec);
      if (!c.ok()) return Reject(RejectReason::kBadCodec, c.status());
      codec = std::move(c).value();
    }
  }
#endif
  reply->header.chunks.clear();
  reply->header.chunks.reserve(ids.size());
  reply->frames.clear();
  reply->frames.reserve(ids.size());
  // A sparse codec sends the change since this worker's last pull (reply
  // number pull_base_seq), or whole weights when that is not what this
  // shard last sent it (first pull, lost reply, new incarnation, restart).
  PullReplica* replica = nullptr;
  bool resync = false;
#if ASYNCPS_SERVER_HAVE_COMPRESSION
  if (codec && codec->IsSparse()) {
    if (req.rank < 0) {
      return Reject(RejectReason::kBadCodec,
                    Status::InvalidArgument(
                        "sparse pull codecs send changes since a worker's "
                        "last pull: they need a worker rank"));
    }
    replica = &replicas_[req.rank];
    resync = replica->seq == 0 || replica->incarnation != req.incarnation ||
             replica->seq != req.pull_base_seq;
    replica->incarnation = req.incarnation;
    replica->seq = next_pull_seq_++;
    replica->chunks.resize(chunks_.size());
    reply->header.pull_seq = replica->seq;
  }
#endif
  uint64_t bytes = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    Chunk& c = *chunks_[local_index_[ids[i]]];
    ChunkRef ref;
    ref.chunk = c.id;
    ref.frame = static_cast<uint32_t>(i + 1);
    ref.num_elems = c.n;
    ref.version = c.version;
    ByteView view;
#if ASYNCPS_SERVER_HAVE_COMPRESSION
    if (replica != nullptr) {
      std::vector<float>& held = replica->chunks[local_index_[ids[i]]];
      if (resync || held.size() != c.n) {
        held.assign(c.w.begin(), c.w.end());  // whole weights go below
      } else {
        delta_scratch_.resize(c.n);
        for (size_t j = 0; j < c.n; ++j) delta_scratch_[j] = c.w[j] - held[j];
        std::vector<uint8_t> payload;
        Status s =
            codec->Encode(delta_scratch_.data(), c.n, c.version, &payload);
        // The worker adds exactly the decoded payload: so does its replica,
        // and what was not sent stays in the next delta (error feedback).
        if (s.ok()) {
          s = codec->DecodeAdd(payload.data(), payload.size(), c.n, 1.0f,
                               held.data());
        }
        if (!s.ok()) {
          replica->seq = 0;  // resync next time
          return Reject(RejectReason::kBadCodec, s.WithContext("pull codec"));
        }
        BufferPtr b = Buffer::FromVector(std::move(payload));
        ref.codec = static_cast<uint8_t>(codec->id());
        view = ByteView{b->data(), b->size(), b};
      }
    } else if (codec) {
      std::vector<uint8_t> payload;
      Status s = codec->Encode(c.w.data(), c.n, c.version, &payload);
      if (!s.ok())
        return Reject(RejectReason::kBadCodec, s.WithContext("pull codec"));
      BufferPtr b = Buffer::FromVector(std::move(payload));
      ref.codec = static_cast<uint8_t>(codec->id());
      view = ByteView{b->data(), b->size(), b};
    }
#endif
    if (view.data == nullptr) {
      // One snapshot per chunk version, shared by every pull of it; the
      // next push writes the live weights, never a buffer in flight.
      if (!c.snapshot || c.snapshot_version != c.version) {
        // Reuse the old snapshot once ZeroMQ has released it: no allocation
        // (and no page faults) per pull in the steady state.
        if (!c.snapshot || c.snapshot.use_count() > 1) {
          c.snapshot = Buffer::Allocate(c.n * sizeof(float));
        }
        std::memcpy(c.snapshot->data(), c.w.data(), c.n * sizeof(float));
        c.snapshot_version = c.version;
      }
      ref.codec = 0;
      view = ByteView{c.snapshot->data(), c.snapshot->size(), c.snapshot};
    }
    ref.byte_size = view.size;
    bytes += view.size;
    reply->header.chunks.push_back(ref);
    reply->frames.push_back(std::move(view));
  }
  RETURN_IF_ERROR(AnswerSparsePull(req, data, reply));
  for (size_t i = ids.size(); i < reply->frames.size(); ++i)
    bytes += reply->frames[i].size;
  ++counters_.pulls;
  counters_.bytes_out += bytes;
  if (req.rank >= 0) last_read_[req.rank] = shard_version_;
  return Status::OK();
}

std::string Shard::StatsJson() const {
  std::string s = "{";
  auto field = [&s](const char* name, const std::string& value) {
    if (s.size() > 1) s += ',';
    s += '"';
    s += name;
    s += "\":";
    s += value;
  };
  auto num = [](auto v) { return std::to_string(v); };
  field("shard", num(options_.shard_id));
  field("num_shards", num(options_.num_shards));
  field("registered", registered() ? "true" : "false");
  field("tensors", num(layout_ ? layout_->tensors().size() : 0));
  field("chunks", num(chunks_.size()));
  uint64_t bytes = 0;
  for (const auto& c : chunks_) bytes += c->n * sizeof(float);
  field("bytes", num(bytes));
  field("version", num(shard_version_));
  field("consistency",
        std::string("\"") + ConsistencyName(options_.consistency) + "\"");
  field("staleness_bound", num(options_.staleness));
  field("optimizer",
        std::string("\"") + OptimizerKindName(options_.optimizer.kind) + "\"");
  field("num_workers", num(options_.num_workers));
  std::string clocks = "[", live = "[";
  for (int r = 0; r < clocks_.num_workers(); ++r) {
    if (r) clocks += ',', live += ',';
    clocks += num(clocks_.clock(r));
    live += clocks_.live(r) ? "true" : "false";
  }
  field("worker_clocks", clocks + "]");
  field("worker_live", live + "]");
  field("min_clock", num(clocks_.MinLiveClock()));
  field("bsp_round", num(bsp_round_));
  field("parked_pulls", num(parked_.size()));
  field("pushes", num(counters_.pushes));
  field("duplicate_pushes", num(counters_.duplicate_pushes));
  field("pulls", num(counters_.pulls));
  field("bytes_in", num(counters_.bytes_in));
  field("bytes_in_raw", num(counters_.bytes_in_raw));
  field("validate_decode_ms", num(counters_.validate_decode_ns / 1000000));
  field("bytes_out", num(counters_.bytes_out));
  field("checkpoints", num(counters_.checkpoints));
  std::string rej = "{";
  uint64_t total = 0;
  for (size_t i = 0; i < kNumRejectReasons; ++i) {
    total += counters_.rejected[i];
    if (counters_.rejected[i] == 0) continue;
    if (rej.size() > 1) rej += ',';
    rej += std::string("\"") + RejectReasonName(static_cast<RejectReason>(i)) +
           "\":" + num(counters_.rejected[i]);
  }
  field("rejected_total", num(total));
  field("rejected", rej + "}");
  field("staleness", staleness_.ToJson());
  if (sparse_) field("sparse", sparse_->StatsJson());
  return s + "}";
}

}  // namespace asyncps::server
