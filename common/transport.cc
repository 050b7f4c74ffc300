// ZeroMQ adapter: the one place that catches cppzmq's exceptions.
#include "common/transport.h"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <atomic>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <set>
#include <thread>
#include <zmq.hpp>

#include "common/mutex.h"

namespace asyncps {

namespace {

// Security events of one server socket, written by the ZAP thread and the
// socket's own monitor, drained by TakeSecurityEvents().
class SecurityLog {
 public:
  void Add(std::string line) {
    MutexLock l(&mu_);
    if (lines_.size() >= kMaxLines) {
      ++dropped_;
      return;
    }
    lines_.push_back(std::move(line));
  }
  std::vector<std::string> Take() {
    MutexLock l(&mu_);
    std::vector<std::string> out(lines_.begin(), lines_.end());
    lines_.clear();
    if (dropped_ > 0) {
      out.push_back(std::to_string(dropped_) + " more security events dropped");
      dropped_ = 0;
    }
    return out;
  }

 private:
  static constexpr size_t kMaxLines = 1000;
  Mutex mu_;
  std::deque<std::string> lines_ GUARDED_BY(mu_);
  uint64_t dropped_ GUARDED_BY(mu_) = 0;
};

// What the ZAP handler enforces for one server socket (its ZAP domain).
struct ZapPolicy {
  std::set<std::string> allowed;  // Z85 client public keys
  bool allow_any = false;         // accept every key (to learn it)
  std::shared_ptr<SecurityLog> log;
};

class ContextImpl : public Context {
 public:
  explicit ContextImpl(int io_threads) : ctx_(io_threads) {}
  ~ContextImpl() override {
    stop_.store(true);
    if (zap_thread_.joinable()) zap_thread_.join();
  }
  zmq::context_t& ctx() { return ctx_; }

  // Installs `policy` for `domain`, starting the ZAP handler thread on first
  // use (it binds inproc://zeromq.zap.01, which makes libzmq consult it for
  // every CURVE handshake of this context).
  Status AddZapDomain(const std::string& domain,
                      std::shared_ptr<const ZapPolicy> policy) {
    MutexLock l(&mu_);
    if (!zap_thread_.joinable()) {
      // Bind here, not in the thread, so a failure is reported to the caller
      // and no handshake can happen before the handler exists.
      try {
        zap_socket_ =
            std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::rep);
        zap_socket_->set(zmq::sockopt::linger, 0);
        zap_socket_->bind("inproc://zeromq.zap.01");
      } catch (const zmq::error_t& e) {
        zap_socket_.reset();
        return Status::Internal(std::string("ZAP handler: ") + e.what());
      }
      zap_thread_ = std::thread([this] { ZapLoop(); });
    }
    policies_[domain] = std::move(policy);
    return Status::OK();
  }
  void RemoveZapDomain(const std::string& domain) {
    MutexLock l(&mu_);
    policies_.erase(domain);
  }
  uint64_t NextId() { return next_id_.fetch_add(1); }

 private:
  // Answers ZAP requests (RFC 27): version, request id, domain, address,
  // identity, mechanism, credentials -> version, request id, status code,
  // status text, user id, metadata.
  void ZapLoop() {
    zmq::socket_t& s = *zap_socket_;
    while (!stop_.load()) {
      try {
        zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
        if (zmq::poll(&item, 1, std::chrono::milliseconds(100)) == 0) continue;
        std::vector<zmq::message_t> req;
        do {
          zmq::message_t m;
          if (!s.recv(m, zmq::recv_flags::none)) break;
          req.push_back(std::move(m));
        } while (req.back().more());
        auto str = [&](size_t i) {
          return i < req.size() ? req[i].to_string() : std::string();
        };
        std::string code = "400", text = "malformed ZAP request";
        std::string key;
        if (req.size() >= 7 && str(5) == "CURVE" && req[6].size() == 32) {
          char z85[41] = {0};
          zmq_z85_encode(z85, static_cast<const uint8_t*>(req[6].data()), 32);
          key = z85;
          std::shared_ptr<const ZapPolicy> policy;
          {
            MutexLock l(&mu_);
            auto it = policies_.find(str(2));
            if (it != policies_.end()) policy = it->second;
          }
          if (!policy) {
            // A CURVE socket of this context without an allowed list (libzmq
            // asks the handler about every CURVE handshake once one exists).
            code = "200";
            text = "OK";
          } else if (policy->allow_any || policy->allowed.count(key)) {
            code = "200";
            text = "OK";
          } else {
            text = "client key not allowed";
            policy->log->Add("CURVE client " + key + " from " + str(3) +
                             " refused: key not in the allowed list");
          }
        }
        std::string ver = str(0), id = str(1);
        s.send(zmq::buffer(ver), zmq::send_flags::sndmore);
        s.send(zmq::buffer(id), zmq::send_flags::sndmore);
        s.send(zmq::buffer(code), zmq::send_flags::sndmore);
        s.send(zmq::buffer(text), zmq::send_flags::sndmore);
        s.send(zmq::buffer(code == "200" ? key : std::string()),
               zmq::send_flags::sndmore);
        s.send(zmq::message_t(), zmq::send_flags::none);
      } catch (const zmq::error_t&) {
        if (stop_.load()) break;
      }
    }
    zap_socket_.reset();  // closed by the thread that used it
  }

