#include "common/metrics.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "common/metrics_http.h"

namespace asyncps::metrics {
namespace {

bool Contains(const std::string& text, const std::string& line) {
  return text.find(line) != std::string::npos;
}

TEST(Metrics, RendersCountersGaugesAndHistograms) {
  Registry r;
  auto& req =
      r.AddCounter("asyncps_requests_total", "Requests by kind.", {"kind"});
  req.WithLabels({"push"}).Inc(3);
  req.WithLabels({"pull"}).Inc();
  r.AddGauge("asyncps_parked_pulls", "Pulls waiting.").Get().Set(2.5);
  auto& h =
      r.AddHistogram("asyncps_latency_seconds", "Latency.", {0.001, 0.01, 0.1});
  h.Get().Observe(0.0005);
  h.Get().Observe(0.005);
  h.Get().Observe(0.005);
  h.Get().Observe(7);
  const std::string text = r.Render();
  EXPECT_TRUE(Contains(text,
                       "# HELP asyncps_requests_total Requests by kind.\n"
                       "# TYPE asyncps_requests_total counter\n"))
      << text;
  EXPECT_TRUE(Contains(text, "asyncps_requests_total{kind=\"pull\"} 1\n"));
  EXPECT_TRUE(Contains(text, "asyncps_requests_total{kind=\"push\"} 3\n"));
  EXPECT_TRUE(Contains(text, "# TYPE asyncps_parked_pulls gauge\n"));
  EXPECT_TRUE(Contains(text, "asyncps_parked_pulls 2.5\n"));
  EXPECT_TRUE(Contains(text, "# TYPE asyncps_latency_seconds histogram\n"));
  // Buckets are cumulative and end with +Inf == count.
  EXPECT_TRUE(
      Contains(text, "asyncps_latency_seconds_bucket{le=\"0.001\"} 1\n"));
  EXPECT_TRUE(
      Contains(text, "asyncps_latency_seconds_bucket{le=\"0.01\"} 3\n"));
  EXPECT_TRUE(Contains(text, "asyncps_latency_seconds_bucket{le=\"0.1\"} 3\n"));
  EXPECT_TRUE(
      Contains(text, "asyncps_latency_seconds_bucket{le=\"+Inf\"} 4\n"));
  EXPECT_TRUE(Contains(text, "asyncps_latency_seconds_sum 7.0105\n")) << text;
  EXPECT_TRUE(Contains(text, "asyncps_latency_seconds_count 4\n"));
  // Families in registration order.
  EXPECT_LT(text.find("asyncps_requests_total"),
            text.find("asyncps_parked_pulls"));
  EXPECT_LT(text.find("asyncps_parked_pulls"),
            text.find("asyncps_latency_seconds"));
}

TEST(Metrics, EscapesHelpAndLabelValues) {
  Registry r;
  r.AddGauge("g", "a \\ back\nslash", {"path"})
      .WithLabels({"x\"y\\z\nw"})
      .Set(1);
  const std::string text = r.Render();
  EXPECT_TRUE(Contains(text, "# HELP g a \\\\ back\\nslash\n")) << text;
  EXPECT_TRUE(Contains(text, "g{path=\"x\\\"y\\\\z\\nw\"} 1\n")) << text;
}

TEST(Metrics, FormatsSpecialValues) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(1e21), "1e+21");
  EXPECT_EQ(FormatValue(1.0 / 0.0), "+Inf");
  EXPECT_EQ(FormatValue(-1.0 / 0.0), "-Inf");
  EXPECT_EQ(FormatValue(std::nan("")), "NaN");
}

TEST(Metrics, CountersOnlyGoUp) {
  Counter c;
  c.Inc(2);
  c.Inc(-5);            // ignored
  c.Inc(std::nan(""));  // ignored
  EXPECT_EQ(c.value(), 2);
  c.Publish(10);
  EXPECT_EQ(c.value(), 10);
  c.Publish(4);  // a restart of the source: never exported as a decrease
  EXPECT_EQ(c.value(), 10);
}

