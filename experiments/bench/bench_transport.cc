// ps_bench_transport: push and pull throughput through a real ps_server on
// loopback, next to a raw ZeroMQ DEALER/ROUTER echo of the same sizes
// measured in the same run.
//
// For each tensor size and number of requests in flight it prints one JSON
// line per (mode, op): mode "transport_only" (server validates and acks
// pushes without applying) or "sgd" (server applies SGD), op "push" or
// "pull", our MB/s and ops/s, the raw baseline's, and ratio = ours / raw.
// Every point is measured --repeats times, raw and ours alternating (a burst
// of load on a shared machine hits both); figures are medians, the ratio is
// the median of the per-repeat ratios, with the spreads. cpu_ms_per_gb is
// the CPU time (user + system) both processes (ours: client and ps_server;
// raw: the one process holding both sockets) spent per GB moved, a figure
// that a loaded machine disturbs much less than throughput.
// --transport=ipc runs both over ipc:// (Unix domain sockets) instead of
// tcp://127.0.0.1.
// --transport=shm measures the colocated pull paths against memcpy, all in
// the same run: pulls of each size through the shard's shared-memory path
// (client with shared memory, destinations in it; common/shm_segment.h),
// the same pulls over ipc:// sockets, and a memcpy of the same bytes into a
// warm destination (one JSON line per size and in-flight count, op
// "pull", mode "shm"; ratio = shm / memcpy, ratio_ipc = ipc / memcpy).
//
// --replicas=2 measures replication's cost: pushes (SGD applied) and pulls
// through a replica group of 2 (primary + backup, a local etcd started by
// this benchmark: /usr/bin/etcd) against the same through one ps_server
// (--replicas=1 of the same group code), alternating; one JSON line per
// (size, in flight, op), mode "replicas2", baseline "replicas1", ratio =
// replicated / single; also the CPU time of the bench and the replicas per
// GB for both, and cpu_ceiling = cpu(R=1) / cpu(R=2): the ratio R=2 can reach
// where the cores are the limit. Needs Debian's etcd-server. With
// --baseline_server=PATH the baseline is a group of 2 of another ps_server
// build (baseline "replicas2_baseline_server"): the cost of a change to
// replication itself, e.g. replica authentication against a build without.
// --replica_flags=--replica_tag=all gives our group (not the baseline) more
// flags: the cost of tagging every byte.
//
// Usage: ps_bench_transport [--sizes=4096,1048576,16777216,67108864]
//        [--inflight=1,8] [--seconds=0.7] [--repeats=5] [--server=PATH]
//        [--transport=tcp|ipc|shm] [--quick]
// Quiet run: ps_bench_transport --repeats=9 --seconds=1
#include <arpa/inet.h>
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>
#include <zmq.hpp>

#include "experiments/bench/bench_util.h"
#include "worker/client.h"

DEFINE_string(sizes, "4096,1048576,16777216,67108864", "Tensor sizes in bytes");
DEFINE_string(inflight, "1,8", "Requests in flight");
DEFINE_double(seconds, 0.7, "Measuring time per point and repeat");
DEFINE_string(server, "", "ps_server binary (default: next to this binary)");
DEFINE_bool(quick, false, "Short run: 0.3 s per point");
DEFINE_string(modes, "transport_only,sgd", "Server modes to measure");
DEFINE_string(curve, "", "Also measure with CurveZMQ encryption when 'on'");
DEFINE_int32(repeats, 5,
             "Measure every point this many times, raw and ours alternating; "
             "medians and spreads are reported (these machines are noisy)");
DEFINE_bool(baseline, true,
            "measure the raw ZeroMQ baseline (false: ours only, e.g. under a "
            "profiler; no ratios)");
DEFINE_string(transport, "tcp", "tcp (127.0.0.1) or ipc (Unix domain socket)");
DEFINE_string(baseline_server, "",
              "with --replicas=2: the baseline is a replica group of 2 run by "
              "this ps_server binary (another build), not one replica");
DEFINE_string(replica_flags, "",
              "with --replicas=2: more ps_server flags for our group "
              "(comma-separated), e.g. --replica_tag=all; not for the "
              "baseline");
DEFINE_int32(replicas, 0,
             "2: measure a replica group of 2 against one replica (see the "
             "file comment); 0: the ordinary rows");

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
  double cpu_ms_per_gb = 0;  // CPU time of both processes per GB moved
};

