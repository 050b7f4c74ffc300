// Shard: the state machine of one parameter-server shard, independent of
// sockets so it can be driven in-process by tests.
//
// A Shard holds, once a layout is registered, the chunks this shard owns
// (weights, optimizer state, version, BSP accumulator), the shard version
// (updates applied), the workers' clocks and liveness, the version each
// worker last read (staleness), the push de-duplication table that applies
// every push exactly once (server/internal/push_dedup.h), parked pulls,
// counters and the staleness histogram.
//
// Hostile but well-formed requests cannot make it allocate without limit or
// spin: every allocation a peer's numbers size (registered chunks, pull
// snapshots and codec payloads not yet sent, pull replicas, parked pulls,
// the layout tables) is drawn from a MemoryBudget first (ResourceExhausted
// with the numbers, nothing allocated); clocks are checked (never negative,
// at most max_clock_jump ahead per request); a pull names each chunk at most
// once; replies not yet taken by a slow reader are capped per connection and
// per rank; parked pulls are capped per connection and per rank and expire.
// Rank -1 (tools, observers such as a dedicated evaluator) may pull
// (read-only, never waiting, never moving a clock) and ask for stats, but
// not register, push or clock.
//
// Sparse tables (server/sparse/sparse_tables.h), registered with the layout,
// travel in the same pushes, pulls and clocks as the chunks (their requests
// are handled by SparseRequests, server/shard/sparse_requests.h): a push's rows
// are validated with its chunks before anything is applied, applied (BSP:
// summed) with them, and written with them in durable mode and in checkpoints.
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
// Consistency (ShardOptions::consistency). A worker's clock is what its
// Clock requests (and pushes) said, never its pulls: a worker sends
// Clock(c+1) after its push of step c on the same connection, so a clock of c
// means its pushes of steps < c are here.
//   kBsp: the pushes of round r (the first push of each rank with clock >= r;
//         a later one of the same rank, or one for an earlier clock from a
//         worker that fell behind, is acknowledged and not counted) are
//         summed per chunk; once every live worker's clock is > r the
//         average (sum / number of contributors) is applied once and the
//         round becomes the minimum live clock. A pull at clock c waits until
//         the round and the minimum live clock are >= c. A worker that comes
//         back behind the round (evicted, late, restarted) reads pull replies
//         whose min_clock is ahead of its own clock and skips ahead to it.
//   kSsp: pushes are applied on arrival; a pull at clock c waits until the
//         minimum live clock is >= c - staleness. So the reply holds every
//         update of steps < c - staleness from every live worker (and, when
//         the worker does not prefetch, all of its own updates of steps < c).
//   kAsp: pushes applied on arrival; pulls never wait.
//
// Persistence: with a Store, the shard recovers from it in Create(); a
// Checkpoint() writes all state in one atomic batch; in durable mode every
// applied push (BSP: every accumulated push and round apply) is written,
// together with the de-duplication table, before its reply is produced. When
// such a write fails the push stays applied in memory but is not
// acknowledged, and the shard refuses pushes (Unavailable: retry) until a
// checkpoint of the whole state succeeds (Tick retries it); only then is the
// retried push acknowledged, as a duplicate. So an acknowledged push is in
// the store.
//
// Ownership: the Shard does not own the Store, which must outlive it.
// Thread safety: none; a Shard is driven by one thread (the event loop).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/buffer.h"
#include "common/layout.h"
#include "common/status.h"
#include "common/wire.h"
#include "server/optimizer/lr_schedule.h"
#include "server/optimizer/optimizer.h"
#include "server/optimizer/staleness_rules.h"
#include "server/shard/memory_budget.h"
#include "server/shard/request_handler.h"
#include "server/shard/stats.h"
#include "server/shard/worker_clocks.h"
#include "server/sparse/sparse_tables.h"
#include "server/store/store.h"

namespace asyncps::compression {
class Codec;  // compression/codec.h
}  // namespace asyncps::compression

