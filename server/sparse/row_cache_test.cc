#include "server/sparse/row_cache.h"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>
#include <unordered_set>

#include "server/sparse/flat_index.h"

namespace asyncps::server::sparse {
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
      EXPECT_EQ(index.Find(key), it == ref.end() ? FlatIndex::kNone : it->second);
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

TEST(RowCacheTest, InsertFindRemoveReusesSlots) {
  RowCache c(4);
  std::vector<uint32_t> slots;
  for (uint64_t k = 0; k < 5000; ++k) {
    uint32_t s = c.Insert(k);
    c.floats(s)[0] = static_cast<float>(k);
    slots.push_back(s);
  }
  EXPECT_EQ(c.entries(), 5000u);
  for (uint64_t k = 0; k < 5000; ++k) {
    uint32_t s = c.Find(k);
    ASSERT_EQ(s, slots[k]);
    ASSERT_EQ(c.floats(s)[0], static_cast<float>(k));
    ASSERT_EQ(c.meta(s).key, k);
  }
  const size_t allocated = c.allocated_bytes();
  for (uint64_t k = 0; k < 2000; ++k) c.Remove(c.Find(k));
  EXPECT_EQ(c.Find(10), RowCache::kNone);
  EXPECT_EQ(c.entries(), 3000u);
  for (uint64_t k = 10000; k < 12000; ++k) c.Insert(k);
  // Freed slots came back: no new block.
  EXPECT_EQ(c.allocated_bytes(), allocated);
  // Live bytes: entries (floats + metadata) plus the index (16 B a slot).
  EXPECT_GE(c.bytes(), c.entries() * c.entry_bytes() + c.entries() * 2 * 16);
  EXPECT_LE(c.bytes(), c.entries() * c.entry_bytes() + 16384 * 16);
}

TEST(RowCacheTest, ClockGivesReferencedEntriesASecondChance) {
  RowCache c(1);
  for (uint64_t k = 0; k < 8; ++k) c.Insert(k);
  // Every entry starts referenced: the first sweep clears the bits, then
  // slot 0 is the victim.
  uint32_t v = c.NextVictim();
  ASSERT_NE(v, RowCache::kNone);
  EXPECT_EQ(c.meta(v).key, 0u);
  c.Remove(v);
  // Touch key 1: it survives the next choice, key 2 goes.
  c.meta(c.Find(1)).flags |= EntryMeta::kRef;
  v = c.NextVictim();
  EXPECT_EQ(c.meta(v).key, 2u);
  c.Remove(v);
  // Pinned entries are never chosen; all pinned: none.
  c.ForEach([&](uint32_t s) { c.meta(s).flags |= EntryMeta::kPinned; });
  EXPECT_EQ(c.NextVictim(), RowCache::kNone);
  c.meta(c.Find(5)).flags &= ~EntryMeta::kPinned;
  v = c.NextVictim();
  ASSERT_NE(v, RowCache::kNone);
  EXPECT_EQ(c.meta(v).key, 5u);
}

TEST(RowCacheTest, MetadataOnlyEntriesAllocateNoFloats) {
  RowCache c(0);
  for (uint64_t k = 0; k < 10000; ++k) c.Insert(k);
  EXPECT_EQ(c.entry_bytes(), sizeof(EntryMeta));
  EXPECT_LT(c.allocated_bytes(), 10000 * sizeof(EntryMeta) * 2 + c.bytes());
}

}  // namespace
}  // namespace asyncps::server::sparse
