#include "server/shard/shard.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

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

TEST(ShardTest, RegisterIsIdempotentAndMismatchNamesTensor) {
  ShardHarness h(Opts(Consistency::kAsp));
  ReplyHeader r =
      h.Call(ShardHarness::Register(0, SmallModel(), SmallLayout(2)));
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_TRUE(r.created);
  EXPECT_EQ(h.shard->layout()->shard_chunks(0),
            (std::vector<uint32_t>{0, 2, 4}));
  // Initial weights come from the layout's initialiser.
  EXPECT_EQ(*h.shard->weights(4), Fill(10, 0.25f));

  // Change the state, then re-register: same specs keep the weights.
  uint32_t c = h.FirstChunk();
  ASSERT_TRUE(h.Call(ShardHarness::Push(1, 0, {c}, {Floats(Fill(16, 1.0f))}),
                     {Floats(Fill(16, 1.0f))})
                  .status.ok());
  auto before = h.AllWeights();
  r = h.Call(ShardHarness::Register(1, SmallModel(), SmallLayout(2)));
  EXPECT_TRUE(r.status.ok());
  EXPECT_FALSE(r.created);
  EXPECT_EQ(h.AllWeights(), before);

  auto other = SmallModel();
  other[1].shape = {11};
  r = h.Call(ShardHarness::Register(0, other, SmallLayout(2)));
  EXPECT_EQ(r.status.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(r.status.message().find("'b'"), std::string::npos)
      << r.status.message();
  other = SmallModel();
  other[0].seed = 8;
  r = h.Call(ShardHarness::Register(0, other, SmallLayout(2)));
  EXPECT_EQ(r.status.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(r.status.message().find("'w'"), std::string::npos);
  r = h.Call(ShardHarness::Register(0, SmallModel(), SmallLayout(3)));
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(h.AllWeights(), before);
  EXPECT_EQ(
      h.shard->counters()
          .rejected[static_cast<size_t>(RejectReason::kRegistrationMismatch)],
      3u);
}

class BadInputTest : public ::testing::Test {
 protected:
  BadInputTest() : h(Opts(Consistency::kAsp)) {
    EXPECT_TRUE(h.Call(ShardHarness::Register(0, SmallModel(), SmallLayout(2)))
                    .status.ok());
    before = h.AllWeights();
  }

  // Sends `req`; expects an error with `code`, the state untouched and one
  // more rejection counted under `reason`.
  void ExpectRejected(RequestHeader req, std::vector<ByteView> data,
                      StatusCode code, RejectReason reason) {
    const uint64_t n =
        h.shard->counters().rejected[static_cast<size_t>(reason)];
    const uint64_t version = h.shard->shard_version();
    ReplyHeader r = h.Call(std::move(req), std::move(data));
    EXPECT_EQ(r.status.code(), code) << r.status.ToString();
    EXPECT_TRUE(r.chunks.empty());
    EXPECT_EQ(h.shard->counters().rejected[static_cast<size_t>(reason)], n + 1)
        << RejectReasonName(reason);
    EXPECT_EQ(h.shard->shard_version(), version);
    EXPECT_EQ(h.AllWeights(), before);  // bitwise
  }

  ShardHarness h;
  std::vector<std::vector<float>> before;
};

TEST_F(BadInputTest, WrongProtocolVersion) {
  auto req = ShardHarness::Pull(0, 0);
  req.version = 2;
  ExpectRejected(req, {}, StatusCode::kFailedPrecondition,
                 RejectReason::kVersion);
}

TEST_F(BadInputTest, RankOutOfRange) {
  auto g = Floats(Fill(16, 1.0f));
  ExpectRejected(ShardHarness::Push(2, 0, {0}, {g}), {g},
                 StatusCode::kInvalidArgument, RejectReason::kRank);
  ExpectRejected(ShardHarness::Push(-1, 0, {0}, {g}), {g},
                 StatusCode::kInvalidArgument, RejectReason::kRank);
  ExpectRejected(ShardHarness::Pull(-7, 0), {}, StatusCode::kInvalidArgument,
                 RejectReason::kRank);
  // -1 is fine for tools, and for observers' pulls (a dedicated evaluator).
  EXPECT_TRUE(h.Call(ShardHarness::Pull(-1, 0)).status.ok());
  RequestHeader stats;
  stats.kind = RequestKind::kStats;
  stats.rank = -1;
  EXPECT_TRUE(h.Call(stats).status.ok());
}

TEST_F(BadInputTest, UnknownAndForeignChunks) {
  auto g = Floats(Fill(16, 1.0f));
  ExpectRejected(ShardHarness::Push(0, 0, {99}, {g}), {g},
                 StatusCode::kNotFound, RejectReason::kUnknownChunk);
  ExpectRejected(ShardHarness::Push(0, 0, {1}, {g}), {g},
                 StatusCode::kInvalidArgument, RejectReason::kWrongShard);
  ExpectRejected(ShardHarness::Pull(0, 0, {99}), {}, StatusCode::kNotFound,
                 RejectReason::kUnknownChunk);
  ExpectRejected(ShardHarness::Pull(0, 0, {3}), {},
                 StatusCode::kInvalidArgument, RejectReason::kWrongShard);
}

TEST_F(BadInputTest, PayloadSizeMismatches) {
  auto g = Floats(Fill(16, 1.0f));
  auto req = ShardHarness::Push(0, 0, {0}, {g});
  req.chunks[0].byte_size = 60;  // header disagrees with the frame
  ExpectRejected(req, {g}, StatusCode::kInvalidArgument,
                 RejectReason::kSizeMismatch);
  auto small = Floats(Fill(15, 1.0f));
  req = ShardHarness::Push(0, 0, {0}, {small});  // 15 elems for a 16-elem chunk
  ExpectRejected(req, {small}, StatusCode::kInvalidArgument,
                 RejectReason::kSizeMismatch);
  req = ShardHarness::Push(0, 0, {0}, {small});
  req.chunks[0].num_elems = 16;  // count right, bytes wrong for raw fp32
  ExpectRejected(req, {small}, StatusCode::kInvalidArgument,
                 RejectReason::kSizeMismatch);
  req = ShardHarness::Push(0, 0, {0}, {g});
  req.chunks[0].frame = 2;  // frame out of range
  ExpectRejected(req, {g}, StatusCode::kInvalidArgument,
                 RejectReason::kSizeMismatch);
  req = ShardHarness::Push(0, 0, {0}, {g});
  ExpectRejected(req, {g, g}, StatusCode::kInvalidArgument,
                 RejectReason::kSizeMismatch);
  req = ShardHarness::Push(0, 0, {0, 2}, {g, g});
  req.chunks[1].frame = 1;  // one frame used twice
  ExpectRejected(req, {g, g}, StatusCode::kInvalidArgument,
                 RejectReason::kSizeMismatch);
  req = ShardHarness::Push(0, 0, {0, 0}, {g, g});  // one chunk twice
  ExpectRejected(req, {g, g}, StatusCode::kInvalidArgument,
                 RejectReason::kOther);
  // Data frames on a pull.
  ExpectRejected(ShardHarness::Pull(0, 0), {g}, StatusCode::kInvalidArgument,
                 RejectReason::kSizeMismatch);
}

TEST_F(BadInputTest, NonFiniteGradientRejectedWholePush) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    auto good = Floats(Fill(16, 1.0f));
    auto v = Fill(16, 1.0f);
    v[13] = bad;
    auto nan = Floats(v);
    // The first chunk is fine: it must not be applied either.
    ExpectRejected(ShardHarness::Push(0, 0, {0, 2}, {good, nan}), {good, nan},
                   StatusCode::kInvalidArgument, RejectReason::kNonFinite);
  }
}

