// Migration (server/migrate/migration.h): elastic shards move the rows of
// sparse tables too, by key-range buckets (common/sparse_table.h, KeyRanges),
// in the steps of migration.cc:
//
//   export  (frozen, drained) kExport with `buckets` of a cut into
//           `num_buckets`: frame 1 the tables record ("0tables",
//           server/sparse/sparse_tables.cc), frame 2 a head, frames 3.. one
//           run of move records per table (server/sparse/row_format.h: the
//           store's records, as server/reshard/ copies them). Every bucket
//           must be this shard's; a reply above --max_sparse_reply_bytes is
//           ResourceExhausted (the coordinator asks for fewer buckets).
//   import  the same frames: checked whole, then staged (an empty shard
//           registers the tables first and serves no key until it adopts);
//           a resent import replaces the rows staged of its buckets.
//   adopt   staged rows become the tables' (written to the store), rows of
//           buckets given away leave the cache and the store, and the
//           document's bucket owners route every key from then on; they
//           persist with the document ("0elastic"), so a restart keeps them.
//
// Head frame (little-endian): u32 'MVH1', i64 the exporter's expiry clock,
// u32 number of tables.
#include <glog/logging.h>

#include <nlohmann/json.hpp>

#include "common/elastic_doc.h"
#include "server/migrate/migration.h"
#include "server/shard/shard_types.h"
#include "server/shard/sparse_requests.h"