  zmq::context_t ctx_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> next_id_{0};
  Mutex mu_;
  std::map<std::string, std::shared_ptr<const ZapPolicy>> policies_
      GUARDED_BY(mu_);
  std::unique_ptr<zmq::socket_t> zap_socket_;  // used by zap_thread_
  std::thread zap_thread_;
};

// Checks that `key` is 40 characters of valid Z85 (a 32-byte key).
Status CheckZ85Key(const std::string& key, const std::string& what) {
  uint8_t bin[32];
  if (key.size() != 40 || zmq_z85_decode(bin, key.c_str()) == nullptr) {
    return Status::InvalidArgument(what +
                                   " is not a 40-character Z85 CURVE key");
  }
  return Status::OK();
}

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

// ThreadSanitizer cannot see libzmq's synchronisation (Debian's libzmq is
// not instrumented): tell it that everything a thread did before sending a
// message happens before whatever the receiving thread does after receiving.
#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
char tsan_handoff;  // the address both sides synchronise on
inline void HandoffRelease() { __tsan_release(&tsan_handoff); }
inline void HandoffAcquire() { __tsan_acquire(&tsan_handoff); }
#else
inline void HandoffRelease() {}
inline void HandoffAcquire() {}
#endif

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
  // ZeroMQ sets SO_SNDBUF on every TCP connection the socket makes or takes.
  if (o.send_buffer_bytes > 0) s.set(zmq::sockopt::sndbuf, o.send_buffer_bytes);
}

// Receives the remaining parts of a message whose first part is `first`.
// Enforces the frame-count and total-size limits by dropping the message.
Status ReceiveRest(zmq::socket_t& s, zmq::message_t&& first,
                   const TransportOptions& o, Message* msg) {
  HandoffAcquire();
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
  // Connection metadata, from any frame of the message.
  if (const char* a = zmq_msg_gets(first.handle(), "Peer-Address")) {
    msg->peer_address = a;
  }
  if (const char* u = zmq_msg_gets(first.handle(), "User-Id")) {
    msg->client_key = u;
  }
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
    HandoffRelease();
    auto r = s.send(id, zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    if (!r) return Status::Unavailable("peer queue full");
  }
  for (size_t i = 0; i < frames.size(); ++i) {
    zmq::message_t m = ToMessage(frames[i]);
    auto flags = (i + 1 < frames.size()) ? zmq::send_flags::sndmore
                                         : zmq::send_flags::none;
    // Only the first part may fail for lack of room: the rest always queue.
    HandoffRelease();  // after the bytes are written, before they leave
    auto r = s.send(m, flags | zmq::send_flags::dontwait);
    if (!r) return Status::ResourceExhausted("send queue full");
  }
  return Status::OK();
}

