#include "server/loop/server.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/elastic_doc.h"
#include "server/loop/shard_factory.h"
#include "server/loop/trust.h"
#include "server/replication/replica_auth.h"

namespace asyncps::server {
namespace {

// Replies of replicated requests (a backup applying them) go to no one:
// the primary answers the worker. This peer name cannot be a ZeroMQ routing
// id (those are 5 bytes starting with 0, or set by the peer; no peer sets
// ids here).
const std::string kInnerPeer("\x01replicated", 11);

uint64_t MessageBytes(const Message& msg) {
  uint64_t bytes = 0;
  for (const ByteView& f : msg.frames) bytes += f.size;
  return bytes;
}

}  // namespace

Server::~Server() {
  if (membership_) membership_->Stop(/*revoke=*/false);
}

void Server::UpdateView() {
  replication::ReplicaView v;
  membership_->TakeView(&v);
  Status s = replicator_->SetView(v, &out_);
  if (!s.ok()) {
    LOG_EVERY_N(ERROR, 20) << "replica view: " << s.ToString();
  }
  for (const std::string& spare :
       replicator_->TakeJoiners(std::chrono::steady_clock::now())) {
    Status j = CopyToSpare(spare);
    if (!j.ok())
      LOG(ERROR) << "copying to spare " << spare << ": " << j.ToString();
  }
  for (const std::string& joined : replicator_->TakeJoined()) {
    membership_->AddBackup(joined);
  }
  for (const std::string& broken : replicator_->TakeBroken()) {
    membership_->DropBackup(broken, /*silent=*/false);
  }
  for (const std::string& silent : replicator_->TakeSilent()) {
    membership_->DropBackup(silent, /*silent=*/true);
  }
  if (uint64_t epoch =
          replicator_->PrimarySuspected(std::chrono::steady_clock::now())) {
    membership_->SuspectPrimary(epoch);
  }
  socket_->SetWakeSockets(replicator_->wake_sockets());
  shard_->set_capture_rounds(replicator_->aggregating());
  shard_->set_follower(!replicator_->view().primary);
}

Status Server::CopyToSpare(const std::string& endpoint) {
  if (!store_) {
    return Status::FailedPrecondition(
        "re-replication needs a store (--db_path) to copy from");
  }
  // A cut of the whole state, then its files: what the spare opens as its
  // store. Updates handed on from here follow the snapshot on the spare's
  // connection, so it ends up where this shard is.
  RETURN_IF_ERROR(shard_->Checkpoint());
  namespace fs = std::filesystem;
  const std::string dir = options_.db_path + ".export";
  std::error_code ec;
  fs::remove_all(dir, ec);
  Status s = store_->ExportCheckpoint(dir);
  if (s.ok()) s = replicator_->StartJoin(endpoint, dir);
  fs::remove_all(dir, ec);
  // The snapshot restores every worker live: the evicted ones follow.
  if (s.ok()) replicator_->ForwardWorkers(shard_->WorkerStates());
  return s;
}

void Server::HandleSnapshot(const std::string& peer, Message& msg,
                            const replication::ReplicaMember& sender,
                            std::chrono::steady_clock::time_point now) {
  namespace fs = std::filesystem;
  Status ok = replicator_->CheckSnapshot(req_, sender);
  if (!ok.ok() && RefreshViewForReplica())
    ok = replicator_->CheckSnapshot(req_, sender);
  if (!ok.ok()) return Reply(peer, ok, RejectReason::kNotPrimary);
  const std::string& name = req_.snapshot_file;
  // A plain file name: nothing a peer sends may point outside the folder.
  const bool plain = !name.empty() && name.size() <= 255 && name != "." &&
                     name != ".." && name.find('/') == std::string::npos &&
                     name.find('\0') == std::string::npos;
  const uint64_t piece = msg.frames.size() == 2 ? msg.frames[1].size : 0;
  if (!plain || msg.frames.size() != 2 ||
      req_.snapshot_offset > req_.snapshot_file_size ||
      piece > req_.snapshot_file_size - req_.snapshot_offset ||
      req_.snapshot_file_size > req_.snapshot_total_bytes ||
      req_.snapshot_total_bytes > kMaxSnapshotBytes) {
    return Reply(peer,
                 Status::InvalidArgument(
                     "malformed snapshot piece (file '" + name.substr(0, 64) +
                     "', offset " + std::to_string(req_.snapshot_offset) +
                     ", " + std::to_string(piece) + " bytes of " +
                     std::to_string(req_.snapshot_file_size) + ")"),
                 RejectReason::kMalformed);
  }
  if (options_.db_path.empty()) {
    return Reply(peer,
                 Status::FailedPrecondition(
                     "this spare has no store (--db_path) to install into"),
                 RejectReason::kStore);
  }
  const std::string staging = options_.db_path + ".incoming";
  std::error_code ec;
  // The pieces of one snapshot come in order with consecutive ids; any
  // other piece starts a new one (a primary that gave up and began again).
  if (incoming_total_ == 0 || incoming_epoch_ != req_.replicate_epoch ||
      incoming_total_ != req_.snapshot_total_bytes ||
      req_.id != incoming_next_id_) {
    // A new snapshot: start from an empty folder.
    fs::remove_all(staging, ec);
    fs::create_directories(staging, ec);
    incoming_epoch_ = req_.replicate_epoch;
    incoming_total_ = req_.snapshot_total_bytes;
    incoming_bytes_ = 0;
  }
  {
    std::fstream f(staging + "/" + name,
                   std::ios::binary | std::ios::in | std::ios::out);
    if (!f.is_open()) {
      f.open(staging + "/" + name, std::ios::binary | std::ios::out);
    }
    f.seekp(static_cast<std::streamoff>(req_.snapshot_offset));
    if (piece > 0) {
      f.write(reinterpret_cast<const char*>(msg.frames[1].data),
              static_cast<std::streamsize>(piece));
    }
    if (!f) {
      incoming_total_ = 0;
      return Reply(peer, Status::Unavailable("writing " + staging + "/" + name),
                   RejectReason::kStore);
    }
  }
  incoming_bytes_ += piece;
  incoming_next_id_ = req_.id + 1;
  if (!req_.snapshot_last) return Answer(peer, Status::OK());
  if (incoming_bytes_ != incoming_total_) {
    const std::string got = std::to_string(incoming_bytes_);
    incoming_total_ = 0;
    return Reply(peer,
                 Status::Corruption("snapshot incomplete: " + got + " of " +
                                    std::to_string(req_.snapshot_total_bytes) +
                                    " bytes"),
                 RejectReason::kMalformed);
  }
  incoming_total_ = 0;
  Status installed = InstallSnapshot(staging, now);
  if (installed.ok()) {
    replicator_->SetJoined(req_.replicate_epoch, sender);
    LOG(INFO) << "installed the primary's snapshot (" << incoming_bytes_
              << " bytes, epoch " << req_.replicate_epoch << "): version "
              << shard_->shard_version();
  }
  incoming_bytes_ = 0;
  Answer(peer, installed);
}

Status Server::InstallSnapshot(const std::string& staging,
                               std::chrono::steady_clock::time_point now) {
  namespace fs = std::filesystem;
  // This process is a spare: what it held is replaced.
  shard_->FailParked(Status::Cancelled("state replaced by a snapshot"), &out_);
  shard_.reset();
  store_.reset();
  std::error_code ec;
  fs::remove_all(options_.db_path, ec);
  fs::remove_all(options_.db_path + ".cut", ec);
  fs::rename(staging, options_.db_path, ec);
  Status s =
      ec ? Status::Unavailable("installing the snapshot: " + ec.message())
         : Status::OK();
  if (s.ok()) {
    RocksDbStoreOptions so;
    so.path = options_.db_path;
    StatusOr<std::unique_ptr<Store>> store = OpenRocksDbStore(so);
    s = store.status();
    if (s.ok()) store_ = std::move(store).value();
  }
  StatusOr<std::unique_ptr<Shard>> shard =
      CreateShard(options_.shard, store_.get(), now);
  if (s.ok() && !shard.ok()) {
    s = shard.status();
    store_.reset();
    shard = CreateShard(options_.shard, nullptr, now);
  }
  if (!shard.ok()) {
    // Without a store a shard always builds; this is not expected.
    LOG(FATAL) << "cannot rebuild the shard: " << shard.status().ToString();
  }
  shard_ = std::move(shard).value();
  return s;
}

StatusOr<std::unique_ptr<Server>> Server::Create(const ServerOptions& options) {
  std::unique_ptr<Server> s(new Server());
  s->options_ = options;
  if (options.max_message_bytes < 1024) {
    return Status::InvalidArgument("max_message_bytes must be >= 1024");
  }
  if (options.max_frame_bytes < 1024) {
    return Status::InvalidArgument("max_frame_bytes must be >= 1024");
  }
  s->options_.max_frame_bytes =
      std::min(options.max_frame_bytes, options.max_message_bytes);
  s->options_.shard.max_frame_bytes =
      static_cast<uint64_t>(s->options_.max_frame_bytes);
  if (!options.db_path.empty()) {
    RocksDbStoreOptions so;
    so.path = options.db_path;
    ASSIGN_OR_RETURN(s->store_, OpenRocksDbStore(so));
  }
  ASSIGN_OR_RETURN(s->shard_, CreateShard(s->options_.shard, s->store_.get(),
                                          std::chrono::steady_clock::now()));
  TransportOptions to;
  to.context = options.context;
  to.max_message_bytes = options.max_message_bytes;
  to.max_frame_bytes = s->options_.max_frame_bytes;
  to.send_buffer_bytes = options.send_buffer_bytes;
  to.curve_secret_key = options.curve_secret_key;
  to.curve_allowed_client_keys = options.curve_allowed_client_keys;
  if (!to.curve_allowed_client_keys.empty()) {
    // Admins connect too.
    to.curve_allowed_client_keys.insert(to.curve_allowed_client_keys.end(),
                                        options.curve_admin_keys.begin(),
                                        options.curve_admin_keys.end());
  }
  if (!options.replication.etcd_endpoints.empty() &&
      !to.curve_allowed_client_keys.empty()) {
    // A replica checks the allowed list in Authorize() instead of during
    // the handshake: its group's members connect with replica keys made at
    // their start, which it may not have read from etcd yet when they
    // first connect, and libzmq does not reliably try a handshake its ZAP
    // handler refused again (libzmq#3519).
    s->allowed_keys_.insert(to.curve_allowed_client_keys.begin(),
                            to.curve_allowed_client_keys.end());
    to.curve_allowed_client_keys.clear();
  }
  to.curve_identify_clients = !options.curve_secret_key.empty();
  ASSIGN_OR_RETURN(s->socket_, ServerSocket::Bind(options.endpoint, to));
  if (options.metrics != nullptr) {
    s->metrics_ = std::make_unique<ServerMetrics>(options.metrics,
                                                  options.shard.num_workers);
  }
  if (!options.elastic_etcd_endpoints.empty()) {
    EtcdOptions eo;
    eo.endpoints = options.elastic_etcd_endpoints;
    eo.security = options.elastic_etcd_security;
    eo.request_timeout = std::chrono::milliseconds(300);
    ASSIGN_OR_RETURN(s->elastic_etcd_, EtcdClient::Create(eo));
  }
  if (!options.replication.etcd_endpoints.empty()) {
    replication::MembershipOptions mo = options.replication;
    mo.group = options.shard.shard_id;
    mo.groups = options.shard.num_shards;
    if (mo.endpoint.empty()) mo.endpoint = s->socket_->endpoint();
    replication::ReplicatorOptions ro;
    ro.group = mo.group;
    ro.transport.context = options.context;
    ro.transport.max_message_bytes = options.max_message_bytes;
    ro.transport.max_frame_bytes = s->options_.max_frame_bytes;
    ro.suspect_after = options.replica_suspect_after;
    ro.aggregate_rounds = options.replicate_after_aggregation;
    ro.tag_coverage = options.replica_tag_coverage;
    ro.flush_unclocked_after = options.round_record_flush_after;
    if (!options.curve_secret_key.empty()) {
      // A replica key pair of this process's own, never written down: the
      // client key of its connections to its backups, published (public
      // half) in its member record.
      RETURN_IF_ERROR(GenerateCurveKeyPair(&ro.transport.curve_public_key,
                                           &ro.transport.curve_secret_key));
      mo.replica_key = ro.transport.curve_public_key;
      ASSIGN_OR_RETURN(mo.server_key,
                       DeriveCurvePublicKey(options.curve_secret_key));
    } else if (options.replica_secret.empty()) {
      mo.group_secret_in_etcd = true;
    }
    if (options.advertise_probe_timeout.count() > 0) {
      RETURN_IF_ERROR(s->ProbeAdvertisedEndpoint(mo.endpoint, ro.transport)
                          .WithContext("this replica's advertised endpoint " +
                                       mo.endpoint));
    }
    ASSIGN_OR_RETURN(s->membership_, replication::Membership::Create(mo));
    ro.name = s->membership_->name();
    ro.incarnation = s->membership_->incarnation();
    if (options.curve_secret_key.empty()) {
      ro.secret = options.replica_secret.empty()
                      ? s->membership_->group_secret()
                      : options.replica_secret;
    }
    ASSIGN_OR_RETURN(s->replicator_, replication::Replicator::Create(ro));
    // A backup until the layout names it the primary: it evicts no worker
    // by itself (see Shard::set_follower), its primary tells it whom.
    s->shard_->set_follower(true);
    s->shard_->set_log_worker_changes(true);
    s->UpdateView();
  }
  return s;
}

const std::string& Server::endpoint() const { return socket_->endpoint(); }

namespace {

// An endpoint others can connect to: tcp://host:port (port 1..65535),
// ipc://path or inproc://name.
Status CheckConnectable(const std::string& e) {
  const auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("'" + e + "' " + why);
  };
  if (e.rfind("ipc://", 0) == 0 || e.rfind("inproc://", 0) == 0) {
    return e.size() > e.find("://") + 3 ? Status::OK() : bad("names nothing");
  }
  if (e.rfind("tcp://", 0) != 0)
    return bad("is not tcp://host:port, ipc://path or inproc://name");
  const size_t colon = e.rfind(':');
  const std::string host = e.substr(6, colon - 6), port = e.substr(colon + 1);
  if (colon < 6 || host.empty() || host == "*")
    return bad("has no host others can reach");
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port) < 1 || std::stoi(port) > 65535)
    return bad("has no port in 1..65535");
  return Status::OK();
}

}  // namespace

