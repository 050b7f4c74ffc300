// UploadHandler (server/upload/upload_handler.h): uploads of values (kAssign:
// fine-tuning from a worker's weights, ps.load_state_dict()). The request is
// described in common/protocol.capnp (Assign), its operations in
// common/wire.h (AssignOp).
//
// The upload claim. One (rank, incarnation, upload id) at a time may upload
// this shard's values. `begin` takes the claim when nobody holds a live one
// and the values are not final (no upload committed, no update applied) or
// the begin says overwrite; it answers created = true to the claimant, and
// created = false (pull the values) once they are final. While another
// worker holds a live claim a begin is answered Unavailable, which the
// client retries: the other ranks wait there until the values are final.
// A claim is live while its worker is live and its last upload request is
// younger than worker_timeout; a restarted process of the same rank (new
// incarnation) takes its predecessor's claim at once. `values` requests of
// the claimant write whole chunks and rows of sparse tables (each
// validated -- owned by this shard, codec 0, sizes, finite, keys unique --
// before any is written; rows get zero optimizer state), `state` requests
// of the claimant set the optimizer state and steps of whole chunks
// (ps.load_optimizer_state_dict(); validated the same way, and for this
// shard's optimizer: its name, k floats per weight, steps <= 2^53, sums of
// squares >= 0), `rows` requests (phase 5) of the claimant set rows of
// sparse tables from records with their saved optimizer state and steps
// (validated as values, and for each table's row optimizer: its name,
// finite state, sums of squares >= 0, steps <= 2^53; the rows' weights are
// written then, as phase 1's), a `read` (phase 3) that names rows answers
// their records (weights, state, steps; no claim needed, as the dense
// state's read), a `scan` (phase 6, no claim needed) answers a page of a
// table's entries (keys from a cursor, rows and admission counters with
// their steps or counts and last-push clocks; the page size bounded by the
// request limits; routed by the shard's layout epoch, as pushes and pulls,
// so a scan never sees a moving key on two shards or on none; plain or
// point-in-time: server/upload/upload_scan.cc), `saved`
// requests (phase 7) of the claimant set such
// entries back (checked as phase 5's, and their kinds, counts and clocks),
// a `clear` (phase 8) of the claimant drops every entry of the tables it
// names (cached and stored: a range delete, one store write; so a restore
// of saved entries leaves exactly them),
// `commit` keeps the state of the chunks whose state this
// upload set and resets every other chunk's (refused when the upload set
// some chunks' state but not all: half a state is never made final), sets
// the shard's version (the lr schedule's count) to the largest step of its
// chunks (0 without state), marks the values final and checkpoints them
// (with a store). Resends are
// harmless: a begin or commit of an upload already committed answers OK
// (created = false), values and state are idempotent. Every write happens
// before a commit, and no rank trains from the shard before its begin
// answers created = false, so nobody reads half an upload; a claimant that
// dies mid-upload is replaced and the next claimant writes every chunk
// again (the state it set is reset unless the new claimant sets it too).
#include "server/upload/upload_handler.h"

#include <glog/logging.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "server/shard/shard_types.h"
#include "server/shard/sparse_requests.h"

namespace asyncps::server {

using internal::PendingRows;

namespace {

// The most optimizer steps a state upload may set: 2^53, exact in the
// double of Adam's bias correction (and beyond any run's count).
constexpr uint64_t kMaxOptimizerSteps = uint64_t{1} << 53;

bool FiniteFloats(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, p + i * sizeof(float), sizeof(float));
    if (!std::isfinite(v)) return false;
  }
  return true;
}

bool NonNegativeFloats(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, p + i * sizeof(float), sizeof(float));
    if (v < 0.0f) return false;
  }
  return true;
}

// The slot of state that is a sum of squares (never negative: the update
// takes its square root), or -1.
int SquaresSlot(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kAdam:
      return 1;  // [m | v]
    case OptimizerKind::kAdaGrad:
      return 0;
    default:
      return -1;
  }
}

}  // namespace

