// Shard: the pull path (validation, replies from ref-counted snapshots,
// pull codecs and the per-worker replicas of sparse pull codecs) and parked
// pulls. Dispatch is in shard.cc.
#include <glog/logging.h>

#include <algorithm>
#include <cstring>

#include "server/internal/shard_types.h"
#include "server/shard.h"
#if ASYNCPS_SERVER_HAVE_COMPRESSION
#include "compression/codec.h"
#endif

namespace asyncps::server {

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
    Status st = AnswerPull(p.req, &r);
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

Status Shard::AnswerPull(const RequestHeader& req, OutgoingReply* reply) {
  RETURN_IF_ERROR(ValidatePullRequest(req));
  const std::vector<uint32_t>& ids =
      req.pull_chunks.empty() ? layout_->shard_chunks(options_.shard_id)
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
  ++counters_.pulls;
  counters_.bytes_out += bytes;
  if (req.rank >= 0) last_read_[req.rank] = shard_version_;
  return Status::OK();
}

}  // namespace asyncps::server