Status Server::ProbeAdvertisedEndpoint(const std::string& endpoint,
                                       const TransportOptions& transport) {
  RETURN_IF_ERROR(CheckConnectable(endpoint));
  TransportOptions to = transport;
  if (!options_.curve_secret_key.empty()) {
    ASSIGN_OR_RETURN(to.curve_server_key,
                     DeriveCurvePublicKey(options_.curve_secret_key));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ClientSocket> c,
                   ClientSocket::Connect(endpoint, to));
  // A probe no request can be mistaken for (it does not decode as one), with
  // a random part: only this process's socket can show it back.
  ASSIGN_OR_RETURN(std::string nonce, replication::RandomBytes(16));
  const std::string probe =
      "asyncps advertised-endpoint probe " + replication::SecretToHex(nonce);
  std::vector<Frame> frames{Frame::Copy(probe.data(), probe.size())};
  RETURN_IF_ERROR(c->Send(frames));
  const auto until =
      std::chrono::steady_clock::now() + options_.advertise_probe_timeout;
  while (std::chrono::steady_clock::now() < until) {
    std::string peer;
    Message msg;
    StatusOr<bool> got =
        socket_->Receive(&peer, &msg, std::chrono::milliseconds(20));
    if (!got.ok() || !*got) continue;
    if (msg.frames.size() == 1 && msg.frames[0].size == probe.size() &&
        std::memcmp(msg.frames[0].data, probe.data(), probe.size()) == 0)
      return Status::OK();
    early_.emplace_back(std::move(peer), std::move(msg));
  }
  return Status::InvalidArgument(
      "a probe sent there did not reach this process in " +
      std::to_string(options_.advertise_probe_timeout.count()) +
      " ms (bound at " + socket_->endpoint() +
      "): fix --advertise_endpoint (other replicas and workers connect there)");
}

