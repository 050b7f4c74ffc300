// UploadHandler: scans of sparse tables (AssignOp::kScan: ps.state_dict()'s
// saved entries, worker::ScanTable), plain or point-in-time.
//
// A plain page reads the table as it is when the page is asked for: a scan
// of many pages, with pushes applied between them, is no snapshot of any
// instant. A point-in-time scan (Assign.openSnapshot on its first page)
// reads every page from the state of the moment it was opened:
//   - with a store, the shard writes a checkpoint (every dirty row and
//     admission counter goes to the store, in one consistent cut) and takes
//     a snapshot of the store (RocksDB: a snapshot, no copy); its pages are
//     read from that snapshot alone. While it is open the store's expiry
//     (compaction) keeps every record that was live at the snapshot's
//     expiry clock (SparseTables::HoldExpiry);
//   - without a store every entry is in the cache: they are copied, as
//     saved records in key order, into a buffer charged to the memory
//     budget (ResourceExhausted when it does not fit: nothing is opened).
// A snapshot is dropped after its last page (fewer entries than asked),
// after shard_.options.scan_snapshot_idle (Tick), when the layout epoch or the
// sparse tables it was taken of change, and with the shard. At most
// kMaxScanSnapshots are open at once, and one is opened per
// kScanOpenInterval at most (each writes a checkpoint); opening another is
// Unavailable (retry). Ids start at a random value, so a restarted shard never
// takes a page for a snapshot of its predecessor's (FailedPrecondition: start
// again).
#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>

#include "server/shard/shard_types.h"
#include "server/upload/upload_handler.h"

namespace asyncps::server {

namespace {

uint64_t RandomScanId() {
  std::random_device rd;
  const uint64_t id = (uint64_t{rd()} << 32) ^ rd();
  return id == 0 ? 1 : id;
}

}  // namespace

void UploadHandler::DropScanSnapshot(size_t i, const char* why) {
  VLOG(1) << "point-in-time scan " << scans_[i]->id << " dropped: " << why;
  scans_.erase(scans_.begin() + static_cast<std::ptrdiff_t>(i));
  UpdateExpiryHold();
}

void UploadHandler::UpdateExpiryHold() {
  if (!shard_.sparse) return;
  std::optional<int64_t> hold;
  for (const auto& s : scans_) {
    if (s->store != nullptr && s->tables == shard_.sparse.get())
      hold = hold ? std::min(*hold, s->clock) : s->clock;
  }
  shard_.sparse->HoldExpiry(hold);
}

void UploadHandler::ExpireScanSnapshots(TimePoint now) {
  for (size_t i = scans_.size(); i-- > 0;) {
    if (now - scans_[i]->used >= shard_.options.scan_snapshot_idle)
      DropScanSnapshot(i, "idle");
  }
}

Status UploadHandler::OpenScanSnapshot(uint32_t table, TimePoint now,
                                       ReplyHeader* reply) {
  ExpireScanSnapshots(now);
  if (scans_.size() >= kMaxScanSnapshots) {
    reply->retry_ms = 100;
    return core_->Reject(
        RejectReason::kOther,
        Status::Unavailable(
            std::to_string(scans_.size()) +
            " point-in-time scans are open on this shard (at most " +
            std::to_string(kMaxScanSnapshots) + "); retry"));
  }
  // Each open writes a checkpoint: a peer that opens scans over and over
  // gets one per kScanOpenInterval at most.
  if (last_scan_open_ && now - *last_scan_open_ < kScanOpenInterval) {
    reply->retry_ms = static_cast<uint32_t>(kScanOpenInterval.count());
    return core_->Reject(
        RejectReason::kOther,
        Status::Unavailable(
            "a point-in-time scan was opened on this shard less "
            "than " +
            std::to_string(kScanOpenInterval.count()) + " ms ago; retry"));
  }
  auto snap = std::make_unique<ScanSnapshot>();
  snap->table = table;
  snap->tables = shard_.sparse.get();
  snap->epoch = core_->layout_epoch();
  snap->clock = shard_.sparse->clock();
  snap->used = now;
  const sparse::SparseTable& t = shard_.sparse->table(table);
  const auto start = std::chrono::steady_clock::now();
  if (shard_.store != nullptr) {
    // Every dirty entry to the store in one cut, then the store as it is.
    Status s = core_->Checkpoint();
    if (!s.ok()) {
      return core_->Reject(
          RejectReason::kStore,
          Status::Unavailable("opening a point-in-time scan: " + s.ToString() +
                              "; retry"));
    }
    StatusOr<std::unique_ptr<StoreSnapshot>> st = shard_.store->NewSnapshot();
    if (!st.ok()) {
      return core_->Reject(
          RejectReason::kStore,
          st.status().WithContext("opening a point-in-time scan"));
    }
    snap->store = std::move(st).value();
  } else {
    // Every entry is cached: copy them all, as a page of the whole table.
    const size_t max = t.cache_rows() + t.cache_counters();
    const size_t record = t.saved_record_bytes();
    const uint64_t bytes = uint64_t{max} * (sizeof(uint64_t) + record);
    const std::string what = "a point-in-time scan of table '" +
                             shard_.sparse->specs()[table].name + "' (" +
                             std::to_string(max) + " entries)";
    StatusOr<MemoryBudget::Charge> charge = shard_.budget.Reserve(bytes, what);
    if (!charge.ok())
      return core_->Reject(RejectReason::kMemoryBudget, charge.status());
    StatusOr<MemoryBudget::Charge> scratch = shard_.budget.Reserve(
        sparse::SparseTable::scan_scratch_bytes(max), "the scratch of " + what);
    if (!scratch.ok())
      return core_->Reject(RejectReason::kMemoryBudget, scratch.status());
    auto held = std::make_shared<ChargedBuffer>();
    held->charge = std::move(charge).value();
    held->buffer = Buffer::Allocate(std::max<uint64_t>(bytes, 1));
    uint8_t* keys = held->buffer->data();
    size_t n = 0;
    Status s =
        shard_.sparse->Scan(table, 0, max, reinterpret_cast<uint64_t*>(keys),
                            keys + max * sizeof(uint64_t), &n);
    if (!s.ok()) {
      return core_->Reject(
          RejectReason::kStore,
          Status::Unavailable("opening a point-in-time scan: " + s.ToString() +
                              "; retry"));
    }
    snap->frozen = std::move(held);
    snap->frozen_max = max;
    snap->frozen_n = n;
  }
  if (next_scan_id_ == 0) next_scan_id_ = RandomScanId();
  snap->id = next_scan_id_++;
  if (next_scan_id_ == 0) next_scan_id_ = 1;
  LOG(INFO) << "point-in-time scan " << snap->id << " of table '"
            << shard_.sparse->specs()[table].name << "' opened at expiry clock "
            << snap->clock << " in "
            << std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::steady_clock::now() - start)
                   .count()
            << " ms (" << (snap->store ? "a store snapshot" : "a copy of ")
            << (snap->store ? "" : std::to_string(snap->frozen_n) + " entries")
            << ")";
  scans_.push_back(std::move(snap));
  last_scan_open_ = now;
  UpdateExpiryHold();
  reply->scan_snapshot = scans_.back()->id;
  return Status::OK();
}