namespace asyncps::server {
namespace internal {
class PushDedup;
class TaskPool;
struct ShardChunk;
struct PendingRows;
struct DecodedRows;
struct ShardState;
struct ElasticState;
struct ImportedClocks;
}  // namespace internal
class SparseRequests;  // server/shard/sparse_requests.h

// Largest clock a worker may report (clocks are in [0, kMaxClock], so no
// arithmetic on them overflows).
inline constexpr int64_t kMaxClock = int64_t{1} << 62;

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
  // Hybrid consistency (Persia) under kBsp: sparse-table rows are applied
  // when their push arrives, as under kAsp, instead of summed into the
  // round, while dense chunks keep BSP; a push of rows only then does not
  // count as the worker's push of the round (its chunks may come in another
  // push). A push with chunks skipped by BSP (late, or the rank's second of
  // the round) still drops its rows. No effect under kSsp / kAsp.
  // Default: false.
  bool sparse_async = false;
  // Learning rate by the staleness of each push (ASP/SSP; BSP pushes have
  // staleness 0): lr / (1 + s) or lr / s (server/optimizer/staleness_rules.h).
  // Default: kNone.
  StalenessLr staleness_lr = StalenessLr::kNone;
  // Delay compensation of stale gradients (DC-ASGD; ASP/SSP only), see
  // server/optimizer/staleness_rules.h for the rule and its memory. Default:
  // off.
  DelayCompensationOptions delay_compensation;
  // Linear learning-rate warm-up over this many shard updates (applied
  // pushes, or BSP rounds): the rate rises from lr * lr_warmup_start to lr
  // (server/optimizer/lr_schedule.h). 0: none. Default: 0.
  uint64_t lr_warmup_updates = 0;
  // Fraction of lr at the first update of the warm-up, in [0, 1].
  // Default: 0.
  float lr_warmup_start = 0.0f;
  // Cosine learning-rate decay: the rate falls from lr (after the warm-up)
  // to lr * lr_final, reaching it at shard update lr_decay_updates, then
  // stays. 0 keeps the rate constant. Default: 0.
  uint64_t lr_decay_updates = 0;
  // Final fraction of lr for the decay, in [0, 1]. Default: 0.
  float lr_final = 0.0f;
  // Update rule. Default: SGD, lr 0.01.
  OptimizerOptions optimizer;
  // Largest learning rate a worker may set with a push or clock (their lr
  // field, e.g. from torch.optim.lr_scheduler); the latest one set replaces
  // optimizer.lr and the schedule above for every later update, dense
  // chunks and (scaled by lr / optimizer.lr) sparse rows alike. A larger
  // one, a negative or a non-finite one is refused (InvalidArgument, the
  // request changes nothing), never clamped; 0 refuses every one.
  // Default: 1.0.
  float max_lr = 1.0f;
  // A worker silent this long is dropped from the clock minimum; 0 disables
  // eviction. Default: 30 s.
  std::chrono::milliseconds worker_timeout{30000};
  // Most pulls parked at once; more are answered ResourceExhausted.
  // Default: 4096.
  size_t max_parked_pulls = 4096;
  // Most requests one peer (routing id) may have waiting in the shard at
  // once (parked pulls), and one worker rank over all its connections; more
  // are answered ResourceExhausted, so one client cannot take the whole
  // parked-pull budget. Requests not yet read stay in ZeroMQ's per-peer
  // queue, bounded by its high-water mark. Default: 1024.
  size_t max_inflight_per_client = 1024;
  // A pull parked this long is answered Unavailable (the client resends it),
  // so no request waits forever. Default: 30 s.
  std::chrono::milliseconds max_park_time{30000};
  // A point-in-time scan of a sparse table (upload_scan.cc) with no page
  // asked for this long is dropped (its store snapshot or copy released;
  // a later page of it is FailedPrecondition: start again). Default: 60 s.
  std::chrono::milliseconds scan_snapshot_idle{60000};
  // Memory this shard may hold for what peers ask of it, in bytes (see the
  // class comment); over it, a registration or pull gets ResourceExhausted
  // with the numbers. ps_server's default is derived from the machine
  // (MemoryBudget::DefaultCapacity()). Default: 4 GiB.
  uint64_t memory_budget_bytes = uint64_t{4} << 30;
  // Bytes of pull replies to one connection, or to one worker rank over all
  // its connections, that ZeroMQ has queued but not yet sent (a client that
  // pulls and does not read); while above it that client's pulls get
  // ResourceExhausted. One reply is always allowed. Default: 256 MiB.
  uint64_t max_unsent_bytes_per_client = uint64_t{256} << 20;
  // Largest pull reply (data frames), bytes; 0: twice this shard's fp32
  // bytes plus 1 MiB (every chunk once, through any pull codec).
  // Default: 0.
  uint64_t max_reply_bytes = 0;
  // Largest data frame the transport accepts, bytes: a registration whose
  // chunks would not fit one frame is refused. Default: 256 MiB.
  uint64_t max_frame_bytes = uint64_t{256} << 20;
  // Largest forward move of a worker's clock in one request (push, pull or
  // clock), in clocks; clocks are never negative. Default: 1,000,000.
  int64_t max_clock_jump = 1000000;
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
  // Threads that apply a large push (and a BSP round), the event loop's own
  // thread included, in [1, 256]. The update is element-wise, so the weights
  // are bitwise the same for any number. ps_server's default is the number
  // of cores it may run on, at most 8. Default: 1.
  int apply_threads = 1;
  // Shared memory of colocated clients (common/shm_segment.h): most
  // segments mapped at once (the oldest attach is dropped past it; 0 refuses
  // every attach) and the largest accepted. A worker rank has at most one
  // (a new attach replaces it); an evicted worker's is unmapped. Default:
  // 256 and 64 GiB.
  size_t max_shm_segments = 256;
  uint64_t max_shm_bytes = uint64_t{64} << 30;
  // A push (or BSP round) with fewer gradient elements than this, in all, is
  // applied on the event loop's thread alone: waking the others costs more
  // than they save. Default: 1 Mi elements (4 MiB of fp32 gradient).
  uint64_t parallel_apply_min_elems = uint64_t{1} << 20;