void Server::ResolveOverdueFreeze(std::chrono::steady_clock::time_point now) {
  if (!shard_->FreezeOverdue(now) || now < next_freeze_check_) return;
  next_freeze_check_ = now + std::chrono::milliseconds(500);
  const uint64_t toward = shard_->freeze_epoch();
  if (!elastic_etcd_) {
    LOG_EVERY_N(ERROR, 20) << "elastic: frozen toward epoch " << toward
                           << " past the deadline and no etcd to ask "
                              "(--elastic_etcd): staying frozen; end the "
                              "change with ps_ctl";
    return;
  }
  StatusOr<std::optional<EtcdKeyValue>> kv =
      elastic_etcd_->Get(options_.elastic_prefix + "/elastic");
  if (!kv.ok()) {
    LOG_EVERY_N(WARNING, 20) << "elastic: frozen past the deadline, etcd "
                                "unreachable (staying frozen): "
                             << kv.status().ToString();
    return;
  }
  RequestHeader req;
  req.kind = RequestKind::kMigrate;
  req.rank = -1;
  req.id = 1;
  uint64_t committed = 0;
  if (kv->has_value()) {
    StatusOr<ElasticDoc> doc = ElasticDoc::FromJson((*kv)->value);
    if (!doc.ok()) {
      LOG_EVERY_N(ERROR, 20) << "elastic: the document in etcd is not one: "
                             << doc.status().ToString();
      return;
    }
    committed = doc->epoch;
    if (committed >= toward) {
      req.migrate_op = MigrateOp::kAdopt;
      req.migrate_epoch = committed;
      req.migrate_doc = (*kv)->value;
    }
  }
  if (committed < toward) {
    req.migrate_op = MigrateOp::kAbort;
    req.migrate_epoch = toward;
  }
  LOG(WARNING)
      << "elastic: no adopt or abort before the deadline; etcd holds epoch "
      << committed << ": "
      << (committed >= toward ? "adopting it" : "aborting");
  std::vector<OutgoingReply> replies;
  shard_->Handle(std::string(), req, {}, now, &replies);
  for (OutgoingReply& r : replies) {
    if (r.peer.empty()) {
      if (!r.header.status.ok())
        LOG(ERROR) << "elastic: " << r.header.status.ToString();
      continue;  // our own request's reply
    }
    out_.push_back(std::move(r));
  }
}

