// Sparse tables end to end: real ps_server processes (RocksDB in temp dirs,
// caches smaller than the tables) and the worker Client; kill -9 recovery
// with and without --durable; ps_ctl stats; the click model trained by
// ps_ctr_worker processes on planted Criteo-format data.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "tests/util/etcd_fixture.h"
#include "tests/util/process.h"
#include "worker/client.h"
#include "worker/ctr/planted.h"
#include "worker/upload.h"

namespace asyncps::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using worker::Client;
using worker::ClientOptions;
using worker::RowsPull;
using worker::RowsPush;

TableSpec Emb(uint32_t dim, RowOptimizerKind kind = RowOptimizerKind::kSgd) {
  TableSpec t;
  t.name = "emb";
  t.dim = dim;
  t.init = InitKind::kUniform;
  t.init_param = 0.25f;
  t.seed = 17;
  t.optimizer.kind = kind;
  t.optimizer.lr = 0.5f;
  return t;
}

std::vector<TensorSpec> Dense() {
  return {TensorSpec{"d", {8}, InitKind::kZeros, 0, 1}};
}

std::vector<ServerHandle> StartShards(const TempDir& dir, int shards,
                                      const std::vector<std::string>& flags,
                                      const std::string& prefix = "shard") {
  std::vector<ServerHandle> out;
  for (int s = 0; s < shards; ++s) {
    std::vector<std::string> f = flags;
    f.push_back("--shard_id=" + std::to_string(s));
    f.push_back("--num_shards=" + std::to_string(shards));
    auto h =
        StartServer(dir, prefix + std::to_string(s), f, "tcp://127.0.0.1:*");
    EXPECT_TRUE(h.ok()) << h.status().ToString();
    if (h.ok()) out.push_back(std::move(h).value());
  }
  return out;
}