  // The learning-rate schedule these options describe.
  LrScheduleOptions lr_schedule() const;
  Status Validate() const;
};

// A BSP round's sums as a shard averages and applies them: per chunk the
// sum of the round's gradients (not yet divided by the contributors),
// captured by a replicating primary (Shard::TakeRoundSums). Frame 0 is the
// chunk ids (u32 each), frames 1.. the sums (f32, one chunk each); `round`
// is the shard's round after the capture.
struct RoundSums {
  std::vector<ByteView> frames;
  int64_t round = 0;
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
  // liveness clocks. `handlers` serve kAssign and kMigrate (built before
  // recovery; server/loop/shard_factory.h gives a shard all of them); a
  // kind without one is answered Unimplemented.
  static StatusOr<std::unique_ptr<Shard>> Create(
      const ShardOptions& options, Store* store, TimePoint now,
      const ShardHandlers& handlers = {});
  ~Shard();
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  // Handles one decoded request from `peer` (an opaque routing id echoed in
  // the replies). Appends the replies that are ready to `out`.
  void Handle(const std::string& peer, const RequestHeader& req,
              const std::vector<ByteView>& data, TimePoint now,
              std::vector<OutgoingReply>* out);

  // Timers: evicts silent workers (freeing their pull replicas), answers
  // parked pulls that became answerable or waited too long, and retries the
  // checkpoint that ends a degraded state. Call at least every few hundred
  // milliseconds.
  void Tick(TimePoint now, std::vector<OutgoingReply>* out);

  // Answers every parked pull with `status` (e.g. Cancelled on exit).
  void FailParked(const Status& status, std::vector<OutgoingReply>* out);

  // Counts a request rejected before it reached Handle() (e.g. a header
  // that could not be decoded).
  void CountRejected(RejectReason reason);

  // Writes all state to the store in one atomic batch (no-op without one).
  // Success ends the degraded state (see degraded()).
  Status Checkpoint();

  // The stats document (JSON object) also returned by a kStats request.
  std::string StatsJson() const;

