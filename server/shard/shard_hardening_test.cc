// Regression tests of issue 13: well-formed requests with hostile values,
// exactly-once pushes, memory bounds, clocks, ranks and BSP rejoin. Each test
// names the issue item it pins.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "server/internal/push_dedup.h"
#include "server/shard/shard.h"
#include "server/store/store.h"
#include "server/testing/test_util.h"

namespace asyncps::server {
namespace {

using testing::Floats;
using testing::ShardHarness;
using testing::SmallLayout;
using testing::SmallModel;

using testing::Fill;
ShardOptions Opts(Consistency c, int workers = 2) {
  return testing::TestOptions(c, workers);
}

uint64_t Rejected(const ShardHarness& h, RejectReason r) {
  return h.shard->counters().rejected[static_cast<size_t>(r)];
}

void Register(ShardHarness& h) {
  ReplyHeader r =
      h.Call(ShardHarness::Register(0, SmallModel(), SmallLayout(2)));
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
}

// A push of 1.0 to chunk 4 (10 floats) with id `id` from rank 0.
RequestHeader PushId(uint64_t id, uint64_t done_below = 0, int64_t clock = 0) {
  auto g = Floats(Fill(10, 1.0f));
  RequestHeader req = ShardHarness::Push(0, clock, {4}, {g});
  req.id = id;
  req.done_below = done_below;
  return req;
}
std::vector<ByteView> PushData() { return {Floats(Fill(10, 1.0f))}; }

// --- Item 1: each push applied exactly once, whatever the order. ---------

TEST(ShardHardeningTest, PushesOvertakingEachOtherAreEachAppliedOnce) {
  ShardHarness h(Opts(Consistency::kAsp));
  Register(h);
  const float w0 = (*h.shard->weights(4))[0];
  // After a reconnect, push 11 (queued in the socket) arrives before the
  // resend of push 10: both are new.
  ASSERT_TRUE(h.Call(PushId(11), PushData()).status.ok());
  ASSERT_TRUE(h.Call(PushId(10), PushData()).status.ok());
  EXPECT_EQ(h.shard->shard_version(), 2u);
  EXPECT_FLOAT_EQ((*h.shard->weights(4))[0], w0 - 2 * 0.5f);
  // Resends of either are duplicates.
  ASSERT_TRUE(h.Call(PushId(10), PushData()).status.ok());
  ASSERT_TRUE(h.Call(PushId(11), PushData()).status.ok());
  EXPECT_EQ(h.shard->shard_version(), 2u);
  EXPECT_EQ(h.shard->counters().duplicate_pushes, 2u);
  // The client says it has finished with every push below 13: a late copy of
  // push 12 (answered or given up long ago) is never applied.
  ASSERT_TRUE(h.Call(PushId(13, 13), PushData()).status.ok());
  ASSERT_TRUE(h.Call(PushId(12), PushData()).status.ok());
  EXPECT_EQ(h.shard->shard_version(), 3u);
  EXPECT_FLOAT_EQ((*h.shard->weights(4))[0], w0 - 3 * 0.5f);
}

TEST(ShardHardeningTest, DedupTableSurvivesACheckpoint) {
  MemStore store;
  ShardOptions o = Opts(Consistency::kAsp);
  {
    ShardHarness a(o, &store);
    Register(a);
    ASSERT_TRUE(a.Call(PushId(10), PushData()).status.ok());
    ASSERT_TRUE(a.Call(PushId(12), PushData()).status.ok());  // 11 in flight
    ASSERT_TRUE(a.shard->Checkpoint().ok());
  }
  ShardHarness b(o, &store);
  ASSERT_EQ(b.shard->shard_version(), 2u);
  ASSERT_TRUE(b.Call(PushId(12), PushData()).status.ok());  // resend
  ASSERT_TRUE(b.Call(PushId(11), PushData()).status.ok());  // first arrival
  ASSERT_TRUE(b.Call(PushId(10), PushData()).status.ok());  // resend
  EXPECT_EQ(b.shard->shard_version(), 3u);
  EXPECT_EQ(b.shard->counters().duplicate_pushes, 2u);
}

TEST(PushDedupTest, FloorWindowIncarnationsAndEncoding) {
  using internal::PushDedup;
  PushDedup::Options o;
  o.num_workers = 2;
  o.max_applied = 4;
  o.incarnations_per_rank = 2;
  PushDedup d(o);
  EXPECT_EQ(d.Check(0, 7, 5), PushDedup::Verdict::kNew);
  d.Record(0, 7, 5);
  d.Record(0, 7, 3);
  EXPECT_EQ(d.Check(0, 7, 3), PushDedup::Verdict::kDuplicate);
  EXPECT_EQ(d.Check(0, 7, 4), PushDedup::Verdict::kNew);
  EXPECT_EQ(d.Check(1, 7, 3), PushDedup::Verdict::kNew);  // other rank
  d.RaiseFloor(0, 7, 5);
  EXPECT_EQ(d.Check(0, 7, 4), PushDedup::Verdict::kLate);
  EXPECT_EQ(d.Check(0, 7, 5), PushDedup::Verdict::kDuplicate);
  EXPECT_EQ(d.applied_ids(), 1u);
  // Without floors the window keeps the newest max_applied ids.
  for (uint64_t id = 6; id < 12; ++id) d.Record(0, 7, id);
  EXPECT_EQ(d.applied_ids(), 4u);
  EXPECT_EQ(d.Check(0, 7, 7), PushDedup::Verdict::kLate);
  EXPECT_EQ(d.Check(0, 7, 11), PushDedup::Verdict::kDuplicate);
  // A restarted process and a late copy of its predecessor keep their own
  // tables; a third one evicts the least recently used.
  d.Record(0, 8, 1);
  EXPECT_EQ(d.Check(0, 7, 11), PushDedup::Verdict::kDuplicate);
  EXPECT_EQ(d.Check(0, 8, 1), PushDedup::Verdict::kDuplicate);
  d.Record(0, 9, 1);
  EXPECT_EQ(d.Check(0, 7, 11), PushDedup::Verdict::kNew);
  EXPECT_EQ(d.Check(0, 8, 1), PushDedup::Verdict::kDuplicate);
  std::string bytes;
  d.Encode(&bytes);
  PushDedup e(o);
  internal::Reader r(bytes);
  ASSERT_TRUE(e.Decode(&r));
  EXPECT_EQ(r.remaining(), 0u);
  EXPECT_EQ(e.Check(0, 8, 1), PushDedup::Verdict::kDuplicate);
  EXPECT_EQ(e.Check(0, 9, 1), PushDedup::Verdict::kDuplicate);
  internal::Reader cut(std::string_view(bytes).substr(0, bytes.size() - 3));
  EXPECT_FALSE(e.Decode(&cut));
}

// --- Item 2: an acknowledged push is in the store. -----------------------

TEST(ShardHardeningTest, PushWhoseDurableWriteFailedIsAckedOnlyOnceStored) {
  MemStore store;
  ShardOptions o = Opts(Consistency::kAsp);
  o.durable = true;
  ShardHarness a(o, &store);
  Register(a);
  ASSERT_TRUE(a.Call(PushId(10), PushData()).status.ok());
  store.FailWrites(true);
  ReplyHeader r = a.Call(PushId(11), PushData());
  EXPECT_EQ(r.status.code(), StatusCode::kUnavailable);
  // The client retries: while nothing could be stored, no acknowledgement.
  r = a.Call(PushId(11), PushData());
  EXPECT_EQ(r.status.code(), StatusCode::kUnavailable) << r.status.ToString();
  EXPECT_TRUE(a.shard->degraded());
  std::vector<OutgoingReply> out;
  a.now += std::chrono::seconds(1);
  a.shard->Tick(a.now, &out);
  EXPECT_TRUE(a.shard->degraded());  // the checkpoint failed too
  // An acknowledgement now would be a lie: the store has one push.
  ShardHarness peek(o, &store);
  EXPECT_EQ(peek.shard->shard_version(), 1u);
  store.FailWrites(false);
  a.now += std::chrono::seconds(10);
  a.shard->Tick(a.now, &out);
  EXPECT_FALSE(a.shard->degraded());
  r = a.Call(PushId(11), PushData());
  EXPECT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(a.shard->shard_version(), 2u);  // applied once
  ShardHarness b(o, &store);
  EXPECT_EQ(b.shard->shard_version(), 2u);
  EXPECT_EQ(b.AllWeights(), a.AllWeights());
  // And the store knows it is applied: a resend after a restart is not.
  ASSERT_TRUE(b.Call(PushId(11), PushData()).status.ok());
  EXPECT_EQ(b.shard->shard_version(), 2u);
}

// --- Item 3: registration bounded by the memory budget. ------------------

TEST(ShardHardeningTest, RegistrationOverTheBudgetAllocatesNothing) {
  ShardOptions o = Opts(Consistency::kAsp, 1);
  o.num_shards = 1;
  o.memory_budget_bytes = uint64_t{64} << 20;
  ShardHarness h(o);
  const uint64_t used = h.shard->budget().used();
  // 2^36 one-element chunks: more chunks than chunk ids.
  TensorSpec huge{"huge", {int64_t{1} << 36}, InitKind::kZeros, 0, 1};
  LayoutOptions tiny;
  tiny.chunk_elems = 1;
  tiny.min_chunk_elems = 1;
  tiny.num_shards = 1;
  ReplyHeader r = h.Call(ShardHarness::Register(0, {huge}, tiny));
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status.message().find("68719476736 chunks"), std::string::npos)
      << r.status.message();
  // 2^31 of them: the layout tables alone would be ~100 GB.
  huge.shape = {int64_t{1} << 31};
  r = h.Call(ShardHarness::Register(0, {huge}, tiny));
  EXPECT_EQ(r.status.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status.message().find("2147483648 chunks"), std::string::npos)
      << r.status.message();
  EXPECT_NE(r.status.message().find("67108864"), std::string::npos)
      << r.status.message();  // the budget
  // 2^33 floats in default chunks: 32 GiB of weights.
  TensorSpec big{"big", {int64_t{1} << 33}, InitKind::kZeros, 0, 1};
  LayoutOptions dflt;
  dflt.num_shards = 1;
  r = h.Call(ShardHarness::Register(0, {big}, dflt));
  EXPECT_EQ(r.status.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status.message().find("8589934592 elements"), std::string::npos)
      << r.status.message();
  EXPECT_FALSE(h.shard->registered());
  EXPECT_EQ(h.shard->budget().used(), used);
  EXPECT_EQ(Rejected(h, RejectReason::kMemoryBudget), 2u);
  // A model that fits still registers.
  r = h.Call(ShardHarness::Register(0, SmallModel(), SmallLayout(1)));
  EXPECT_TRUE(r.status.ok()) << r.status.ToString();
}

// --- Item 4: pulls. -------------------------------------------------------

TEST(ShardHardeningTest, PullNamingAChunkTwiceIsRefused) {
  ShardHarness h(Opts(Consistency::kAsp));
  Register(h);
  std::vector<uint32_t> ids(200000, 4);
  RequestHeader pull = ShardHarness::Pull(0, 0, ids);
  pull.pull_codec = "fp16";
  ReplyHeader r = h.Call(pull);
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(r.chunks.empty());
  EXPECT_EQ(Rejected(h, RejectReason::kRepeatedChunk), 1u);
  EXPECT_TRUE(h.Call(ShardHarness::Pull(0, 0, {0, 2, 4})).status.ok());
}

TEST(ShardHardeningTest, RepliesNotYetSentAreCappedPerClientAndRank) {
  ShardOptions o = Opts(Consistency::kAsp);
  o.max_unsent_bytes_per_client = 100;  // one full pull is 3 chunks, 168 B
  ShardHarness h(o);
  Register(h);
  auto g = Floats(Fill(10, 1.0f));
  // A client that pulls and never reads: its replies stay queued (held
  // here as ZeroMQ would hold them).
  std::vector<std::vector<OutgoingReply>> queued;
  queued.push_back(h.Send(ShardHarness::Pull(0, 0), {}, "slow"));
  ASSERT_TRUE(queued.back()[0].header.status.ok());
  EXPECT_EQ(h.shard->unsent_reply_bytes(), 168u);
  ASSERT_TRUE(h.Call(ShardHarness::Push(1, 0, {4}, {g}), {g}).status.ok());
  queued.push_back(h.Send(ShardHarness::Pull(0, 0), {}, "slow"));
  EXPECT_EQ(queued.back()[0].header.status.code(),
            StatusCode::kResourceExhausted);
  // The same rank over a new connection is capped too.
  queued.push_back(h.Send(ShardHarness::Pull(0, 0), {}, "slow-again"));
  EXPECT_EQ(queued.back()[0].header.status.code(),
            StatusCode::kResourceExhausted);
  // Other clients are not.
  auto other = h.Send(ShardHarness::Pull(1, 0), {}, "fast");
  EXPECT_TRUE(other[0].header.status.ok());
  EXPECT_EQ(Rejected(h, RejectReason::kUnsentReplies), 2u);
  // Once sent (released), the slow client may pull again.
  queued.clear();
  other.clear();
  EXPECT_EQ(h.shard->unsent_reply_bytes(), 0u);
  EXPECT_TRUE(
      h.Send(ShardHarness::Pull(0, 0), {}, "slow")[0].header.status.ok());
  // Pulls of one version share its snapshot: queued, they pin nothing new
  // and are not refused.
  for (int i = 0; i < 5; ++i) {
    queued.push_back(h.Send(ShardHarness::Pull(1, 0), {}, "same"));
    EXPECT_TRUE(queued.back()[0].header.status.ok()) << i;
  }
}

TEST(ShardHardeningTest, SnapshotsPinnedByUnsentRepliesComeFromTheBudget) {
  ShardOptions o = Opts(Consistency::kAsp, 2);
  o.num_shards = 1;
  o.memory_budget_bytes = uint64_t{1} << 20;
  ShardHarness h(o);
  TensorSpec w{"w", {20000}, InitKind::kZeros, 0, 1};  // 80 KB
  LayoutOptions l;
  l.num_shards = 1;
  ASSERT_TRUE(h.Call(ShardHarness::Register(0, {w}, l)).status.ok());
  auto g = Floats(Fill(20000, 1.0f));
  // Many clients pull after every push and never read: each reply pins the
  // snapshot of its version.
  std::vector<std::vector<OutgoingReply>> queued;
  int refused = 0;
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(h.Call(ShardHarness::Push(0, 0, {0}, {g}), {g}).status.ok());
    auto out = h.Send(ShardHarness::Pull(0, 0), {}, "c" + std::to_string(i));
    refused += out[0].header.status.code() == StatusCode::kResourceExhausted;
    queued.push_back(std::move(out));
    EXPECT_LE(h.shard->budget().used(), h.shard->budget().capacity());
  }
  EXPECT_GT(refused, 50);
  EXPECT_EQ(Rejected(h, RejectReason::kMemoryBudget),
            static_cast<uint64_t>(refused));
  queued.clear();
  ASSERT_TRUE(h.Call(ShardHarness::Push(0, 0, {0}, {g}), {g}).status.ok());
  EXPECT_TRUE(h.Call(ShardHarness::Pull(0, 0)).status.ok());
}

