// Replicator: the event loop's side of a replica group (primary-backup
// replication of one shard index over R processes).
//
// Every process of a group runs the same Shard (same shard id). The group's
// layout (server/replication/replica_view.h), decided in etcd by Membership,
// names one primary and its backups under an epoch. Workers talk to the
// primary only; a backup refuses their data requests with a redirect to the
// primary it knows.
//
// The primary applies each register, push, clock and upload request, and
// each step of an elastic change that alters the shard (kMigrate freeze,
// import, adopt, abort: server/elastic/), as a single shard does, then
// hands the request (its header and data frames, not
// copied) to every backup as a kReplicate request stamped with the epoch.
// The reply to the worker is held until every backup of the current view
// has answered that kReplicate: an acknowledged update is applied by every
// replica of the group (a fan-out of the primary, not a chain: the
// acknowledgement waits for the slowest backup either way, and one hop is
// shorter than R-1). Heartbeats are not
// handed on: workers send theirs to every replica of a group. Requests that
// failed on the primary changed nothing and
// are not handed on; a resent push is handed on again and the backup's
// de-duplication table, which holds what the primary's holds, applies it
// once.
//
// Replication after aggregation (Li et al., OSDI'14), under BSP
// (Shard::AggregatesRounds(): BSP, no sparse tables) with ps_server
// --replicate_after_aggregation (the default): a primary hands its backups one
// round record per round instead of every push and clock. Pushes and
// clocks the shard accepted are batched (Batch: their headers, not their
// data, and their replies, held); when the shard closes a round it keeps a
// copy of the round's per-chunk sums (taken before they are averaged), and
// ForwardRound sends one kReplicate carrying the batched headers and those
// sums. The backup sets each chunk's round sum to the primary's, replays
// the headers in order without data (a push: de-duplication entry, clock,
// contributor count and per-rank round bookkeeping; a clock: the same
// clock move, which closes the round there with the same code on the same
// sums and counts), and closes the round itself when the primary's closed
// by an eviction (the record names the round after it): its weights,
// optimizer state, versions, round, clocks and de-duplication table are
// bitwise the primary's. The replies of the round's pushes and clocks are
// released once every backup acknowledged the record. A round closes on
// the workers' clocks, and a worker normally sends a shard its clock right
// behind its push (the trainer sends push, clock, then waits on its pull;
// the overlap scheduler under BSP pushes one bucket per shard and clocks it
// at once before any stage wait). A worker whose clock a shard refused for
// a stale elastic layout does wait for push replies first: it sends the
// clock again only once every push of the step is acknowledged (a
// rerouted push must reach its new owner first), and the round waits for
// that clock. So a rank whose batched push sees no clock of its own for
// flush_unclocked_after gets the open round's record sent
// (RankAwaitsClock()), which releases the reply; without it that was a
// deadlock (launch.elastic, --replicas 2). A request handed on by itself
// (register, upload, elastic steps, a push with sparse rows) is preceded
// by a record of what was batched before it (the open round's sums so
// far), so backups apply everything in the primary's order. A primary
// lost mid-round handed at most such open records of the round on; the
// workers' resends of the unacknowledged pushes and clocks are applied
// once by the promoted backup (the records carried the de-duplication
// entries of every acknowledged push). Pull replies are not held (as before).
// ASP/SSP and shards with sparse tables hand on every request as described
// above.
//
// Workers' liveness. A worker silent for --worker_timeout_ms leaves the
// clock minimum (server/shard/worker_clocks.h), which closes BSP rounds
// without it, expires sparse rows and frees its per-worker state: only the
// primary decides this. A backup evicts nobody on its own timer
// (Shard::set_follower) and takes an evicted worker back only on a request
// it replays. The primary hands on a liveness record (ForwardWorkers: the
// liveness and clock of each worker that changed) after an eviction and
// after a rejoin on a request it does not hand on (a heartbeat, a pull),
// behind the open round's record when requests are batched; the backup
// sets those states at that point of the primary's order. A spare copied
// to gets every worker's state after its snapshot. Promoted, a process
// evicts by its own timer again, from when it last heard from each worker
// (workers send their heartbeats to every replica).
//
// Who may send them (replica_auth.h). Every kReplicate and kSnapshot names
// its sender (replica name, incarnation, MAC session) and is authenticated
// before anything else (Authenticate): without CURVE by its tag under the
// group's secret, with CURVE by the client key of its connection, which
// must be the replica key in a member record of the group. Then it must
// come from the primary the view names at the request's epoch (the
// spare's snapshot source, for a spare that installed a snapshot; at a
// newer epoch than this process read, a live member of its group). The
// request it carries is judged as if it came alone (server/loop/trust.h).
// Forged pings cannot keep a backup from suspecting a dead primary: only
// the primary's authenticated traffic counts as hearing from it.
//
// A backup applies kReplicate requests in arrival order (one DEALER per
// backup keeps the primary's order) and answers each with the status of
// the applied request. It refuses one from an epoch lower than its own, or
// any when it is itself the primary: a deposed primary can then never get
// an update acknowledged, which is what keeps two primaries from both
// acknowledging writes. A primary also refuses writes (applies nothing)
// once its etcd lease is unconfirmed and no backup answered it lately:
// alone, or cut off from its group (Admit).
//
// When the view drops a backup (its lease ended), replies that only waited
// for it are released. When this process stops being primary, held replies
// are dropped unanswered: the workers resend them to the new primary, which
// has every update this one handed on and de-duplicates the resends
// (batched requests are dropped with them: nothing of them was handed on).
//
// Re-replication. A spare of the group (a live process the layout does not
// list: a replacement) is copied to: the server hands the Replicator a
// checkpoint of its store (StartJoin), which goes to the spare as kSnapshot
// pieces on the spare's connection, followed there by every update handed
// on from then on. The spare installs the checkpoint as its store, and once
// it acknowledged the last piece it counts as a backup (its acknowledgements
// hold replies from then on) and TakeJoined() names it, for Membership to
// list it in the layout. A spare takes kReplicate requests once it installed
// a snapshot, from that epoch on.
//
// Ownership: owns one ClientSocket per backup. Thread safety: none; used by
// the event loop's thread only.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/transport.h"
#include "common/wire.h"
#include "server/replication/replica_auth.h"
#include "server/replication/replica_view.h"
#include "server/shard/shard.h"

