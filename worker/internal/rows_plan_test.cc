#include "worker/internal/rows_plan.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <set>

namespace asyncps::worker::internal {
namespace {

TableSpec Table(const std::string& name, uint32_t dim) {
  TableSpec t;
  t.name = name;
  t.dim = dim;
  return t;
}

std::vector<uint64_t> KeysOf(const RowsPlan::Part& p) {
  std::vector<uint64_t> k(p.n);
  std::memcpy(k.data(), p.keys->data(), p.n * 8);
  return k;
}

// Each shard gets the unique keys it owns; gradients of repeated keys are
// summed in position order; pulled rows reach every position.
TEST(RowsPlanTest, UniqueKeysPerShardMergedGradsAndScatter) {
  const std::vector<TableSpec> tables = {Table("a", 2), Table("b", 3)};
  const int shards = 3;
  std::vector<uint64_t> ka = {7, 9, 7, 100, 9, 7, 55};
  std::vector<float> ga(ka.size() * 2);
  for (size_t i = 0; i < ga.size(); ++i) ga[i] = 0.5f * static_cast<float>(i);
  std::vector<uint64_t> kb = {7, 8};
  std::vector<float> gb(6, 1.0f);
  RowsPlan plan;
  ASSERT_TRUE(plan.Build(tables, shards,
                         {{0, ka.data(), ka.size(), ga.data(), nullptr},
                          {1, kb.data(), kb.size(), gb.data(), nullptr}},
                         true)
                  .ok());
  std::map<uint64_t, std::vector<float>> want;  // table a: key -> summed grad
  for (size_t i = 0; i < ka.size(); ++i) {
    auto& w = want[ka[i]];
    w.resize(2, 0.0f);
    w[0] += ga[i * 2];
    w[1] += ga[i * 2 + 1];
  }
  std::set<uint64_t> seen;
  size_t b_keys = 0;
  for (int s = 0; s < shards; ++s) {
    for (const RowsPlan::Part& p : plan.parts(s)) {
      const TableSpec& t = tables[p.table];
      for (size_t j = 0; j < p.n; ++j) {
        const uint64_t key = KeysOf(p)[j];
        EXPECT_EQ(ShardOfKey(t, key, shards), s);
        if (p.table == 1) {
          ++b_keys;
          continue;
        }
        EXPECT_TRUE(seen.insert(key).second) << "key sent twice: " << key;
        EXPECT_EQ(p.grads->floats()[j * 2], want[key][0]);
        EXPECT_EQ(p.grads->floats()[j * 2 + 1], want[key][1]);
      }
    }
  }
  EXPECT_EQ(seen.size(), 4u);
  EXPECT_EQ(b_keys, 2u);

  // Pull: rows come back per shard part; every position gets its key's row.
  std::vector<float> out(ka.size() * 2, -1.0f);
  RowsPlan pull;
  ASSERT_TRUE(pull.Build(tables, shards,
                         {{0, ka.data(), ka.size(), nullptr, out.data()}},
                         false)
                  .ok());
  for (int s = 0; s < shards; ++s) {
    for (size_t p = 0; p < pull.parts(s).size(); ++p) {
      const RowsPlan::Part& part = pull.parts(s)[p];
      EXPECT_FALSE(part.grads);
      std::vector<float> rows(part.n * 2);
      for (size_t j = 0; j < part.n; ++j) {
        rows[j * 2] = static_cast<float>(KeysOf(part)[j]);
        rows[j * 2 + 1] = -static_cast<float>(KeysOf(part)[j]);
      }
      pull.Scatter(s, p, rows.data());
    }
  }
  for (size_t i = 0; i < ka.size(); ++i) {
    EXPECT_EQ(out[i * 2], static_cast<float>(ka[i]));
    EXPECT_EQ(out[i * 2 + 1], -static_cast<float>(ka[i]));
  }
}

TEST(RowsPlanTest, BadRequestsAreRefused) {
  const std::vector<TableSpec> tables = {Table("a", 2)};
  std::vector<uint64_t> k = {1};
  std::vector<float> g(2);
  RowsPlan plan;
  EXPECT_FALSE(
      plan.Build(tables, 2, {{1, k.data(), 1, g.data(), nullptr}}, true).ok());
  Status s = plan.Build(tables, 2,
                        {{0, k.data(), 1, g.data(), nullptr},
                         {0, k.data(), 1, g.data(), nullptr}},
                        true);
  EXPECT_NE(s.message().find("named twice"), std::string::npos);
  EXPECT_FALSE(
      plan.Build(tables, 2, {{0, k.data(), 1, nullptr, nullptr}}, true).ok());
  EXPECT_FALSE(
      plan.Build(tables, 2, {{0, nullptr, 1, nullptr, g.data()}}, false).ok());
}

}  // namespace
}  // namespace asyncps::worker::internal
