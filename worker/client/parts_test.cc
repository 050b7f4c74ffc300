// Tests of the Client's parts that need no shard: ShmPulls' reply check and
// ElasticRouter's redirect check (worker/client/). The Client as a whole is
// tested in worker/client_test.cc.
#include <gtest/gtest.h>

#include "worker/client/elastic_router.h"
#include "worker/client/shm_pulls.h"

namespace asyncps::worker::client {
namespace {

Layout TwoChunkLayout() {
  LayoutOptions lo;
  lo.chunk_elems = 8;
  lo.min_chunk_elems = 8;
  lo.num_shards = 1;
  TensorSpec t;
  t.name = "w";
  t.shape = {16};
  StatusOr<Layout> l = Layout::Create({t}, lo);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  return std::move(*l);
}

ReplyHeader ShmReply(const Layout& layout) {
  ReplyHeader r;
  for (uint32_t id : layout.shard_chunks(0)) {
    ChunkRef c;
    c.chunk = id;
    c.frame = 0;
    c.num_elems = layout.chunks()[id].num_elems;
    c.byte_size = c.num_elems * sizeof(float);
    r.chunks.push_back(c);
  }
  return r;
}

TEST(ShmPullsTest, ReplyNamingEveryChunkInPlaceIsCounted) {
  const Layout layout = TwoChunkLayout();
  const auto& owned = layout.shard_chunks(0);
  const std::vector<uint32_t> ids(owned.begin(), owned.end());
  ASSERT_EQ(ids.size(), 2u);
  TicketResult result;
  ASSERT_TRUE(
      ShmPulls::CheckReply(layout, ids, ShmReply(layout), &result).ok());
  EXPECT_EQ(result.bytes_received, 16 * sizeof(float));
}

TEST(ShmPullsTest, ReplyWithAFrameOrAMissingChunkIsCorrupt) {
  const Layout layout = TwoChunkLayout();
  const auto& owned = layout.shard_chunks(0);
  const std::vector<uint32_t> ids(owned.begin(), owned.end());
  TicketResult result;
  ReplyHeader framed = ShmReply(layout);
  framed.chunks[1].frame = 1;  // bytes sent over the socket after all
  EXPECT_EQ(ShmPulls::CheckReply(layout, ids, framed, &result).code(),
            StatusCode::kCorruption);
  ReplyHeader short_reply = ShmReply(layout);
  short_reply.chunks.pop_back();
  EXPECT_EQ(ShmPulls::CheckReply(layout, ids, short_reply, &result).code(),
            StatusCode::kCorruption);
}

TEST(ElasticRouterTest, RedirectFollowedOnlyToAGivenMemberWithoutEtcd) {
  ClientOptions o;
  o.servers = {"tcp://a:1|tcp://b:2"};
  ElasticRouter router(o);
  const std::vector<std::string> members = {"tcp://a:1", "tcp://b:2"};
  const auto now = SteadyClock::now();
  EXPECT_TRUE(router.RedirectAllowed(0, members, "tcp://b:2", now));
  EXPECT_FALSE(router.RedirectAllowed(0, members, "tcp://evil:3", now));
  // Refused again from the cache while it lasts.
  EXPECT_FALSE(router.RedirectAllowed(0, members, "tcp://evil:3", now));
  EXPECT_EQ(router.epoch(), 0u);
  EXPECT_EQ(router.key_ranges(), nullptr);
}

}  // namespace
}  // namespace asyncps::worker::client
