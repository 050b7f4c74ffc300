// ZeroMQ adapter: the one place that catches cppzmq's exceptions.
#include "common/transport.h"

#include <cstring>
#include <zmq.hpp>

namespace asyncps {

namespace {

class ContextImpl : public Context {
 public:
  explicit ContextImpl(int io_threads) : ctx_(io_threads) {}
  zmq::context_t& ctx() { return ctx_; }

 private:
  zmq::context_t ctx_;
};

Status FromZmq(const zmq::error_t& e, const std::string& what) {
  int n = e.num();
  std::string m = what + ": " + e.what();
  if (n == EAGAIN || n == EHOSTUNREACH) return Status::Unavailable(m);
  if (n == EINVAL || n == EPROTONOSUPPORT || n == ENOCOMPATPROTO)
    return Status::InvalidArgument(m);
  if (n == EADDRINUSE || n == EADDRNOTAVAIL) return Status::Unavailable(m);
  if (n == ETERM) return Status::Cancelled(m);
  if (n == EMSGSIZE) return Status::ResourceExhausted(m);
  return Status::Internal(m);
}

std::shared_ptr<ContextImpl> ContextOf(const TransportOptions& o) {
  if (o.context) return std::static_pointer_cast<ContextImpl>(o.context);
  return std::make_shared<ContextImpl>(1);
}

// Frames below this size are copied: a zmq small message is cheaper than a
// free callback and a reference count.
constexpr size_t kCopyBelow = 512;

void ReleaseOwner(void* /*data*/, void* hint) {
  delete static_cast<std::shared_ptr<const void>*>(hint);
}

zmq::message_t ToMessage(Frame& f) {
  if (!f.owner || f.size < kCopyBelow) return zmq::message_t(f.data, f.size);
  auto* hint = new std::shared_ptr<const void>(f.owner);
  return zmq::message_t(const_cast<void*>(f.data), f.size, &ReleaseOwner, hint);
}

void ApplyCommonOptions(zmq::socket_t& s, const TransportOptions& o) {
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::sndhwm, o.hwm);
  s.set(zmq::sockopt::rcvhwm, o.hwm);
  s.set(zmq::sockopt::maxmsgsize, o.max_frame_bytes);
  if (o.socket_buffer_bytes > 0) {
    s.set(zmq::sockopt::sndbuf, o.socket_buffer_bytes);
    s.set(zmq::sockopt::rcvbuf, o.socket_buffer_bytes);
  }
}

// Receives the remaining parts of a message whose first part is `first`.
// Enforces the frame-count and total-size limits by dropping the message.
Status ReceiveRest(zmq::socket_t& s, zmq::message_t&& first,
                   const TransportOptions& o, Message* msg) {
  msg->Clear();
  bool more = first.more();
  int64_t total = static_cast<int64_t>(first.size());
  auto keep = [&](zmq::message_t&& m) {
    auto holder = std::make_shared<zmq::message_t>(std::move(m));
    ByteView v;
    v.data = static_cast<const uint8_t*>(holder->data());
    v.size = holder->size();
    v.owner = std::move(holder);
    msg->frames.push_back(std::move(v));
  };
  keep(std::move(first));
  while (more) {
    zmq::message_t part;
    auto r = s.recv(
        part, zmq::recv_flags::none);  // parts of a message arrive together
    if (!r) return Status::Internal("lost part of a multipart message");
    more = part.more();
    total += static_cast<int64_t>(part.size());
    if (msg->error.ok()) {
      if (msg->frames.size() >= o.max_frames) {
        msg->error =
            Status::ResourceExhausted("message has more than " +
                                      std::to_string(o.max_frames) + " frames");
      } else if (total > o.max_message_bytes) {
        msg->error = Status::ResourceExhausted(
            "message exceeds " + std::to_string(o.max_message_bytes) +
            " bytes");
      }
      if (!msg->error.ok()) {
        msg->frames.resize(1);  // keep the header so the id can be echoed
        continue;
      }
      keep(std::move(part));
    }
  }
  msg->total_bytes = total;
  return Status::OK();
}

Status SendFrames(zmq::socket_t& s, const std::string* peer,
                  std::vector<Frame>& frames) {
  if (frames.empty())
    return Status::InvalidArgument("cannot send an empty message");
  if (peer != nullptr) {
    zmq::message_t id(peer->data(), peer->size());
    auto r = s.send(id, zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    if (!r) return Status::Unavailable("peer queue full");
  }
  for (size_t i = 0; i < frames.size(); ++i) {
    zmq::message_t m = ToMessage(frames[i]);
    auto flags = (i + 1 < frames.size()) ? zmq::send_flags::sndmore
                                         : zmq::send_flags::none;
    // Only the first part may fail for lack of room: the rest always queue.
    auto r = s.send(m, flags | zmq::send_flags::dontwait);
    if (!r) return Status::ResourceExhausted("send queue full");
  }
  return Status::OK();
}

std::string NormaliseEndpoint(const std::string& e) {
  // "tcp://host:0" means any free port, as "tcp://host:*" does for ZeroMQ.
  if (e.size() > 2 && e.compare(e.size() - 2, 2, ":0") == 0 &&
      e.rfind("tcp://", 0) == 0) {
    return e.substr(0, e.size() - 1) + "*";
  }
  return e;
}

class ServerSocketImpl : public ServerSocket {
 public:
  ServerSocketImpl(std::shared_ptr<ContextImpl> ctx, const TransportOptions& o)
      : ctx_(std::move(ctx)),
        options_(o),
        socket_(ctx_->ctx(), zmq::socket_type::router) {}

  Status Init(const std::string& endpoint) {
    try {
      ApplyCommonOptions(socket_, options_);
      socket_.set(zmq::sockopt::router_mandatory, 1);
      if (!options_.curve_secret_key.empty()) {
        socket_.set(zmq::sockopt::curve_server, 1);
        socket_.set(zmq::sockopt::curve_secretkey, options_.curve_secret_key);
      }
      socket_.bind(NormaliseEndpoint(endpoint));
      endpoint_ = socket_.get(zmq::sockopt::last_endpoint);
    } catch (const zmq::error_t& e) {
      return FromZmq(e, "bind " + endpoint);
    }
    return Status::OK();
  }

  const std::string& endpoint() const override { return endpoint_; }

  StatusOr<bool> Receive(std::string* peer, Message* msg,
                         std::chrono::milliseconds timeout) override {
    try {
      zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, timeout) == 0) return false;
      zmq::message_t id;
      auto r = socket_.recv(id, zmq::recv_flags::dontwait);
      if (!r) return false;
      peer->assign(static_cast<const char*>(id.data()), id.size());
      if (!id.more())
        return false;  // identity without a body: nothing to answer
      zmq::message_t first;
      r = socket_.recv(first, zmq::recv_flags::none);
      if (!r) return false;
      RETURN_IF_ERROR(ReceiveRest(socket_, std::move(first), options_, msg));
      return true;
    } catch (const zmq::error_t& e) {
      return FromZmq(e, "receive");
    }
  }

