// Shard: what the core does for elastic shards (server/elastic/). The
// kMigrate steps that move chunks and rows between shards (freeze, export,
// import, adopt, abort) are Migration's (server/migrate/migration.cc, which
// documents them); the core routes every push, pull and clock by the layout
// epoch adopted, holds pushes and clocks back while frozen, and installs
// what Migration imported or adopted.
//
// A push or pull carries the epoch the client routed it by: an older one is
// refused with this shard's document (the client re-routes and resends what
// was refused, nothing of it applied); a newer one, not adopted here yet, is
// asked again shortly. A push this shard applied before the flip and that
// the client resends is acknowledged from the de-duplication table first.
#include <glog/logging.h>

#include <algorithm>

#include "server/shard/shard.h"
#include "server/shard/shard_state.h"
#include "server/shard/shard_types.h"

namespace asyncps::server {

using internal::kRetryMs;

uint64_t Shard::layout_epoch() const { return elastic_->epoch; }
bool Shard::frozen() const { return elastic_->frozen; }
uint64_t Shard::freeze_epoch() const {
  return elastic_->frozen ? elastic_->freeze_epoch : 0;
}
bool Shard::FreezeOverdue(TimePoint now) const {
  return elastic_->frozen && now >= elastic_->freeze_until;
}

Status Shard::CheckRoute(const RequestHeader& req, ReplyHeader* reply) {
  const internal::ElasticState& e = *elastic_;
  if (req.layout_epoch == e.epoch) return Status::OK();
  if (req.layout_epoch > e.epoch) {
    reply->retry_ms = kRetryMs;
    return Reject(
        RejectReason::kStaleLayout,
        Status::Unavailable("layout epoch " + std::to_string(req.layout_epoch) +
                            " not adopted by this shard yet (it is at " +
                            std::to_string(e.epoch) + "): retry"));
  }
  reply->layout_doc = e.doc;
  return Reject(
      RejectReason::kStaleLayout,
      Status::FailedPrecondition(
          std::string(RequestKindName(req.kind)) + " routed by layout epoch " +
          std::to_string(req.layout_epoch) + ", this shard serves epoch " +
          std::to_string(e.epoch) + ": route by the layout in this reply"));
}

Status Shard::CheckFrozen(const RequestHeader& req, ReplyHeader* reply) {
  const internal::ElasticState& e = *elastic_;
  if (!e.frozen || req.rank < 0) return Status::OK();
  bool held;
  if (req.kind == RequestKind::kPush) {
    held = e.freeze_clock < 0 || req.clock >= e.freeze_clock;
  } else {  // kClock: one that does not move the clock changes nothing
    held = req.clock > clocks_.clock(req.rank) &&
           (e.freeze_clock < 0 || req.clock > e.freeze_clock);
  }
  if (!held) return Status::OK();
  reply->retry_ms = kRetryMs;
  return Reject(
      RejectReason::kStaleLayout,
      Status::Unavailable("chunks are moving to layout epoch " +
                          std::to_string(e.freeze_epoch) + ": retry"));
}

Status Shard::ApplyElasticOwners() {
  const internal::ElasticState& e = *elastic_;
  if (e.epoch == 0 || !layout_) return Status::OK();
  options_.num_shards =
      std::max(options_.num_shards, static_cast<int>(e.num_servers));
  StatusOr<Layout> l = layout_->WithOwners(e.owners, options_.num_shards);
  if (!l.ok())
    return Status::Corruption("stored elastic layout: " + l.status().message());
  layout_ = std::move(l).value();
  return Status::OK();
}

void Shard::ApplyKeyRanges() {
  if (sparse_ && elastic_->ranges) sparse_->SetKeyRanges(elastic_->ranges);
}

void Shard::InstallImportedLayout(Layout layout,
                                  const internal::ImportedClocks& state) {
  layout_ = std::move(layout);
  local_index_.assign(layout_->chunks().size(), -1);
  shard_version_ = state.version;
  bsp_round_ = state.round;
  clocks_.Restore(state.clocks, std::chrono::steady_clock::now());
  for (size_t w = 0; w < state.pushed.size(); ++w) {
    bsp_pushed_round_[w] = state.pushed[w];
    last_read_[w] = state.version;
  }
}

void Shard::InstallChunks(std::vector<std::unique_ptr<Chunk>> chunks,
                          std::vector<int32_t> local, Layout layout,
                          int num_shards, uint64_t dropped_bytes) {
  uint64_t elems = 0;
  for (const auto& c : chunks) elems += c->n;
  chunks_ = std::move(chunks);
  local_index_ = std::move(local);
  // The chunks' memory: what stayed keeps the registration's charge, shrunk
  // to what now stays at most; installed chunks keep their own (Migration).
  const uint64_t kept = chunks_charge_.bytes();
  chunks_charge_.ShrinkTo(kept > dropped_bytes ? kept - dropped_bytes : 0);
  layout_ = std::move(layout);
  options_.num_shards = num_shards;
  shard_bytes_ = elems * sizeof(float);
  pending_.reserve(chunks_.size());
  touched_.reserve(chunks_.size());
  pull_stamp_.assign(chunks_.size(), 0);
  for (int r = 0; r < options_.num_workers; ++r) {
    FreeReplica(r);  // local indexes changed: resync with whole weights
    if (!dc_reads_.empty()) FreeDcReads(r);
  }
  for (DcReads& rd : dc_reads_) {
    for (DcReads::Slot& slot : rd.slots) {
      slot = DcReads::Slot{};
      slot.chunks.resize(chunks_.size());
    }
  }
  LOG(INFO) << "elastic: holding " << chunks_.size() << " chunks, "
            << shard_bytes_ << " bytes";
}

void Shard::ReleaseForEpoch(std::vector<OutgoingReply>* out) {
  const internal::ElasticState& e = *elastic_;
  std::fill(held_push_.begin(), held_push_.end(), HeldPush{});
  for (auto it = parked_.begin(); it != parked_.end();) {
    if ((*it)->req.layout_epoch == e.epoch) {
      ++it;
      continue;
    }
    OutgoingReply r;
    r.peer = (*it)->peer;
    FillCommon((*it)->req, &r.header);
    r.header.layout_doc = e.doc;
    r.header.status = Status::FailedPrecondition(
        "pull routed by layout epoch " +
        std::to_string((*it)->req.layout_epoch) +
        ", this shard now serves epoch " + std::to_string(e.epoch));
    out->push_back(std::move(r));
    it = parked_.erase(it);
  }
}

}  // namespace asyncps::server