// poll()'s timeout: negative waits without end, as zmq_poll's does.
int PollMillis(std::chrono::milliseconds timeout) {
  if (timeout.count() < 0) return -1;
  return static_cast<int>(std::min<int64_t>(timeout.count(), INT_MAX));
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

  ~ServerSocketImpl() override {
    if (!zap_domain_.empty()) ctx_->RemoveZapDomain(zap_domain_);
  }

  Status Init(const std::string& endpoint) {
    const bool curve = !options_.curve_secret_key.empty();
    if (!curve && !options_.curve_allowed_client_keys.empty()) {
      return Status::InvalidArgument(
          "curve_allowed_client_keys needs curve_secret_key");
    }
    if (curve) {
      RETURN_IF_ERROR(
          CheckZ85Key(options_.curve_secret_key, "curve_secret_key"));
      for (const std::string& k : options_.curve_allowed_client_keys) {
        RETURN_IF_ERROR(CheckZ85Key(k, "allowed client key '" + k + "'"));
      }
    }
    try {
      ApplyCommonOptions(socket_, options_);
      socket_.set(zmq::sockopt::router_mandatory, 1);
      if (curve) {
        const uint64_t id = ctx_->NextId();
        if (!options_.curve_allowed_client_keys.empty() ||
            options_.curve_identify_clients) {
          auto policy = std::make_shared<ZapPolicy>();
          policy->allowed.insert(options_.curve_allowed_client_keys.begin(),
                                 options_.curve_allowed_client_keys.end());
          policy->allow_any = options_.curve_allowed_client_keys.empty();
          policy->log = log_;
          zap_domain_ = "asyncps-" + std::to_string(id);
          RETURN_IF_ERROR(ctx_->AddZapDomain(zap_domain_, policy));
          socket_.set(zmq::sockopt::zap_domain, zap_domain_);
        }
        socket_.set(zmq::sockopt::curve_server, 1);
        socket_.set(zmq::sockopt::curve_secretkey, options_.curve_secret_key);
        // Failed handshakes (wrong server key, no encryption) never reach
        // the ZAP handler: a socket monitor reports them.
        const std::string mon =
            "inproc://asyncps-monitor-" + std::to_string(id) + "-" +
            std::to_string(reinterpret_cast<uintptr_t>(this));
        if (zmq_socket_monitor(socket_.handle(), mon.c_str(),
                               ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                                   ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) != 0) {
          return Status::Internal("socket monitor: " +
                                  std::string(zmq_strerror(zmq_errno())));
        }
        monitor_ = std::make_unique<zmq::socket_t>(ctx_->ctx(),
                                                   zmq::socket_type::pair);
        monitor_->set(zmq::sockopt::linger, 0);
        monitor_->connect(mon);
      }
      socket_.bind(NormaliseEndpoint(endpoint));
      endpoint_ = socket_.get(zmq::sockopt::last_endpoint);
    } catch (const zmq::error_t& e) {
      return FromZmq(e, "bind " + endpoint);
    }
    return Status::OK();
  }

  std::vector<std::string> TakeSecurityEvents() override {
    return log_->Take();
  }

  void SetWakeSockets(std::vector<ClientSocket*> sockets) override {
    wake_ = std::move(sockets);
  }

  const std::string& endpoint() const override { return endpoint_; }

  StatusOr<bool> Receive(std::string* peer, Message* msg,
                         std::chrono::milliseconds timeout) override {
    try {
      zmq::message_t id;
      zmq::recv_result_t r;
      // While messages keep coming, the next one is taken straight from the
      // queue: no poll() system call per message. Once the queue ran dry,
      // wait in poll. Without a monitor or wake sockets, a receive that
      // found nothing leaves the socket read dry, and one poll() on its
      // file descriptor waits (zmq_poll would first poll without waiting
      // and ask the socket for its events, before and after the wait).
      // Else zmq_poll, and a failed non-blocking receive (a system call
      // too) is not tried first once a burst ended.
      const bool alone = !monitor_ && wake_.empty();
      if (burst_ || alone) {
        r = socket_.recv(id, zmq::recv_flags::dontwait);
        if (monitor_ && r && ++since_monitor_ >= kMonitorEvery) {
          since_monitor_ = 0;
          DrainMonitor();
        }
      }
      if (!r && alone) {
        burst_ = false;
        if (fd_ < 0) fd_ = socket_.get(zmq::sockopt::fd);
        // The descriptor also wakes for ZeroMQ's own commands (a peer
        // connecting): then the socket is read dry again and waited on.
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        for (std::chrono::milliseconds left = timeout; !r;) {
          pollfd p{fd_, POLLIN, 0};
          if (poll(&p, 1, PollMillis(left)) <= 0) return false;  // or EINTR
          r = socket_.recv(id, zmq::recv_flags::dontwait);
          if (timeout.count() < 0) continue;
          left = std::chrono::ceil<std::chrono::milliseconds>(
              deadline - std::chrono::steady_clock::now());
          if (!r && left.count() <= 0) return false;
        }
      }
      if (!r) {
        burst_ = false;
        items_.clear();
        items_.push_back({socket_.handle(), 0, ZMQ_POLLIN, 0});
        if (monitor_) items_.push_back({monitor_->handle(), 0, ZMQ_POLLIN, 0});
        for (ClientSocket* w : wake_)
          items_.push_back({PollHandleOf(w), 0, ZMQ_POLLIN, 0});
        zmq::pollitem_t* items = items_.data();
        if (zmq::poll(items, items_.size(), timeout) == 0) return false;
        if (monitor_ && (items[1].revents & ZMQ_POLLIN)) DrainMonitor();
        if (!(items[0].revents & ZMQ_POLLIN)) return false;
        r = socket_.recv(id, zmq::recv_flags::dontwait);
        if (!r) return false;
      }
      burst_ = true;
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
  // Monitor events: frame 1 = u16 event + u32 value, frame 2 = endpoint.
  void DrainMonitor() {
    for (;;) {
      zmq::message_t ev, addr;
      if (!monitor_->recv(ev, zmq::recv_flags::dontwait)) return;
      if (ev.more()) (void)monitor_->recv(addr, zmq::recv_flags::none);
      if (ev.size() < 6) continue;
      uint16_t event;
      uint32_t value;
      std::memcpy(&event, ev.data(), 2);
      std::memcpy(&value, static_cast<const char*>(ev.data()) + 2, 4);
      char buf[64];
      std::snprintf(buf, sizeof(buf), "0x%x", value);
      log_->Add(std::string("CURVE handshake failed on ") + addr.to_string() +
                (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL
                     ? std::string(" (protocol error ") + buf +
                           ": wrong server key or no encryption)"
                     : std::string(" (errno ") + std::to_string(value) + ")"));
    }
  }

  // Security events are read at least every this many messages of a burst.
  static constexpr int kMonitorEvery = 256;

  std::shared_ptr<ContextImpl> ctx_;
  TransportOptions options_;
  zmq::socket_t socket_;
  std::unique_ptr<zmq::socket_t> monitor_;  // CURVE only
  bool burst_ = false;                      // the last Receive() got a message
  int fd_ = -1;                             // ZMQ_FD of socket_, once asked
  std::vector<ClientSocket*> wake_;         // SetWakeSockets()
  std::vector<zmq::pollitem_t> items_;      // reused by Receive()
  int since_monitor_ = 0;  // messages taken without reading the monitor
  std::shared_ptr<SecurityLog> log_ = std::make_shared<SecurityLog>();
  std::string zap_domain_;
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
        std::string pub = options_.curve_public_key;
        std::string sec = options_.curve_secret_key;
        if (sec.empty()) {
          // No key pair of its own: a throwaway one still encrypts (the
          // server refuses it if it checks client keys).
          RETURN_IF_ERROR(GenerateCurveKeyPair(&pub, &sec));
        } else if (pub.empty()) {
          ASSIGN_OR_RETURN(pub, DeriveCurvePublicKey(sec));
        }
        RETURN_IF_ERROR(
            CheckZ85Key(options_.curve_server_key, "curve_server_key"));
        RETURN_IF_ERROR(CheckZ85Key(pub, "curve_public_key"));
        RETURN_IF_ERROR(CheckZ85Key(sec, "curve_secret_key"));
        socket_.set(zmq::sockopt::curve_serverkey, options_.curve_server_key);
        socket_.set(zmq::sockopt::curve_publickey, pub);
        socket_.set(zmq::sockopt::curve_secretkey, sec);
      }
      // Connection events tell the client when a restarted server is back.
      static std::atomic<uint64_t> next_monitor{0};
      const std::string mon = "inproc://asyncps-client-monitor-" +
                              std::to_string(next_monitor++) + "-" +
                              std::to_string(reinterpret_cast<uintptr_t>(this));
      if (zmq_socket_monitor(socket_.handle(), mon.c_str(),
                             ZMQ_EVENT_CONNECTED) != 0) {
        return Status::Internal("socket monitor: " +
                                std::string(zmq_strerror(zmq_errno())));
      }
      monitor_ =
          std::make_unique<zmq::socket_t>(ctx_->ctx(), zmq::socket_type::pair);
      monitor_->set(zmq::sockopt::linger, 0);
      monitor_->connect(mon);
      socket_.connect(endpoint);
    } catch (const zmq::error_t& e) {
      return FromZmq(e, "connect " + endpoint);
    }
    return Status::OK();
  }

  ~ClientSocketImpl() override {
    // Stop the monitor before its socket goes.
    zmq_socket_monitor(socket_.handle(), nullptr, 0);
  }

  int TakeConnects() override {
    if (monitor_idle_) {
      // PollAny just found no signal on a drained monitor: no event came.
      monitor_idle_ = false;
      return 0;
    }
    int n = 0;
    try {
      while (true) {
        zmq::message_t ev, addr;
        if (!monitor_->recv(ev, zmq::recv_flags::dontwait)) break;
        if (ev.more()) (void)monitor_->recv(addr, zmq::recv_flags::none);
        if (ev.size() >= 2) {
          uint16_t event;
          std::memcpy(&event, ev.data(), sizeof(event));
          if (event == ZMQ_EVENT_CONNECTED) ++n;
        }
      }
      monitor_drained_ = true;
    } catch (const zmq::error_t&) {
      // A closing context: no more events.
    }
    return n;
  }

  const std::string& endpoint() const override { return endpoint_; }

  void SetMaxMessageBytes(int64_t bytes) override {
    options_.max_message_bytes = bytes;
  }

  Status Send(std::vector<Frame>& frames) override {
    drained_ = false;  // sending may take the socket's pending signal
    try {
      return SendFrames(socket_, nullptr, frames);
    } catch (const zmq::error_t& e) {
      return FromZmq(e, "send to " + endpoint_);
    }
  }

  StatusOr<bool> Receive(Message* msg,
                         std::chrono::milliseconds timeout) override {
    drained_ = false;
    try {
      zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
      if (timeout.count() != 0 && zmq::poll(&item, 1, timeout) == 0)
        return false;
      zmq::message_t first;
      auto r = socket_.recv(first, zmq::recv_flags::dontwait);
      if (!r) {
        drained_ = true;
        return false;
      }
      RETURN_IF_ERROR(ReceiveRest(socket_, std::move(first), options_, msg));
      return true;
    } catch (const zmq::error_t& e) {
      return FromZmq(e, "receive from " + endpoint_);
    }
  }

 protected:
  void* raw_handle() override { return socket_.handle(); }
  void* monitor_handle() override { return monitor_->handle(); }

  bool FillPollFds(pollfd* fds) override {
    if (!drained_ || !monitor_drained_) return false;
    try {
      if (fd_ < 0) fd_ = socket_.get(zmq::sockopt::fd);
      if (monitor_fd_ < 0) monitor_fd_ = monitor_->get(zmq::sockopt::fd);
    } catch (const zmq::error_t&) {
      return false;
    }
    fds[0] = pollfd{fd_, POLLIN, 0};
    fds[1] = pollfd{monitor_fd_, POLLIN, 0};
    return true;
  }

  void SetMonitorIdle(bool idle) override { monitor_idle_ = idle; }

  void ForgetDrained() override {
    drained_ = monitor_drained_ = monitor_idle_ = false;
  }

 private:
  friend class ClientSocket;
  std::shared_ptr<ContextImpl> ctx_;
  TransportOptions options_;
  zmq::socket_t socket_;
  std::unique_ptr<zmq::socket_t> monitor_;  // PAIR receiving connect events
  std::string endpoint_;
  // PollAny's fast path. ZeroMQ signals a socket's file descriptor (ZMQ_FD)
  // only when a command reaches the socket after it processed all pending
  // ones, which a receive that found nothing does; any other operation may
  // consume the signal and leave a message queued behind a silent fd.
  bool drained_ = false;          // the last operation: a receive of nothing
  bool monitor_drained_ = false;  // TakeConnects read the monitor dry
  bool monitor_idle_ = false;     // PollAny: no signal on the drained monitor
  int fd_ = -1;                   // ZMQ_FD of socket_, once asked
  int monitor_fd_ = -1;           // ZMQ_FD of monitor_, once asked
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