TEST(Metrics, HistogramPublishReplacesState) {
  Histogram h({1, 2});
  h.Observe(100);
  h.Publish({1, 2, 3}, 9.5);
  Histogram::Snapshot s = h.Snap();
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{1, 3, 6}));
  EXPECT_EQ(s.count, 6u);
  EXPECT_EQ(s.sum, 9.5);
}

TEST(Metrics, SameNameTwiceIsTheSameFamily) {
  Registry r;
  auto& a = r.AddCounter("x_total", "help", {"k"});
  auto& b = r.AddCounter("x_total", "help", {"k"});
  EXPECT_EQ(&a, &b);
  EXPECT_EQ(&a.WithLabels({"1"}), &b.WithLabels({"1"}));
}

TEST(MetricsDeathTest, RejectsNamesPrometheusWouldNot) {
  Registry r;
  EXPECT_DEATH(r.AddCounter("requests", "no _total"), "_total");
  EXPECT_DEATH(r.AddGauge("1bad", "digit first"), "bad metric name");
  EXPECT_DEATH(r.AddGauge("g", "reserved", {"le"}), "bad label name");
  EXPECT_DEATH(r.AddGauge("g2", "reserved", {"__x"}), "bad label name");
  EXPECT_DEATH(r.AddHistogram("h", "bounds", {2, 1}), "increase");
  r.AddGauge("g3", "one label", {"a"});
  EXPECT_DEATH(r.AddGauge("g3", "other labels", {"b"}), "registered twice");
}

TEST(Metrics, ConcurrentUpdatesAreNotLost) {
  Registry r;
  Counter& c = r.AddCounter("c_total", "c").Get();
  Histogram& h = r.AddHistogram("h", "h", {0.5}).Get();
  std::atomic<bool> done{false};
  std::thread scraper([&] {
    while (!done.load()) (void)r.Render();
  });
  std::vector<std::thread> writers;
  for (int t = 0; t < 4; ++t) {
    writers.emplace_back([&] {
      for (int i = 0; i < 50000; ++i) {
        c.Inc();
        h.Observe(1);
      }
    });
  }
  for (auto& w : writers) w.join();
  done = true;
  scraper.join();
  EXPECT_EQ(c.value(), 200000);
  EXPECT_EQ(h.Snap().count, 200000u);
  EXPECT_EQ(h.Snap().sum, 200000);
}

TEST(Metrics, CollectorsRunAtEachRender) {
  Registry r;
  Gauge& g = r.AddGauge("calls", "render calls").Get();
  int calls = 0;
  r.AddCollector([&] { g.Set(++calls); });
  (void)r.Render();
  EXPECT_TRUE(Contains(r.Render(), "calls 2\n"));
}

TEST(Metrics, ProcessMetricsReadProc) {
  Registry r;
  AddProcessMetrics(&r);
  const std::string text = r.Render();
  EXPECT_TRUE(Contains(text, "# TYPE process_resident_memory_bytes gauge"));
  EXPECT_TRUE(Contains(text, "# TYPE process_cpu_seconds_total counter"));
  // This test process holds at least a few MiB and stdin/stdout/stderr.
  auto value = [&](const std::string& name) {
    const size_t at = text.find("\n" + name + " ");
    return at == std::string::npos
               ? -1.0
               : std::atof(text.c_str() + at + name.size() + 2);
  };
  EXPECT_GT(value("process_resident_memory_bytes"), 1 << 20);
  EXPECT_GE(value("process_open_fds"), 3);
  EXPECT_GT(value("process_start_time_seconds"), 1.6e9);
}

// promtool (Debian's prometheus package) is the reference parser and
// linter of the exposition format.
TEST(Metrics, PromtoolAcceptsTheExposition) {
  if (access("/usr/bin/promtool", X_OK) != 0) {
    GTEST_SKIP() << "promtool not installed (Debian package prometheus)";
  }
  Registry r;
  AddProcessMetrics(&r);
  r.AddCounter("asyncps_requests_total", "Requests.", {"kind"})
      .WithLabels({"pu\"sh"})
      .Inc(1);
  r.AddGauge("asyncps_worker_clock", "Clock.", {"rank"})
      .WithLabels({"0"})
      .Set(-3);
  r.AddHistogram("asyncps_apply_seconds", "Apply time.",
                 Histogram::ExponentialBounds(1e-5, 4, 8))
      .Get()
      .Observe(0.01);
  const std::string path = testing::TempDir() + "/exposition.txt";
  std::ofstream(path) << r.Render();
  const std::string cmd = "/usr/bin/promtool check metrics < " + path + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[256];
  while (fgets(buf, sizeof(buf), p)) out += buf;
  EXPECT_EQ(pclose(p), 0) << out;
  EXPECT_EQ(out, "") << "promtool lint findings";
}

