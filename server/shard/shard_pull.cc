// Shard: the pull path (validation, replies from ref-counted snapshots,
// pull codecs and the per-worker replicas of sparse pull codecs), parked
// pulls, and the accounting of reply bytes not yet sent. Dispatch is in
// shard.cc.
//
// What a pull may cost the shard is bounded: a chunk is named at most once,
// the reply is at most max_reply_bytes, every buffer made for it (a new
// snapshot while the previous one still waits in ZeroMQ's queue, a codec
// payload, a replica) is drawn from the memory budget first, and a client
// (connection or rank) with max_unsent_bytes_per_client of replies still
// queued gets ResourceExhausted instead of another one.
#include <glog/logging.h>

#include <algorithm>
#include <cstring>

#include "compression/codec.h"
#include "server/shard/shard.h"
#include "server/shard/shard_types.h"
#include "server/shard/sparse_requests.h"

namespace asyncps::server {

size_t Shard::NumParked(const std::string& peer) const {
  size_t n = 0;
  for (const auto& p : parked_) n += p->peer == peer;
  return n;
}

size_t Shard::NumParkedOfRank(int rank) const {
  size_t n = 0;
  for (const auto& p : parked_) n += p->req.rank == rank;
  return n;
}

bool Shard::IsParked(const std::string& peer, uint64_t id) const {
  for (const auto& p : parked_) {
    if (p->req.id == id && p->peer == peer) return true;
  }
  return false;
}

Status Shard::HandlePull(const std::string& peer, const RequestHeader& req,
                         const std::vector<ByteView>& data, TimePoint now,
                         OutgoingReply* r, bool* parked) {
  RETURN_IF_ERROR(CheckRoute(req, &r->header));
  RETURN_IF_ERROR(ValidatePullRequest(req));
  RETURN_IF_ERROR(sparse_requests_->ValidatePull(req, data));
  // Rank -1 (an observer, such as a dedicated evaluator) reads the current
  // weights without waiting and without taking part in the clocks.
  if (req.rank < 0 || PullReady(req.clock))
    return AnswerPull(peer, req, data, r);
  if (IsParked(peer, req.id)) {
    *parked = true;  // a resend of a pull that is already waiting
    return Status::OK();
  }
  if (parked_.size() >= options_.max_parked_pulls) {
    return Reject(
        RejectReason::kTooManyParked,
        Status::ResourceExhausted("too many parked pulls (" +
                                  std::to_string(parked_.size()) + ")"));
  }
  const size_t limit = options_.max_inflight_per_client;
  if (NumParked(peer) >= limit || NumParkedOfRank(req.rank) >= limit) {
    return Reject(
        RejectReason::kTooManyInflight,
        Status::ResourceExhausted(
            "too many requests in flight from this client or rank " +
            std::to_string(req.rank) + " (" + std::to_string(limit) + ")"));
  }
  uint64_t bytes = sizeof(ParkedPull) + peer.size() +
                   req.pull_chunks.size() * sizeof(uint32_t) +
                   req.pull_codec.size() + req.rows.size() * sizeof(RowsRef);
  for (const ByteView& f : data) bytes += f.size;  // keys kept with it
  StatusOr<MemoryBudget::Charge> charge =
      budget_->Reserve(bytes, "a parked pull");
  if (!charge.ok()) return Reject(RejectReason::kMemoryBudget, charge.status());
  auto p = std::make_unique<ParkedPull>();
  p->peer = peer;
  p->req = req;
  p->data = data;
  p->since = now;
  p->charge = std::move(charge).value();
  parked_.push_back(std::move(p));
  *parked = true;
  return Status::OK();
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
    r.peer = p.peer;
    reject_reason_ = RejectReason::kOther;
    Status st = AnswerPull(p.peer, p.req, p.data, &r);
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

void Shard::ExpireParked(TimePoint now, std::vector<OutgoingReply>* out) {
  size_t keep = 0;
  for (size_t i = 0; i < parked_.size(); ++i) {
    ParkedPull& p = *parked_[i];
    if (now - p.since < options_.max_park_time) {
      parked_[keep++] = std::move(parked_[i]);
      continue;
    }
    // The client resends it (Unavailable = retry): a worker that still
    // waits parks again, a request nobody waits for is gone.
    OutgoingReply r;
    r.peer = p.peer;
    FillCommon(p.req, &r.header);
    r.header.status = Status::Unavailable(
        "pull for clock " + std::to_string(p.req.clock) + " waited " +
        std::to_string(options_.max_park_time.count()) + " ms (min clock " +
        std::to_string(clocks_.MinLiveClock()) + "): retry");
    CountRejected(RejectReason::kParkExpired);
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

Status Shard::ValidatePullRequest(const RequestHeader& req) {
  if (!layout_) {
    return Reject(
        RejectReason::kNotRegistered,
        Status::FailedPrecondition("no layout registered: register first"));
  }
  ++pull_stamps_;
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
    uint64_t& stamp = pull_stamp_[local_index_[id]];
    if (stamp == pull_stamps_) {
      return Reject(RejectReason::kRepeatedChunk,
                    Status::InvalidArgument("pull names chunk " +
                                            std::to_string(id) + " twice"));
    }
    stamp = pull_stamps_;
  }
  if (!req.pull_shm_offsets.empty()) return ValidateShmPull(req);
  if (!req.pull_codec.empty() && req.pull_codec != "none") {
    StatusOr<compression::CodecSpec> spec =
        compression::CodecSpec::Parse(req.pull_codec);
    if (!spec.ok()) return Reject(RejectReason::kBadCodec, spec.status());
  }
  return Status::OK();
}

Shard::UnsentBytes& Shard::UnsentOf(const std::string& peer) {
  std::shared_ptr<UnsentBytes>& c = unsent_[peer];
  if (!c) c = std::make_shared<UnsentBytes>(0);
  return *c;
}

void Shard::PruneUnsent() {
  for (auto it = unsent_.begin(); it != unsent_.end();) {
    const bool idle = it->second->load(std::memory_order_relaxed) == 0 &&
                      it->second.use_count() == 1;
    it = idle ? unsent_.erase(it) : std::next(it);
  }
}

void Shard::PinUnsent(const std::string& peer, int rank, uint64_t fresh,
                      OutgoingReply* reply) {
  if (reply->frames.empty()) return;
  auto pin = std::make_shared<ReplyPin>();
  pin->owners.reserve(reply->frames.size());
  uint64_t bytes = 0;
  for (ByteView& f : reply->frames) {
    bytes += f.size;
    pin->owners.push_back(std::move(f.owner));
  }
  pin->counters[0] = unsent_total_;
  pin->added[0] = bytes;
  if (fresh > 0) {
    UnsentOf(peer);
    pin->counters[1] = unsent_[peer];
    pin->added[1] = fresh;
    if (rank >= 0) {
      pin->counters[2] = unsent_by_rank_[rank];
      pin->added[2] = fresh;
    }
  }
  for (size_t i = 0; i < pin->counters.size(); ++i) {
    if (pin->counters[i])
      pin->counters[i]->fetch_add(pin->added[i], std::memory_order_relaxed);
  }
  for (ByteView& f : reply->frames) f.owner = pin;
}

void Shard::FreeReplica(int rank) { replicas_[rank].reset(); }

Status Shard::EnsureSnapshot(Chunk& c, uint64_t* fresh) {
  // One snapshot per chunk version, shared by every pull of it; the next
  // push writes the live weights, never a buffer in flight.
  if (c.snapshot && c.snapshot_version == c.version) return Status::OK();
  // Reuse the old snapshot once nothing else holds it (ZeroMQ released it,
  // no delay-compensation read): no allocation (and no page faults) per
  // pull in the steady state.
  if (!c.snapshot || c.snapshot.use_count() > 1) {
    StatusOr<MemoryBudget::Charge> charge =
        budget_->Reserve(c.n * sizeof(float),
                         "a pull snapshot of chunk " + std::to_string(c.id));
    if (!charge.ok())
      return Reject(RejectReason::kMemoryBudget, charge.status());
    auto snap = std::make_shared<ChargedBuffer>();
    snap->charge = std::move(charge).value();
    if (fresh != nullptr) *fresh += c.n * sizeof(float);
    snap->buffer = Buffer::Allocate(c.n * sizeof(float));
    c.snapshot = std::move(snap);
  }
  std::memcpy(c.snapshot->buffer->data(), c.w.data(), c.n * sizeof(float));
  c.snapshot_version = c.version;
  return Status::OK();
}

Status Shard::CheckUnsent(const std::string& peer, int rank) {
  // A client that pulls and does not read would otherwise pin snapshot after
  // snapshot in ZeroMQ's queue. What counts against it is the buffers made
  // for its replies (a new snapshot because the previous one is still
  // queued, codec payloads): repeated pulls of one version share a snapshot
  // and cost nothing. One reply is always allowed, more only while the
  // earlier ones' buffers are below the limit.
  const auto found = unsent_.find(peer);
  const uint64_t unsent_peer =
      found == unsent_.end() ? 0
                             : found->second->load(std::memory_order_relaxed);
  const uint64_t unsent_rank =
      rank >= 0 ? unsent_by_rank_[rank]->load(std::memory_order_relaxed) : 0;
  const uint64_t unsent_limit = options_.max_unsent_bytes_per_client;
  if (unsent_peer >= unsent_limit || unsent_rank >= unsent_limit) {
    return Reject(RejectReason::kUnsentReplies,
                  Status::ResourceExhausted(
                      std::to_string(std::max(unsent_peer, unsent_rank)) +
                      " bytes of earlier replies to this client are not yet "
                      "sent (limit " +
                      std::to_string(unsent_limit) + "): read them first"));
  }
  return Status::OK();
}

Status Shard::MakePullCodec(const RequestHeader& req,
                            const std::vector<uint32_t>& ids,
                            std::unique_ptr<compression::Codec>* codec) {
  if (!req.pull_codec.empty() && req.pull_codec != "none") {
    ASSIGN_OR_RETURN(compression::CodecSpec spec,
                     compression::CodecSpec::Parse(req.pull_codec));
    if (spec.id != compression::CodecId::kNone) {
      StatusOr<std::unique_ptr<compression::Codec>> c =
          compression::CreateCodec(spec);
      if (!c.ok()) return Reject(RejectReason::kBadCodec, c.status());
      *codec = std::move(c).value();
    }
  }
  uint64_t most = 0;
  for (uint32_t id : ids) {
    const uint64_t n = chunks_[local_index_[id]]->n;
    if (*codec) {
      most +=
          std::max<uint64_t>((*codec)->MaxEncodedBytes(n), n * sizeof(float));
      continue;
    }
    most += n * sizeof(float);
  }
  const uint64_t reply_limit = options_.max_reply_bytes != 0
                                   ? options_.max_reply_bytes
                                   : 2 * shard_bytes_ + (uint64_t{1} << 20);
  if (most > reply_limit) {
    return Reject(
        RejectReason::kOversize,
        Status::InvalidArgument("pull of " + std::to_string(ids.size()) +
                                " chunks could need " + std::to_string(most) +
                                " bytes, above the reply limit of " +
                                std::to_string(reply_limit)));
  }
  return Status::OK();
}

Status Shard::TakePullReplica(const RequestHeader& req, OutgoingReply* reply,
                              PullReplica** replica, bool* resync) {
  if (req.rank < 0) {
    return Reject(RejectReason::kBadCodec,
                  Status::InvalidArgument(
                      "sparse pull codecs send changes since a worker's "
                      "last pull: they need a worker rank"));
  }
  std::unique_ptr<PullReplica>& slot = replicas_[req.rank];
  if (slot &&
      (slot->incarnation != req.incarnation || slot->codec != req.pull_codec)) {
    slot.reset();  // a new client process or codec: start over
  }
  if (!slot) {
    StatusOr<MemoryBudget::Charge> charge = budget_->Reserve(
        shard_bytes_, "the pull replica of rank " + std::to_string(req.rank));
    if (!charge.ok())
      return Reject(RejectReason::kMemoryBudget, charge.status());
    slot = std::make_unique<PullReplica>();
    slot->incarnation = req.incarnation;
    slot->codec = req.pull_codec;
    slot->chunks.resize(chunks_.size());
    slot->charge = std::move(charge).value();
  }
  *replica = slot.get();
  *resync = (*replica)->seq == 0 || (*replica)->seq != req.pull_base_seq;
  (*replica)->seq = next_pull_seq_++;
  reply->header.pull_seq = (*replica)->seq;
  return Status::OK();
}

Status Shard::EncodePulled(const Chunk& c, const float* x,
                           compression::Codec* codec, ChunkRef* ref,
                           ByteView* view, uint64_t* fresh) {
  StatusOr<MemoryBudget::Charge> charge =
      budget_->Reserve(codec->MaxEncodedBytes(c.n), "a pull codec payload");
  if (!charge.ok()) return Reject(RejectReason::kMemoryBudget, charge.status());
  std::vector<uint8_t> payload;
  Status s = codec->Encode(x, c.n, c.version, &payload);
  if (!s.ok())
    return Reject(RejectReason::kBadCodec, s.WithContext("pull codec"));
  auto held = std::make_shared<ChargedBuffer>();
  held->charge = std::move(charge).value();
  held->charge.ShrinkTo(payload.capacity());
  *fresh += held->charge.bytes();
  held->buffer = Buffer::FromVector(std::move(payload));
  ref->codec = static_cast<uint8_t>(codec->id());
  *view = ByteView{held->buffer->data(), held->buffer->size(), held};
  return Status::OK();
}

Status Shard::AddPulledChunk(uint32_t id, uint32_t frame,
                             compression::Codec* codec, PullReplica* replica,
                             bool resync, OutgoingReply* reply,
                             uint64_t* fresh) {
  Chunk& c = *chunks_[local_index_[id]];
  ChunkRef ref;
  ref.chunk = c.id;
  ref.frame = frame;
  ref.num_elems = c.n;
  ref.version = c.version;
  ByteView view;
  if (replica != nullptr) {
    std::vector<float>& held = replica->chunks[local_index_[id]];
    if (resync || held.size() != c.n) {
      held.assign(c.w.begin(), c.w.end());  // whole weights go below
    } else {
      delta_scratch_.resize(c.n);
      for (size_t j = 0; j < c.n; ++j) delta_scratch_[j] = c.w[j] - held[j];
      Status s =
          EncodePulled(c, delta_scratch_.data(), codec, &ref, &view, fresh);
      // The worker adds exactly the decoded payload: so does its replica,
      // and what was not sent stays in the next delta (error feedback).
      if (s.ok()) {
        s = codec->DecodeAdd(view.data, view.size, c.n, 1.0f, held.data());
        if (!s.ok()) s = Reject(RejectReason::kBadCodec, s);
      }
      if (!s.ok()) return s;
    }
  } else if (codec) {
    RETURN_IF_ERROR(EncodePulled(c, c.w.data(), codec, &ref, &view, fresh));
  }
  if (view.data == nullptr) {
    RETURN_IF_ERROR(EnsureSnapshot(c, fresh));
    ref.codec = 0;
    view = ByteView{c.snapshot->buffer->data(), c.snapshot->buffer->size(),
                    c.snapshot};
  }
  ref.byte_size = view.size;
  reply->header.chunks.push_back(ref);
  reply->frames.push_back(std::move(view));
  return Status::OK();
}

Status Shard::AnswerPull(const std::string& peer, const RequestHeader& req,
                         const std::vector<ByteView>& data,
                         OutgoingReply* reply) {
  RETURN_IF_ERROR(ValidatePullRequest(req));
  RETURN_IF_ERROR(CheckUnsent(peer, req.rank));
  static const std::vector<uint32_t> kNoChunks;
  const std::vector<uint32_t>& ids =
      !req.pull_dense           ? kNoChunks  // rows only
      : req.pull_chunks.empty() ? layout_->shard_chunks(options_.shard_id)
                                : req.pull_chunks;
  std::unique_ptr<compression::Codec> codec;
  RETURN_IF_ERROR(MakePullCodec(req, ids, &codec));
  if (!req.pull_shm_offsets.empty()) {
    RETURN_IF_ERROR(AnswerShmPull(req, ids, reply));
    if (!dc_reads_.empty() && req.rank >= 0)
      RETURN_IF_ERROR(RecordDcRead(req, ids));
    if (req.rank >= 0) {
      FreeReplica(req.rank);
      last_read_[req.rank] = shard_version_;
    }
    return Status::OK();
  }
  reply->header.chunks.clear();
  reply->header.chunks.reserve(ids.size());
  reply->frames.clear();
  reply->frames.reserve(ids.size());
  // A sparse codec sends the change since this worker's last pull (reply
  // number pull_base_seq), or whole weights when that is not what this
  // shard last sent it (first pull, lost reply, new incarnation, restart).
  PullReplica* replica = nullptr;
  bool resync = false;
  if (codec && codec->IsSparse())
    RETURN_IF_ERROR(TakePullReplica(req, reply, &replica, &resync));
  // A worker that pulls without a sparse codec no longer needs its replica.
  if (replica == nullptr && req.rank >= 0) FreeReplica(req.rank);
  uint64_t fresh = 0;
  Status s;
  for (size_t i = 0; i < ids.size() && s.ok(); ++i) {
    s = AddPulledChunk(ids[i], static_cast<uint32_t>(i + 1), codec.get(),
                       replica, resync, reply, &fresh);
  }
  if (s.ok() && !dc_reads_.empty() && req.rank >= 0) s = RecordDcRead(req, ids);
  if (!s.ok()) {
    if (replica != nullptr) replica->seq = 0;  // resync next time
    return s;
  }
  RETURN_IF_ERROR(sparse_requests_->AnswerPull(req, data, reply, &fresh));
  uint64_t bytes = 0;
  for (const ByteView& f : reply->frames) bytes += f.size;
  ++counters_.pulls;
  counters_.bytes_out += bytes;
  if (req.rank >= 0) last_read_[req.rank] = shard_version_;
  PinUnsent(peer, req.rank, fresh, reply);
  return Status::OK();
}

}  // namespace asyncps::server