// A fresh endpoint of --transport for a server to bind.
std::string BindEndpoint(const std::filesystem::path& dir) {
  if (FLAGS_transport != "tcp") return "ipc://" + (dir / "sock").string();
  return "tcp://127.0.0.1:0";
}

// Runs `start` / `wait` keeping `inflight` operations outstanding for
// `seconds`; returns the throughput for `bytes` per operation.
template <typename Start, typename Wait, typename Cpu>
Rate Measure(int inflight, size_t bytes, Start start, Wait wait, Cpu cpu) {
  std::deque<uint64_t> q;
  // Warm up.
  for (int i = 0; i < inflight; ++i) q.push_back(start());
  while (!q.empty()) {
    wait(q.front());
    q.pop_front();
  }
  const double seconds = FLAGS_quick ? 0.3 : FLAGS_seconds;
  int64_t done = 0;
  const double cpu0 = cpu();
  auto t0 = Clock::now();
  for (int i = 0; i < inflight; ++i) q.push_back(start());
  while (true) {
    wait(q.front());
    q.pop_front();
    ++done;
    if (std::chrono::duration<double>(Clock::now() - t0).count() >= seconds)
      break;
    q.push_back(start());
  }
  while (!q.empty()) {
    wait(q.front());
    q.pop_front();
    ++done;
  }
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  const double gb = done * static_cast<double>(bytes) / 1e9;
  return {done * static_cast<double>(bytes) / s / 1e6, done / s,
          1e3 * (cpu() - cpu0) / gb};
}

// ---- raw ZeroMQ baseline ------------------------------------------------
// An echo server on a ROUTER: a message with a payload is answered with a
// 8-byte ack (push); a 8-byte request is answered with `bytes` (pull).
class RawServer {
 public:
  RawServer(zmq::context_t& ctx, size_t bytes, const std::string& endpoint)
      : socket_(ctx, zmq::socket_type::router), data_(bytes, 1) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.bind(endpoint == "tcp://127.0.0.1:0" ? "tcp://127.0.0.1:*"
                                                 : endpoint);
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

// The raw client against a RawServer in this process (one ZeroMQ context
// and I/O thread serve both ends: the historical baseline) or, with
// `two_processes`, in a forked child with its own context (the topology of
// a worker and a ps_server).
Rate RawMeasure(bool push, size_t bytes, int inflight, bool two_processes) {
  char tmpl[] = "/tmp/ps_bench_raw.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return {};
  const std::filesystem::path dir = tmpl;
  zmq::context_t ctx(1);
  std::optional<RawServer> server;
  std::string endpoint;
  pid_t child = -1;
  int pipe_fds[2] = {-1, -1};
  if (two_processes) {
    if (pipe(pipe_fds) != 0) return {};
    child = fork();
    if (child == 0) {
      close(pipe_fds[0]);
      {
        zmq::context_t child_ctx(1);
        RawServer s(child_ctx, bytes, BindEndpoint(dir));
        const std::string ep = s.endpoint() + "\n";
        if (write(pipe_fds[1], ep.data(), ep.size()) !=
            static_cast<ssize_t>(ep.size())) {
          _exit(1);
        }
        // Serve until the parent is done (SIGTERM).
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGTERM);
        pthread_sigmask(SIG_BLOCK, &set, nullptr);
        int sig = 0;
        sigwait(&set, &sig);
      }
      _exit(0);
    }
    close(pipe_fds[1]);
    char buf[512];
    ssize_t got = 0, r;
    while ((r = read(pipe_fds[0], buf + got, sizeof(buf) - 1 - got)) > 0) {
      got += r;
      if (std::memchr(buf, '\n', got) != nullptr) break;
    }
    close(pipe_fds[0]);
    buf[got] = 0;
    endpoint = std::string(buf, std::strcspn(buf, "\n"));
  } else {
    server.emplace(ctx, bytes, BindEndpoint(dir));
    endpoint = server->endpoint();
  }
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(endpoint);
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
    if (!push)
      std::memcpy(dst.data(), m.data(), std::min(m.size(), dst.size()));
  };
  Rate r = Measure(inflight, bytes, start, wait, [child] {
    return bench::ProcessCpuSeconds() +
           (child > 0 ? bench::ProcessCpuSeconds(child) : 0.0);
  });
  dealer.close();
  server.reset();
  if (child > 0) {
    kill(child, SIGTERM);
    int st;
    waitpid(child, &st, 0);
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return r;
}

