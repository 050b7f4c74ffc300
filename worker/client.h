// Client: a worker's connection to every parameter-server shard.
//
// The client splits pushes and pulls by shard (from the model Layout), sends
// them over one DEALER socket per shard, and lets many requests be in flight
// at once: Start*() queue a request and return a Ticket at once; Wait() drives
// the sockets until that ticket completes or its deadline passes. Requests
// that get no reply in `attempt_timeout` are resent with exponential backoff
// (a restarted shard is reached again without the caller noticing); resent
// pushes are applied once, because the server deduplicates them by
// (rank, incarnation, request id). Sparse tables (common/sparse_table.h)
// registered with the model travel in the same messages: StartPushRows /
// StartPullRows send each shard only the unique keys it owns (gradients of
// repeated keys summed first; pulled rows written to every position of a
// repeated key), optionally as fp16. Tensor bytes leave without copying
// (payload frames are ref-counted) and pulled weights are copied once, from
// the received frame straight into the caller's buffer.
//
// Thread safety: a Client is used by one thread at a time. Heartbeats, when
// enabled, are sent by a private thread with sockets of its own.
//
// The implementation is in worker/client/: a core (core.h: start, wait,
// pump; one ShardConn per shard connection, one ReplyReader per ticket)
// and, over it, the elastic router, admin calls, uploads and
// shared-memory pulls as types of their own.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/assign_op.h"
#include "common/etcd_security.h"
#include "common/layout.h"
#include "common/sparse_table.h"
#include "common/status.h"
#include "common/transport.h"

