// ps_bench_transport: push and pull throughput through a real ps_server on
// loopback, next to a raw ZeroMQ DEALER/ROUTER echo of the same sizes
// measured in the same run.
//
// For each tensor size and number of requests in flight it prints one JSON
// line per (mode, op): mode "transport_only" (server validates and acks
// pushes without applying) or "sgd" (server applies SGD), op "push" or
// "pull", our MB/s and ops/s, the raw baseline's, and ratio = ours / raw.
//
// Usage: ps_bench_transport [--sizes=4096,1048576,16777216,67108864]
//        [--inflight=1,8] [--seconds=1.5] [--server=PATH] [--quick]
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <zmq.hpp>

#include "worker/client.h"

DEFINE_string(sizes, "4096,1048576,16777216,67108864", "Tensor sizes in bytes");
DEFINE_string(inflight, "1,8", "Requests in flight");
DEFINE_double(seconds, 0.7, "Measuring time per point and repeat");
DEFINE_string(server, "", "ps_server binary (default: next to this binary)");
DEFINE_bool(quick, false, "Short run: 0.3 s per point");
DEFINE_string(modes, "transport_only,sgd", "Server modes to measure");
DEFINE_string(curve, "", "Also measure with CurveZMQ encryption when 'on'");
DEFINE_int32(repeats, 3,
             "Measure every point this many times, raw and ours alternating, "
             "and keep the best of each (these machines are noisy)");

namespace {

using namespace asyncps;
using namespace asyncps::worker;
using Clock = std::chrono::steady_clock;

std::vector<int64_t> ParseList(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::stoll(item));
  return v;
}

std::vector<std::string> ParseNames(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(item);
  return v;
}

struct Rate {
  double mb_per_s = 0;
  double ops_per_s = 0;
};

// Runs `start` / `wait` keeping `inflight` operations outstanding for
// `seconds`; returns the throughput for `bytes` per operation.
template <typename Start, typename Wait>
Rate Measure(int inflight, size_t bytes, Start start, Wait wait) {
  std::deque<uint64_t> q;
  // Warm up.
  for (int i = 0; i < inflight; ++i) q.push_back(start());
  while (!q.empty()) {
    wait(q.front());
    q.pop_front();
  }
  const double seconds = FLAGS_quick ? 0.3 : FLAGS_seconds;
  int64_t done = 0;
  auto t0 = Clock::now();
  for (int i = 0; i < inflight; ++i) q.push_back(start());
  while (true) {
    wait(q.front());
    q.pop_front();
    ++done;
    if (std::chrono::duration<double>(Clock::now() - t0).count() >= seconds) break;
    q.push_back(start());
  }
  while (!q.empty()) {
    wait(q.front());
    q.pop_front();
    ++done;
  }
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  return {done * static_cast<double>(bytes) / s / 1e6, done / s};
}

// ---- raw ZeroMQ baseline ------------------------------------------------
// An echo server on a ROUTER: a message with a payload is answered with a
// 8-byte ack (push); a 8-byte request is answered with `bytes` (pull).
class RawServer {
 public:
  RawServer(zmq::context_t& ctx, size_t bytes) : socket_(ctx, zmq::socket_type::router), data_(bytes, 1) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.bind("tcp://127.0.0.1:*");
    endpoint_ = socket_.get(zmq::sockopt::last_endpoint);
    thread_ = std::thread([this] { Run(); });
  }
  ~RawServer() {
    stop_ = true;
    thread_.join();
  }
  const std::string& endpoint() const { return endpoint_; }

 private:
  void Run() {
    while (!stop_) {
      zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, std::chrono::milliseconds(20)) == 0) continue;
      zmq::message_t id, body;
      (void)socket_.recv(id);
      (void)socket_.recv(body);
      socket_.send(id, zmq::send_flags::sndmore);
      if (body.size() == 8) {
        // Zero-copy reply, as ps_server sends weights.
        zmq::message_t reply(data_.data(), data_.size(), nullptr, nullptr);
        socket_.send(reply, zmq::send_flags::none);
      } else {
        socket_.send(zmq::buffer("ack00000", 8));
      }
    }
  }
  zmq::socket_t socket_;
  std::vector<uint8_t> data_;
  std::string endpoint_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
};

Rate RawMeasure(bool push, size_t bytes, int inflight) {
  zmq::context_t ctx(1);
  RawServer server(ctx, bytes);
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(server.endpoint());
  std::vector<uint8_t> payload(bytes, 2);
  std::vector<uint8_t> dst(bytes);
  uint64_t next = 0;
  auto start = [&]() -> uint64_t {
    if (push) {
      zmq::message_t m(payload.data(), payload.size(), nullptr, nullptr);
      dealer.send(m, zmq::send_flags::none);
    } else {
      dealer.send(zmq::buffer("pull0000", 8));
    }
    return next++;
  };
  auto wait = [&](uint64_t) {
    zmq::message_t m;
    (void)dealer.recv(m);
    if (!push) std::memcpy(dst.data(), m.data(), std::min(m.size(), dst.size()));
  };
  return Measure(inflight, bytes, start, wait);
}