// ---- ps_server ------------------------------------------------------------
// A child process (ps_server, etcd) with its temp folder: SIGTERM, reaped
// and the folder removed when it goes.
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

// Forks and execs args[0] with its stderr and stdout in `log`.
pid_t Spawn(std::vector<std::string> args, const std::string& log) {
  pid_t pid = fork();
  if (pid == 0) {
    freopen(log.c_str(), "w", stderr);
    freopen(log.c_str(), "a", stdout);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

StatusOr<std::unique_ptr<ServerProcess>> StartServer(
    const std::string& bin, bool transport_only,
    const CurveKeys* curve = nullptr,
    const std::vector<std::string>& extra = {}) {
  auto p = std::make_unique<ServerProcess>();
  char tmpl[] = "/tmp/ps_bench_transport.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return Status::Internal("mkdtemp failed");
  p->dir = tmpl;
  std::string ready = (p->dir / "ready").string();
  std::vector<std::string> args = {
      bin,
      "--endpoint=" + BindEndpoint(p->dir),
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
  args.insert(args.end(), extra.begin(), extra.end());
  if (curve != nullptr) {
    std::ofstream allowed(p->dir / "allowed");
    allowed << curve->client_public << "\n";
    args.push_back("--curve_secret_key=" + curve->server_secret);
    args.push_back("--curve_allowed_clients=" + (p->dir / "allowed").string());
  }
  const pid_t pid = Spawn(args, (p->dir / "server.log").string());
  p->pid = pid;
  for (int i = 0; i < 1000; ++i) {
    std::ifstream f(ready);
    if (f && std::getline(f, p->endpoint) && !p->endpoint.empty()) return p;
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) {
      p->pid = -1;
      return Status::Unavailable("ps_server exited during start; see " +
                                 (p->dir / "server.log").string());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return Status::TimedOut("ps_server did not write its ready file within 10 s");
}

// Pushes or pulls through the shard at `endpoint` ("ep1|ep2" for a replica
// group) whose server processes are `pids`.
StatusOr<Rate> MeasureAt(const std::string& endpoint,
                         const std::vector<pid_t>& pids, bool push,
                         size_t bytes, int inflight, const CurveKeys* curve,
                         bool shm);

StatusOr<Rate> OursMeasure(const std::string& bin, bool transport_only,
                           bool push, size_t bytes, int inflight,
                           const CurveKeys* curve = nullptr, bool shm = false) {
  ASSIGN_OR_RETURN(auto server, StartServer(bin, transport_only, curve));
  return MeasureAt(server->endpoint, {server->pid}, push, bytes, inflight,
                   curve, shm);
}

StatusOr<Rate> MeasureAt(const std::string& endpoint,
                         const std::vector<pid_t>& pids, bool push,
                         size_t bytes, int inflight, const CurveKeys* curve,
                         bool shm) {
  ClientOptions co;
  co.servers = {endpoint};
  co.rank = 0;
  if (shm)
    co.shared_memory_bytes = static_cast<size_t>(inflight) * bytes + (1 << 20);
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
  std::vector<std::vector<float>> dst_heap(shm ? 0 : inflight,
                                           std::vector<float>(bytes / 4));
  std::vector<float*> dst;
  for (int i = 0; i < inflight; ++i) {
    float* d = shm ? client->AllocateShared(bytes / 4) : dst_heap[i].data();
    if (d == nullptr)
      return Status::Internal("no shared memory for the pull destinations");
    std::memset(d, 0,
                bytes / 4 * sizeof(float));  // warm, as the memcpy baseline's
    dst.push_back(d);
  }
  if (shm && client->shared_memory_shards() != 1)
    return Status::Unavailable(
        "the shard refused the shared memory (see its log)");
  Status failure;
  uint64_t n = 0;
  auto start = [&]() -> uint64_t {
    StatusOr<Client::Ticket> tk = Status::OK();
    if (push) {
      std::vector<ChunkPayload> p;
      for (const ChunkSpec& c : layout.chunks())
        p.push_back({c.id, 0, Frame::Ref(grads[c.id])});
      tk = client->StartPush(0, std::move(p));
    } else {
      tk = client->StartPull(0, {dst[n++ % inflight]});
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
  Rate r = Measure(inflight, bytes, start, wait, [&pids] {
    double cpu = bench::ProcessCpuSeconds();
    for (pid_t pid : pids) cpu += bench::ProcessCpuSeconds(pid);
    return cpu;
  });
  RETURN_IF_ERROR(failure);
  return r;
}

// memcpy of `bytes` from a source into one of `inflight` warm destinations,
// one after another: the bound of any copy path on this machine.
Rate MemcpyMeasure(size_t bytes, int inflight) {
  std::vector<uint8_t> src(bytes, 1);
  std::vector<std::vector<uint8_t>> dst(inflight,
                                        std::vector<uint8_t>(bytes, 0));
  uint64_t n = 0;
  auto start = [&]() -> uint64_t {
    std::memcpy(dst[n % inflight].data(), src.data(), bytes);
    return n++;
  };
  return Measure(
      inflight, bytes, start, [](uint64_t) {},
      [] { return bench::ProcessCpuSeconds(); });
}

// ---- --replicas ------------------------------------------------------------
// A local etcd (one member, 1 s leases as psrun starts it) for the groups.
using EtcdProcess = ServerProcess;

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

StatusOr<std::unique_ptr<EtcdProcess>> StartEtcd() {
  const char* bin = "/usr/bin/etcd";
  if (access(bin, X_OK) != 0)
    return Status::Unavailable("no /usr/bin/etcd (etcd-server)");
  auto e = std::make_unique<EtcdProcess>();
  char tmpl[] = "/tmp/ps_bench_etcd.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return Status::Internal("mkdtemp failed");
  e->dir = tmpl;
  const int client = FreePort(), peer = FreePort();
  e->endpoint = "http://127.0.0.1:" + std::to_string(client);
  std::vector<std::string> args = {
      bin,
      "--data-dir=" + (e->dir / "data").string(),
      "--listen-client-urls=" + e->endpoint,
      "--advertise-client-urls=" + e->endpoint,
      "--listen-peer-urls=http://127.0.0.1:" + std::to_string(peer),
      "--initial-advertise-peer-urls=http://127.0.0.1:" + std::to_string(peer),
      "--initial-cluster=default=http://127.0.0.1:" + std::to_string(peer),
      "--heartbeat-interval=50",
      "--election-timeout=250"};
  e->pid = Spawn(args, (e->dir / "etcd.log").string());
  return e;  // the servers retry until it answers
}

// One row per (size, in flight, op): a replica group of 2 against 1.
int ReplicaRows(const std::string& bin) {
  auto fail = [](const Status& s) {
    bench::Json e;
    e["bench"] = "transport";
    e["error"] = s.ToString();
    bench::Emit(e);
    return 1;
  };
  auto etcd = StartEtcd();
  if (!etcd.ok()) return fail(etcd.status());
  int prefix = 0;
  // A fresh group of `replicas` per measurement (as OursMeasure starts a
  // fresh server), under its own key prefix.
  auto measure = [&](int replicas, bool push, size_t bytes, int inflight,
                     const std::string& server, bool ours) -> StatusOr<Rate> {
    const std::string pre =
        "/bench/" + std::to_string(getpid()) + "-" + std::to_string(prefix++);
    std::vector<std::unique_ptr<ServerProcess>> group;
    std::string endpoint;
    std::vector<pid_t> pids;
    for (int r = 0; r < replicas; ++r) {
      std::vector<std::string> flags = {
          "--etcd=" + (*etcd)->endpoint, "--etcd_prefix=" + pre,
          "--replicas=" + std::to_string(replicas),
          "--replica=" + std::to_string(r)};
      if (ours) {
        for (const std::string& f : ParseNames(FLAGS_replica_flags))
          if (!f.empty()) flags.push_back(f);
      }
      ASSIGN_OR_RETURN(auto s, StartServer(server, false, nullptr, flags));
      endpoint += (r ? "|" : "") + s->endpoint;
      pids.push_back(s->pid);
      group.push_back(std::move(s));
    }
    return MeasureAt(endpoint, pids, push, bytes, inflight, nullptr, false);
  };
  for (int64_t bytes : ParseList(FLAGS_sizes)) {
    for (int64_t inflight : ParseList(FLAGS_inflight)) {
      for (bool push : {true, false}) {
        std::vector<Rate> one, two;
        for (int rep = 0; rep < std::max(1, FLAGS_repeats); ++rep) {
          // The baseline: one replica, or (--baseline_server) a group of
          // two run by another build, e.g. one without replica
          // authentication.
          auto a = FLAGS_baseline_server.empty()
                       ? measure(1, push, bytes, inflight, bin, false)
                       : measure(2, push, bytes, inflight,
                                 FLAGS_baseline_server, false);
          if (!a.ok()) return fail(a.status());
          auto b = measure(2, push, bytes, inflight, bin, true);
          if (!b.ok()) return fail(b.status());
          one.push_back(*a);
          two.push_back(*b);
        }
        const bool small = bytes < (1 << 20);
        auto metric = [small](const std::vector<Rate>& v) {
          std::vector<double> out;
          for (const Rate& r : v)
            out.push_back(small ? r.ops_per_s : r.mb_per_s);
          return out;
        };
        auto mbs = [](const std::vector<Rate>& v) {
          std::vector<double> out;
          for (const Rate& r : v) out.push_back(r.mb_per_s);
          return out;
        };
        bench::Json j;
        j["bench"] = "transport";
        j["op"] = push ? "push" : "pull";
        j["mode"] = "replicas2";
        j["transport"] = "tcp";
        j["bytes"] = bytes;
        j["inflight"] = inflight;
        j["mb_per_s"] = bench::Round(bench::SpreadOf(mbs(two)).median, 1);
        j["baseline"] = FLAGS_baseline_server.empty()
                            ? "replicas1"
                            : "replicas2_baseline_server";
        if (!FLAGS_baseline_server.empty())
          j["baseline_server"] = FLAGS_baseline_server;
        if (!FLAGS_replica_flags.empty())
          j["replica_flags"] = FLAGS_replica_flags;
        j["baseline_mb_per_s"] =
            bench::Round(bench::SpreadOf(mbs(one)).median, 1);
        j["ratio_metric"] = small ? "ops_per_s" : "mb_per_s";
        const auto r = bench::SpreadOf(bench::Ratios(metric(two), metric(one)));
        j["ratio"] = bench::Round(r.median, 3);
        j["ratio_spread"] = bench::ToJson(r);
        // CPU time of the bench and every replica per GB moved: the
        // backups' receive, copy and apply. Where the cores are the limit
        // (8 in flight on this 2-core machine), R=2 can reach at most
        // cpu(R=1) / cpu(R=2) of R=1's throughput: cpu_ceiling.
        auto cpu = [](const std::vector<Rate>& v) {
          std::vector<double> out;
          for (const Rate& x : v) out.push_back(x.cpu_ms_per_gb);
          return out;
        };
        const auto ceiling = bench::SpreadOf(bench::Ratios(cpu(one), cpu(two)));
        j["cpu_ms_per_gb"] = bench::Round(bench::SpreadOf(cpu(two)).median, 1);
        j["baseline_cpu_ms_per_gb"] =
            bench::Round(bench::SpreadOf(cpu(one)).median, 1);
        j["cpu_ceiling"] = bench::Round(ceiling.median, 3);
        j["ratio_vs_cpu_ceiling"] =
            ceiling.median > 0 ? bench::Round(r.median / ceiling.median, 3)
                               : 0.0;
        bench::Emit(j);
      }
    }
  }
  return 0;
}

// --transport=shm: see the file comment.
int ShmRows(const std::string& bin) {
  for (int64_t bytes : ParseList(FLAGS_sizes)) {
    for (int64_t inflight : ParseList(FLAGS_inflight)) {
      std::vector<Rate> shm, ipc, mem;
      for (int rep = 0; rep < std::max(1, FLAGS_repeats); ++rep) {
        mem.push_back(MemcpyMeasure(bytes, inflight));
        auto a = OursMeasure(bin, true, false, bytes, inflight, nullptr, true);
        auto b = OursMeasure(bin, true, false, bytes, inflight, nullptr, false);
        if (!a.ok() || !b.ok()) {
          bench::Json e;
          e["bench"] = "transport";
          e["error"] = (a.ok() ? b.status() : a.status()).ToString();
          bench::Emit(e);
          return 1;
        }
        shm.push_back(*a);
        ipc.push_back(*b);
      }
      auto mbs = [](const std::vector<Rate>& v) {
        std::vector<double> out;
        for (const Rate& r : v) out.push_back(r.mb_per_s);
        return out;
      };
      auto cpu = [](const std::vector<Rate>& v) {
        std::vector<double> out;
        for (const Rate& r : v) out.push_back(r.cpu_ms_per_gb);
        return out;
      };
      bench::Json j;
      j["bench"] = "transport";
      j["op"] = "pull";
      j["mode"] = "shm";
      j["transport"] = "shm";
      j["bytes"] = bytes;
      j["inflight"] = inflight;
      j["mb_per_s"] = bench::Round(bench::SpreadOf(mbs(shm)).median, 1);
      j["cpu_ms_per_gb"] = bench::Round(bench::SpreadOf(cpu(shm)).median, 1);
      j["ipc_mb_per_s"] = bench::Round(bench::SpreadOf(mbs(ipc)).median, 1);
      j["ipc_cpu_ms_per_gb"] =
          bench::Round(bench::SpreadOf(cpu(ipc)).median, 1);
      j["baseline"] = "memcpy";
      j["baseline_mb_per_s"] =
          bench::Round(bench::SpreadOf(mbs(mem)).median, 1);
      j["ratio_metric"] = "mb_per_s";
      const auto r = bench::SpreadOf(bench::Ratios(mbs(shm), mbs(mem)));
      j["ratio"] = bench::Round(r.median, 3);
      j["ratio_spread"] = bench::ToJson(r);
      const auto ri = bench::SpreadOf(bench::Ratios(mbs(ipc), mbs(mem)));
      j["ratio_ipc"] = bench::Round(ri.median, 3);
      j["ratio_ipc_spread"] = bench::ToJson(ri);
      j["ratio_shm_vs_ipc"] = bench::Round(
          bench::SpreadOf(bench::Ratios(mbs(shm), mbs(ipc))).median, 3);
      bench::Emit(j);
    }
  }
  return 0;
}

// One row per mode (and with --curve=on one of CURVE) of `bytes` pushed or
// pulled with `inflight` requests in flight; 1 when a run failed (its error
// emitted), else 0. `keys`: CURVE keys, null when --curve is off.
int MeasureRows(const std::string& bin, const std::vector<std::string>& modes,
                const CurveKeys* keys, int64_t bytes, int64_t inflight,
                bool push) {
  const bool curve = keys != nullptr;
  // Raw and ours alternate, so a burst of load hits both alike.
  std::vector<Rate> raw, raw2;
  std::vector<std::vector<Rate>> ours(modes.size());
  std::vector<Rate> plain, enc;
  for (int rep = 0; rep < std::max(1, FLAGS_repeats); ++rep) {
    raw.push_back(FLAGS_baseline ? RawMeasure(push, bytes, inflight, false)
                                 : Rate{});
    raw2.push_back(FLAGS_baseline ? RawMeasure(push, bytes, inflight, true)
                                  : Rate{});
    for (size_t m = 0; m < modes.size(); ++m) {
      auto o =
          OursMeasure(bin, modes[m] == "transport_only", push, bytes, inflight);
      if (!o.ok()) {
        bench::Json e;
        e["bench"] = "transport";
        e["error"] = o.status().ToString();
        bench::Emit(e);
        return 1;
      }
      ours[m].push_back(*o);
    }
    if (curve) {
      // Encrypted + authenticated, server in transport-only mode: the
      // cost of CURVE next to the same-run plaintext transport-only run.
      auto p = OursMeasure(bin, true, push, bytes, inflight);
      auto e = OursMeasure(bin, true, push, bytes, inflight, keys);
      if (!p.ok() || !e.ok()) {
        bench::Json j;
        j["bench"] = "transport";
        j["error"] = (p.ok() ? e.status() : p.status()).ToString();
        bench::Emit(j);
        return 1;
      }
      plain.push_back(*p);
      enc.push_back(*e);
    }
  }
  const bool small = bytes < (1 << 20);
  auto metric = [small](const std::vector<Rate>& v) {
    std::vector<double> out;
    for (const Rate& r : v) out.push_back(small ? r.ops_per_s : r.mb_per_s);
    return out;
  };
  auto field = [](const std::vector<Rate>& v, double Rate::*f) {
    std::vector<double> out;
    for (const Rate& r : v) out.push_back(r.*f);
    return out;
  };
  // Medians of the repeats' MB/s, ops/s and CPU per GB, named prefix +
  // field.
  auto rates = [&field](bench::Json& j, const std::string& prefix,
                        const std::vector<Rate>& v) {
    j[prefix + "mb_per_s"] =
        bench::Round(bench::SpreadOf(field(v, &Rate::mb_per_s)).median, 1);
    j[prefix + "ops_per_s"] =
        bench::Round(bench::SpreadOf(field(v, &Rate::ops_per_s)).median, 1);
    j[prefix + "cpu_ms_per_gb"] =
        bench::Round(bench::SpreadOf(field(v, &Rate::cpu_ms_per_gb)).median, 1);
  };
  auto row = [&](const std::string& mode, const std::vector<Rate>& v) {
    const auto ratio = bench::SpreadOf(bench::Ratios(metric(v), metric(raw)));
    bench::Json j;
    j["bench"] = "transport";
    j["op"] = push ? "push" : "pull";
    j["mode"] = mode;
    j["transport"] = FLAGS_transport;
    j["bytes"] = bytes;
    j["inflight"] = inflight;
    rates(j, "", v);
    j["baseline"] = "raw_zmq_dealer_router";
    rates(j, "baseline_", raw);
    j["ratio_metric"] = small ? "ops_per_s" : "mb_per_s";
    j["ratio"] = bench::Round(ratio.median, 3);
    j["ratio_spread"] = bench::ToJson(ratio);
    // The same raw client and server, the server in its own process
    // (as ps_server is): the cost of two processes is in both.
    rates(j, "raw_2proc_", raw2);
    const auto vs2 = bench::SpreadOf(bench::Ratios(metric(v), metric(raw2)));
    j["ratio_vs_raw_2proc"] = bench::Round(vs2.median, 3);
    j["ratio_vs_raw_2proc_spread"] = bench::ToJson(vs2);
    j["cpu_ratio"] = bench::Round(
        bench::SpreadOf(bench::Ratios(field(raw, &Rate::cpu_ms_per_gb),
                                      field(v, &Rate::cpu_ms_per_gb)))
            .median,
        3);
    return j;
  };
  for (size_t m = 0; m < modes.size(); ++m) bench::Emit(row(modes[m], ours[m]));
  if (curve) {
    bench::Json j = row("curve", enc);
    j["plain_transport_only_mb_per_s"] =
        bench::Round(bench::SpreadOf(field(plain, &Rate::mb_per_s)).median, 1);
    j["ratio_vs_plain"] = bench::Round(
        bench::SpreadOf(bench::Ratios(metric(enc), metric(plain))).median, 3);
    bench::Emit(j);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  // As ps_worker and ps_server do; the raw baselines (this process and the
  // forked raw server) run with it too.
  (void)TuneAllocatorForMessages();
  std::string bin = FLAGS_server;
  if (bin.empty())
    bin = (std::filesystem::path(argv[0]).parent_path() / "ps_server").string();
  if (!std::filesystem::exists(bin)) {
    std::fprintf(stderr,
                 "ps_bench_transport: no ps_server at %s (use --server)\n",
                 bin.c_str());
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
    if (s.ok())
      s = GenerateCurveKeyPair(&keys.client_public, &keys.client_secret);
    if (!s.ok()) {
      std::fprintf(stderr, "ps_bench_transport: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  if (FLAGS_transport != "tcp" && FLAGS_transport != "ipc" &&
      FLAGS_transport != "shm") {
    std::fprintf(stderr,
                 "ps_bench_transport: --transport must be tcp, ipc or shm\n");
    return 2;
  }
  if (FLAGS_transport == "shm") return ShmRows(bin);
  if (FLAGS_replicas == 2) return ReplicaRows(bin);
  if (FLAGS_replicas != 0) {
    std::fprintf(stderr, "ps_bench_transport: --replicas must be 0 or 2\n");
    return 2;
  }
  const std::vector<std::string> modes = ParseNames(FLAGS_modes);
  for (int64_t bytes : ParseList(FLAGS_sizes)) {
    for (int64_t inflight : ParseList(FLAGS_inflight)) {
      for (bool push : {true, false}) {
        if (MeasureRows(bin, modes, curve ? &keys : nullptr, bytes, inflight,
                        push) != 0)
          return 1;
      }
    }
  }
  return 0;
}