namespace asyncps::server::replication {

// True for the requests a primary hands on to its backups once its shard
// accepted them, and a backup takes in a kReplicate: register, push, clock,
// upload (kAssign) and the steps of an elastic change that alter the shard
// (kMigrate freeze, import, adopt, abort; describe and export only read).
bool HandedOn(const RequestHeader& req);

struct ReplicatorOptions {
  // Replica group (shard index) this process serves. Default: 0.
  int group = 0;
  // This process as its etcd member record names it: its replica name
  // ("g<group>r<replica>") and incarnation, stamped on every replica request
  // it sends. Default: "", 0.
  std::string name;
  uint64_t incarnation = 0;
  // The group's secret (kReplicaSecretBytes bytes): every replica request
  // carries a tag of it and is applied only with a valid one (see
  // server/replication/replica_auth.h). Empty: CurveZMQ authenticates the
  // sender instead, and `transport` must hold this process's replica key
  // pair (curve_secret_key, curve_public_key); each backup is connected to
  // with the server key of its member record. One of the two is required.
  // Default: "".
  std::string secret;
  // With a secret: what the tag of an update covers (replica_auth.h
  // Coverage): kHeader, its header and frame lengths (a peer off the
  // network path cannot forge or replay one), or kAll, every byte (an
  // on-path host cannot alter one either). A receiver set to kAll refuses
  // updates tagged kHeader. Snapshots are always tagged kAll. Default:
  // kHeader.
  Coverage tag_coverage = Coverage::kHeader;
  // Socket options for the connections to backups (context, limits, and
  // with CurveZMQ the replica key pair).
  TransportOptions transport;
  // A primary sends each backup a ping (a kReplicate carrying no request)
  // when it sent it nothing for this long. Default: 100 ms.
  std::chrono::milliseconds ping_every{100};
  // A backup that heard nothing from its primary for this long (after it
  // heard from it at least once in the epoch) suspects it is gone
  // (PrimarySuspected()); 0: only its etcd lease tells. Default: 500 ms.
  std::chrono::milliseconds suspect_after{500};
  // Replication after aggregation: under BSP (Shard::AggregatesRounds()) a
  // primary hands on one round record per round instead of every push and
  // clock (see the header comment). Default: false (ServerOptions: true).
  bool aggregate_rounds = false;
  // Replication after aggregation: a round record of the open round goes
  // out when a rank's batched push waited this long for that rank's clock
  // (RankAwaitsClock()), so its reply is released; a worker that must see
  // a rerouted push acknowledged before it clocks (an elastic change) would
  // otherwise wait for a round that waits for its clock. Default: 20 ms.
  std::chrono::milliseconds flush_unclocked_after{20};
};

// Counters for stats and metrics.
struct ReplicatorCounters {
  uint64_t forwarded = 0;      // kReplicate requests sent, all backups
  uint64_t acked = 0;          // their acknowledgements received
  uint64_t applied = 0;        // kReplicate requests applied as a backup
  uint64_t refused_stale = 0;  // kReplicate refused: stale epoch / primary
  // Replica requests refused because their sender was not authenticated
  // (no valid tag, not a member's key) or is not the group's primary.
  uint64_t refused_sender = 0;
  uint64_t backup_connect_errors = 0;  // a listed backup could not be connected
  uint64_t backup_errors = 0;          // acknowledgements carrying an error
  uint64_t dropped_held = 0;  // held replies dropped on losing the primary
  uint64_t refused_not_primary = 0;  // worker requests redirected
  uint64_t refused_no_lease = 0;     // writes refused: lease not confirmed
  uint64_t view_changes = 0;
  uint64_t snapshots_sent = 0;  // spares copied to (started)
  uint64_t snapshot_bytes_sent = 0;
  uint64_t spares_joined = 0;  // acknowledged their snapshot
  uint64_t snapshots_failed = 0;
  // Replication after aggregation.
  uint64_t records_forwarded = 0;  // round records sent, all backups
  uint64_t batched = 0;            // pushes and clocks folded into records
  uint64_t records_applied = 0;    // round records applied as a backup
  // Liveness records (workers evicted or taken back) sent, all backups.
  uint64_t liveness_forwarded = 0;
};

class Replicator {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  // InvalidArgument without a secret or a CurveZMQ replica key.
  static StatusOr<std::unique_ptr<Replicator>> Create(
      const ReplicatorOptions& options);
  ~Replicator();
  Replicator(const Replicator&) = delete;
  Replicator& operator=(const Replicator&) = delete;

