// The event loop over a real (in-process) ZeroMQ transport: malformed
// input gets error replies and the server keeps serving.
#include "server/loop/server.h"

#include <gtest/gtest.h>

#include <thread>

#include "server/testing/test_util.h"

namespace asyncps::server {
namespace {

// Sends `frames` on `c` and decodes the reply (5 s at most).
ReplyHeader Roundtrip(ClientSocket& c, std::vector<Frame> frames) {
  EXPECT_TRUE(c.Send(frames).ok());
  Message msg;
  auto got = c.Receive(&msg, std::chrono::milliseconds(5000));
  EXPECT_TRUE(got.ok() && *got);
  ReplyHeader r;
  if (!msg.frames.empty()) {
    EXPECT_TRUE(
        DecodeReply(msg.frames[0].data, msg.frames[0].size, DecodeLimits(), &r)
            .ok());
  }
  return r;
}

using testing::SmallLayout;
using testing::SmallModel;

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ctx_ = Context::Create(1);
    ServerOptions o;
    o.endpoint = "inproc://server_test";
    o.context = ctx_;
    o.max_message_bytes = 4096;
    o.shard.num_workers = 2;
    o.shard.num_shards = 1;
    auto s = Server::Create(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(s).value();
    thread_ = std::thread([this] { run_status_ = server_->Run(stop_); });
    TransportOptions to;
    to.context = ctx_;
    auto c = ClientSocket::Connect("inproc://server_test", to);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_ = std::move(c).value();
  }
  void TearDown() override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

  ReplyHeader Roundtrip(std::vector<Frame> frames) {
    return server::Roundtrip(*client_, std::move(frames));
  }
  ReplyHeader Call(const RequestHeader& req) {
    std::vector<Frame> f;
    f.push_back(Frame::Owned(EncodeRequest(req)));
    return Roundtrip(std::move(f));
  }

  std::shared_ptr<Context> ctx_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<ClientSocket> client_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  Status run_status_;
};

TEST_F(ServerTest, BadInputGetsErrorRepliesAndServerKeepsServing) {
  RequestHeader reg =
      testing::ShardHarness::Register(0, SmallModel(), SmallLayout(1));
  reg.id = 5;
  ReplyHeader r = Call(reg);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.id, 5u);

  // Garbage bytes: error reply with id 0.
  std::vector<Frame> g;
  g.push_back(Frame::Copy("\x01\x02garbage!garbage!", 17));
  r = Roundtrip(std::move(g));
  EXPECT_FALSE(r.status.ok());
  EXPECT_EQ(r.id, 0u);

  // Truncated Cap'n Proto.
  RequestHeader pull = testing::ShardHarness::Pull(0, 0);
  pull.id = 9;
  std::vector<uint8_t> bytes = EncodeRequest(pull);
  bytes.resize(bytes.size() / 2);
  std::vector<Frame> t;
  t.push_back(Frame::Owned(std::move(bytes)));
  r = Roundtrip(std::move(t));
  EXPECT_FALSE(r.status.ok());

  // Wrong protocol version: the id is echoed.
  RequestHeader v = pull;
  v.version = 3;
  v.id = 11;
  r = Call(v);
  EXPECT_EQ(r.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.id, 11u);

