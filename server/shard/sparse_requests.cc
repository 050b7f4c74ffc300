// SparseRequests (server/shard/sparse_requests.h): the rows of sparse tables
// in registration, pushes, pulls and BSP rounds (the tables themselves:
// server/sparse/; their part of a store write: shard_persist.cc).
//
// A push's RowsRefs are validated after its chunks and before anything is
// applied: each names a registered table at most once, two data frames of
// the message that no other ref uses, a keys frame of exactly num_keys
// uint64 and a rows frame of num_keys x dim values in fp32 or a dense codec
// (validated before anything is allocated for it); then the keys (count
// limit, duplicates, ownership) and the decoded rows (NaN/Inf) are checked
// by SparseTables::Check. Keys and rows are copied into aligned scratch
// (frames may sit unaligned in a message) where phase 2 applies them from.
// An upload of rows with their optimizer state (AssignOp::kRows) carries
// row records instead of rows (raw only: num_keys x the table's record
// size, common/protocol.capnp), split here into the weights (checked as
// rows), the state (DecodedRows::state) and the steps (steps); the saved
// records of AssignOp::kSaved (common/sparse_table.h) also into the kinds
// (kinds) and clocks (clocks).
#include "server/shard/sparse_requests.h"

#include <glog/logging.h>

#include <cstring>

#include "compression/codec.h"
#include "server/shard/shard_types.h"