Status CheckSendBufferBytes(int64_t bytes, const std::string& what) {
  if (bytes == 0 ||
      (bytes >= kMinSendBufferBytes && bytes <= kMaxSendBufferBytes)) {
    return Status::OK();
  }
  return Status::InvalidArgument(
      what + " must be 0 (the OS default) or " +
      std::to_string(kMinSendBufferBytes >> 10) + " KiB to " +
      std::to_string(kMaxSendBufferBytes >> 20) + " MiB, got " +
      std::to_string(bytes) + " bytes");
}

Status CheckSendBufferKb(int64_t kb, const std::string& what) {
  if (kb == 0 || (kb >= (kMinSendBufferBytes >> 10) &&
                  kb <= (kMaxSendBufferBytes >> 10))) {
    return Status::OK();
  }
  return Status::InvalidArgument(what + " must be 0 (the OS default) or " +
                                 std::to_string(kMinSendBufferBytes >> 10) +
                                 " to " +
                                 std::to_string(kMaxSendBufferBytes >> 10) +
                                 " KiB, got " + std::to_string(kb));
}

StatusOr<std::unique_ptr<ServerSocket>> ServerSocket::Bind(
    const std::string& endpoint, const TransportOptions& options) {
  RETURN_IF_ERROR(
      CheckSendBufferBytes(options.send_buffer_bytes, "send_buffer_bytes"));
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
  RETURN_IF_ERROR(
      CheckSendBufferBytes(options.send_buffer_bytes, "send_buffer_bytes"));
  try {
    auto s = std::make_unique<ClientSocketImpl>(ContextOf(options), options);
    RETURN_IF_ERROR(s->Init(endpoint));
    return std::unique_ptr<ClientSocket>(std::move(s));
  } catch (const zmq::error_t& e) {
    return FromZmq(e, "socket");
  }
}

