#include "server/loop/server_metrics.h"

#include <gtest/gtest.h>

#include <thread>

#include "server/loop/server.h"
#include "server/testing/test_util.h"

namespace asyncps::server {
namespace {

using std::chrono::milliseconds;
using testing::ShardHarness;
using testing::SmallLayout;
using testing::SmallModel;

// The value of one sample line "name{labels} value" of an exposition, or -1.
double Sample(const std::string& text, const std::string& series) {
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::atof(text.c_str() + at + series.size() + 2);
}

TEST(ServerMetrics, FollowsTheShard) {
  metrics::Registry registry;
  ShardOptions so;
  so.num_workers = 2;
  so.consistency = Consistency::kSsp;
  so.staleness = 0;
  ShardHarness h(so);
  ServerMetricsOptions mo;
  mo.publish_every = milliseconds(0);
  ServerMetrics m(&registry, so.num_workers, mo);
  auto send = [&](RequestHeader req, std::vector<ByteView> data = {}) {
    req.id = ++h.next_id;
    uint64_t bytes = 0;
    for (const ByteView& v : data) bytes += v.size;
    std::vector<OutgoingReply> out;
    h.shard->Handle("peer" + std::to_string(req.rank), req, data, h.now, &out);
    m.OnRequest(req.kind, "peer" + std::to_string(req.rank), req.id,
                100 + bytes, h.now, 0.001);
    for (const OutgoingReply& r : out) m.OnReply(r.peer, r.header, 50, h.now);
    return out;
  };
  ASSERT_EQ(
      send(ShardHarness::Register(0, SmallModel(), SmallLayout(1))).size(), 1u);
  const uint32_t chunk = h.FirstChunk();
  std::vector<float> g(h.ChunkElems(chunk), 0.5f);
  // Both read version 0, then both push: staleness 0 and 1.
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_EQ(send(ShardHarness::Pull(rank, 0)).size(), 1u);
  }
  for (int rank = 0; rank < 2; ++rank) {
    ByteView f = testing::Floats(g);
    ASSERT_EQ(send(ShardHarness::Push(rank, 0, {chunk}, {f}), {f}).size(), 1u);
  }
  // Rank 0 at clock 1 waits for rank 1 (s = 0): parked for 250 ms.
  ASSERT_TRUE(send(ShardHarness::Clock(0, 1)).size() == 1);
  EXPECT_TRUE(send(ShardHarness::Pull(0, 1)).empty());
  h.now += milliseconds(250);
  auto released = send(ShardHarness::Clock(1, 1));
  ASSERT_EQ(released.size(), 2u);  // the clock's reply and the parked pull
  // A push naming an unknown chunk is rejected.
  ByteView bad = testing::Floats(g);
  EXPECT_FALSE(send(ShardHarness::Push(1, 1, {9999}, {bad}), {bad})[0]
                   .header.status.ok());
  m.Publish(*h.shard, h.now);

