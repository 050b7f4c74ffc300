// Server: the event loop of one ps_server shard.
//
// Owns a ServerSocket (ZeroMQ ROUTER), the shard's Store (RocksDB when
// db_path is set) and the Shard. Run() receives with a short timeout so
// timers run between messages (liveness, parked pulls, periodic
// checkpoints), decodes each header (a malformed one gets an error reply,
// with id 0 when even the id is unreadable; the server never crashes on
// input), checks that admin requests (checkpoint, shutdown) come from an
// admin, dispatches to the Shard and sends its replies, tensor frames
// without copying. Every reply states the server's request limits
// (max_request_bytes, max_frame_bytes) so clients refuse larger requests
// themselves; a request over them is answered InvalidArgument with its id.
//
// Replication (server/replication/): with etcd endpoints in `replication`,
// the server is one replica of its shard's replica group: Membership keeps
// its lease and the group's layout in etcd, and the Replicator hands the
// updates it applies as the primary to its backups (holding each reply until
// they applied it), applies kReplicate requests as a backup, and refuses
// workers' data requests when it is not the primary (Unavailable with a
// redirect). Without etcd nothing of this runs: a static fleet.
//
// Ownership: the Server owns the socket, the store and the shard.
// Thread safety: Run() is called from one thread; `stop` may be set from
// any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/etcd_client.h"
#include "common/status.h"
#include "common/transport.h"
#include "common/wire.h"
#include "server/loop/server_metrics.h"
#include "server/replication/membership.h"
#include "server/replication/replicator.h"
#include "server/shard/shard.h"
#include "server/store/store.h"

namespace asyncps::server {

struct ServerOptions {
  // ZeroMQ endpoint to bind; "tcp://127.0.0.1:*" picks a free port.
  // Default: "tcp://127.0.0.1:*" (loopback only).
  std::string endpoint = "tcp://127.0.0.1:*";
  // The shard's configuration (id, counts, consistency, optimizer...).
  ShardOptions shard;
  // RocksDB directory of this shard; empty: no persistence. Default: "".
  std::string db_path;
  // Period of automatic checkpoints; 0 disables them (checkpoints still
  // happen on request and on shutdown). Default: 60 s.
  std::chrono::milliseconds checkpoint_every{60000};
  // Largest request accepted (all frames), bytes; a larger one is dropped on
  // receipt and answered InvalidArgument (with its id). Default: 1 GiB.
  int64_t max_message_bytes = int64_t{1} << 30;
  // Largest frame accepted, bytes (capped at max_message_bytes): ZeroMQ drops
  // the connection of a peer sending a larger one before buffering it
  // (ZMQ_MAXMSGSIZE). Registrations whose chunks would not fit are refused.
  // Default: 256 MiB.
  int64_t max_frame_bytes = int64_t{256} << 20;
  // SO_SNDBUF of each worker's connection, bytes (TransportOptions::
  // send_buffer_bytes): bounds how much of this shard's replies waits in a
  // saturated link's queue ahead of the workers' acknowledgements. 0: the
  // OS default. Default: 0.
  int send_buffer_bytes = 0;
  // Longest wait for a message before timers run. Default: 20 ms.
  std::chrono::milliseconds tick{20};
  // ZeroMQ context to use; nullptr creates one. Default: nullptr.
  std::shared_ptr<Context> context;
  // CurveZMQ secret key of this server (Z85); empty: no encryption.
  // Default: "".
  std::string curve_secret_key;
  // Client public keys (Z85) allowed to connect when CURVE is on; empty:
  // any client knowing the server's public key. Refused handshakes are
  // logged. Default: empty.
  std::vector<std::string> curve_allowed_client_keys;
  // Registry the server's metrics are registered in and fed to (see
  // server/loop/server_metrics.h); not owned, must outlive the server. nullptr:
  // no metrics. Default: nullptr.
  metrics::Registry* metrics = nullptr;
  // Client public keys (Z85) that may send admin requests (checkpoint,
  // shutdown) when CURVE is on; they may connect even when not in
  // curve_allowed_client_keys. With CURVE on and this empty, admin requests
  // are refused. Default: empty.
  std::vector<std::string> curve_admin_keys;
  // Without CURVE, admin requests are accepted only from loopback addresses
  // (and inproc/ipc) unless this is set. Default: false.
  bool allow_remote_admin = false;
  // The replica group's secret (kReplicaSecretBytes bytes, ps_server
  // --replica_secret_file): replica traffic is authenticated with it
  // (server/replication/replica_auth.h). Empty: with CURVE the replicas'
  // keys authenticate it instead; without, the group's secret in etcd
  // (created with the group). Default: "".
  std::string replica_secret;
  // Without CURVE: what a replica update's tag covers
  // (replication::ReplicatorOptions::tag_coverage, ps_server --replica_tag).
  // Default: kHeader.
  replication::Coverage replica_tag_coverage = replication::Coverage::kHeader;
  // A replica first checks that its advertised endpoint
  // (replication.endpoint) reaches it: a probe sent there must arrive on
  // its own socket within this long, else Create() fails (a mistyped or
  // foreign endpoint would have its group's primary replicate to no one).
  // Default: 5 s.
  std::chrono::milliseconds advertise_probe_timeout{5000};
  // Replica group membership: empty etcd_endpoints = a static fleet (no
  // replication). `group` is taken from shard.shard_id, `groups` from
  // shard.num_shards, `endpoint` (when empty) from the bound endpoint.
  // Default: static.
  replication::MembershipOptions replication;
  // A backup that heard nothing (updates or pings) from its primary for
  // this long asks etcd to promote it; 0: only the primary's lease ending
  // does. Default: 500 ms.
  std::chrono::milliseconds replica_suspect_after{500};
  // Replication after aggregation: under BSP a primary hands its backups one
  // record per round (the round's sums and the headers of its pushes and
  // clocks) instead of every push (server/replication/replicator.h).
  // Default: true.
  bool replicate_after_aggregation = true;
  // With it: a rank's batched push that waited this long for the rank's
  // clock sends the open round's record, releasing the push's reply
  // (replication::ReplicatorOptions::flush_unclocked_after). Default: 20 ms.
  std::chrono::milliseconds round_record_flush_after{20};
  // Elastic shards (server/elastic/): etcd endpoints and the fleet's prefix,
  // where ps_ctl add-shard / remove-shard commit each change. A shard frozen
  // for a change past its deadline reads <prefix>/elastic there: the change
  // committed -> adopt it; not -> abort it; etcd unreachable -> stay frozen
  // (never two owners of a chunk). Empty: stay frozen until ps_ctl ends it.
  // Default: empty.
  std::vector<std::string> elastic_etcd_endpoints;
  // etcd's TLS files and credentials, for elastic_etcd_endpoints
  // (replication.etcd_security for the replica layout). Default: none.
  EtcdSecurity elastic_etcd_security;
  std::string elastic_prefix = "/asyncps/default";
};

class Server {
 public:
  // Opens the store (recovering the shard) and binds the socket.
  static StatusOr<std::unique_ptr<Server>> Create(const ServerOptions& options);
  ~Server();