TEST_F(BadInputTest, UnknownCodecAndUnregistered) {
  auto g = Floats(Fill(16, 1.0f));
  auto req = ShardHarness::Push(0, 0, {0}, {g});
  req.chunks[0].codec = 200;
  const uint64_t n =
      h.shard->counters()
          .rejected[static_cast<size_t>(RejectReason::kBadCodec)];
  ReplyHeader r = h.Call(req, {g});
  EXPECT_FALSE(r.status.ok());
  EXPECT_EQ(h.shard->counters()
                .rejected[static_cast<size_t>(RejectReason::kBadCodec)],
            n + 1);
  EXPECT_EQ(h.AllWeights(), before);

  ShardHarness fresh(Opts(Consistency::kAsp));
  r = fresh.Call(ShardHarness::Push(0, 0, {0}, {g}), {g});
  EXPECT_EQ(r.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(fresh.Call(ShardHarness::Pull(0, 0)).status.code(),
            StatusCode::kFailedPrecondition);
}

TEST(ShardTest, AspPushPullAndStaleness) {
  ShardHarness h(Opts(Consistency::kAsp));
  ASSERT_TRUE(h.Call(ShardHarness::Register(0, SmallModel(), SmallLayout(2)))
                  .status.ok());
  const std::vector<float> w0 = *h.shard->weights(4);
  ReplyHeader p = h.Call(ShardHarness::Pull(0, 0, {4}));
  ASSERT_TRUE(p.status.ok());
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].byte_size, 40u);
  auto g = Floats(Fill(10, 0.5f));
  ReplyHeader r = h.Call(ShardHarness::Push(0, 0, {4}, {g}), {g});
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.staleness, 0);
  r = h.Call(ShardHarness::Push(0, 0, {4}, {g}),
             {g});  // worker 0 has not re-read
  EXPECT_EQ(r.staleness, 1);
  EXPECT_EQ(h.shard->shard_version(), 2u);
  EXPECT_EQ(h.shard->chunk_version(4), 2u);
  for (float v : *h.shard->weights(4))
    EXPECT_FLOAT_EQ(v, 0.25f - 2 * 0.5f * 0.5f);

  // A pull reply is a snapshot: the next push does not change its bytes.
  auto out = h.Send(ShardHarness::Pull(0, 1, {4}));
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0].frames.size(), 1u);
  std::vector<float> got(10);
  std::memcpy(got.data(), out[0].frames[0].data, 40);
  ASSERT_TRUE(h.Call(ShardHarness::Push(0, 1, {4}, {g}), {g}).status.ok());
  std::vector<float> again(10);
  std::memcpy(again.data(), out[0].frames[0].data, 40);
  EXPECT_EQ(got, again);
  EXPECT_NE(*h.shard->weights(4), got);
  EXPECT_EQ(h.shard->staleness().count(), 3u);
  EXPECT_NE(h.shard->StatsJson().find("\"pushes\":3"), std::string::npos)
      << h.shard->StatsJson();
  (void)w0;
}