Status UploadHandler::ReadOptimizerState(const std::string& peer,
                                         const RequestHeader& req,
                                         OutgoingReply* reply) {
  const size_t k = shard_.optimizer.state_per_elem();  // dc state not included
  uint64_t bytes = 0;
  for (const auto& c : shard_.chunks) bytes += c->n * k * sizeof(float);
  StatusOr<MemoryBudget::Charge> charge = shard_.budget.Reserve(
      bytes, "a copy of the optimizer state of " +
                 std::to_string(shard_.chunks.size()) + " chunks");
  if (!charge.ok())
    return core_->Reject(RejectReason::kMemoryBudget, charge.status());
  auto held = std::make_shared<ChargedBuffer>();
  held->charge = std::move(charge).value();
  held->buffer = Buffer::Allocate(bytes);
  uint8_t* at = held->buffer->data();
  for (const auto& c : shard_.chunks) {
    const size_t size = c->n * k * sizeof(float);
    if (size > 0) std::memcpy(at, c->state.data(), size);
    ChunkRef ref;
    ref.chunk = c->id;
    ref.frame = static_cast<uint32_t>(reply->frames.size() + 1);
    ref.num_elems = c->n * k;
    ref.byte_size = size;
    ref.version = c->step;
    reply->header.chunks.push_back(ref);
    reply->frames.push_back(ByteView{at, size, held});
    at += size;
  }
  core_->PinUnsent(peer, req.rank, bytes, reply);
  return Status::OK();
}

UploadHandler::UploadHandler(internal::ShardState shard,
                             internal::ShardServices* core,
                             SparseRequests* sparse)
    : shard_(shard), core_(core), rows_(sparse) {}

UploadHandler::~UploadHandler() = default;

void UploadHandler::Tick(TimePoint now) {
  if (!scans_.empty()) ExpireScanSnapshots(now);
}

std::unique_ptr<RequestHandler> UploadHandler::Make(
    const internal::ShardState& shard, internal::ShardServices* core,
    SparseRequests* sparse) {
  return std::make_unique<UploadHandler>(shard, core, sparse);
}

