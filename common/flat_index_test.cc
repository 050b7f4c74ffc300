#include "common/flat_index.h"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>

namespace asyncps {
namespace {

TEST(FlatIndexTest, MatchesStdUnorderedMapUnderChurn) {
  FlatIndex index;
  std::unordered_map<uint64_t, uint32_t> ref;
  std::mt19937_64 rng(3);
  for (int step = 0; step < 200000; ++step) {
    // Small key range: many collisions of probe runs, many erases.
    const uint64_t key = rng() % 5000 * 0x10000;  // aligned keys collide more
    const int op = static_cast<int>(rng() % 3);
    auto it = ref.find(key);
    if (op == 0 && it == ref.end()) {
      index.Insert(key, static_cast<uint32_t>(step));
      ref[key] = static_cast<uint32_t>(step);
    } else if (op == 1) {
      EXPECT_EQ(index.Erase(key), it != ref.end());
      if (it != ref.end()) ref.erase(it);
    } else {
      EXPECT_EQ(index.Find(key),
                it == ref.end() ? FlatIndex::kNone : it->second);
    }
  }
  EXPECT_EQ(index.size(), ref.size());
  for (const auto& [k, v] : ref) ASSERT_EQ(index.Find(k), v);
  EXPECT_LE(index.size() * 2, index.capacity());
  index.Update(ref.begin()->first, 7);
  EXPECT_EQ(index.Find(ref.begin()->first), 7u);
}

TEST(FlatIndexTest, KeySetFindsDuplicatesAndClearsInConstantTime) {
  KeySet set;
  set.Clear();
  set.Reserve(1000);
  for (uint64_t k = 0; k < 1000; ++k) ASSERT_TRUE(set.Insert(k * 7919));
  EXPECT_FALSE(set.Insert(7919 * 500));
  set.Clear();
  set.Reserve(1000);
  EXPECT_TRUE(set.Insert(7919 * 500));
  EXPECT_FALSE(set.Insert(7919 * 500));
  // Growing keeps the current generation's keys.
  set.Reserve(100000);
  EXPECT_FALSE(set.Insert(7919 * 500));
  EXPECT_TRUE(set.Insert(1));
}

}  // namespace
}  // namespace asyncps