TEST(ShardTest, ResentPushIsAppliedOnce) {
  ShardHarness h(Opts(Consistency::kAsp));
  ASSERT_TRUE(h.Call(ShardHarness::Register(0, SmallModel(), SmallLayout(2)))
                  .status.ok());
  auto g = Floats(Fill(10, 1.0f));
  auto req = ShardHarness::Push(1, 0, {4}, {g});
  req.id = 7;
  ASSERT_TRUE(h.Call(req, {g}).status.ok());
  auto after = h.AllWeights();
  ASSERT_TRUE(h.Call(req, {g}).status.ok());  // resent
  EXPECT_EQ(h.AllWeights(), after);
  EXPECT_EQ(h.shard->counters().duplicate_pushes, 1u);
  req.incarnation = 43;  // a restarted worker reuses ids
  ASSERT_TRUE(h.Call(req, {g}).status.ok());
  EXPECT_NE(h.AllWeights(), after);
}

TEST(ShardTest, SspParksPullsUntilBound) {
  ShardOptions o = Opts(Consistency::kSsp, 2);
  o.staleness = 1;
  o.worker_timeout = std::chrono::milliseconds(1000);
  ShardHarness h(o);
  ASSERT_TRUE(h.Call(ShardHarness::Register(0, SmallModel(), SmallLayout(2)))
                  .status.ok());
  EXPECT_TRUE(h.Call(ShardHarness::Pull(0, 1)).status.ok());  // 0 >= 1 - 1
  ASSERT_TRUE(h.Call(ShardHarness::Clock(0, 3)).status.ok());
  auto out = h.Send(ShardHarness::Pull(0, 3), {}, "w0");  // needs min >= 2
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(h.shard->num_parked(), 1u);
  out = h.Send(ShardHarness::Clock(1, 1), {}, "w1");
  ASSERT_EQ(out.size(), 1u);  // only the clock's own reply
  EXPECT_EQ(out[0].peer, "w1");
  out = h.Send(ShardHarness::Clock(1, 2), {}, "w1");
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].peer, "w0");
  EXPECT_EQ(out[1].header.kind, RequestKind::kPull);
  EXPECT_TRUE(out[1].header.status.ok());
  EXPECT_GE(out[1].header.min_clock, 3 - 1);
  EXPECT_EQ(out[1].frames.size(), 3u);
  EXPECT_EQ(h.shard->num_parked(), 0u);

  // A dead worker is evicted and releases the parked pull.
  ASSERT_TRUE(h.Call(ShardHarness::Clock(0, 6)).status.ok());
  out = h.Send(ShardHarness::Pull(0, 6), {}, "w0");
  EXPECT_TRUE(out.empty());
  h.now += std::chrono::milliseconds(500);
  std::vector<OutgoingReply> ticked;
  h.shard->Tick(h.now, &ticked);
  EXPECT_TRUE(ticked.empty());
  ASSERT_TRUE(h.Call(ShardHarness::Clock(0, 6)).status.ok());  // worker 0 alive
  h.now += std::chrono::milliseconds(800);  // worker 1 silent 1.3 s
  h.shard->Tick(h.now, &ticked);
  ASSERT_EQ(ticked.size(), 1u);
  EXPECT_TRUE(ticked[0].header.status.ok());
  EXPECT_FALSE(h.shard->clocks().live(1));
  // It rejoins at the current minimum, not at its old clock.
  ASSERT_TRUE(h.Call(ShardHarness::Clock(1, 3)).status.ok());
  EXPECT_TRUE(h.shard->clocks().live(1));
  EXPECT_EQ(h.shard->clocks().clock(1), 6);
}