  // Takes a new view (from Membership). Connects to new backups, releases
  // replies that waited only for dropped ones (into `out`), and drops every
  // held reply when this process is no longer the primary. The view takes
  // effect whole: a listed backup that cannot be connected to (its
  // endpoint does not parse, no server key with CURVE) still holds every
  // reply from then on, as a backup that failed an update does, and is
  // reported by TakeBroken() so that Membership drops it through etcd (a
  // new epoch); the error returned says which.
  Status SetView(const ReplicaView& view, std::vector<OutgoingReply>* out);
  const ReplicaView& view() const { return view_; }

  // OK when a worker request of `kind` may be served by this process now;
  // otherwise the error to answer (Unavailable, with the redirect set in
  // *redirect). Stats, checkpoint and shutdown are always served.
  Status Admit(RequestKind kind, TimePoint now, std::string* redirect);

  // True when `req`, accepted by the shard, is handed on now (this process
  // is the primary, has backups, and HandedOn(req)).
  bool Replicates(const RequestHeader& req) const;

  // Hands `msg` (a worker request the shard applied) to every backup.
  // When `hold` is non-null, *hold (the reply to it) is kept until every
  // backup has acknowledged; without backups it is appended to `out` at once.
  void Forward(const Message& msg, OutgoingReply* hold,
               std::vector<OutgoingReply>* out);