namespace asyncps::worker {

struct ClientOptions {
  // Shard endpoints; servers[i] is shard i. Required. A replicated shard
  // is its replica group, "ep1|ep2|...": the client talks to one member
  // (the first, at start) and moves to another when that one redirects it
  // (it is not the primary: the reply names the primary) or leaves a
  // request unanswered for attempt_timeout; every request in flight to the
  // shard is then resent there (pushes are applied once: the group's
  // primary holds the de-duplication table its predecessor replicated).
  std::vector<std::string> servers;
  // Worker rank, 0..num_workers-1, or -1 for tools (stats, shutdown).
  // Default: -1.
  int rank = -1;
  // Socket options (limits, keys). Default: TransportOptions defaults.
  TransportOptions transport;
  // A request without a reply after this long is resent. Default: 2000 ms.
  std::chrono::milliseconds attempt_timeout{2000};
  // Longest pause between resends (doubling from attempt_timeout).
  // Default: 4000 ms.
  std::chrono::milliseconds max_backoff{4000};
  // Deadline of a request from its start, unless Wait() is given a shorter
  // one. Default: 120 s.
  std::chrono::milliseconds deadline{120000};
  // Most requests in flight; Start*() returns ResourceExhausted past it.
  // Default: 256.
  size_t max_in_flight = 256;
  // The shards' request limits assumed until a shard states its own (every
  // reply does): a push over them is refused before it is sent.
  // Default: ps_server's defaults, 1 GiB and 256 MiB.
  int64_t max_request_bytes = int64_t{1} << 30;
  int64_t max_request_frame_bytes = int64_t{256} << 20;
  // Called on the waiting thread just before a push request to a shard is
  // first sent (acked false) and when that shard acknowledges it (acked true),
  // with the shard index and the request id: an audit trail for exact
  // accounting of acknowledged pushes (ps_worker --push_log). Default: none.
  std::function<void(int shard, uint64_t id, bool acked)> on_push;
  // Interval of the background heartbeat thread; 0 disables it.
  // Default: 0 (workers enable it).
  std::chrono::milliseconds heartbeat_interval{0};
  // Called by Wait() -- and so by every blocking call of the Client and of
  // PsParameterStore -- on the waiting thread, each time a wait has lasted
  // another `interrupt_poll` without completing. A non-OK status ends the
  // wait with that status and abandons the ticket, as a passed deadline
  // does. Lets a binding keep blocking calls interruptible (Python: check
  // for Ctrl-C). Never called once a ticket has completed. Default: none.
  std::function<Status()> interrupt;
  // Time between two calls of `interrupt` during one wait, > 0.
  // Default: 50 ms.
  std::chrono::milliseconds interrupt_poll{50};
  // Encoding of sparse rows both ways: compression::CodecId of a dense codec
  // (0 = fp32, 1 = fp16, 2 = bf16). Default: 0.
  uint8_t rows_codec = 0;
  // Bytes of shared memory for pulls from shards on this host
  // (common/shm_segment.h); 0 = off. The client creates one sealed segment
  // and attaches it to every shard when the model is registered (or its
  // layout used); a shard on another host, or one that refuses, is pulled
  // from over its socket as before. A raw pull (no codec, no rows) whose
  // destination buffers all lie in memory from AllocateShared() is then
  // written there by the shard itself: one copy, no socket transfer.
  // Default: 0.
  size_t shared_memory_bytes = 0;
  // Elastic fleets (ps_ctl add-shard / remove-shard, common/elastic_doc.h):
  // etcd client URLs ("http://host:port") and the fleet's key prefix. When
  // set, Register() and UseLayout() first read the layout document
  // (<etcd_prefix>/elastic) and go to the shards that own chunks or key
  // ranges of sparse tables now, so a worker started again after every
  // shard in `servers` left still joins the fleet. `servers` stays the
  // fleet's first shards (their count cut the chunks; the document lists
  // them first). Without a document (a fleet that never changed) nothing
  // differs. Default: none.
  std::vector<std::string> etcd_endpoints;
  std::string etcd_prefix;
  // etcd's TLS files and credentials (https:// endpoints, etcd users).
  // Default: none.
  EtcdSecurity etcd_security;
};

// Rows of one sparse table in a push: n keys (repeats allowed: their
// gradients are summed) and their gradients, n x dim floats.
struct RowsPush {
  uint32_t table = 0;  // index in the registered table list
  const uint64_t* keys = nullptr;
  size_t n = 0;
  const float* grads = nullptr;
};

// Rows of one sparse table to pull: n keys (repeats allowed) whose rows are
// written to out (n x dim floats) during Wait().
struct RowsPull {
  uint32_t table = 0;
  const uint64_t* keys = nullptr;
  size_t n = 0;
  float* out = nullptr;
};

// One chunk of a push: the chunk id (from the layout), the codec its payload
// is encoded with (compression::CodecId, 0 = raw fp32) and the payload frame.
struct ChunkPayload {
  uint32_t chunk = 0;
  uint8_t codec = 0;
  Frame data;
  uint64_t version = 0;  // an upload of state (kAssign phase 4): the
                         // chunk's optimizer steps; else unused
};

// Bytes of one row record of `table` (kAssign phases 3 and 5, common/
// protocol.capnp): u64 optimizer steps, f32 weights[dim], f32 state[dim x
// k] for the table's row optimizer's k floats per weight.
inline size_t RowRecordBytes(const TableSpec& table) {
  return sizeof(uint64_t) +
         table.dim * (1 + table.optimizer.state_per_elem()) * sizeof(float);
}

// One request of an upload of values to one shard (kAssign; the protocol is
// in common/protocol.capnp, the whole upload in worker/upload.h).
struct AssignRequest {
  uint64_t upload = 0;  // random, != 0
  // kBegin, kValues, kCommit, kState, kRows (rows with state), kSaved
  // (saved rows) or kClear (clear tables).
  AssignOp phase = AssignOp::kBegin;
  bool overwrite = false;  // begin: claim even final values
  // values: raw fp32 chunks of the shard; state: k x the chunk's elements
  // floats of optimizer state per chunk ([slot 0 | slot 1 ...]), the
  // chunk's optimizer steps in `version`.
  std::vector<ChunkPayload> chunks;
  std::string optimizer;  // state: the optimizer it was saved from
  // values: rows of sparse tables (keys owned by the shard, each once; the
  // `grads` field holds the values, n x dim), copied when sent. Rows with
  // state: the keys of rows[i] and, in row_records[i], their n row records
  // (RowRecordBytes each; `grads` unused); `optimizer` names the tables'
  // row optimizer. Clear tables: the tables to clear (n = 0, no keys).
  std::vector<RowsPush> rows;
  std::vector<Frame> row_records;
};

// The shards' optimizer state (Client::ReadOptimizerState).
struct OptimizerState {
  // Floats of state per weight (Adam 2: m, v; momentum and AdaGrad 1; SGD 0).
  int per_weight = 0;
  // slots[j][t]: state slot j of tensor t (layout order), num_elements floats.
  std::vector<std::vector<std::vector<float>>> slots;
  // The most optimizer steps any chunk has taken (Adam's bias correction).
  uint64_t steps = 0;
  // Each chunk's optimizer steps, by chunk id (layout order).
  std::vector<uint64_t> chunk_steps;
};

// What a completed request reports (aggregated over shards).
struct TicketResult {
  int64_t max_staleness = -1;   // pushes: largest staleness recorded by a shard
  int64_t min_clock = 0;        // smallest min-clock among the shards' replies
  uint64_t bytes_received = 0;  // data-frame bytes of the replies
  bool created = false;         // register: some shard created the tensors
};

// Splits a comma-separated list of shard endpoints (empty items dropped).
std::vector<std::string> ParseEndpoints(const std::string& list);
// Splits a replica group "ep1|ep2|..." into its members (empty dropped).
std::vector<std::string> ParseReplicaGroup(const std::string& group);

class Client {
 public:
  using Ticket = uint64_t;

