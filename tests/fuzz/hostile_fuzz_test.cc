// Structure-aware network fuzz (issue 13): a real ps_server receives
// well-formed requests of every kind with extreme and random values
// (tests/fuzz/hostile_requests.h) while a real ps_worker trains beside them.
// Every request must be answered within its deadline, the shard must stay up
// with its memory bounded, the worker must finish with a sane accuracy, and
// the rejections must be counted by reason.
//
// The shard runs with CURVE and an admin key the fuzzer does not hold, so its
// checkpoint and shutdown requests are refused (as they must be).
//
// Environment: ASYNCPS_HOSTILE_FUZZ_MESSAGES (default 20000),
// ASYNCPS_HOSTILE_FUZZ_SEED (default 1). experiments/chaos/hostile_soak.py
// runs the long version (ps_hostile_fuzz against an ASan+UBSan shard).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "tests/fuzz/hostile_requests.h"
#include "tests/util/etcd_fixture.h"
#include "tests/util/process.h"
#include "worker/client.h"
#include "worker/model.h"

namespace asyncps::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

int64_t EnvInt(const char* name, int64_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoll(v) : dflt;
}

struct Keys {
  std::string server_pub, server_sec, admin_pub, admin_sec, fuzz_pub, fuzz_sec;
};

Keys MakeKeys(const TempDir& dir) {
  Keys k;
  EXPECT_TRUE(GenerateCurveKeyPair(&k.server_pub, &k.server_sec).ok());
  EXPECT_TRUE(GenerateCurveKeyPair(&k.admin_pub, &k.admin_sec).ok());
  EXPECT_TRUE(GenerateCurveKeyPair(&k.fuzz_pub, &k.fuzz_sec).ok());
  std::ofstream(dir.Sub("server.key")) << k.server_sec << "\n";
  std::ofstream(dir.Sub("server.pub")) << k.server_pub << "\n";
  std::ofstream(dir.Sub("admins")) << k.admin_pub << "\n";
  return k;
}

std::string Summary(const std::string& log, const std::string& key) {
  std::smatch m;
  std::regex re("SUMMARY .*\\b" + key + "=([-0-9.eE+]+)");
  return std::regex_search(log, m, re) ? m[1].str() : "";
}

// Runs `messages` hostile requests against `endpoint`; returns the report.
fuzz::DriverReport Fuzz(const std::string& endpoint, const Keys& keys,
                        const Layout& layout,
                        const std::vector<TensorSpec>& tensors, int workers,
                        int64_t messages, uint64_t seed,
                        const std::function<bool()>& keep_going) {
  fuzz::DriverOptions o;
  o.endpoint = endpoint;
  o.transport.curve_server_key = keys.server_pub;
  o.transport.curve_public_key = keys.fuzz_pub;
  o.transport.curve_secret_key = keys.fuzz_sec;
  o.deadline = milliseconds(10000);
  auto driver = fuzz::HostileDriver::Create(o);
  EXPECT_TRUE(driver.ok());
  fuzz::HostileGenerator gen(layout, tensors, 0, workers, /*admin=*/true, seed);
  Status s = (*driver)->Run(gen, messages, keep_going);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return (*driver)->report();
}

std::vector<std::string> ServerFlags(const TempDir& dir,
                                     const std::string& consistency) {
  return {"--shard_id=0",
          "--num_shards=1",
          "--num_workers=2",
          "--consistency=" + consistency,
          "--optimizer=sgd",
          "--lr=0.05",
          "--checkpoint_every_s=0",
          "--worker_timeout_s=5",
          "--memory_budget_mb=256",
          "--max_park_s=2",
          "--curve_secret_key=" + dir.Sub("server.key"),
          "--curve_admin_clients=" + dir.Sub("admins")};
}

