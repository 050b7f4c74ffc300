// Elastic fleets end to end: real ps_server processes, a real etcd (skipped
// without Debian's etcd-server) and ps_ctl add-shard / remove-shard. A worker
// started again after every shard it was given left the fleet registers
// through the layout in etcd (ClientOptions::etcd_endpoints) and trains on.
#include <gtest/gtest.h>

#include <cstring>

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

  // Shard `id` of a fleet of `num_shards` (its count when it joins).
  void StartShard(int id, int num_shards) {
    auto h = StartServer(
        dir_, "shard" + std::to_string(id),
        {"--num_workers=1", "--consistency=asp", "--optimizer=sgd", "--lr=0.5",
         "--shard_id=" + std::to_string(id),
         "--num_shards=" + std::to_string(num_shards),
         "--elastic_etcd=" + etcd_->endpoint(),
         std::string("--etcd_prefix=") + kPrefix},
        "tcp://127.0.0.1:*");
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    shards_.push_back(std::move(h).value());
  }

  // ps_ctl COMMAND ENDPOINT against the fleet's etcd (the first change also
  // needs the static fleet's --servers).
  void Ctl(const std::string& command, const std::string& endpoint) {
    auto p = Process::Start(
        {BinPath("ps_ctl"), "--etcd=" + etcd_->endpoint(),
         std::string("--etcd_prefix=") + kPrefix,
         "--servers=" + shards_[0].endpoint + "," + shards_[1].endpoint,
         command, endpoint},
        dir_.Sub("ctl-" + command + "-" + std::to_string(++ctl_runs_)));
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    auto code = (*p)->Wait(seconds(60));
    ASSERT_TRUE(code.ok()) << code.status().ToString();
    ASSERT_EQ(*code, 0) << (*p)->Log();
  }

  std::unique_ptr<Client> Connect(bool with_etcd, milliseconds deadline,
                                  std::vector<std::string> servers = {}) {
    ClientOptions o;
    o.servers = servers.empty()
                    ? std::vector<std::string>{shards_[0].endpoint,
                                               shards_[1].endpoint}
                    : servers;
    o.rank = 0;
    o.deadline = deadline;
    o.attempt_timeout = milliseconds(500);
    if (with_etcd) {
      o.etcd_endpoints = {etcd_->endpoint()};
      o.etcd_prefix = kPrefix;
    }
    auto c = Client::Create(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }

  // One push of gradient `g` in every element at `clock`.
  static void Push(Client& c, int64_t clock, float g) {
    std::vector<ChunkPayload> payloads;
    for (const ChunkSpec& chunk : c.layout().chunks()) {
      auto buf = Buffer::Allocate(chunk.num_elems * sizeof(float));
      float* f = reinterpret_cast<float*>(buf->data());
      for (uint64_t i = 0; i < chunk.num_elems; ++i) f[i] = g;
      payloads.push_back({chunk.id, 0, Frame::Ref(buf)});
    }
    auto t = c.StartPush(clock, std::move(payloads));
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    Status s = c.Wait(*t, seconds(60));
    ASSERT_TRUE(s.ok()) << s.ToString();
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
  int ctl_runs_ = 0;
};

TEST_F(ElasticIntegrationTest, WorkerStartedAfterItsShardsLeftRegistersThroughEtcd) {
  ASSERT_NO_FATAL_FAILURE(StartShard(0, 2));
  ASSERT_NO_FATAL_FAILURE(StartShard(1, 2));
  std::vector<float> trained;
  {
    auto a = Connect(/*with_etcd=*/true, seconds(60));
    ASSERT_TRUE(a);
    ASSERT_TRUE(a->Register(Model(), Cut()).ok());  // no document yet: as static
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
