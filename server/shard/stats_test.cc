#include "server/shard/stats.h"

#include <gtest/gtest.h>

namespace asyncps::server {
namespace {

TEST(StalenessHistogramTest, ExactAndLogBuckets) {
  StalenessHistogram h;
  EXPECT_EQ(h.Quantile(0.5), 0u);
  for (int i = 0; i < 98; ++i) h.Add(1);
  h.Add(63);
  h.Add(1000);
  EXPECT_EQ(h.count(), 100u);
  EXPECT_EQ(h.max(), 1000u);
  EXPECT_EQ(h.Quantile(0.5), 1u);
  EXPECT_EQ(h.Quantile(0.99), 1000u >> 9 << 9);  // bucket [512, 1024)
  EXPECT_EQ(StalenessHistogram::BucketOf(63), 63u);
  EXPECT_EQ(StalenessHistogram::BucketOf(64), 64u);
  EXPECT_EQ(StalenessHistogram::BucketOf(127), 64u);
  EXPECT_EQ(StalenessHistogram::BucketOf(128), 65u);
  EXPECT_EQ(StalenessHistogram::BucketOf(~uint64_t{0}),
            StalenessHistogram::kNumBuckets - 1);
  EXPECT_NE(h.ToJson().find("\"p50\":1"), std::string::npos);
}

}  // namespace
}  // namespace asyncps::server
