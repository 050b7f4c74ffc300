// Shard: the rows of sparse tables in registration, pushes, pulls, BSP
// rounds and persistence (the tables themselves: server/sparse/).
//
// A push's RowsRefs are validated after its chunks and before anything is
// applied: each names a registered table at most once, two data frames of
// the message that no other ref uses, a keys frame of exactly num_keys
// uint64 and a rows frame of num_keys x dim values in fp32 or a dense codec
// (validated before anything is allocated for it); then the keys (count
// limit, duplicates, ownership) and the decoded rows (NaN/Inf) are checked
// by SparseTables::Check. Keys and rows are copied into aligned scratch
// (frames may sit unaligned in a message) where phase 2 applies them from.
// An upload of rows with their optimizer state (kAssign phase 5) carries
// row records instead of rows (raw only: num_keys x the table's record
// size, common/protocol.capnp), split here into the weights (checked as
// rows), the state (rows_->state) and the steps (rows_->steps); phase 7's
// saved records (common/sparse_table.h) also into the kinds (rows_->kinds)
// and clocks (rows_->clocks).
#include <glog/logging.h>

#include <cstring>

#include "server/internal/shard_types.h"
#include "server/shard/shard.h"
#if ASYNCPS_SERVER_HAVE_COMPRESSION
#include "compression/codec.h"
#endif

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

Status Shard::RegisterTables(const std::vector<TableSpec>& tables,
                             bool created) {
  if (!created) {
    // Re-registration (idempotent): the same tables, or an error naming the
    // first that differs.
    static const std::vector<TableSpec> kNone;
    const std::vector<TableSpec>& have = sparse_ ? sparse_->specs() : kNone;
    for (size_t i = 0; i < std::max(have.size(), tables.size()); ++i) {
      if (i < have.size() && i < tables.size() && have[i] == tables[i])
        continue;
      const std::string& name =
          i < tables.size() ? tables[i].name : have[i].name;
      return Reject(RejectReason::kRegistrationMismatch,
                    Status::AlreadyExists(
                        "table '" + name + "' (index " + std::to_string(i) +
                        ") does not match the registered tables" +
                        (i >= tables.size() ? " (missing)" : "")));
    }
    return Status::OK();
  }
  sparse_.reset();
  sparse_charge_.Reset();
  if (tables.empty()) return Status::OK();
  sparse::SparseOptions o = options_.sparse;
  // The embedding cache is part of what the shard holds for its peers.
  StatusOr<MemoryBudget::Charge> charge =
      budget_->Reserve(o.cache_bytes, "the embedding cache");
  if (!charge.ok()) return Reject(RejectReason::kMemoryBudget, charge.status());
  sparse_charge_ = std::move(charge).value();
  o.shard_id = options_.shard_id;
  o.num_shards = options_.num_shards;
  StatusOr<std::unique_ptr<sparse::SparseTables>> t =
      sparse::SparseTables::Create(o, tables, store_);
  if (!t.ok()) {
    return Reject(RejectReason::kRegistrationMismatch,
                  t.status().WithContext("sparse tables"));
  }
  sparse_ = std::move(t).value();
  ApplyKeyRanges();  // an elastic fleet's adopted key ranges
  sparse_->AdvanceClock(clocks_.MinLiveClock());
  table_stamp_.assign(tables.size(), 0);
  LOG(INFO) << "registered " << tables.size() << " sparse tables";
  return Status::OK();
}

