// Shard: elastic shards (server/elastic/). ps_ctl moves chunks between shards
// while training runs, in steps the shard answers as kMigrate requests:
//
//   freeze  toward epoch E+1 at clock F: pushes of clock >= F and clocks > F
//           are refused (Unavailable, retry_ms), so under BSP every round
//           below F completes and nothing is half-summed ("drained"); F = -1
//           holds back every push and clock (ASP/SSP: nothing accumulates).
//   export  the records of the chunks that move (the persistence formats of
//           shard_persist.cc), the layout and the shard state (clocks, round).
//   import  on the destination: staged, not served (an empty shard registers
//           the layout and takes the clocks and round from the state record).
//   adopt   the document of epoch E+1 (committed in etcd by then): staged
//           chunks the document gives this shard are installed, chunks it
//           gives away are dropped, pushes flow again.
//   abort   staged chunks dropped, pushes flow again, the old layout stays.
//
// A push or pull carries the epoch the client routed it by: an older one is
// refused with this shard's document (the client re-routes and resends what
// was refused, nothing of it applied); a newer one, not adopted here yet, is
// asked again shortly. A push this shard applied before the flip and that
// the client resends is acknowledged from the de-duplication table first.
#include <glog/logging.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/elastic_doc.h"
#include "server/internal/layout_record.h"
#include "server/internal/shard_records.h"
#include "server/shard/shard_types.h"
#include "server/shard/shard.h"

