// The shard's staleness-aware rules end to end through Handle(): learning-
// rate warm-up following the shard version, the staleness-dependent rate of
// Zhang et al., and DC-ASGD's delay compensation against the weights each
// worker read, each checked against a reference computed here.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "server/shard/shard.h"
#include "server/store/store.h"
#include "server/testing/test_util.h"

namespace asyncps::server {
namespace {

using testing::Floats;
using testing::ShardHarness;
using testing::SmallLayout;
using testing::SmallModel;

constexpr uint64_t kIncarnation = 42;  // what ShardHarness::Push sends

ShardOptions Opts(Consistency c) {
  ShardOptions o = testing::TestOptions(c, 2);  // SGD, lr 0.5
  return o;
}

RequestHeader PullAt(int rank, int64_t clock) {
  RequestHeader r = ShardHarness::Pull(rank, clock);
  r.incarnation = kIncarnation;
  return r;
}

std::vector<float> Ramp(size_t n, float a, float b) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = a + b * static_cast<float>(i);
  return v;
}

// Pushes g to chunk 4 ("b", 10 floats) as `rank` at `clock`.
void Push(ShardHarness& h, int rank, int64_t clock,
          const std::vector<float>& g) {
  auto f = Floats(g);
  ReplyHeader r = h.Call(ShardHarness::Push(rank, clock, {4}, {f}), {f});
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
}

void Register(ShardHarness& h) {
  ASSERT_TRUE(h.Call(ShardHarness::Register(0, SmallModel(), SmallLayout(2)))
                  .status.ok());
}

std::vector<double> AsDouble(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

void ExpectNear(const std::vector<float>& got,
                const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-5 * (1 + std::fabs(want[i]))) << i;
}

TEST(ShardStalenessTest, WarmupFollowsTheShardVersionUnderAsp) {
  ShardOptions o = Opts(Consistency::kAsp);
  o.lr_warmup_updates = 3;
  o.lr_warmup_start = 0.25f;
  ShardHarness h(o);
  Register(h);
  std::vector<double> w = AsDouble(*h.shard->weights(4));
  const std::vector<float> g = Ramp(10, 1.0f, 0.5f);
  // Updates 0..2 at 0.25, 0.5, 0.75 of lr (whichever worker pushes), then lr.
  const double scale[] = {0.25, 0.5, 0.75, 1.0, 1.0};
  for (int k = 0; k < 5; ++k) {
    Push(h, k % 2, k / 2, g);
    for (size_t i = 0; i < w.size(); ++i) w[i] -= 0.5 * scale[k] * g[i];
    ExpectNear(*h.shard->weights(4), w);
  }
}

TEST(ShardStalenessTest, WarmupCountsBspRounds) {
  ShardOptions o = Opts(Consistency::kBsp);
  o.lr_warmup_updates = 2;
  o.lr_warmup_start = 0.5f;
  ShardHarness h(o);
  Register(h);
  std::vector<double> w = AsDouble(*h.shard->weights(4));
  const std::vector<float> g0 = Ramp(10, 1.0f, 0.5f),
                           g1 = Ramp(10, -2.0f, 0.25f);
  const double scale[] = {0.5, 0.75, 1.0};
  for (int round = 0; round < 3; ++round) {
    Push(h, 0, round, g0);
    Push(h, 1, round, g1);
    ASSERT_TRUE(h.Call(ShardHarness::Clock(0, round + 1)).status.ok());
    ASSERT_TRUE(h.Call(ShardHarness::Clock(1, round + 1)).status.ok());
    for (size_t i = 0; i < w.size(); ++i)
      w[i] -= 0.5 * scale[round] * (double{g0[i]} + g1[i]) / 2;
    ExpectNear(*h.shard->weights(4), w);
  }
  EXPECT_EQ(h.shard->shard_version(), 3u);
}

TEST(ShardStalenessTest, InverseStalenessLearningRate) {
  ShardOptions o = Opts(Consistency::kAsp);
  o.staleness_lr = StalenessLr::kInverse;
  ShardHarness h(o);
  Register(h);
  std::vector<double> w = AsDouble(*h.shard->weights(4));
  const std::vector<float> g = Ramp(10, 1.0f, -0.1f);
  ASSERT_TRUE(h.Call(PullAt(0, 0)).status.ok());  // rank 0 reads version 0
  ASSERT_TRUE(h.Call(PullAt(1, 0)).status.ok());
  Push(h, 1, 0, g);  // staleness 0: lr
  ASSERT_TRUE(h.Call(PullAt(1, 1)).status.ok());
  Push(h, 1, 1, g);  // staleness 0: lr
  ASSERT_TRUE(h.Call(PullAt(1, 2)).status.ok());
  Push(h, 1, 2, g);  // staleness 0: lr
  Push(h, 0, 0, g);  // rank 0 read version 0, the shard is at 3: lr / 3
  for (size_t i = 0; i < w.size(); ++i) w[i] -= 0.5 * (3 + 1.0 / 3) * g[i];
  ExpectNear(*h.shard->weights(4), w);
}

// DC-ASGD-c: g' = g + lambda * g * g * (w_now - w_read), then SGD.
TEST(ShardStalenessTest, DelayCompensationUsesWhatThePushingWorkerRead) {
  ShardOptions o = Opts(Consistency::kAsp);
  o.delay_compensation.lambda = 0.5f;
  ShardHarness h(o);
  Register(h);
  const std::vector<double> r0 = AsDouble(*h.shard->weights(4));
  const std::vector<float> g0 = Ramp(10, 1.0f, 0.5f),
                           g1 = Ramp(10, -2.0f, 0.25f);
  ASSERT_TRUE(h.Call(PullAt(0, 0)).status.ok());
  ASSERT_TRUE(h.Call(PullAt(1, 0)).status.ok());
  Push(h, 1, 0, g1);  // read = now: no correction
  std::vector<double> w = r0;
  for (size_t i = 0; i < w.size(); ++i) w[i] -= 0.5 * g1[i];
  ExpectNear(*h.shard->weights(4), w);
  Push(h, 0, 0, g0);  // read r0, now w: corrected
  for (size_t i = 0; i < w.size(); ++i) {
    const double gi = g0[i];
    const double corrected = gi + 0.5 * gi * gi * (w[i] - r0[i]);
    w[i] -= 0.5 * corrected;
  }
  ExpectNear(*h.shard->weights(4), w);
  // The correction is not zero here: plain SGD would differ.
  EXPECT_GT(std::fabs((*h.shard->weights(4))[9] -
                      (r0[9] - 0.5 * g1[9] - 0.5 * g0[9])),
            1e-3);
  EXPECT_EQ(h.shard->counters().dc_compensated, 2u);
  EXPECT_EQ(h.shard->counters().dc_uncompensated, 0u);
}

// A worker that prefetches step c+1's weights before pushing step c: the
// push of c is compensated against the read of c, not the newer one.
TEST(ShardStalenessTest, DelayCompensationKeepsTheReadOfEachClock) {
  ShardOptions o = Opts(Consistency::kAsp);
  o.delay_compensation.lambda = 0.5f;
  ShardHarness h(o);
  Register(h);
  const std::vector<float> g0 = Ramp(10, 1.0f, 0.5f),
                           g1 = Ramp(10, -2.0f, 0.25f);
  std::vector<double> w = AsDouble(*h.shard->weights(4));
  auto sgd = [&w](const std::vector<float>& g,
                  const std::vector<double>* read) {
    for (size_t i = 0; i < w.size(); ++i) {
      const double gi = g[i];
      w[i] -= 0.5 * (read ? gi + 0.5 * gi * gi * (w[i] - (*read)[i]) : gi);
    }
  };
  ASSERT_TRUE(h.Call(PullAt(0, 0)).status.ok());
  const std::vector<double> read0 = w;
  ASSERT_TRUE(h.Call(PullAt(1, 0)).status.ok());
  Push(h, 1, 0, g1);
  sgd(g1, &read0);
  ASSERT_TRUE(h.Call(PullAt(0, 1)).status.ok());  // prefetch of step 1
  const std::vector<double> read1 = w;
  ASSERT_TRUE(h.Call(PullAt(1, 1)).status.ok());
  Push(h, 1, 1, g1);
  sgd(g1, &read1);
  Push(h, 0, 0, g0);  // against read0
  sgd(g0, &read0);
  ExpectNear(*h.shard->weights(4), w);
  Push(h, 0, 1, g0);  // against read1
  sgd(g0, &read1);
  ExpectNear(*h.shard->weights(4), w);
  // A third clock replaces the oldest read (clock 0): a late push of clock 0
  // goes uncorrected and is counted.
  ASSERT_TRUE(h.Call(PullAt(0, 2)).status.ok());
  Push(h, 0, 0, g0);
  sgd(g0, nullptr);
  ExpectNear(*h.shard->weights(4), w);
  EXPECT_EQ(h.shard->counters().dc_compensated, 4u);
  EXPECT_EQ(h.shard->counters().dc_uncompensated, 1u);
}

TEST(ShardStalenessTest, DelayCompensationWithoutAReadAppliesPlainSgd) {
  ShardOptions o = Opts(Consistency::kAsp);
  o.delay_compensation.lambda = 0.5f;
  ShardHarness h(o);
  Register(h);
  std::vector<double> w = AsDouble(*h.shard->weights(4));
  const std::vector<float> g = Ramp(10, 1.0f, 0.5f);
  Push(h, 0, 0, g);  // never pulled (e.g. the shard restarted)
  RequestHeader other = PullAt(1, 0);
  other.incarnation = 7;  // another process of rank 1: its read does not count
  ASSERT_TRUE(h.Call(other).status.ok());
  Push(h, 1, 0, g);
  for (size_t i = 0; i < w.size(); ++i) w[i] -= 2 * 0.5 * g[i];
  ExpectNear(*h.shard->weights(4), w);
  EXPECT_EQ(h.shard->counters().dc_uncompensated, 2u);
}

TEST(ShardStalenessTest, EvictionFreesTheReads) {
  ShardOptions o = Opts(Consistency::kAsp);
  o.delay_compensation.lambda = 0.5f;
  o.worker_timeout = std::chrono::milliseconds(1000);
  ShardHarness h(o);
  Register(h);
  ASSERT_TRUE(h.Call(PullAt(0, 0)).status.ok());
  ASSERT_TRUE(h.Call(PullAt(1, 0)).status.ok());
  Push(h, 1, 0, Ramp(10, 1.0f, 0.5f));
  // Rank 1 reads the new version (a new snapshot) at two more clocks, which
  // replace its read of clock 0: rank 0's read of chunk 4 is then a buffer
  // that only its read holds.
  ASSERT_TRUE(h.Call(PullAt(1, 1)).status.ok());
  ASSERT_TRUE(h.Call(PullAt(1, 2)).status.ok());
  const uint64_t held = h.shard->budget().used();
  h.now += std::chrono::milliseconds(1500);
  ASSERT_TRUE(h.Call(ShardHarness::Clock(1, 1)).status.ok());  // rank 1 stays
  std::vector<OutgoingReply> out;
  h.shard->Tick(h.now, &out);
  EXPECT_FALSE(h.shard->clocks().live(0));
  EXPECT_LT(h.shard->budget().used(), held);
  Push(h, 0, 0, Ramp(10, 1.0f, 0.5f));
  EXPECT_EQ(h.shard->counters().dc_uncompensated, 1u);
}

TEST(ShardStalenessTest, DelayCompensationNeedsAsyncAndRoomForTheReads) {
  ShardOptions bsp = Opts(Consistency::kBsp);
  bsp.delay_compensation.lambda = 0.1f;
  EXPECT_EQ(Shard::Create(bsp, nullptr, std::chrono::steady_clock::now())
                .status()
                .code(),
            StatusCode::kInvalidArgument);

  // 2 x 262,144 floats split over 2 shards: 1 MiB of weights here. 8
  // workers' reads need 8 MiB more, over a 6 MiB budget; the same shard
  // without compensation fits.
  std::vector<TensorSpec> big = {
      TensorSpec{"w", {512, 512}, InitKind::kUniform, 0.1f, 1},
      TensorSpec{"v", {512, 512}, InitKind::kUniform, 0.1f, 2}};
  LayoutOptions lo;
  lo.chunk_elems = 1 << 16;
  lo.num_shards = 2;
  ShardOptions o = testing::TestOptions(Consistency::kAsp, 8);
  o.memory_budget_bytes = uint64_t{6} << 20;
  {
    ShardHarness plain(o);
    EXPECT_TRUE(plain.Call(ShardHarness::Register(0, big, lo)).status.ok());
  }
  o.delay_compensation.lambda = 0.1f;
  ShardHarness h(o);
  ReplyHeader r = h.Call(ShardHarness::Register(0, big, lo));
  EXPECT_EQ(r.status.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status.message().find("delay compensation"), std::string::npos)
      << r.status.message();
  EXPECT_FALSE(h.shard->registered());
}

// DC-ASGD-a keeps its mean square beside the optimizer state and a
// checkpoint restores it with the weights.
TEST(ShardStalenessTest, AdaptiveMeanSquareIsCheckpointed) {
  ShardOptions o = Opts(Consistency::kAsp);
  o.delay_compensation.lambda = 2.0f;
  o.delay_compensation.meansquare_decay = 0.95f;
  MemStore store;
  ShardHarness a(o, &store);
  Register(a);
  const std::vector<double> r0 = AsDouble(*a.shard->weights(4));
  const std::vector<float> g0 = Ramp(10, 1.0f, 0.5f),
                           g1 = Ramp(10, -2.0f, 0.25f);
  ASSERT_TRUE(a.Call(PullAt(0, 0)).status.ok());
  Push(a, 1, 0, g1);  // no read of rank 1: mean square only
  Push(a, 0, 0, g0);
  std::vector<double> w = r0, ms(10, 0.0);
  for (size_t i = 0; i < w.size(); ++i) {
    ms[i] = 0.05 * double{g1[i]} * g1[i];
    w[i] -= 0.5 * g1[i];
    const double gi = g0[i];
    ms[i] = 0.95 * ms[i] + 0.05 * gi * gi;
    w[i] -=
        0.5 * (gi + 2.0 / std::sqrt(ms[i] + 1e-7) * gi * gi * (w[i] - r0[i]));
  }
  ExpectNear(*a.shard->weights(4), w);
  const std::vector<float>& state = *a.shard->optimizer_state(4);
  ASSERT_EQ(state.size(), 10u);  // SGD has none: the mean square alone
  for (size_t i = 0; i < 10; ++i)
    EXPECT_NEAR(state[i], ms[i], 1e-6 * (1 + ms[i]));
  ASSERT_TRUE(a.shard->Checkpoint().ok());
  ShardHarness b(o, &store);
  ASSERT_TRUE(b.shard->registered());
  EXPECT_EQ(a.AllWeights(), b.AllWeights());  // weights + mean square, bitwise
}

}  // namespace
}  // namespace asyncps::server
