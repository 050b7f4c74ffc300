#include "server/optimizer/staleness_rules.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "server/optimizer/lr_schedule.h"

namespace asyncps::server {
namespace {

TEST(LrScheduleTest, LinearWarmupThenConstant) {
  LrScheduleOptions o;
  o.warmup_updates = 4;
  o.warmup_start = 0.25f;
  ASSERT_TRUE(o.Validate().ok());
  LrSchedule s(o);
  // start + (1 - start) * v / 4 for v < 4, then 1.
  const float want[] = {0.25f, 0.4375f, 0.625f, 0.8125f, 1.0f, 1.0f, 1.0f};
  for (uint64_t v = 0; v < 7; ++v) EXPECT_FLOAT_EQ(s.Scale(v), want[v]) << v;
}

TEST(LrScheduleTest, CosineDecayStartsAfterTheWarmupAndEndsAtDecayUpdates) {
  LrScheduleOptions o;
  o.warmup_updates = 2;
  o.decay_updates = 6;  // cosine over updates 2..6
  o.final_fraction = 0.1f;
  ASSERT_TRUE(o.Validate().ok());
  LrSchedule s(o);
  EXPECT_FLOAT_EQ(s.Scale(0), 0.0f);
  EXPECT_FLOAT_EQ(s.Scale(1), 0.5f);
  for (uint64_t v = 2; v <= 8; ++v) {
    const double t = std::min(1.0, (v - 2) / 4.0);
    const double want = 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * t));
    EXPECT_NEAR(s.Scale(v), want, 1e-6) << v;
  }
  // Without a warm-up the cosine runs from update 0 (the earlier rule).
  LrScheduleOptions d;
  d.decay_updates = 2;
  LrSchedule ds(d);
  EXPECT_FLOAT_EQ(ds.Scale(0), 1.0f);
  EXPECT_FLOAT_EQ(ds.Scale(1), 0.5f);
  EXPECT_FLOAT_EQ(ds.Scale(2), 0.0f);
  EXPECT_EQ(LrSchedule(LrScheduleOptions{}).Scale(12345), 1.0f);
}

TEST(LrScheduleTest, RejectsBadOptions) {
  LrScheduleOptions o;
  o.warmup_start = 1.5f;
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
  o = LrScheduleOptions{};
  o.warmup_updates = 10;
  o.decay_updates = 10;  // the decay would end inside the warm-up
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
  o.final_fraction = -0.1f;
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
}

TEST(StalenessLrTest, RulesAndNames) {
  EXPECT_EQ(StalenessLrScale(StalenessLr::kNone, 7), 1.0f);
  EXPECT_FLOAT_EQ(StalenessLrScale(StalenessLr::kOnePlus, 0), 1.0f);
  EXPECT_FLOAT_EQ(StalenessLrScale(StalenessLr::kOnePlus, 3), 0.25f);
  // Zhang et al.: lr / s, and lr itself for a fresh gradient.
  EXPECT_FLOAT_EQ(StalenessLrScale(StalenessLr::kInverse, 0), 1.0f);
  EXPECT_FLOAT_EQ(StalenessLrScale(StalenessLr::kInverse, 1), 1.0f);
  EXPECT_FLOAT_EQ(StalenessLrScale(StalenessLr::kInverse, 4), 0.25f);
  for (StalenessLr r :
       {StalenessLr::kNone, StalenessLr::kOnePlus, StalenessLr::kInverse}) {
    auto parsed = ParseStalenessLr(StalenessLrName(r));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, r);
  }
  EXPECT_EQ(*ParseStalenessLr("true"), StalenessLr::kOnePlus);
  EXPECT_EQ(*ParseStalenessLr("false"), StalenessLr::kNone);
  EXPECT_EQ(ParseStalenessLr("sqrt").status().code(),
            StatusCode::kInvalidArgument);
}

// Reference: Zheng et al. (2017), Algorithm 1 (DC-ASGD-c) and the adaptive
// lambda of Section 5 (DC-ASGD-a), computed in double.
TEST(DelayCompensationTest, MatchesTheReferenceComputation) {
  const std::vector<float> g = {0.5f, -1.0f, 2.0f, 0.0f, -0.25f};
  const std::vector<float> now = {1.0f, 2.0f, -1.0f, 3.0f, 0.5f};
  const std::vector<float> read = {0.5f, 2.5f, -1.5f, 1.0f, 0.5f};
  DelayCompensationOptions c;
  c.lambda = 0.3f;
  ASSERT_TRUE(c.Validate().ok());
  EXPECT_EQ(c.state_per_elem(), 0u);
  std::vector<float> out(g.size());
  CompensateDelay(c, g.data(), now.data(), read.data(), nullptr, g.size(),
                  out.data());
  for (size_t i = 0; i < g.size(); ++i) {
    const double want =
        double{g[i]} + 0.3 * double{g[i]} * g[i] * (double{now[i]} - read[i]);
    EXPECT_NEAR(out[i], want, 1e-6) << i;
  }
  EXPECT_FLOAT_EQ(out[0], 0.5f + 0.3f * 0.25f * 0.5f);

  DelayCompensationOptions a = c;
  a.lambda = 2.0f;
  a.meansquare_decay = 0.95f;
  a.eps = 1e-7f;
  EXPECT_EQ(a.state_per_elem(), 1u);
  std::vector<double> ms_ref(g.size(), 0.0);
  std::vector<float> ms(g.size(), 0.0f);
  for (int round = 0; round < 3; ++round) {
    std::vector<float> in = g;
    for (float& x : in) x *= static_cast<float>(round + 1);
    CompensateDelay(a, in.data(), now.data(), read.data(), ms.data(), in.size(),
                    in.data());  // in place
    for (size_t i = 0; i < g.size(); ++i) {
      const double gi = double{g[i]} * (round + 1);
      ms_ref[i] = 0.95 * ms_ref[i] + 0.05 * gi * gi;
      const double want = gi + 2.0 / std::sqrt(ms_ref[i] + 1e-7) * gi * gi *
                                   (double{now[i]} - read[i]);
      EXPECT_NEAR(ms[i], ms_ref[i], 1e-6 * (1 + ms_ref[i]));
      EXPECT_NEAR(in[i], want, 1e-5 * (1 + std::fabs(want))) << round << i;
    }
  }
  // Without a read the mean square still follows every gradient.
  UpdateMeanSquare(a, g.data(), ms.data(), g.size());
  for (size_t i = 0; i < g.size(); ++i) {
    ms_ref[i] = 0.95 * ms_ref[i] + 0.05 * double{g[i]} * g[i];
    EXPECT_NEAR(ms[i], ms_ref[i], 1e-6 * (1 + ms_ref[i]));
  }
}

TEST(DelayCompensationTest, ValidatesOptions) {
  DelayCompensationOptions o;
  EXPECT_FALSE(o.enabled());
  EXPECT_EQ(o.ToString(), "off");
  o.lambda = -1.0f;
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
  o.lambda = 0.1f;
  o.meansquare_decay = 1.0f;
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
  o.meansquare_decay = 0.95f;
  o.eps = 0.0f;
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace asyncps::server