// --- HTTP -------------------------------------------------------------------

// Raw TCP connection to 127.0.0.1:port.
int ConnectTo(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  return fd;
}

class MetricsHttp : public testing::Test {
 protected:
  void SetUp() override {
    registry_.AddCounter("asyncps_test_total", "A test counter.").Get().Inc(5);
    MetricsServerOptions o;
    o.io_timeout = std::chrono::milliseconds(500);
    o.port_file = testing::TempDir() + "/metrics.port";
    std::remove(o.port_file.c_str());
    auto s = MetricsServer::Start(o, &registry_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(s).value();
  }

  // Raw TCP connection to the server.
  int Connect() { return ConnectTo(server_->port()); }

  // Sends `bytes`, returns everything read until the server closes.
  std::string RawExchange(const std::string& bytes) {
    int fd = Connect();
    EXPECT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
    std::string got;
    char buf[4096];
    timeval tv{3, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ssize_t n;
    while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) got.append(buf, n);
    close(fd);
    return got;
  }

  void ExpectScrapeWorks() {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_connection_timeout(std::chrono::seconds(2));
    c.set_read_timeout(std::chrono::seconds(2));
    auto res = c.Get("/metrics");
    ASSERT_TRUE(res) << httplib::to_string(res.error());
    EXPECT_EQ(res->status, 200);
    EXPECT_TRUE(Contains(res->body, "asyncps_test_total 5\n"));
  }

  Registry registry_;
  std::unique_ptr<MetricsServer> server_;
};

TEST_F(MetricsHttp, ServesTheRegistry) {
  httplib::Client c("127.0.0.1", server_->port());
  auto res = c.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"),
            "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(res->body, registry_.Render());
  EXPECT_EQ(server_->scrapes(), 1u);
  std::ifstream f(testing::TempDir() + "/metrics.port");
  int port = 0;
  f >> port;
  EXPECT_EQ(port, server_->port());
  EXPECT_EQ(server_->endpoint(),
            "http://127.0.0.1:" + std::to_string(server_->port()) + "/metrics");
}

TEST_F(MetricsHttp, UnknownPathsAndMethods) {
  httplib::Client c("127.0.0.1", server_->port());
  auto res = c.Get("/nope");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
  res = c.Post("/metrics", "", "text/plain");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 405);
  EXPECT_EQ(res->get_header_value("Allow"), "GET, HEAD");
  res = c.Post("/metrics", "a body", "text/plain");  // never read
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 413);
  res = c.Get("/");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(server_->scrapes(), 0u);
}

TEST_F(MetricsHttp, SurvivesGarbage) {
  const std::string replies[] = {
      RawExchange("\x01\x02garbage\r\n\r\n"),
      RawExchange("GET /metrics HTTP/9.9 extra words\r\n\r\n"),
      RawExchange("GET /" + std::string(20000, 'a') + " HTTP/1.1\r\n\r\n"),
      RawExchange(std::string(100000, 'x')),
      RawExchange("GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: "
                  "99999999999\r\n\r\n"),
  };
  for (const std::string& r : replies) {
    // Each gets a 4xx or a closed connection, never a crash.
    if (!r.empty()) {
      EXPECT_TRUE(r.rfind("HTTP/1.1 4", 0) == 0 ||
                  r.rfind("HTTP/1.1 2", 0) == 0)
          << r.substr(0, 80);
    }
  }
  ExpectScrapeWorks();
}