TEST(ShardTest, AspNeverParksAndParkLimit) {
  ShardHarness h(Opts(Consistency::kAsp));
  ASSERT_TRUE(h.Call(ShardHarness::Register(0, SmallModel(), SmallLayout(2)))
                  .status.ok());
  EXPECT_TRUE(h.Call(ShardHarness::Pull(0, 100)).status.ok());

  ShardOptions o = Opts(Consistency::kSsp);
  o.max_parked_pulls = 1;
  ShardHarness s(o);
  ASSERT_TRUE(s.Call(ShardHarness::Register(0, SmallModel(), SmallLayout(2)))
                  .status.ok());
  EXPECT_TRUE(s.Send(ShardHarness::Pull(0, 5)).empty());
  EXPECT_EQ(s.Call(ShardHarness::Pull(0, 5)).status.code(),
            StatusCode::kResourceExhausted);
  std::vector<OutgoingReply> out;
  s.shard->FailParked(Status::Cancelled("bye"), &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].header.status.code(), StatusCode::kCancelled);
}

TEST(ShardTest, PerClientInflightLimit) {
  ShardOptions o = Opts(Consistency::kSsp);
  o.max_inflight_per_client = 2;
  ShardHarness s(o);
  ASSERT_TRUE(s.Call(ShardHarness::Register(0, SmallModel(), SmallLayout(2)))
                  .status.ok());
  auto pull = [](uint64_t id) {
    RequestHeader p = ShardHarness::Pull(0, 5);
    p.id = id;
    return p;
  };
  EXPECT_TRUE(s.Send(pull(100), {}, "a").empty());
  EXPECT_TRUE(s.Send(pull(101), {}, "a").empty());
  auto out = s.Send(pull(102), {}, "a");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].header.status.code(), StatusCode::kResourceExhausted);
  // Another peer of another rank still gets its own budget; the rejection
  // is counted.
  RequestHeader other = pull(103);
  other.rank = 1;
  EXPECT_TRUE(s.Send(other, {}, "b").empty());
  EXPECT_EQ(s.shard->num_parked(), 3u);
  EXPECT_EQ(s.shard->counters()
                .rejected[static_cast<size_t>(RejectReason::kTooManyInflight)],
            1u);
  EXPECT_NE(s.shard->StatsJson().find("\"too_many_inflight\":1"),
            std::string::npos);
}