Status UploadHandler::Handle(const std::string& peer, const RequestHeader& req,
                             const std::vector<ByteView>& data, TimePoint now,
                             OutgoingReply* out,
                             std::vector<OutgoingReply>* /*others*/) {
  ReplyHeader* reply = &out->header;
  reply->created = false;
  if (!shard_.layout) {
    return core_->Reject(
        RejectReason::kNotRegistered,
        Status::FailedPrecondition("no layout registered: register first"));
  }
  if (req.assign_upload == 0 || req.assign_phase > kLastAssignOp) {
    return core_->Reject(
        RejectReason::kUploadClaim,
        Status::InvalidArgument(
            "assign needs an upload id != 0 and a phase in "
            "{0 begin, 1 values, 2 commit, 3 read, 4 state, 5 rows "
            "with state, 6 scan, 7 saved rows, 8 clear tables}, "
            "got phase " +
            std::to_string(static_cast<int>(req.assign_phase))));
  }
  if (req.assign_phase == AssignOp::kScan)
    return ScanRows(peer, req, data, now, out);
  const bool read_rows = req.assign_phase == AssignOp::kRead &&
                         req.chunks.empty() && !req.rows.empty();
  const bool records = req.assign_phase == AssignOp::kRows ||
                       req.assign_phase == AssignOp::kSaved;
  if (req.assign_phase != AssignOp::kValues &&
      req.assign_phase != AssignOp::kState && !records && !read_rows &&
      req.assign_phase != AssignOp::kClear &&
      (!req.chunks.empty() || !req.rows.empty() || !data.empty())) {
    return core_->Reject(
        RejectReason::kSizeMismatch,
        Status::InvalidArgument(
            "only an assign of phase 1 (values), 4 (state) or 5 "
            "(rows with state) carries chunks or rows, of phase 3 "
            "(read) keys of rows, and of phase 8 (clear) tables"));
  }
  if (read_rows) return ReadRowRecords(peer, req, data, out);
  if (req.assign_phase == AssignOp::kRead)
    return ReadOptimizerState(peer, req, out);
  const UploadClaim& c = upload_claim_;
  const bool live = c.rank >= 0 && shard_.clocks.live(c.rank) &&
                    (shard_.options.worker_timeout.count() == 0 ||
                     now - c.last <= shard_.options.worker_timeout);
  const bool mine = c.rank == req.rank && c.incarnation == req.incarnation &&
                    c.upload == req.assign_upload;
  const std::string who = "upload " + std::to_string(req.assign_upload) +
                          " of rank " + std::to_string(req.rank);
  if (req.assign_phase == AssignOp::kBegin) {
    if (mine) {
      upload_claim_.last = now;
      reply->created = true;
      return Status::OK();
    }
    if (committed_upload_ == req.assign_upload) return Status::OK();
    const bool final = values_final_ || shard_.shard_version > 0;
    if (final && !req.assign_overwrite) return Status::OK();
    if (live && c.rank != req.rank) {
      return core_->Reject(
          RejectReason::kUploadClaim,
          Status::Unavailable(
              "rank " + std::to_string(c.rank) +
              " is uploading this shard's values: retry until it "
              "commits"));
    }
    if (c.rank >= 0) {
      LOG(INFO) << who << " takes the upload claim of rank " << c.rank
                << (live ? " (a new incarnation)" : " (silent)");
    }
    upload_claim_ =
        UploadClaim{req.rank, req.incarnation, req.assign_upload, now};
    reply->created = true;
    return Status::OK();
  }
  if (req.assign_phase == AssignOp::kCommit &&
      committed_upload_ == req.assign_upload)
    return Status::OK();  // a resent commit
  if (!mine) {
    return core_->Reject(
        RejectReason::kUploadClaim,
        Status::FailedPrecondition(
            who + " does not hold this shard's upload claim (" +
            (c.rank < 0 ? std::string("none is held")
                        : "rank " + std::to_string(c.rank) + " holds it") +
            "): begin first"));
  }
  if (req.assign_phase == AssignOp::kCommit) return CommitUpload(req, who);
  if (req.assign_phase == AssignOp::kClear) {
    RETURN_IF_ERROR(ClearTables(req, data));
    upload_claim_.last = now;
    return Status::OK();
  }
  if (req.assign_phase == AssignOp::kState || records) {
    RETURN_IF_ERROR(req.assign_phase == AssignOp::kState
                        ? WriteOptimizerState(req, data)
                        : WriteRowRecords(req, data));
    upload_claim_.last = now;
    return Status::OK();
  }
  // Values: every chunk and row checked before any is written.
  if (req.chunks.size() + 2 * req.rows.size() != data.size()) {
    return core_->Reject(
        RejectReason::kSizeMismatch,
        Status::InvalidArgument(
            "assign names " + std::to_string(req.chunks.size()) +
            " chunks and " + std::to_string(req.rows.size()) +
            " row refs (2 frames each) in " + std::to_string(data.size()) +
            " data frames"));
  }
  ++shard_.stamp;
  if (shard_.frame_stamp.size() < data.size())
    shard_.frame_stamp.resize(data.size(), 0);
  for (const ChunkRef& ref : req.chunks) {
    const std::string what = "assign of chunk " + std::to_string(ref.chunk);
    Chunk* chunk = nullptr;
    RETURN_IF_ERROR(CheckAssignRef(ref, data.size(), what, &chunk));
    const ByteView& f = data[ref.frame - 1];
    if (ref.num_elems != chunk->n || ref.byte_size != f.size ||
        f.size != chunk->n * sizeof(float)) {
      return core_->Reject(
          RejectReason::kSizeMismatch,
          Status::InvalidArgument(
              what + ": " + std::to_string(ref.num_elems) + " elements in " +
              std::to_string(f.size) + " bytes (ref says " +
              std::to_string(ref.byte_size) + "), the chunk has " +
              std::to_string(chunk->n) + " floats"));
    }
    if (!FiniteFloats(f.data, chunk->n)) {
      return core_->Reject(RejectReason::kNonFinite,
                           Status::InvalidArgument(what + ": NaN or Inf"));
    }
  }
  // Rows: tables, frames, sizes, keys owned and unique, values finite, the
  // cache budget (SparseRequests), decoded into shard_.rows.pending.
  RETURN_IF_ERROR(rows_->ValidatePush(req, data));
  for (const ChunkRef& ref : req.chunks) {
    Chunk& chunk = *shard_.chunks[shard_.local_index[ref.chunk]];
    std::memcpy(chunk.w.data(), data[ref.frame - 1].data,
                chunk.n * sizeof(float));
    chunk.snapshot_version = ~uint64_t{0};  // pulls copy the new values
  }
  upload_claim_.last = now;
  return AssignPendingRows(req, /*with_state=*/false);
}

