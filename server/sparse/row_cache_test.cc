#include "server/sparse/row_cache.h"

#include <gtest/gtest.h>

#include <vector>

namespace asyncps::server::sparse {
namespace {

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
