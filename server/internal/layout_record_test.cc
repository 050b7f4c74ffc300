// The layout record: both versions round-trip, a balanced model keeps the
// first version's bytes, and damaged records are refused before allocation.
#include "server/internal/layout_record.h"

#include <gtest/gtest.h>

#include <cstring>

#include "server/internal/shard_records.h"
#include "server/testing/test_util.h"

namespace asyncps::server {
namespace {

uint32_t Magic(const std::string& record) {
  uint32_t m = 0;
  std::memcpy(&m, record.data(), sizeof(m));
  return m;
}

TEST(LayoutRecordTest, BothPlacementsRoundTrip) {
  for (Placement p : {Placement::kBalanced, Placement::kInOrder}) {
    LayoutOptions o = testing::SmallLayout(3);
    o.placement = p;
    auto l = Layout::Create(testing::SmallModel(), o);
    ASSERT_TRUE(l.ok());
    const std::string rec = internal::EncodeLayoutRecord(*l);
    // Balanced models keep the first version's record, so a shard built
    // before placements existed still reads it.
    EXPECT_EQ(Magic(rec), p == Placement::kBalanced ? internal::kLayoutMagic
                                                    : internal::kLayoutMagicV2);
    std::vector<TensorSpec> tensors;
    LayoutOptions back;
    ASSERT_TRUE(internal::ParseLayoutRecord(rec, &tensors, &back).ok());
    EXPECT_EQ(tensors, testing::SmallModel());
    EXPECT_EQ(back.num_shards, 3);
    EXPECT_EQ(back.chunk_elems, o.chunk_elems);
    EXPECT_EQ(back.min_chunk_elems, o.min_chunk_elems);
    EXPECT_EQ(back.placement, p);
  }
}

TEST(LayoutRecordTest, DamagedRecordsAreRefused) {
  LayoutOptions o = testing::SmallLayout(2);
  o.placement = Placement::kInOrder;
  const std::string rec =
      internal::EncodeLayoutRecord(*Layout::Create(testing::SmallModel(), o));
  std::vector<TensorSpec> tensors;
  LayoutOptions lo;
  const auto code = [&](const std::string& r) {
    return internal::ParseLayoutRecord(r, &tensors, &lo).code();
  };
  ASSERT_EQ(code(rec), StatusCode::kOk);
  for (size_t n = 0; n < rec.size(); ++n) {
    EXPECT_EQ(code(rec.substr(0, n)), StatusCode::kCorruption)
        << "truncated at " << n;
  }
  EXPECT_EQ(code(rec + "x"), StatusCode::kCorruption);
  std::string bad = rec;
  bad[24] = 2;  // the placement byte: no such placement
  EXPECT_EQ(code(bad), StatusCode::kCorruption);
  bad = rec;
  const uint32_t many = 1u << 30;  // tensors: more than the bytes left
  std::memcpy(&bad[25], &many, sizeof(many));
  EXPECT_EQ(code(bad), StatusCode::kCorruption);
  bad = rec;
  const uint32_t shards = 0;
  std::memcpy(&bad[4], &shards, sizeof(shards));
  EXPECT_EQ(code(bad), StatusCode::kCorruption);
  bad = rec;
  bad[0] = 'X';
  EXPECT_EQ(code(bad), StatusCode::kCorruption);
}

}  // namespace
}  // namespace asyncps::server