TEST(HostileFuzzTest, ShardAnswersEveryHostileRequestBesideARealWorker) {
  const int64_t messages = EnvInt("ASYNCPS_HOSTILE_FUZZ_MESSAGES", 20000);
  const uint64_t seed = EnvInt("ASYNCPS_HOSTILE_FUZZ_SEED", 1);
  TempDir dir;
  const Keys keys = MakeKeys(dir);
  auto server = StartServer(dir, "shard", ServerFlags(dir, "asp"));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const std::vector<int> layers = {784, 256, 128, 10};
  const std::vector<TensorSpec> tensors = worker::MlpTensorSpecs(layers, 1);
  LayoutOptions lo;
  lo.num_shards = 1;
  auto layout = Layout::Create(tensors, lo);
  ASSERT_TRUE(layout.ok());
  // The real worker registers the model and trains; rank 1 never comes
  // (ASP does not wait for it).
  auto worker = Process::Start(
      {BinPath("ps_worker"), "--servers=" + server->endpoint, "--rank=0",
       "--num_workers=2", "--max_steps=600", "--epochs=0", "--eval=true",
       "--log_every=100", "--timeout_s=60",
       "--curve_server_key=" + dir.Sub("server.pub")},
      dir.Sub("worker.log"));
  ASSERT_TRUE(worker.ok());
  // Hostile traffic once the worker has registered the model (a hostile
  // registration first would be a different model, and the worker's own
  // registration would fail, as it must).
  bool registered = false;
  for (int i = 0; i < 600 && !registered; ++i) {
    auto ctl =
        Process::Start({BinPath("ps_ctl"), "--servers=" + server->endpoint,
                        "--curve_server_key=" + dir.Sub("server.pub"), "stats"},
                       dir.Sub("registered.json"));
    ASSERT_TRUE(ctl.ok());
    (void)(*ctl)->Wait(seconds(10));
    registered =
        ReadFile(dir.Sub("registered.json")).find("\"registered\":true") !=
        std::string::npos;
    if (!registered) std::this_thread::sleep_for(milliseconds(100));
  }
  ASSERT_TRUE(registered) << (*worker)->Log();
  auto report = Fuzz(server->endpoint, keys, *layout, tensors, 2, messages,
                     seed, [&] { return true; });
  auto code = (*worker)->Wait(seconds(180));
  ASSERT_TRUE(code.ok()) << (*worker)->Log();
  EXPECT_EQ(*code, 0) << (*worker)->Log();
  const std::string acc = Summary((*worker)->Log(), "final_test_acc");
  ASSERT_FALSE(acc.empty()) << (*worker)->Log();
  EXPECT_GE(std::stod(acc), 0.70) << (*worker)->Log();

  ASSERT_TRUE(server->process->Running()) << server->process->Log();
  EXPECT_EQ(report.sent, messages);
  EXPECT_EQ(report.unanswered, 0) << report.ToJson();
  EXPECT_EQ(report.answered, report.sent) << report.ToJson();
  const uint64_t hwm_kib = ProcStatusKib(server->process->pid(), "VmHWM");
  EXPECT_LT(hwm_kib, 768u * 1024) << "peak RSS " << hwm_kib << " KiB";
  EXPECT_GT(report.codes["InvalidArgument"], 0);
  // The shard's own count of rejections by reason.
  std::ofstream(dir.Sub("admin.key")) << keys.admin_sec << "\n";
  auto ctl =
      Process::Start({BinPath("ps_ctl"), "--servers=" + server->endpoint,
                      "--curve_server_key=" + dir.Sub("server.pub"),
                      "--curve_secret_key=" + dir.Sub("admin.key"), "stats"},
                     dir.Sub("stats.json"));
  ASSERT_TRUE(ctl.ok());
  ASSERT_EQ(*(*ctl)->Wait(seconds(10)), 0);
  const std::string stats = ReadFile(dir.Sub("stats.json"));
  EXPECT_NE(stats.find("\"admin_denied\":"), std::string::npos) << stats;
  EXPECT_NE(stats.find("\"repeated_chunk\":"), std::string::npos) << stats;
  EXPECT_NE(stats.find("\"bad_clock\":"), std::string::npos) << stats;
  std::printf(
      "{\"hostile_fuzz\":%s,\"worker_acc\":%s,\"shard_peak_rss_kib\":%llu}\n",
      report.ToJson().c_str(), acc.c_str(),
      static_cast<unsigned long long>(hwm_kib));
  std::printf("shard stats: %s\n", stats.c_str());
}

