// Migration (server/migrate/migration.h): elastic shards (server/elastic/).
// ps_ctl moves chunks between shards while training runs, in steps the shard
// answers as kMigrate requests:
//
//   freeze  toward epoch E+1 at clock F: pushes of clock >= F and clocks > F
//           are refused (Unavailable, retry_ms), so under BSP every round
//           below F completes and nothing is half-summed ("drained"); F = -1
//           holds back every push and clock (ASP/SSP: nothing accumulates).
//   export  the records of the chunks that move (the persistence formats of
//           server/shard/shard_persist.cc), the layout and the shard state
//           (clocks, round).
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
#include "server/migrate/migration.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/elastic_doc.h"
#include "server/internal/layout_record.h"
#include "server/internal/shard_records.h"
#include "server/shard/shard_types.h"
#include "server/shard/sparse_requests.h"

namespace asyncps::server {
namespace {

using internal::kChunkMagic;
using internal::kStateMagic;
using internal::Reader;

std::string_view View(const ByteView& v) {
  return std::string_view(reinterpret_cast<const char*>(v.data), v.size);
}

// The bytes per element a chunk of this shard holds: weights, snapshot,
// optimizer state and (BSP) the round's sum.
uint64_t BytesPerElem(const ShardOptions& o, size_t state_per_elem) {
  return sizeof(float) *
         (2 + state_per_elem + (o.consistency == Consistency::kBsp ? 1 : 0));
}

}  // namespace

Migration::Migration(internal::ShardState shard, internal::ShardServices* core,
                     SparseRequests* sparse)
    : shard_(shard), core_(core), sparse_(sparse) {}

Migration::~Migration() = default;

std::unique_ptr<RequestHandler> Migration::Make(
    const internal::ShardState& shard, internal::ShardServices* core,
    SparseRequests* sparse) {
  return std::make_unique<Migration>(shard, core, sparse);
}

bool Migration::Drained() const {
  const internal::ElasticState& e = shard_.elastic;
  if (!e.frozen) return false;
  if (shard_.options.consistency != Consistency::kBsp || e.freeze_clock < 0)
    return true;
  if (shard_.bsp_round < e.freeze_clock) return false;
  for (const auto& c : shard_.chunks) {
    if (c->contributors != 0) return false;
  }
  // The round's sums of sparse rows too (applied with the round).
  return shard_.sparse == nullptr || !shard_.sparse->HasRoundSums();
}

std::string Migration::DescribeJson() const {
  const internal::ElasticState& e = shard_.elastic;
  const ShardOptions& o = shard_.options;
  const WorkerClocks& clocks = shard_.clocks;
  nlohmann::json j;
  j["shard"] = o.shard_id;
  j["num_shards"] = o.num_shards;
  j["epoch"] = e.epoch;
  j["registered"] = shard_.layout.has_value();
  j["consistency"] = ConsistencyName(o.consistency);
  j["frozen"] = e.frozen;
  j["freeze_epoch"] = e.freeze_epoch;
  j["drained"] = Drained();
  int64_t max_clock = 0;
  for (int r = 0; r < clocks.num_workers(); ++r) {
    if (clocks.live(r)) max_clock = std::max(max_clock, clocks.clock(r));
  }
  j["max_clock"] = max_clock;
  // The latest BSP round any worker pushed for (-1: none): a freeze clock
  // must be past it (kFreeze refuses one that is not).
  int64_t max_pushed = -1;
  for (int64_t p : shard_.bsp_pushed_round)
    max_pushed = std::max(max_pushed, p);
  j["max_pushed_round"] = max_pushed;
  j["min_clock"] = clocks.MinLiveClock();
  j["bsp_round"] = shard_.bsp_round;
  j["sparse_tables"] = shard_.sparse != nullptr;
  // Key ranges served (0: static) and the rows held, cached or stored (an
  // estimate: the coordinator sizes its requests by it).
  j["num_buckets"] = e.ranges ? e.ranges->num_buckets : 0;
  j["sparse_bytes"] = shard_.sparse ? shard_.sparse->MoveBytesEstimate() : 0;
  nlohmann::json elems = nlohmann::json::array(),
                 owners = nlohmann::json::array(),
                 owned = nlohmann::json::array(),
                 staged = nlohmann::json::array();
  if (shard_.layout) {
    for (const ChunkSpec& c : shard_.layout->chunks()) {
      elems.push_back(c.num_elems);
      owners.push_back(c.shard);
    }
    for (const auto& c : shard_.chunks) owned.push_back(c->id);
  }
  for (const auto& [id, s] : staged_) staged.push_back(id);
  j["num_chunks"] = elems.size();
  j["chunk_elems"] = std::move(elems);
  j["owners"] = std::move(owners);
  j["owned"] = std::move(owned);
  j["staged"] = std::move(staged);
  return j.dump();
}

Status Migration::Handle(const std::string& /*peer*/, const RequestHeader& req,
                         const std::vector<ByteView>& data, TimePoint /*now*/,
                         OutgoingReply* r, std::vector<OutgoingReply>* out) {
  internal::ElasticState& e = shard_.elastic;
  if (req.migrate_op != MigrateOp::kImport && !data.empty()) {
    return core_->Reject(RejectReason::kSizeMismatch,
                         Status::InvalidArgument(
                             "migrate request carries unexpected data frames"));
  }
  // Rows of sparse tables move by buckets (migration_rows.cc), chunks by
  // id; one request moves one kind.
  const bool rows =
      !req.migrate_buckets.empty() || req.migrate_num_buckets != 0;
  if (rows && !req.migrate_chunks.empty()) {
    return core_->Reject(
        RejectReason::kOther,
        Status::InvalidArgument("a migrate request names chunks and buckets: "
                                "move them in separate requests"));
  }
  switch (req.migrate_op) {
    case MigrateOp::kDescribe:
      r->header.text = DescribeJson();
      return Status::OK();
    case MigrateOp::kFreeze:
      return Freeze(req, r);
    case MigrateOp::kExport:
      return rows ? ExportRows(req, r) : ExportChunks(req, r);
    case MigrateOp::kImport:
      return rows ? ImportRows(req, data) : ImportChunks(req, data);
    case MigrateOp::kAdopt:
      return Adopt(req, out);
    case MigrateOp::kAbort:
      if (e.frozen && e.freeze_epoch == req.migrate_epoch) {
        staged_.clear();
        EndFreeze("aborted");
      }
      return Status::OK();
  }
  return core_->Reject(RejectReason::kOther,
                       Status::InvalidArgument("unknown migrate op"));
}

Status Migration::Freeze(const RequestHeader& req, OutgoingReply* r) {
  internal::ElasticState& e = shard_.elastic;
  const ShardOptions& o = shard_.options;
  const WorkerClocks& clocks = shard_.clocks;
  if (req.migrate_epoch <= e.epoch) {
    return core_->Reject(
        RejectReason::kStaleLayout,
        Status::FailedPrecondition(
            "freeze toward epoch " + std::to_string(req.migrate_epoch) +
            ": this shard is at epoch " + std::to_string(e.epoch)));
  }
  if (e.frozen && e.freeze_epoch != req.migrate_epoch) {
    return core_->Reject(
        RejectReason::kOther,
        Status::FailedPrecondition("already frozen toward epoch " +
                                   std::to_string(e.freeze_epoch) +
                                   ": adopt or abort it first"));
  }
  const int64_t at = req.migrate_at_clock;
  if (at < -1 || at > kMaxClock) {
    return core_->Reject(
        RejectReason::kBadClock,
        Status::InvalidArgument("freeze clock " + std::to_string(at) +
                                " not in [-1, 2^62]"));
  }
  if (at >= 0 && o.consistency == Consistency::kBsp) {
    for (int rank = 0; rank < clocks.num_workers(); ++rank) {
      if (clocks.clock(rank) > at || shard_.bsp_pushed_round[rank] >= at) {
        return core_->Reject(
            RejectReason::kBadClock,
            Status::FailedPrecondition(
                "worker " + std::to_string(rank) + " is already at clock " +
                std::to_string(clocks.clock(rank)) +
                ", past the freeze clock " + std::to_string(at)));
      }
    }
  }
  if (at >= 0 && o.consistency != Consistency::kBsp) {
    return core_->Reject(
        RejectReason::kOther,
        Status::InvalidArgument("a freeze at a clock is for BSP; " +
                                std::string(ConsistencyName(o.consistency)) +
                                " freezes at -1"));
  }
  e.frozen = true;
  e.freeze_epoch = req.migrate_epoch;
  e.freeze_clock = at;
  e.freeze_until =
      std::chrono::steady_clock::now() +
      std::chrono::milliseconds(std::max<uint32_t>(req.migrate_deadline_ms, 1));
  LOG(INFO) << "elastic: frozen toward epoch " << e.freeze_epoch << " at clock "
            << at;
  r->header.text = DescribeJson();
  return Status::OK();
}

Status Migration::CheckFrozenFor(const RequestHeader& req, const char* what,
                                 bool drained) {
  const internal::ElasticState& e = shard_.elastic;
  if (e.frozen && e.freeze_epoch == req.migrate_epoch &&
      (!drained || Drained()))
    return Status::OK();
  return core_->Reject(
      RejectReason::kOther,
      Status::FailedPrecondition(
          std::string(what) + " needs the shard frozen toward epoch " +
          std::to_string(req.migrate_epoch) + (drained ? " and drained" : "")));
}

void Migration::EndFreeze(const char* why) {
  internal::ElasticState& e = shard_.elastic;
  LOG(INFO) << "elastic: freeze toward epoch " << e.freeze_epoch << " " << why
            << "; serving epoch " << e.epoch;
  e.frozen = false;
  e.freeze_epoch = 0;
  e.freeze_clock = -1;
  // Rows staged and not installed (abort) are dropped with the freeze.
  if (shard_.sparse) shard_.sparse->DropStaged();
  staged_num_buckets_ = 0;
  staged_buckets_.clear();
  staged_rows_charge_.Reset();
}

Status Migration::ExportChunks(const RequestHeader& req, OutgoingReply* r) {
  if (!shard_.layout) {
    return core_->Reject(
        RejectReason::kNotRegistered,
        Status::FailedPrecondition("no layout registered: nothing to export"));
  }
  RETURN_IF_ERROR(CheckFrozenFor(req, "export", /*drained=*/true));
  const std::vector<uint32_t>& ids = req.migrate_chunks;
  std::vector<uint32_t> sorted = ids;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return core_->Reject(RejectReason::kRepeatedChunk,
                         Status::InvalidArgument("export names a chunk twice"));
  }
  uint64_t bytes = 0;
  for (uint32_t id : ids) {
    if (id >= shard_.local_index.size() || shard_.local_index[id] < 0) {
      return core_->Reject(RejectReason::kWrongShard,
                           Status::NotFound("chunk " + std::to_string(id) +
                                            " is not held by this shard"));
    }
    const Chunk& c = *shard_.chunks[shard_.local_index[id]];
    bytes += (c.w.size() + c.state.size() + c.acc.size()) * sizeof(float) + 64;
  }
  StatusOr<MemoryBudget::Charge> charge = shard_.budget.Reserve(
      bytes, "an export of " + std::to_string(ids.size()) + " chunks");
  if (!charge.ok())
    return core_->Reject(RejectReason::kMemoryBudget, charge.status());
  auto held = std::make_shared<MemoryBudget::Charge>(std::move(charge).value());
  std::vector<StoreEntry> entries;
  core_->AddExportEntries(ids, &entries);
  for (const StoreEntry& en : entries) {
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
  // The charge lives as long as the first frame (released with the reply).
  auto keep =
      std::make_shared<std::pair<std::shared_ptr<const void>,
                                 std::shared_ptr<MemoryBudget::Charge>>>(
          r->frames[0].owner, held);
  r->frames[0].owner = std::shared_ptr<const void>(keep, keep.get());
  core_->PinUnsent("", -1, 0, r);
  LOG(INFO) << "elastic: exported " << ids.size() << " chunks toward epoch "
            << req.migrate_epoch;
  return Status::OK();
}

Status Migration::PrepareImportLayout(const std::vector<TensorSpec>& tensors,
                                      const LayoutOptions& lo,
                                      std::optional<Layout>* candidate) {
  const std::optional<Layout>& layout = shard_.layout;
  if (layout) {
    if (tensors != layout->tensors() ||
        lo.chunk_elems != layout->options().chunk_elems ||
        lo.min_chunk_elems != layout->options().min_chunk_elems ||
        lo.placement != layout->options().placement) {
      return core_->Reject(
          RejectReason::kRegistrationMismatch,
          Status::AlreadyExists("import of another model's chunks"));
    }
    return Status::OK();
  }
  RETURN_IF_ERROR(core_->ChargeLayoutTables(tensors, lo));
  StatusOr<Layout> l = Layout::Create(tensors, lo);
  if (l.ok()) {
    const int n = std::max(shard_.options.num_shards, l->num_shards());
    l = l->WithOwners(l->Owners(), n);
  }
  if (!l.ok()) {
    core_->ReleaseLayoutCharge();
    return core_->Reject(RejectReason::kOther, l.status());
  }
  *candidate = std::move(l).value();
  return Status::OK();
}

Status Migration::ParseImportState(const ByteView& frame,
                                   internal::ImportedClocks* state) {
  // The state record's head: clocks and rounds (shard_persist.cc's format).
  Reader sr(View(frame));
  uint32_t magic = 0, nw = 0;
  int32_t sid = 0, sn = 0;
  const int workers = shard_.options.num_workers;
  if (!sr.Get(&magic) || magic != kStateMagic || !sr.Get(&sid) ||
      !sr.Get(&sn) || !sr.Get(&nw) || !sr.Get(&state->version) ||
      !sr.Get(&state->round) || static_cast<int>(nw) != workers) {
    return core_->Reject(
        RejectReason::kMalformed,
        Status::InvalidArgument(
            "import: the state record is damaged or for " + std::to_string(nw) +
            " workers, this shard has " + std::to_string(workers)));
  }
  state->clocks.resize(nw);
  state->pushed.resize(nw);
  for (uint32_t w = 0; w < nw; ++w) {
    uint64_t read = 0;
    if (!sr.Get(&state->clocks[w]) || !sr.Get(&read) ||
        !sr.Get(&state->pushed[w])) {
      return core_->Reject(
          RejectReason::kMalformed,
          Status::InvalidArgument("import: the state record is damaged"));
    }
  }
  return Status::OK();
}

Status Migration::ParseImportChunk(uint32_t id, const ByteView& frame,
                                   const Layout& l, Staged* staged) {
  const ShardOptions& o = shard_.options;
  const size_t spe = shard_.state_per_elem;
  const uint64_t n = l.chunks()[id].num_elems;
  Reader r(View(frame));
  uint32_t cm = 0, cspe = 0, contributors = 0;
  uint64_t cn = 0, cversion = 0, cstep = 0;
  uint8_t has_acc = 0;
  if (!r.Get(&cm) || cm != kChunkMagic || !r.Get(&cn) || cn != n ||
      !r.Get(&cspe) || cspe != spe || !r.Get(&cversion) || !r.Get(&cstep) ||
      !r.Get(&contributors) || !r.Get(&has_acc) || contributors != 0 ||
      r.remaining() != n * sizeof(float) * (1 + spe + (has_acc ? 1 : 0))) {
    return core_->Reject(
        RejectReason::kSizeMismatch,
        Status::InvalidArgument("import: the record of chunk " +
                                std::to_string(id) +
                                " is damaged, has another optimizer state or a "
                                "half-summed round"));
  }
  StatusOr<MemoryBudget::Charge> charge =
      shard_.budget.Reserve(n * BytesPerElem(o, spe) + sizeof(Chunk),
                            "staged chunk " + std::to_string(id));
  if (!charge.ok())
    return core_->Reject(RejectReason::kMemoryBudget, charge.status());
  auto c = std::make_unique<Chunk>();
  c->id = id;
  c->n = n;
  c->w.resize(n);
  c->state.resize(n * spe);
  (void)r.GetBytes(c->w.data(), n * sizeof(float));
  (void)r.GetBytes(c->state.data(), c->state.size() * sizeof(float));
  c->version = cversion;
  c->step = cstep;
  if (o.consistency == Consistency::kBsp) {
    c->acc.assign(n, 0.0f);
    c->pushed_round.assign(o.num_workers, -1);  // drained: none yet
  }
  *staged = Staged{std::move(c), std::move(charge).value()};
  return Status::OK();
}

Status Migration::ImportChunks(const RequestHeader& req,
                               const std::vector<ByteView>& data) {
  const std::vector<uint32_t>& ids = req.migrate_chunks;
  if (data.size() != ids.size() + 2) {
    return core_->Reject(
        RejectReason::kSizeMismatch,
        Status::InvalidArgument(
            "import of " + std::to_string(ids.size()) + " chunks needs " +
            std::to_string(ids.size() + 2) + " data frames, got " +
            std::to_string(data.size())));
  }
  RETURN_IF_ERROR(CheckFrozenFor(req, "import", /*drained=*/false));
  std::vector<TensorSpec> tensors;
  LayoutOptions lo;
  Status parsed = internal::ParseLayoutRecord(View(data[0]), &tensors, &lo);
  if (!parsed.ok()) {
    return core_->Reject(RejectReason::kMalformed,
                         Status::InvalidArgument(parsed.message()));
  }
  internal::ImportedClocks state;
  RETURN_IF_ERROR(ParseImportState(data[1], &state));
  std::optional<Layout> candidate;  // an empty shard's layout
  RETURN_IF_ERROR(PrepareImportLayout(tensors, lo, &candidate));
  const bool fresh = candidate.has_value();
  const Layout& l = fresh ? *candidate : *shard_.layout;
  // Every chunk record checked before any is staged.
  std::map<uint32_t, Staged> staged;
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint32_t id = ids[i];
    Status s;
    if (id >= l.chunks().size() || staged.count(id) > 0) {
      s = core_->Reject(
          RejectReason::kUnknownChunk,
          Status::InvalidArgument("import names chunk " + std::to_string(id) +
                                  " twice or outside the layout"));
    } else {
      s = ParseImportChunk(id, data[i + 2], l, &staged[id]);
    }
    if (!s.ok()) {
      if (fresh) core_->ReleaseLayoutCharge();
      return s;
    }
  }
  if (fresh) {
    core_->InstallImportedLayout(std::move(candidate).value(), state);
    LOG(INFO) << "elastic: registered " << shard_.layout->tensors().size()
              << " tensors from an import; round " << shard_.bsp_round;
  }
  for (auto& [id, s] : staged) staged_[id] = std::move(s);
  LOG(INFO) << "elastic: staged " << ids.size() << " chunks toward epoch "
            << shard_.elastic.freeze_epoch;
  return Status::OK();
}

