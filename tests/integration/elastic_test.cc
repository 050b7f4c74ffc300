// Elastic fleets end to end: real ps_server processes, a real etcd (skipped
// without Debian's etcd-server) and ps_ctl add-shard / remove-shard. A worker
// started again after every shard it was given left the fleet registers
// through the layout in etcd (ClientOptions::etcd_endpoints) and trains on.
// Replica groups grow, shrink and fail over with chunks and sparse rows.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "common/buffer.h"
#include "tests/util/etcd_fixture.h"
#include "tests/util/process.h"
#include "worker/client.h"

namespace asyncps::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using worker::ChunkPayload;
using worker::Client;
using worker::ClientOptions;
using worker::RowsPull;
using worker::RowsPush;

constexpr char kPrefix[] = "/asyncps/elastic_it";

// 21 chunks of at most 128 floats: enough to spread over 4 shards.
LayoutOptions Cut() {
  LayoutOptions o;
  o.chunk_elems = 128;
  o.min_chunk_elems = 128;
  return o;
}

std::vector<TensorSpec> Model() {
  return {TensorSpec{"w", {64, 40}, InitKind::kZeros, 0, 1},
          TensorSpec{"b", {40}, InitKind::kZeros, 0, 1}};
}

class ElasticIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdServer::Available())
      GTEST_SKIP() << "etcd not installed (Debian's etcd-server)";
    auto e = EtcdServer::Start(dir_.Sub("etcd"), dir_.path().string());
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    etcd_ = std::move(e).value();
  }

  // Shard `id` of a fleet of `num_shards` (its count when it joins); with
  // `replicas` > 1 member `replica` of replica group `id`.
  void StartShard(int id, int num_shards, int replicas = 1, int replica = 0) {
    std::vector<std::string> flags = {
        "--num_workers=1",
        "--consistency=asp",
        "--optimizer=sgd",
        "--lr=0.5",
        "--shard_id=" + std::to_string(id),
        "--num_shards=" + std::to_string(num_shards),
        "--elastic_etcd=" + etcd_->endpoint(),
        std::string("--etcd_prefix=") + kPrefix};
    if (replicas > 1) {
      flags.insert(flags.end(),
                   {"--replicas=" + std::to_string(replicas),
                    "--replica=" + std::to_string(replica),
                    "--etcd=" + etcd_->endpoint(), "--lease_ms=1000"});
    }
    auto h = StartServer(
        dir_, "shard" + std::to_string(id) + "r" + std::to_string(replica),
        flags, "tcp://127.0.0.1:*");
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    shards_.push_back(std::move(h).value());
  }

  // Replica group `id` of two members; returns "ep0|ep1".
  std::string StartGroup(int id, int num_shards) {
    StartShard(id, num_shards, 2, 0);
    StartShard(id, num_shards, 2, 1);
    if (shards_.size() < 2) return "";
    return shards_[shards_.size() - 2].endpoint + "|" + shards_.back().endpoint;
  }

  // ps_ctl COMMAND ENDPOINT against the fleet's etcd (the first change also
  // needs the static fleet's --servers: first_ when set, else the first two
  // shards started).
  void Ctl(const std::string& command, const std::string& endpoint) {
    const std::string first =
        first_.empty() ? shards_[0].endpoint + "," + shards_[1].endpoint
                       : first_;
    auto p = Process::Start(
        {BinPath("ps_ctl"), "--etcd=" + etcd_->endpoint(),
         std::string("--etcd_prefix=") + kPrefix, "--servers=" + first, command,
         endpoint},
        dir_.Sub("ctl-" + command + "-" + std::to_string(++ctl_runs_)));
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    auto code = (*p)->Wait(seconds(60));
    ASSERT_TRUE(code.ok()) << code.status().ToString();
    ASSERT_EQ(*code, 0) << (*p)->Log();
  }

  std::unique_ptr<Client> Connect(bool with_etcd, milliseconds deadline,
                                  std::vector<std::string> servers = {}) {
    ClientOptions o;
    if (servers.empty() && !first_.empty())
      servers = worker::ParseEndpoints(first_);
    o.servers = servers.empty() ? std::vector<std::string>{shards_[0].endpoint,
                                                           shards_[1].endpoint}
                                : servers;
    o.rank = 0;
    o.deadline = deadline;
    o.attempt_timeout = milliseconds(500);
    o.heartbeat_interval = milliseconds(200);  // shards that join get them too
    if (with_etcd) {
      o.etcd_endpoints = {etcd_->endpoint()};
      o.etcd_prefix = kPrefix;
    }
    auto c = Client::Create(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }

  // One push of gradient `g` in every element at `clock` (and in every row
  // of `keys` of table 0 when given).
  static void Push(Client& c, int64_t clock, float g,
                   const std::vector<uint64_t>& keys = {}) {
    std::vector<ChunkPayload> payloads;
    for (const ChunkSpec& chunk : c.layout().chunks()) {
      auto buf = Buffer::Allocate(chunk.num_elems * sizeof(float));
      float* f = reinterpret_cast<float*>(buf->data());
      for (uint64_t i = 0; i < chunk.num_elems; ++i) f[i] = g;
      payloads.push_back({chunk.id, 0, Frame::Ref(buf)});
    }
    std::vector<float> grads;
    std::vector<RowsPush> rows;
    if (!keys.empty()) {
      grads.assign(keys.size() * c.tables()[0].dim, g);
      rows.push_back(RowsPush{0, keys.data(), keys.size(), grads.data()});
    }
    auto t = rows.empty() ? c.StartPush(clock, std::move(payloads))
                          : c.StartPushRows(clock, std::move(payloads), rows);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    Status s = c.Wait(*t, seconds(60));
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  // The rows of `keys` of table 0.
  static std::vector<float> PullRows(Client& c, int64_t clock,
                                     const std::vector<uint64_t>& keys) {
    std::vector<float> out(keys.size() * c.tables()[0].dim, -9.0f);
    auto t = c.StartPullRows(
        clock, {}, {RowsPull{0, keys.data(), keys.size(), out.data()}});
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (t.ok()) {
      Status s = c.Wait(*t, seconds(60));
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
    return out;
  }

  static std::vector<float> Pull(Client& c, int64_t clock) {
    std::vector<float> w(64 * 40, -9.0f), b(40, -9.0f);
    auto t = c.StartPull(clock, {w.data(), b.data()});
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (t.ok()) {
      Status s = c.Wait(*t, seconds(60));
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
    w.insert(w.end(), b.begin(), b.end());
    return w;
  }

  TempDir dir_;
  std::unique_ptr<EtcdServer> etcd_;
  std::vector<ServerHandle> shards_;
  std::string first_;  // the static fleet's servers, when not shards 0 and 1
  int ctl_runs_ = 0;
};

// ps_ctl stats of the replica at `endpoint` (an empty object when it does
// not answer).
nlohmann::json Stats(const TempDir& dir, const std::string& endpoint) {
  static int runs = 0;
  auto p = Process::Start({BinPath("ps_ctl"), "--servers=" + endpoint, "stats"},
                          dir.Sub("stats-" + std::to_string(++runs)));
  if (!p.ok()) return nlohmann::json::object();
  auto code = (*p)->Wait(seconds(20));
  if (!code.ok() || *code != 0) return nlohmann::json::object();
  auto j = nlohmann::json::parse((*p)->Log(), nullptr, false);
  if (j.is_discarded() || !j.contains("shards") || j["shards"].empty())
    return nlohmann::json::object();
  return j["shards"][0]["stats"];
}

// "role" of the replica at `endpoint` (primary, backup, spare).
std::string Role(const TempDir& dir, const std::string& endpoint) {
  nlohmann::json j = Stats(dir, endpoint);
  return j.contains("replication") ? j["replication"].value("role", "") : "";
}

// Rows of table 0 the replica at `endpoint` holds (its store's estimate and
// its cache).
uint64_t HeldRows(const TempDir& dir, const std::string& endpoint) {
  nlohmann::json j = Stats(dir, endpoint);
  if (!j.contains("sparse")) return 0;
  const nlohmann::json& t = j["sparse"]["tables"][0];
  return t.value("rows", uint64_t{0}) + t.value("cache_rows", uint64_t{0});
}

TEST_F(ElasticIntegrationTest,
       WorkerStartedAfterItsShardsLeftRegistersThroughEtcd) {
  ASSERT_NO_FATAL_FAILURE(StartShard(0, 2));
  ASSERT_NO_FATAL_FAILURE(StartShard(1, 2));
  std::vector<float> trained;
  {
    auto a = Connect(/*with_etcd=*/true, seconds(60));
    ASSERT_TRUE(a);
    ASSERT_TRUE(
        a->Register(Model(), Cut()).ok());  // no document yet: as static
    for (int clock = 0; clock < 3; ++clock) Push(*a, clock, 0.25f);
    // 2 -> 3 -> 4 shards, then both first shards leave: the fleet is the
    // two that joined.
    ASSERT_NO_FATAL_FAILURE(StartShard(2, 3));
    ASSERT_NO_FATAL_FAILURE(Ctl("add-shard", shards_[2].endpoint));
    ASSERT_NO_FATAL_FAILURE(StartShard(3, 4));
    ASSERT_NO_FATAL_FAILURE(Ctl("add-shard", shards_[3].endpoint));
    Push(*a, 3, 0.5f);  // re-routed to the new owners
    ASSERT_NO_FATAL_FAILURE(Ctl("remove-shard", shards_[0].endpoint));
    ASSERT_NO_FATAL_FAILURE(Ctl("remove-shard", shards_[1].endpoint));
    trained = Pull(*a, 4);
  }  // the worker goes away
  for (int s = 0; s < 2; ++s) {
    shards_[s].process->Kill(15);
    EXPECT_FALSE(shards_[s].process->Running());
  }
  // 3 pushes of 0.25 and one of 0.5, lr 0.5, from zeros.
  for (float v : trained) ASSERT_EQ(v, -0.5f * (3 * 0.25f + 0.5f));

  // Without etcd a worker given the first shards finds nobody.
  {
    auto lost = Connect(/*with_etcd=*/false, seconds(3));
    ASSERT_TRUE(lost);
    Status s = lost->Register(Model(), Cut());
    EXPECT_FALSE(s.ok());
  }
  // With etcd it registers with the shards that own chunks now, pulls the
  // trained weights and trains on.
  auto b = Connect(/*with_etcd=*/true, seconds(30));
  ASSERT_TRUE(b);
  Status s = b->Register(Model(), Cut());
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(b->num_shards(), 4);
  // Registering again (PsParameterStore::Create does, after the Python
  // client's own registration) still names the 2 shards that cut the
  // chunks, not the 4 it knows of now.
  s = b->Register(Model(), Cut());
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Pull(*b, 4), trained);
  Push(*b, 4, 1.0f);
  for (float v : Pull(*b, 5)) ASSERT_EQ(v, -0.5f * (3 * 0.25f + 0.5f + 1.0f));

  // A worker given other servers than the fleet's first is told so.
  auto wrong = Connect(/*with_etcd=*/true, seconds(10),
                       {shards_[2].endpoint, shards_[3].endpoint});
  ASSERT_TRUE(wrong);
  s = wrong->Register(Model(), Cut());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("the fleet's first shards"), std::string::npos)
      << s.ToString();
}

}  // namespace
}  // namespace asyncps::testing

