// UploadHandler: a shard's kAssign requests (common/wire.h AssignOp):
// uploads of values and optimizer state (fine-tuning from a worker's
// weights, ps.load_state_dict()), reads of the optimizer state and of row
// records, and scans of sparse tables, plain or point-in-time. The rules
// (the upload claim, what each operation checks and writes) are at the top
// of upload_handler.cc, the scans' at the top of upload_scan.cc.
//
// Owns: the upload claim, the id of the last committed upload, whether the
// values are final, and the open point-in-time scans (their store snapshots
// or copies, charged to the shard's memory budget).
//
// Needs from the shard (server/shard/shard_state.h): its options, layout,
// chunks, clocks (is the claimant live), memory budget, store, optimizer,
// sparse tables and version (a commit sets it), lent as a ShardState; and
// the core's Reject, Checkpoint, PinUnsent and CheckRoute, lent as
// ShardServices; and the shard's SparseRequests, which validates and
// decodes the rows an upload or read names. A Shard built with an assign
// factory (server/loop/shard_factory.h) builds one UploadHandler, hands it
// every kAssign request from Shard::Handle(), calls Tick() from its own
// Tick(), and destroys it before its sparse tables and store.
//
// Thread safety: none; driven by the shard's thread (the event loop).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/buffer.h"
#include "common/status.h"
#include "common/wire.h"
#include "server/shard/request_handler.h"
#include "server/shard/shard.h"
#include "server/shard/shard_state.h"
#include "server/store/store.h"

namespace asyncps::server {

struct ChargedBuffer;  // server/shard/shard_types.h

class SparseRequests;  // server/shard/sparse_requests.h

class UploadHandler : public RequestHandler {
 public:
  // `shard`, `core` and `sparse` must outlive the handler.
  UploadHandler(internal::ShardState shard, internal::ShardServices* core,
                SparseRequests* sparse);
  ~UploadHandler() override;
  UploadHandler(const UploadHandler&) = delete;
  UploadHandler& operator=(const UploadHandler&) = delete;

  // A RequestHandlerFactory for Shard::Create.
  static std::unique_ptr<RequestHandler> Make(const internal::ShardState& shard,
                                              internal::ShardServices* core,
                                              SparseRequests* sparse);

  // Handles one kAssign request from `peer`; fills `reply` (header and data
  // frames; nothing goes to `out`). A failure went through
  // ShardServices::Reject.
  Status Handle(const std::string& peer, const RequestHeader& req,
                const std::vector<ByteView>& data, TimePoint now,
                OutgoingReply* reply, std::vector<OutgoingReply>* out) override;

  // Timers: drops point-in-time scans idle past options.scan_snapshot_idle.
  void Tick(TimePoint now) override;

 private:
  using Chunk = internal::ShardChunk;
  // An open point-in-time scan of a sparse table (upload_scan.cc).
  struct ScanSnapshot {
    uint64_t id = 0;
    uint32_t table = 0;
    const void* tables = nullptr;  // the SparseTables it was taken of
    uint64_t epoch = 0;            // the layout epoch it was taken under
    int64_t clock = 0;             // the expiry clock when it was taken
    // With a store: its snapshot, taken right after a checkpoint.
    std::unique_ptr<StoreSnapshot> store;
    // Without: frozen_max keys, then as many saved records; frozen_n used.
    std::shared_ptr<ChargedBuffer> frozen;
    size_t frozen_max = 0;
    size_t frozen_n = 0;
    TimePoint used;  // when a page of it was last asked for
  };
  // The upload claim (rank -1: none).
  struct UploadClaim {
    int rank = -1;
    uint64_t incarnation = 0;
    uint64_t upload = 0;
    TimePoint last{};
  };
  static constexpr size_t kMaxScanSnapshots = 4;
  static constexpr std::chrono::milliseconds kScanOpenInterval{50};

  // AssignOp::kRead: the optimizer state of every owned chunk.
  Status ReadOptimizerState(const std::string& peer, const RequestHeader& req,
                            OutgoingReply* reply);
  // AssignOp::kState (the claimant's): sets the optimizer state and steps of
  // whole chunks; every chunk checked before any is written.
  Status WriteOptimizerState(const RequestHeader& req,
                             const std::vector<ByteView>& data);
  // AssignOp::kRead naming rows of sparse tables (keys only): their records
  // (weights, optimizer state, steps), one rows ref per table.
  Status ReadRowRecords(const std::string& peer, const RequestHeader& req,
                        const std::vector<ByteView>& data,
                        OutgoingReply* reply);
  // AssignOp::kRows / kSaved (the claimant's): rows set from records with
  // their saved optimizer state; every row checked before any is written.
  Status WriteRowRecords(const RequestHeader& req,
                         const std::vector<ByteView>& data);
  // AssignOp::kClear (the claimant's): drops every entry of the tables the
  // request names (all checked first).
  Status ClearTables(const RequestHeader& req,
                     const std::vector<ByteView>& data);
  // kValues, kRows and kSaved: sets the decoded rows (validated), with
  // their optimizer state when `with_state` (and their kinds and clocks:
  // kSaved); clears them.
  Status AssignPendingRows(const RequestHeader& req, bool with_state);
  // AssignOp::kCommit (the claimant's): makes the upload final.
  Status CommitUpload(const RequestHeader& req, const std::string& who);
  // kValues and kState: `ref` names a chunk of this shard not yet named in
  // this request, raw fp32, and a data frame in range not yet named;
  // *chunk gets it.
  Status CheckAssignRef(const ChunkRef& ref, size_t num_frames,
                        const std::string& what, Chunk** chunk);

  // upload_scan.cc. AssignOp::kScan: a page of a scan of one table's
  // entries (keys and saved records, common/protocol.capnp).
  Status ScanRows(const std::string& peer, const RequestHeader& req,
                  const std::vector<ByteView>& data, TimePoint now,
                  OutgoingReply* reply);
  // Opens a point-in-time scan of `table` (its id in reply->scan_snapshot,
  // the snapshot last in scans_); drops scans_[i]; drops the idle ones;
  // holds the sparse tables' expiry for the open ones.
  Status OpenScanSnapshot(uint32_t table, TimePoint now, ReplyHeader* reply);
  void DropScanSnapshot(size_t i, const char* why);
  void ExpireScanSnapshots(TimePoint now);
  void UpdateExpiryHold();

  internal::ShardState shard_;
  internal::ShardServices* core_;  // not owned
  SparseRequests* rows_;           // not owned
  UploadClaim upload_claim_;
  uint64_t committed_upload_ = 0;
  bool values_final_ = false;
  // Open point-in-time scans and the id of the next one (random start).
  std::vector<std::unique_ptr<ScanSnapshot>> scans_;
  uint64_t next_scan_id_ = 0;
  std::optional<TimePoint> last_scan_open_;
};

}  // namespace asyncps::server
