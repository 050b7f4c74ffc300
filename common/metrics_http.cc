// How connections are served (issue 40: slow clients must not starve
// scrapes). cpp-httplib's own accept loop hands each connection to a pool
// thread that then reads the request with a timeout per read, not per
// request, and no bound on the number of headers: a client sending one
// header line a second keeps a thread forever. Debian ships the library
// compiled (libcpp-httplib.so), so its CPPHTTPLIB_* limits cannot be
// changed from here. Instead:
//
//   gate thread    accepts, and reads every connection's request head (the
//                  request line and the headers, up to the blank line) with
//                  poll(2) over all of them: each has a deadline
//                  (request_timeout from its accept, io_timeout from its
//                  last byte) and caps on its bytes and lines; past one it
//                  gets a canned 408 / 431 and is closed. At max_connections
//                  a new connection evicts the oldest one still sending its
//                  head (or gets 503 when every one is being answered).
//   pool threads   take a connection whose head is complete and run the
//                  library's parser, router and writer on it
//                  (Server::process_request) over a Stream that serves the
//                  head from memory (so they never wait on a client's bytes;
//                  a body, never wanted, reads as its end) and writes with
//                  the reply's deadline. One request per connection
//                  (Connection: close).
//
// So a slow client costs a slot in the gate's poll set, never a thread.
#include "common/metrics_http.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <list>
#include <thread>
#include <vector>

#include "common/file_util.h"
#include "common/mutex.h"

namespace asyncps::metrics {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";
constexpr char kTimeout[] =
    "HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n"
    "Connection: close\r\n\r\n";
constexpr char kTooLarge[] =
    "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\n"
    "Connection: close\r\n\r\n";
constexpr char kBusy[] =
    "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
    "Connection: close\r\n\r\n";

// Milliseconds from now until `t`, at least 0, rounded up.
int MsUntil(Clock::time_point t) {
  const auto d = t - Clock::now();
  if (d <= Clock::duration::zero()) return 0;
  return static_cast<int>(
      std::chrono::ceil<std::chrono::milliseconds>(d).count());
}

// "ip", port of a socket address.
void AddressOf(const sockaddr_storage& a, socklen_t len, std::string* ip,
               int* port) {
  char host[NI_MAXHOST] = {}, serv[NI_MAXSERV] = {};
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, host,
                  sizeof(host), serv, sizeof(serv),
                  NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
    *ip = host;
    *port = std::atoi(serv);
  }
}

// A connection, from its accept to its close.
struct Conn {
  int fd = -1;
  std::string head;    // bytes read so far (the head, perhaps more after it)
  size_t scanned = 0;  // head[0, scanned) holds only complete lines
  int lines = 0;       // complete lines so far, the request line included
  Clock::time_point deadline;    // accept + request_timeout
  Clock::time_point idle_until;  // last byte + io_timeout
  sockaddr_storage peer{};
  socklen_t peer_len = 0;
};

// Best effort: a short canned reply on a non-blocking socket, then close.
void Refuse(int fd, const char* reply) {
  (void)!send(fd, reply, std::strlen(reply), MSG_NOSIGNAL | MSG_DONTWAIT);
  close(fd);
}

// httplib's Stream over a connection whose head the gate read: reads come
// from memory, writes go to the socket within the reply's deadline.
class HeadStream : public httplib::Stream {
 public:
  HeadStream(const Conn& c, Clock::time_point deadline,
             std::chrono::milliseconds io_timeout)
      : c_(c), deadline_(deadline), io_timeout_(io_timeout) {}