Status UploadHandler::AssignPendingRows(const RequestHeader& req,
                                        bool with_state) {
  // Set rows are dirty in the cache; the commit's checkpoint stores them.
  const bool saved = with_state && req.assign_phase == AssignOp::kSaved;
  Status rows;
  for (const PendingRows& p : shard_.rows.pending) {
    Status s = shard_.sparse->Assign(
        p.table, shard_.rows.keys.data() + p.keys_at,
        shard_.rows.values.data() + p.rows_at, p.n,
        shard_.clocks.clock(req.rank),
        /*durable=*/false,
        with_state ? shard_.rows.state.data() + p.state_at : nullptr,
        with_state ? shard_.rows.steps.data() + p.keys_at : nullptr,
        saved ? shard_.rows.kinds.data() + p.keys_at : nullptr,
        saved ? shard_.rows.clocks.data() + p.keys_at : nullptr);
    if (rows.ok()) rows = s;
  }
  shard_.rows.pending.clear();
  if (!rows.ok()) {
    // Values are idempotent: the client resends the request.
    return core_->Reject(
        RejectReason::kStore,
        Status::Unavailable("upload of rows: " + rows.ToString() + "; retry"));
  }
  return Status::OK();
}

Status UploadHandler::WriteRowRecords(const RequestHeader& req,
                                      const std::vector<ByteView>& data) {
  if (!req.chunks.empty() || req.rows.empty() ||
      2 * req.rows.size() != data.size()) {
    return core_->Reject(
        RejectReason::kSizeMismatch,
        Status::InvalidArgument(
            "rows with optimizer state: " + std::to_string(req.rows.size()) +
            " row refs (keys and "
            "records frames each, no chunks) in " +
            std::to_string(data.size()) + " data frames"));
  }
  // The optimizer first: the state of another one has another size.
  for (const RowsRef& ref : req.rows) {
    if (!shard_.sparse || ref.table >= shard_.sparse->num_tables())
      continue;  // below
    Status s =
        CheckRowState(shard_.sparse->specs()[ref.table], req.assign_optimizer,
                      nullptr, nullptr, nullptr, 0);
    if (!s.ok()) return core_->Reject(RejectReason::kOptimizerState, s);
  }
  ++shard_.stamp;
  // Tables, frames, sizes, keys owned and unique, weights finite, decoded.
  RETURN_IF_ERROR(rows_->ValidatePush(req, data));
  for (const PendingRows& p : shard_.rows.pending) {
    Status s =
        CheckRowState(shard_.sparse->specs()[p.table], req.assign_optimizer,
                      shard_.rows.keys.data() + p.keys_at,
                      shard_.rows.state.data() + p.state_at,
                      shard_.rows.steps.data() + p.keys_at, p.n);
    if (s.ok() && req.assign_phase == AssignOp::kSaved) {
      s = CheckSavedMeta(shard_.sparse->specs()[p.table],
                         shard_.rows.keys.data() + p.keys_at,
                         shard_.rows.kinds.data() + p.keys_at,
                         shard_.rows.steps.data() + p.keys_at,
                         shard_.rows.clocks.data() + p.keys_at, p.n);
    }
    if (!s.ok()) {
      shard_.rows.pending.clear();
      return core_->Reject(RejectReason::kOptimizerState, s);
    }
  }
  return AssignPendingRows(req, /*with_state=*/true);
}