  // True once a kShutdown request has been answered.
  bool shutdown_requested() const { return shutdown_requested_; }
  // True while pushes are refused because a durable write (or a write-back
  // of evicted rows) failed and no checkpoint has succeeded since.
  bool degraded() const { return degraded_; }

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
  const MemoryBudget& budget() const { return *budget_; }
  // Bytes of replies handed out by Handle()/Tick() and not yet released
  // (sent by ZeroMQ or dropped), all peers.
  uint64_t unsent_reply_bytes() const;
  // Weights / optimizer state / version of an owned chunk (nullptr / 0 if
  // not owned).
  const std::vector<float>* weights(uint32_t chunk) const;
  // The elastic layout epoch this shard serves under (0: static).
  uint64_t layout_epoch() const;
  bool frozen() const;
  // The epoch a freeze is toward (0: not frozen), and whether neither adopt
  // nor abort came before its deadline (the server then asks etcd, where
  // the coordinator commits a change, whether it happened).
  uint64_t freeze_epoch() const;
  bool FreezeOverdue(TimePoint now) const;
  // The shard's sparse tables, or nullptr when none are registered.
  sparse::SparseTables* sparse_tables() { return sparse_.get(); }
  const sparse::SparseTables* sparse_tables() const { return sparse_.get(); }
  // Figures of the shard's store (all 0 without one). Call on the shard's
  // thread (the store's).
  StoreStats store_stats() const {
    return store_ != nullptr ? store_->GetStoreStats() : StoreStats{};
  }
  SpaceStats space_stats(SpaceId space) const {
    return store_ != nullptr ? store_->GetSpaceStats(space) : SpaceStats{};
  }
  const std::vector<float>* optimizer_state(uint32_t chunk) const;
  uint64_t chunk_version(uint32_t chunk) const;

  // A push refused before it reached the shard (a replica that is not the
  // primary, or cannot take writes now): like a push this shard asked to be
  // sent again, this rank's later clocks are refused until it comes back
  // (or a later push of the rank is applied, here or replayed from the
  // primary). Otherwise a clock accepted right after the refusal (the
  // process was promoted in between) would close a BSP round without it.
  void NoteRefusedPush(const RequestHeader& req);

  // --- Replication after aggregation (shard_round_sums.cc) ---
  // Under BSP a replicating primary hands its backups the round's sums
  // instead of every push (server/replication/replicator.h). True when this
  // shard's rounds can be handed on that way: BSP, applying (not
  // transport_only), no sparse tables (rows are handed on per push).
  bool AggregatesRounds() const;
  // Primary: while on, every BSP round this shard closes keeps a copy of
  // its sums (taken before they are averaged) for TakeRoundSums().
  // Default: off.
  void set_capture_rounds(bool on) { capture_rounds_ = on; }
  // Primary: the sums of the round closed since the last call (true), or
  // false when none closed. With `open` the sums of the round open now are
  // taken instead when none closed (a record handed on mid-round).
  bool TakeRoundSums(bool open, RoundSums* sums);
  // Backup: sets each listed chunk's round sum to the primary's (before the
  // record's headers are replayed). InvalidArgument when a chunk is not
  // this shard's or a size differs; nothing is set then.
  Status InstallRoundSums(const std::vector<ByteView>& frames);
  // Backup: while on, pushes are replayed from their headers alone (no
  // data frames): de-duplication, clocks and round bookkeeping, no sums.
  void set_replay_headers(bool on) { replay_headers_ = on; }
  // Backup: closes the open round, moving it to `round`, when the
  // primary's closed without a clock the record replays (an eviction).
  Status CatchUpRound(int64_t round);

  // --- Workers' liveness in a replica group (shard_liveness.cc) ---
  // Backup: while on, the shard evicts no worker on its own timer and takes
  // an evicted one back only on a request replayed from the primary (a
  // push, clock, registration or upload); the primary's other evictions
  // and rejoins arrive as SetWorkerStates(). Default: off.
  void set_follower(bool on) { clocks_.set_follow(on); }
  bool follower() const { return clocks_.follow(); }
  // Primary: records which workers' liveness changes, for
  // TakeWorkerChanges(). Default: off.
  void set_log_worker_changes(bool on) { clocks_.set_log_changes(on); }
  // Primary: the state (liveness, clock) of every worker whose liveness
  // changed since the last call; false when none did.
  bool TakeWorkerChanges(std::vector<WorkerLiveness>* states);
  // The state of every worker (a spare joining the group gets it after the
  // snapshot, whose restore counts every worker live).
  std::vector<WorkerLiveness> WorkerStates() const;
  // Backup: sets each worker's liveness and clock to the primary's, with
  // what an eviction or rejoin here does (an evicted worker's replica, DC
  // reads and shared memory freed; rounds closed, sparse rows expired by
  // the new clock minimum). InvalidArgument (nothing set) for a rank out of
  // range, a rank listed twice or a negative clock.
  Status SetWorkerStates(const std::vector<WorkerLiveness>& states,
                         TimePoint now, std::vector<OutgoingReply>* out);