Status Migration::CheckAdopt(const ElasticDoc& doc) {
  const internal::ElasticState& e = shard_.elastic;
  const int shard_id = shard_.options.shard_id;
  if (doc.epoch <= e.epoch) {
    return core_->Reject(
        RejectReason::kStaleLayout,
        Status::FailedPrecondition(
            "adopt of epoch " + std::to_string(doc.epoch) +
            ": this shard is at epoch " + std::to_string(e.epoch)));
  }
  if (!shard_.layout) {
    return core_->Reject(
        RejectReason::kNotRegistered,
        Status::FailedPrecondition(
            "adopt before a layout is registered or imported"));
  }
  const size_t num_chunks = shard_.layout->chunks().size();
  if (doc.owners.size() != num_chunks ||
      shard_id >= static_cast<int>(doc.servers.size())) {
    return core_->Reject(
        RejectReason::kOther,
        Status::InvalidArgument(
            "the document lists " + std::to_string(doc.owners.size()) +
            " chunks and " + std::to_string(doc.servers.size()) +
            " servers; this shard (index " + std::to_string(shard_id) +
            ") holds a layout of " + std::to_string(num_chunks) + " chunks"));
  }
  // Everything this shard will own is here or staged, before anything moves.
  for (uint32_t id = 0; id < doc.owners.size(); ++id) {
    if (doc.owners[id] != shard_id) continue;
    if (shard_.local_index[id] < 0 && staged_.count(id) == 0) {
      return core_->Reject(
          RejectReason::kOther,
          Status::FailedPrecondition("adopt gives this shard chunk " +
                                     std::to_string(id) +
                                     " that it neither holds nor has staged"));
    }
  }
  return CheckAdoptRows(doc);
}