Status Server::Run(const std::atomic<bool>& stop) {
  using Clock = std::chrono::steady_clock;
  std::string peer;
  Message msg;
  Clock::time_point last_checkpoint = Clock::now();
  // What arrived while the advertised endpoint was probed.
  for (auto& [p, m] : early_) {
    if (membership_) UpdateView();
    HandleMessage(p, m, Clock::now());
    SendAll();
  }
  early_.clear();
  while (!stop.load(std::memory_order_relaxed) &&
         !shard_->shutdown_requested()) {
    msg.Clear();
    if (membership_) UpdateView();
    StatusOr<bool> got = socket_->Receive(&peer, &msg, options_.tick);
    const Clock::time_point now = Clock::now();
    if (!got.ok()) {
      LOG_EVERY_N(ERROR, 100) << "receive: " << got.status().ToString();
    } else if (*got) {
      HandleMessage(peer, msg, now);
    }
    if (replicator_) replicator_->Poll(&out_);
    for (const std::string& e : socket_->TakeSecurityEvents()) {
      LOG(WARNING) << "security: " << e;
      // A client key refused: perhaps a replica whose member record this
      // process has not read yet (its retry comes in ~100 ms).
      if (membership_ && e.find("refused") != std::string::npos)
        membership_->Wake();
    }
    shard_->Tick(now, &out_);
    ResolveOverdueFreeze(now);
    if (replicator_) {
      ForwardRound(/*open=*/false);              // closed by an eviction
      ForwardWorkerChanges(/*replayed=*/false);  // the eviction
      // A worker waiting for a push reply before its clock (a rerouted
      // push, elastic change): the open round's record releases it.
      if (replicator_->RankAwaitsClock(now)) ForwardRound(/*open=*/true);
    }
    SendAll();
    if (metrics_) metrics_->Publish(*shard_, now);
    if (options_.checkpoint_every.count() > 0 && store_ &&
        now - last_checkpoint >= options_.checkpoint_every) {
      Status s = shard_->Checkpoint();
      if (!s.ok()) LOG(ERROR) << s.ToString();
      last_checkpoint = now;
    }
  }
  shard_->FailParked(Status::Cancelled("server shutting down"), &out_);
  SendAll();
  // A clean stop hands the group over at once instead of after the TTL.
  if (membership_) membership_->Stop(/*revoke=*/true);
  if (shard_->shutdown_requested())
    return Status::OK();  // checkpointed by the request
  return shard_->Checkpoint();
}