// Hostile clocks against the waiting consistency modes, where a pull may park
// and a clock drives rounds: still every request answered in time.
TEST(HostileFuzzTest, BspAndSspShardsAnswerEveryHostileRequest) {
  const int64_t messages = EnvInt("ASYNCPS_HOSTILE_FUZZ_MESSAGES", 20000) / 4;
  TempDir dir;
  const Keys keys = MakeKeys(dir);
  const std::vector<TensorSpec> tensors = {
      TensorSpec{"w", {300, 40}, InitKind::kUniform, 0.1f, 3},
      TensorSpec{"b", {40}, InitKind::kZeros, 0, 3}};
  LayoutOptions lo;
  lo.num_shards = 1;
  lo.chunk_elems = 4096;
  auto layout = Layout::Create(tensors, lo);
  ASSERT_TRUE(layout.ok());
  for (const std::string mode : {"bsp", "ssp"}) {
    std::vector<std::string> flags = ServerFlags(dir, mode);
    if (mode == "ssp") flags.push_back("--staleness=2");
    auto server = StartServer(dir, "shard-" + mode, flags);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    auto report = Fuzz(server->endpoint, keys, *layout, tensors, 2, messages, 7,
                       [] { return true; });
    ASSERT_TRUE(server->process->Running()) << server->process->Log();
    EXPECT_EQ(report.unanswered, 0) << mode << ": " << report.ToJson();
    EXPECT_EQ(report.answered, report.sent) << mode;
    std::printf("{\"mode\":\"%s\",\"hostile_fuzz\":%s}\n", mode.c_str(),
                report.ToJson().c_str());
  }
}