  const std::string text = registry.Render();
  EXPECT_EQ(Sample(text, "asyncps_shard_requests_total{kind=\"push\"}"), 3);
  EXPECT_EQ(Sample(text, "asyncps_shard_requests_total{kind=\"pull\"}"), 3);
  EXPECT_EQ(Sample(text, "asyncps_shard_pushes_total"),
            h.shard->counters().pushes);
  EXPECT_EQ(Sample(text, "asyncps_shard_pushes_total"), 2);
  // Staleness: rank 0 pushed at version 0 (0), rank 1 after it (1).
  EXPECT_EQ(Sample(text, "asyncps_shard_staleness_count"), 2);
  EXPECT_EQ(Sample(text, "asyncps_shard_staleness_sum"), 1);
  EXPECT_EQ(Sample(text, "asyncps_shard_staleness_bucket{le=\"0\"}"), 1);
  // Three pulls answered, one of them after 250 ms.
  EXPECT_EQ(Sample(text, "asyncps_shard_pull_wait_seconds_count"), 3);
  EXPECT_NEAR(Sample(text, "asyncps_shard_pull_wait_seconds_sum"), 0.25, 1e-6);
  EXPECT_EQ(
      Sample(text, "asyncps_shard_rejected_total{reason=\"unknown_chunk\"}"),
      1);
  EXPECT_EQ(Sample(text, "asyncps_shard_worker_clock{rank=\"0\"}"), 1);
  EXPECT_EQ(Sample(text, "asyncps_shard_worker_clock{rank=\"1\"}"), 1);
  EXPECT_EQ(Sample(text, "asyncps_shard_live_workers"), 2);
  EXPECT_EQ(Sample(text, "asyncps_shard_version"), 2);
  EXPECT_EQ(Sample(text, "asyncps_shard_chunk_bytes"), 74 * 4);
  EXPECT_EQ(Sample(text, "asyncps_shard_push_bytes_total{kind=\"raw\"}"),
            2 * g.size() * 4);
  EXPECT_EQ(Sample(text, "asyncps_shard_memory_budget_bytes{kind=\"used\"}"),
            h.shard->budget().used());
  EXPECT_GT(h.shard->budget().used(), 0u);  // the registered chunks
  EXPECT_EQ(
      Sample(text, "asyncps_shard_memory_budget_bytes{kind=\"capacity\"}"),
      h.shard->budget().capacity());
  EXPECT_EQ(Sample(text, "asyncps_shard_degraded"), 0);
  EXPECT_EQ(Sample(text, "asyncps_shard_request_bytes_total{kind=\"push\"}"),
            3 * (100 + g.size() * 4));
}

TEST(ServerMetrics, CountsCheckpointsAndDurableWrites) {
  metrics::Registry registry;
  MemStore store;
  ShardOptions so;
  so.durable = true;
  ShardHarness h(so, &store);
  ServerMetricsOptions mo;
  mo.publish_every = milliseconds(0);
  ServerMetrics m(&registry, 1, mo);
  ASSERT_TRUE(h.Call(ShardHarness::Register(0, SmallModel(), SmallLayout(1)))
                  .status.ok());
  const uint32_t chunk = h.FirstChunk();
  ByteView f = testing::Floats(std::vector<float>(h.ChunkElems(chunk), 0.25f));
  ASSERT_TRUE(h.Call(ShardHarness::Push(0, 0, {chunk}, {f}), {f}).status.ok());
  ASSERT_TRUE(h.shard->Checkpoint().ok());
  m.Publish(*h.shard, h.now);
  const std::string text = registry.Render();
  const ShardCounters& c = h.shard->counters();
  EXPECT_EQ(c.durable_writes, 1u);  // the push
  EXPECT_EQ(Sample(text, "asyncps_shard_durable_writes_total"), 1);
  // Registration checkpoints once, then the explicit one.
  EXPECT_EQ(Sample(text, "asyncps_shard_checkpoints_total"), 2);
  EXPECT_EQ(Sample(text, "asyncps_shard_checkpoint_seconds_total"),
            c.checkpoint_ns * 1e-9);
  // Two checkpoints hold every chunk: at least twice the weights.
  EXPECT_GT(Sample(text, "asyncps_shard_store_written_bytes_total"),
            2 * 74 * 4);
}

TEST(ServerMetrics, PublishIsRateLimited) {
  metrics::Registry registry;
  ShardOptions so;
  ShardHarness h(so);
  ServerMetrics m(&registry, 1);  // publish_every 200 ms
  m.Publish(*h.shard, h.now);
  h.Call(ShardHarness::Register(0, SmallModel(), SmallLayout(1)));
  h.Call(ShardHarness::Clock(0, 5));
  m.Publish(*h.shard, h.now + milliseconds(10));
  EXPECT_EQ(Sample(registry.Render(), "asyncps_shard_worker_clock{rank=\"0\"}"),
            0);
  m.Publish(*h.shard, h.now + milliseconds(300));
  EXPECT_EQ(Sample(registry.Render(), "asyncps_shard_worker_clock{rank=\"0\"}"),
            5);
}

// The event loop feeds the registry while serving real (inproc) sockets.
TEST(ServerMetrics, ServerFeedsTheRegistry) {
  metrics::Registry registry;
  auto ctx = Context::Create(1);
  ServerOptions o;
  o.endpoint = "inproc://server_metrics_test";
  o.context = ctx;
  o.shard.num_workers = 1;
  o.metrics = &registry;
  auto s = Server::Create(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::atomic<bool> stop{false};
  std::thread loop([&] { (void)(*s)->Run(stop); });
  TransportOptions to;
  to.context = ctx;
  auto c = ClientSocket::Connect(o.endpoint, to);
  ASSERT_TRUE(c.ok());
  RequestHeader reg = ShardHarness::Register(0, SmallModel(), SmallLayout(1));
  reg.id = 1;
  std::vector<Frame> f{Frame::Owned(EncodeRequest(reg))};
  ASSERT_TRUE((*c)->Send(f).ok());
  std::vector<Frame> g{Frame::Copy("garbage", 7)};
  ASSERT_TRUE((*c)->Send(g).ok());
  Message msg;
  for (int i = 0; i < 2; ++i) {
    auto got = (*c)->Receive(&msg, milliseconds(5000));
    ASSERT_TRUE(got.ok() && *got);
  }
  // Counters are published within publish_every (200 ms) of the loop.
  std::string text;
  for (int i = 0; i < 100; ++i) {
    text = registry.Render();
    if (Sample(text, "asyncps_shard_rejected_total{reason=\"malformed\"}") ==
        1) {
      break;
    }
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_EQ(Sample(text, "asyncps_shard_rejected_total{reason=\"malformed\"}"),
            1)
      << text;
  EXPECT_EQ(Sample(text, "asyncps_shard_requests_total{kind=\"register\"}"), 1);
  EXPECT_GT(Sample(text, "asyncps_shard_reply_bytes_total{kind=\"register\"}"),
            0);
  EXPECT_EQ(
      Sample(text, "asyncps_shard_request_seconds_count{kind=\"register\"}"),
      1);
  stop = true;
  loop.join();
}

}  // namespace
}  // namespace asyncps::server
