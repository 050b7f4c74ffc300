// Shard: the state machine of one parameter-server shard, independent of
// sockets so it can be driven in-process by tests.
//
// A Shard holds, once a layout is registered, the chunks this shard owns
// (weights, optimizer state, version, BSP accumulator), the shard version
// (updates applied), the workers' clocks and liveness, the version each
// worker last read (staleness), a per-rank push dedup entry
// (incarnation, last applied push id) that makes resent pushes idempotent,
// parked pulls, counters and the staleness histogram.
//
// Sparse tables (server/sparse/sparse_tables.h), registered with the layout,
// travel in the same pushes, pulls and clocks as the chunks (their requests
// are handled in shard_sparse.cc): a push's rows are validated with its
// chunks before anything is applied, applied (BSP: summed) with them, and
// written with them in durable mode and in checkpoints.
//
// Input: a decoded RequestHeader plus its data frames (frames[i] is data
// frame i+1 of the message). Output: zero or more OutgoingReply: the reply
// to this request (unless it is a pull that had to wait: it is parked and
// answered by a later Handle() or Tick()), plus parked pulls released.
//
// Every request is validated completely before any state changes: a push
// whose last chunk is bad leaves every chunk untouched. Pull replies carry
// ref-counted snapshots of the weights (one copy per chunk version, shared
// by every pull of that version), never pointers into memory that the next
// push mutates.
//
// Consistency (ShardOptions::consistency):
//   kBsp: pushes for the current round r (clock == r) are summed per chunk;
//         once every live worker's clock is > r the average (sum / number of
//         contributors) is applied once and the round becomes r+1. A pull at
//         clock c waits until the minimum live clock is >= c.
//   kSsp: pushes are applied on arrival; a pull at clock c waits until the
//         minimum live clock is >= c - staleness.
//   kAsp: pushes applied on arrival; pulls never wait.
//
// Persistence: with a Store, the shard recovers from it in Create(); a
// Checkpoint() writes all state in one atomic batch; in durable mode every
// applied push (BSP: every accumulated push and round apply) is written
// before its reply is produced.
//
// Ownership: the Shard does not own the Store, which must outlive it.
// Thread safety: none; a Shard is driven by one thread (the event loop).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/buffer.h"
#include "common/layout.h"
#include "common/status.h"
#include "common/wire.h"
#include "server/optimizer.h"
#include "server/sparse/sparse_tables.h"
#include "server/stats.h"
#include "server/store.h"
#include "server/worker_clocks.h"

namespace asyncps::server {

enum class Consistency : uint8_t { kBsp = 0, kSsp = 1, kAsp = 2 };
const char* ConsistencyName(Consistency c);
StatusOr<Consistency> ParseConsistency(std::string_view name);

struct ShardOptions {
  // This shard's index, in [0, num_shards). Default: 0.
  int shard_id = 0;
  // Shards in the deployment; a registration must name the same number.
  // Default: 1.
  int num_shards = 1;
  // Workers (ranks 0..num_workers-1), >= 1. Default: 1.
  int num_workers = 1;
  // Default: kAsp.
  Consistency consistency = Consistency::kAsp;
  // SSP bound s, in clocks, >= 0. Default: 0.
  int64_t staleness = 0;
  // Scale the learning rate by 1 / (1 + staleness of the push). Default: off.
  bool staleness_lr = false;
  // Cosine learning-rate decay: the rate falls from lr to lr * lr_final over
  // this many shard updates (applied pushes, or BSP rounds), then stays.
  // 0 keeps the rate constant. Default: 0.
  uint64_t lr_decay_updates = 0;
  // Final fraction of lr for the decay, in [0, 1]. Default: 0.
  float lr_final = 0.0f;
  // Update rule. Default: SGD, lr 0.01.
  OptimizerOptions optimizer;
  // A worker silent this long is dropped from the clock minimum; 0 disables
  // eviction. Default: 30 s.
  std::chrono::milliseconds worker_timeout{30000};
  // Most pulls parked at once; more are answered ResourceExhausted.
  // Default: 4096.
  size_t max_parked_pulls = 4096;
  // Most requests one peer (routing id) may have waiting in the shard at
  // once (parked pulls); more are answered ResourceExhausted, so one client
  // cannot take the whole parked-pull budget. Requests not yet read stay in
  // ZeroMQ's per-peer queue, bounded by its high-water mark. Default: 1024.
  size_t max_inflight_per_client = 1024;
  // Benchmark mode: pushes are validated (sizes, codecs; not scanned for
  // NaN) and acknowledged, never applied.
  // Default: false.
  bool transport_only = false;
  // Write each applied push to the Store before acknowledging it.
  // Default: false.
  bool durable = false;
  // Sync mode of durable writes (checkpoints always sync). Default: kNoSync
  // (WAL only: survives kill -9, not power loss).
  SyncMode durable_sync = SyncMode::kNoSync;
  // Sparse tables: cache budget and request limits (shard_id and num_shards
  // are this struct's). Default: SparseOptions defaults.
  sparse::SparseOptions sparse;