namespace {

// Loopback as ZeroMQ reports it ("127.x.y.z", "::1", "::ffff:127.x.y.z"),
// or no address at all (inproc, ipc: this machine).
bool IsLoopback(const std::string& address) {
  if (address.empty() || address == "::1") return true;
  // ipc:// peers are on this machine by definition; ZeroMQ names them
  // "localhost:<uid>:<gid>:<pid>"-style (a TCP peer is always numeric).
  if (address.rfind("localhost:", 0) == 0) return true;
  std::string a = address;
  if (a.rfind("::ffff:", 0) == 0) a = a.substr(7);
  return a.rfind("127.", 0) == 0;
}

}  // namespace

Status Server::CheckAdmin(const Message& msg) const {
  if (!options_.curve_secret_key.empty()) {
    for (const std::string& k : options_.curve_admin_keys) {
      if (k == msg.client_key) return Status::OK();
    }
    return Status::InvalidArgument(
        "admin requests (checkpoint, shutdown) need an admin key: this "
        "client's CURVE key is not in the server's --curve_admin_clients");
  }
  if (options_.allow_remote_admin || IsLoopback(msg.peer_address)) {
    return Status::OK();
  }
  return Status::InvalidArgument(
      "admin requests (checkpoint, shutdown) are accepted only from this "
      "machine (peer " +
      msg.peer_address +
      "); start the server with --allow_remote_admin or CURVE admin keys");
}

void Server::Reply(const std::string& peer, const Status& error,
                   RejectReason reason) {
  shard_->CountRejected(reason);
  Answer(peer, error);
}

void Server::Answer(const std::string& peer, const Status& status) {
  OutgoingReply r;
  r.peer = peer;
  r.header.id = req_.id;
  r.header.kind = req_.kind;
  r.header.status = status;
  r.header.shard_version = shard_->shard_version();
  r.header.min_clock = shard_->min_clock();
  out_.push_back(std::move(r));
}

void Server::HandleMessage(const std::string& peer, Message& msg,
                           std::chrono::steady_clock::time_point now) {
  handed_on_ = false;
  Dispatch(peer, msg, now);
  if (replicator_) ForwardWorkerChanges(handed_on_);
  if (metrics_) {
    // Rejected requests count under the kind their header claimed
    // (heartbeat when it did not decode).
    const double handle_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - now)
            .count();
    metrics_->OnRequest(req_.kind, peer, req_.id, MessageBytes(msg), now,
                        handle_s);
  }
}