TEST(ShardTest, BspAveragesOnceAllWorkersClocked) {
  ShardHarness h(Opts(Consistency::kBsp, 2));
  ASSERT_TRUE(h.Call(ShardHarness::Register(0, SmallModel(), SmallLayout(2)))
                  .status.ok());
  const std::vector<float> w0 = *h.shard->weights(4);
  auto g1 = Floats(Fill(10, 1.0f)), g2 = Floats(Fill(10, 2.0f));
  ASSERT_TRUE(h.Call(ShardHarness::Push(0, 0, {4}, {g1}), {g1}).status.ok());
  ASSERT_TRUE(h.Call(ShardHarness::Push(1, 0, {4}, {g2}), {g2}).status.ok());
  EXPECT_EQ(*h.shard->weights(4), w0);  // nothing applied before the round ends
  // A second push of rank 0 for this round is acknowledged, not counted.
  auto g9 = Floats(Fill(10, 9.0f));
  EXPECT_TRUE(h.Call(ShardHarness::Push(0, 0, {4}, {g9}), {g9}).status.ok());
  EXPECT_EQ(h.shard->counters().skipped_pushes, 1u);
  // Its push for the next round while this one is open here (a backup
  // promoted before the round's last pushes reached it): held, nothing
  // applied or counted, sent again after retry_ms.
  auto g3 = Floats(Fill(10, 3.0f));
  const RequestHeader next = ShardHarness::Push(0, 1, {4}, {g3});
  ReplyHeader held = h.Call(next, {g3});
  EXPECT_EQ(held.status.code(), StatusCode::kUnavailable)
      << held.status.ToString();
  EXPECT_GT(held.retry_ms, 0u);
  EXPECT_EQ(h.shard->counters().skipped_pushes, 1u);
  EXPECT_EQ(*h.shard->weights(4), w0);
  ASSERT_TRUE(h.Call(ShardHarness::Clock(0, 1)).status.ok());
  auto out = h.Send(ShardHarness::Pull(0, 1), {}, "w0");  // waits for worker 1
  EXPECT_TRUE(out.empty());
  out = h.Send(ShardHarness::Clock(1, 1), {}, "w1");
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].peer, "w0");
  EXPECT_EQ(h.shard->bsp_round(), 1);
  EXPECT_EQ(h.shard->shard_version(), 1u);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ((*h.shard->weights(4))[i], w0[i] - 0.5f * ((1.0f + 2.0f) / 2.0f));
  }
  // The released pull carries the averaged weights.
  float first;
  std::memcpy(&first, out[1].frames.back().data, 4);
  EXPECT_EQ(first, (*h.shard->weights(4))[0]);
  // The held push, sent again, counts for round 1 with rank 1's.
  ASSERT_TRUE(h.Call(next, {g3}).status.ok());
  ASSERT_TRUE(h.Call(ShardHarness::Push(1, 1, {4}, {g2}), {g2}).status.ok());
  ASSERT_TRUE(h.Call(ShardHarness::Clock(0, 2)).status.ok());
  ASSERT_TRUE(h.Call(ShardHarness::Clock(1, 2)).status.ok());
  EXPECT_EQ((*h.shard->weights(4))[0], w0[0] - 0.5f * 1.5f - 0.5f * 2.5f);
  // Only one contributor next round: divided by one.
  ASSERT_TRUE(h.Call(ShardHarness::Push(1, 2, {4}, {g2}), {g2}).status.ok());
  ASSERT_TRUE(h.Call(ShardHarness::Clock(0, 3)).status.ok());
  ASSERT_TRUE(h.Call(ShardHarness::Clock(1, 3)).status.ok());
  EXPECT_EQ((*h.shard->weights(4))[0],
            w0[0] - 0.5f * 1.5f - 0.5f * 2.5f - 0.5f * 2.0f);
}

