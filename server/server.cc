#include "server/server.h"

#include <glog/logging.h>

namespace asyncps::server {
namespace {

uint64_t MessageBytes(const Message& msg) {
  uint64_t bytes = 0;
  for (const ByteView& f : msg.frames) bytes += f.size;
  return bytes;
}

}  // namespace

Server::~Server() = default;

StatusOr<std::unique_ptr<Server>> Server::Create(const ServerOptions& options) {
  std::unique_ptr<Server> s(new Server());
  s->options_ = options;
  if (options.max_message_bytes < 1024) {
    return Status::InvalidArgument("max_message_bytes must be >= 1024");
  }
  if (!options.db_path.empty()) {
    RocksDbStoreOptions so;
    so.path = options.db_path;
    ASSIGN_OR_RETURN(s->store_, OpenRocksDbStore(so));
  }
  ASSIGN_OR_RETURN(s->shard_, Shard::Create(options.shard, s->store_.get(),
                                            std::chrono::steady_clock::now()));
  TransportOptions to;
  to.context = options.context;
  to.max_message_bytes = options.max_message_bytes;
  to.max_frame_bytes = options.max_message_bytes;
  to.curve_secret_key = options.curve_secret_key;
  to.curve_allowed_client_keys = options.curve_allowed_client_keys;
  ASSIGN_OR_RETURN(s->socket_, ServerSocket::Bind(options.endpoint, to));
  if (options.metrics != nullptr) {
    s->metrics_ = std::make_unique<ServerMetrics>(options.metrics,
                                                  options.shard.num_workers);
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
    StatusOr<bool> got = socket_->Receive(&peer, &msg, options_.tick);
    const Clock::time_point now = Clock::now();
    if (!got.ok()) {
      LOG_EVERY_N(ERROR, 100) << "receive: " << got.status().ToString();
    } else if (*got) {
      HandleMessage(peer, msg, now);
    }
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
  if (shard_->shutdown_requested())
    return Status::OK();  // checkpointed by the request
  return shard_->Checkpoint();
}

void Server::HandleMessage(const std::string& peer, Message& msg,
                           std::chrono::steady_clock::time_point now) {
  Status error = msg.error;
  RejectReason reason = RejectReason::kOversize;
  req_.id = 0;
  req_.kind = RequestKind::kHeartbeat;
  if (error.ok()) {
    if (msg.frames.empty()) {
      error = Status::InvalidArgument("empty message");
      reason = RejectReason::kMalformed;
    } else {
      error = DecodeRequest(msg.frames[0].data, msg.frames[0].size,
                            DecodeLimits(), &req_);
      reason = error.code() == StatusCode::kFailedPrecondition
                   ? RejectReason::kVersion
                   : RejectReason::kMalformed;
    }
  }
  if (!error.ok()) {
    shard_->CountRejected(reason);
    OutgoingReply r;
    r.peer = peer;
    r.header.id = req_.id;
    r.header.kind = req_.kind;
    r.header.status = error;
    r.header.shard_version = shard_->shard_version();
    r.header.min_clock = shard_->min_clock();
    out_.push_back(std::move(r));
    if (metrics_) {
      metrics_->OnRequest(req_.kind, peer, req_.id, MessageBytes(msg), now, 0);
    }
    return;
  }
  data_.assign(msg.frames.begin() + 1, msg.frames.end());
  shard_->Handle(peer, req_, data_, now, &out_);
  data_.clear();
  if (metrics_) {
    const double handle_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - now)
            .count();
    metrics_->OnRequest(req_.kind, peer, req_.id, MessageBytes(msg), now,
                        handle_s);
  }
}

void Server::SendAll() {
  for (OutgoingReply& r : out_) {
    frames_.clear();
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