void Server::Dispatch(const std::string& peer, Message& msg,
                      std::chrono::steady_clock::time_point now) {
  req_.id = 0;
  req_.kind = RequestKind::kHeartbeat;
  if (msg.frames.empty()) {
    return Reply(peer, Status::InvalidArgument("empty message"),
                 RejectReason::kMalformed);
  }
  Status decoded = DecodeRequest(msg.frames[0].data, msg.frames[0].size,
                                 DecodeLimits(), &req_);
  if (!msg.error.ok()) {
    // Too large or too many frames: the frames are gone, the header (when it
    // decodes) names the request, so its sender gets a final answer instead
    // of resending something that can never be accepted.
    return Reply(peer,
                 Status::InvalidArgument(
                     msg.error.message() +
                     " (this server's --max_message_bytes / frame limits)"),
                 RejectReason::kOversize);
  }
  if (!decoded.ok()) {
    return Reply(peer, decoded,
                 decoded.code() == StatusCode::kFailedPrecondition
                     ? RejectReason::kVersion
                     : RejectReason::kMalformed);
  }
  replication::ReplicaMember sender;
  RejectReason reason = RejectReason::kOther;
  Status trusted = Authorize(msg, &sender, &reason);
  if (!trusted.ok()) {
    LOG_EVERY_N(WARNING, 100)
        << RequestKindName(req_.kind) << " refused: " << trusted.message();
    return Reply(peer, trusted, reason);
  }
  if (req_.kind == RequestKind::kReplicate) {
    return HandleReplicate(peer, msg, sender, now);
  }
  if (req_.kind == RequestKind::kSnapshot) {
    return HandleSnapshot(peer, msg, sender, now);
  }
  if (replicator_) {
    std::string redirect;
    Status admitted = replicator_->Admit(req_.kind, now, &redirect);
    if (!admitted.ok()) {
      shard_->NoteRefusedPush(req_);
      Reply(peer, admitted, RejectReason::kNotPrimary);
      out_.back().header.redirect = redirect;
      return;
    }
  }
  if (replicator_ && replicator_->Replicates(req_) &&
      !replicator_->Batches(req_, shard_->AggregatesRounds())) {
    // Handed on by itself: the batched pushes and clocks before it go
    // first, so the backups apply everything in this process's order.
    ForwardRound(/*open=*/true);
  }
  const size_t first = out_.size();
  data_.assign(msg.frames.begin() + 1, msg.frames.end());
  try {
    shard_->Handle(peer, req_, data_, now, &out_);
    if (replicator_) Replicate(peer, msg, first, now);
    if (replicator_ && req_.kind == RequestKind::kStats)
      AddReplicationStats(peer, first);
  } catch (const std::bad_alloc&) {
    // Every allocation a request sizes is checked against the memory
    // budget first; this is the last line if the machine has less memory
    // than the budget assumes.
    LOG(ERROR) << "out of memory handling " << RequestKindName(req_.kind) << " "
               << req_.id << " (lower --memory_budget_mb)";
    Reply(peer, Status::ResourceExhausted("out of memory on the server"),
          RejectReason::kMemoryBudget);
  }
  data_.clear();
}

bool Server::RefreshViewForReplica() {
  // A replica request this view refuses may come from a layout or member
  // this process has not read yet (a new primary's first update races the
  // backup's own read). Read etcd once, at most every second and for at
  // most 200 ms: a sender that keeps getting refused cannot stall the loop.
  const auto now = std::chrono::steady_clock::now();
  if (!membership_ || now < next_view_refresh_) return false;
  next_view_refresh_ = now + std::chrono::seconds(1);
  if (!membership_->AwaitStep(std::chrono::milliseconds(200))) return false;
  UpdateView();
  return true;
}

Status Server::Authorize(Message& msg, replication::ReplicaMember* sender,
                         RejectReason* reason) {
  const Role role = RequiredRole(req_);
  if (!allowed_keys_.empty() && role != Role::kPrimary &&
      allowed_keys_.count(msg.client_key) == 0) {
    *reason = RejectReason::kUntrusted;
    return Status::PermissionDenied(
        "this client's CURVE key is not in the server's "
        "--curve_allowed_clients");
  }
  switch (role) {
    case Role::kAnyone:
      return Status::OK();
    case Role::kAdmin:
      *reason = RejectReason::kAdminDenied;
      return CheckAdmin(msg);
    case Role::kPrimary:
      if (!replicator_) {
        *reason = RejectReason::kNotPrimary;
        return Status::InvalidArgument(std::string(RequestKindName(req_.kind)) +
                                       " request to a server that is not a "
                                       "replica (started without --etcd)");
      }
      *reason = RejectReason::kUntrusted;
      Status s = replicator_->Authenticate(&msg, req_, sender);
      // With CURVE a key no member record of this view holds may be a
      // member's this process has not read yet (one that just started).
      if (!s.ok() && !msg.client_key.empty() && RefreshViewForReplica())
        s = replicator_->Authenticate(&msg, req_, sender);
      return s;
  }
  return Status::Internal("unknown role");
}