namespace asyncps::server {
namespace {

using internal::kChunkMagic;
using internal::kRetryMs;
using internal::kStateMagic;
using internal::Reader;

}  // namespace

uint64_t Shard::layout_epoch() const { return elastic_->epoch; }
bool Shard::frozen() const { return elastic_->frozen; }
uint64_t Shard::freeze_epoch() const {
  return elastic_->frozen ? elastic_->freeze_epoch : 0;
}
bool Shard::FreezeOverdue(TimePoint now) const {
  return elastic_->frozen && now >= elastic_->freeze_until;
}

Status Shard::CheckRoute(const RequestHeader& req, ReplyHeader* reply) {
  const ElasticState& e = *elastic_;
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
  const ElasticState& e = *elastic_;
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

bool Shard::Drained() const {
  const ElasticState& e = *elastic_;
  if (!e.frozen) return false;
  if (options_.consistency != Consistency::kBsp || e.freeze_clock < 0)
    return true;
  if (bsp_round_ < e.freeze_clock) return false;
  for (const auto& c : chunks_) {
    if (c->contributors != 0) return false;
  }
  // The round's sums of sparse rows too (applied with the round).
  return sparse_ == nullptr || !sparse_->HasRoundSums();
}

std::string Shard::DescribeJson() const {
  const ElasticState& e = *elastic_;
  nlohmann::json j;
  j["shard"] = options_.shard_id;
  j["num_shards"] = options_.num_shards;
  j["epoch"] = e.epoch;
  j["registered"] = layout_.has_value();
  j["consistency"] = ConsistencyName(options_.consistency);
  j["frozen"] = e.frozen;
  j["freeze_epoch"] = e.freeze_epoch;
  j["drained"] = Drained();
  int64_t max_clock = 0;
  for (int r = 0; r < clocks_.num_workers(); ++r) {
    if (clocks_.live(r)) max_clock = std::max(max_clock, clocks_.clock(r));
  }
  j["max_clock"] = max_clock;
  // The latest BSP round any worker pushed for (-1: none): a freeze clock
  // must be past it (kFreeze refuses one that is not).
  int64_t max_pushed = -1;
  for (int64_t p : bsp_pushed_round_) max_pushed = std::max(max_pushed, p);
  j["max_pushed_round"] = max_pushed;
  j["min_clock"] = clocks_.MinLiveClock();
  j["bsp_round"] = bsp_round_;
  j["sparse_tables"] = sparse_ != nullptr;
  // Key ranges served (0: static) and the rows held, cached or stored (an
  // estimate: the coordinator sizes its requests by it).
  j["num_buckets"] = e.ranges ? e.ranges->num_buckets : 0;
  j["sparse_bytes"] = sparse_ ? sparse_->MoveBytesEstimate() : 0;
  nlohmann::json elems = nlohmann::json::array(),
                 owners = nlohmann::json::array(),
                 owned = nlohmann::json::array(),
                 staged = nlohmann::json::array();
  if (layout_) {
    for (const ChunkSpec& c : layout_->chunks()) {
      elems.push_back(c.num_elems);
      owners.push_back(c.shard);
    }
    for (const auto& c : chunks_) owned.push_back(c->id);
  }
  for (const auto& [id, s] : e.staged) staged.push_back(id);
  j["num_chunks"] = elems.size();
  j["chunk_elems"] = std::move(elems);
  j["owners"] = std::move(owners);
  j["owned"] = std::move(owned);
  j["staged"] = std::move(staged);
  return j.dump();
}

Status Shard::HandleMigrate(const RequestHeader& req,
                            const std::vector<ByteView>& data, OutgoingReply* r,
                            std::vector<OutgoingReply>* out) {
  ElasticState& e = *elastic_;
  if (req.migrate_op != MigrateOp::kImport && !data.empty()) {
    return Reject(RejectReason::kSizeMismatch,
                  Status::InvalidArgument(
                      "migrate request carries unexpected data frames"));
  }
  // Rows of sparse tables move by buckets (shard_migrate_rows.cc), chunks by
  // id; one request moves one kind.
  const bool rows =
      !req.migrate_buckets.empty() || req.migrate_num_buckets != 0;
  if (rows && !req.migrate_chunks.empty()) {
    return Reject(
        RejectReason::kOther,
        Status::InvalidArgument("a migrate request names chunks and buckets: "
                                "move them in separate requests"));
  }
  switch (req.migrate_op) {
    case MigrateOp::kDescribe:
      r->header.text = DescribeJson();
      return Status::OK();
    case MigrateOp::kFreeze: {
      if (req.migrate_epoch <= e.epoch) {
        return Reject(
            RejectReason::kStaleLayout,
            Status::FailedPrecondition(
                "freeze toward epoch " + std::to_string(req.migrate_epoch) +
                ": this shard is at epoch " + std::to_string(e.epoch)));
      }
      if (e.frozen && e.freeze_epoch != req.migrate_epoch) {
        return Reject(RejectReason::kOther, Status::FailedPrecondition(
                                                "already frozen toward epoch " +
                                                std::to_string(e.freeze_epoch) +
                                                ": adopt or abort it first"));
      }
      const int64_t at = req.migrate_at_clock;
      if (at < -1 || at > kMaxClock) {
        return Reject(
            RejectReason::kBadClock,
            Status::InvalidArgument("freeze clock " + std::to_string(at) +
                                    " not in [-1, 2^62]"));
      }
      if (at >= 0 && options_.consistency == Consistency::kBsp) {
        for (int rank = 0; rank < clocks_.num_workers(); ++rank) {
          if (clocks_.clock(rank) > at || bsp_pushed_round_[rank] >= at) {
            return Reject(
                RejectReason::kBadClock,
                Status::FailedPrecondition(
                    "worker " + std::to_string(rank) + " is already at clock " +
                    std::to_string(clocks_.clock(rank)) +
                    ", past the freeze clock " + std::to_string(at)));
          }
        }
      }
      if (at >= 0 && options_.consistency != Consistency::kBsp) {
        return Reject(RejectReason::kOther,
                      Status::InvalidArgument(
                          "a freeze at a clock is for BSP; " +
                          std::string(ConsistencyName(options_.consistency)) +
                          " freezes at -1"));
      }
      e.frozen = true;
      e.freeze_epoch = req.migrate_epoch;
      e.freeze_clock = at;
      e.freeze_until = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(
                           std::max<uint32_t>(req.migrate_deadline_ms, 1));
      LOG(INFO) << "elastic: frozen toward epoch " << e.freeze_epoch
                << " at clock " << at;
      r->header.text = DescribeJson();
      return Status::OK();
    }
    case MigrateOp::kExport:
      return rows ? ExportRows(req, r) : ExportChunks(req, r);
    case MigrateOp::kImport:
      return rows ? ImportRows(req, data) : ImportChunks(req, data);
    case MigrateOp::kAdopt:
      return Adopt(req, out);
    case MigrateOp::kAbort:
      if (e.frozen && e.freeze_epoch == req.migrate_epoch) {
        e.staged.clear();
        EndFreeze("aborted");
      }
      return Status::OK();
  }
  return Reject(RejectReason::kOther,
                Status::InvalidArgument("unknown migrate op"));
}

void Shard::EndFreeze(const char* why) {
  ElasticState& e = *elastic_;
  LOG(INFO) << "elastic: freeze toward epoch " << e.freeze_epoch << " " << why
            << "; serving epoch " << e.epoch;
  e.frozen = false;
  e.freeze_epoch = 0;
  e.freeze_clock = -1;
  // Rows staged and not installed (abort) are dropped with the freeze.
  if (sparse_) sparse_->DropStaged();
  e.staged_num_buckets = 0;
  e.staged_buckets.clear();
  e.staged_rows_charge.Reset();
}

Status Shard::ExportChunks(const RequestHeader& req, OutgoingReply* r) {
  ElasticState& e = *elastic_;
  if (!layout_) {
    return Reject(
        RejectReason::kNotRegistered,
        Status::FailedPrecondition("no layout registered: nothing to export"));
  }
  if (!e.frozen || e.freeze_epoch != req.migrate_epoch || !Drained()) {
    return Reject(RejectReason::kOther,
                  Status::FailedPrecondition(
                      "export needs the shard frozen toward epoch " +
                      std::to_string(req.migrate_epoch) + " and drained"));
  }
  std::vector<uint32_t> ids = req.migrate_chunks;
  std::vector<uint32_t> sorted = ids;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return Reject(RejectReason::kRepeatedChunk,
                  Status::InvalidArgument("export names a chunk twice"));
  }
  uint64_t bytes = 0;
  for (uint32_t id : ids) {
    if (id >= local_index_.size() || local_index_[id] < 0) {
      return Reject(RejectReason::kWrongShard,
                    Status::NotFound("chunk " + std::to_string(id) +
                                     " is not held by this shard"));
    }
    const Chunk& c = *chunks_[local_index_[id]];
    bytes += (c.w.size() + c.state.size() + c.acc.size()) * sizeof(float) + 64;
  }
  StatusOr<MemoryBudget::Charge> charge = budget_->Reserve(
      bytes, "an export of " + std::to_string(ids.size()) + " chunks");
  if (!charge.ok()) return Reject(RejectReason::kMemoryBudget, charge.status());
  auto held = std::make_shared<MemoryBudget::Charge>(std::move(charge).value());
  entries_.clear();
  AddLayoutEntry(&entries_);
  AddStateEntry(&entries_);
  for (uint32_t id : ids) AddChunkEntry(*chunks_[local_index_[id]], &entries_);
  for (const StoreEntry& en : entries_) {
    size_t n = en.head.size();
    for (const StorePart& p : en.parts) n += p.size;
    std::shared_ptr<Buffer> b = Buffer::Allocate(n);
    uint8_t* dst = b->data();
    std::memcpy(dst, en.head.data(), en.head.size());
    size_t at = en.head.size();
    for (const StorePart& p : en.parts) {
      std::memcpy(dst + at, p.data, p.size);
      at += p.size;
    }
    ByteView v;
    v.data = b->data();
    v.size = n;
    v.owner = std::shared_ptr<const void>(b, b.get());
    r->frames.push_back(std::move(v));
  }
  entries_.clear();
  // The charge lives as long as the first frame (released with the reply).
  auto keep =
      std::make_shared<std::pair<std::shared_ptr<const void>,
                                 std::shared_ptr<MemoryBudget::Charge>>>(
          r->frames[0].owner, held);
  r->frames[0].owner = std::shared_ptr<const void>(keep, keep.get());
  PinUnsent("", -1, 0, r);
  LOG(INFO) << "elastic: exported " << ids.size() << " chunks toward epoch "
            << req.migrate_epoch;
  return Status::OK();
}

Status Shard::ImportChunks(const RequestHeader& req,
                           const std::vector<ByteView>& data) {
  ElasticState& e = *elastic_;
  const std::vector<uint32_t>& ids = req.migrate_chunks;
  if (data.size() != ids.size() + 2) {
    return Reject(RejectReason::kSizeMismatch,
                  Status::InvalidArgument(
                      "import of " + std::to_string(ids.size()) +
                      " chunks needs " + std::to_string(ids.size() + 2) +
                      " data frames, got " + std::to_string(data.size())));
  }
  if (!e.frozen || e.freeze_epoch != req.migrate_epoch) {
    return Reject(RejectReason::kOther,
                  Status::FailedPrecondition(
                      "import needs the shard frozen toward epoch " +
                      std::to_string(req.migrate_epoch)));
  }
  std::vector<TensorSpec> tensors;
  LayoutOptions lo;
  {
    Status s = internal::ParseLayoutRecord(
        std::string_view(reinterpret_cast<const char*>(data[0].data),
                         data[0].size),
        &tensors, &lo);
    if (!s.ok())
      return Reject(RejectReason::kMalformed,
                    Status::InvalidArgument(s.message()));
  }
  // The state record's head: clocks and rounds (shard_persist.cc's format).
  Reader sr(std::string_view(reinterpret_cast<const char*>(data[1].data),
                             data[1].size));
  uint32_t magic = 0, nw = 0;
  int32_t sid = 0, sn = 0;
  uint64_t version = 0;
  int64_t round = 0;
  if (!sr.Get(&magic) || magic != kStateMagic || !sr.Get(&sid) ||
      !sr.Get(&sn) || !sr.Get(&nw) || !sr.Get(&version) || !sr.Get(&round) ||
      static_cast<int>(nw) != options_.num_workers) {
    return Reject(RejectReason::kMalformed,
                  Status::InvalidArgument(
                      "import: the state record is damaged or for " +
                      std::to_string(nw) + " workers, this shard has " +
                      std::to_string(options_.num_workers)));
  }
  std::vector<int64_t> clocks(nw), pushed(nw);
  std::vector<uint64_t> reads(nw);
  for (uint32_t w = 0; w < nw; ++w) {
    if (!sr.Get(&clocks[w]) || !sr.Get(&reads[w]) || !sr.Get(&pushed[w])) {
      return Reject(
          RejectReason::kMalformed,
          Status::InvalidArgument("import: the state record is damaged"));
    }
  }
  const bool fresh = !layout_;
  std::optional<Layout> candidate;
  if (fresh) {
    RETURN_IF_ERROR(ChargeLayoutTables(tensors, lo));
    StatusOr<Layout> l = Layout::Create(tensors, lo);
    if (!l.ok()) {
      layout_charge_.Reset();
      return Reject(RejectReason::kOther, l.status());
    }
    const int n = std::max(options_.num_shards, l->num_shards());
    StatusOr<Layout> mine = l->WithOwners(l->Owners(), n);
    if (!mine.ok()) {
      layout_charge_.Reset();
      return Reject(RejectReason::kOther, mine.status());
    }
    candidate = std::move(mine).value();
  } else if (tensors != layout_->tensors() ||
             lo.chunk_elems != layout_->options().chunk_elems ||
             lo.min_chunk_elems != layout_->options().min_chunk_elems ||
             lo.placement != layout_->options().placement) {
    return Reject(RejectReason::kRegistrationMismatch,
                  Status::AlreadyExists("import of another model's chunks"));
  }
  const Layout& l = fresh ? *candidate : *layout_;
  // Every chunk record checked before any is staged.
  const size_t spe = state_per_elem_;
  std::map<uint32_t, ElasticState::Staged> staged;
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint32_t id = ids[i];
    if (id >= l.chunks().size() || staged.count(id) > 0) {
      if (fresh) layout_charge_.Reset();
      return Reject(
          RejectReason::kUnknownChunk,
          Status::InvalidArgument("import names chunk " + std::to_string(id) +
                                  " twice or outside the layout"));
    }
    const uint64_t n = l.chunks()[id].num_elems;
    Reader r(std::string_view(reinterpret_cast<const char*>(data[i + 2].data),
                              data[i + 2].size));
    uint32_t cm = 0, cspe = 0, contributors = 0;
    uint64_t cn = 0, cversion = 0, cstep = 0;
    uint8_t has_acc = 0;
    if (!r.Get(&cm) || cm != kChunkMagic || !r.Get(&cn) || cn != n ||
        !r.Get(&cspe) || cspe != spe || !r.Get(&cversion) || !r.Get(&cstep) ||
        !r.Get(&contributors) || !r.Get(&has_acc) || contributors != 0 ||
        r.remaining() != n * sizeof(float) * (1 + spe + (has_acc ? 1 : 0))) {
      if (fresh) layout_charge_.Reset();
      return Reject(RejectReason::kSizeMismatch,
                    Status::InvalidArgument(
                        "import: the record of chunk " + std::to_string(id) +
                        " is damaged, has another optimizer state or a "
                        "half-summed round"));
    }
    const uint64_t per_elem =
        sizeof(float) *
        (2 + spe + (options_.consistency == Consistency::kBsp ? 1 : 0));
    StatusOr<MemoryBudget::Charge> charge = budget_->Reserve(
        n * per_elem + sizeof(Chunk), "staged chunk " + std::to_string(id));
    if (!charge.ok()) {
      if (fresh) layout_charge_.Reset();
      return Reject(RejectReason::kMemoryBudget, charge.status());
    }
    auto c = std::make_unique<Chunk>();
    c->id = id;
    c->n = n;
    c->w.resize(n);
    c->state.resize(n * spe);
    (void)r.GetBytes(c->w.data(), n * sizeof(float));
    (void)r.GetBytes(c->state.data(), c->state.size() * sizeof(float));
    c->version = cversion;
    c->step = cstep;
    if (options_.consistency == Consistency::kBsp) {
      c->acc.assign(n, 0.0f);
      c->pushed_round.assign(options_.num_workers, -1);  // drained: none yet
    }
    staged[id] = ElasticState::Staged{std::move(c), std::move(charge).value()};
  }
  if (fresh) {
    layout_ = std::move(candidate);
    local_index_.assign(layout_->chunks().size(), -1);
    shard_version_ = version;
    bsp_round_ = round;
    const auto now = std::chrono::steady_clock::now();
    clocks_.Restore(clocks, now);
    for (uint32_t w = 0; w < nw; ++w) {
      bsp_pushed_round_[w] = pushed[w];
      last_read_[w] = version;
    }
    LOG(INFO) << "elastic: registered " << layout_->tensors().size()
              << " tensors from an import; round " << bsp_round_;
  }
  for (auto& [id, s] : staged) e.staged[id] = std::move(s);
  LOG(INFO) << "elastic: staged " << ids.size() << " chunks toward epoch "
            << e.freeze_epoch;
  return Status::OK();
}

