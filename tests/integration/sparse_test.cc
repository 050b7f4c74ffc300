// Sparse tables end to end: real ps_server processes (RocksDB in temp dirs,
// caches smaller than the tables) and the worker Client; kill -9 recovery
// with and without --durable; ps_ctl stats; the click model trained by
// ps_ctr_worker processes on planted Criteo-format data.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <sstream>

#include "tests/util/etcd_fixture.h"
#include "tests/util/process.h"
#include "worker/client.h"
#include "worker/ctr/planted.h"

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
    auto h = StartServer(dir, prefix + std::to_string(s), f,
                         "tcp://127.0.0.1:*");
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
        for (uint32_t j = 0; j < t_.dim; ++j) it->second[j] += g[i * t_.dim + j];
      }
    }
    for (uint64_t k : order) {
      std::vector<float>& w = Row(k);
      for (uint32_t j = 0; j < t_.dim; ++j)
        w[j] -= t_.optimizer.lr * sum[k][j];
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
  for (float& v : g) v = static_cast<float>(static_cast<int>(rng() % 33) - 16) / 64.0f;
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
  auto servers = StartShards(
      dir, 2, {"--num_workers=2", "--optimizer=sgd", "--lr=0.1",
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
      ASSERT_NEAR(half[i * t.dim + j], want, 1e-3 * std::max(1.0f, std::abs(want)));
    }
  }
  // Both shards evicted and read back from RocksDB.
  int code = 0;
  auto ctl = Process::Start({BinPath("ps_ctl"),
                             "--servers=" + servers[0].endpoint + "," +
                                 servers[1].endpoint,
                             "stats"},
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
  if (!EtcdServer::Available()) GTEST_SKIP() << "etcd not installed (etcd-server)";
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
  auto train = [&](int steps) {
    for (int i = 0; i < steps; ++i) {
      auto keys = Batch(2000, 20000, rng);
      auto g = Grads(keys.size(), t.dim, rng);
      ASSERT_TRUE(PushRows(*c, 0, keys, g).ok());
      ref.Push(keys, g);
    }
  };
  auto check = [&]() {
    auto probe = Batch(3000, 20000, rng);
    ExpectRows(ref, probe, PullRows(*c, 0, probe, t.dim), t.dim);
  };
  auto ctl = [&](const std::string& cmd, const std::string& endpoint) {
    auto p = Process::Start({BinPath("ps_ctl"), "--etcd=" + (*etcd)->endpoint(),
                             "--etcd_prefix=" + prefix,
                             "--servers=" + servers[0].endpoint + "," + servers[1].endpoint,
                             cmd, endpoint},
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
  check();  // routed by epoch 0: refused, re-routed by the document
  train(10);
  check();

  rep = ctl("remove-shard", servers[0].endpoint);
  ASSERT_TRUE(rep.is_object());
  EXPECT_GT(rep.value("moved_rows", 0), 1000);
  EXPECT_EQ(rep["active"], nlohmann::json::array({1, 2}));
  train(10);  // routed by epoch 1: refused, re-routed
  check();
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
    for (uint64_t k = 0; k < vocab; ++k) all.push_back(k * 0x9e3779b97f4a7c15ULL);
    Reference& want = durable ? ref : at_checkpoint;
    for (size_t off = 0; off < all.size(); off += 5000) {
      std::vector<uint64_t> part(all.begin() + off,
                                 all.begin() + std::min(all.size(), off + 5000));
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
  auto servers = StartShards(
      dir, 2, {"--num_workers=2", "--consistency=ssp", "--staleness=1",
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