Status UploadHandler::ReadRowRecords(const std::string& peer,
                                     const RequestHeader& req,
                                     const std::vector<ByteView>& data,
                                     OutgoingReply* reply) {
  // Keys: tables, frames, counts, ownership, repeats.
  RETURN_IF_ERROR(rows_->ValidatePull(req, data));
  uint64_t bytes = 0;
  for (const PendingRows& p : shard_.rows.pending)
    bytes += p.n * shard_.sparse->table(p.table).record_bytes();
  if (bytes > shard_.sparse->options().max_reply_bytes) {
    shard_.rows.pending.clear();
    return core_->Reject(
        RejectReason::kOversize,
        Status::ResourceExhausted(
            "row records of " + std::to_string(bytes) +
            " bytes, more than a reply may hold (" +
            std::to_string(shard_.sparse->options().max_reply_bytes) +
            "): split it"));
  }
  StatusOr<MemoryBudget::Charge> charge =
      shard_.budget.Reserve(bytes, "a copy of rows and their optimizer state");
  if (!charge.ok()) {
    shard_.rows.pending.clear();
    return core_->Reject(RejectReason::kMemoryBudget, charge.status());
  }
  auto held = std::make_shared<ChargedBuffer>();
  held->charge = std::move(charge).value();
  held->buffer = Buffer::Allocate(bytes);
  uint8_t* at = held->buffer->data();
  for (const PendingRows& p : shard_.rows.pending) {
    const size_t size = p.n * shard_.sparse->table(p.table).record_bytes();
    Status s = shard_.sparse->ReadRecords(
        p.table, shard_.rows.keys.data() + p.keys_at, p.n, at);
    if (!s.ok()) {
      shard_.rows.pending.clear();
      reply->header.rows.clear();
      reply->frames.clear();
      return core_->Reject(
          RejectReason::kStore,
          Status::Unavailable("reading rows: " + s.ToString() + "; retry"));
    }
    RowsRef out;
    out.table = p.table;
    out.num_keys = p.n;
    out.rows_frame = static_cast<uint32_t>(reply->frames.size() + 1);
    reply->header.rows.push_back(out);
    reply->frames.push_back(ByteView{at, size, held});
    at += size;
  }
  shard_.rows.pending.clear();
  core_->PinUnsent(peer, req.rank, bytes, reply);
  return Status::OK();
}

Status UploadHandler::ClearTables(const RequestHeader& req,
                                  const std::vector<ByteView>& data) {
  if (!shard_.sparse) {
    return core_->Reject(RejectReason::kUnknownChunk,
                         Status::NotFound("clear of tables: no sparse table is "
                                          "registered"));
  }
  const size_t num_tables = shard_.sparse->num_tables();
  if (req.rows.empty() || req.rows.size() > num_tables || !req.chunks.empty() ||
      !data.empty()) {
    return core_->Reject(
        RejectReason::kSizeMismatch,
        Status::InvalidArgument(
            "a clear of tables names 1 to " + std::to_string(num_tables) +
            " tables (rows refs without keys) and carries no "
            "chunks or frames; got " +
            std::to_string(req.rows.size()) + " rows refs, " +
            std::to_string(req.chunks.size()) + " chunks, " +
            std::to_string(data.size()) + " frames"));
  }
  // Every ref checked before anything is dropped.
  std::vector<uint32_t> tables;
  for (const RowsRef& ref : req.rows) {
    if (ref.table >= num_tables) {
      return core_->Reject(
          RejectReason::kUnknownChunk,
          Status::NotFound("clear of unknown table " +
                           std::to_string(ref.table) + " (" +
                           std::to_string(num_tables) + " registered)"));
    }
    if (ref.num_keys != 0 || ref.keys_frame != 0 || ref.rows_frame != 0 ||
        std::find(tables.begin(), tables.end(), ref.table) != tables.end()) {
      return core_->Reject(
          RejectReason::kSizeMismatch,
          Status::InvalidArgument("clear of table '" +
                                  shard_.sparse->specs()[ref.table].name +
                                  "': named twice, or with keys or frames"));
    }
    tables.push_back(ref.table);
  }
  // Refused while a key-range move stages rows of a table here, or when
  // the store write fails: nothing dropped, and the client retries.
  Status s = shard_.sparse->ClearTables(tables);
  if (!s.ok()) {
    return core_->Reject(s.code() == StatusCode::kFailedPrecondition
                             ? RejectReason::kStaleLayout
                             : RejectReason::kStore,
                         Status::Unavailable(s.ToString() + "; retry"));
  }
  return Status::OK();
}