TEST(ShardTest, TransportOnlyNeverApplies) {
  ShardOptions o = Opts(Consistency::kAsp);
  o.transport_only = true;
  ShardHarness h(o);
  ASSERT_TRUE(h.Call(ShardHarness::Register(0, SmallModel(), SmallLayout(2)))
                  .status.ok());
  auto before = h.AllWeights();
  auto g = Floats(Fill(10, 1.0f));
  ASSERT_TRUE(h.Call(ShardHarness::Push(0, 0, {4}, {g}), {g}).status.ok());
  EXPECT_EQ(h.AllWeights(), before);
  EXPECT_EQ(h.shard->counters().pushes, 1u);
  EXPECT_EQ(h.shard->counters().bytes_in, 40u);
}

TEST(ShardTest, StalenessAwareLearningRate) {
  ShardOptions o = Opts(Consistency::kAsp);
  o.staleness_lr = StalenessLr::kOnePlus;
  o.optimizer.lr = 1.0f;
  ShardHarness h(o);
  ASSERT_TRUE(h.Call(ShardHarness::Register(0, SmallModel(), SmallLayout(2)))
                  .status.ok());
  auto g = Floats(Fill(10, 1.0f));
  ASSERT_TRUE(h.Call(ShardHarness::Push(0, 0, {4}, {g}), {g})
                  .status.ok());  // staleness 0
  ASSERT_TRUE(h.Call(ShardHarness::Push(0, 0, {4}, {g}), {g})
                  .status.ok());  // staleness 1
  EXPECT_FLOAT_EQ((*h.shard->weights(4))[0], 0.25f - 1.0f - 0.5f);
}

// A backup sets its primary's worker states: bad ones are refused whole
// (nothing set), good ones evict and take back as given, and a follower's
// own timer evicts nobody.
TEST(ShardTest, FollowerSetsItsPrimarysWorkerStatesAndRefusesBadOnes) {
  ShardOptions o = Opts(Consistency::kSsp, 2);
  o.worker_timeout = std::chrono::milliseconds(1000);
  ShardHarness h(o);
  h.shard->set_follower(true);
  std::vector<OutgoingReply> out;
  for (const std::vector<WorkerLiveness>& bad :
       {std::vector<WorkerLiveness>{{0, false, 3}, {2, false, 1}},
        std::vector<WorkerLiveness>{{1, false, 3}, {1, true, 4}},
        std::vector<WorkerLiveness>{{0, false, -1}}}) {
    EXPECT_EQ(h.shard->SetWorkerStates(bad, h.now, &out).code(),
              StatusCode::kInvalidArgument);
    EXPECT_TRUE(h.shard->clocks().live(0) && h.shard->clocks().live(1));
    EXPECT_EQ(h.shard->clocks().clock(0), 0);
  }
  ASSERT_TRUE(
      h.shard->SetWorkerStates({{1, false, 2}, {0, true, 5}}, h.now, &out)
          .ok());
  EXPECT_FALSE(h.shard->clocks().live(1));
  EXPECT_EQ(h.shard->clocks().clock(0), 5);
  EXPECT_EQ(h.shard->clocks().MinLiveClock(), 5);
  h.now += std::chrono::seconds(10);
  h.shard->Tick(h.now, &out);
  EXPECT_TRUE(h.shard->clocks().live(0));
}

}  // namespace
}  // namespace asyncps::server