void Server::AddReplicationStats(const std::string& peer, size_t first) {
  for (size_t i = first; i < out_.size(); ++i) {
    OutgoingReply& r = out_[i];
    if (r.peer != peer || r.header.id != req_.id || !r.header.status.ok())
      continue;
    nlohmann::json j = nlohmann::json::parse(r.header.text, nullptr, false);
    if (!j.is_object()) return;
    const replication::ReplicaView& v = replicator_->view();
    const replication::ReplicatorCounters& c = replicator_->counters();
    const replication::MembershipCounters& m = membership_->counters();
    j["replication"] = {{"name", membership_->name()},
                        {"epoch", v.epoch},
                        {"role", v.primary  ? "primary"
                                 : v.backup ? "backup"
                                            : "spare"},
                        {"primary", v.primary_endpoint},
                        {"backups", v.backup_endpoints},
                        {"spares", v.spare_endpoints},
                        {"held_replies", replicator_->num_held()},
                        {"forwarded", c.forwarded},
                        {"acked", c.acked},
                        {"applied", c.applied},
                        {"refused_stale", c.refused_stale},
                        {"refused_sender", c.refused_sender},
                        {"backup_connect_errors", c.backup_connect_errors},
                        {"backup_errors", c.backup_errors},
                        {"dropped_held", c.dropped_held},
                        {"refused_not_primary", c.refused_not_primary},
                        {"refused_no_lease", c.refused_no_lease},
                        {"view_changes", c.view_changes},
                        {"snapshots_sent", c.snapshots_sent},
                        {"snapshot_bytes_sent", c.snapshot_bytes_sent},
                        {"spares_joined", c.spares_joined},
                        {"snapshots_failed", c.snapshots_failed},
                        {"records_forwarded", c.records_forwarded},
                        {"batched", c.batched},
                        {"records_applied", c.records_applied},
                        {"liveness_forwarded", c.liveness_forwarded},
                        {"promotions", m.promotions.load()},
                        {"suspicions", m.suspicions.load()},
                        {"backups_dropped", m.backups_dropped.load()},
                        {"backups_added", m.backups_added.load()},
                        {"keepalive_failures", m.keepalive_failures.load()},
                        {"lease_renewals", m.lease_renewals.load()},
                        {"cas_conflicts", m.cas_conflicts.load()},
                        {"etcd_errors", m.etcd_errors.load()}};
    r.header.text = j.dump();
    return;
  }
}

void Server::Replicate(const std::string& peer, const Message& msg,
                       size_t first,
                       std::chrono::steady_clock::time_point now) {
  const bool batch = replicator_->Batches(req_, shard_->AggregatesRounds());
  for (size_t i = first; replicator_->Replicates(req_) && i < out_.size();
       ++i) {
    OutgoingReply& r = out_[i];
    if (r.peer != peer || r.header.id != req_.id || r.header.kind != req_.kind)
      continue;
    if (!r.header.status.ok()) break;  // nothing applied: nothing to hand on
    OutgoingReply hold = std::move(r);
    out_.erase(out_.begin() + static_cast<std::ptrdiff_t>(i));
    handed_on_ = true;
    if (batch) {
      replicator_->Batch(msg, req_, &hold, now);
    } else {
      replicator_->Forward(msg, &hold, &out_);
    }
    break;
  }
  ForwardRound(/*open=*/false);  // a round this request closed
}

void Server::ForwardRound(bool open) {
  RoundSums sums;
  if (!shard_->TakeRoundSums(open && replicator_->num_batched() > 0, &sums))
    return;
  replicator_->ForwardRound(std::move(sums), &out_);
}

void Server::ForwardWorkerChanges(bool replayed) {
  std::vector<WorkerLiveness> states;
  if (!shard_->TakeWorkerChanges(&states) || replayed ||
      !replicator_->view().primary)
    return;
  ForwardRound(/*open=*/true);  // what was batched before the change
  replicator_->ForwardWorkers(std::move(states));
}

void Server::HandleReplicate(const std::string& peer, Message& msg,
                             const replication::ReplicaMember& sender,
                             std::chrono::steady_clock::time_point now) {
  Status ok = replicator_->CheckReplicate(req_, sender);
  if (!ok.ok() && RefreshViewForReplica())
    ok = replicator_->CheckReplicate(req_, sender);
  if (!ok.ok()) return Reply(peer, ok, RejectReason::kNotPrimary);
  if (!req_.replicate_workers.empty()) {
    // A liveness record: the primary's evictions and rejoins.
    if (req_.replicate_aggregate || msg.frames.size() > 1) {
      return Reply(
          peer,
          Status::InvalidArgument(
              "a replicated liveness record carries worker states only"),
          RejectReason::kMalformed);
    }
    Status set = shard_->SetWorkerStates(req_.replicate_workers, now, &out_);
    replicator_->CountApplied(/*record=*/false);
    return Answer(peer, set);
  }
  if (req_.replicate_aggregate) return HandleRoundRecord(peer, msg, now);
  if (msg.frames.size() < 2) return Answer(peer, Status::OK());  // a ping
  Status decoded = DecodeRequest(msg.frames[1].data, msg.frames[1].size,
                                 DecodeLimits(), &inner_);
  // Judged as if it came alone, from the primary that relays it.
  if (decoded.ok()) decoded = RelayedRequestOk(inner_);
  if (!decoded.ok()) {
    return Reply(
        peer,
        Status::InvalidArgument("replicated request: " + decoded.message()),
        RejectReason::kMalformed);
  }
  const size_t first = out_.size();
  data_.assign(msg.frames.begin() + 2, msg.frames.end());
  Status applied;
  try {
    shard_->Handle(kInnerPeer, inner_, data_, now, &out_);
  } catch (const std::bad_alloc&) {
    applied = Status::ResourceExhausted("out of memory on the backup");
  }
  data_.clear();
  TakeInnerReplies(first, &applied);
  replicator_->CountApplied(/*record=*/false);
  Answer(peer, applied);
}

