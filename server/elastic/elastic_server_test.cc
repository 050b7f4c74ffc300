// Elastic shards, the server loop: a shard frozen for a change whose
// coordinator went away (no adopt or abort before the freeze deadline) asks
// etcd whether the change committed: adopts it if so, aborts if not, and
// without etcd stays frozen (never two owners of a chunk). Real etcd
// (skipped without Debian's etcd-server), in-process server.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "common/elastic_doc.h"
#include "common/etcd_client.h"
#include "server/loop/server.h"
#include "server/testing/test_util.h"
#include "tests/util/etcd_fixture.h"

namespace asyncps::server {
namespace {

using std::chrono::milliseconds;

class ElasticServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!asyncps::testing::EtcdServer::Available())
      GTEST_SKIP() << "etcd not installed (Debian's etcd-server)";
    dir_ = std::filesystem::temp_directory_path() /
           ("elastic_server_test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    auto e = asyncps::testing::EtcdServer::Start((dir_ / "etcd").string(),
                                                 dir_.string());
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    etcd_ = std::move(e).value();
    EtcdOptions eo;
    eo.endpoints = {etcd_->endpoint()};
    auto c = EtcdClient::Create(eo);
    ASSERT_TRUE(c.ok());
    kv_ = std::move(c).value();
    ctx_ = Context::Create(1);
  }
  void TearDown() override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    server_.reset();
    etcd_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  void Start(bool with_etcd) {
    ServerOptions o;
    o.endpoint = "inproc://elastic_server_test";
    o.context = ctx_;
    o.shard.num_workers = 1;
    o.shard.num_shards = 1;
    if (with_etcd) o.elastic_etcd_endpoints = {etcd_->endpoint()};
    o.elastic_prefix = "/elastic_server_test";
    auto s = Server::Create(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(s).value();
    thread_ = std::thread([this] { (void)server_->Run(stop_); });
    TransportOptions to;
    to.context = ctx_;
    auto c = ClientSocket::Connect(o.endpoint, to);
    ASSERT_TRUE(c.ok());
    client_ = std::move(c).value();
    RequestHeader reg = testing::ShardHarness::Register(
        0, testing::SmallModel(), testing::SmallLayout(1));
    ASSERT_TRUE(Call(reg).status.ok());
  }

  ReplyHeader Call(RequestHeader req) {
    req.id = ++next_id_;
    std::vector<Frame> f{Frame::Owned(EncodeRequest(req))};
    EXPECT_TRUE(client_->Send(f).ok());
    Message msg;
    ReplyHeader r;
    while (true) {
      auto got = client_->Receive(&msg, milliseconds(5000));
      if (!got.ok() || !*got) {
        ADD_FAILURE() << "no reply";
        return r;
      }
      EXPECT_TRUE(DecodeReply(msg.frames[0].data, msg.frames[0].size,
                              DecodeLimits(), &r)
                      .ok());
      if (r.id == req.id) return r;
    }
  }

  ReplyHeader Freeze(uint64_t epoch, uint32_t deadline_ms) {
    RequestHeader f;
    f.kind = RequestKind::kMigrate;
    f.rank = -1;
    f.migrate_op = MigrateOp::kFreeze;
    f.migrate_epoch = epoch;
    f.migrate_at_clock = -1;
    f.migrate_deadline_ms = deadline_ms;
    return Call(f);
  }

  // Waits up to 5 s for the freeze to end; the describe text at the end.
  std::string WaitUnfrozen() {
    RequestHeader d;
    d.kind = RequestKind::kMigrate;
    d.rank = -1;
    d.migrate_op = MigrateOp::kDescribe;
    std::string text;
    for (int i = 0; i < 100; ++i) {
      text = Call(d).text;
      if (text.find("\"frozen\":false") != std::string::npos) break;
      std::this_thread::sleep_for(milliseconds(50));
    }
    return text;
  }

  std::filesystem::path dir_;
  std::unique_ptr<asyncps::testing::EtcdServer> etcd_;
  std::unique_ptr<EtcdClient> kv_;
  std::shared_ptr<Context> ctx_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<ClientSocket> client_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  uint64_t next_id_ = 0;
};

TEST_F(ElasticServerTest, OverdueFreezeWithoutACommitAborts) {
  Start(/*with_etcd=*/true);
  ASSERT_TRUE(Freeze(1, 100).status.ok());
  std::vector<float> g(16, 1.0f);
  auto frame = testing::Floats(g);
  RequestHeader push = testing::ShardHarness::Push(0, 0, {0}, {frame});
  push.id = ++next_id_;
  std::vector<Frame> f{Frame::Owned(EncodeRequest(push)),
                       Frame::Copy(frame.data, frame.size)};
  ASSERT_TRUE(client_->Send(f).ok());
  Message msg;
  ASSERT_TRUE(*client_->Receive(&msg, milliseconds(5000)));
  ReplyHeader r;
  ASSERT_TRUE(
      DecodeReply(msg.frames[0].data, msg.frames[0].size, DecodeLimits(), &r)
          .ok());
  EXPECT_EQ(r.status.code(), StatusCode::kUnavailable);  // held by the freeze
  const std::string text = WaitUnfrozen();
  EXPECT_NE(text.find("\"frozen\":false"), std::string::npos) << text;
  EXPECT_NE(text.find("\"epoch\":0"), std::string::npos) << text;
}

TEST_F(ElasticServerTest, OverdueFreezeAfterTheCommitAdopts) {
  Start(/*with_etcd=*/true);
  ElasticDoc doc;
  doc.epoch = 1;
  doc.servers = {"inproc://elastic_server_test", "tcp://127.0.0.1:9"};
  doc.owners.assign(server_->shard().layout()->chunks().size(), 0);
  ASSERT_TRUE(kv_->Put("/elastic_server_test/elastic", doc.ToJson()).ok());
  ASSERT_TRUE(Freeze(1, 100).status.ok());
  const std::string text = WaitUnfrozen();
  EXPECT_NE(text.find("\"epoch\":1"), std::string::npos) << text;
  // Requests routed by the old layout now get the new one.
  RequestHeader pull = testing::ShardHarness::Pull(0, 0);
  ReplyHeader r = Call(pull);
  EXPECT_EQ(r.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.layout_doc, doc.ToJson());
  pull.layout_epoch = 1;
  EXPECT_TRUE(Call(pull).status.ok());
}

TEST_F(ElasticServerTest, OverdueFreezeWithoutEtcdStaysFrozen) {
  Start(/*with_etcd=*/false);
  ASSERT_TRUE(Freeze(1, 50).status.ok());
  std::this_thread::sleep_for(milliseconds(700));
  RequestHeader d;
  d.kind = RequestKind::kMigrate;
  d.rank = -1;
  d.migrate_op = MigrateOp::kDescribe;
  EXPECT_NE(Call(d).text.find("\"frozen\":true"), std::string::npos);
}

}  // namespace
}  // namespace asyncps::server