// Sparse tables (issues 12 and 13): hostile row refs in pushes and pulls,
// hostile table definitions and hostile scans (plain and point-in-time:
// opens, unknown ids, both at once, any page size and cursor) against shard
// 0 of two (RocksDB stores, caches far smaller than the rows touched, so
// evictions write back meanwhile).
// Every request is answered, the shard stays up, and since legal hostile
// updates carry zero gradients (SGD), every row and weight a real client
// wrote before reads back bitwise the same; the shard then still trains.
TEST(HostileFuzzTest, SparseShardAnswersEveryHostileRowRequest) {
  const int64_t messages = EnvInt("ASYNCPS_HOSTILE_FUZZ_MESSAGES", 20000) / 2;
  TempDir dir;
  const Keys keys = MakeKeys(dir);
  std::vector<ServerHandle> servers;
  for (int s = 0; s < 2; ++s) {
    std::vector<std::string> flags = ServerFlags(dir, "asp");
    flags[0] = "--shard_id=" + std::to_string(s);
    flags[1] = "--num_shards=2";
    flags.push_back("--db_path=" + dir.Sub("db" + std::to_string(s)));
    flags.push_back("--embedding_cache_bytes=1048576");
    auto h = StartServer(dir, "shard" + std::to_string(s), flags,
                         "tcp://127.0.0.1:*");
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    servers.push_back(std::move(h).value());
  }
  const std::vector<TensorSpec> tensors = {
      TensorSpec{"w", {64, 16}, InitKind::kUniform, 0.1f, 3},
      TensorSpec{"b", {16}, InitKind::kZeros, 0, 3}};
  TableSpec emb;
  emb.name = "emb";
  emb.dim = 8;
  emb.init = InitKind::kUniform;
  emb.init_param = 0.25f;
  emb.seed = 5;
  emb.optimizer.kind = RowOptimizerKind::kSgd;
  emb.optimizer.lr = 0.5f;
  TableSpec side = emb;
  side.name = "side";
  side.dim = 3;
  const std::vector<TableSpec> tables = {emb, side};
  worker::ClientOptions co;
  for (const auto& s : servers) co.servers.push_back(s.endpoint);
  co.rank = 0;
  co.deadline = seconds(60);
  co.transport.curve_server_key = keys.server_pub;
  co.transport.curve_public_key = keys.fuzz_pub;
  co.transport.curve_secret_key = keys.fuzz_sec;
  auto client = worker::Client::Create(co);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  worker::Client& c = **client;
  LayoutOptions lo;
  lo.chunk_elems = 256;
  ASSERT_TRUE(c.RegisterModel(tensors, lo, tables).ok());
  // Real rows: 4000 keys (far more than 1 MiB of cache holds with the
  // fuzzer's), pushed once with known gradients.
  std::vector<uint64_t> ids(4000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i * 0x9e3779b97f4a7c15ULL;
  std::vector<float> g(ids.size() * emb.dim);
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i % 7) / 8;
  auto push = [&](int64_t clock) {
    worker::RowsPush p{0, ids.data(), ids.size(), g.data()};
    auto t = c.StartPushRows(clock, {}, {p});
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    Status s = c.Wait(*t, seconds(60));
    ASSERT_TRUE(s.ok()) << s.ToString();
  };
  auto read = [&](std::vector<float>* rows,
                  std::vector<std::vector<float>>* dense) {
    rows->assign(ids.size() * emb.dim, -99.0f);
    dense->clear();
    std::vector<float*> dst;
    for (const TensorSpec& t : tensors) {
      dense->emplace_back(static_cast<size_t>(t.num_elements()), -99.0f);
      dst.push_back(dense->back().data());
    }
    worker::RowsPull p{0, ids.data(), ids.size(), rows->data()};
    auto t = c.StartPullRows(0, dst, {p});
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    Status s = c.Wait(*t, seconds(60));
    ASSERT_TRUE(s.ok()) << s.ToString();
  };
  push(0);
  std::vector<float> rows_before, rows_after;
  std::vector<std::vector<float>> dense_before, dense_after;
  read(&rows_before, &dense_before);
  fuzz::DriverOptions o;
  o.endpoint = servers[0].endpoint;
  o.transport.curve_server_key = keys.server_pub;
  o.transport.curve_public_key = keys.fuzz_pub;
  o.transport.curve_secret_key = keys.fuzz_sec;
  auto driver = fuzz::HostileDriver::Create(o);
  ASSERT_TRUE(driver.ok()) << driver.status().ToString();
  fuzz::HostileGenerator gen(c.layout(), tensors, 0, 2, /*admin=*/true,
                             EnvInt("ASYNCPS_HOSTILE_FUZZ_SEED", 1) + 11,
                             tables);
  Status st = (*driver)->Run(gen, messages, [] { return true; });
  ASSERT_TRUE(st.ok()) << st.ToString();
  const fuzz::DriverReport& report = (*driver)->report();
  ASSERT_TRUE(servers[0].process->Running()) << servers[0].process->Log();
  EXPECT_EQ(report.unanswered, 0) << report.ToJson();
  EXPECT_EQ(report.answered, report.sent) << report.ToJson();
  EXPECT_EQ(report.sent, messages);
  int row_shapes = 0, scan_shapes = 0;
  for (const auto& [shape, n] : report.shapes) {
    if (shape.rfind("rows/", 0) == 0 || shape.rfind("pull_rows/", 0) == 0)
      row_shapes += n > 0;
    if (shape.rfind("scan/", 0) == 0) scan_shapes += n > 0;
  }
  EXPECT_GE(row_shapes, 20) << report.ToJson();
  EXPECT_EQ(scan_shapes, 5) << report.ToJson();
  EXPECT_GT(report.codes.at("OK"), 0);
  // Nothing a real client wrote changed.
  read(&rows_after, &dense_after);
  EXPECT_EQ(rows_after, rows_before);
  EXPECT_EQ(dense_after, dense_before);
  // The shard counted the row rejections and still trains.
  std::vector<std::string> stats;
  ASSERT_TRUE(c.Stats(&stats, seconds(10)).ok());
  ASSERT_EQ(stats.size(), 2u);
  const nlohmann::json j = nlohmann::json::parse(stats[0]);
  EXPECT_TRUE(j.contains("sparse")) << stats[0];
  const std::string text = stats[0];
  for (const char* reason : {"wrong_shard", "non_finite", "unknown_chunk",
                             "size_mismatch", "bad_codec"}) {
    EXPECT_NE(text.find(std::string("\"") + reason + "\":"), std::string::npos)
        << reason << " in " << text;
  }
  push(1);
  read(&rows_after, &dense_after);
  for (size_t i = 0; i < rows_after.size(); ++i) {
    ASSERT_EQ(rows_after[i], rows_before[i] - 0.5f * g[i]) << i;
  }
  const uint64_t hwm_kib = ProcStatusKib(servers[0].process->pid(), "VmHWM");
  EXPECT_LT(hwm_kib, 768u * 1024) << "peak RSS " << hwm_kib << " KiB";
  std::printf("{\"sparse_hostile_fuzz\":%s,\"shard_peak_rss_kib\":%llu}\n",
              report.ToJson().c_str(),
              static_cast<unsigned long long>(hwm_kib));
}