  // True when `req` (accepted by a shard whose rounds aggregate:
  // Shard::AggregatesRounds()) goes into the next round record rather than
  // its own kReplicate: options.aggregate_rounds, Replicates(req), and a
  // push without sparse rows or a clock.
  bool Batches(const RequestHeader& req, bool shard_aggregates) const;
  // True while this process is a primary with backups that batches (the
  // shard then captures its rounds' sums).
  bool aggregating() const;
  // Requests batched since the last record.
  size_t num_batched() const { return batch_.size(); }
  // Keeps `msg`'s header (not its data) for the next round record and its
  // reply *hold, released once every backup acknowledged that record.
  // `req` is msg's decoded header (its kind and rank), `now` its arrival.
  void Batch(const Message& msg, const RequestHeader& req, OutgoingReply* hold,
             TimePoint now);
  // True when a rank's push has been in the batch, without a clock of that
  // rank after it, for options.flush_unclocked_after: the open round's
  // record should go out (Server::ForwardRound(open)) so that the push's
  // reply is released.
  bool RankAwaitsClock(TimePoint now) const;
  // Hands every backup one round record: the batched headers and `sums`
  // (Shard::TakeRoundSums). The batched replies are held until every
  // backup acknowledged it; without backups they go to `out` at once.
  void ForwardRound(RoundSums sums, std::vector<OutgoingReply>* out);
  // Hands every backup a liveness record: the primary's state of the
  // workers it evicted or took back on a request it does not hand on (a
  // heartbeat, a pull). Nothing waits for it; the replies handed on after
  // it wait for their own acknowledgements, which come after its.
  void ForwardWorkers(std::vector<WorkerLiveness> states);

  // Backup and spare side: who sent `msg`, a kReplicate or kSnapshot whose
  // decoded header is `req` (replica_auth.h): with CurveZMQ the member whose
  // replica key the handshake authenticated; without, the sender the
  // header names, once the tag (the last frame, removed from msg->frames
  // here) verified under the group's secret. PermissionDenied otherwise
  // (counted in refused_sender), with one message for every cause.
  Status Authenticate(Message* msg, const RequestHeader& req,
                      ReplicaMember* sender);
  // Backup side: checks a kReplicate request from the authenticated
  // `sender` against this view: it must come from the primary the view
  // names (the epoch's), from the primary whose snapshot this spare
  // installed, or, at an epoch this process has not read yet, from a live
  // member of the group. OK means apply its inner request.
  Status CheckReplicate(const RequestHeader& req, const ReplicaMember& sender);
  // Backup side: counts an applied kReplicate request (a round record).
  void CountApplied(bool record) {
    ++counters_.applied;
    if (record) ++counters_.records_applied;
  }
  // Backup side: the epoch whose primary has been silent for
  // suspect_after (it sends pings when idle, so it is probably gone), or 0.
  // Promotion still goes through etcd (Membership), and is safe without
  // waiting for the primary's lease: the promoted backup refuses the old
  // primary's updates, which then cannot be acknowledged.
  uint64_t PrimarySuspected(TimePoint now) const;

  // Primary side of re-replication: spares to copy to now (each once; one
  // that failed is offered again after a pause).
  std::vector<std::string> TakeJoiners(TimePoint now);
  // Sends the checkpoint in `dir` (its plain files) to the spare at
  // `endpoint` as kSnapshot pieces of at most `piece_bytes`; every update
  // handed on later follows them.
  Status StartJoin(const std::string& endpoint, const std::string& dir,
                   size_t piece_bytes = size_t{16} << 20);
  // Spares that acknowledged their whole snapshot since the last call.
  std::vector<std::string> TakeJoined();
  // Backups that failed an update since the last call (for Membership to
  // drop: until then the replies wait).
  std::vector<std::string> TakeBroken();
  // Backups that answered nothing, pings included, for suspect_after while
  // updates waited on them (gone or cut off), since the last call: for
  // Membership to drop without waiting for their leases.
  std::vector<std::string> TakeSilent();
  // Spare side: OK when a kSnapshot request from the authenticated `sender`
  // may be installed: this process is neither primary nor backup, and the
  // sender is the primary of the view's epoch (or, at a newer epoch, a live
  // member of the group).
  Status CheckSnapshot(const RequestHeader& req, const ReplicaMember& sender);
  // Spare side: a snapshot of `epoch` from `sender` was installed;
  // kReplicate requests of that epoch on are taken from that process.
  void SetJoined(uint64_t epoch, const ReplicaMember& sender) {
    joined_epoch_ = epoch;
    joined_primary_ = sender;
  }