  Status Validate() const;
};

// A reply addressed to the peer that sent the request.
struct OutgoingReply {
  std::string peer;
  ReplyHeader header;
  std::vector<ByteView> frames;  // data frames 1..n, in order
};

class Shard {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  // Builds a shard and, if `store` is non-null, recovers the state it holds
  // (layout, weights, optimizer state, versions, clocks, dedup table,
  // counters). FailedPrecondition if the store belongs to another shard id
  // or shard count; Corruption if a record is damaged. `now` starts the
  // liveness clocks.
  static StatusOr<std::unique_ptr<Shard>> Create(const ShardOptions& options,
                                                 Store* store, TimePoint now);
  ~Shard();
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  // Handles one decoded request from `peer` (an opaque routing id echoed in
  // the replies). Appends the replies that are ready to `out`.
  void Handle(const std::string& peer, const RequestHeader& req,
              const std::vector<ByteView>& data, TimePoint now,
              std::vector<OutgoingReply>* out);

  // Timers: evicts silent workers and answers parked pulls that became
  // answerable. Call at least every few hundred milliseconds.
  void Tick(TimePoint now, std::vector<OutgoingReply>* out);

  // Answers every parked pull with `status` (e.g. Cancelled on exit).
  void FailParked(const Status& status, std::vector<OutgoingReply>* out);

  // Counts a request rejected before it reached Handle() (e.g. a header
  // that could not be decoded).
  void CountRejected(RejectReason reason);

  // Writes all state to the store in one atomic batch (no-op without one).
  Status Checkpoint();

  // The stats document (JSON object) also returned by a kStats request.
  std::string StatsJson() const;

  // True once a kShutdown request has been answered.
  bool shutdown_requested() const { return shutdown_requested_; }

  // --- Introspection (tests, stats) ---
  const ShardOptions& options() const { return options_; }
  bool registered() const { return layout_.has_value(); }
  const Layout* layout() const { return layout_ ? &*layout_ : nullptr; }
  uint64_t shard_version() const { return shard_version_; }
  int64_t min_clock() const { return clocks_.MinLiveClock(); }
  int64_t bsp_round() const { return bsp_round_; }
  size_t num_parked() const { return parked_.size(); }
  const ShardCounters& counters() const { return counters_; }
  const StalenessHistogram& staleness() const { return staleness_; }
  const WorkerClocks& clocks() const { return clocks_; }
  // Weights / optimizer state / version of an owned chunk (nullptr / 0 if
  // not owned).
  const std::vector<float>* weights(uint32_t chunk) const;
  // The shard's sparse tables, or nullptr when none are registered.
  sparse::SparseTables* sparse_tables() { return sparse_.get(); }
  const std::vector<float>* optimizer_state(uint32_t chunk) const;
  uint64_t chunk_version(uint32_t chunk) const;

 private:
  struct Chunk;
  struct PendingGrad;
  struct ParkedPull;
  struct Dedup {
    bool valid = false;
    uint64_t incarnation = 0;
    uint64_t last_id = 0;
  };

  Shard(const ShardOptions& options, Store* store,
        std::unique_ptr<Optimizer> optimizer, TimePoint now);

  // shard.cc: dispatch, registration, pulls, clocks.
  Status HandleRegister(const RequestHeader& req, ReplyHeader* reply);
  // Fills the reply to a pull, or returns an error. Never parks.
  Status AnswerPull(const RequestHeader& req, const std::vector<ByteView>& data,
                    OutgoingReply* reply);
  bool PullReady(int64_t clock) const;
  void OnClocksChanged(std::vector<OutgoingReply>* out);
  void ReleaseParked(std::vector<OutgoingReply>* out);
  // True when a pull with this id from this peer is already parked.
  bool IsParked(const std::string& peer, uint64_t id) const;
  // Pulls parked for this peer.
  size_t NumParked(const std::string& peer) const;
  void FillCommon(const RequestHeader& req, ReplyHeader* reply) const;
  Status AllocateChunks();
  Status ValidatePullRequest(const RequestHeader& req);
  // Records why the request being handled fails; returns `s`.
  Status Reject(RejectReason reason, Status s);

