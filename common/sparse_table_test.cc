#include "common/sparse_table.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

namespace asyncps {
namespace {

TableSpec Spec(const std::string& name, uint32_t dim) {
  TableSpec t;
  t.name = name;
  t.dim = dim;
  t.init = InitKind::kNormal;
  t.init_param = 0.5f;
  t.seed = 7;
  return t;
}

TEST(SparseTableTest, ShardOfKeyIsPureAndBalanced) {
  TableSpec t = Spec("emb", 8);
  const int shards = 7;
  std::vector<int> count(shards, 0);
  const int n = 700000;
  for (uint64_t k = 0; k < n; ++k) {
    int s = ShardOfKey(t, k, shards);
    ASSERT_GE(s, 0);
    ASSERT_LT(s, shards);
    ASSERT_EQ(s, ShardOfKey(t, k, shards));
    ++count[s];
  }
  // Consecutive keys spread evenly: within 2% of the mean.
  for (int c : count) EXPECT_NEAR(c, n / shards, n / shards / 50);
  // Another table sends the same key elsewhere about (S-1)/S of the time.
  TableSpec other = Spec("emb2", 8);
  int same = 0;
  for (uint64_t k = 0; k < 10000; ++k)
    same += ShardOfKey(t, k, shards) == ShardOfKey(other, k, shards);
  EXPECT_LT(same, 2000);
  EXPECT_EQ(ShardOfKey(t, ~uint64_t{0}, 1), 0);
}

TEST(SparseTableTest, InitialRowsDependOnSeedTableAndKeyOnly) {
  TableSpec t = Spec("emb", 16);
  std::vector<float> a(16), b(16), c(16);
  InitializeRow(t, 42, a.data());
  InitializeRow(t, 42, b.data());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), 64));
  InitializeRow(t, 43, c.data());
  EXPECT_NE(0, std::memcmp(a.data(), c.data(), 64));
  TableSpec renamed = t;
  renamed.name = "emb_b";
  InitializeRow(renamed, 42, c.data());
  EXPECT_NE(0, std::memcmp(a.data(), c.data(), 64));
  TableSpec reseeded = t;
  reseeded.seed = 8;
  InitializeRow(reseeded, 42, c.data());
  EXPECT_NE(0, std::memcmp(a.data(), c.data(), 64));
  // N(0, 0.5^2) over many rows.
  double sum = 0, sq = 0;
  const int rows = 20000;
  for (uint64_t k = 0; k < rows; ++k) {
    InitializeRow(t, k, a.data());
    for (float v : a) {
      ASSERT_TRUE(std::isfinite(v));
      sum += v;
      sq += double{v} * v;
    }
  }
  const double m = sum / (rows * 16.0);
  EXPECT_NEAR(m, 0.0, 0.01);
  EXPECT_NEAR(std::sqrt(sq / (rows * 16.0) - m * m), 0.5, 0.01);
  TableSpec zeros = Spec("z", 4);
  zeros.init = InitKind::kZeros;
  InitializeRow(zeros, 5, a.data());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a[i], 0.0f);
}

TEST(SparseTableTest, ValidationNamesTheProblem) {
  TableSpec t = Spec("emb", 8);
  EXPECT_TRUE(t.Validate().ok());
  TableSpec bad = t;
  bad.dim = 0;
  EXPECT_NE(bad.Validate().message().find("dim 0"), std::string::npos);
  bad = t;
  bad.dim = kMaxRowDim + 1;
  EXPECT_FALSE(bad.Validate().ok());
  bad = t;
  bad.name = "";
  EXPECT_FALSE(bad.Validate().ok());
  bad = t;
  bad.init = InitKind::kHeNormal;
  EXPECT_NE(bad.Validate().message().find("initialiser"), std::string::npos);
  bad = t;
  bad.optimizer.lr = -1;
  EXPECT_NE(bad.Validate().message().find("lr"), std::string::npos);
  bad = t;
  bad.optimizer.beta2 = 1.0f;
  EXPECT_FALSE(bad.Validate().ok());
  bad = t;
  bad.expire_after_clocks = -1;
  EXPECT_FALSE(bad.Validate().ok());
  bad = t;
  bad.init_param = NAN;
  EXPECT_FALSE(bad.Validate().ok());
  EXPECT_TRUE(ValidateTables({t, Spec("other", 4)}).ok());
  Status dup = ValidateTables({t, Spec("emb", 4)});
  EXPECT_NE(dup.message().find("duplicate table name 'emb'"),
            std::string::npos);
}