void Migration::InstallAdoptedChunks(const ElasticDoc& doc, int num_shards,
                                     Layout next) {
  const int shard_id = shard_.options.shard_id;
  const uint64_t per_elem = BytesPerElem(shard_.options, shard_.state_per_elem);
  const std::vector<int32_t> old_local = shard_.local_index;
  std::vector<std::unique_ptr<Chunk>> old = core_->TakeChunks();
  std::vector<std::unique_ptr<Chunk>> chunks;
  std::vector<int32_t> local(doc.owners.size(), -1);
  uint64_t dropped = 0, dropped_bytes = 0, installed = 0;
  for (uint32_t id = 0; id < doc.owners.size(); ++id) {
    const bool mine = doc.owners[id] == shard_id;
    if (old_local[id] >= 0) {
      if (mine) {
        local[id] = static_cast<int32_t>(chunks.size());
        chunks.push_back(std::move(old[old_local[id]]));
      } else {
        ++dropped;
        dropped_bytes += old[old_local[id]]->n * per_elem + sizeof(Chunk);
      }
      continue;
    }
    if (!mine) continue;
    auto it = staged_.find(id);
    local[id] = static_cast<int32_t>(chunks.size());
    chunks.push_back(std::move(it->second.chunk));
    installed_charges_.push_back(std::move(it->second.charge));
    staged_.erase(it);
    ++installed;
  }
  core_->InstallChunks(std::move(chunks), std::move(local), std::move(next),
                       num_shards, dropped_bytes);
  LOG(INFO) << "elastic: epoch " << doc.epoch << ": " << installed
            << " chunks installed, " << dropped << " given away";
}

