// ps_bench_etcd: what one etcd request costs the membership loop of a
// replicated shard (server/replication/membership.h), which polls etcd
// every 100 ms: a range read of the layout and members, and a lease
// keep-alive. Each call is timed with the client keeping its connection
// open (EtcdOptions::keep_alive, the default) and, as the same-run
// baseline, with a new connection per call; the two alternate within each
// repeat, in a rotating order.
//
// Starts its own etcd (Debian's /usr/bin/etcd, on free loopback ports, with
// the test fixture's flags) in a temp folder and kills it at the end; exits
// 77 when etcd is not installed.
//
// One JSON object per line:
//   {"bench":"etcd","op":"range"|"keepalive","keep_alive":true,
//    "calls":..,"etcd_cpu_ms_per_call":{spread},"client_us_per_call":{spread},
//    "baseline":"keep_alive=false","baseline_etcd_cpu_ms_per_call":{..},
//    "baseline_client_us_per_call":{..},"ratio":..,"ratio_spread":{..},
//    "latency_ratio":..}
// ratio = the median of the per-repeat etcd CPU per call with keep-alive /
// without (below 1: keep-alive saves etcd CPU); latency_ratio likewise for
// the client's wall time per call.
//
// Quiet run: ps_bench_etcd --repeats=9 --calls=500
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/etcd_client.h"
#include "experiments/bench/bench_util.h"
#include "tests/util/etcd_fixture.h"

DEFINE_int32(calls, 300, "calls per measurement");
DEFINE_int32(repeats, 5, "repeats of every measurement (median reported)");
DEFINE_bool(quick, false, "2 repeats of 50 calls (a smoke run)");

namespace {

using namespace asyncps;  // NOLINT: tool main
using Clock = std::chrono::steady_clock;

struct Sample {
  double etcd_cpu_ms_per_call = 0;
  double client_us_per_call = 0;
};

// Runs `calls` calls of `op` on a client made with `keep_alive`, timing
// etcd's CPU and the client's wall time. Exits on a failed call.
Sample Measure(const std::string& endpoint, pid_t etcd_pid, bool keep_alive,
               const std::string& op, int64_t lease, int calls) {
  EtcdOptions o;
  o.endpoints = {endpoint};
  o.keep_alive = keep_alive;
  auto client = EtcdClient::Create(o);
  CHECK(client.ok()) << client.status().ToString();
  const double cpu0 = bench::ProcessCpuSeconds(etcd_pid);
  const auto t0 = Clock::now();
  for (int i = 0; i < calls; ++i) {
    Status s;
    if (op == "range") {
      // The membership loop's read: the layout and every member key.
      s = (*client)
              ->GetRange("/asyncps/bench/layout", "/asyncps/bench/members0")
              .status();
    } else {
      s = (*client)->KeepAlive(lease);
    }
    if (!s.ok()) {
      std::fprintf(stderr, "ps_bench_etcd: %s failed: %s\n", op.c_str(),
                   s.ToString().c_str());
      std::exit(1);
    }
  }
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  const double cpu = bench::ProcessCpuSeconds(etcd_pid) - cpu0;
  Sample out;
  out.etcd_cpu_ms_per_call = 1e3 * cpu / calls;
  out.client_us_per_call = 1e6 * wall / calls;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("etcd request cost with and without keep-alive");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  if (FLAGS_quick) {
    FLAGS_repeats = 2;
    FLAGS_calls = 50;
  }
  if (FLAGS_calls < 1 || FLAGS_repeats < 1) {
    std::fprintf(stderr, "ps_bench_etcd: --calls and --repeats must be >= 1\n");
    return 2;
  }
  if (!testing::EtcdServer::Available()) {
    std::fprintf(stderr, "ps_bench_etcd: no etcd at %s: skipped\n",
                 testing::EtcdServer::Binary().c_str());
    return 77;
  }
  char dir_template[] = "/tmp/ps_bench_etcd.XXXXXX";
  const char* dir = mkdtemp(dir_template);
  CHECK(dir != nullptr) << "mkdtemp failed";
  int rc = 0;
  {
    auto etcd = testing::EtcdServer::Start(std::string(dir) + "/data", dir);
    CHECK(etcd.ok()) << etcd.status().ToString();
    const std::string endpoint = (*etcd)->endpoint();
    EtcdOptions o;
    o.endpoints = {endpoint};
    auto setup = EtcdClient::Create(o);
    CHECK(setup.ok());
    // A layout and three members, as a 3-group fleet keeps them.
    CHECK((*setup)->Put("/asyncps/bench/layout", std::string(600, 'l')).ok());
    auto lease = (*setup)->GrantLease(std::chrono::seconds(60));
    CHECK(lease.ok()) << lease.status().ToString();
    for (int m = 0; m < 3; ++m) {
      CHECK((*setup)
                ->Put("/asyncps/bench/members/" + std::to_string(m),
                      std::string(120, 'm'), *lease)
                .ok());
    }
    for (const std::string op : {"range", "keepalive"}) {
      std::vector<double> cpu_on, cpu_off, us_on, us_off;
      for (int r = 0; r < FLAGS_repeats; ++r) {
        Sample on, off;
        if (r % 2 == 0) {
          on = Measure(endpoint, (*etcd)->pid(), true, op, *lease, FLAGS_calls);
          off =
              Measure(endpoint, (*etcd)->pid(), false, op, *lease, FLAGS_calls);
        } else {
          off =
              Measure(endpoint, (*etcd)->pid(), false, op, *lease, FLAGS_calls);
          on = Measure(endpoint, (*etcd)->pid(), true, op, *lease, FLAGS_calls);
        }
        cpu_on.push_back(on.etcd_cpu_ms_per_call);
        cpu_off.push_back(off.etcd_cpu_ms_per_call);
        us_on.push_back(on.client_us_per_call);
        us_off.push_back(off.client_us_per_call);
      }
      bench::Json j;
      j["bench"] = "etcd";
      j["op"] = op;
      j["keep_alive"] = true;
      j["calls"] = FLAGS_calls;
      j["etcd_cpu_ms_per_call"] = bench::ToJson(bench::SpreadOf(cpu_on));
      j["client_us_per_call"] = bench::ToJson(bench::SpreadOf(us_on), 1);
      j["baseline"] = "keep_alive=false";
      j["baseline_etcd_cpu_ms_per_call"] =
          bench::ToJson(bench::SpreadOf(cpu_off));
      j["baseline_client_us_per_call"] =
          bench::ToJson(bench::SpreadOf(us_off), 1);
      const bench::Spread ratio =
          bench::SpreadOf(bench::Ratios(cpu_on, cpu_off));
      j["ratio"] = bench::Round(ratio.median, 3);
      j["ratio_spread"] = bench::ToJson(ratio);
      j["latency_ratio"] =
          bench::Round(bench::SpreadOf(bench::Ratios(us_on, us_off)).median, 3);
      bench::Emit(j);
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return rc;
}