// Validates and decodes the RowsRefs of a push or a pull into
// rows_->pending, rows_->keys and (pushes) rows_->values. `stamp_` and
// frame_stamp_ already hold this request's chunk frames.
Status Shard::ValidateSparsePush(const RequestHeader& req,
                                 const std::vector<ByteView>& data) {
  rows_->pending.clear();
  if (req.rows.empty()) return Status::OK();
  if (!sparse_) {
    return Reject(RejectReason::kUnknownChunk,
                  Status::NotFound("push names rows of " +
                                   std::to_string(req.rows.size()) +
                                   " tables, but no sparse table is "
                                   "registered"));
  }
  // Pushes and uploads (kAssign) carry rows; pulls and reads of row
  // records (kAssign phase 3) carry keys only.
  const bool assign = req.kind == RequestKind::kAssign;
  const bool push = req.kind == RequestKind::kPush ||
                    (assign && req.assign_phase != AssignOp::kRead);
  const bool records = assign && (req.assign_phase == AssignOp::kRows ||
                                  req.assign_phase == AssignOp::kSaved);
  // Phase 7: saved records (kind, count, clock before the row record).
  const bool saved = assign && req.assign_phase == AssignOp::kSaved;
  const sparse::SparseOptions& limits = sparse_->options();
  if (frame_stamp_.size() < data.size()) frame_stamp_.resize(data.size(), 0);
  sparse_->BeginRequest();
  // Sizes first, so nothing is allocated for a request that lies about them.
  size_t total_keys = 0, total_values = 0, total_state = 0;
  for (const RowsRef& ref : req.rows) {
    if (ref.table >= sparse_->num_tables()) {
      return Reject(RejectReason::kUnknownChunk,
                    Status::NotFound("unknown table " +
                                     std::to_string(ref.table) + " (" +
                                     std::to_string(sparse_->num_tables()) +
                                     " registered)"));
    }
    const std::string name = TableName(*sparse_, ref.table);
    if (table_stamp_[ref.table] == stamp_) {
      return Reject(RejectReason::kOther,
                    Status::InvalidArgument(name + " named twice in one " +
                                            RequestKindName(req.kind)));
    }
    table_stamp_[ref.table] = stamp_;
    if (ref.num_keys > limits.max_keys_per_request) {
      return Reject(RejectReason::kOversize,
                    Status::InvalidArgument(
                        name + ": " + std::to_string(ref.num_keys) +
                        " keys, more than the " +
                        std::to_string(limits.max_keys_per_request) +
                        " one request may name: split it"));
    }
    const uint32_t frames[2] = {ref.keys_frame, ref.rows_frame};
    for (int k = 0; k < (push ? 2 : 1); ++k) {  // pulls carry keys only
      const uint32_t f = frames[k];
      if (f < 1 || f > data.size()) {
        return Reject(RejectReason::kSizeMismatch,
                      Status::InvalidArgument(
                          name + ": frame index " + std::to_string(f) +
                          " out of range [1, " + std::to_string(data.size()) +
                          "]"));
      }
      if (frame_stamp_[f - 1] == stamp_) {
        return Reject(RejectReason::kSizeMismatch,
                      Status::InvalidArgument(name + ": frame " +
                                              std::to_string(f) +
                                              " referenced twice"));
      }
      frame_stamp_[f - 1] = stamp_;
    }
    const ByteView& keys = data[ref.keys_frame - 1];
    if (keys.size != ref.num_keys * sizeof(uint64_t)) {
      return Reject(RejectReason::kSizeMismatch,
                    Status::InvalidArgument(
                        name + ": keys frame of " + std::to_string(keys.size) +
                        " bytes for " + std::to_string(ref.num_keys) +
                        " keys"));
    }
    const uint64_t values = ref.num_keys * sparse_->specs()[ref.table].dim;
    const sparse::SparseTable& table = sparse_->table(ref.table);
    const size_t record_bytes =
        saved ? table.saved_record_bytes() : table.record_bytes();
    if (records &&
        (ref.codec != 0 || data[ref.rows_frame - 1].size !=
                               ref.num_keys * record_bytes)) {
      return Reject(
          RejectReason::kSizeMismatch,
          Status::InvalidArgument(
              name + ": row records frame of " +
              std::to_string(data[ref.rows_frame - 1].size) + " bytes (codec " +
              std::to_string(ref.codec) + "), expected " +
              std::to_string(ref.num_keys) + " raw records of " +
              std::to_string(record_bytes) + " bytes"));
    }
    if (records) {
      // Sized above.
    } else if (ref.codec != 0) {
#if ASYNCPS_SERVER_HAVE_COMPRESSION
      namespace cz = compression;
      if (ref.codec >= cz::kNumCodecs ||
          cz::CodecForId(static_cast<cz::CodecId>(ref.codec)).IsSparse()) {
        return Reject(RejectReason::kBadCodec,
                      Status::InvalidArgument(
                          name + ": rows need a dense codec (none, fp16, "
                                 "bf16, ...), not codec " +
                          std::to_string(ref.codec)));
      }
      if (push) {
        const ByteView& f = data[ref.rows_frame - 1];
        Status v = cz::CodecForId(static_cast<cz::CodecId>(ref.codec))
                       .Validate(f.data, f.size, values);
        if (!v.ok())
          return Reject(RejectReason::kBadCodec, v.WithContext(name));
      }
#else
      return Reject(RejectReason::kBadCodec,
                    Status::Unimplemented(name + ": codec " +
                                          std::to_string(ref.codec) +
                                          " needs the compression library"));
#endif
    } else if (push &&
               data[ref.rows_frame - 1].size != values * sizeof(float)) {
      return Reject(RejectReason::kSizeMismatch,
                    Status::InvalidArgument(
                        name + ": rows frame of " +
                        std::to_string(data[ref.rows_frame - 1].size) +
                        " bytes, expected " + std::to_string(ref.num_keys) +
                        " rows of " +
                        std::to_string(sparse_->specs()[ref.table].dim) +
                        " floats"));
    }
    PendingRows p;
    p.table = ref.table;
    p.n = ref.num_keys;
    p.keys_at = total_keys;
    p.rows_at = total_values;
    p.state_at = total_state;
    rows_->pending.push_back(p);
    total_keys += ref.num_keys;
    if (push) total_values += values;
    if (records) total_state += ref.num_keys * table.state_floats();
  }
  // Decode and check every table's part before anything is applied. The
  // scratch (reused) is charged to the memory budget at its size.
  const uint64_t scratch = total_keys * sizeof(uint64_t) *
                               (records ? 2 : 1) +
                           (saved ? total_keys * 12 : 0) +
                           (total_values + total_state) * sizeof(float);
  if (scratch > request_charge_.bytes()) {
    Status c = Recharge(*budget_, scratch, "decoded keys and rows of a request",
                        &request_charge_);
    if (!c.ok()) return Reject(RejectReason::kMemoryBudget, c);
    rows_->keys.reserve(total_keys);
    rows_->values.reserve(total_values);
  }
  rows_->keys.resize(total_keys);
  rows_->values.resize(total_values);
  if (records) {
    rows_->state.resize(total_state);
    rows_->steps.resize(total_keys);
  }
  if (saved) {
    rows_->kinds.resize(total_keys);
    rows_->clocks.resize(total_keys);
  }
  for (size_t i = 0; i < req.rows.size(); ++i) {
    const RowsRef& ref = req.rows[i];
    const PendingRows& p = rows_->pending[i];
    uint64_t* keys = rows_->keys.data() + p.keys_at;
    std::memcpy(keys, data[ref.keys_frame - 1].data, p.n * sizeof(uint64_t));
    float* rows = nullptr;
    if (push) {
      rows = rows_->values.data() + p.rows_at;
      const ByteView& f = data[ref.rows_frame - 1];
      if (records) {
        const sparse::SparseTable& t = sparse_->table(p.table);
        const size_t dim = sparse_->specs()[p.table].dim;
        const size_t k = t.state_floats();
        for (size_t j = 0; j < p.n; ++j) {
          const uint8_t* rec;
          if (saved) {
            rec = f.data + j * t.saved_record_bytes();
            uint32_t zero = 0;
            std::memcpy(&rows_->kinds[p.keys_at + j], rec, sizeof(uint32_t));
            std::memcpy(&zero, rec + 4, sizeof(zero));
            if (zero != 0) rows_->kinds[p.keys_at + j] = 0;  // refused below
            std::memcpy(&rows_->clocks[p.keys_at + j], rec + 16,
                        sizeof(int64_t));
            // Then the count (as a row record's steps), the clock (read
            // above) and the floats (as a row record's).
            std::memcpy(&rows_->steps[p.keys_at + j], rec + 8,
                        sizeof(uint64_t));
            rec += 16;
          } else {
            rec = f.data + j * t.record_bytes();
            std::memcpy(&rows_->steps[p.keys_at + j], rec, sizeof(uint64_t));
          }
          rec += sizeof(uint64_t);
          std::memcpy(rows + j * dim, rec, dim * sizeof(float));
          std::memcpy(rows_->state.data() + p.state_at + j * k,
                      rec + dim * sizeof(float), k * sizeof(float));
        }
      } else if (ref.codec == 0) {
        std::memcpy(rows, f.data, f.size);
      } else {
#if ASYNCPS_SERVER_HAVE_COMPRESSION
        const size_t values = p.n * sparse_->specs()[p.table].dim;
        Status s = compression::CodecForId(
                       static_cast<compression::CodecId>(ref.codec))
                       .Decode(f.data, f.size, values, rows);
        if (!s.ok())
          return Reject(RejectReason::kBadCodec,
                        s.WithContext(TableName(*sparse_, p.table)));
#endif
      }
    }
    sparse::CheckFailure why = sparse::CheckFailure::kNone;
    Status s = sparse_->Check(p.table, keys, p.n, rows, &why);
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
      return Reject(reason, s);
    }
  }
  return Status::OK();
}