namespace asyncps::server {
namespace {

TEST(ShardTest, ResentParkedPullIsAnsweredOnce) {
  ShardHarness h(Opts(Consistency::kSsp, 2));
  ASSERT_TRUE(h.Call(ShardHarness::Register(0, SmallModel(), SmallLayout(2)))
                  .status.ok());
  ASSERT_TRUE(h.Call(ShardHarness::Clock(0, 1)).status.ok());
  auto pull = ShardHarness::Pull(0, 1);
  pull.id = 500;
  EXPECT_TRUE(h.Send(pull, {}, "w0").empty());
  EXPECT_TRUE(h.Send(pull, {}, "w0").empty());  // the client's resend
  EXPECT_EQ(h.shard->num_parked(), 1u);
  auto out = h.Send(ShardHarness::Clock(1, 1), {}, "w1");
  int pull_replies = 0;
  for (const auto& r : out) pull_replies += r.header.kind == RequestKind::kPull;
  EXPECT_EQ(pull_replies, 1);
  EXPECT_EQ(h.shard->num_parked(), 0u);
}

}  // namespace
}  // namespace asyncps::server

namespace asyncps::server {
namespace {

TEST(ShardTest, CosineLearningRateScheduleOverShardUpdates) {
  ShardOptions o = Opts(Consistency::kAsp);
  o.lr_decay_updates = 2;  // full lr, then half (cos(pi/2)), then zero
  ShardHarness h(o);
  ASSERT_TRUE(h.Call(ShardHarness::Register(0, SmallModel(), SmallLayout(2)))
                  .status.ok());
  auto g = Floats(Fill(10, 1.0f));
  const float w0 = (*h.shard->weights(4))[0];
  const float steps[] = {0.5f, 0.25f, 0.0f, 0.0f};  // lr 0.5 x schedule
  float expected = w0;
  for (float step : steps) {
    ASSERT_TRUE(h.Call(ShardHarness::Push(0, 0, {4}, {g}), {g}).status.ok());
    expected -= step;
    EXPECT_FLOAT_EQ((*h.shard->weights(4))[0], expected);
  }
}

}  // namespace
}  // namespace asyncps::server

namespace asyncps::server {
namespace {

TEST(ShardTest, AWorkerWaitingOnAParkedPullIsNotEvicted) {
  ShardOptions o = Opts(Consistency::kSsp, 2);
  o.worker_timeout = std::chrono::milliseconds(1000);
  ShardHarness h(o);
  ASSERT_TRUE(h.Call(ShardHarness::Register(0, SmallModel(), SmallLayout(2)))
                  .status.ok());
  ASSERT_TRUE(h.Call(ShardHarness::Clock(1, 0)).status.ok());
  ASSERT_TRUE(h.Call(ShardHarness::Clock(0, 1)).status.ok());
  EXPECT_TRUE(h.Send(ShardHarness::Pull(0, 1), {}, "w0").empty());  // parked
  std::vector<OutgoingReply> ticked;
  for (int i = 0; i < 4; ++i) {  // 2 s: worker 1 keeps talking, 0 waits
    h.now += std::chrono::milliseconds(500);
    ASSERT_TRUE(h.Call(ShardHarness::Clock(1, 0)).status.ok());
    h.shard->Tick(h.now, &ticked);
  }
  EXPECT_TRUE(ticked.empty());
  EXPECT_TRUE(h.shard->clocks().live(0));
  auto out = h.Send(ShardHarness::Clock(1, 1), {}, "w1");
  ASSERT_EQ(out.size(), 2u);  // the clock's reply and the released pull
  EXPECT_EQ(out[1].peer, "w0");
}

}  // namespace
}  // namespace asyncps::server