 private:
  // After workers were evicted: frees what only they used.
  void FreeEvicted();

  using Chunk = internal::ShardChunk;
  using PendingRows = internal::PendingRows;
  // The ShardServices the core lends its handlers (shard.cc).
  class Services;
  struct PendingGrad;
  struct ParkedPull;
  struct PullReplica;
  struct WorkPiece;
  struct DcReads;
  struct ShmAttachment;
  // Reply bytes handed to the transport and not yet released by it.
  using UnsentBytes = std::atomic<uint64_t>;

  Shard(const ShardOptions& options, Store* store,
        std::unique_ptr<Optimizer> optimizer, TimePoint now,
        const ShardHandlers& handlers);
  // References to the state the handlers work on (shard.cc).
  internal::ShardState LendState();

  // shard.cc: dispatch, clocks, timers.
  // Checks what every request must satisfy before its kind is handled:
  // protocol version, rank (and what rank -1 may do), data frames, clock.
  Status Admit(const RequestHeader& req, bool has_data);
  bool PullReady(int64_t clock) const;
  // Checks a worker's clock in a push, pull or clock request.
  Status CheckClock(int rank, int64_t clock);
  void OnClocksChanged(std::vector<OutgoingReply>* out);
  void FillCommon(const RequestHeader& req, ReplyHeader* reply) const;
  Status HandleClock(const RequestHeader& req);
  // Keeps held_push_ after a push of `req.rank` was answered `st`.
  void NoteHeldPush(const RequestHeader& req, const Status& st);
  Status CheckHeldPush(const RequestHeader& req, ReplyHeader* reply);
  // Records why the request being handled fails; returns `s`.
  Status Reject(RejectReason reason, Status s);
  // A durable write failed: refuse pushes until a checkpoint succeeds.
  void EnterDegraded(const Status& cause);
  void TryRepair(TimePoint now);

  // shard_register.cc: registration and chunk allocation.
  Status HandleRegister(const RequestHeader& req, ReplyHeader* reply);
  // Reserves the layout tables of `req` from the budget, computed before
  // any of them is built.
  Status ChargeLayoutTables(const std::vector<TensorSpec>& tensors,
                            const LayoutOptions& options);
  // Reserves and allocates this shard's chunks of layout_.
  Status AllocateChunks();

  // shard_pull.cc: pulls, replicas, parked pulls, unsent replies.
  Status HandlePull(const std::string& peer, const RequestHeader& req,
                    const std::vector<ByteView>& data, TimePoint now,
                    OutgoingReply* r, bool* parked);
  Status ValidatePullRequest(const RequestHeader& req);
  // Fills the reply to a pull, or returns an error. Never parks.
  Status AnswerPull(const std::string& peer, const RequestHeader& req,
                    const std::vector<ByteView>& data, OutgoingReply* reply);
  // AnswerPull's steps: the cap on unsent reply bytes of `peer` and `rank`;
  // the pull codec (*codec, null for raw fp32) and the bound on the reply
  // of chunks `ids`; a sparse codec's replica of `req.rank` (*resync: send
  // whole weights); one chunk's ref and frame (a codec payload, a delta
  // against the replica, or the shared snapshot) appended to `reply`.
  Status CheckUnsent(const std::string& peer, int rank);
  Status MakePullCodec(const RequestHeader& req,
                       const std::vector<uint32_t>& ids,
                       std::unique_ptr<compression::Codec>* codec);
  Status TakePullReplica(const RequestHeader& req, OutgoingReply* reply,
                         PullReplica** replica, bool* resync);
  Status AddPulledChunk(uint32_t id, uint32_t frame, compression::Codec* codec,
                        PullReplica* replica, bool resync, OutgoingReply* reply,
                        uint64_t* fresh);
  // Encodes `x` (chunk c's weights or delta) with `codec` into a payload
  // drawn from the budget: *view, ref->codec; its bytes added to *fresh.
  Status EncodePulled(const Chunk& c, const float* x, compression::Codec* codec,
                      ChunkRef* ref, ByteView* view, uint64_t* fresh);
  void ReleaseParked(std::vector<OutgoingReply>* out);
  void ExpireParked(TimePoint now, std::vector<OutgoingReply>* out);
  // True when a pull with this id from this peer is already parked.
  bool IsParked(const std::string& peer, uint64_t id) const;
  size_t NumParked(const std::string& peer) const;
  size_t NumParkedOfRank(int rank) const;
  // Frees the pull replica of `rank` (eviction, new incarnation, codec).
  void FreeReplica(int rank);
  // Makes c.snapshot hold the chunk's current weights (a new buffer, drawn
  // from the budget, when the old one is still referenced by a reply in
  // flight or a delay-compensation read); adds what it allocated to *fresh.
  Status EnsureSnapshot(Chunk& c, uint64_t* fresh);
  // Delay compensation: remembers the snapshots of `ids` as what `rank`
  // read at `clock` (after a successful pull reply).
  Status RecordDcRead(const RequestHeader& req,
                      const std::vector<uint32_t>& ids);
  void FreeDcReads(int rank);
  // Keeps every frame of `reply` until ZeroMQ releases the last of them;
  // until then its bytes count as unsent (total), and `fresh` of them (the
  // buffers made for this reply: new snapshots, codec payloads) as unsent
  // to `peer` and `rank`.
  void PinUnsent(const std::string& peer, int rank, uint64_t fresh,
                 OutgoingReply* reply);
  UnsentBytes& UnsentOf(const std::string& peer);
  void PruneUnsent();