  Status Send(const std::string& peer, std::vector<Frame>& frames) override {
    try {
      return SendFrames(socket_, &peer, frames);
    } catch (const zmq::error_t& e) {
      return FromZmq(e, "send");
    }
  }

 private:
  std::shared_ptr<ContextImpl> ctx_;
  TransportOptions options_;
  zmq::socket_t socket_;
  std::string endpoint_;
};

class ClientSocketImpl : public ClientSocket {
 public:
  ClientSocketImpl(std::shared_ptr<ContextImpl> ctx, const TransportOptions& o)
      : ctx_(std::move(ctx)),
        options_(o),
        socket_(ctx_->ctx(), zmq::socket_type::dealer) {}

  Status Init(const std::string& endpoint) {
    endpoint_ = endpoint;
    try {
      ApplyCommonOptions(socket_, options_);
      socket_.set(zmq::sockopt::reconnect_ivl, 50);
      socket_.set(zmq::sockopt::reconnect_ivl_max, 500);
      if (!options_.curve_server_key.empty()) {
        socket_.set(zmq::sockopt::curve_serverkey, options_.curve_server_key);
        socket_.set(zmq::sockopt::curve_publickey, options_.curve_public_key);
        socket_.set(zmq::sockopt::curve_secretkey, options_.curve_secret_key);
      }
      socket_.connect(endpoint);
    } catch (const zmq::error_t& e) {
      return FromZmq(e, "connect " + endpoint);
    }
    return Status::OK();
  }