  // The bound endpoint (real port for "tcp://host:*").
  const std::string& endpoint() const;

  // Serves until a shutdown request has been answered or `stop` is true.
  // On exit parked pulls get Cancelled replies and, unless a shutdown
  // request already did it, a final checkpoint is written; its status is
  // returned.
  Status Run(const std::atomic<bool>& stop);

  Shard& shard() { return *shard_; }
  // nullptr in a static fleet.
  const replication::Replicator* replicator() const {
    return replicator_.get();
  }

 private:
  Server() = default;
  // Dispatch() plus the request's metrics.
  void HandleMessage(const std::string& peer, Message& msg,
                     std::chrono::steady_clock::time_point now);
  // Decodes and checks `msg`, hands it to the shard or answers an error.
  void Dispatch(const std::string& peer, Message& msg,
                std::chrono::steady_clock::time_point now);
  // The trust check of the request in req_ (server/loop/trust.h), the one
  // place a request is judged by who sent it: OK, or the error to answer
  // and the reason to count. A replica request's authenticated sender goes
  // into *sender (its tag frame is removed from `msg`).
  Status Authorize(Message& msg, replication::ReplicaMember* sender,
                   RejectReason* reason);
  // Sends a probe to the advertised `endpoint` and waits for it on the own
  // socket (see ServerOptions::advertise_probe_timeout); messages that
  // arrive meanwhile are kept for Run().
  Status ProbeAdvertisedEndpoint(const std::string& endpoint,
                                 const TransportOptions& transport);
  // OK when `msg` may carry an admin request (see curve_admin_keys,
  // allow_remote_admin).
  Status CheckAdmin(const Message& msg) const;
  void Reply(const std::string& peer, const Status& error, RejectReason reason);
  // Appends the reply to the request in req_ with `status`.
  void Answer(const std::string& peer, const Status& status);
  // Backup side of replication: applies the request a kReplicate carries.
  void HandleReplicate(const std::string& peer, Message& msg,
                       const replication::ReplicaMember& sender,
                       std::chrono::steady_clock::time_point now);
  // Backup side: applies a round record (replication after aggregation).
  void HandleRoundRecord(const std::string& peer, Message& msg,
                         std::chrono::steady_clock::time_point now);
  // Backup side: takes the replies the shard gave the replicated requests
  // (out_ from `first`) out of out_; the first error goes into *applied.
  void TakeInnerReplies(size_t first, Status* applied);
  // Primary side: hands the request just applied to the backups, holding
  // its reply (out_ from `first`) until they applied it; under BSP with
  // replication after aggregation a push or clock goes into the next round
  // record instead, and a round the shard closed is handed on.
  void Replicate(const std::string& peer, const Message& msg, size_t first,
                 std::chrono::steady_clock::time_point now);
  // Primary side: hands on the round record when the shard closed a round
  // (or, with `open`, when requests are batched: before handling a request
  // that is handed on by itself, so backups apply everything in order).
  void ForwardRound(bool open);
  // Primary side: hands the backups the workers whose liveness the shard
  // changed (an eviction, a rejoin) unless the request just handled was
  // handed on (`replayed`: the backups replay the same change with it),
  // after the batched requests before it. Elsewhere the changes are
  // dropped (a backup follows its primary's).
  void ForwardWorkerChanges(bool replayed);
  // Adds the "replication" object (role, epoch, counters) to the stats
  // reply to the request in req_ (out_ from `first`).
  void AddReplicationStats(const std::string& peer, size_t first);
  // Takes Membership's latest view; copies the state to new spares and has
  // Membership list those that installed it.
  void UpdateView();
  // A replica request was refused by this view: reads etcd again (at most
  // once a second, 200 ms at most) and takes the view; true when it did.
  bool RefreshViewForReplica();
  // Primary: a checkpoint of the store, sent to the spare at `endpoint`.
  Status CopyToSpare(const std::string& endpoint);
  // Spare: writes one piece of a snapshot; after the last, installs it.
  void HandleSnapshot(const std::string& peer, Message& msg,
                      const replication::ReplicaMember& sender,
                      std::chrono::steady_clock::time_point now);
  // Replaces the store and the shard with the checkpoint in `staging`.
  Status InstallSnapshot(const std::string& staging,
                         std::chrono::steady_clock::time_point now);
  void SendAll();
  // A freeze past its deadline: adopt or abort as etcd says (see
  // ServerOptions::elastic_etcd_endpoints).
  void ResolveOverdueFreeze(std::chrono::steady_clock::time_point now);

