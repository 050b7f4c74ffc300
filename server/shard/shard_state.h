// ShardState and ShardServices: the narrow view of a Shard that the request
// handlers cut out of it (server/shard/sparse_requests.h,
// server/upload/upload_handler.h, server/migrate/migration.h) work on. Not
// part of the server API.
//
// The Shard core (server/shard/shard.h: dispatch, clocks, dense push and
// pull) owns every object named here; it lends a ShardState (references to
// its chunks, clocks, memory budget, store, layout and sparse tables) and a
// ShardServices (the few core operations a handler calls) to each handler
// it builds, and outlives them. A handler reads and changes the shard only
// through these two.
//
// Thread safety: none; everything here belongs to the shard's thread (the
// event loop), as the Shard itself.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/buffer.h"
#include "common/layout.h"
#include "common/sparse_table.h"
#include "common/status.h"
#include "common/wire.h"
#include "server/optimizer/optimizer.h"
#include "server/shard/memory_budget.h"
#include "server/shard/shard.h"
#include "server/shard/worker_clocks.h"
#include "server/sparse/sparse_tables.h"
#include "server/store/store.h"

namespace asyncps::server::internal {

struct ShardChunk;  // server/shard/shard_types.h

// One table's rows of a request, validated and decoded by SparseRequests
// (server/shard/sparse_requests.h), waiting to be applied or set.
struct PendingRows {
  uint32_t table = 0;
  size_t n = 0;
  size_t keys_at = 0;   // offset in DecodedRows::keys
  size_t rows_at = 0;   // offset in DecodedRows::values
  size_t state_at = 0;  // AssignOp::kRows / kSaved: offset in state
};

// The decoded rows of the request being handled (reused across requests so
// the push path allocates nothing once warm).
struct DecodedRows {
  std::vector<PendingRows> pending;
  std::vector<uint64_t> keys;
  std::vector<float> values;
  // AssignOp::kRows / kSaved: the decoded optimizer state of the rows (by
  // state_at) and their steps (by keys_at).
  std::vector<float> state;
  std::vector<uint64_t> steps;
  // AssignOp::kSaved: the saved entries' kinds and clocks (by keys_at).
  std::vector<uint32_t> kinds;
  std::vector<int64_t> clocks;
};

// Elastic shards: the layout epoch the shard serves under (persisted with
// its document, "0elastic") and the freeze toward the next one, which the
// core enforces on pushes and clocks. Migration (server/migrate/) sets both.
struct ElasticState {
  uint64_t epoch = 0;       // 0: the static layout
  std::string doc;          // the adopted document (common/elastic_doc.h)
  std::vector<int> owners;  // of the adopted document, by chunk id
  size_t num_servers = 0;
  // Sparse tables: the adopted key ranges (null: static, or no buckets in
  // the document).
  std::shared_ptr<const KeyRanges> ranges;
  bool frozen = false;
  uint64_t freeze_epoch = 0;
  int64_t freeze_clock = -1;  // -1: every push and clock waits
  std::chrono::steady_clock::time_point freeze_until{};
};

// A fresh shard's clocks and rounds, taken from an imported state record.
struct ImportedClocks {
  uint64_t version = 0;
  int64_t round = 0;
  std::vector<int64_t> clocks;  // per rank
  std::vector<int64_t> pushed;  // per rank: BSP round last pushed for
};

// What the core lends: references into the Shard's own members, valid for
// the Shard's lifetime.
struct ShardState {
  const ShardOptions& options;
  Store* const store;  // may be null
  const Optimizer& optimizer;
  MemoryBudget& budget;
  // Registered layout (empty until a registration) and this shard's chunks
  // of it in id order, with chunk id -> index in `chunks` (-1: not ours).
  const std::optional<Layout>& layout;
  const std::vector<std::unique_ptr<ShardChunk>>& chunks;
  const std::vector<int32_t>& local_index;
  const WorkerClocks& clocks;
  // Floats of optimizer (and delay compensation) state per weight.
  const size_t state_per_elem;
  // Updates applied (the lr schedule's count).
  uint64_t& shard_version;
  // BSP: the open round, and per rank the round its last counted push was
  // for (-1: none).
  const int64_t& bsp_round;
  const std::vector<int64_t>& bsp_pushed_round;
  ElasticState& elastic;
  // Sparse tables (null until a model with tables is registered; made and
  // dropped by SparseRequests).
  std::unique_ptr<sparse::SparseTables>& sparse;
  // Validation stamps shared with the push path: a chunk (ShardChunk::stamp)
  // or frame (frame_stamp[i]) equal to `stamp` was named in this request.
  uint64_t& stamp;
  std::vector<uint64_t>& frame_stamp;
  DecodedRows& rows;
};

// The core operations a handler calls.
class ShardServices {
 public:
  virtual ~ShardServices() = default;
  // Records why the request being handled fails; returns `s`.
  virtual Status Reject(RejectReason reason, Status s) = 0;
  // Writes all state to the store in one atomic batch (no-op without one).
  virtual Status Checkpoint() = 0;
  // Keeps every frame of `reply` until the transport releases it, counting
  // `fresh` of its bytes as unsent to `peer` and `rank`.
  virtual void PinUnsent(const std::string& peer, int rank, uint64_t fresh,
                         OutgoingReply* reply) = 0;
  // A request routed by another elastic layout epoch than the shard's is
  // refused (older) or asked again shortly (newer).
  virtual Status CheckRoute(const RequestHeader& req, ReplyHeader* reply) = 0;
  // The elastic layout epoch the shard serves under (0: static).
  virtual uint64_t layout_epoch() const = 0;
  // Serves the adopted elastic key ranges on the sparse tables (after a
  // registration).
  virtual void ApplyKeyRanges() = 0;
  // A durable write failed: pushes are refused until a checkpoint succeeds.
  virtual void EnterDegraded(const Status& cause) = 0;