  const std::string& endpoint() const override { return endpoint_; }

  Status Send(std::vector<Frame>& frames) override {
    try {
      return SendFrames(socket_, nullptr, frames);
    } catch (const zmq::error_t& e) {
      return FromZmq(e, "send to " + endpoint_);
    }
  }

  StatusOr<bool> Receive(Message* msg,
                         std::chrono::milliseconds timeout) override {
    try {
      zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
      if (timeout.count() != 0 && zmq::poll(&item, 1, timeout) == 0)
        return false;
      zmq::message_t first;
      auto r = socket_.recv(first, zmq::recv_flags::dontwait);
      if (!r) return false;
      RETURN_IF_ERROR(ReceiveRest(socket_, std::move(first), options_, msg));
      return true;
    } catch (const zmq::error_t& e) {
      return FromZmq(e, "receive from " + endpoint_);
    }
  }

 protected:
  void* raw_handle() override { return socket_.handle(); }

 private:
  friend class ClientSocket;
  std::shared_ptr<ContextImpl> ctx_;
  TransportOptions options_;
  zmq::socket_t socket_;
  std::string endpoint_;
};

}  // namespace

std::shared_ptr<Context> Context::Create(int io_threads) {
  return std::make_shared<ContextImpl>(io_threads < 1 ? 1 : io_threads);
}

Frame Frame::Copy(const void* data, size_t size) {
  auto v = std::make_shared<std::vector<uint8_t>>(
      static_cast<const uint8_t*>(data),
      static_cast<const uint8_t*>(data) + size);
  return Frame{v->data(), v->size(), v};
}

Frame Frame::Owned(std::vector<uint8_t>&& bytes) {
  auto v = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  return Frame{v->data(), v->size(), v};
}

Frame Frame::Ref(const BufferPtr& b) { return Frame{b->data(), b->size(), b}; }

Frame Frame::Ref(const void* data, size_t size,
                 std::shared_ptr<const void> owner) {
  return Frame{data, size, std::move(owner)};
}

StatusOr<std::unique_ptr<ServerSocket>> ServerSocket::Bind(
    const std::string& endpoint, const TransportOptions& options) {
  try {
    auto s = std::make_unique<ServerSocketImpl>(ContextOf(options), options);
    RETURN_IF_ERROR(s->Init(endpoint));
    return std::unique_ptr<ServerSocket>(std::move(s));
  } catch (const zmq::error_t& e) {
    return FromZmq(e, "socket");
  }
}

StatusOr<std::unique_ptr<ClientSocket>> ClientSocket::Connect(
    const std::string& endpoint, const TransportOptions& options) {
  try {
    auto s = std::make_unique<ClientSocketImpl>(ContextOf(options), options);
    RETURN_IF_ERROR(s->Init(endpoint));
    return std::unique_ptr<ClientSocket>(std::move(s));
  } catch (const zmq::error_t& e) {
    return FromZmq(e, "socket");
  }
}

StatusOr<int> ClientSocket::PollAny(const std::vector<ClientSocket*>& sockets,
                                    std::chrono::milliseconds timeout) {
  std::vector<zmq::pollitem_t> items(sockets.size());
  for (size_t i = 0; i < sockets.size(); ++i) {
    items[i] = zmq::pollitem_t{sockets[i]->raw_handle(), 0, ZMQ_POLLIN, 0};
  }
  try {
    if (zmq::poll(items.data(), items.size(), timeout) == 0) return -1;
  } catch (const zmq::error_t& e) {
    return FromZmq(e, "poll");
  }
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].revents & ZMQ_POLLIN) return static_cast<int>(i);
  }
  return -1;
}

Status GenerateCurveKeyPair(std::string* public_key, std::string* secret_key) {
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0) {
    return Status::Unimplemented("this libzmq has no CURVE support: " +
                                 std::string(zmq_strerror(zmq_errno())));
  }
  public_key->assign(pub, 40);
  secret_key->assign(sec, 40);
  return Status::OK();
}

}  // namespace asyncps