  // shard_push.cc: worker-set lr. Checks a push's or clock's lr (0 = not
  // set) against max_lr.
  Status CheckWorkerLr(const RequestHeader& req);
  // Makes a checked lr (if set) the rate of later updates.
  void TakeWorkerLr(const RequestHeader& req);

  // shard_shm.cc: clients' shared memory (common/shm_segment.h).
  Status HandleAttachShm(const RequestHeader& req);
  // Unmaps the segments of a worker rank (evicted: if it comes back, its
  // client attaches again when a pull is refused).
  void DropShm(int rank);
  // The segment attached by this request's client, or nullptr.
  ShmAttachment* FindShm(const RequestHeader& req);
  // Checks a pull's shm offsets (one per chunk id, ranges in the segment,
  // raw fp32 only) before it is answered or parked.
  Status ValidateShmPull(const RequestHeader& req);
  // Writes the pulled chunks `ids` into the client's segment and fills the
  // reply's chunk refs (frame 0). REQUIRES: ValidateShmPull(req) passed in
  // this same call. Cancelled when the client no longer
  // awaits this pull (answered already, or abandoned): nothing written.
  Status AnswerShmPull(const RequestHeader& req,
                       const std::vector<uint32_t>& ids, OutgoingReply* reply);

  // shard_elastic.cc: elastic shards (server/elastic/). The kMigrate
  // requests that move chunks are Migration's (server/migrate/); the core
  // routes by the layout epoch adopted and holds pushes back while frozen.
  // A push or pull routed by another epoch than this shard's: refused with
  // this shard's layout document (older) or asked again shortly (newer).
  Status CheckRoute(const RequestHeader& req, ReplyHeader* reply);
  // A push (or clock) the freeze holds back: Unavailable, retry shortly.
  Status CheckFrozen(const RequestHeader& req, ReplyHeader* reply);
  // Applies the adopted elastic owners to layout_ (recovery).
  Status ApplyElasticOwners();
  // Serves the adopted key ranges (after adopt, recovery, registration).
  void ApplyKeyRanges();
  // What ShardServices lends Migration (server/shard/shard_state.h).
  void InstallImportedLayout(Layout layout,
                             const internal::ImportedClocks& state);
  void InstallChunks(std::vector<std::unique_ptr<Chunk>> chunks,
                     std::vector<int32_t> local, Layout layout, int num_shards,
                     uint64_t dropped_bytes);
  void ReleaseForEpoch(std::vector<OutgoingReply>* out);