void Server::TakeInnerReplies(size_t first, Status* applied) {
  for (size_t i = first; i < out_.size();) {
    if (out_[i].peer != kInnerPeer) {
      ++i;
      continue;
    }
    if (!out_[i].header.status.ok() && applied->ok()) {
      *applied =
          Status::Internal("backup could not apply the " +
                           std::string(RequestKindName(out_[i].header.kind)) +
                           " " + std::to_string(out_[i].header.id) + ": " +
                           out_[i].header.status.ToString());
    }
    out_.erase(out_.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

void Server::HandleRoundRecord(const std::string& peer, Message& msg,
                               std::chrono::steady_clock::time_point now) {
  // Frames: the kReplicate header, the batched headers, the chunk ids, the
  // sums (common/protocol.capnp, Replicate).
  const size_t n = req_.replicate_requests;
  if (msg.frames.size() < n + 2) {
    return Reply(peer,
                 Status::InvalidArgument(
                     "round record of " + std::to_string(n) + " requests has " +
                     std::to_string(msg.frames.size()) + " frames"),
                 RejectReason::kMalformed);
  }
  std::vector<RequestHeader> inner(n);
  for (size_t i = 0; i < n; ++i) {
    Status d = DecodeRequest(msg.frames[i + 1].data, msg.frames[i + 1].size,
                             DecodeLimits(), &inner[i]);
    if (d.ok()) d = RelayedRequestOk(inner[i]);
    if (d.ok() &&
        !(inner[i].kind == RequestKind::kClock ||
          (inner[i].kind == RequestKind::kPush && inner[i].rows.empty())))
      d = Status::InvalidArgument(
          "a round record carries pushes and clocks only");
    if (!d.ok()) {
      return Reply(peer,
                   Status::InvalidArgument("round record: " + d.message()),
                   RejectReason::kMalformed);
    }
  }
  data_.assign(msg.frames.begin() + 1 + static_cast<std::ptrdiff_t>(n),
               msg.frames.end());
  // The sums first (replayed pushes add nothing), then the headers in the
  // primary's order, then the round the primary moved to.
  Status applied = shard_->InstallRoundSums(data_);
  data_.clear();
  const size_t first = out_.size();
  shard_->set_replay_headers(true);
  for (size_t i = 0; applied.ok() && i < n; ++i) {
    try {
      shard_->Handle(kInnerPeer, inner[i], {}, now, &out_);
    } catch (const std::bad_alloc&) {
      applied = Status::ResourceExhausted("out of memory on the backup");
    }
  }
  shard_->set_replay_headers(false);
  if (applied.ok()) applied = shard_->CatchUpRound(req_.replicate_round);
  TakeInnerReplies(first, &applied);
  replicator_->CountApplied(/*record=*/true);
  Answer(peer, applied);
}

void Server::SendAll() {
  for (OutgoingReply& r : out_) {
    frames_.clear();
    r.header.max_request_bytes =
        static_cast<uint64_t>(options_.max_message_bytes);
    r.header.max_frame_bytes = static_cast<uint64_t>(options_.max_frame_bytes);
    if (replicator_) r.header.epoch = replicator_->view().epoch;
    frames_.push_back(Frame::Owned(EncodeReply(r.header)));
    for (ByteView& v : r.frames)
      frames_.push_back(Frame::Ref(v.data, v.size, std::move(v.owner)));
    if (metrics_) {
      uint64_t bytes = 0;
      for (const Frame& f : frames_) bytes += f.size;
      metrics_->OnReply(r.peer, r.header, bytes,
                        std::chrono::steady_clock::now());
    }
    Status s = socket_->Send(r.peer, frames_);
    if (!s.ok()) {
      LOG_EVERY_N(WARNING, 100)
          << "reply " << r.header.id << ": " << s.ToString();
    }
  }
  out_.clear();
  frames_.clear();
}

}  // namespace asyncps::server