void* ServerSocket::PollHandleOf(ClientSocket* s) { return s->raw_handle(); }

StatusOr<int> ClientSocket::PollAny(const std::vector<ClientSocket*>& sockets,
                                    std::chrono::milliseconds timeout) {
  // Every socket read dry since its last use: one poll() on their file
  // descriptors. zmq_poll() would first poll with no timeout and ask every
  // socket for its events (two system calls each) before waiting.
  std::vector<pollfd> fds(2 * sockets.size());
  bool fast = true;
  for (size_t i = 0; i < sockets.size() && fast; ++i)
    fast = sockets[i]->FillPollFds(&fds[2 * i]);
  if (fast) {
    const int rc = poll(fds.data(), fds.size(), PollMillis(timeout));
    if (rc < 0 && errno != EINTR) {
      return Status::Internal(std::string("poll: ") + std::strerror(errno));
    }
    int ready = -1;
    for (size_t i = 0; i < sockets.size(); ++i) {
      sockets[i]->SetMonitorIdle(rc > 0 && fds[2 * i + 1].revents == 0);
      if (rc > 0 && ready < 0 && (fds[2 * i].revents | fds[2 * i + 1].revents))
        ready = static_cast<int>(i);
    }
    return ready;
  }
  std::vector<zmq::pollitem_t> items(2 * sockets.size());
  for (size_t i = 0; i < sockets.size(); ++i) {
    items[2 * i] = zmq::pollitem_t{sockets[i]->raw_handle(), 0, ZMQ_POLLIN, 0};
    items[2 * i + 1] =
        zmq::pollitem_t{sockets[i]->monitor_handle(), 0, ZMQ_POLLIN, 0};
    sockets[i]->ForgetDrained();
  }
  try {
    if (zmq::poll(items.data(), items.size(), timeout) == 0) return -1;
  } catch (const zmq::error_t& e) {
    // A signal (Ctrl-C in a Python caller, SIGCHLD, ...) interrupted the
    // wait: nothing is ready; the caller's loop checks its deadline and
    // polls again.
    if (e.num() == EINTR) return -1;
    return FromZmq(e, "poll");
  }
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].revents & ZMQ_POLLIN) return static_cast<int>(i / 2);
  }
  return -1;
}