  // shard_push.cc: validation and apply.
  Status HandlePush(const RequestHeader& req, const std::vector<ByteView>& data,
                    ReplyHeader* reply);
  // Checks a push whole: ValidatePushFrames, then every dense gradient for
  // NaN/Inf. Fills pending_.
  Status ValidatePush(const RequestHeader& req,
                      const std::vector<ByteView>& data);
  // Frames, chunk refs, sizes, codec payloads (decoded), then the sparse
  // rows (ValidateSparsePush); fills pending_ with the chunks that passed,
  // up to the first that failed.
  Status ValidatePushFrames(const RequestHeader& req,
                            const std::vector<ByteView>& data);
  // BSP: true when `rank` already pushed for the round (pending_ holds the
  // push being handled).
  bool PushedThisRound(int rank) const;
  // Backup, replay_headers_: fills pending_ from the chunk refs of a push
  // replayed without its data (shard_round_sums.cc).
  Status ReplayPushRefs(const RequestHeader& req);
  // Copies the sums of chunks with contributors into a RoundSums.
  RoundSums CaptureSums() const;
  // Marks the push done in the de-duplication table (memory only).
  void RecordPush(const RequestHeader& req);
  // RecordPush and, in durable mode, writes it.
  Status FinishPush(const RequestHeader& req);
  void ApplyPending(int rank, float lr_scale);
  // Parallel work over pieces of chunks: BeginWork() empties work_,
  // AddWork() cuts a chunk (and its gradient g) into pieces, RunWork() calls
  // fn on every piece, on the apply threads when there is enough of it.
  void BeginWork();
  void AddWork(Chunk* c, const float* g);
  void RunWork(const std::function<void(WorkPiece&)>& fn);
  // Delay compensation (DC-ASGD) of every pending gradient of `req` against
  // what its worker read at req.clock (shard_staleness.cc).
  void CompensatePending(const RequestHeader& req);
  // The schedule's multiplier of lr at the current shard version.
  float ScheduleScale() const;
  // Applies the averaged round and moves bsp_round_ to `next`. The round's
  // rows are read from the store first: when that fails, nothing of the
  // round is applied, *applied is false and the round is tried again at
  // the next Tick. Otherwise *applied is true and only the durable write
  // can fail.
  Status ApplyBspRound(int64_t next, bool* applied);

  // shard_persist.cc: checkpoint, recovery, durable writes.
  // Writes entries_ plus the sparse tables' part of a cut (a checkpoint's
  // when `checkpoint`, else a durable write's); sets *bytes to the bytes
  // handed to the store.
  Status WriteCut(bool checkpoint, SyncMode sync, uint64_t* bytes);
  Status Recover();
  Status WriteDurable(bool sync);  // touched_ chunks + state
  // WriteCut(), then clears entries_; adds the time taken to `*ns` and,
  // when it succeeds, the bytes to counters_.store_bytes_written.
  Status TimedWrite(bool checkpoint, SyncMode mode, uint64_t* ns);
  void AddLayoutEntry(std::vector<StoreEntry>* entries) const;
  void AddStateEntry(std::vector<StoreEntry>* entries) const;
  void AddChunkEntry(const Chunk& c, std::vector<StoreEntry>* entries) const;
  Status RestoreLayout(std::string_view value);
  Status RestoreState(std::string_view value);
  Status RestoreChunk(uint32_t id, std::string_view value);