TEST_F(MetricsHttp, SlowClientsDoNotBlockScrapes) {
  // Two idle connections (as many as the pool has threads) and one that
  // sends half a request line: each is cut after io_timeout.
  int idle1 = Connect(), idle2 = Connect(), half = Connect();
  ASSERT_EQ(send(half, "GET /met", 8, MSG_NOSIGNAL), 8);
  const auto start = std::chrono::steady_clock::now();
  ExpectScrapeWorks();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  close(idle1);
  close(idle2);
  close(half);
}

TEST_F(MetricsHttp, ManyConnections) {
  std::vector<std::future<int>> results;
  for (int i = 0; i < 64; ++i) {
    results.push_back(std::async(std::launch::async, [this] {
      httplib::Client c("127.0.0.1", server_->port());
      c.set_read_timeout(std::chrono::seconds(10));
      auto res = c.Get("/metrics");
      return res ? res->status : -1;
    }));
  }
  for (auto& r : results) EXPECT_EQ(r.get(), 200);
  EXPECT_EQ(server_->scrapes(), 64u);
}

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A client that sends its request head one header line every 200 ms (each
// line well within io_timeout) for up to `longest`; returns how long after
// `start` the server cut it off (replied or closed), `longest` if never.
Clock::duration DripHeaders(int port, Clock::time_point start,
                            Clock::duration longest, int id) {
  const int fd = ConnectTo(port);
  std::string line = "GET /metrics HTTP/1.1\r\n";
  while (Clock::now() - start < longest) {
    if (send(fd, line.data(), line.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(line.size()))
      break;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 200) != 0) break;  // a reply, EOF or a reset: cut off
    line = "X-Slow-" + std::to_string(id) + ": x\r\n";
  }
  close(fd);
  return std::min<Clock::duration>(Clock::now() - start, longest);
}

// Sends `head` as fast as the server takes it (stopping where it refuses
// more), then returns what the server answered before closing.
std::string SendAll(int port, const std::string& head) {
  const int fd = ConnectTo(port);
  for (size_t at = 0; at < head.size();) {
    const ssize_t n =
        send(fd, head.data() + at, std::min<size_t>(head.size() - at, 4096),
             MSG_NOSIGNAL);
    if (n <= 0) break;
    at += static_cast<size_t>(n);
  }
  timeval tv{3, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string got;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) got.append(buf, n);
  close(fd);
  return got;
}

// Scrapes `port` until `until`; every scrape must be answered 200 within
// `bound`. Returns how many were.
int ScrapeUntil(int port, Clock::time_point until, Clock::duration bound) {
  int ok = 0;
  while (Clock::now() < until) {
    const auto t0 = Clock::now();
    httplib::Client c("127.0.0.1", port);
    c.set_connection_timeout(std::chrono::seconds(2));
    c.set_read_timeout(std::chrono::seconds(2));
    auto res = c.Get("/metrics");
    const auto took = Clock::now() - t0;
    EXPECT_TRUE(res && res->status == 200)
        << "scrape " << ok << ": "
        << (res ? std::to_string(res->status)
                : httplib::to_string(res.error()));
    if (!res) return ok;
    EXPECT_LT(took, bound)
        << "scrape " << ok << " took "
        << std::chrono::duration_cast<milliseconds>(took).count() << " ms";
    EXPECT_TRUE(Contains(res->body, "asyncps_test_total 5\n"));
    ++ok;
    std::this_thread::sleep_for(milliseconds(50));
  }
  return ok;
}