TEST(SparseTableTest, EqualityCoversEveryField) {
  TableSpec t = Spec("emb", 8);
  TableSpec u = t;
  EXPECT_EQ(t, u);
  u.optimizer.kind = RowOptimizerKind::kAdam;
  EXPECT_NE(t, u);
  u = t;
  u.admit_after_pushes = 3;
  EXPECT_NE(t, u);
  u = t;
  u.expire_after_clocks = 10;
  EXPECT_NE(t, u);
  u = t;
  u.optimizer.initial_accumulator = 0.1f;
  EXPECT_NE(t, u);
  EXPECT_EQ(RowOptimizerKindName(RowOptimizerKind::kAdaGrad),
            std::string("adagrad"));
  EXPECT_EQ(*ParseRowOptimizerKind("adam"), RowOptimizerKind::kAdam);
  EXPECT_FALSE(ParseRowOptimizerKind("momentum").ok());
}

}  // namespace
}  // namespace asyncps

namespace asyncps {
namespace {

// Saved optimizer state of rows (a restore), checked by the client before
// it uploads and by the shard before it writes: the table's optimizer,
// finite, sums of squares >= 0, steps <= 2^53; the error names the key.
TEST(SparseTableTest, RowStateChecksNameTheTableAndKey) {
  TableSpec t;
  t.name = "emb";
  t.dim = 2;
  t.optimizer.kind = RowOptimizerKind::kAdam;  // per row [m m | v v]
  const std::vector<uint64_t> keys = {11, 12};
  std::vector<float> state = {-1, 2, 3, 4, 5, -0.0f, 7, 8};  // m may be < 0
  std::vector<uint64_t> steps = {1, kMaxRowSteps};
  EXPECT_TRUE(
      CheckRowState(t, "adam", keys.data(), state.data(), steps.data(), 2)
          .ok());
  Status s =
      CheckRowState(t, "adagrad", keys.data(), state.data(), steps.data(), 2);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("saved from 'adagrad', the table runs 'adam'"),
            std::string::npos);
  state[7] = -1.0f;  // key 12's v
  s = CheckRowState(t, "adam", keys.data(), state.data(), steps.data(), 2);
  EXPECT_NE(s.message().find("key 12 has a negative sum of squares"),
            std::string::npos);
  state[7] = std::nanf("");
  s = CheckRowState(t, "adam", keys.data(), state.data(), steps.data(), 2);
  EXPECT_NE(s.message().find("key 12 contains NaN"), std::string::npos);
  state[7] = 8.0f;
  steps[1] = kMaxRowSteps + 1;
  s = CheckRowState(t, "adam", keys.data(), state.data(), steps.data(), 2);
  EXPECT_NE(s.message().find("at most 2^53"), std::string::npos);
  // AdaGrad: its one slot is the sum; SGD keeps none.
  t.optimizer.kind = RowOptimizerKind::kAdaGrad;
  steps[1] = 0;
  const std::vector<float> sums = {0, 1, 2, -3};
  s = CheckRowState(t, "adagrad", keys.data(), sums.data(), steps.data(), 2);
  EXPECT_NE(s.message().find("key 12 has a negative sum"), std::string::npos);
  t.optimizer.kind = RowOptimizerKind::kSgd;
  EXPECT_TRUE(
      CheckRowState(t, "sgd", keys.data(), nullptr, steps.data(), 2).ok());
}

}  // namespace
}  // namespace asyncps