Status Shard::Adopt(const RequestHeader& req, std::vector<OutgoingReply>* out) {
  ElasticState& e = *elastic_;
  StatusOr<ElasticDoc> parsed =
      ElasticDoc::FromJson(req.migrate_doc);
  if (!parsed.ok()) return Reject(RejectReason::kMalformed, parsed.status());
  const ElasticDoc& doc = *parsed;
  if (doc.epoch != req.migrate_epoch) {
    return Reject(RejectReason::kOther,
                  Status::InvalidArgument("adopt of epoch " +
                                          std::to_string(req.migrate_epoch) +
                                          " with a document of epoch " +
                                          std::to_string(doc.epoch)));
  }
  if (doc.epoch == e.epoch && req.migrate_doc == e.doc)
    return Status::OK();  // again
  if (doc.epoch <= e.epoch) {
    return Reject(RejectReason::kStaleLayout,
                  Status::FailedPrecondition(
                      "adopt of epoch " + std::to_string(doc.epoch) +
                      ": this shard is at epoch " + std::to_string(e.epoch)));
  }
  if (!layout_) {
    return Reject(RejectReason::kNotRegistered,
                  Status::FailedPrecondition(
                      "adopt before a layout is registered or imported"));
  }
  if (doc.owners.size() != layout_->chunks().size() ||
      options_.shard_id >= static_cast<int>(doc.servers.size())) {
    return Reject(
        RejectReason::kOther,
        Status::InvalidArgument(
            "the document lists " + std::to_string(doc.owners.size()) +
            " chunks and " + std::to_string(doc.servers.size()) +
            " servers; this shard (index " + std::to_string(options_.shard_id) +
            ") holds a layout of " + std::to_string(layout_->chunks().size()) +
            " chunks"));
  }
  // Everything this shard will own is here or staged, before anything moves.
  for (uint32_t id = 0; id < doc.owners.size(); ++id) {
    if (doc.owners[id] != options_.shard_id) continue;
    const bool have = local_index_[id] >= 0 || e.staged.count(id) > 0;
    if (!have) {
      return Reject(RejectReason::kOther,
                    Status::FailedPrecondition(
                        "adopt gives this shard chunk " + std::to_string(id) +
                        " that it neither holds nor has staged"));
    }
  }
  RETURN_IF_ERROR(CheckAdoptRows(doc));
  const int num_shards =
      std::max(options_.num_shards, static_cast<int>(doc.servers.size()));
  StatusOr<Layout> next = layout_->WithOwners(doc.owners, num_shards);
  if (!next.ok()) return Reject(RejectReason::kOther, next.status());
  std::vector<std::unique_ptr<Chunk>> chunks;
  std::vector<int32_t> local(doc.owners.size(), -1);
  std::vector<MemoryBudget::Charge> charges;
  uint64_t elems = 0, dropped = 0, dropped_bytes = 0, installed = 0;
  const uint64_t per_elem =
      sizeof(float) * (2 + state_per_elem_ +
                       (options_.consistency == Consistency::kBsp ? 1 : 0));
  for (uint32_t id = 0; id < doc.owners.size(); ++id) {
    const bool mine = doc.owners[id] == options_.shard_id;
    if (local_index_[id] >= 0) {
      if (mine) {
        local[id] = static_cast<int32_t>(chunks.size());
        chunks.push_back(std::move(chunks_[local_index_[id]]));
      } else {
        ++dropped;
        dropped_bytes +=
            chunks_[local_index_[id]]->n * per_elem + sizeof(Chunk);
      }
      continue;
    }
    if (!mine) continue;
    auto it = e.staged.find(id);
    local[id] = static_cast<int32_t>(chunks.size());
    chunks.push_back(std::move(it->second.chunk));
    charges.push_back(std::move(it->second.charge));
    e.staged.erase(it);
    ++installed;
  }
  for (const auto& c : chunks) elems += c->n;
  chunks_ = std::move(chunks);
  local_index_ = std::move(local);
  // The chunks' memory: what stayed keeps the registration's charge, shrunk
  // to what now stays at most; installed chunks keep their own.
  const uint64_t kept = chunks_charge_.bytes();
  chunks_charge_.ShrinkTo(kept > dropped_bytes ? kept - dropped_bytes : 0);
  for (auto& c : charges) elastic_charges_.push_back(std::move(c));
  layout_ = std::move(next).value();
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
  Status rows_status = AdoptRows(doc);
  e.epoch = doc.epoch;
  e.doc = req.migrate_doc;
  e.owners = doc.owners;
  e.num_servers = doc.servers.size();
  e.staged.clear();
  // A push held under the old layout now goes by the new one (perhaps to
  // another shard); the client holds the clocks behind it until it is
  // acknowledged (Reroute).
  std::fill(held_push_.begin(), held_push_.end(), HeldPush{});
  EndFreeze("ended: adopted");
  // Pulls parked under the old layout go back to their clients with the new.
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
  LOG(INFO) << "elastic: adopted epoch " << e.epoch << ": " << installed
            << " chunks installed, " << dropped << " given away; holding "
            << chunks_.size() << " chunks, " << shard_bytes_ << " bytes";
  if (!rows_status.ok()) {
    // The rows are in the cache (dirty) if not in the store: the
    // checkpoint below, or a later one, stores them.
    LOG(ERROR) << "elastic: moving rows for epoch " << e.epoch << ": "
               << rows_status.ToString();
    EnterDegraded(rows_status);
  }
  if (store_ != nullptr) {
    Status s = Checkpoint();
    if (!s.ok()) {
      LOG(ERROR) << "elastic: checkpoint after adopting epoch " << e.epoch
                 << " failed: " << s.ToString();
      EnterDegraded(s);
    }
  }
  return Status::OK();
}

Status Shard::ApplyElasticOwners() {
  const ElasticState& e = *elastic_;
  if (e.epoch == 0 || !layout_) return Status::OK();
  options_.num_shards =
      std::max(options_.num_shards, static_cast<int>(e.num_servers));
  StatusOr<Layout> l = layout_->WithOwners(e.owners, options_.num_shards);
  if (!l.ok())
    return Status::Corruption("stored elastic layout: " + l.status().message());
  layout_ = std::move(l).value();
  return Status::OK();
}

}  // namespace asyncps::server