// Issue 40: replica traffic from someone who is not the group's primary.
// A replica group of two real processes (etcd, the group's secret there)
// gets hostile replicates and snapshots (tests/fuzz/hostile_requests.h
// set_replica_traffic: forged pushes, liveness records, round records,
// wrapped elastic steps and registrations, made-up senders, sessions and
// tags) at its backup, then the whole hostile mix at its primary. Every
// request is answered; the backup's state does not move while only forged
// traffic reaches it, the two stay alike through the primary's, and after
// kill -9 of the primary the backup serves the primary's weights bitwise.
TEST(HostileFuzzTest, ReplicaGroupRefusesHostileReplicaTraffic) {
  if (!EtcdServer::Available())
    GTEST_SKIP() << "etcd not installed (Debian's etcd-server)";
  const int64_t messages = EnvInt("ASYNCPS_HOSTILE_FUZZ_MESSAGES", 20000) / 4;
  const uint64_t seed = EnvInt("ASYNCPS_HOSTILE_FUZZ_SEED", 1);
  TempDir dir;
  auto etcd = EtcdServer::Start(dir.Sub("etcd"), dir.path().string());
  ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
  std::vector<ServerHandle> r;
  for (int i = 0; i < 2; ++i) {
    auto h = StartServer(
        dir, "g0r" + std::to_string(i),
        {"--num_workers=1", "--consistency=asp", "--optimizer=sgd", "--lr=0.05",
         "--checkpoint_every_s=0", "--memory_budget_mb=256", "--replicas=2",
         "--replica=" + std::to_string(i), "--etcd=" + (*etcd)->endpoint(),
         "--etcd_prefix=/hostile"},
        "tcp://127.0.0.1:*");
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    r.push_back(std::move(h).value());
  }
  const std::vector<TensorSpec> tensors =
      worker::MlpTensorSpecs({64, 32, 10}, 1);
  LayoutOptions lo;
  lo.num_shards = 1;
  auto layout = Layout::Create(tensors, lo);
  ASSERT_TRUE(layout.ok());
  worker::ClientOptions co;
  co.servers = {r[0].endpoint + "|" + r[1].endpoint};
  co.rank = 0;
  co.attempt_timeout = milliseconds(500);
  auto client = worker::Client::Create(co);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Register(tensors, lo).ok());
  // The backup's state as its stats show it, and its weights (pulled from
  // the primary, which the backup equals once acknowledged).
  auto stats_of = [&](const std::string& endpoint) {
    worker::ClientOptions so;
    so.servers = {endpoint};
    so.rank = -1;
    auto c = worker::Client::Create(so);
    std::vector<std::string> replies;
    EXPECT_TRUE(c.ok() && (*c)->Stats(&replies, seconds(10)).ok());
    auto j = nlohmann::json::parse(replies.empty() ? "{}" : replies[0], nullptr,
                                   false);
    return nlohmann::json{{"version", j["version"]},
                          {"clocks", j["worker_clocks"]},
                          {"live", j["worker_live"]},
                          {"push_table", j["push_table"]},
                          {"role", j["replication"]["role"]}};
  };
  auto weights_of = [&](worker::Client& c) {
    std::vector<std::vector<float>> w;
    std::vector<float*> out;
    for (const TensorSpec& t : tensors) {
      w.emplace_back(t.num_elements());
      out.push_back(w.back().data());
    }
    auto t = c.StartPull(0, out);
    EXPECT_TRUE(t.ok() && c.Wait(*t, seconds(30)).ok());
    return w;
  };
  const nlohmann::json before = stats_of(r[1].endpoint);
  ASSERT_EQ(before["role"], "backup") << before.dump();
  fuzz::DriverOptions o;
  o.deadline = milliseconds(10000);
  o.endpoint = r[1].endpoint;
  auto at_backup = fuzz::HostileDriver::Create(o);
  ASSERT_TRUE(at_backup.ok());
  fuzz::HostileGenerator forged(*layout, tensors, 0, 1, /*admin=*/false, seed);
  forged.set_replica_traffic(100, {"g0r0", "g0r1", "g0r2"});
  ASSERT_TRUE((*at_backup)->Run(forged, messages, [] { return true; }).ok());
  const fuzz::DriverReport& rb = (*at_backup)->report();
  EXPECT_EQ(rb.answered, messages) << rb.ToJson();
  EXPECT_EQ(rb.codes.count("OK"), 0u) << rb.ToJson();
  EXPECT_EQ(stats_of(r[1].endpoint), before);
  // The whole mix at the primary, with forged replica traffic among it.
  o.endpoint = r[0].endpoint;
  auto at_primary = fuzz::HostileDriver::Create(o);
  ASSERT_TRUE(at_primary.ok());
  fuzz::HostileGenerator mixed(*layout, tensors, 0, 1, /*admin=*/false,
                               seed + 1);
  mixed.set_replica_traffic(20, {"g0r0", "g0r1"});
  ASSERT_TRUE((*at_primary)->Run(mixed, messages, [] { return true; }).ok());
  const fuzz::DriverReport& rp = (*at_primary)->report();
  EXPECT_EQ(rp.answered, messages) << rp.ToJson();
  ASSERT_TRUE(r[0].process->Running()) << r[0].process->Log();
  ASSERT_TRUE(r[1].process->Running()) << r[1].process->Log();
  const auto primary_weights = weights_of(**client);
  nlohmann::json p = stats_of(r[0].endpoint), b = stats_of(r[1].endpoint);
  EXPECT_EQ(p["version"], b["version"]) << p.dump() << " " << b.dump();
  EXPECT_EQ(p["push_table"], b["push_table"]);
  r[0].process->Kill(9);
  EXPECT_EQ(weights_of(**client), primary_weights);
  std::printf("{\"hostile_replica_fuzz\":{\"backup\":%s,\"primary\":%s}}\n",
              rb.ToJson().c_str(), rp.ToJson().c_str());
}

}  // namespace
}  // namespace asyncps::testing