Status TuneAllocatorForMessages(const AllocatorTuning& tuning) {
#if defined(__GLIBC__)
  // glibc's ceiling for the mmap threshold on 64-bit
  // (DEFAULT_MMAP_THRESHOLD_MAX).
  constexpr int64_t kMaxMmapThreshold = int64_t{32} << 20;
  if (tuning.mmap_threshold_bytes < 0 ||
      tuning.mmap_threshold_bytes > kMaxMmapThreshold) {
    return Status::InvalidArgument("mmap threshold must be in [0, 32 MiB]");
  }
  if (tuning.trim_threshold_bytes < 0 ||
      tuning.trim_threshold_bytes > INT_MAX) {
    return Status::InvalidArgument("trim threshold must be in [0, 2^31)");
  }
  if (mallopt(M_MMAP_THRESHOLD,
              static_cast<int>(tuning.mmap_threshold_bytes)) != 1 ||
      mallopt(M_TRIM_THRESHOLD,
              static_cast<int>(tuning.trim_threshold_bytes)) != 1) {
    // Valid values refused: another allocator stands in for glibc's
    // (a sanitizer's, whose mallopt does nothing).
    return Status::Unimplemented("the allocator in use ignores mallopt");
  }
  return Status::OK();
#else
  (void)tuning;
  return Status::Unimplemented("no mallopt in this C library");
#endif
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

StatusOr<std::string> DeriveCurvePublicKey(const std::string& secret_key) {
  RETURN_IF_ERROR(CheckZ85Key(secret_key, "CURVE secret key"));
  char pub[41];
  if (zmq_curve_public(pub, secret_key.c_str()) != 0) {
    return Status::InvalidArgument("cannot derive a public key: " +
                                   std::string(zmq_strerror(zmq_errno())));
  }
  return std::string(pub, 40);
}

namespace {

// Lines of a key file without comments, blanks and surrounding spaces.
StatusOr<std::vector<std::string>> KeyFileLines(const std::string& path) {
  std::ifstream f(path);
  if (!f) return Status::NotFound("cannot read key file " + path);
  std::vector<std::string> out;
  for (std::string line; std::getline(f, line);) {
    const size_t b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos || line[b] == '#') continue;
    const size_t e = line.find_first_of(" \t\r", b);
    out.push_back(line.substr(b, e == std::string::npos ? e : e - b));
  }
  return out;
}

}  // namespace