Status UploadHandler::ScanRows(const std::string& peer,
                               const RequestHeader& req,
                               const std::vector<ByteView>& data, TimePoint now,
                               OutgoingReply* reply) {
  if (!shard_.sparse) {
    return core_->Reject(RejectReason::kUnknownChunk,
                         Status::NotFound("scan of rows: no sparse table is "
                                          "registered"));
  }
  if (req.rows.size() != 1 || !req.chunks.empty() || !data.empty()) {
    return core_->Reject(
        RejectReason::kSizeMismatch,
        Status::InvalidArgument(
            "a scan of rows names one table (one rows ref) and "
            "carries no chunks or frames; got " +
            std::to_string(req.rows.size()) + " rows refs, " +
            std::to_string(req.chunks.size()) + " chunks, " +
            std::to_string(data.size()) + " frames"));
  }
  const uint32_t table = req.rows[0].table;
  if (table >= shard_.sparse->num_tables()) {
    return core_->Reject(
        RejectReason::kUnknownChunk,
        Status::NotFound("scan of unknown table " + std::to_string(table) +
                         " (" + std::to_string(shard_.sparse->num_tables()) +
                         " registered)"));
  }
  if (req.assign_open_snapshot && req.assign_snapshot != 0) {
    return core_->Reject(
        RejectReason::kSizeMismatch,
        Status::InvalidArgument(
            "a scan page opens a point-in-time scan or names one, "
            "not both"));
  }
  // Every page of a scan is answered by the layout epoch the client routes
  // by (an older one: refused with this shard's document, the client
  // starts the scan again; a newer one: asked again shortly). So a scan
  // whose pages all carried one epoch sees each key on exactly one shard,
  // also while key ranges move: their rows change shards only at an adopt,
  // which changes the epoch (staged rows are served by nobody before it).
  RETURN_IF_ERROR(core_->CheckRoute(req, &reply->header));
  const sparse::SparseOptions& limits = shard_.sparse->options();
  const size_t max = req.assign_scan_rows;
  const size_t record = shard_.sparse->table(table).saved_record_bytes();
  const uint64_t bytes = max * (sizeof(uint64_t) + record);
  if (max == 0 || max > limits.max_keys_per_request ||
      bytes > limits.max_reply_bytes) {
    return core_->Reject(
        RejectReason::kOversize,
        Status::InvalidArgument(
            "scan of table '" + shard_.sparse->specs()[table].name +
            "': pages of " + std::to_string(max) +
            " entries; a page holds 1 to " +
            std::to_string(std::min<uint64_t>(
                limits.max_keys_per_request,
                limits.max_reply_bytes / (sizeof(uint64_t) + record))) +
            " entries of " + std::to_string(record) + " bytes"));
  }
  // The point-in-time scan this page reads from, opened by it or named.
  ScanSnapshot* snap = nullptr;
  size_t snap_at = 0;  // its index in scans_
  if (req.assign_open_snapshot) {
    RETURN_IF_ERROR(OpenScanSnapshot(table, now, &reply->header));
    snap_at = scans_.size() - 1;
    snap = scans_.back().get();
  } else if (req.assign_snapshot != 0) {
    ExpireScanSnapshots(now);
    for (size_t i = 0; i < scans_.size() && snap == nullptr; ++i) {
      ScanSnapshot& s = *scans_[i];
      if (s.id != req.assign_snapshot) continue;
      if (s.table != table || s.tables != shard_.sparse.get() ||
          s.epoch != core_->layout_epoch()) {
        DropScanSnapshot(i, "its table or layout changed");
        break;
      }
      snap = &s;
      snap_at = i;
    }
    if (snap == nullptr) {
      return core_->Reject(
          RejectReason::kOther,
          Status::FailedPrecondition(
              "point-in-time scan " + std::to_string(req.assign_snapshot) +
              " of table '" + shard_.sparse->specs()[table].name +
              "' is not open on this shard (its last page was "
              "read, it was idle, the layout changed or the shard "
              "restarted): start the scan again"));
    }
    snap->used = now;
    reply->header.scan_snapshot = snap->id;
  }
  // The reply (held until ZeroMQ has sent it) and, while the page is
  // gathered, the scan's scratch: both bounded by the page size, both
  // charged, or the page is refused (ResourceExhausted: ask for a smaller
  // one) before anything is allocated.
  StatusOr<MemoryBudget::Charge> charge =
      shard_.budget.Reserve(bytes, "a page of a scan of rows");
  if (!charge.ok())
    return core_->Reject(RejectReason::kMemoryBudget, charge.status());
  StatusOr<MemoryBudget::Charge> scratch =
      shard_.budget.Reserve(sparse::SparseTable::scan_scratch_bytes(max),
                            "the cached entries of a page of a scan of rows");
  if (!scratch.ok())
    return core_->Reject(RejectReason::kMemoryBudget, scratch.status());
  auto held = std::make_shared<ChargedBuffer>();
  held->charge = std::move(charge).value();
  held->buffer = Buffer::Allocate(bytes);
  uint8_t* keys = held->buffer->data();  // 64-byte aligned
  uint8_t* records = keys + max * sizeof(uint64_t);
  size_t n = 0;
  if (snap != nullptr && snap->frozen != nullptr) {
    // A copy of the table: the entries with key >= the cursor.
    const uint64_t* all =
        reinterpret_cast<const uint64_t*>(snap->frozen->buffer->data());
    const uint8_t* recs =
        snap->frozen->buffer->data() + snap->frozen_max * sizeof(uint64_t);
    const size_t at = static_cast<size_t>(
        std::lower_bound(all, all + snap->frozen_n, req.assign_cursor) - all);
    n = std::min(max, snap->frozen_n - at);
    std::memcpy(keys, all + at, n * sizeof(uint64_t));
    std::memcpy(records, recs + at * record, n * record);
  } else {
    Status s = shard_.sparse->Scan(
        table, req.assign_cursor, max, reinterpret_cast<uint64_t*>(keys),
        records, &n, snap != nullptr ? snap->store.get() : nullptr,
        snap != nullptr ? snap->clock : 0);
    if (!s.ok()) {
      return core_->Reject(
          RejectReason::kStore,
          Status::Unavailable("scan of rows: " + s.ToString() + "; retry"));
    }
  }
  if (snap != nullptr && n < max)
    DropScanSnapshot(snap_at, "its last page was read");
  RowsRef out;
  out.table = table;
  out.num_keys = n;
  out.keys_frame = 1;
  out.rows_frame = 2;
  reply->header.rows.push_back(out);
  reply->frames.push_back(ByteView{keys, n * sizeof(uint64_t), held});
  reply->frames.push_back(ByteView{records, n * record, held});
  core_->PinUnsent(peer, req.rank, bytes, reply);
  return Status::OK();
}

}  // namespace asyncps::server