  static StatusOr<std::unique_ptr<Client>> Create(const ClientOptions& options);
  virtual ~Client() = default;

  int num_shards() const { return static_cast<int>(options_.servers.size()); }
  const ClientOptions& options() const { return options_; }

  // Registers the model on every shard and keeps its layout (num_shards is
  // taken from the server list). Idempotent; AlreadyExists if a shard holds a
  // different model. Workers only (rank >= 0). Also raises the largest reply
  // this client accepts to what a pull of the model can need.
  virtual Status Register(const std::vector<TensorSpec>& tensors,
                          LayoutOptions layout) = 0;
  // Registers the model with sparse tables. Idempotent; AlreadyExists if a
  // shard holds a different model or other tables.
  virtual Status RegisterModel(const std::vector<TensorSpec>& tensors,
                               LayoutOptions layout,
                               const std::vector<TableSpec>& tables) = 0;
  // The registered tables (empty before RegisterModel).
  virtual const std::vector<TableSpec>& tables() const = 0;
  // The shard that owns `key` of registered table `table` by the layout
  // this client routes by: an elastic fleet's key ranges (the layout read
  // last), else the static hash over num_shards().
  // REQUIRES: table < tables().size().
  virtual int ShardOfRow(uint32_t table, uint64_t key) const = 0;
  // Computes and keeps the layout of a model without registering it: for
  // observers (rank -1), which pull what the workers registered. Until they
  // have, pulls fail with FailedPrecondition.
  virtual Status UseLayout(const std::vector<TensorSpec>& tensors,
                           LayoutOptions layout) = 0;
  // REQUIRES: Register() or UseLayout() succeeded.
  virtual const Layout& layout() const = 0;