  // Reads the backups' acknowledgements and releases (into `out`) every held
  // reply all of them acknowledged.
  // Also sends pings to backups idle for ping_every.
  void Poll(std::vector<OutgoingReply>* out);

  // The backups' sockets, for the event loop's poll
  // (ServerSocket::SetWakeSockets); valid until the next SetView().
  std::vector<ClientSocket*> wake_sockets() const;

  // Replies held now (batched ones too).
  size_t num_held() const { return held_.size() + batch_.size(); }
  const ReplicatorCounters& counters() const { return counters_; }

 private:
  struct Backup;
  struct Held {
    uint64_t seq = 0;
    OutgoingReply reply;
  };
  explicit Replicator(const ReplicatorOptions& options);
  // A connection to the replica at `endpoint` (its server key from the
  // view's member record with CURVE).
  StatusOr<std::unique_ptr<ClientSocket>> ConnectTo(
      const std::string& endpoint) const;
  // Sends one replica request (`header`, then `data`, then its tag without
  // CURVE) to `b`.
  Status SendTo(Backup& b, const std::vector<uint8_t>& header,
                const std::vector<ByteView>& data, const uint8_t* tag);
  // The tag of a replica request (header, data) with id `id`; nullptr
  // with CURVE (nothing to add).
  const uint8_t* Tag(const RequestHeader& h, const std::vector<uint8_t>& header,
                     const std::vector<ByteView>& data);
  void Release(std::vector<OutgoingReply>* out);
  // The batched replies to `out` at once (no backup to wait for), then
  // ClearBatch().
  void ReleaseBatch(std::vector<OutgoingReply>* out);
  // Empties the batch and what it knows of ranks awaiting their clocks.
  void ClearBatch();
  // A kReplicate header with the next sequence number, epoch and group.
  RequestHeader NewReplicate();
  // Sends a kReplicate (header `h`, then `frames`) to every backup.
  void SendToBackups(const RequestHeader& h,
                     const std::vector<ByteView>& frames);
  // Batched requests: the header frame and the reply to it.
  struct Batched {
    ByteView header;
    OutgoingReply reply;
  };

  ReplicatorOptions options_;
  ReplicaView view_;
  std::vector<std::unique_ptr<Backup>> backups_;
  std::deque<Held> held_;       // seq order
  std::vector<Batched> batch_;  // since the last round record
  // Ranks with a batched push and no batched clock after it, and since
  // when (at most one entry per accepted rank; cleared with the batch).
  std::vector<std::pair<int32_t, TimePoint>> unclocked_;
  uint64_t next_seq_;  // starts random: unique across restarts
  std::vector<Frame> frames_;
  Message msg_;
  ReplicatorCounters counters_;
  // Re-replication: when each spare was last offered (TakeJoiners).
  std::vector<std::pair<std::string, TimePoint>> offered_;
  std::vector<std::string> joined_;  // TakeJoined()
  std::vector<std::string> broken_;  // TakeBroken()
  std::vector<std::string> silent_;  // TakeSilent()
  uint64_t joined_epoch_ = 0;        // spare side: 0 = no snapshot installed
  ReplicaMember joined_primary_;     // who sent that snapshot
  std::unique_ptr<ReplicaMac> mac_;  // null with CURVE
  std::array<uint8_t, kReplicaTagBytes> tag_{};  // Tag()'s last
  // Backup side: when the primary of `heard_epoch_` was last heard from.
  TimePoint heard_at_{};
  uint64_t heard_epoch_ = 0;
  // Primary side: when a backup last acknowledged anything (pings too).
  TimePoint last_ack_at_{};
};

}  // namespace asyncps::server::replication
