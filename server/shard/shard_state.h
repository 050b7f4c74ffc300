// ShardState and ShardServices: the narrow view of a Shard that the request
// handlers cut out of it (server/upload/upload_handler.h) work on. Not part
// of the server API.
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

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/buffer.h"
#include "common/layout.h"
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
  // Updates applied (the lr schedule's count).
  uint64_t& shard_version;
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
};

}  // namespace asyncps::server::internal