  // Starts a push of `chunks` (any subset of the model's chunks) made at
  // worker clock `clock`.
  virtual StatusOr<Ticket> StartPush(int64_t clock,
                                     std::vector<ChunkPayload> chunks) = 0;
  // Starts a pull of every chunk into `tensors` (one buffer per tensor, in
  // layout order, each num_elements floats), answered as the server's
  // consistency mode allows for a worker at `clock`. `codec` is the pull
  // compression spec ("" = raw fp32). The buffers are written during Wait().
  virtual StatusOr<Ticket> StartPull(int64_t clock,
                                     const std::vector<float*>& tensors,
                                     const std::string& codec = "") = 0;
  // Starts a pull of only the chunks `chunks` (layout ids, each at most
  // once) into `tensors` (as StartPull; only those chunks are written), raw
  // fp32, one request per shard that holds any of them. Requests leave for
  // each shard in the order they were started and a shard answers those it
  // can answer in that order, so pulls started in the order of first use
  // arrive in it (the layered pulls of worker/ps_store.h).
  virtual StatusOr<Ticket> StartPullChunks(
      int64_t clock, const std::vector<uint32_t>& chunks,
      const std::vector<float*>& tensors) = 0;
  // Starts a push of chunks and rows of sparse tables in one message per
  // shard (at most one RowsPush per table). The key and gradient buffers
  // may be reused as soon as this returns.
  virtual StatusOr<Ticket> StartPushRows(int64_t clock,
                                         std::vector<ChunkPayload> chunks,
                                         const std::vector<RowsPush>& rows) = 0;
  // Starts a pull of rows (at most one RowsPull per table) and, unless
  // `tensors` is empty, of every chunk (as StartPull); the keys may be
  // reused as soon as this returns, the outputs are written during Wait().
  virtual StatusOr<Ticket> StartPullRows(int64_t clock,
                                         const std::vector<float*>& tensors,
                                         const std::vector<RowsPull>& rows,
                                         const std::string& codec = "") = 0;

  // Starts announcing this worker's new clock to every shard. The highest
  // clock announced is sent again to a shard that comes back after a lost
  // connection (a restart may have lost it), so a wait for that shard's
  // consistency bound does not hang on a clock it forgot.
  virtual StatusOr<Ticket> StartClock(int64_t clock) = 0;
  // As StartClock, to the shards `shards` only (indices in [0,
  // num_shards()), each at most once; an empty list sends nothing): the
  // per-shard clocks of the overlap pipeline (worker/ps_store.h), where a
  // shard hears of clock c as soon as this worker's pushes of step c - 1
  // to it have left, not after the pushes to every shard. The highest clock
  // announced is kept per shard (a reconnecting shard gets its own again);
  // the other shards' are untouched. Clocks that go back are sent (the
  // shard ignores them) but never lower what is kept.
  virtual StatusOr<Ticket> StartClockShards(int64_t clock,
                                            const std::vector<int>& shards) = 0;

  // Starts a heartbeat to the shards `shards` (as StartClockShards), on the
  // connections this client's requests use. A shard handles what arrives
  // in order, so its reply says that every request started to it before
  // has arrived, even one whose own reply is held (a replicated primary
  // answers a push once its backups have it): the overlap pipeline's stage
  // wait (PsParameterStore::StartReceipts).
  virtual StatusOr<Ticket> StartHeartbeatShards(
      const std::vector<int>& shards) = 0;

  // Waits until `ticket` completes: its status (the first error from any
  // shard), or TimedOut when `timeout` (capped by the request deadline)
  // passes first, in which case the ticket is abandoned.
  virtual Status Wait(Ticket ticket, std::chrono::milliseconds timeout,
                      TicketResult* result = nullptr) = 0;
  // Waits for every outstanding ticket.
  virtual Status WaitAll(std::chrono::milliseconds timeout) = 0;

  // Admin requests, answered by every shard; `replies` gets one JSON text
  // per shard for Stats.
  virtual Status Stats(std::vector<std::string>* replies,
                       std::chrono::milliseconds timeout) = 0;
  virtual Status Checkpoint(std::chrono::milliseconds timeout) = 0;
  virtual Status Shutdown(std::chrono::milliseconds timeout) = 0;
  virtual Status Heartbeat(std::chrono::milliseconds timeout) = 0;

  // A buffer of `num_floats` floats in this client's shared memory (see
  // ClientOptions::shared_memory_bytes), 64-byte aligned, valid as long as
  // the Client; nullptr when shared memory is off or too little is left.
  // Pulls into such buffers skip the socket for the shards attached.
  virtual float* AllocateShared(size_t num_floats) = 0;
  // Shards that accepted this client's shared memory (0 when it is off).
  virtual int shared_memory_shards() const = 0;