namespace asyncps::server {
namespace {

constexpr uint32_t kRowsHeadMagic = 0x3148564d;  // "MVH1"

using internal::Put;
using internal::Reader;

ByteView Owned(std::string bytes) {
  auto s = std::make_shared<std::string>(std::move(bytes));
  ByteView v;
  v.data = reinterpret_cast<const uint8_t*>(s->data());
  v.size = s->size();
  v.owner = std::shared_ptr<const void>(s, s.get());
  return v;
}

std::string_view View(const ByteView& v) {
  return std::string_view(reinterpret_cast<const char*>(v.data), v.size);
}

}  // namespace

int Migration::BucketOwnerNow(uint32_t b, uint32_t num_buckets) const {
  const internal::ElasticState& e = shard_.elastic;
  if (e.ranges) return e.ranges->owners[b];
  if (!shard_.sparse) return -1;
  const uint32_t n = static_cast<uint32_t>(shard_.sparse->options().num_shards);
  return static_cast<int>(b / (num_buckets / n));
}

Status Migration::CheckBucketList(const RequestHeader& req,
                                  std::vector<uint8_t>* chosen) {
  const internal::ElasticState& e = shard_.elastic;
  const uint32_t nb = req.migrate_num_buckets;
  if (nb < 1 || nb > kMaxBuckets) {
    return core_->Reject(
        RejectReason::kOther,
        Status::InvalidArgument("a cut into " + std::to_string(nb) +
                                " buckets: not in [1, " +
                                std::to_string(kMaxBuckets) + "]"));
  }
  if (e.ranges && e.ranges->num_buckets != nb) {
    return core_->Reject(
        RejectReason::kOther,
        Status::InvalidArgument("a cut into " + std::to_string(nb) +
                                " buckets; this shard serves one into " +
                                std::to_string(e.ranges->num_buckets)));
  }
  if (!e.ranges && shard_.sparse &&
      nb % static_cast<uint32_t>(shard_.sparse->options().num_shards) != 0) {
    return core_->Reject(
        RejectReason::kOther,
        Status::InvalidArgument(
            "a cut into " + std::to_string(nb) + " buckets is not one of " +
            std::to_string(shard_.sparse->options().num_shards) +
            " static shards"));
  }
  if (req.migrate_buckets.empty() || req.migrate_buckets.size() > nb) {
    return core_->Reject(
        RejectReason::kOther,
        Status::InvalidArgument("a move names " +
                                std::to_string(req.migrate_buckets.size()) +
                                " buckets of " + std::to_string(nb)));
  }
  chosen->assign(nb, 0);
  for (uint32_t b : req.migrate_buckets) {
    if (b >= nb || (*chosen)[b]) {
      return core_->Reject(
          RejectReason::kRepeatedChunk,
          Status::InvalidArgument("bucket " + std::to_string(b) +
                                  " named twice or outside the cut into " +
                                  std::to_string(nb)));
    }
    (*chosen)[b] = 1;
  }
  return Status::OK();
}

Status Migration::ExportRows(const RequestHeader& req, OutgoingReply* r) {
  if (!shard_.sparse) {
    return core_->Reject(RejectReason::kNotRegistered,
                         Status::FailedPrecondition(
                             "no sparse tables registered: no rows to export"));
  }
  RETURN_IF_ERROR(CheckFrozenFor(req, "export", /*drained=*/true));
  std::vector<uint8_t> chosen;
  RETURN_IF_ERROR(CheckBucketList(req, &chosen));
  for (uint32_t b : req.migrate_buckets) {
    if (BucketOwnerNow(b, req.migrate_num_buckets) != shard_.options.shard_id) {
      return core_->Reject(RejectReason::kWrongShard,
                           Status::NotFound("bucket " + std::to_string(b) +
                                            " is not held by this shard"));
    }
  }
  std::vector<std::string> tables;
  uint64_t rows = 0;
  Status s = shard_.sparse->ExportBuckets(
      req.migrate_num_buckets, chosen, shard_.sparse->options().max_reply_bytes,
      &tables, &rows);
  if (!s.ok()) {
    return core_->Reject(s.code() == StatusCode::kResourceExhausted
                             ? RejectReason::kOversize
                             : RejectReason::kStore,
                         s);
  }
  uint64_t bytes = 0;
  for (const std::string& t : tables) bytes += t.size();
  StatusOr<MemoryBudget::Charge> charge = shard_.budget.Reserve(
      bytes + 4096, "an export of the rows of " +
                        std::to_string(req.migrate_buckets.size()) +
                        " buckets");
  if (!charge.ok())
    return core_->Reject(RejectReason::kMemoryBudget, charge.status());
  std::vector<StoreEntry> specs;
  shard_.sparse->AddSpecsEntry(&specs);
  std::string head;
  Put<uint32_t>(&head, kRowsHeadMagic);
  Put<int64_t>(&head, shard_.sparse->clock());
  Put<uint32_t>(&head, static_cast<uint32_t>(tables.size()));
  r->frames.push_back(Owned(std::move(specs[0].head)));
  r->frames.push_back(Owned(std::move(head)));
  for (std::string& t : tables) r->frames.push_back(Owned(std::move(t)));
  // The charge lives as long as the first frame (released with the reply).
  auto keep =
      std::make_shared<std::pair<std::shared_ptr<const void>,
                                 std::shared_ptr<MemoryBudget::Charge>>>(
          r->frames[0].owner,
          std::make_shared<MemoryBudget::Charge>(std::move(charge).value()));
  r->frames[0].owner = std::shared_ptr<const void>(keep, keep.get());
  core_->PinUnsent("", -1, 0, r);
  nlohmann::json j;
  j["rows"] = rows;
  j["bytes"] = bytes;
  r->header.text = j.dump();
  LOG(INFO) << "elastic: exported " << rows << " sparse rows of "
            << req.migrate_buckets.size() << " buckets toward epoch "
            << req.migrate_epoch;
  return Status::OK();
}

Status Migration::ImportRows(const RequestHeader& req,
                             const std::vector<ByteView>& data) {
  internal::ElasticState& e = shard_.elastic;
  RETURN_IF_ERROR(CheckFrozenFor(req, "import", /*drained=*/false));
  if (data.size() < 2) {
    return core_->Reject(
        RejectReason::kSizeMismatch,
        Status::InvalidArgument("an import of rows needs the tables record and "
                                "a head frame, got " +
                                std::to_string(data.size()) + " frames"));
  }
  StatusOr<std::vector<TableSpec>> specs =
      sparse::SparseTables::ParseSpecs(View(data[0]));
  if (!specs.ok()) {
    return core_->Reject(
        RejectReason::kMalformed,
        Status::InvalidArgument("import: " + specs.status().message()));
  }
  Reader hr(View(data[1]));
  uint32_t magic = 0, nt = 0;
  int64_t clock = 0;
  if (!hr.Get(&magic) || magic != kRowsHeadMagic || !hr.Get(&clock) ||
      !hr.Get(&nt) || hr.remaining() != 0 || nt != specs->size() ||
      data.size() != 2 + size_t{nt}) {
    return core_->Reject(
        RejectReason::kMalformed,
        Status::InvalidArgument("import: the rows head is damaged or does not "
                                "match the " +
                                std::to_string(data.size()) + " frames"));
  }
  if (shard_.sparse && shard_.sparse->specs() != *specs) {
    return core_->Reject(
        RejectReason::kRegistrationMismatch,
        Status::AlreadyExists("import of another model's sparse tables"));
  }
  if (staged_num_buckets_ != 0 &&
      staged_num_buckets_ != req.migrate_num_buckets) {
    return core_->Reject(
        RejectReason::kOther,
        Status::InvalidArgument("rows of a cut into " +
                                std::to_string(staged_num_buckets_) +
                                " buckets are staged already"));
  }
  const bool fresh = !shard_.sparse;
  if (fresh) {
    // An empty shard joining: the tables first; it holds no bucket yet.
    if (req.migrate_num_buckets < 1 || req.migrate_num_buckets > kMaxBuckets) {
      return core_->Reject(
          RejectReason::kOther,
          Status::InvalidArgument(
              "a cut into " + std::to_string(req.migrate_num_buckets) +
              " buckets: not in [1, " + std::to_string(kMaxBuckets) + "]"));
    }
    RETURN_IF_ERROR(sparse_->RegisterTables(*specs, /*created=*/true));
    auto none = std::make_shared<KeyRanges>();
    none->num_buckets = req.migrate_num_buckets;
    none->owners.assign(none->num_buckets, -1);
    e.ranges = std::move(none);
    core_->ApplyKeyRanges();
    shard_.sparse->AdvanceClock(clock);
  }
  Status s = StageRows(req, data);
  if (!s.ok() && fresh) {
    // A refused import changes nothing: not even the registration.
    sparse_->DropTables();
    e.ranges.reset();
    return s;
  }
  if (fresh) {
    LOG(INFO) << "elastic: registered " << specs->size()
              << " sparse tables from an import";
  }
  return s;
}

Status Migration::StageRows(const RequestHeader& req,
                            const std::vector<ByteView>& data) {
  internal::ElasticState& e = shard_.elastic;
  std::vector<uint8_t> chosen;
  RETURN_IF_ERROR(CheckBucketList(req, &chosen));
  for (uint32_t b : req.migrate_buckets) {
    if (BucketOwnerNow(b, req.migrate_num_buckets) == shard_.options.shard_id) {
      return core_->Reject(
          RejectReason::kRepeatedChunk,
          Status::InvalidArgument("bucket " + std::to_string(b) +
                                  " is held here already"));
    }
  }
  // A bucket staged already is a resend: its rows are replaced (the charge
  // covers both copies while they are checked, then what stays staged).
  uint64_t bytes = shard_.sparse->staged_bytes();
  for (size_t t = 2; t < data.size(); ++t) bytes += data[t].size;
  StatusOr<MemoryBudget::Charge> charge = shard_.budget.Reserve(
      bytes, "staged rows of " + std::to_string(req.migrate_buckets.size()) +
                 " buckets");
  if (!charge.ok())
    return core_->Reject(RejectReason::kMemoryBudget, charge.status());
  std::vector<std::string_view> frames;
  for (size_t t = 2; t < data.size(); ++t) frames.push_back(View(data[t]));
  uint64_t rows = 0;
  Status s = shard_.sparse->StageImport(req.migrate_num_buckets, chosen, frames,
                                        &rows);
  if (!s.ok()) return core_->Reject(RejectReason::kMalformed, s);
  staged_rows_charge_ = std::move(charge).value();  // the old one released
  staged_rows_charge_.ShrinkTo(shard_.sparse->staged_bytes());
  staged_num_buckets_ = req.migrate_num_buckets;
  if (staged_buckets_.empty()) staged_buckets_.assign(staged_num_buckets_, 0);
  for (uint32_t b : req.migrate_buckets) staged_buckets_[b] = 1;
  LOG(INFO) << "elastic: staged " << rows << " sparse rows of "
            << req.migrate_buckets.size() << " buckets toward epoch "
            << e.freeze_epoch;
  return Status::OK();
}

Status Migration::CheckAdoptRows(const ElasticDoc& doc) {
  const internal::ElasticState& e = shard_.elastic;
  if (!shard_.sparse) {
    for (int o : doc.bucket_owners) {
      if (o == shard_.options.shard_id) {
        return core_->Reject(
            RejectReason::kOther,
            Status::FailedPrecondition(
                "adopt gives this shard key ranges of sparse tables, but it "
                "holds none (no rows were imported)"));
      }
    }
    return Status::OK();
  }
  if (doc.num_buckets == 0) {
    return core_->Reject(RejectReason::kOther,
                         Status::InvalidArgument(
                             "the document has no key ranges, but this model "
                             "has sparse tables"));
  }
  if ((e.ranges && e.ranges->num_buckets != doc.num_buckets) ||
      (!e.ranges &&
       doc.num_buckets %
               static_cast<uint32_t>(shard_.sparse->options().num_shards) !=
           0)) {
    return core_->Reject(
        RejectReason::kOther,
        Status::InvalidArgument("the document cuts the keys into " +
                                std::to_string(doc.num_buckets) +
                                " buckets, which is not this shard's cut"));
  }
  for (uint32_t b = 0; b < doc.num_buckets; ++b) {
    if (doc.bucket_owners[b] != shard_.options.shard_id ||
        BucketOwnerNow(b, doc.num_buckets) == shard_.options.shard_id)
      continue;
    if (staged_num_buckets_ != doc.num_buckets || !staged_buckets_[b]) {
      return core_->Reject(
          RejectReason::kOther,
          Status::FailedPrecondition(
              "adopt gives this shard bucket " + std::to_string(b) +
              " whose rows it neither holds nor has staged"));
    }
  }
  return Status::OK();
}

Status Migration::AdoptRows(const ElasticDoc& doc) {
  internal::ElasticState& e = shard_.elastic;
  if (!shard_.sparse || doc.num_buckets == 0) return Status::OK();
  std::vector<uint8_t> gone(doc.num_buckets, 0);
  uint64_t giving = 0, taking = 0;
  for (uint32_t b = 0; b < doc.num_buckets; ++b) {
    const bool had =
        BucketOwnerNow(b, doc.num_buckets) == shard_.options.shard_id;
    const bool has = doc.bucket_owners[b] == shard_.options.shard_id;
    gone[b] = had && !has;
    giving += gone[b];
    taking += !had && has;
  }
  Status first = shard_.sparse->InstallStaged();
  uint64_t dropped = 0;
  Status d = shard_.sparse->DropBuckets(doc.num_buckets, gone, &dropped);
  if (first.ok()) first = d;
  auto ranges = std::make_shared<KeyRanges>();
  ranges->num_buckets = doc.num_buckets;
  ranges->owners = doc.bucket_owners;
  e.ranges = std::move(ranges);
  core_->ApplyKeyRanges();
  LOG(INFO) << "elastic: key ranges of epoch " << doc.epoch << ": " << taking
            << " buckets taken, " << giving << " given away (" << dropped
            << " stored rows dropped)";
  return first;
}

}  // namespace asyncps::server