Status Shard::ChargeSparseRound() {
  if (rows_->pending.empty() || options_.consistency != Consistency::kBsp ||
      options_.sparse_async)
    return Status::OK();
  // This round's sums may grow by a row (and its index entry, and its entry
  // in the rank's key set) per key.
  uint64_t grow = 0;
  for (const PendingRows& p : rows_->pending)
    grow += p.n * (sparse_->specs()[p.table].dim * sizeof(float) + 72);
  Status c = Recharge(*budget_, round_charge_.bytes() + grow,
                      "BSP sums of sparse rows", &round_charge_);
  if (!c.ok()) return Reject(RejectReason::kMemoryBudget, c);
  return Status::OK();
}

Status Shard::HoldSparsePush() {
  for (const PendingRows& p : rows_->pending) {
    Status s = sparse_->Hold(p.table, rows_->keys.data() + p.keys_at, p.n);
    if (s.ok()) continue;
    sparse_->ReleaseHeld();
    rows_->pending.clear();
    return Reject(RejectReason::kStore,
                  Status::Unavailable("reading the rows of the push failed, "
                                      "nothing of it was applied (retry): " +
                                      s.ToString()));
  }
  return Status::OK();
}

Status Shard::ApplySparsePush(int rank, int64_t clock, float lr_scale) {
  if (rows_->pending.empty()) return Status::OK();
  const bool durable = options_.durable && store_ != nullptr;
  // Every table's rows are applied even when a write-back of evicted rows
  // fails on the way (the rows stay in the cache, dirty): the push is never
  // left half applied by the store.
  Status first;
  for (const PendingRows& p : rows_->pending) {
    const uint64_t* keys = rows_->keys.data() + p.keys_at;
    const float* grads = rows_->values.data() + p.rows_at;
    if (options_.consistency == Consistency::kBsp && !options_.sparse_async) {
      sparse_->Accumulate(p.table, keys, grads, p.n, rank);  // charged before
      continue;
    }
    Status s = sparse_->Apply(p.table, keys, grads, p.n, clock, lr_scale,
                              durable);
    if (first.ok()) first = s;
  }
  sparse_->ReleaseHeld();
  rows_->pending.clear();
  return first;
}