  // --- For Migration (server/migrate/migration.h) ---
  // Reserves the layout tables of a layout from the budget (before it is
  // built); ReleaseLayoutCharge() gives them back when it is not installed.
  virtual Status ChargeLayoutTables(const std::vector<TensorSpec>& tensors,
                                    const LayoutOptions& options) = 0;
  virtual void ReleaseLayoutCharge() = 0;
  // An empty shard takes `layout` (charged above, no chunk of it held yet)
  // and the clocks and rounds of an imported state record.
  virtual void InstallImportedLayout(Layout layout,
                                     const ImportedClocks& state) = 0;
  // The persistence records (layout, shard state, then the chunks `ids`,
  // all held here) of an export, appended to *entries; valid until the
  // shard's state next changes.
  virtual void AddExportEntries(const std::vector<uint32_t>& ids,
                                std::vector<StoreEntry>* entries) = 0;
  // Adopt: takes the shard's chunks out (local_index unchanged), then
  // installs `chunks` (id order) with `local` (chunk id -> index) under
  // `layout` for `num_shards` shards; what stayed keeps the registration's
  // charge, less `dropped_bytes`. Pull replicas and delay-compensation reads
  // start over (local indexes changed).
  virtual std::vector<std::unique_ptr<ShardChunk>> TakeChunks() = 0;
  virtual void InstallChunks(std::vector<std::unique_ptr<ShardChunk>> chunks,
                             std::vector<int32_t> local, Layout layout,
                             int num_shards, uint64_t dropped_bytes) = 0;
  // A new layout epoch was adopted (ShardState::elastic): pushes held back
  // under the old one are forgotten, pulls parked under it are answered
  // with the new document (into *out).
  virtual void ReleaseForEpoch(std::vector<OutgoingReply>* out) = 0;
};

}  // namespace asyncps::server::internal