  ShardOptions options_;
  Store* store_;  // not owned; may be null
  std::unique_ptr<Optimizer> optimizer_;
  LrSchedule schedule_;
  // Floats of state per weight: the optimizer's, then the delay
  // compensation's mean square (chunk.state = [optimizer | dc]).
  size_t state_per_elem_;
  std::shared_ptr<MemoryBudget> budget_;
  MemoryBudget::Charge fixed_charge_;   // tables sized by options
  MemoryBudget::Charge layout_charge_;  // layout tables
  MemoryBudget::Charge chunks_charge_;  // this shard's chunks
  std::optional<Layout> layout_;
  std::vector<std::unique_ptr<Chunk>> chunks_;  // this shard's chunks, id order
  std::vector<int32_t>
      local_index_;           // chunk id -> index in chunks_, -1 if not ours
  uint64_t shard_bytes_ = 0;  // fp32 bytes of chunks_
  uint64_t shard_version_ = 0;
  int64_t bsp_round_ = 0;
  // BSP, per rank: the round its last counted push was for (-1: none).
  std::vector<int64_t> bsp_pushed_round_;
  // Per rank: the lowest clock of a push this shard answered "retry"
  // (Unavailable: held by a freeze, a failing store) that has not come back
  // since, and the incarnation that sent it. A clock of that rank past it
  // is answered "retry" too: a clock of c says every push of the rank's
  // steps < c is here, and one that overtook a held push would close a BSP
  // round (or free an SSP read) without it.
  struct HeldPush {
    int64_t clock = -1;  // -1: none
    uint64_t incarnation = 0;
  };
  std::vector<HeldPush> held_push_;
  WorkerClocks clocks_;
  std::vector<uint64_t>
      last_read_;  // per rank: shard version of its last pull reply
  std::unique_ptr<internal::PushDedup> dedup_;
  // Durable write failed: pushes refused until a checkpoint succeeds.
  bool degraded_ = false;
  // BSP: the last round's rows could not be read; Tick() tries again.
  bool bsp_round_retry_ = false;
  // Replication after aggregation (shard_round_sums.cc): capture closed
  // rounds' sums (primary), the last capture, replay pushes without data
  // (backup).
  bool capture_rounds_ = false;
  std::optional<RoundSums> captured_;
  bool replay_headers_ = false;
  TimePoint next_repair_{};
  std::chrono::milliseconds repair_backoff_{100};
  // Sparse pull codecs (top-k, random-k) send each worker the change since
  // its last pull: per rank, what that worker holds of every local chunk.
  // Not persisted: after a restart the next pull resyncs with whole weights.
  std::vector<std::unique_ptr<PullReplica>> replicas_;  // per rank
  // Delay compensation: per rank, the pull snapshots it read (empty when
  // compensation is off).
  std::vector<DcReads> dc_reads_;
  uint64_t next_pull_seq_;  // starts random: unique across restarts
  std::vector<float> delta_scratch_;
  std::vector<uint64_t> pull_stamp_;  // per local chunk: pull #stamp named it
  uint64_t pull_stamps_ = 0;
  std::vector<std::unique_ptr<ParkedPull>> parked_;
  // Clients' shared-memory segments by (rank, incarnation), oldest first.
  std::vector<std::unique_ptr<ShmAttachment>> shm_;
  // Unsent reply bytes per peer (routing id) and per rank; the counters are
  // decremented by ZeroMQ's I/O thread when it releases a reply's frames.
  std::unordered_map<std::string, std::shared_ptr<UnsentBytes>> unsent_;
  std::vector<std::shared_ptr<UnsentBytes>> unsent_by_rank_;
  std::shared_ptr<UnsentBytes> unsent_total_;
  ShardCounters counters_;
  StalenessHistogram staleness_;
  bool shutdown_requested_ = false;
  // The lr a worker set (0: none).
  float worker_lr_ = 0.0f;
  RejectReason reject_reason_ =
      RejectReason::kOther;  // of the request being handled

  // Reused across pushes so the apply path allocates nothing once warm.
  std::vector<PendingGrad> pending_;
  std::vector<uint64_t> frame_stamp_;
  uint64_t stamp_ = 0;
  std::vector<Chunk*> touched_;
  std::unique_ptr<internal::TaskPool> apply_pool_;  // apply_threads > 1
  std::vector<WorkPiece> work_;
  uint64_t work_elems_ = 0;
  std::vector<uint32_t> sparse_idx_;
  std::vector<float> sparse_val_;
  std::vector<StoreEntry> entries_;

  // Elastic shards: the adopted epoch and document, and the freeze
  // (shard_elastic.cc; set by Migration).
  std::unique_ptr<internal::ElasticState> elastic_;

  // Sparse tables (nullptr until a model with tables is registered).
  std::unique_ptr<sparse::SparseTables> sparse_;
  // A request's rows, validated and decoded (SparseRequests), waiting to
  // be applied (a push's) or set (an upload's).
  std::unique_ptr<internal::DecodedRows> rows_;

  // The request handlers cut out of the core, on the view of it that
  // services_ and ShardState (server/shard/shard_state.h) lend; declared
  // last, so destroyed first (the open scans before sparse_ and the store).
  std::unique_ptr<Services> services_;
  std::unique_ptr<SparseRequests> sparse_requests_;  // rows of requests
  std::unique_ptr<RequestHandler> uploads_;          // kAssign (null: unserved)
  std::unique_ptr<RequestHandler> migration_;  // kMigrate (null: unserved)
};

}  // namespace asyncps::server
