#include "server/server.h"

#include <glog/logging.h>

#include <algorithm>

namespace asyncps::server {
namespace {

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
  socket_->SetWakeSockets(replicator_->wake_sockets());
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
  ASSIGN_OR_RETURN(s->shard_,
                   Shard::Create(s->options_.shard, s->store_.get(),
                                 std::chrono::steady_clock::now()));
  TransportOptions to;
  to.context = options.context;
  to.max_message_bytes = options.max_message_bytes;
  to.max_frame_bytes = s->options_.max_frame_bytes;
  to.curve_secret_key = options.curve_secret_key;
  to.curve_allowed_client_keys = options.curve_allowed_client_keys;
  if (!to.curve_allowed_client_keys.empty()) {
    // Admins connect too.
    to.curve_allowed_client_keys.insert(to.curve_allowed_client_keys.end(),
                                        options.curve_admin_keys.begin(),
                                        options.curve_admin_keys.end());
  }
  to.curve_identify_clients = !options.curve_secret_key.empty();
  ASSIGN_OR_RETURN(s->socket_, ServerSocket::Bind(options.endpoint, to));
  if (options.metrics != nullptr) {
    s->metrics_ = std::make_unique<ServerMetrics>(options.metrics,
                                                  options.shard.num_workers);
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
    s->replicator_ = std::make_unique<replication::Replicator>(ro);
    ASSIGN_OR_RETURN(s->membership_, replication::Membership::Create(mo));
    s->UpdateView();
  }
  return s;
}

const std::string& Server::endpoint() const { return socket_->endpoint(); }

Status Server::Run(const std::atomic<bool>& stop) {
  using Clock = std::chrono::steady_clock;
  std::string peer;
  Message msg;
  Clock::time_point last_checkpoint = Clock::now();
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
    }
    shard_->Tick(now, &out_);
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
      "machine (peer " + msg.peer_address +
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
  Dispatch(peer, msg, now);
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
  if (req_.kind == RequestKind::kCheckpoint ||
      req_.kind == RequestKind::kShutdown) {
    Status admin = CheckAdmin(msg);
    if (!admin.ok()) {
      LOG_EVERY_N(WARNING, 100) << RequestKindName(req_.kind) << " refused: "
                                << admin.message();
      return Reply(peer, admin, RejectReason::kAdminDenied);
    }
  }
  if (req_.kind == RequestKind::kReplicate) {
    return HandleReplicate(peer, msg, now);
  }
  if (replicator_) {
    std::string redirect;
    Status admitted = replicator_->Admit(req_.kind, now, &redirect);
    if (!admitted.ok()) {
      Reply(peer, admitted, RejectReason::kNotPrimary);
      out_.back().header.redirect = redirect;
      return;
    }
  }
  const size_t first = out_.size();
  data_.assign(msg.frames.begin() + 1, msg.frames.end());
  try {
    shard_->Handle(peer, req_, data_, now, &out_);
    if (replicator_ && replicator_->Replicates(req_.kind))
      Replicate(peer, msg, first);
  } catch (const std::bad_alloc&) {
    // Every allocation a request sizes is checked against the memory
    // budget first; this is the last line if the machine has less memory
    // than the budget assumes.
    LOG(ERROR) << "out of memory handling " << RequestKindName(req_.kind)
               << " " << req_.id << " (lower --memory_budget_mb)";
    Reply(peer, Status::ResourceExhausted("out of memory on the server"),
          RejectReason::kMemoryBudget);
  }
  data_.clear();
}

void Server::Replicate(const std::string& peer, const Message& msg,
                       size_t first) {
  for (size_t i = first; i < out_.size(); ++i) {
    OutgoingReply& r = out_[i];
    if (r.peer != peer || r.header.id != req_.id || r.header.kind != req_.kind)
      continue;
    if (!r.header.status.ok()) return;  // nothing applied: nothing to hand on
    OutgoingReply hold = std::move(r);
    out_.erase(out_.begin() + static_cast<std::ptrdiff_t>(i));
    replicator_->Forward(msg, &hold, &out_);
    return;
  }
}

void Server::HandleReplicate(const std::string& peer, Message& msg,
                             std::chrono::steady_clock::time_point now) {
  if (!replicator_) {
    return Reply(peer,
                 Status::InvalidArgument(
                     "replicate request to a server that is not a replica "
                     "(started without --etcd)"),
                 RejectReason::kNotPrimary);
  }
  Status ok = replicator_->CheckReplicate(req_);
  if (!ok.ok()) return Reply(peer, ok, RejectReason::kNotPrimary);
  if (msg.frames.size() < 2) {
    return Reply(peer, Status::InvalidArgument("replicate without a request"),
                 RejectReason::kMalformed);
  }
  Status decoded = DecodeRequest(msg.frames[1].data, msg.frames[1].size,
                                 DecodeLimits(), &inner_);
  if (decoded.ok() && inner_.kind != RequestKind::kRegister &&
      inner_.kind != RequestKind::kPush && inner_.kind != RequestKind::kClock) {
    decoded = Status::InvalidArgument(
        std::string("a ") + RequestKindName(inner_.kind) +
        " request is not replicated");
  }
  if (!decoded.ok()) {
    return Reply(peer, Status::InvalidArgument("replicated request: " +
                                               decoded.message()),
                 RejectReason::kMalformed);
  }
  // The inner request's replies go to no one: the primary answers the
  // worker. This peer name cannot be a ZeroMQ routing id (those are 5
  // bytes starting with 0, or set by the peer; no peer sets ids here).
  static const std::string kInnerPeer("\x01replicated", 11);
  const size_t first = out_.size();
  data_.assign(msg.frames.begin() + 2, msg.frames.end());
  Status applied;
  try {
    shard_->Handle(kInnerPeer, inner_, data_, now, &out_);
  } catch (const std::bad_alloc&) {
    applied = Status::ResourceExhausted("out of memory on the backup");
  }
  data_.clear();
  for (size_t i = first; i < out_.size();) {
    if (out_[i].peer != kInnerPeer) {
      ++i;
      continue;
    }
    if (!out_[i].header.status.ok() && applied.ok()) {
      applied = Status::Internal("backup could not apply the " +
                                 std::string(RequestKindName(inner_.kind)) +
                                 ": " + out_[i].header.status.ToString());
    }
    out_.erase(out_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  replicator_->CountApplied();
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