Status UploadHandler::CheckAssignRef(const ChunkRef& ref, size_t num_frames,
                                     const std::string& what, Chunk** out) {
  if (ref.chunk >= shard_.local_index.size()) {
    return core_->Reject(RejectReason::kUnknownChunk,
                         Status::InvalidArgument(what + ": not in the layout"));
  }
  if (shard_.local_index[ref.chunk] < 0) {
    return core_->Reject(
        RejectReason::kWrongShard,
        Status::InvalidArgument(what + ": held by another shard"));
  }
  Chunk& chunk = *shard_.chunks[shard_.local_index[ref.chunk]];
  if (chunk.stamp == shard_.stamp) {
    return core_->Reject(RejectReason::kRepeatedChunk,
                         Status::InvalidArgument(what + ": named twice"));
  }
  chunk.stamp = shard_.stamp;
  if (ref.codec != 0) {
    return core_->Reject(RejectReason::kBadCodec,
                         Status::InvalidArgument(what + ": travels as raw fp32 "
                                                        "(codec 0)"));
  }
  if (ref.frame < 1 || ref.frame > num_frames) {
    return core_->Reject(
        RejectReason::kUnknownChunk,
        Status::InvalidArgument(what + ": frame " + std::to_string(ref.frame) +
                                " out of range"));
  }
  if (shard_.frame_stamp[ref.frame - 1] == shard_.stamp) {
    return core_->Reject(
        RejectReason::kUnknownChunk,
        Status::InvalidArgument(what + ": frame " + std::to_string(ref.frame) +
                                " named twice"));
  }
  shard_.frame_stamp[ref.frame - 1] = shard_.stamp;
  *out = &chunk;
  return Status::OK();
}