  ServerOptions options_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Shard> shard_;
  std::unique_ptr<ServerSocket> socket_;
  std::unique_ptr<ServerMetrics> metrics_;  // null without a registry
  // Both null in a static fleet. The membership's thread stops before the
  // replicator goes.
  std::unique_ptr<replication::Replicator> replicator_;
  std::unique_ptr<replication::Membership> membership_;
  RequestHeader inner_;  // a kReplicate's request, reused
  // Messages that arrived while the advertised endpoint was probed:
  // handled first by Run().
  std::vector<std::pair<std::string, Message>> early_;
  // A replica with CURVE and an allowed-key list: the list (admins
  // included), checked in Authorize() (see Create()).
  std::set<std::string> allowed_keys_;
  std::unique_ptr<EtcdClient> elastic_etcd_;  // null without endpoints
  std::chrono::steady_clock::time_point next_freeze_check_{};
  std::chrono::steady_clock::time_point next_view_refresh_{};
  // A snapshot being received (spare): its epoch, size and bytes so far.
  uint64_t incoming_epoch_ = 0;
  uint64_t incoming_total_ = 0;
  uint64_t incoming_bytes_ = 0;
  uint64_t incoming_next_id_ = 0;
  // Largest snapshot a spare accepts, bytes.
  static constexpr uint64_t kMaxSnapshotBytes = uint64_t{1} << 40;
  // Reused per message.
  RequestHeader req_;
  // Set by Replicate() when the request in req_ was handed on (batched too).
  bool handed_on_ = false;
  std::vector<ByteView> data_;
  std::vector<OutgoingReply> out_;
  std::vector<Frame> frames_;
};

}  // namespace asyncps::server