  // One upload request to `shard` (see AssignRequest); *claimed gets the
  // reply's verdict for a begin (true: this client holds the claim).
  // Unavailable replies (another worker uploads) are retried until
  // `timeout`. REQUIRES: Register() succeeded.
  virtual Status Assign(int shard, AssignRequest request, bool* claimed,
                        std::chrono::milliseconds timeout) = 0;

  // Reads every shard's optimizer state (kAssign phase 3) into *out.
  // REQUIRES: Register() succeeded.
  virtual Status ReadOptimizerState(OptimizerState* out,
                                    std::chrono::milliseconds timeout) = 0;
  // Reads the rows of keys[0..n) (unique) of registered table `table` with
  // their optimizer state and steps (kAssign phase 3 naming rows): `out`
  // gets n row records (RowRecordBytes(table) bytes each, in key order; a
  // key without a row: its initial value and state, 0 steps). Keys go to
  // the shard ShardOfKey names (not elastic key ranges), at most
  // kMaxReadKeys and 64 MiB of records per request. InvalidArgument for a
  // repeated key. REQUIRES: Register() succeeded.
  static constexpr size_t kMaxReadKeys = 65536;
  virtual Status ReadRowRecords(uint32_t table, const uint64_t* keys, size_t n,
                                uint8_t* out,
                                std::chrono::milliseconds timeout) = 0;
  // One page of a scan of the entries (rows and admission counters) of
  // registered table `table` that `shard` holds (kAssign phase 6): the keys
  // >= `from`, in increasing order, of at most max_rows entries are
  // appended to *keys and their saved records (SavedRecordBytes(table)
  // each, common/sparse_table.h) to *records. Fewer than max_rows: the
  // shard has no more. REQUIRES: Register() succeeded. Default:
  // Unimplemented.
  // (A page carries the client's layout epoch: a shard that adopted a
  // newer one refuses it, FailedPrecondition, and the client adopts that
  // layout, layout_epoch() changes; worker::ScanTable then starts over.)
  // With `snapshot`, a page of a point-in-time scan (common/protocol.capnp
  // Assign.openSnapshot): *snapshot == 0 opens one on the shard (the table
  // as it stands now) and reads its first page; its id goes to *snapshot,
  // and the later pages naming it read the table as it was then. A page
  // of a scan the shard no longer holds is FailedPrecondition (start
  // again).
  virtual Status ScanRows(int shard, uint32_t table, uint64_t from,
                          size_t max_rows, std::vector<uint64_t>* keys,
                          std::vector<uint8_t>* records,
                          std::chrono::milliseconds timeout,
                          uint64_t* snapshot = nullptr) {
    (void)shard, (void)table, (void)from, (void)max_rows, (void)keys,
        (void)records, (void)timeout, (void)snapshot;
    return Status::Unimplemented("this client cannot scan rows");
  }

  // The elastic layout epoch requests are routed by (0: a static fleet,
  // or no layout adopted yet). Default: 0.
  virtual uint64_t layout_epoch() const { return 0; }

  // The learning rate every later push and clock carries (> 0: the shards
  // use it in place of their --lr and schedule, up to their --max_lr; 0: not
  // carried). Default: 0.
  void set_lr(float lr) { lr_ = lr; }
  float lr() const { return lr_; }

  // Requests resent so far (all shards).
  virtual uint64_t resends() const = 0;
  // Times a shard's replica group member was changed (failover, redirect).
  virtual uint64_t failovers() const = 0;
  // This client process's random incarnation (sent with every request).
  virtual uint64_t incarnation() const = 0;

 protected:
  explicit Client(const ClientOptions& o) : options_(o) {}
  ClientOptions options_;
  float lr_ = 0.0f;  // carried by pushes and clocks when > 0
};

}  // namespace asyncps::worker