namespace asyncps::server {
namespace {

std::string TableName(const sparse::SparseTables& t, uint32_t table) {
  return "table '" + t.specs()[table].name + "'";
}

// Replaces *charge by one of `bytes` (the old one is released once the new
// one is held).
Status Recharge(MemoryBudget& budget, uint64_t bytes, std::string_view what,
                MemoryBudget::Charge* charge) {
  if (bytes <= charge->bytes()) return Status::OK();
  ASSIGN_OR_RETURN(MemoryBudget::Charge c, budget.Reserve(bytes, what));
  *charge = std::move(c);
  return Status::OK();
}

}  // namespace

SparseRequests::SparseRequests(internal::ShardState shard,
                               internal::ShardServices* core)
    : shard_(shard), core_(core) {}

void SparseRequests::DropTables() {
  shard_.sparse.reset();
  sparse_charge_.Reset();
}

Status SparseRequests::RegisterTables(const std::vector<TableSpec>& tables,
                                      bool created) {
  if (!created) {
    // Re-registration (idempotent): the same tables, or an error naming the
    // first that differs.
    static const std::vector<TableSpec> kNone;
    const std::vector<TableSpec>& have =
        shard_.sparse ? shard_.sparse->specs() : kNone;
    for (size_t i = 0; i < std::max(have.size(), tables.size()); ++i) {
      if (i < have.size() && i < tables.size() && have[i] == tables[i])
        continue;
      const std::string& name =
          i < tables.size() ? tables[i].name : have[i].name;
      return core_->Reject(
          RejectReason::kRegistrationMismatch,
          Status::AlreadyExists("table '" + name + "' (index " +
                                std::to_string(i) +
                                ") does not match the registered tables" +
                                (i >= tables.size() ? " (missing)" : "")));
    }
    return Status::OK();
  }
  shard_.sparse.reset();
  sparse_charge_.Reset();
  if (tables.empty()) return Status::OK();
  sparse::SparseOptions o = shard_.options.sparse;
  // The embedding cache is part of what the shard holds for its peers.
  StatusOr<MemoryBudget::Charge> charge =
      shard_.budget.Reserve(o.cache_bytes, "the embedding cache");
  if (!charge.ok())
    return core_->Reject(RejectReason::kMemoryBudget, charge.status());
  sparse_charge_ = std::move(charge).value();
  o.shard_id = shard_.options.shard_id;
  o.num_shards = shard_.options.num_shards;
  StatusOr<std::unique_ptr<sparse::SparseTables>> t =
      sparse::SparseTables::Create(o, tables, shard_.store);
  if (!t.ok()) {
    return core_->Reject(RejectReason::kRegistrationMismatch,
                         t.status().WithContext("sparse tables"));
  }
  shard_.sparse = std::move(t).value();
  core_->ApplyKeyRanges();  // an elastic fleet's adopted key ranges
  shard_.sparse->AdvanceClock(shard_.clocks.MinLiveClock());
  table_stamp_.assign(tables.size(), 0);
  LOG(INFO) << "registered " << tables.size() << " sparse tables";
  return Status::OK();
}

// Validates and decodes the RowsRefs of a push or a pull into
// shard_.rows.pending, shard_.rows.keys and (pushes) shard_.rows.values.
// `shard_.stamp` and shard_.frame_stamp already hold this request's chunk
// frames.
Status SparseRequests::ValidatePush(const RequestHeader& req,
                                    const std::vector<ByteView>& data) {
  shard_.rows.pending.clear();
  if (req.rows.empty()) return Status::OK();
  if (!shard_.sparse) {
    return core_->Reject(RejectReason::kUnknownChunk,
                         Status::NotFound("push names rows of " +
                                          std::to_string(req.rows.size()) +
                                          " tables, but no sparse table is "
                                          "registered"));
  }
  // Pushes and uploads (kAssign) carry rows; pulls and reads of row
  // records (kAssign phase 3) carry keys only.
  const bool assign = req.kind == RequestKind::kAssign;
  Shape shape;
  shape.push = req.kind == RequestKind::kPush ||
               (assign && req.assign_phase != AssignOp::kRead);
  shape.records = assign && (req.assign_phase == AssignOp::kRows ||
                             req.assign_phase == AssignOp::kSaved);
  // Phase 7: saved records (kind, count, clock before the row record).
  shape.saved = assign && req.assign_phase == AssignOp::kSaved;
  if (shard_.frame_stamp.size() < data.size())
    shard_.frame_stamp.resize(data.size(), 0);
  shard_.sparse->BeginRequest();
  // Sizes first, so nothing is allocated for a request that lies about them.
  size_t total_keys = 0, total_values = 0, total_state = 0;
  for (const RowsRef& ref : req.rows) {
    RETURN_IF_ERROR(CheckRef(req, ref, data, shape));
    const uint64_t values =
        ref.num_keys * shard_.sparse->specs()[ref.table].dim;
    PendingRows p;
    p.table = ref.table;
    p.n = ref.num_keys;
    p.keys_at = total_keys;
    p.rows_at = total_values;
    p.state_at = total_state;
    shard_.rows.pending.push_back(p);
    total_keys += ref.num_keys;
    if (shape.push) total_values += values;
    if (shape.records)
      total_state +=
          ref.num_keys * shard_.sparse->table(ref.table).state_floats();
  }
  RETURN_IF_ERROR(SizeDecoded(total_keys, total_values, total_state, shape));
  // Decode and check every table's part before anything is applied.
  for (size_t i = 0; i < req.rows.size(); ++i) {
    RETURN_IF_ERROR(
        DecodeRef(req.rows[i], shard_.rows.pending[i], data, shape));
  }
  return Status::OK();
}

Status SparseRequests::CheckRef(const RequestHeader& req, const RowsRef& ref,
                                const std::vector<ByteView>& data,
                                const Shape& shape) {
  const bool push = shape.push, records = shape.records, saved = shape.saved;
  const sparse::SparseOptions& limits = shard_.sparse->options();
  if (ref.table >= shard_.sparse->num_tables()) {
    return core_->Reject(
        RejectReason::kUnknownChunk,
        Status::NotFound("unknown table " + std::to_string(ref.table) + " (" +
                         std::to_string(shard_.sparse->num_tables()) +
                         " registered)"));
  }
  const std::string name = TableName(*shard_.sparse, ref.table);
  if (table_stamp_[ref.table] == shard_.stamp) {
    return core_->Reject(RejectReason::kOther,
                         Status::InvalidArgument(name + " named twice in one " +
                                                 RequestKindName(req.kind)));
  }
  table_stamp_[ref.table] = shard_.stamp;
  if (ref.num_keys > limits.max_keys_per_request) {
    return core_->Reject(
        RejectReason::kOversize,
        Status::InvalidArgument(name + ": " + std::to_string(ref.num_keys) +
                                " keys, more than the " +
                                std::to_string(limits.max_keys_per_request) +
                                " one request may name: split it"));
  }
  const uint32_t frames[2] = {ref.keys_frame, ref.rows_frame};
  for (int k = 0; k < (push ? 2 : 1); ++k) {  // pulls carry keys only
    const uint32_t f = frames[k];
    if (f < 1 || f > data.size()) {
      return core_->Reject(
          RejectReason::kSizeMismatch,
          Status::InvalidArgument(name + ": frame index " + std::to_string(f) +
                                  " out of range [1, " +
                                  std::to_string(data.size()) + "]"));
    }
    if (shard_.frame_stamp[f - 1] == shard_.stamp) {
      return core_->Reject(
          RejectReason::kSizeMismatch,
          Status::InvalidArgument(name + ": frame " + std::to_string(f) +
                                  " referenced twice"));
    }
    shard_.frame_stamp[f - 1] = shard_.stamp;
  }
  const ByteView& keys = data[ref.keys_frame - 1];
  if (keys.size != ref.num_keys * sizeof(uint64_t)) {
    return core_->Reject(
        RejectReason::kSizeMismatch,
        Status::InvalidArgument(name + ": keys frame of " +
                                std::to_string(keys.size) + " bytes for " +
                                std::to_string(ref.num_keys) + " keys"));
  }
  const uint64_t values = ref.num_keys * shard_.sparse->specs()[ref.table].dim;
  const sparse::SparseTable& table = shard_.sparse->table(ref.table);
  const size_t record_bytes =
      saved ? table.saved_record_bytes() : table.record_bytes();
  if (records && (ref.codec != 0 || data[ref.rows_frame - 1].size !=
                                        ref.num_keys * record_bytes)) {
    return core_->Reject(
        RejectReason::kSizeMismatch,
        Status::InvalidArgument(name + ": row records frame of " +
                                std::to_string(data[ref.rows_frame - 1].size) +
                                " bytes (codec " + std::to_string(ref.codec) +
                                "), expected " + std::to_string(ref.num_keys) +
                                " raw records of " +
                                std::to_string(record_bytes) + " bytes"));
  }
  if (records) {
    // Sized above.
  } else if (ref.codec != 0) {
    namespace cz = compression;
    if (ref.codec >= cz::kNumCodecs ||
        cz::CodecForId(static_cast<cz::CodecId>(ref.codec)).IsSparse()) {
      return core_->Reject(
          RejectReason::kBadCodec,
          Status::InvalidArgument(name +
                                  ": rows need a dense codec (none, fp16, "
                                  "bf16, ...), not codec " +
                                  std::to_string(ref.codec)));
    }
    if (push) {
      const ByteView& f = data[ref.rows_frame - 1];
      Status v = cz::CodecForId(static_cast<cz::CodecId>(ref.codec))
                     .Validate(f.data, f.size, values);
      if (!v.ok())
        return core_->Reject(RejectReason::kBadCodec, v.WithContext(name));
    }
  } else if (push && data[ref.rows_frame - 1].size != values * sizeof(float)) {
    return core_->Reject(
        RejectReason::kSizeMismatch,
        Status::InvalidArgument(
            name + ": rows frame of " +
            std::to_string(data[ref.rows_frame - 1].size) +
            " bytes, expected " + std::to_string(ref.num_keys) + " rows of " +
            std::to_string(shard_.sparse->specs()[ref.table].dim) + " floats"));
  }
  return Status::OK();
}

Status SparseRequests::SizeDecoded(size_t total_keys, size_t total_values,
                                   size_t total_state, const Shape& shape) {
  const bool records = shape.records, saved = shape.saved;
  // The scratch (reused) is charged to the memory budget at its size.
  const uint64_t scratch = total_keys * sizeof(uint64_t) * (records ? 2 : 1) +
                           (saved ? total_keys * 12 : 0) +
                           (total_values + total_state) * sizeof(float);
  if (scratch > request_charge_.bytes()) {
    Status c = Recharge(shard_.budget, scratch,
                        "decoded keys and rows of a request", &request_charge_);
    if (!c.ok()) return core_->Reject(RejectReason::kMemoryBudget, c);
    shard_.rows.keys.reserve(total_keys);
    shard_.rows.values.reserve(total_values);
  }
  shard_.rows.keys.resize(total_keys);
  shard_.rows.values.resize(total_values);
  if (records) {
    shard_.rows.state.resize(total_state);
    shard_.rows.steps.resize(total_keys);
  }
  if (saved) {
    shard_.rows.kinds.resize(total_keys);
    shard_.rows.clocks.resize(total_keys);
  }
  return Status::OK();
}

void SparseRequests::DecodeRecords(const PendingRows& p, const ByteView& f,
                                   bool saved, float* rows) {
  const sparse::SparseTable& t = shard_.sparse->table(p.table);
  const size_t dim = shard_.sparse->specs()[p.table].dim;
  const size_t k = t.state_floats();
  for (size_t j = 0; j < p.n; ++j) {
    const uint8_t* rec;
    if (saved) {
      rec = f.data + j * t.saved_record_bytes();
      uint32_t zero = 0;
      std::memcpy(&shard_.rows.kinds[p.keys_at + j], rec, sizeof(uint32_t));
      std::memcpy(&zero, rec + 4, sizeof(zero));
      if (zero != 0) shard_.rows.kinds[p.keys_at + j] = 0;  // refused below
      std::memcpy(&shard_.rows.clocks[p.keys_at + j], rec + 16,
                  sizeof(int64_t));
      // Then the count (as a row record's steps), the clock (read
      // above) and the floats (as a row record's).
      std::memcpy(&shard_.rows.steps[p.keys_at + j], rec + 8, sizeof(uint64_t));
      rec += 16;
    } else {
      rec = f.data + j * t.record_bytes();
      std::memcpy(&shard_.rows.steps[p.keys_at + j], rec, sizeof(uint64_t));
    }
    rec += sizeof(uint64_t);
    std::memcpy(rows + j * dim, rec, dim * sizeof(float));
    std::memcpy(shard_.rows.state.data() + p.state_at + j * k,
                rec + dim * sizeof(float), k * sizeof(float));
  }
}

Status SparseRequests::DecodeRef(const RowsRef& ref, const PendingRows& p,
                                 const std::vector<ByteView>& data,
                                 const Shape& shape) {
  const bool push = shape.push, records = shape.records;
  uint64_t* keys = shard_.rows.keys.data() + p.keys_at;
  std::memcpy(keys, data[ref.keys_frame - 1].data, p.n * sizeof(uint64_t));
  float* rows = nullptr;
  if (push) {
    rows = shard_.rows.values.data() + p.rows_at;
    const ByteView& f = data[ref.rows_frame - 1];
    if (records) {
      DecodeRecords(p, f, shape.saved, rows);
    } else if (ref.codec == 0) {
      std::memcpy(rows, f.data, f.size);
    } else {
      const size_t values = p.n * shard_.sparse->specs()[p.table].dim;
      Status s =
          compression::CodecForId(static_cast<compression::CodecId>(ref.codec))
              .Decode(f.data, f.size, values, rows);
      if (!s.ok())
        return core_->Reject(RejectReason::kBadCodec,
                             s.WithContext(TableName(*shard_.sparse, p.table)));
    }
  }
  sparse::CheckFailure why = sparse::CheckFailure::kNone;
  Status s = shard_.sparse->Check(p.table, keys, p.n, rows, &why);
  if (!s.ok()) {
    RejectReason reason = RejectReason::kOther;  // duplicate keys
    if (why == sparse::CheckFailure::kUnknownTable)
      reason = RejectReason::kUnknownChunk;
    if (why == sparse::CheckFailure::kWrongShard)
      reason = RejectReason::kWrongShard;
    if (why == sparse::CheckFailure::kNonFinite)
      reason = RejectReason::kNonFinite;
    if (why == sparse::CheckFailure::kTooLarge)
      reason = RejectReason::kOversize;
    return core_->Reject(reason, s);
  }
  return Status::OK();
}

Status SparseRequests::ChargeRound() {
  if (shard_.rows.pending.empty() ||
      shard_.options.consistency != Consistency::kBsp ||
      shard_.options.sparse_async)
    return Status::OK();
  // This round's sums may grow by a row (and its index entry, and its entry
  // in the rank's key set) per key.
  uint64_t grow = 0;
  for (const PendingRows& p : shard_.rows.pending)
    grow += p.n * (shard_.sparse->specs()[p.table].dim * sizeof(float) + 72);
  Status c = Recharge(shard_.budget, round_charge_.bytes() + grow,
                      "BSP sums of sparse rows", &round_charge_);
  if (!c.ok()) return core_->Reject(RejectReason::kMemoryBudget, c);
  return Status::OK();
}

Status SparseRequests::HoldPush() {
  for (const PendingRows& p : shard_.rows.pending) {
    Status s =
        shard_.sparse->Hold(p.table, shard_.rows.keys.data() + p.keys_at, p.n);
    if (s.ok()) continue;
    shard_.sparse->ReleaseHeld();
    shard_.rows.pending.clear();
    return core_->Reject(
        RejectReason::kStore,
        Status::Unavailable("reading the rows of the push failed, "
                            "nothing of it was applied (retry): " +
                            s.ToString()));
  }
  return Status::OK();
}

Status SparseRequests::ApplyPush(int rank, int64_t clock, float lr_scale) {
  if (shard_.rows.pending.empty()) return Status::OK();
  const bool durable = shard_.options.durable && shard_.store != nullptr;
  // Every table's rows are applied even when a write-back of evicted rows
  // fails on the way (the rows stay in the cache, dirty): the push is never
  // left half applied by the store.
  Status first;
  for (const PendingRows& p : shard_.rows.pending) {
    const uint64_t* keys = shard_.rows.keys.data() + p.keys_at;
    const float* grads = shard_.rows.values.data() + p.rows_at;
    if (shard_.options.consistency == Consistency::kBsp &&
        !shard_.options.sparse_async) {
      shard_.sparse->Accumulate(p.table, keys, grads, p.n,
                                rank);  // charged before
      continue;
    }
    Status s = shard_.sparse->Apply(p.table, keys, grads, p.n, clock, lr_scale,
                                    durable);
    if (first.ok()) first = s;
  }
  shard_.sparse->ReleaseHeld();
  shard_.rows.pending.clear();
  return first;
}

Status SparseRequests::ValidatePull(const RequestHeader& req,
                                    const std::vector<ByteView>& data) {
  if (req.rows.empty()) return Status::OK();
  ++shard_.stamp;  // frames and tables of this pull
  if (data.size() != req.rows.size()) {
    return core_->Reject(
        RejectReason::kSizeMismatch,
        Status::InvalidArgument("pull carries " + std::to_string(data.size()) +
                                " data frames for " +
                                std::to_string(req.rows.size()) + " row refs"));
  }
  return ValidatePush(req, data);
}

Status SparseRequests::AnswerPull(const RequestHeader& req,
                                  const std::vector<ByteView>& data,
                                  OutgoingReply* reply, uint64_t* fresh) {
  reply->header.rows.clear();
  if (req.rows.empty()) return Status::OK();
  // Parked pulls are answered later: validate again (the same checks) to
  // fill this request's scratch.
  RETURN_IF_ERROR(ValidatePull(req, data));
  for (size_t i = 0; i < req.rows.size(); ++i) {
    const RowsRef& ref = req.rows[i];
    const PendingRows& p = shard_.rows.pending[i];
    const size_t values = p.n * shard_.sparse->specs()[p.table].dim;
    auto owner = std::make_shared<ChargedBuffer>();
    StatusOr<MemoryBudget::Charge> charge = shard_.budget.Reserve(
        values * sizeof(float), "sparse rows of a pull reply");
    if (!charge.ok())
      return core_->Reject(RejectReason::kMemoryBudget, charge.status());
    owner->charge = std::move(charge).value();
    BufferPtr rows = Buffer::Allocate(values * sizeof(float));
    Status s = shard_.sparse->Read(p.table, shard_.rows.keys.data() + p.keys_at,
                                   p.n, rows->floats());
    if (!s.ok()) return core_->Reject(RejectReason::kStore, s);
    RowsRef out;
    out.table = ref.table;
    out.num_keys = p.n;
    out.codec = 0;
    if (ref.codec != 0) {
      compression::CodecSpec spec;
      spec.id = static_cast<compression::CodecId>(ref.codec);
      StatusOr<std::unique_ptr<compression::Codec>> codec =
          compression::CreateCodec(spec);
      if (!codec.ok())
        return core_->Reject(RejectReason::kBadCodec, codec.status());
      std::vector<uint8_t> payload;
      s = (*codec)->Encode(rows->floats(), values, 0, &payload);
      if (!s.ok()) return core_->Reject(RejectReason::kBadCodec, s);
      rows = Buffer::FromVector(std::move(payload));
      out.codec = ref.codec;
      owner->charge.ShrinkTo(rows->size());
    }
    owner->buffer = rows;
    *fresh += owner->charge.bytes();
    out.rows_frame = static_cast<uint32_t>(reply->frames.size() + 1);
    reply->frames.push_back(ByteView{rows->data(), rows->size(), owner});
    reply->header.rows.push_back(out);
  }
  shard_.rows.pending.clear();
  return Status::OK();
}

}  // namespace asyncps::server
