// ps_bench_replica_mac: what a replica update's tag costs on one core
// (server/replication/replica_auth.h): ReplicaMac::Sign of a 200-byte header
// and one payload frame, covering every byte (Coverage::kAll) or the header
// and the frame lengths (kHeader, the default), next to a memcpy of the
// payload measured in the same repeat.
//
// One JSON object per line:
//   {"bench":"replica_mac","coverage":"all","bytes":1048576,"cache":"cold",
//    "gb_per_s":..,"baseline":"memcpy","baseline_gb_per_s":..,"ratio":..,
//    "us_per_message":..,"ratio_spread":{..},...}
// "cold" cycles through a 256 MiB buffer (each message's bytes come from
// memory, as a pushed tensor does), "hot" tags the same bytes again.
// ratio = tag throughput / memcpy throughput (the median of the per-repeat
// ratios). Flags: --quick, --reps=N.
// Quiet run: ps_bench_replica_mac --reps=9
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "experiments/bench/bench_util.h"
#include "server/replication/replica_auth.h"

namespace {

namespace bench = asyncps::bench;
using asyncps::server::replication::Coverage;
using asyncps::server::replication::kReplicaSecretBytes;
using asyncps::server::replication::ReplicaMac;
using asyncps::server::replication::TagPiece;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
      reps = 2;
    } else if (a.rfind("--reps=", 0) == 0) {
      reps = std::max(1, std::stoi(a.substr(7)));
    } else {
      std::fprintf(stderr,
                   "usage: ps_bench_replica_mac [--quick] [--reps=N]\n");
      return 2;
    }
  }
  auto mac = ReplicaMac::Create(std::string(kReplicaSecretBytes, 's'), 0);
  if (!mac.ok()) {
    std::fprintf(stderr, "%s\n", mac.status().ToString().c_str());
    return 1;
  }
  const size_t pool_bytes = quick ? (32u << 20) : (256u << 20);
  std::vector<uint8_t> pool(pool_bytes, 0x5a);
  for (size_t i = 0; i < pool.size(); i += 4096)
    pool[i] = static_cast<uint8_t>(i >> 12);
  const std::vector<uint8_t> header(200, 0x11);
  uint64_t id = 0;
  const std::vector<size_t> sizes =
      quick ? std::vector<size_t>{4096, 1 << 20}
            : std::vector<size_t>{4096, 1 << 20, 16 << 20};
  for (size_t bytes : sizes) {
    std::vector<uint8_t> dst(bytes);
    const size_t messages = std::max<size_t>(
        8,
        std::min<size_t>((quick ? 64u : 512u) << 20, pool_bytes * 4) / bytes);
    for (const char* cache : {"cold", "hot"}) {
      const bool cold = std::strcmp(cache, "cold") == 0;
      auto at = [&](size_t m) {
        return cold ? pool.data() + (m * bytes) % (pool_bytes - bytes)
                    : pool.data();
      };
      for (Coverage coverage : {Coverage::kAll, Coverage::kHeader}) {
        std::vector<double> ours, base, ratios;
        uint8_t sink = 0;
        for (int r = 0; r < reps; ++r) {
          auto t0 = Clock::now();
          for (size_t m = 0; m < messages; ++m)
            std::memcpy(dst.data(), at(m), bytes);
          const double b = Seconds(t0);
          sink ^= dst[bytes / 2];
          t0 = Clock::now();
          for (size_t m = 0; m < messages; ++m) {
            const std::vector<TagPiece> frames{{header.data(), header.size()},
                                               {at(m), bytes}};
            sink ^= (*mac)->Sign(++id, frames, coverage)[0];
          }
          const double o = Seconds(t0);
          const double gb = static_cast<double>(messages * bytes) / 1e9;
          ours.push_back(gb / o);
          base.push_back(gb / b);
          ratios.push_back(b / o);
        }
        const bench::Spread so = bench::SpreadOf(ours);
        bench::Json j;
        j["bench"] = "replica_mac";
        j["coverage"] = coverage == Coverage::kAll ? "all" : "header";
        j["bytes"] = bytes;
        j["cache"] = cache;
        j["gb_per_s"] = bench::Round(so.median, 2);
        j["baseline"] = "memcpy";
        j["baseline_gb_per_s"] = bench::Round(bench::SpreadOf(base).median, 2);
        j["ratio"] = bench::Round(bench::SpreadOf(ratios).median, 3);
        j["ratio_spread"] = bench::ToJson(bench::SpreadOf(ratios));
        j["us_per_message"] = bench::Round(
            static_cast<double>(bytes) / (so.median * 1e9) * 1e6, 3);
        j["gb_per_s_spread"] = bench::ToJson(so, 2);
        j["reps"] = reps;
        j["sink"] = sink;  // keeps the loops
        std::printf("%s\n", j.dump().c_str());
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