// A MetricsServer with `o` on 127.0.0.1 and a client that sends its head
// one line every 200 ms (DripHeaders) `slow_clients` times, from start().
class MetricsHttpAbuse : public testing::Test {
 protected:
  void Start(const MetricsServerOptions& o, int slow_clients,
             Clock::duration longest) {
    registry_.AddCounter("asyncps_test_total", "A test counter.").Get().Inc(5);
    auto s = MetricsServer::Start(o, &registry_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(s).value();
    port_ = server_->port();
    start_ = Clock::now();
    for (int i = 0; i < slow_clients; ++i) {
      slow_.push_back(std::async(std::launch::async, DripHeaders, port_, start_,
                                 longest, i));
    }
  }

  Registry registry_;
  std::unique_ptr<MetricsServer> server_;
  int port_ = 0;
  Clock::time_point start_;
  std::vector<std::future<Clock::duration>> slow_;
};

// Issue 40: one header line a second from each of two clients kept both of
// the pool's threads (the library's read timeout is per read, not per
// request) and every scrape timed out for as long as they went on. Slow and
// oversized requests must never delay a correct scraper; the slow ones are
// cut off at request_timeout, the oversized ones get 4xx or a close.
TEST_F(MetricsHttpAbuse, SlowAndOversizedClientsNeverDelayScrapes) {
  MetricsServerOptions o;
  o.io_timeout = milliseconds(500);
  o.request_timeout = milliseconds(1000);
  ASSERT_NO_FATAL_FAILURE(Start(o, 6, milliseconds(4000)));
  std::string many = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 5000; ++i) many += "X-H-" + std::to_string(i) + ": v\r\n";
  many += "\r\n";
  const std::string huge = "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " +
                           std::string(1 << 20, 'a') + "\r\n\r\n";
  auto many_reply = std::async(std::launch::async, SendAll, port_, many);
  auto huge_reply = std::async(std::launch::async, SendAll, port_, huge);
  std::this_thread::sleep_for(milliseconds(300));  // the slow ones are in

  EXPECT_GE(ScrapeUntil(port_, start_ + milliseconds(3000), milliseconds(500)),
            10);
  for (size_t i = 0; i < slow_.size(); ++i) {
    const auto cut = slow_[i].get();
    EXPECT_LT(cut, milliseconds(2500))
        << "slow client " << i << " not cut off at the deadline";
    EXPECT_GE(cut, milliseconds(900)) << "slow client " << i << " cut early";
  }
  for (auto* reply : {&many_reply, &huge_reply}) {
    const std::string r = reply->get();
    EXPECT_TRUE(r.empty() || r.rfind("HTTP/1.1 4", 0) == 0) << r.substr(0, 80);
  }
  EXPECT_EQ(
      ScrapeUntil(port_, Clock::now() + milliseconds(1), milliseconds(500)), 1);
}

// More slow connections than max_connections: the oldest ones still
// sending their heads make room, and scrapes are answered at once.
TEST_F(MetricsHttpAbuse, ConnectionsBeyondTheCapEvictTheSlowest) {
  MetricsServerOptions o;
  o.io_timeout = milliseconds(1000);
  o.request_timeout = milliseconds(5000);
  o.max_connections = 4;
  ASSERT_NO_FATAL_FAILURE(Start(o, 8, milliseconds(3000)));
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_GE(ScrapeUntil(port_, start_ + milliseconds(1500), milliseconds(500)),
            5);
  int evicted = 0;
  for (auto& f : slow_) evicted += f.get() < milliseconds(2000);
  EXPECT_GE(evicted, 4);
}

TEST(MetricsHttpOptions, BadOptionsAndBusyPort) {
  Registry r;
  MetricsServerOptions o;
  o.port = 70000;
  EXPECT_EQ(MetricsServer::Start(o, &r).status().code(),
            StatusCode::kInvalidArgument);
  o.port = 0;
  EXPECT_EQ(MetricsServer::Start(o, nullptr).status().code(),
            StatusCode::kInvalidArgument);
  for (int bad = 0; bad < 5; ++bad) {
    MetricsServerOptions b;
    if (bad == 0) b.request_timeout = std::chrono::milliseconds(0);
    if (bad == 1) b.max_headers = 0;
    if (bad == 2) b.max_header_bytes = 100;
    if (bad == 3) b.max_header_bytes = (1 << 20) + 1;
    if (bad == 4) b.max_connections = 0;
    EXPECT_EQ(MetricsServer::Start(b, &r).status().code(),
              StatusCode::kInvalidArgument)
        << "case " << bad;
  }
  auto first = MetricsServer::Start(o, &r);
  ASSERT_TRUE(first.ok());
  o.port = (*first)->port();
  auto second = MetricsServer::Start(o, &r);
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(second.status().message(), std::to_string(o.port)));
}

}  // namespace
}  // namespace asyncps::metrics