// --- Item 5: clocks. ------------------------------------------------------

TEST(ShardHardeningTest, HostileClocksAreRefusedAndNeverHang) {
  ShardHarness h(Opts(Consistency::kBsp, 1));
  Register(h);
  ReplyHeader r = h.Call(ShardHarness::Clock(0, int64_t{1} << 62));
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  r = h.Call(ShardHarness::Clock(0, -1));
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(h.shard->bsp_round(), 0);
  ShardOptions s = Opts(Consistency::kSsp, 1);
  s.staleness = 3;
  ShardHarness ssp(s);
  Register(ssp);
  // Answered (not parked) although clock - staleness would overflow.
  r = ssp.Call(ShardHarness::Pull(0, std::numeric_limits<int64_t>::min()));
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ssp.shard->num_parked(), 0u);
  EXPECT_EQ(Rejected(h, RejectReason::kBadClock), 2u);
}

TEST(ShardHardeningTest, ClockJumpsAreBoundedPerRequest) {
  ShardOptions o = Opts(Consistency::kAsp, 1);
  o.max_clock_jump = 100;
  ShardHarness h(o);
  Register(h);
  EXPECT_TRUE(h.Call(ShardHarness::Clock(0, 100)).status.ok());
  EXPECT_EQ(h.Call(ShardHarness::Clock(0, 201)).status.code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(h.Call(ShardHarness::Pull(0, 201)).status.code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(h.Call(ShardHarness::Clock(0, 200)).status.ok());
  EXPECT_EQ(h.shard->clocks().clock(0), 200);
}

TEST(ShardHardeningTest, BspRoundMovesToTheMinimumInOneStep) {
  ShardOptions o = Opts(Consistency::kBsp, 1);
  o.max_clock_jump = int64_t{1} << 62;
  ShardHarness h(o);
  Register(h);
  auto g = Floats(Fill(10, 1.0f));
  ASSERT_TRUE(h.Call(ShardHarness::Push(0, 0, {4}, {g}), {g}).status.ok());
  // A round loop walking 2^40 empty rounds would never come back.
  ASSERT_TRUE(h.Call(ShardHarness::Clock(0, int64_t{1} << 40)).status.ok());
  EXPECT_EQ(h.shard->bsp_round(), int64_t{1} << 40);
  EXPECT_EQ(h.shard->shard_version(), 1u);  // the one round with a push
}

// --- Item 7: replicas and parked pulls. ----------------------------------

TEST(ShardHardeningTest, PullReplicasAreFreedAndCounted) {
  ShardOptions o = Opts(Consistency::kAsp);
  o.worker_timeout = std::chrono::milliseconds(1000);
  ShardHarness h(o);
  Register(h);
  ASSERT_TRUE(h.Call(ShardHarness::Pull(1, 0)).status.ok());  // snapshots
  const uint64_t base = h.shard->budget().used();
  RequestHeader pull = ShardHarness::Pull(0, 0);
  pull.pull_codec = "topk:ratio=0.5";
  pull.incarnation = 1;
  ASSERT_TRUE(h.Call(pull).status.ok());
  const uint64_t replica = h.shard->budget().used() - base;
  EXPECT_EQ(replica, 168u);  // a copy of the shard's 42 floats
  // A new incarnation of the worker replaces it, not adds another.
  pull.incarnation = 2;
  ASSERT_TRUE(h.Call(pull).status.ok());
  EXPECT_EQ(h.shard->budget().used() - base, replica);
  // A codec change frees it.
  pull.pull_codec = "fp16";
  ASSERT_TRUE(h.Call(pull).status.ok());
  EXPECT_EQ(h.shard->budget().used(), base);
  pull.pull_codec = "randomk:ratio=0.5";
  ASSERT_TRUE(h.Call(pull).status.ok());
  EXPECT_EQ(h.shard->budget().used() - base, replica);
  // So does eviction.
  h.now += std::chrono::milliseconds(500);
  ASSERT_TRUE(h.Call(ShardHarness::Clock(1, 0)).status.ok());
  h.now += std::chrono::milliseconds(800);
  std::vector<OutgoingReply> out;
  h.shard->Tick(h.now, &out);
  ASSERT_FALSE(h.shard->clocks().live(0));
  EXPECT_EQ(h.shard->budget().used(), base);
}

TEST(ShardHardeningTest, ParkedPullsAreCappedPerRankAndExpire) {
  ShardOptions o = Opts(Consistency::kSsp);
  o.max_inflight_per_client = 2;
  o.max_park_time = std::chrono::milliseconds(5000);
  o.worker_timeout = std::chrono::milliseconds(0);
  ShardHarness h(o);
  Register(h);
  ASSERT_TRUE(h.Call(ShardHarness::Clock(0, 5)).status.ok());
  // A reconnect gets a new routing id each time: the rank's cap holds.
  EXPECT_TRUE(h.Send(ShardHarness::Pull(0, 5), {}, "conn1").empty());
  EXPECT_TRUE(h.Send(ShardHarness::Pull(0, 5), {}, "conn2").empty());
  auto out = h.Send(ShardHarness::Pull(0, 5), {}, "conn3");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].header.status.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(h.shard->num_parked(), 2u);
  // Nobody waits forever: expired pulls are answered (retry).
  h.now += std::chrono::milliseconds(5001);
  std::vector<OutgoingReply> ticked;
  h.shard->Tick(h.now, &ticked);
  ASSERT_EQ(ticked.size(), 2u);
  EXPECT_EQ(ticked[0].header.status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(h.shard->num_parked(), 0u);
  EXPECT_EQ(Rejected(h, RejectReason::kParkExpired), 2u);
}

// --- Item 8: rank -1. -----------------------------------------------------

TEST(ShardHardeningTest, ObserversMayPullButNotRegisterPushOrClock) {
  ShardHarness h(Opts(Consistency::kSsp));
  ReplyHeader r =
      h.Call(ShardHarness::Register(-1, SmallModel(), SmallLayout(2)));
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(h.shard->registered());
  Register(h);
  auto g = Floats(Fill(10, 1.0f));
  EXPECT_EQ(h.Call(ShardHarness::Push(-1, 0, {4}, {g}), {g}).status.code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(h.Call(ShardHarness::Clock(-1, 3)).status.code(),
            StatusCode::kInvalidArgument);
  // An observer's pull is read-only: answered at once, no clock moved.
  r = h.Call(ShardHarness::Pull(-1, 100));
  EXPECT_TRUE(r.status.ok());
  EXPECT_EQ(h.shard->clocks().clock(0), 0);
  EXPECT_EQ(Rejected(h, RejectReason::kRank), 3u);
}

// --- Item 9: BSP rejoin, one push per rank and round. --------------------

TEST(ShardHardeningTest, BspWorkerBehindTheRoundIsAckedAndNotCounted) {
  ShardOptions o = Opts(Consistency::kBsp, 2);
  o.worker_timeout = std::chrono::milliseconds(1000);
  ShardHarness h(o);
  Register(h);
  auto g1 = Floats(Fill(10, 1.0f)), g2 = Floats(Fill(10, 2.0f));
  // Rank 1 goes silent and is evicted; rank 0 runs rounds 0..2 alone.
  h.now += std::chrono::milliseconds(1500);
  for (int c = 0; c < 3; ++c) {
    ASSERT_TRUE(h.Call(ShardHarness::Push(0, c, {4}, {g1}), {g1}).status.ok());
    ASSERT_TRUE(h.Call(ShardHarness::Clock(0, c + 1)).status.ok());
    std::vector<OutgoingReply> out;
    h.shard->Tick(h.now, &out);
  }
  ASSERT_EQ(h.shard->bsp_round(), 3);
  const auto before = h.AllWeights();
  // Rank 1 comes back with its push for round 0: acknowledged, not counted,
  // and its pull reply tells it where the fleet is.
  ReplyHeader r = h.Call(ShardHarness::Push(1, 0, {4}, {g2}), {g2});
  EXPECT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(h.shard->counters().skipped_pushes, 1u);
  r = h.Call(ShardHarness::Pull(1, 1));
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.min_clock, 3);
  // It skips to round 3 and takes part again.
  ASSERT_TRUE(h.Call(ShardHarness::Push(1, 3, {4}, {g2}), {g2}).status.ok());
  ASSERT_TRUE(h.Call(ShardHarness::Push(0, 3, {4}, {g1}), {g1}).status.ok());
  // A second push of rank 0 for round 3 (a restarted process) is not counted.
  ASSERT_TRUE(h.Call(ShardHarness::Push(0, 3, {4}, {g1}), {g1}).status.ok());
  EXPECT_EQ(h.shard->counters().skipped_pushes, 2u);
  ASSERT_TRUE(h.Call(ShardHarness::Clock(0, 4)).status.ok());
  ASSERT_TRUE(h.Call(ShardHarness::Clock(1, 4)).status.ok());
  EXPECT_EQ(h.shard->bsp_round(), 4);
  EXPECT_FLOAT_EQ((*h.shard->weights(4))[0],
                  before[4][0] - 0.5f * (1.0f + 2.0f) / 2.0f);
}

TEST(ShardHardeningTest, APrefetchedPullIsNotTheWorkersClock) {
  // With prefetching, the pull for round c+1 leaves before the push of round
  // c: it must not complete round c without that push.
  ShardHarness h(Opts(Consistency::kBsp, 2));
  Register(h);
  auto g1 = Floats(Fill(10, 1.0f)), g2 = Floats(Fill(10, 2.0f));
  ASSERT_TRUE(h.Call(ShardHarness::Push(1, 0, {4}, {g2}), {g2}).status.ok());
  ASSERT_TRUE(h.Call(ShardHarness::Clock(1, 1)).status.ok());
  EXPECT_TRUE(h.Send(ShardHarness::Pull(0, 1), {}, "w0").empty());  // parked
  EXPECT_EQ(h.shard->bsp_round(), 0);
  ASSERT_TRUE(h.Call(ShardHarness::Push(0, 0, {4}, {g1}), {g1}).status.ok());
  auto out = h.Send(ShardHarness::Clock(0, 1), {}, "w0");
  ASSERT_EQ(out.size(), 2u);  // the clock's reply and the released pull
  EXPECT_EQ(h.shard->counters().skipped_pushes, 0u);
  float first;
  std::memcpy(&first, out[1].frames.back().data, 4);
  EXPECT_FLOAT_EQ(first, 0.25f - 0.5f * 1.5f);  // both pushes averaged
}

// --- Small ones. ----------------------------------------------------------

TEST(ShardHardeningTest, EmptyPushChangesNothing) {
  ShardOptions o = Opts(Consistency::kAsp);
  o.lr_decay_updates = 10;
  ShardHarness h(o);
  Register(h);
  const auto before = h.AllWeights();
  RequestHeader empty = ShardHarness::Push(0, 0, {}, {});
  ASSERT_TRUE(h.Call(empty).status.ok());
  EXPECT_EQ(h.shard->shard_version(), 0u);
  EXPECT_EQ(h.AllWeights(), before);
  // The cosine schedule did not move: the first real push gets the full rate.
  auto g = Floats(Fill(10, 1.0f));
  ASSERT_TRUE(h.Call(ShardHarness::Push(0, 0, {4}, {g}), {g}).status.ok());
  EXPECT_FLOAT_EQ((*h.shard->weights(4))[0], 0.25f - 0.5f);
}

}  // namespace
}  // namespace asyncps::server