namespace asyncps::testing {
namespace {

// Elastic shards with replica groups (R = 2): groups join and leave while a
// worker trains, every step of a change replicated in each group; then the
// primary of the group that joined is killed (SIGKILL) and its backup,
// promoted, holds every update: the weights are the sum of every
// acknowledged push, and a worker started again registers through etcd.
TEST_F(ElasticIntegrationTest, ReplicaGroupsGrowShrinkAndFailOver) {
  const std::string g0 = StartGroup(0, 2);
  const std::string g1 = StartGroup(1, 2);
  ASSERT_FALSE(g0.empty() || g1.empty());
  first_ = g0 + "," + g1;
  float sum = 0.0f;
  auto a = Connect(/*with_etcd=*/true, seconds(60));
  ASSERT_TRUE(a);
  Status s = a->Register(Model(), Cut());
  ASSERT_TRUE(s.ok()) << s.ToString();
  int64_t clock = 0;
  for (; clock < 3; ++clock, sum += 0.25f) Push(*a, clock, 0.25f);
  const std::string g2 = StartGroup(2, 3);
  ASSERT_FALSE(g2.empty());
  ASSERT_NO_FATAL_FAILURE(Ctl("add-shard", g2));
  for (; clock < 6; ++clock, sum += 0.5f) Push(*a, clock, 0.5f);
  ASSERT_NO_FATAL_FAILURE(Ctl("remove-shard", g0));
  for (; clock < 9; ++clock, sum += 0.125f) Push(*a, clock, 0.125f);
  for (float v : Pull(*a, clock)) ASSERT_EQ(v, -0.5f * sum);
  // The joined group's primary dies; its backup takes over with every
  // update (the pushes above were acknowledged only once both applied).
  const size_t g2_first = shards_.size() - 2;
  size_t primary = shards_.size();
  for (size_t i = g2_first; i < shards_.size(); ++i)
    if (Role(dir_, shards_[i].endpoint) == "primary") primary = i;
  ASSERT_LT(primary, shards_.size()) << "no primary in the joined group";
  const size_t backup = primary == g2_first ? g2_first + 1 : g2_first;
  EXPECT_EQ(Role(dir_, shards_[backup].endpoint), "backup");
  shards_[primary].process->Kill(9);
  for (float v : Pull(*a, clock)) ASSERT_EQ(v, -0.5f * sum);
  for (int i = 0; i < 3; ++i, ++clock, sum += 1.0f) Push(*a, clock, 1.0f);
  const std::vector<float> trained = Pull(*a, clock);
  for (float v : trained) ASSERT_EQ(v, -0.5f * sum);
  EXPECT_EQ(Role(dir_, shards_[backup].endpoint), "primary");
  EXPECT_GE(a->failovers(), 1u);
  a.reset();
  // A worker started again registers with the groups that own chunks now.
  auto b = Connect(/*with_etcd=*/true, seconds(30));
  ASSERT_TRUE(b);
  s = b->Register(Model(), Cut());
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Pull(*b, clock), trained);
}

// The same with a sparse table: its key-range buckets move into the group
// that joins and out of the group that leaves, each import, adopt and drop
// applied by every member of the group (handed on like a push), so the
// backup promoted after its primary's SIGKILL holds every row it was given
// and every update since.
TEST_F(ElasticIntegrationTest, ReplicaGroupsMoveSparseRowsAndFailOver) {
  const std::string g0 = StartGroup(0, 2);
  const std::string g1 = StartGroup(1, 2);
  ASSERT_FALSE(g0.empty() || g1.empty());
  first_ = g0 + "," + g1;
  TableSpec emb;
  emb.name = "emb";
  emb.dim = 4;
  emb.init = InitKind::kZeros;
  emb.optimizer.kind = RowOptimizerKind::kSgd;
  emb.optimizer.lr = 0.5f;
  std::vector<uint64_t> keys;
  for (uint64_t i = 0; i < 400; ++i) keys.push_back(i * 2654435761ULL + 7);
  float sum = 0.0f;
  auto expect = [&](const std::vector<float>& got) {
    ASSERT_EQ(got.size(), keys.size() * emb.dim);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], -0.5f * sum) << "key " << keys[i / emb.dim];
  };
  auto a = Connect(/*with_etcd=*/true, seconds(60));
  ASSERT_TRUE(a);
  Status s = a->RegisterModel(Model(), Cut(), {emb});
  ASSERT_TRUE(s.ok()) << s.ToString();
  int64_t clock = 0;
  for (; clock < 3; ++clock, sum += 0.25f) Push(*a, clock, 0.25f, keys);
  const std::string g2 = StartGroup(2, 3);
  ASSERT_FALSE(g2.empty());
  ASSERT_NO_FATAL_FAILURE(Ctl("add-shard", g2));
  // Both members of the joined group hold the rows it was given.
  for (size_t i = shards_.size() - 2; i < shards_.size(); ++i)
    EXPECT_GT(HeldRows(dir_, shards_[i].endpoint), 0u) << shards_[i].endpoint;
  for (; clock < 5; ++clock, sum += 0.5f) Push(*a, clock, 0.5f, keys);
  ASSERT_NO_FATAL_FAILURE(expect(PullRows(*a, clock, keys)));
  ASSERT_NO_FATAL_FAILURE(Ctl("remove-shard", g0));
  for (; clock < 7; ++clock, sum += 0.125f) Push(*a, clock, 0.125f, keys);
  ASSERT_NO_FATAL_FAILURE(expect(PullRows(*a, clock, keys)));
  for (float v : Pull(*a, clock)) ASSERT_EQ(v, -0.5f * sum);
  // Both members of each group that holds rows now are killed in turn
  // (their primaries): the backups hold the rows they were handed.
  for (size_t first : {size_t{2}, shards_.size() - 2}) {
    size_t primary = shards_.size();
    for (size_t i = first; i < first + 2; ++i)
      if (Role(dir_, shards_[i].endpoint) == "primary") primary = i;
    ASSERT_LT(primary, shards_.size())
        << "no primary in the group of " << first;
    shards_[primary].process->Kill(9);
    ASSERT_NO_FATAL_FAILURE(expect(PullRows(*a, clock, keys)));
    for (int i = 0; i < 2; ++i, ++clock, sum += 1.0f)
      Push(*a, clock, 1.0f, keys);
    ASSERT_NO_FATAL_FAILURE(expect(PullRows(*a, clock, keys)));
  }
  for (float v : Pull(*a, clock)) ASSERT_EQ(v, -0.5f * sum);
  EXPECT_GE(a->failovers(), 2u);
}

}  // namespace
}  // namespace asyncps::testing