  bool is_readable() const override { return at_ < c_.head.size(); }
  bool is_writable() const override { return Clock::now() < deadline_; }

  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, c_.head.size() - at_);
    std::memcpy(ptr, c_.head.data() + at_, n);
    at_ += n;
    return static_cast<ssize_t>(n);
  }

  using httplib::Stream::write;
  ssize_t write(const char* ptr, size_t size) override {
    size_t done = 0;
    while (done < size) {
      const ssize_t n =
          send(c_.fd, ptr + done, size - done, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        done += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return -1;
      const int wait = std::min<int>(MsUntil(deadline_),
                                     static_cast<int>(io_timeout_.count()));
      pollfd p{c_.fd, POLLOUT, 0};
      if (wait <= 0 || poll(&p, 1, wait) <= 0) return -1;  // too slow
    }
    return static_cast<ssize_t>(done);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    AddressOf(c_.peer, c_.peer_len, &ip, &port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t len = sizeof(a);
    if (getsockname(c_.fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
      AddressOf(a, len, &ip, &port);
  }
  int socket() const override { return c_.fd; }

 private:
  const Conn& c_;
  size_t at_ = 0;
  const Clock::time_point deadline_;
  const std::chrono::milliseconds io_timeout_;
};

// The library's router, parser and writer, run on one connection at a time
// (process_request is protected: this is its one user).
class Router : public httplib::Server {
 public:
  void Serve(HeadStream& s) {
    bool closed = true;
    process_request(s, /*close_connection=*/true, closed, nullptr);
  }
};

}  // namespace

struct MetricsServer::Impl {
  MetricsServerOptions options;
  const Registry* registry = nullptr;
  Router http;
  int listen_fd = -1;
  int wake[2] = {-1, -1};  // the gate's stop signal (a byte on wake[1])
  int port = 0;
  std::atomic<uint64_t> scrapes{0};
  std::thread gate;
  std::vector<std::thread> pool;

  // Connections open (gate, queue or pool), touched by the gate (accepts,
  // refusals) and the pool (closes).
  std::atomic<int> open{0};
  Mutex mu;
  CondVar ready_cv;
  std::deque<Conn> ready GUARDED_BY(mu);  // heads complete, for the pool
  bool stopping GUARDED_BY(mu) = false;

  ~Impl() {
    if (gate.joinable()) {
      (void)!::write(wake[1], "x", 1);
      gate.join();
    }
    {
      MutexLock l(&mu);
      stopping = true;
    }
    ready_cv.SignalAll();
    for (std::thread& t : pool) t.join();
    for (Conn& c : ready) close(c.fd);
    for (int fd : {listen_fd, wake[0], wake[1]}) {
      if (fd >= 0) close(fd);
    }
  }

  // Reads what `c` sent; false when it is done with (handed to the pool,
  // refused, or gone).
  bool ReadHead(Conn& c) {
    char buf[4096];
    const size_t cap = static_cast<size_t>(options.max_header_bytes);
    const ssize_t n = recv(c.fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
      return true;
    if (n <= 0) {
      Drop(c.fd, nullptr);
      return false;
    }
    c.head.append(buf, static_cast<size_t>(n));
    c.idle_until = Clock::now() + options.io_timeout;
    // Complete lines; the head ends at the first empty one.
    for (size_t nl; (nl = c.head.find('\n', c.scanned)) != std::string::npos;) {
      const size_t len = nl - c.scanned;
      const bool empty = len == 0 || (len == 1 && c.head[c.scanned] == '\r');
      c.scanned = nl + 1;
      if (c.scanned > cap) break;
      if (empty) {
        Hand(std::move(c));
        return false;
      }
      if (++c.lines > options.max_headers + 1) {  // + the request line
        Drop(c.fd, kTooLarge);
        return false;
      }
    }
    if (c.head.size() > cap) {
      Drop(c.fd, kTooLarge);
      return false;
    }
    return true;
  }

  void Drop(int fd, const char* reply) {
    if (reply != nullptr) {
      Refuse(fd, reply);
    } else {
      close(fd);
    }
    open.fetch_sub(1);
  }

  void Hand(Conn&& c) {
    {
      MutexLock l(&mu);
      ready.push_back(std::move(c));
    }
    ready_cv.Signal();
  }

  // Accepts every connection waiting; at the cap, evicts the oldest one of
  // `reading` (accept order), or refuses the new one.
  void AcceptAll(std::list<Conn>* reading) {
    while (true) {
      Conn c;
      c.peer_len = sizeof(c.peer);
      c.fd = accept4(listen_fd, reinterpret_cast<sockaddr*>(&c.peer),
                     &c.peer_len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (c.fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          // Out of descriptors (EMFILE): the listener stays readable, so
          // pause instead of spinning.
          PLOG_EVERY_N(WARNING, 100) << "metrics accept";
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        return;
      }
      if (open.load() >= options.max_connections) {
        if (reading->empty()) {
          Refuse(c.fd, kBusy);
          continue;
        }
        VLOG(1) << "metrics: connection cap, the oldest slow one dropped";
        Drop(reading->front().fd, kTimeout);
        reading->pop_front();
      }
      open.fetch_add(1);
      const auto now = Clock::now();
      c.deadline = now + options.request_timeout;
      c.idle_until = now + options.io_timeout;
      reading->push_back(std::move(c));
    }
  }

  void RunGate() {
    std::list<Conn> reading;  // in accept order
    std::vector<pollfd> fds;
    std::vector<std::list<Conn>::iterator> at;
    while (true) {
      fds.assign({{wake[0], POLLIN, 0}, {listen_fd, POLLIN, 0}});
      at.clear();
      Clock::time_point next = Clock::time_point::max();
      for (auto it = reading.begin(); it != reading.end(); ++it) {
        fds.push_back({it->fd, POLLIN, 0});
        at.push_back(it);
        next = std::min({next, it->deadline, it->idle_until});
      }
      const int wait = next == Clock::time_point::max() ? -1 : MsUntil(next);
      if (poll(fds.data(), fds.size(), wait) < 0 && errno != EINTR) {
        PLOG(ERROR) << "metrics poll";
        break;
      }
      if (fds[0].revents != 0) break;
      for (size_t i = 0; i < at.size(); ++i) {
        if (fds[i + 2].revents != 0 && !ReadHead(*at[i])) reading.erase(at[i]);
      }
      const auto now = Clock::now();
      for (auto it = reading.begin(); it != reading.end();) {
        if (now >= it->deadline || now >= it->idle_until) {
          Drop(it->fd, kTimeout);
          it = reading.erase(it);
        } else {
          ++it;
        }
      }
      if (fds[1].revents != 0) AcceptAll(&reading);
    }
    for (Conn& c : reading) Drop(c.fd, nullptr);
  }

  void RunPool() {
    while (true) {
      Conn c;
      {
        MutexLock l(&mu);
        while (!stopping && ready.empty()) ready_cv.Wait(&mu);
        if (stopping) return;
        c = std::move(ready.front());
        ready.pop_front();
      }
      HeadStream s(c, Clock::now() + options.request_timeout,
                   options.io_timeout);
      try {
        http.Serve(s);
      } catch (...) {  // a handler's are caught by the library already
        LOG(WARNING) << "metrics: a request failed with an exception";
      }
      shutdown(c.fd, SHUT_RDWR);
      Drop(c.fd, nullptr);
    }
  }
};

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

MetricsServer::~MetricsServer() = default;

namespace {

Status Validate(const MetricsServerOptions& options, const Registry* registry) {
  if (registry == nullptr) {
    return Status::InvalidArgument("metrics server needs a registry");
  }
  if (options.port < 0 || options.port > 65535) {
    return Status::InvalidArgument("metrics port " +
                                   std::to_string(options.port) +
                                   " out of range [0, 65535]");
  }
  if (options.threads < 1 || options.threads > 64) {
    return Status::InvalidArgument("metrics threads must be in [1, 64]");
  }
  if (options.io_timeout.count() < 1 || options.request_timeout.count() < 1) {
    return Status::InvalidArgument(
        "metrics io_timeout and request_timeout must be >= 1 ms");
  }
  if (options.max_headers < 1 || options.max_header_bytes < 256 ||
      options.max_header_bytes > (1 << 20)) {
    return Status::InvalidArgument(
        "metrics max_headers must be >= 1, max_header_bytes in [256, 1 MiB]");
  }
  if (options.max_connections < 1) {
    return Status::InvalidArgument("metrics max_connections must be >= 1");
  }
  return Status::OK();
}

// A listening socket on bind:port (SO_REUSEADDR only: SO_REUSEPORT would
// let a second process bind the same port without an error); -1 if none.
int Listen(const std::string& bind, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(bind.c_str(), std::to_string(port).c_str(), &hints, &found) !=
      0)
    return -1;
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                a->ai_protocol);
    if (fd < 0) continue;
    int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 ||
        listen(fd, SOMAXCONN) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  return fd;
}

int BoundPort(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return -1;
  std::string ip;
  int port = -1;
  AddressOf(a, len, &ip, &port);
  return port;
}

}  // namespace

StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const MetricsServerOptions& options, const Registry* registry) {
  RETURN_IF_ERROR(Validate(options, registry));
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->registry = registry;
  Impl* raw = impl.get();
  httplib::Server& http = impl->http;
  http.set_payload_max_length(0);  // GET only: a body gets 413, unread
  http.Get("/metrics", [raw](const httplib::Request&, httplib::Response& res) {
    res.set_content(raw->registry->Render(), kContentType);
    raw->scrapes.fetch_add(1, std::memory_order_relaxed);
  });
  http.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("asyncps metrics: see /metrics\n", "text/plain");
  });
  // Other methods on known paths: 405 with Allow, as HTTP says.
  auto not_allowed = [](const httplib::Request& req, httplib::Response& res) {
    res.status = 405;
    res.set_header("Allow", "GET, HEAD");
  };
  for (const char* path : {"/metrics", "/"}) {
    http.Post(path, not_allowed);
    http.Put(path, not_allowed);
    http.Delete(path, not_allowed);
    http.Patch(path, not_allowed);
  }
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res,
                                std::exception_ptr) { res.status = 500; });
  impl->listen_fd = Listen(options.bind, options.port);
  impl->port = impl->listen_fd >= 0 ? BoundPort(impl->listen_fd) : -1;
  if (impl->port <= 0) {
    return Status::Unavailable("cannot bind metrics endpoint " + options.bind +
                               ":" + std::to_string(options.port));
  }
  if (pipe2(impl->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    return Status::Unavailable(std::string("metrics server pipe: ") +
                               std::strerror(errno));
  }
  for (int i = 0; i < options.threads; ++i) {
    impl->pool.emplace_back([raw] { raw->RunPool(); });
  }
  impl->gate = std::thread([raw] { raw->RunGate(); });
  if (!options.port_file.empty()) {
    RETURN_IF_ERROR(WriteFileAtomically(options.port_file,
                                        std::to_string(impl->port) + "\n"));
  }
  LOG(INFO) << "metrics on http://" << options.bind << ":" << impl->port
            << "/metrics";
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

int MetricsServer::port() const { return impl_->port; }

std::string MetricsServer::endpoint() const {
  return "http://" + impl_->options.bind + ":" + std::to_string(impl_->port) +
         "/metrics";
}

uint64_t MetricsServer::scrapes() const {
  return impl_->scrapes.load(std::memory_order_relaxed);
}

}  // namespace asyncps::metrics