Status Migration::Adopt(const RequestHeader& req,
                        std::vector<OutgoingReply>* out) {
  internal::ElasticState& e = shard_.elastic;
  StatusOr<ElasticDoc> parsed = ElasticDoc::FromJson(req.migrate_doc);
  if (!parsed.ok())
    return core_->Reject(RejectReason::kMalformed, parsed.status());
  const ElasticDoc& doc = *parsed;
  if (doc.epoch != req.migrate_epoch) {
    return core_->Reject(
        RejectReason::kOther,
        Status::InvalidArgument(
            "adopt of epoch " + std::to_string(req.migrate_epoch) +
            " with a document of epoch " + std::to_string(doc.epoch)));
  }
  if (doc.epoch == e.epoch && req.migrate_doc == e.doc)
    return Status::OK();  // again
  RETURN_IF_ERROR(CheckAdopt(doc));
  const int num_shards =
      std::max(shard_.options.num_shards, static_cast<int>(doc.servers.size()));
  StatusOr<Layout> next = shard_.layout->WithOwners(doc.owners, num_shards);
  if (!next.ok()) return core_->Reject(RejectReason::kOther, next.status());
  InstallAdoptedChunks(doc, num_shards, std::move(next).value());
  Status rows_status = AdoptRows(doc);
  e.epoch = doc.epoch;
  e.doc = req.migrate_doc;
  e.owners = doc.owners;
  e.num_servers = doc.servers.size();
  staged_.clear();
  EndFreeze("ended: adopted");
  // A push held under the old layout now goes by the new one (perhaps to
  // another shard; the client holds the clocks behind it until it is
  // acknowledged: Reroute); pulls parked under it go back to their clients
  // with the new one.
  core_->ReleaseForEpoch(out);
  LOG(INFO) << "elastic: adopted epoch " << e.epoch << ": holding "
            << shard_.chunks.size() << " chunks";
  if (!rows_status.ok()) {
    // The rows are in the cache (dirty) if not in the store: the
    // checkpoint below, or a later one, stores them.
    LOG(ERROR) << "elastic: moving rows for epoch " << e.epoch << ": "
               << rows_status.ToString();
    core_->EnterDegraded(rows_status);
  }
  if (shard_.store != nullptr) {
    Status s = core_->Checkpoint();
    if (!s.ok()) {
      LOG(ERROR) << "elastic: checkpoint after adopting epoch " << e.epoch
                 << " failed: " << s.ToString();
      core_->EnterDegraded(s);
    }
  }
  return Status::OK();
}

}  // namespace asyncps::server