StatusOr<std::string> LoadCurveKey(const std::string& file_or_key) {
  if (file_or_key.size() == 40 && CheckZ85Key(file_or_key, "").ok() &&
      !std::ifstream(file_or_key)) {
    return file_or_key;
  }
  ASSIGN_OR_RETURN(std::vector<std::string> lines, KeyFileLines(file_or_key));
  if (lines.empty()) return Status::InvalidArgument("no key in " + file_or_key);
  RETURN_IF_ERROR(CheckZ85Key(lines[0], "the key in " + file_or_key));
  return lines[0];
}

Status LoadCurveClientKeys(const std::string& server_key,
                           const std::string& secret_key,
                           const std::string& public_key,
                           TransportOptions* options) {
  if (server_key.empty()) return Status::OK();
  ASSIGN_OR_RETURN(options->curve_server_key, LoadCurveKey(server_key));
  if (!secret_key.empty()) {
    ASSIGN_OR_RETURN(options->curve_secret_key, LoadCurveKey(secret_key));
  }
  if (!public_key.empty()) {
    ASSIGN_OR_RETURN(options->curve_public_key, LoadCurveKey(public_key));
  }
  return Status::OK();
}

StatusOr<std::vector<std::string>> LoadCurveKeyList(const std::string& path) {
  ASSIGN_OR_RETURN(std::vector<std::string> lines, KeyFileLines(path));
  for (const std::string& k : lines)
    RETURN_IF_ERROR(CheckZ85Key(k, "key '" + k + "' in " + path));
  return lines;
}

}  // namespace asyncps