Status Shard::ValidateSparsePull(const RequestHeader& req,
                                 const std::vector<ByteView>& data) {
  if (req.rows.empty()) return Status::OK();
  ++stamp_;  // frames and tables of this pull
  if (data.size() != req.rows.size()) {
    return Reject(RejectReason::kSizeMismatch,
                  Status::InvalidArgument(
                      "pull carries " + std::to_string(data.size()) +
                      " data frames for " + std::to_string(req.rows.size()) +
                      " row refs"));
  }
  return ValidateSparsePush(req, data);
}

Status Shard::AnswerSparsePull(const RequestHeader& req,
                               const std::vector<ByteView>& data,
                               OutgoingReply* reply, uint64_t* fresh) {
  reply->header.rows.clear();
  if (req.rows.empty()) return Status::OK();
  // Parked pulls are answered later: validate again (the same checks) to
  // fill this request's scratch.
  RETURN_IF_ERROR(ValidateSparsePull(req, data));
  for (size_t i = 0; i < req.rows.size(); ++i) {
    const RowsRef& ref = req.rows[i];
    const PendingRows& p = rows_->pending[i];
    const size_t values = p.n * sparse_->specs()[p.table].dim;
    auto owner = std::make_shared<ChargedBuffer>();
    StatusOr<MemoryBudget::Charge> charge =
        budget_->Reserve(values * sizeof(float), "sparse rows of a pull reply");
    if (!charge.ok())
      return Reject(RejectReason::kMemoryBudget, charge.status());
    owner->charge = std::move(charge).value();
    BufferPtr rows = Buffer::Allocate(values * sizeof(float));
    Status s = sparse_->Read(p.table, rows_->keys.data() + p.keys_at, p.n,
                             rows->floats());
    if (!s.ok()) return Reject(RejectReason::kStore, s);
    RowsRef out;
    out.table = ref.table;
    out.num_keys = p.n;
    out.codec = 0;
#if ASYNCPS_SERVER_HAVE_COMPRESSION
    if (ref.codec != 0) {
      compression::CodecSpec spec;
      spec.id = static_cast<compression::CodecId>(ref.codec);
      StatusOr<std::unique_ptr<compression::Codec>> codec =
          compression::CreateCodec(spec);
      if (!codec.ok()) return Reject(RejectReason::kBadCodec, codec.status());
      std::vector<uint8_t> payload;
      s = (*codec)->Encode(rows->floats(), values, 0, &payload);
      if (!s.ok()) return Reject(RejectReason::kBadCodec, s);
      rows = Buffer::FromVector(std::move(payload));
      out.codec = ref.codec;
      owner->charge.ShrinkTo(rows->size());
    }
#endif
    owner->buffer = rows;
    *fresh += owner->charge.bytes();
    out.rows_frame = static_cast<uint32_t>(reply->frames.size() + 1);
    reply->frames.push_back(ByteView{rows->data(), rows->size(), owner});
    reply->header.rows.push_back(out);
  }
  rows_->pending.clear();
  return Status::OK();
}

Status Shard::WriteCut(bool checkpoint, SyncMode sync, uint64_t* bytes) {
  *bytes = StoreEntriesBytes(entries_);
  if (!sparse_) return store_->Write(entries_, sync);
  if (checkpoint) sparse_->AddSpecsEntry(&entries_);
  sparse_->AddStateEntry(&entries_);
  std::unique_ptr<StoreBatch> batch = store_->NewBatch();
  if (checkpoint) {
    RETURN_IF_ERROR(sparse_->FlushForCheckpoint(batch.get()));
  } else {
    sparse_->AddDurable(batch.get());
  }
  *bytes = StoreEntriesBytes(entries_) + batch->bytes();
  Status s = store_->Write(entries_, batch.get(), sync, WriteKind::kCut);
  if (checkpoint) {
    if (s.ok()) sparse_->CommitCheckpoint();
  } else {
    sparse_->CommitDurable(s.ok());
  }
  return s;
}

}  // namespace asyncps::server