  // Oversize message (limit 4096 bytes).
  std::vector<Frame> big;
  RequestHeader push = testing::ShardHarness::Push(
      0, 0, {0}, {testing::Floats(std::vector<float>(1000))});
  push.id = 12;
  big.push_back(Frame::Owned(EncodeRequest(push)));
  big.push_back(Frame::Owned(std::vector<uint8_t>(4000)));
  big.push_back(Frame::Owned(std::vector<uint8_t>(4000)));
  r = Roundtrip(std::move(big));
  // Answered with its own id and a final code: resending cannot help.
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.id, 12u);
  // Every reply states the limits, so a client can refuse such a request
  // itself.
  EXPECT_EQ(r.max_request_bytes, 4096u);
  EXPECT_EQ(r.max_frame_bytes, 4096u);

  // Still serving; rejections are counted.
  RequestHeader stats;
  stats.kind = RequestKind::kStats;
  stats.id = 13;
  r = Call(stats);
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.id, 13u);
  EXPECT_NE(r.text.find("\"malformed\":2"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("\"protocol_version\":1"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("\"oversize\":1"), std::string::npos) << r.text;

  // A valid pull returns the chunk as a data frame.
  pull.id = 14;
  std::vector<Frame> pf;
  pf.push_back(Frame::Owned(EncodeRequest(pull)));
  ASSERT_TRUE(client_->Send(pf).ok());
  Message msg;
  ASSERT_TRUE(*client_->Receive(&msg, std::chrono::milliseconds(5000)));
  ASSERT_TRUE(
      DecodeReply(msg.frames[0].data, msg.frames[0].size, DecodeLimits(), &r)
          .ok());
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(msg.frames.size(), 1 + r.chunks.size());

  RequestHeader bye;
  bye.kind = RequestKind::kShutdown;
  bye.id = 15;
  r = Call(bye);
  EXPECT_TRUE(r.status.ok());
  thread_.join();
  EXPECT_TRUE(run_status_.ok());
}

// Issue 13, item 8: with CURVE, checkpoint and shutdown need an admin key
// distinct from the workers' keys; stats stays open to every client.
TEST(ServerAdminTest, CurveAdminRequestsNeedAnAdminKey) {
  std::string server_pub, server_sec, worker_pub, worker_sec, admin_pub,
      admin_sec;
  ASSERT_TRUE(GenerateCurveKeyPair(&server_pub, &server_sec).ok());
  ASSERT_TRUE(GenerateCurveKeyPair(&worker_pub, &worker_sec).ok());
  ASSERT_TRUE(GenerateCurveKeyPair(&admin_pub, &admin_sec).ok());
  auto ctx = Context::Create(1);
  ServerOptions o;
  o.endpoint = "tcp://127.0.0.1:*";
  o.context = ctx;
  o.shard.num_shards = 1;
  o.curve_secret_key = server_sec;
  o.curve_allowed_client_keys = {worker_pub};
  o.curve_admin_keys = {admin_pub};
  auto s = Server::Create(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::atomic<bool> stop{false};
  Status run;
  std::thread loop([&] { run = (*s)->Run(stop); });
  auto call = [&](const std::string& pub, const std::string& sec,
                  RequestKind kind) {
    TransportOptions to;
    to.context = ctx;
    to.curve_server_key = server_pub;
    to.curve_public_key = pub;
    to.curve_secret_key = sec;
    auto c = ClientSocket::Connect((*s)->endpoint(), to);
    EXPECT_TRUE(c.ok());
    RequestHeader req;
    req.kind = kind;
    req.id = 77;
    std::vector<Frame> f{Frame::Owned(EncodeRequest(req))};
    return Roundtrip(**c, std::move(f));
  };
  ReplyHeader r = call(worker_pub, worker_sec, RequestKind::kShutdown);
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status.message().find("admin"), std::string::npos);
  r = call(worker_pub, worker_sec, RequestKind::kCheckpoint);
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  r = call(worker_pub, worker_sec, RequestKind::kStats);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_NE(r.text.find("\"admin_denied\":2"), std::string::npos) << r.text;
  EXPECT_FALSE((*s)->shard().shutdown_requested());
  r = call(admin_pub, admin_sec, RequestKind::kCheckpoint);
  EXPECT_TRUE(r.status.ok()) << r.status.ToString();
  r = call(admin_pub, admin_sec, RequestKind::kShutdown);
  EXPECT_TRUE(r.status.ok()) << r.status.ToString();
  loop.join();
  EXPECT_TRUE(run.ok());
}

}  // namespace
}  // namespace asyncps::server