// ---- ps_server ------------------------------------------------------------
struct ServerProcess {
  pid_t pid = -1;
  std::string endpoint;
  std::filesystem::path dir;
  ~ServerProcess() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      int st;
      waitpid(pid, &st, 0);
    }
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
  }
};

// CurveZMQ keys of a --curve=on run (empty: plaintext).
struct CurveKeys {
  std::string server_public, server_secret, client_public, client_secret;
};

StatusOr<std::unique_ptr<ServerProcess>> StartServer(const std::string& bin, bool transport_only,
                                                     const CurveKeys* curve = nullptr) {
  auto p = std::make_unique<ServerProcess>();
  char tmpl[] = "/tmp/ps_bench_transport.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return Status::Internal("mkdtemp failed");
  p->dir = tmpl;
  std::string ready = (p->dir / "ready").string();
  std::vector<std::string> args = {bin,
                                   "--endpoint=tcp://127.0.0.1:0",
                                   "--ready_file=" + ready,
                                   "--shard_id=0",
                                   "--num_shards=1",
                                   "--num_workers=1",
                                   "--consistency=asp",
                                   "--optimizer=sgd",
                                   "--lr=0.0001",
                                   "--checkpoint_every_s=0",
                                   "--db_path=" + (p->dir / "db").string(),
                                   std::string("--transport_only=") + (transport_only ? "true" : "false")};
  if (curve != nullptr) {
    std::ofstream allowed(p->dir / "allowed");
    allowed << curve->client_public << "\n";
    args.push_back("--curve_secret_key=" + curve->server_secret);
    args.push_back("--curve_allowed_clients=" + (p->dir / "allowed").string());
  }
  pid_t pid = fork();
  if (pid == 0) {
    std::string log = (p->dir / "server.log").string();
    freopen(log.c_str(), "w", stderr);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  p->pid = pid;
  for (int i = 0; i < 1000; ++i) {
    std::ifstream f(ready);
    if (f && std::getline(f, p->endpoint) && !p->endpoint.empty()) return p;
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) {
      p->pid = -1;
      return Status::Unavailable("ps_server exited during start; see " + (p->dir / "server.log").string());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return Status::TimedOut("ps_server did not write its ready file within 10 s");
}

StatusOr<Rate> OursMeasure(const std::string& bin, bool transport_only, bool push, size_t bytes, int inflight,
                           const CurveKeys* curve = nullptr) {
  ASSIGN_OR_RETURN(auto server, StartServer(bin, transport_only, curve));
  ClientOptions co;
  co.servers = {server->endpoint};
  co.rank = 0;
  if (curve != nullptr) {
    co.transport.curve_server_key = curve->server_public;
    co.transport.curve_public_key = curve->client_public;
    co.transport.curve_secret_key = curve->client_secret;
  }
  ASSIGN_OR_RETURN(auto client, Client::Create(co));
  TensorSpec t;
  t.name = "t";
  t.shape = {static_cast<int64_t>(bytes / 4)};
  LayoutOptions lo;
  RETURN_IF_ERROR(client->Register({t}, lo));
  const Layout& layout = client->layout();
  std::vector<BufferPtr> grads;
  for (const ChunkSpec& c : layout.chunks()) {
    BufferPtr b = Buffer::Allocate(c.num_elems * 4);
    std::memset(b->data(), 0, b->size());
    grads.push_back(b);
  }
  std::vector<std::vector<float>> dst(inflight, std::vector<float>(bytes / 4));
  Status failure;
  uint64_t n = 0;
  auto start = [&]() -> uint64_t {
    StatusOr<Client::Ticket> tk = Status::OK();
    if (push) {
      std::vector<ChunkPayload> p;
      for (const ChunkSpec& c : layout.chunks()) p.push_back({c.id, 0, Frame::Ref(grads[c.id])});
      tk = client->StartPush(0, std::move(p));
    } else {
      tk = client->StartPull(0, {dst[n++ % inflight].data()});
    }
    if (!tk.ok()) {
      failure = tk.status();
      return 0;
    }
    return *tk;
  };
  auto wait = [&](uint64_t tk) {
    Status s = client->Wait(tk, std::chrono::seconds(30));
    if (!s.ok() && failure.ok()) failure = s;
  };
  Rate r = Measure(inflight, bytes, start, wait);
  RETURN_IF_ERROR(failure);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  std::string bin = FLAGS_server;
  if (bin.empty()) bin = (std::filesystem::path(argv[0]).parent_path() / "ps_server").string();
  if (!std::filesystem::exists(bin)) {
    std::fprintf(stderr, "ps_bench_transport: no ps_server at %s (use --server)\n", bin.c_str());
    return 2;
  }
  if (!FLAGS_curve.empty() && FLAGS_curve != "on" && FLAGS_curve != "off") {
    std::fprintf(stderr, "ps_bench_transport: --curve must be on or off\n");
    return 2;
  }
  CurveKeys keys;
  const bool curve = FLAGS_curve == "on";
  if (curve) {
    Status s = GenerateCurveKeyPair(&keys.server_public, &keys.server_secret);
    if (s.ok()) s = GenerateCurveKeyPair(&keys.client_public, &keys.client_secret);
    if (!s.ok()) {
      std::fprintf(stderr, "ps_bench_transport: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  for (int64_t bytes : ParseList(FLAGS_sizes)) {
    for (int64_t inflight : ParseList(FLAGS_inflight)) {
      for (bool push : {true, false}) {
        // Raw and ours alternate, so a burst of load hits both alike; the
        // best of the repeats is each one's figure.
        const std::vector<std::string> modes = ParseNames(FLAGS_modes);
        Rate raw;
        std::vector<Rate> best(modes.size());
        for (int rep = 0; rep < std::max(1, FLAGS_repeats); ++rep) {
          Rate r = RawMeasure(push, bytes, inflight);
          if (r.mb_per_s > raw.mb_per_s) raw = r;
          for (size_t m = 0; m < modes.size(); ++m) {
            auto o = OursMeasure(bin, modes[m] == "transport_only", push, bytes, inflight);
            if (!o.ok()) {
              std::printf("{\"bench\":\"transport\",\"error\":\"%s\"}\n", o.status().ToString().c_str());
              return 1;
            }
            if (o->mb_per_s > best[m].mb_per_s) best[m] = *o;
          }
        }
        for (size_t m = 0; m < modes.size(); ++m) {
          const std::string& mode = modes[m];
          const Rate* ours = &best[m];
          bool small = bytes < (1 << 20);
          double ratio = small ? ours->ops_per_s / raw.ops_per_s : ours->mb_per_s / raw.mb_per_s;
          std::printf(
              "{\"bench\":\"transport\",\"op\":\"%s\",\"mode\":\"%s\",\"bytes\":%lld,\"inflight\":%lld,"
              "\"mb_per_s\":%.1f,\"ops_per_s\":%.1f,\"baseline\":\"raw_zmq_dealer_router\","
              "\"baseline_mb_per_s\":%.1f,\"baseline_ops_per_s\":%.1f,\"ratio_metric\":\"%s\",\"ratio\":%.3f}\n",
              push ? "push" : "pull", mode.c_str(), static_cast<long long>(bytes), static_cast<long long>(inflight),
              ours->mb_per_s, ours->ops_per_s, raw.mb_per_s, raw.ops_per_s, small ? "ops_per_s" : "mb_per_s", ratio);
          std::fflush(stdout);
        }
        if (curve) {
          // Encrypted + authenticated, server in transport-only mode: the
          // cost of CURVE next to the same-run plaintext transport-only run.
          auto plain = OursMeasure(bin, true, push, bytes, inflight);
          auto enc = OursMeasure(bin, true, push, bytes, inflight, &keys);
          if (!plain.ok() || !enc.ok()) {
            std::printf("{\"bench\":\"transport\",\"error\":\"%s\"}\n",
                        (plain.ok() ? enc.status() : plain.status()).ToString().c_str());
            return 1;
          }
          bool small = bytes < (1 << 20);
          double ratio = small ? enc->ops_per_s / raw.ops_per_s : enc->mb_per_s / raw.mb_per_s;
          double vs_plain = small ? enc->ops_per_s / plain->ops_per_s : enc->mb_per_s / plain->mb_per_s;
          std::printf(
              "{\"bench\":\"transport\",\"op\":\"%s\",\"mode\":\"curve\",\"bytes\":%lld,\"inflight\":%lld,"
              "\"mb_per_s\":%.1f,\"ops_per_s\":%.1f,\"baseline\":\"raw_zmq_dealer_router\","
              "\"baseline_mb_per_s\":%.1f,\"baseline_ops_per_s\":%.1f,\"ratio_metric\":\"%s\",\"ratio\":%.3f,"
              "\"plain_transport_only_mb_per_s\":%.1f,\"plain_transport_only_ops_per_s\":%.1f,"
              "\"ratio_vs_plain\":%.3f}\n",
              push ? "push" : "pull", static_cast<long long>(bytes), static_cast<long long>(inflight), enc->mb_per_s,
              enc->ops_per_s, raw.mb_per_s, raw.ops_per_s, small ? "ops_per_s" : "mb_per_s", ratio, plain->mb_per_s,
              plain->ops_per_s, vs_plain);
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}