Status UploadHandler::WriteOptimizerState(const RequestHeader& req,
                                          const std::vector<ByteView>& data) {
  const size_t k = shard_.optimizer.state_per_elem();  // dc state not included
  const std::string name = OptimizerKindName(shard_.options.optimizer.kind);
  if (!req.rows.empty() || req.chunks.size() != data.size()) {
    return core_->Reject(
        RejectReason::kSizeMismatch,
        Status::InvalidArgument("optimizer state of " +
                                std::to_string(req.chunks.size()) +
                                " chunks in " + std::to_string(data.size()) +
                                " data frames (one each, no rows)"));
  }
  ++shard_.stamp;
  if (shard_.frame_stamp.size() < data.size())
    shard_.frame_stamp.resize(data.size(), 0);
  for (const ChunkRef& ref : req.chunks) {
    const std::string what =
        "optimizer state of chunk " + std::to_string(ref.chunk);
    Chunk* chunk = nullptr;
    RETURN_IF_ERROR(CheckAssignRef(ref, data.size(), what, &chunk));
    const std::string tensor =
        "optimizer state of tensor '" +
        shard_.layout->tensors()[shard_.layout->chunks()[ref.chunk].tensor]
            .name +
        "' (chunk " + std::to_string(ref.chunk) + ")";
    if (req.assign_optimizer != name) {
      return core_->Reject(RejectReason::kOptimizerState,
                           Status::InvalidArgument(
                               tensor + " was saved from '" +
                               req.assign_optimizer + "', this shard runs '" +
                               name + "' (ps_server --optimizer): refused"));
    }
    const uint64_t n = chunk->n;
    if (ref.num_elems != k * n && ref.num_elems % n == 0) {
      return core_->Reject(
          RejectReason::kOptimizerState,
          Status::InvalidArgument(tensor + " has " +
                                  std::to_string(ref.num_elems / n) +
                                  " floats per weight, '" + name + "' keeps " +
                                  std::to_string(k) + ": refused"));
    }
    const ByteView& f = data[ref.frame - 1];
    if (ref.num_elems != k * n || ref.byte_size != f.size ||
        f.size != k * n * sizeof(float)) {
      return core_->Reject(
          RejectReason::kSizeMismatch,
          Status::InvalidArgument(
              tensor + ": " + std::to_string(ref.num_elems) + " floats in " +
              std::to_string(f.size) + " bytes (ref says " +
              std::to_string(ref.byte_size) + "), needs " + std::to_string(k) +
              " x " + std::to_string(n)));
    }
    if (ref.version > kMaxOptimizerSteps) {
      return core_->Reject(
          RejectReason::kOptimizerState,
          Status::InvalidArgument(tensor + ": " + std::to_string(ref.version) +
                                  " optimizer steps, at most 2^53"));
    }
    if (!FiniteFloats(f.data, k * n)) {
      return core_->Reject(RejectReason::kNonFinite,
                           Status::InvalidArgument(tensor + ": NaN or Inf"));
    }
    const int squares = SquaresSlot(shard_.options.optimizer.kind);
    if (squares >= 0 &&
        !NonNegativeFloats(
            f.data + static_cast<size_t>(squares) * n * sizeof(float), n)) {
      return core_->Reject(RejectReason::kOptimizerState,
                           Status::InvalidArgument(
                               tensor + ": slot " + std::to_string(squares) +
                               " is a sum of squares, found a negative value"));
    }
  }
  for (const ChunkRef& ref : req.chunks) {
    Chunk& chunk = *shard_.chunks[shard_.local_index[ref.chunk]];
    const size_t bytes = k * chunk.n * sizeof(float);
    if (bytes > 0)
      std::memcpy(chunk.state.data(), data[ref.frame - 1].data, bytes);
    chunk.step = ref.version;
    chunk.state_upload = req.assign_upload;
  }
  return Status::OK();
}

Status UploadHandler::CommitUpload(const RequestHeader& req,
                                   const std::string& who) {
  size_t with_state = 0;
  for (const auto& chunk : shard_.chunks)
    with_state += chunk->state_upload == req.assign_upload ? 1 : 0;
  if (with_state != 0 && with_state != shard_.chunks.size()) {
    return core_->Reject(
        RejectReason::kOptimizerState,
        Status::FailedPrecondition(
            who + " set the optimizer state of " + std::to_string(with_state) +
            " of this shard's " + std::to_string(shard_.chunks.size()) +
            " chunks: every chunk's or none; not committed"));
  }
  const size_t k = shard_.optimizer.state_per_elem();
  uint64_t steps = 0;
  for (auto& chunk : shard_.chunks) {
    if (with_state > 0) {  // the uploaded state kept, the DC state reset
      std::fill(chunk->state.begin() + k * chunk->n, chunk->state.end(), 0.0f);
    } else {
      std::fill(chunk->state.begin(), chunk->state.end(), 0.0f);
      chunk->step = 0;
    }
    steps = std::max(steps, chunk->step);
  }
  // The lr schedule counts updates applied (ScheduleScale()); the restored
  // model has had `steps` (every dense push and BSP round steps every chunk
  // of the shard once), so the schedule resumes there, and restarts with
  // the optimizer state when none was uploaded.
  shard_.shard_version = steps;
  if (shard_.store != nullptr) {
    Status s = core_->Checkpoint();
    if (!s.ok()) {
      return core_->Reject(RejectReason::kStore,
                           Status::Unavailable("upload not stored: " +
                                               s.ToString() + "; retry"));
    }
  }
  values_final_ = true;
  committed_upload_ = req.assign_upload;
  upload_claim_ = UploadClaim{};
  LOG(INFO) << who << " committed: " << shard_.chunks.size()
            << " chunks hold its values"
            << (with_state > 0 ? " and optimizer state" : "");
  return Status::OK();
}

}  // namespace asyncps::server
