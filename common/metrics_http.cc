#include "common/metrics_http.h"

#include <glog/logging.h>
#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <thread>

#include "common/file_util.h"

namespace asyncps::metrics {
namespace {

constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace

struct MetricsServer::Impl {
  MetricsServerOptions options;
  const Registry* registry = nullptr;
  httplib::Server http;
  std::thread thread;
  int port = 0;
  std::atomic<uint64_t> scrapes{0};

  ~Impl() {
    http.stop();
    if (thread.joinable()) thread.join();
  }
};

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

MetricsServer::~MetricsServer() = default;

StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const MetricsServerOptions& options, const Registry* registry) {
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
  if (options.io_timeout.count() < 1) {
    return Status::InvalidArgument("metrics io_timeout must be >= 1 ms");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->registry = registry;
  Impl* raw = impl.get();
  httplib::Server& http = impl->http;
  const int threads = options.threads;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_read_timeout(options.io_timeout);
  http.set_write_timeout(options.io_timeout);
  http.set_keep_alive_timeout(
      std::max<time_t>(1, options.io_timeout.count() / 1000));
  http.set_keep_alive_max_count(100);
  http.set_payload_max_length(0);  // GET only: a body gets 413, unread
  // SO_REUSEADDR only: the library's default also sets SO_REUSEPORT, which
  // would let a second process bind the same port without an error.
  http.set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
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
  if (options.port == 0) {
    impl->port = http.bind_to_any_port(options.bind);
  } else {
    impl->port =
        http.bind_to_port(options.bind, options.port) ? options.port : -1;
  }
  if (impl->port <= 0) {
    return Status::Unavailable("cannot bind metrics endpoint " + options.bind +
                               ":" + std::to_string(options.port));
  }
  impl->thread = std::thread([raw] { raw->http.listen_after_bind(); });
  // stop() only interrupts a running accept loop: wait until it runs, so
  // that destroying the server never leaves the thread blocked in accept.
  for (int i = 0; i < 5000 && !http.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
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