std::unique_ptr<Client> Connect(const std::vector<ServerHandle>& servers,
                                int rank, uint8_t rows_codec = 0) {
  ClientOptions o;
  for (const auto& s : servers) o.servers.push_back(s.endpoint);
  o.rank = rank;
  o.deadline = seconds(60);
  o.attempt_timeout = milliseconds(500);
  o.rows_codec = rows_codec;
  auto c = Client::Create(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

// The rows the shards must hold: SGD on the summed gradient of each push.
class Reference {
 public:
  explicit Reference(TableSpec t) : t_(std::move(t)) {}
  void Push(const std::vector<uint64_t>& keys, const std::vector<float>& g) {
    std::map<uint64_t, std::vector<float>> sum;  // repeated keys summed
    std::vector<uint64_t> order;
    for (size_t i = 0; i < keys.size(); ++i) {
      auto [it, fresh] = sum.emplace(keys[i], std::vector<float>());
      if (fresh) {
        it->second.assign(g.begin() + i * t_.dim, g.begin() + (i + 1) * t_.dim);
        order.push_back(keys[i]);
      } else {
        for (uint32_t j = 0; j < t_.dim; ++j)
          it->second[j] += g[i * t_.dim + j];
      }
    }
    for (uint64_t k : order) {
      std::vector<float>& w = Row(k);
      for (uint32_t j = 0; j < t_.dim; ++j) w[j] -= t_.optimizer.lr * sum[k][j];
    }
  }
  std::vector<float>& Row(uint64_t k) {
    auto it = rows_.find(k);
    if (it == rows_.end()) {
      std::vector<float> v(t_.dim);
      InitializeRow(t_, k, v.data());
      it = rows_.emplace(k, std::move(v)).first;
    }
    return it->second;
  }

 private:
  TableSpec t_;
  std::map<uint64_t, std::vector<float>> rows_;
};

// Gradients that are exact in fp16 (small multiples of 1/64).
std::vector<float> Grads(size_t n, uint32_t dim, std::mt19937_64& rng) {
  std::vector<float> g(n * dim);
  for (float& v : g)
    v = static_cast<float>(static_cast<int>(rng() % 33) - 16) / 64.0f;
  return g;
}

std::vector<uint64_t> Batch(size_t n, uint64_t vocab, std::mt19937_64& rng) {
  std::vector<uint64_t> k(n);
  for (auto& v : k) v = (rng() % vocab) * 0x9e3779b97f4a7c15ULL;  // repeats
  return k;
}

Status PushRows(Client& c, int64_t clock, const std::vector<uint64_t>& keys,
                const std::vector<float>& g) {
  RowsPush p{0, keys.data(), keys.size(), g.data()};
  ASSIGN_OR_RETURN(Client::Ticket t, c.StartPushRows(clock, {}, {p}));
  return c.Wait(t, seconds(60));
}

std::vector<float> PullRows(Client& c, int64_t clock,
                            const std::vector<uint64_t>& keys, uint32_t dim) {
  std::vector<float> out(keys.size() * dim, -99.0f);
  RowsPull p{0, keys.data(), keys.size(), out.data()};
  auto t = c.StartPullRows(clock, {}, {p});
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  if (t.ok()) {
    Status s = c.Wait(*t, seconds(60));
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  return out;
}

void ExpectRows(Reference& ref, const std::vector<uint64_t>& keys,
                const std::vector<float>& got, uint32_t dim) {
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_EQ(0, std::memcmp(got.data() + i * dim, ref.Row(keys[i]).data(),
                             dim * sizeof(float)))
        << "key " << keys[i] << " at " << i << ": " << got[i * dim] << " vs "
        << ref.Row(keys[i])[0];
  }
}

// Two shards, two clients (fp32 and fp16 rows), batches with repeated keys,
// caches far smaller than the table: every pulled row equals the reference.
TEST(SparseIntegrationTest, RowsAcrossShardsAndCachesMatchReference) {
  TempDir dir;
  auto servers =
      StartShards(dir, 2,
                  {"--num_workers=2", "--optimizer=sgd", "--lr=0.1",
                   "--embedding_cache_bytes=1048576", "--worker_timeout_s=60"});
  ASSERT_EQ(servers.size(), 2u);
  const TableSpec t = Emb(16);
  auto a = Connect(servers, 0), b = Connect(servers, 1, /*fp16*/ 1);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->RegisterModel(Dense(), {}, {t}).ok());
  ASSERT_TRUE(b->RegisterModel(Dense(), {}, {t}).ok());
  Reference ref(t);
  std::mt19937_64 rng(7);
  for (int step = 0; step < 30; ++step) {
    Client& c = step % 2 ? *b : *a;
    auto keys = Batch(3000, 40000, rng);
    auto g = Grads(keys.size(), t.dim, rng);
    ASSERT_TRUE(PushRows(c, step / 2, keys, g).ok());
    ref.Push(keys, g);
    auto probe = Batch(500, 40000, rng);
    ExpectRows(ref, probe, PullRows(*a, step / 2, probe, t.dim), t.dim);
  }
  // fp16 pulls are the rows rounded to half precision.
  auto keys = Batch(200, 40000, rng);
  std::vector<float> half = PullRows(*b, 15, keys, t.dim);
  for (size_t i = 0; i < keys.size(); ++i) {
    for (uint32_t j = 0; j < t.dim; ++j) {
      const float want = ref.Row(keys[i])[j];
      ASSERT_NEAR(half[i * t.dim + j], want,
                  1e-3 * std::max(1.0f, std::abs(want)));
    }
  }
  // Both shards evicted and read back from RocksDB.
  int code = 0;
  auto ctl = Process::Start(
      {BinPath("ps_ctl"),
       "--servers=" + servers[0].endpoint + "," + servers[1].endpoint, "stats"},
      dir.Sub("ctl.out"));
  ASSERT_TRUE(ctl.ok());
  ASSERT_EQ(*(*ctl)->Wait(seconds(10)), 0);
  (void)code;
  auto stats = nlohmann::json::parse((*ctl)->Log(), nullptr, false);
  ASSERT_FALSE(stats.is_discarded()) << (*ctl)->Log();
  for (const auto& shard : stats["shards"]) {
    const auto& tbl = shard["stats"]["sparse"]["tables"][0];
    EXPECT_EQ(tbl["name"], "emb");
    for (const char* f : {"rows", "cache_bytes", "hit_rate", "rocksdb_reads",
                          "rocksdb_writes", "admitted", "admission_counted",
                          "evictions", "expired", "disk_bytes"}) {
      EXPECT_TRUE(tbl.contains(f)) << f;
    }
    EXPECT_GT(tbl["evictions"].get<uint64_t>(), 1000u);
    EXPECT_GT(tbl["rocksdb_reads"].get<uint64_t>(), 1000u);
    EXPECT_GT(tbl["rows"].get<uint64_t>(), 10000u);
    EXPECT_LE(shard["stats"]["sparse"]["cache_bytes"].get<uint64_t>(),
              1048576u);
  }
}

// Elastic shards with sparse tables: a third shard joins and then the first
// one leaves (ps_ctl add-shard / remove-shard, the layout in a real etcd)
// between a client's pushes and pulls of rows; the client follows the
// shards' refusals (a pull first, then pushes, re-routed under their
// tickets) and every pulled row equals the reference, bitwise.
TEST(SparseIntegrationTest, ElasticShardsMoveRowsBitwise) {
  if (!EtcdServer::Available())
    GTEST_SKIP() << "etcd not installed (etcd-server)";
  TempDir dir;
  auto etcd = EtcdServer::Start(dir.Sub("etcd"), dir.path().string());
  ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
  const std::string prefix = "/sparse_elastic";
  const std::vector<std::string> flags = {
      "--num_workers=1", "--consistency=asp", "--optimizer=sgd", "--lr=0.1",
      "--embedding_cache_bytes=1048576", "--worker_timeout_s=60",
      // Exports of more than 128 KiB of rows are refused: ps_ctl asks
      // again for fewer buckets at a time.
      "--max_sparse_reply_bytes=131072",
      "--elastic_etcd=" + (*etcd)->endpoint(), "--etcd_prefix=" + prefix};
  auto servers = StartShards(dir, 2, flags);
  ASSERT_EQ(servers.size(), 2u);
  const TableSpec t = Emb(8);
  auto c = Connect(servers, 0);
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->RegisterModel(Dense(), {}, {t}).ok());
  Reference ref(t);
  std::mt19937_64 rng(11);
  std::set<uint64_t> pushed;
  auto train = [&](int steps) {
    for (int i = 0; i < steps; ++i) {
      auto keys = Batch(2000, 20000, rng);
      auto g = Grads(keys.size(), t.dim, rng);
      ASSERT_TRUE(PushRows(*c, 0, keys, g).ok());
      ref.Push(keys, g);
      pushed.insert(keys.begin(), keys.end());
    }
  };
  // Issue 22: a scan of the whole table (worker::ScanTable) sees every key
  // once with its row, also when the client routes by an epoch the shards
  // left (its first pass is refused; it starts over by the new layout).
  auto scan = [&](uint64_t epoch) {
    worker::SavedRows saved;
    Status s = worker::ScanTable(c.get(), 0, 1000, &saved, seconds(60));
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(c->layout_epoch(), epoch);
    ASSERT_EQ(saved.keys, std::vector<uint64_t>(pushed.begin(), pushed.end()));
    const size_t bytes = SavedRecordBytes(t);
    for (size_t i = 0; i < saved.keys.size(); ++i) {
      ASSERT_EQ(
          0, std::memcmp(saved.records.data() + i * bytes + kSavedHeaderBytes,
                         ref.Row(saved.keys[i]).data(), t.dim * sizeof(float)))
          << saved.keys[i];
    }
  };
  auto check = [&]() {
    auto probe = Batch(3000, 20000, rng);
    ExpectRows(ref, probe, PullRows(*c, 0, probe, t.dim), t.dim);
  };
  auto ctl = [&](const std::string& cmd, const std::string& endpoint) {
    auto p = Process::Start(
        {BinPath("ps_ctl"), "--etcd=" + (*etcd)->endpoint(),
         "--etcd_prefix=" + prefix,
         "--servers=" + servers[0].endpoint + "," + servers[1].endpoint, cmd,
         endpoint},
        dir.Sub(cmd + ".out"));
    EXPECT_TRUE(p.ok());
    if (!p.ok()) return nlohmann::json();
    StatusOr<int> code = (*p)->Wait(seconds(60));
    EXPECT_TRUE(code.ok() && *code == 0) << (*p)->Log();
    // The report is the one JSON line on stdout (the log goes to stderr).
    std::string last;
    std::istringstream lines((*p)->Log());
    for (std::string l; std::getline(lines, l);)
      if (!l.empty() && l[0] == '{') last = l;
    auto j = nlohmann::json::parse(last, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << (*p)->Log();
    return j;
  };
  train(10);
  check();
  scan(0);

  std::vector<std::string> f3 = flags;
  f3.push_back("--shard_id=2");
  f3.push_back("--num_shards=3");
  auto joined = StartServer(dir, "shard2", f3, "tcp://127.0.0.1:*");
  ASSERT_TRUE(joined.ok()) << joined.status().ToString();
  nlohmann::json rep = ctl("add-shard", joined->endpoint);
  ASSERT_TRUE(rep.is_object());
  EXPECT_GT(rep.value("moved_buckets", 0), 30);  // a third of 128
  EXPECT_GT(rep.value("moved_rows", 0), 1000);
  EXPECT_GT(rep.value("moved_row_bytes", 0), 131072);  // so in several exports
  scan(1);  // routed by epoch 0: refused, scanned again by epoch 1
  check();
  train(10);
  check();

  rep = ctl("remove-shard", servers[0].endpoint);
  ASSERT_TRUE(rep.is_object());
  EXPECT_GT(rep.value("moved_rows", 0), 1000);
  EXPECT_EQ(rep["active"], nlohmann::json::array({1, 2}));
  train(10);  // routed by epoch 1: refused, re-routed
  check();
  scan(2);
}

// Issue 22: Client::ScanRows against real shards (RocksDB, caches far
// smaller than the table): in pages of 1, 3, 7 and 1000 entries every entry
// (rows and admission counters) comes back exactly once, from its own shard,
// in increasing key order, the same whatever the page; worker::ScanTable
// merges the shards. Restored through the client (UploadValues with kinds
// and clocks, clear) into a second fleet that held other ids, the second
// fleet's scan equals the first's bitwise and the other ids are gone.
struct Scanned {
  std::vector<uint64_t> keys;
  std::vector<uint8_t> records;
  bool operator==(const Scanned& o) const {
    return keys == o.keys && records == o.records;
  }
};

Scanned ScanShard(Client& c, int shard, size_t page, size_t bytes) {
  Scanned got;
  uint64_t from = 0;
  for (;;) {
    const size_t before = got.keys.size();
    Status s =
        c.ScanRows(shard, 0, from, page, &got.keys, &got.records, seconds(60));
    EXPECT_TRUE(s.ok()) << s.ToString();
    const size_t n = got.keys.size() - before;
    EXPECT_LE(n, page);
    EXPECT_EQ(got.records.size(), got.keys.size() * bytes);
    if (!s.ok() || n < page) break;
    from = got.keys.back() + 1;
  }
  return got;
}

TEST(SparseIntegrationTest, ClientScansEveryEntryOnceInKeyOrderAndRestoresIt) {
  TempDir dir;
  const std::vector<std::string> flags = {
      "--num_workers=1", "--optimizer=sgd", "--lr=0.1",
      "--embedding_cache_bytes=1048576", "--worker_timeout_s=60"};
  auto servers = StartShards(dir, 2, flags);
  ASSERT_EQ(servers.size(), 2u);
  TableSpec t = Emb(8, RowOptimizerKind::kAdaGrad);
  t.admit_after_pushes = 2;
  auto a = Connect(servers, 0);
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->RegisterModel(Dense(), {}, {t}).ok());
  // Rows: keys pushed twice; admission counters: keys pushed once.
  std::vector<uint64_t> rows, counters;
  for (uint64_t i = 1; i <= 30000; ++i) {
    (i <= 20000 ? rows : counters).push_back(i * 0x9e3779b97f4a7c15ULL);
  }
  std::mt19937_64 rng(11);
  ASSERT_TRUE(PushRows(*a, 0, rows, Grads(rows.size(), t.dim, rng)).ok());
  ASSERT_TRUE(PushRows(*a, 0, rows, Grads(rows.size(), t.dim, rng)).ok());
  ASSERT_TRUE(
      PushRows(*a, 0, counters, Grads(counters.size(), t.dim, rng)).ok());
  // Most entries were evicted: the scans merge RocksDB with the caches.
  std::vector<std::string> stats;
  ASSERT_TRUE(a->Stats(&stats, seconds(10)).ok());
  for (const std::string& text : stats) {
    auto j = nlohmann::json::parse(text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << text;
    EXPECT_GT(j["sparse"]["tables"][0]["evictions"].get<uint64_t>(), 5000u);
  }
  const size_t bytes = SavedRecordBytes(t);
  std::map<uint64_t, uint32_t> want;  // key -> kind
  for (uint64_t k : rows) want[k] = kSavedRow;
  for (uint64_t k : counters) want[k] = kSavedCounter;
  std::vector<Scanned> by_shard(2);
  for (int s = 0; s < 2; ++s) {
    by_shard[s] = ScanShard(*a, s, 1000, bytes);
    const Scanned& got = by_shard[s];
    EXPECT_GT(got.keys.size(), 10000u);
    for (size_t i = 0; i < got.keys.size(); ++i) {
      if (i > 0) {
        ASSERT_LT(got.keys[i - 1], got.keys[i]);
      }
      EXPECT_EQ(a->ShardOfRow(0, got.keys[i]), s);
      uint32_t kind;
      uint64_t count;
      std::memcpy(&kind, &got.records[i * bytes], 4);
      std::memcpy(&count, &got.records[i * bytes + 8], 8);
      auto it = want.find(got.keys[i]);
      ASSERT_NE(it, want.end()) << got.keys[i];
      EXPECT_EQ(kind, it->second);
      if (kind == kSavedCounter) {
        EXPECT_EQ(count, 1u);
      }
      want.erase(it);  // so a key seen twice fails above
    }
    for (size_t page : {1, 3, 7}) {
      EXPECT_EQ(ScanShard(*a, s, page, bytes), got) << "pages of " << page;
    }
  }
  EXPECT_TRUE(want.empty()) << want.size() << " entries not scanned";
  worker::SavedRows merged;
  ASSERT_TRUE(worker::ScanTable(a.get(), 0, 5, &merged, seconds(60)).ok());
  EXPECT_EQ(merged.keys.size(), rows.size() + counters.size());
  EXPECT_TRUE(std::is_sorted(merged.keys.begin(), merged.keys.end()));
  // Refused: bad pages and tables (client), a page over the shard's limits.
  std::vector<uint64_t> k;
  std::vector<uint8_t> r;
  EXPECT_EQ(a->ScanRows(0, 0, 0, 0, &k, &r, seconds(5)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(a->ScanRows(2, 0, 0, 10, &k, &r, seconds(5)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(a->ScanRows(0, 1, 0, 10, &k, &r, seconds(5)).code(),
            StatusCode::kNotFound);
  EXPECT_EQ(a->ScanRows(0, 0, 0, size_t{1} << 30, &k, &r, seconds(5)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(k.empty() && r.empty());

  // A second fleet that holds other ids, restored from the scan.
  auto second = StartShards(dir, 2, flags, "second");
  ASSERT_EQ(second.size(), 2u);
  auto b = Connect(second, 0);
  ASSERT_TRUE(b);
  ASSERT_TRUE(b->RegisterModel(Dense(), {}, {t}).ok());
  std::vector<uint64_t> other;
  for (uint64_t i = 0; i < 300; ++i) other.push_back(i * 7919 + 3);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(PushRows(*b, 0, other, Grads(other.size(), t.dim, rng)).ok());
  }
  const size_t n = merged.keys.size();
  const size_t floats = (bytes - kSavedHeaderBytes) / sizeof(float);
  std::vector<uint32_t> kinds(n);
  std::vector<uint64_t> counts(n);
  std::vector<int64_t> clocks(n);
  std::vector<float> values(n * t.dim), state(n * (floats - t.dim));
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* rec = merged.records.data() + i * bytes;
    std::memcpy(&kinds[i], rec, 4);
    std::memcpy(&counts[i], rec + 8, 8);
    std::memcpy(&clocks[i], rec + 16, 8);
    std::memcpy(&values[i * t.dim], rec + kSavedHeaderBytes,
                t.dim * sizeof(float));
    std::memcpy(&state[i * (floats - t.dim)],
                rec + kSavedHeaderBytes + t.dim * sizeof(float),
                (floats - t.dim) * sizeof(float));
  }
  worker::RowsValues rv;
  rv.table = 0;
  rv.keys = merged.keys.data();
  rv.n = n;
  rv.values = values.data();
  rv.state = state.data();
  rv.steps = counts.data();
  rv.optimizer = "adagrad";
  rv.kinds = kinds.data();
  rv.clocks = clocks.data();
  rv.clear = true;
  worker::UploadOptions uo;
  uo.overwrite = true;
  uo.max_request_bytes = 200000;  // several requests per shard
  std::vector<float> dense(8, 0.5f);
  bool uploaded = false;
  Status up =
      worker::UploadValues(b.get(), {dense.data()}, uo, &uploaded, {rv});
  ASSERT_TRUE(up.ok()) << up.ToString();
  EXPECT_TRUE(uploaded);
  for (int s = 0; s < 2; ++s)
    EXPECT_EQ(ScanShard(*b, s, 333, bytes), by_shard[s]) << "shard " << s;
  EXPECT_EQ(PullRows(*b, 0, rows, t.dim), PullRows(*a, 0, rows, t.dim));
  std::vector<float> initial;
  for (uint64_t key : other) {
    std::vector<float> v(t.dim);
    InitializeRow(t, key, v.data());
    initial.insert(initial.end(), v.begin(), v.end());
  }
  EXPECT_EQ(PullRows(*b, 0, other, t.dim), initial);
}

// Issue 22 item 4: a point-in-time scan through Client::ScanRows against
// real shards (RocksDB, caches far smaller than the table). Both shards'
// scans are opened, then every row is pushed again and new ids arrive, and
// only then are the other pages read: they give the table as it was
// opened, which equals a scan made before the pushes, while a plain scan
// sees the pushes (the pushes take well under --scan_snapshot_idle_s=6,
// also on a loaded machine). A shard drops a scan idle longer than that
// (FailedPrecondition); worker::ScanTable, whose
// pages come one after the other, is point-in-time by itself.
TEST(SparseIntegrationTest, PointInTimeScanIgnoresPushesBetweenItsPages) {
  TempDir dir;
  const std::vector<std::string> flags = {"--num_workers=1",
                                          "--optimizer=sgd",
                                          "--lr=0.1",
                                          "--embedding_cache_bytes=1048576",
                                          "--worker_timeout_s=60",
                                          "--scan_snapshot_idle_s=6"};
  auto servers = StartShards(dir, 2, flags);
  ASSERT_EQ(servers.size(), 2u);
  TableSpec t = Emb(8, RowOptimizerKind::kAdaGrad);
  auto a = Connect(servers, 0);
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->RegisterModel(Dense(), {}, {t}).ok());
  std::vector<uint64_t> rows, later;
  for (uint64_t i = 1; i <= 24000; ++i)
    (i <= 20000 ? rows : later).push_back(i * 0x9e3779b97f4a7c15ULL);
  std::mt19937_64 rng(5);
  ASSERT_TRUE(PushRows(*a, 0, rows, Grads(rows.size(), t.dim, rng)).ok());
  const size_t bytes = SavedRecordBytes(t);
  std::vector<Scanned> before(2);
  for (int s = 0; s < 2; ++s) before[s] = ScanShard(*a, s, 1000, bytes);
  worker::SavedRows merged_before;
  ASSERT_TRUE(
      worker::ScanTable(a.get(), 0, 500, &merged_before, seconds(60)).ok());
  EXPECT_EQ(merged_before.keys.size(), rows.size());

  std::vector<Scanned> got(2);
  std::vector<uint64_t> snapshot(2, 0);
  for (int s = 0; s < 2; ++s) {
    ASSERT_TRUE(a->ScanRows(s, 0, 0, 200, &got[s].keys, &got[s].records,
                            seconds(60), &snapshot[s])
                    .ok());
    ASSERT_NE(snapshot[s], 0u);
    ASSERT_EQ(got[s].keys.size(), 200u);
  }
  ASSERT_TRUE(PushRows(*a, 1, rows, Grads(rows.size(), t.dim, rng)).ok());
  ASSERT_TRUE(PushRows(*a, 1, later, Grads(later.size(), t.dim, rng)).ok());
  for (int s = 0; s < 2; ++s) {
    for (;;) {
      const size_t n = got[s].keys.size();
      const uint64_t id = snapshot[s];
      Status st = a->ScanRows(s, 0, got[s].keys.back() + 1, 200, &got[s].keys,
                              &got[s].records, seconds(60), &snapshot[s]);
      ASSERT_TRUE(st.ok()) << st.ToString();
      EXPECT_EQ(snapshot[s], id);
      if (got[s].keys.size() - n < 200) break;
    }
    EXPECT_EQ(got[s], before[s]) << "shard " << s;
    const Scanned now = ScanShard(*a, s, 1000, bytes);
    EXPECT_GT(now.keys.size(), before[s].keys.size());
    EXPECT_FALSE(now == before[s]);
  }
  // The last pages dropped both scans; an idle one is dropped too.
  std::vector<uint64_t> k;
  std::vector<uint8_t> r;
  EXPECT_EQ(a->ScanRows(0, 0, 0, 10, &k, &r, seconds(5), &snapshot[0]).code(),
            StatusCode::kFailedPrecondition);
  uint64_t idle = 0;
  ASSERT_TRUE(a->ScanRows(1, 0, 0, 10, &k, &r, seconds(5), &idle).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(6500));
  EXPECT_EQ(
      a->ScanRows(1, 0, k.back() + 1, 10, &k, &r, seconds(5), &idle).code(),
      StatusCode::kFailedPrecondition);
  worker::SavedRows merged;
  ASSERT_TRUE(worker::ScanTable(a.get(), 0, 500, &merged, seconds(60)).ok());
  EXPECT_EQ(merged.keys.size(), rows.size() + later.size());
}

// kill -9 and restart: with --durable every acknowledged push is there;
// without it the shard is back at its last checkpoint, bitwise.
TEST(SparseIntegrationTest, KillNineRecovery) {
  for (bool durable : {true, false}) {
    SCOPED_TRACE(durable ? "durable" : "checkpoints only");
    TempDir dir;
    std::vector<std::string> flags = {
        "--num_workers=1", "--optimizer=sgd", "--lr=0.1",
        "--embedding_cache_bytes=1048576", "--checkpoint_every_s=0"};
    if (durable) flags.push_back("--durable");
    auto servers = StartShards(dir, 1, flags);
    ASSERT_EQ(servers.size(), 1u);
    const TableSpec t = Emb(32, RowOptimizerKind::kSgd);
    auto c = Connect(servers, 0);
    ASSERT_TRUE(c->RegisterModel(Dense(), {}, {t}).ok());
    Reference ref(t);
    std::mt19937_64 rng(11);
    const uint64_t vocab = 30000;  // ~4 MiB of rows: 4x the cache
    for (int step = 0; step < 20; ++step) {
      auto keys = Batch(2000, vocab, rng);
      auto g = Grads(keys.size(), t.dim, rng);
      ASSERT_TRUE(PushRows(*c, step, keys, g).ok());
      ref.Push(keys, g);
    }
    ASSERT_TRUE(c->Checkpoint(seconds(30)).ok());
    Reference at_checkpoint = ref;
    for (int step = 20; step < 40; ++step) {
      auto keys = Batch(2000, vocab, rng);
      auto g = Grads(keys.size(), t.dim, rng);
      ASSERT_TRUE(PushRows(*c, step, keys, g).ok());  // acknowledged
      ref.Push(keys, g);
    }
    servers[0].process->Kill(9);
    c.reset();
    auto again = StartShards(dir, 1, flags);  // same db path
    ASSERT_EQ(again.size(), 1u);
    auto c2 = Connect(again, 0);
    ASSERT_TRUE(c2->RegisterModel(Dense(), {}, {t}).ok());
    std::vector<uint64_t> all;
    for (uint64_t k = 0; k < vocab; ++k)
      all.push_back(k * 0x9e3779b97f4a7c15ULL);
    Reference& want = durable ? ref : at_checkpoint;
    for (size_t off = 0; off < all.size(); off += 5000) {
      std::vector<uint64_t> part(
          all.begin() + off, all.begin() + std::min(all.size(), off + 5000));
      ExpectRows(want, part, PullRows(*c2, 40, part, t.dim), t.dim);
    }
    if (!durable) {
      EXPECT_NE(again[0].process->Log().find("rolling back to the last "
                                             "checkpoint"),
                std::string::npos);
    }
  }
}

double SummaryValue(const std::string& log, const std::string& key) {
  std::smatch m;
  std::regex re("SUMMARY .*\\b" + key + "=([-0-9.eE+]+)");
  if (std::regex_search(log, m, re)) return std::stod(m[1]);
  return std::nan("");
}

// The click model, trained by two ps_ctr_worker processes through two
// shards (SSP, RocksDB, a cache smaller than the table), gets within 0.02
// nats of the planted model's Bayes-optimal log loss on held-out data.
TEST(CtrTrainingTest, ClickModelApproachesThePlantedOptimum) {
  TempDir dir;
  worker::ctr::PlantedOptions po;
  po.vocab = 10;
  po.seed = 5;
  worker::ctr::PlantedModel model(po);
  const std::string train = dir.Sub("train.txt"), test = dir.Sub("test.txt");
  ASSERT_TRUE(worker::ctr::WritePlantedFile(train, 100000, model, 1).ok());
  auto st = worker::ctr::WritePlantedFile(test, 10000, model, 2);
  ASSERT_TRUE(st.ok());
  auto servers =
      StartShards(dir, 2,
                  {"--num_workers=2", "--consistency=ssp", "--staleness=1",
                   "--optimizer=adam", "--lr=0.003",
                   "--embedding_cache_bytes=1048576", "--worker_timeout_s=60"});
  ASSERT_EQ(servers.size(), 2u);
  const std::string eps = servers[0].endpoint + "," + servers[1].endpoint;
  std::vector<std::unique_ptr<Process>> workers;
  for (int r = 0; r < 2; ++r) {
    auto w = Process::Start(
        {BinPath("ps_ctr_worker"), "--servers=" + eps,
         "--rank=" + std::to_string(r), "--num_workers=2", "--train=" + train,
         "--test=" + test, "--batch=256", "--epochs=4", "--factor_dim=4",
         "--init_scale=0.1", "--rows_codec=" + std::string(r ? "fp16" : "none"),
         "--timeout_s=60", "--log_every=200"},
        dir.Sub("worker" + std::to_string(r) + ".log"));
    ASSERT_TRUE(w.ok());
    workers.push_back(std::move(*w));
  }
  for (auto& w : workers) {
    auto code = w->Wait(seconds(240));
    ASSERT_TRUE(code.ok()) << w->Log();
    ASSERT_EQ(*code, 0) << w->Log();
  }
  const std::string log = workers[0]->Log();
  const double loss = SummaryValue(log, "test_logloss");
  const double auc = SummaryValue(log, "test_auc");
  EXPECT_LT(loss - st->bayes_logloss_sample, 0.02) << log;
  EXPECT_GT(loss - st->bayes_logloss_sample, -0.02) << log;
  EXPECT_GT(auc, st->bayes_auc - 0.02) << log;
}

}  // namespace
}  // namespace asyncps::testing