  // shard_push.cc: validation and apply.
  Status HandlePush(const RequestHeader& req, const std::vector<ByteView>& data,
                    ReplyHeader* reply);
  Status ValidatePush(const RequestHeader& req,
                      const std::vector<ByteView>& data);
  void ApplyPending(int rank, float lr_scale);
  // The schedule's multiplier of lr at the current shard version.
  float ScheduleScale() const;
  // Applies the averaged round and advances bsp_round_ by one.
  Status ApplyBspRound();

  // shard_sparse.cc: the rows of sparse tables in registration, pushes,
  // pulls, BSP rounds and persistence.
  Status RegisterTables(const std::vector<TableSpec>& tables, bool created);
  Status ValidateSparsePush(const RequestHeader& req,
                            const std::vector<ByteView>& data);
  Status ApplySparsePush(int64_t clock, float lr_scale);
  Status ValidateSparsePull(const RequestHeader& req,
                            const std::vector<ByteView>& data);
  Status AnswerSparsePull(const RequestHeader& req,
                          const std::vector<ByteView>& data,
                          OutgoingReply* reply);
  // Writes entries_ plus the sparse tables' part of a cut.
  Status WriteCut(bool checkpoint, SyncMode sync);

  // shard_persist.cc: checkpoint, recovery, durable writes.
  Status Recover();
  Status WriteDurable(bool sync);  // touched_ chunks + state
  void AddLayoutEntry(std::vector<StoreEntry>* entries) const;
  void AddStateEntry(std::vector<StoreEntry>* entries) const;
  void AddChunkEntry(const Chunk& c, std::vector<StoreEntry>* entries) const;
  Status RestoreLayout(std::string_view value);
  Status RestoreState(std::string_view value);
  Status RestoreChunk(uint32_t id, std::string_view value);

  ShardOptions options_;
  Store* store_;  // not owned; may be null
  std::unique_ptr<Optimizer> optimizer_;
  std::optional<Layout> layout_;
  std::vector<std::unique_ptr<Chunk>> chunks_;  // this shard's chunks, id order
  std::vector<int32_t>
      local_index_;  // chunk id -> index in chunks_, -1 if not ours
  uint64_t shard_version_ = 0;
  int64_t bsp_round_ = 0;
  WorkerClocks clocks_;
  std::vector<uint64_t>
      last_read_;             // per rank: shard version of its last pull reply
  std::vector<Dedup> dedup_;  // per rank
  // Sparse pull codecs (top-k, random-k) send each worker the change since
  // its last pull: per rank, what that worker holds of every local chunk.
  // Not persisted: after a restart the next pull resyncs with whole weights.
  struct PullReplica {
    uint64_t incarnation = 0;
    uint64_t seq = 0;  // pull_seq of the last reply sent; 0: none
    std::vector<std::vector<float>> chunks;  // by local chunk index
  };
  std::vector<PullReplica> replicas_;  // per rank
  uint64_t next_pull_seq_;             // starts random: unique across restarts
  std::vector<float> delta_scratch_;
  std::vector<std::unique_ptr<ParkedPull>> parked_;
  ShardCounters counters_;
  StalenessHistogram staleness_;
  bool shutdown_requested_ = false;
  RejectReason reject_reason_ =
      RejectReason::kOther;  // of the request being handled

  // Reused across pushes so the apply path allocates nothing once warm.
  std::vector<PendingGrad> pending_;
  std::vector<uint64_t> frame_stamp_;
  uint64_t stamp_ = 0;
  std::vector<Chunk*> touched_;
  std::vector<uint32_t> sparse_idx_;
  std::vector<float> sparse_val_;
  std::vector<StoreEntry> entries_;

  // Sparse tables (nullptr until a model with tables is registered).
  std::unique_ptr<sparse::SparseTables> sparse_;
  // A push's rows, validated and decoded, waiting for phase 2.
  struct PendingRows {
    uint32_t table = 0;
    size_t n = 0;
    size_t keys_at = 0;  // offset in sparse_keys_
    size_t rows_at = 0;  // offset in sparse_rows_
  };
  std::vector<PendingRows> pending_rows_;
  std::vector<uint64_t> sparse_keys_;
  std::vector<float> sparse_rows_;
  std::vector<uint64_t> table_stamp_;  // per table: seen in request #stamp_
};

}  // namespace asyncps::server
