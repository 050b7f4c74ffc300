// Elastic shards, shard side: chunks moved between in-process shards by
// kMigrate requests (freeze, export, import, adopt, abort), stale routes
// refused with the layout, and the result bitwise equal to a shard that
// never moved anything. Also the layout document and Rebalance().
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>

#include "common/elastic_doc.h"
#include "server/elastic/elastic_doc.h"
#include "server/shard/shard.h"
#include "server/store/store.h"
#include "server/testing/test_util.h"

namespace asyncps::server {
namespace {

using testing::Fill;
using testing::Floats;
using testing::ShardHarness;
using testing::SmallLayout;
using testing::SmallModel;

TEST(ElasticDocTest, RoundTripAndBadDocuments) {
  ElasticDoc d;
  d.epoch = 3;
  d.servers = {"tcp://127.0.0.1:1", "tcp://127.0.0.1:2", "tcp://127.0.0.1:3"};
  d.owners = {0, 2, 2, 0};
  StatusOr<ElasticDoc> back = ElasticDoc::FromJson(d.ToJson());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->epoch, 3u);
  EXPECT_EQ(back->servers, d.servers);
  EXPECT_EQ(back->owners, d.owners);
  EXPECT_EQ(back->Active(), (std::vector<int>{0, 2}));
  for (const char* bad :
       {"", "[]", "{\"epoch\": 1}",
        "{\"epoch\": 1, \"servers\": [], \"owners\": []}",
        "{\"epoch\": 1, \"servers\": [\"a\"], \"owners\": [1]}",
        "{\"epoch\": 1, \"servers\": [\"a\"], \"owners\": [-1]}",
        "{\"epoch\": -1, \"servers\": [\"a\"], \"owners\": [0]}",
        "{\"epoch\": 1, \"servers\": [\"a\"], \"owners\": [\"x\"]}"}) {
    EXPECT_EQ(ElasticDoc::FromJson(bad).status().code(),
              StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(RebalanceTest, JoinMovesOnlyWhatBalancesAndLeaveGivesEverythingAway) {
  // 24 equal chunks on 2 shards, then a third joins.
  std::vector<uint64_t> sizes(24, 1000);
  std::vector<int> owners(24);
  for (int i = 0; i < 24; ++i) owners[i] = i % 2;
  std::vector<int> three = elastic::Rebalance(sizes, owners, {0, 1, 2});
  int moved = 0;
  for (int i = 0; i < 24; ++i) moved += three[i] != owners[i];
  EXPECT_EQ(moved, 8);  // a third of the chunks, no more
  EXPECT_LE(elastic::Imbalance(sizes, three, {0, 1, 2}), 1.0001);
  // Shard 2 leaves again: only its chunks move.
  std::vector<int> two = elastic::Rebalance(sizes, three, {0, 1});
  for (int i = 0; i < 24; ++i) {
    EXPECT_NE(two[i], 2);
    if (three[i] != 2) {
      EXPECT_EQ(two[i], three[i]) << i;
    }
  }
  EXPECT_LE(elastic::Imbalance(sizes, two, {0, 1}), 1.0001);
  // Unequal chunks: within 1.15x of the mean when the chunks allow it.
  std::vector<uint64_t> mixed;
  for (int i = 0; i < 30; ++i) mixed.push_back(1000 + 97 * (i % 7));
  std::vector<int> start(30);
  for (int i = 0; i < 30; ++i) start[i] = i % 2;
  EXPECT_LE(elastic::Imbalance(
                mixed, elastic::Rebalance(mixed, start, {0, 1, 2}), {0, 1, 2}),
            1.15);
}

RequestHeader Migrate(MigrateOp op, uint64_t epoch) {
  return testing::MigrateRequest(op, epoch);
}

ShardOptions Options(int id, int num_shards) {
  return testing::ElasticTestOptions(id, num_shards);
}

// The gradient every worker pushes to chunk `id` at `clock`.
ByteView Grad(int rank, int64_t clock, uint32_t id, uint64_t n) {
  return testing::ChunkGrad(rank, clock, id, n);
}

// One BSP step of both workers on `h` for the chunks it owns: push, clock.
void Step(ShardHarness& h, int64_t clock, uint64_t epoch = 0) {
  const auto& ids = h.shard->layout()->shard_chunks(h.options.shard_id);
  for (int rank = 0; rank < 2; ++rank) {
    if (!ids.empty()) {
      std::vector<ByteView> frames;
      for (uint32_t id : ids)
        frames.push_back(Grad(rank, clock, id, h.ChunkElems(id)));
      RequestHeader p = ShardHarness::Push(rank, clock, ids, frames);
      p.layout_epoch = epoch;
      ReplyHeader r = h.Call(p, frames);
      ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    }
    RequestHeader c = ShardHarness::Clock(rank, clock + 1);
    c.layout_epoch = epoch;
    ReplyHeader r = h.Call(c);
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  }
}

class MigrateTest : public ::testing::Test {
 protected:
  MigrateTest()
      : a(Options(0, 2)),
        b(Options(1, 2)),
        c(Options(2, 3), &store),
        ref0(Options(0, 2)) {
    for (ShardHarness* h : {&a, &b, &ref0}) {
      EXPECT_TRUE(
          h->Call(ShardHarness::Register(0, SmallModel(), SmallLayout(2)))
              .status.ok());
    }
  }

  // The document of epoch 1: chunk 4 moves from shard 0 to shard 2.
  static std::string Doc() {
    ElasticDoc d;
    d.epoch = 1;
    d.servers = {"tcp://127.0.0.1:1", "tcp://127.0.0.1:2", "tcp://127.0.0.1:3"};
    d.owners = {0, 1, 0, 1, 2};
    return d.ToJson();
  }

  // Freezes a, b and c toward epoch 1 at clock `at`; moves chunk 4 to c.
  void Move(int64_t at) {
    for (ShardHarness* h : {&a, &b, &c}) {
      RequestHeader f = Migrate(MigrateOp::kFreeze, 1);
      f.migrate_at_clock = at;
      ReplyHeader r = h->Call(f);
      ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    }
  }

  void CopyChunk4() {
    RequestHeader e = Migrate(MigrateOp::kExport, 1);
    e.migrate_chunks = {4};
    auto out = a.Send(e);
    ASSERT_EQ(out.size(), 1u);
    ASSERT_TRUE(out[0].header.status.ok()) << out[0].header.status.ToString();
    ASSERT_EQ(out[0].frames.size(), 3u);
    RequestHeader i = Migrate(MigrateOp::kImport, 1);
    i.migrate_chunks = {4};
    ReplyHeader r = c.Call(i, out[0].frames);
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  }

  void AdoptAll() {
    for (ShardHarness* h : {&c, &a, &b}) {  // the receiver first
      RequestHeader d = Migrate(MigrateOp::kAdopt, 1);
      d.migrate_doc = Doc();
      ReplyHeader r = h->Call(d);
      ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    }
  }

  MemStore store;
  ShardHarness a, b, c, ref0;
};

TEST_F(MigrateTest, MoveUnderBspIsBitwiseTheSameAsNoMove) {
  for (int64_t clock = 0; clock < 3; ++clock) {
    Step(a, clock);
    Step(b, clock);
    Step(ref0, clock);
  }
  // Freeze at clock 4: step 3 still goes in; step 4 waits.
  Move(4);
  EXPECT_TRUE(
      a.Call(Migrate(MigrateOp::kDescribe, 0)).text.find("\"drained\":false") !=
      std::string::npos);
  Step(a, 3);
  Step(b, 3);
  Step(ref0, 3);
  auto g = Grad(0, 4, 0, 16);
  RequestHeader held = ShardHarness::Push(0, 4, {0}, {g});
  ReplyHeader r = a.Call(held, {g});
  EXPECT_EQ(r.status.code(), StatusCode::kUnavailable);
  EXPECT_GT(r.retry_ms, 0u);
  EXPECT_EQ(a.Call(ShardHarness::Clock(0, 5)).status.code(),
            StatusCode::kUnavailable);
  EXPECT_NE(
      a.Call(Migrate(MigrateOp::kDescribe, 0)).text.find("\"drained\":true"),
      std::string::npos);
  const std::vector<float> w4 = *a.shard->weights(4);
  const std::vector<float> s4 = *a.shard->optimizer_state(4);
  CopyChunk4();
  // Staged, not served: a stale route is refused only after the flip.
  EXPECT_EQ(c.shard->weights(4), nullptr);
  AdoptAll();
  ASSERT_NE(c.shard->weights(4), nullptr);
  EXPECT_EQ(*c.shard->weights(4), w4);
  EXPECT_EQ(*c.shard->optimizer_state(4), s4);
  EXPECT_EQ(a.shard->weights(4), nullptr);
  EXPECT_EQ(c.shard->bsp_round(), a.shard->bsp_round());
  EXPECT_EQ(c.shard->layout_epoch(), 1u);
  EXPECT_FALSE(a.shard->frozen());

  // The held push, still routed by epoch 0, comes back with the layout.
  r = a.Call(held, {g});
  EXPECT_EQ(r.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.layout_doc, Doc());
  // A clock routed by the old layout comes back too (it must follow the
  // pushes it counts, which the client re-routes first).
  r = a.Call(ShardHarness::Clock(0, 5));
  EXPECT_EQ(r.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.layout_doc, Doc());
  // A worker that starts again registers with the first shard count and is
  // told the layout to route by.
  r = a.Call(ShardHarness::Register(1, SmallModel(), SmallLayout(2)));
  EXPECT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.layout_doc, Doc());
  // A pull routed by an epoch the shard has not adopted is asked again.
  RequestHeader ahead = ShardHarness::Pull(0, 4);
  ahead.layout_epoch = 2;
  r = a.Call(ahead);
  EXPECT_EQ(r.status.code(), StatusCode::kUnavailable);
  EXPECT_GT(r.retry_ms, 0u);

  // Training goes on by epoch 1: three shards, the same sums.
  for (int64_t clock = 4; clock < 7; ++clock) {
    Step(a, clock, 1);
    Step(b, clock, 1);
    Step(c, clock, 1);
    Step(ref0, clock);
  }
  for (uint32_t id : {0u, 2u}) {
    EXPECT_EQ(*a.shard->weights(id), *ref0.shard->weights(id)) << id;
  }
  EXPECT_EQ(*c.shard->weights(4), *ref0.shard->weights(4));  // bitwise
  EXPECT_EQ(*c.shard->optimizer_state(4), *ref0.shard->optimizer_state(4));
  EXPECT_EQ(c.shard->chunk_version(4), ref0.shard->chunk_version(4));

  // The receiver checkpointed its new layout: a restart holds chunk 4.
  ASSERT_TRUE(c.shard->Checkpoint().ok());
  auto again = CreateShard(Options(2, 3), &store, c.now);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_NE((*again)->weights(4), nullptr);
  EXPECT_EQ(*(*again)->weights(4), *c.shard->weights(4));
  EXPECT_EQ((*again)->layout_epoch(), 1u);
}

// A re-route splits one round's push into several to one shard: each piece
// counts once; a second gradient of a chunk for the round does not.
TEST_F(MigrateTest, BspCountsThePiecesOfOneSplitPush) {
  // The reference gets each rank's round-0 gradient of chunks 0 and 2 in one
  // push.
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<ByteView> g{Grad(rank, 0, 0, 16), Grad(rank, 0, 2, 16)};
    ASSERT_TRUE(
        ref0.Call(ShardHarness::Push(rank, 0, {0, 2}, g), g).status.ok());
  }
  // `a` gets the same gradients, chunk by chunk, and chunk 0 of rank 0 twice.
  for (int rank = 0; rank < 2; ++rank) {
    for (uint32_t id : {0u, 2u}) {
      auto g = Grad(rank, 0, id, 16);
      ASSERT_TRUE(
          a.Call(ShardHarness::Push(rank, 0, {id}, {g}), {g}).status.ok());
    }
  }
  const uint64_t skipped = a.shard->counters().skipped_pushes;
  auto again = Grad(0, 0, 0, 16);
  ASSERT_TRUE(
      a.Call(ShardHarness::Push(0, 0, {0}, {again}), {again}).status.ok());
  EXPECT_EQ(a.shard->counters().skipped_pushes, skipped + 1);
  for (ShardHarness* h : {&a, &ref0}) {
    for (int rank = 0; rank < 2; ++rank)
      ASSERT_TRUE(h->Call(ShardHarness::Clock(rank, 1)).status.ok());
  }
  EXPECT_EQ(a.shard->bsp_round(), 1);
  EXPECT_EQ(*a.shard->weights(0), *ref0.shard->weights(0));
  EXPECT_EQ(*a.shard->weights(2), *ref0.shard->weights(2));
}

// A freeze held rank 0's push for round 2 and was aborted (another shard
// refused it); rank 0's clock 3, sent right behind the push, must not reach
// the shard before the push is sent again: it would close round 2 without
// it, and the resend would be acknowledged but not counted.
TEST_F(MigrateTest, ClockThatOvertakesAHeldPushWaitsForIt) {
  for (int64_t clock = 0; clock < 2; ++clock) {
    Step(a, clock);
    Step(ref0, clock);
  }
  RequestHeader f = Migrate(MigrateOp::kFreeze, 1);
  f.migrate_at_clock = 2;
  ASSERT_TRUE(a.Call(f).status.ok());
  const auto& ids = a.shard->layout()->shard_chunks(0);
  auto push = [&](int rank) {
    std::vector<ByteView> frames;
    for (uint32_t id : ids)
      frames.push_back(Grad(rank, 2, id, a.ChunkElems(id)));
    return a.Call(ShardHarness::Push(rank, 2, ids, frames), frames);
  };
  EXPECT_EQ(push(0).status.code(), StatusCode::kUnavailable);
  ASSERT_TRUE(a.Call(Migrate(MigrateOp::kAbort, 1)).status.ok());
  ReplyHeader early = a.Call(ShardHarness::Clock(0, 3));
  EXPECT_EQ(early.status.code(), StatusCode::kUnavailable)
      << early.status.ToString();
  EXPECT_GT(early.retry_ms, 0u);
  // A clock that does not pass the held push still goes in.
  EXPECT_TRUE(a.Call(ShardHarness::Clock(0, 2)).status.ok());
  ASSERT_TRUE(push(1).status.ok());
  ASSERT_TRUE(a.Call(ShardHarness::Clock(1, 3)).status.ok());
  EXPECT_EQ(a.shard->bsp_round(), 2);  // round 2 waits for rank 0's push
  const uint64_t skipped = a.shard->counters().skipped_pushes;
  ASSERT_TRUE(push(0).status.ok());
  ASSERT_TRUE(a.Call(ShardHarness::Clock(0, 3)).status.ok());
  EXPECT_EQ(a.shard->counters().skipped_pushes, skipped);
  EXPECT_EQ(a.shard->bsp_round(), 3);
  Step(ref0, 2);
  for (uint32_t id : ids)
    EXPECT_EQ(*a.shard->weights(id), *ref0.shard->weights(id)) << id;

  // A new process of rank 0 (another incarnation) is not held by the push
  // its predecessor left behind.
  RequestHeader f2 = Migrate(MigrateOp::kFreeze, 2);
  f2.migrate_at_clock = 3;
  ASSERT_TRUE(a.Call(f2).status.ok());
  std::vector<ByteView> frames;
  for (uint32_t id : ids) frames.push_back(Grad(0, 3, id, a.ChunkElems(id)));
  EXPECT_EQ(a.Call(ShardHarness::Push(0, 3, ids, frames), frames).status.code(),
            StatusCode::kUnavailable);
  ASSERT_TRUE(a.Call(Migrate(MigrateOp::kAbort, 2)).status.ok());
  RequestHeader other = ShardHarness::Clock(0, 4);
  other.incarnation = 43;
  EXPECT_TRUE(a.Call(other).status.ok());
}

TEST_F(MigrateTest, IdleFleetFreezesAtItsClockAndIsDrainedAtOnce) {
  Step(a, 0);
  Step(a, 1);  // both workers at clock 2, round 2 not started
  auto describe = [&] {
    ReplyHeader r = a.Call(Migrate(MigrateOp::kDescribe, 0));
    EXPECT_TRUE(r.status.ok()) << r.status.ToString();
    return nlohmann::json::parse(r.text);
  };
  nlohmann::json d = describe();
  EXPECT_EQ(d["max_clock"], 2);
  EXPECT_EQ(d["max_pushed_round"], 1);
  RequestHeader f = Migrate(MigrateOp::kFreeze, 1);
  f.migrate_at_clock = 2;
  ASSERT_TRUE(a.Call(f).status.ok());
  d = describe();
  EXPECT_TRUE(d["frozen"].get<bool>());
  EXPECT_TRUE(d["drained"].get<bool>());
  // Round 2's pushes are held until the change ends.
  const auto& ids = a.shard->layout()->shard_chunks(0);
  std::vector<ByteView> frames;
  for (uint32_t id : ids) frames.push_back(Grad(0, 2, id, a.ChunkElems(id)));
  ReplyHeader held = a.Call(ShardHarness::Push(0, 2, ids, frames), frames);
  EXPECT_EQ(held.status.code(), StatusCode::kUnavailable);
  ASSERT_TRUE(a.Call(Migrate(MigrateOp::kAbort, 1)).status.ok());
  Step(a, 2);
  d = describe();
  EXPECT_EQ(d["max_pushed_round"], 2);
  // Once a worker pushed for round 3, a freeze at 3 comes too late.
  frames.clear();
  for (uint32_t id : ids) frames.push_back(Grad(0, 3, id, a.ChunkElems(id)));
  ASSERT_TRUE(
      a.Call(ShardHarness::Push(0, 3, ids, frames), frames).status.ok());
  f.migrate_at_clock = 3;
  EXPECT_EQ(a.Call(f).status.code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(a.shard->frozen());
}

TEST_F(MigrateTest, FreezeTooLateAndAbortKeepTheOldLayout) {
  Step(a, 0);
  Step(a, 1);
  RequestHeader f = Migrate(MigrateOp::kFreeze, 1);
  f.migrate_at_clock = 1;  // workers are at clock 2 already
  EXPECT_EQ(a.Call(f).status.code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(a.shard->frozen());
  Move(3);
  // Not drained (round 2 not summed): nothing exported.
  RequestHeader e = Migrate(MigrateOp::kExport, 1);
  e.migrate_chunks = {4};
  EXPECT_EQ(a.Call(e).status.code(), StatusCode::kFailedPrecondition);
  Step(a, 2);
  Step(b, 0);
  Step(b, 1);
  Step(b, 2);
  CopyChunk4();
  for (ShardHarness* h : {&a, &b, &c}) {
    EXPECT_TRUE(h->Call(Migrate(MigrateOp::kAbort, 1)).status.ok());
    EXPECT_FALSE(h->shard->frozen());
    EXPECT_EQ(h->shard->layout_epoch(), 0u);
  }
  EXPECT_NE(a.shard->weights(4), nullptr);
  // Nothing staged any more: c cannot adopt a layout that gives it chunk 4.
  Move(3);
  RequestHeader d = Migrate(MigrateOp::kAdopt, 1);
  d.migrate_doc = Doc();
  ReplyHeader r = c.Call(d);
  EXPECT_EQ(r.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(c.shard->layout_epoch(), 0u);
}

TEST_F(MigrateTest, HostileMigrateRequestsChangeNothing) {
  // Only tools may migrate.
  RequestHeader worker = Migrate(MigrateOp::kFreeze, 1);
  worker.rank = 0;
  EXPECT_EQ(a.Call(worker).status.code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(a.shard->frozen());
  Move(3);
  Step(a, 0);
  Step(a, 1);
  Step(a, 2);
  Step(b, 0);
  Step(b, 1);
  Step(b, 2);
  // An export of a chunk this shard does not hold, or of one twice.
  RequestHeader e = Migrate(MigrateOp::kExport, 1);
  e.migrate_chunks = {1};
  EXPECT_EQ(a.Call(e).status.code(), StatusCode::kNotFound);
  e.migrate_chunks = {4, 4};
  EXPECT_EQ(a.Call(e).status.code(), StatusCode::kInvalidArgument);
  // An import with a frame missing, or with a damaged chunk record.
  e.migrate_chunks = {4};
  auto out = a.Send(e);
  ASSERT_TRUE(out[0].header.status.ok());
  RequestHeader i = Migrate(MigrateOp::kImport, 1);
  i.migrate_chunks = {4};
  std::vector<ByteView> frames = out[0].frames;
  EXPECT_EQ(c.Call(i, {frames[0], frames[1]}).status.code(),
            StatusCode::kInvalidArgument);
  std::vector<ByteView> cut = frames;
  cut[2].size -= 4;
  EXPECT_EQ(c.Call(i, cut).status.code(), StatusCode::kInvalidArgument);
  i.migrate_chunks = {99};
  EXPECT_EQ(c.Call(i, frames).status.code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(c.shard->registered());
  // A document that does not fit the layout.
  RequestHeader d = Migrate(MigrateOp::kAdopt, 1);
  d.migrate_doc =
      "{\"epoch\": 1, \"servers\": [\"a\", \"b\"], \"owners\": [0, 1]}";
  EXPECT_EQ(a.Call(d).status.code(), StatusCode::kInvalidArgument);
  d.migrate_doc = "not json";
  EXPECT_EQ(a.Call(d).status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(a.shard->weights(4), nullptr);
  EXPECT_EQ(a.shard->layout_epoch(), 0u);
}

}  // namespace
}  // namespace asyncps::server
