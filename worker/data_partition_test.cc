#include "worker/data_partition.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace asyncps::worker {
namespace {

Dataset MakeDataset(int64_t n) {
  Dataset d;
  d.num_examples = n;
  d.rows = 1;
  d.cols = 2;
  for (int64_t i = 0; i < n; ++i) {
    d.images.push_back(static_cast<float>(i));
    d.images.push_back(static_cast<float>(-i));
    d.labels.push_back(static_cast<uint8_t>(i % 10));
  }
  return d;
}

class PartitionTest : public ::testing::TestWithParam<PartitionKind> {};

TEST_P(PartitionTest, DisjointAndCovering) {
  for (int w : {1, 3, 7}) {
    std::set<int64_t> all;
    size_t total = 0;
    for (int r = 0; r < w; ++r) {
      PartitionOptions o{r, w, GetParam(), 0};
      auto idx = PartitionIndices(1001, o);
      EXPECT_GE(static_cast<int64_t>(idx.size()), PartitionSize(1001, w));
      total += idx.size();
      all.insert(idx.begin(), idx.end());
    }
    EXPECT_EQ(total, 1001u);
    EXPECT_EQ(all.size(), 1001u);
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, PartitionTest,
                         ::testing::Values(PartitionKind::kContiguous,
                                           PartitionKind::kStrided));

TEST(ShuffleTest, DeterministicPerSeedRankEpoch) {
  std::vector<int64_t> base(500);
  for (int i = 0; i < 500; ++i) base[i] = i;
  auto shuffled = [&](uint64_t seed, int rank, int64_t epoch) {
    auto v = base;
    ShuffleForEpoch(seed, rank, epoch, &v);
    return v;
  };
  EXPECT_EQ(shuffled(1, 0, 0), shuffled(1, 0, 0));
  EXPECT_NE(shuffled(1, 0, 0), shuffled(1, 0, 1));
  EXPECT_NE(shuffled(1, 0, 0), shuffled(2, 0, 0));
  EXPECT_NE(shuffled(1, 0, 0), shuffled(1, 1, 0));
  EXPECT_NE(shuffled(1, 0, 0), base);
  auto s = shuffled(3, 2, 5);
  std::sort(s.begin(), s.end());
  EXPECT_EQ(s, base);  // a permutation
}

TEST(BatchIteratorTest, EpochsCoverPartitionOnceAndMatchAcrossModes) {
  Dataset d = MakeDataset(103);
  for (int rank = 0; rank < 2; ++rank) {
    BatchOptions o;
    o.partition = {rank, 2, PartitionKind::kStrided, 42};
    o.batch_size = 10;
    auto prefetch = BatchIterator::Create(&d, o);
    o.prefetch = false;
    auto direct = BatchIterator::Create(&d, o);
    ASSERT_TRUE(prefetch.ok() && direct.ok());
    EXPECT_EQ((*prefetch)->batches_per_epoch(), 6);  // 51 examples per epoch
    for (int epoch = 0; epoch < 3; ++epoch) {
      std::set<int64_t> seen;
      for (int b = 0; b < 6; ++b) {
        auto p = (*prefetch)->Next();
        auto q = (*direct)->Next();
        ASSERT_TRUE(p.ok() && q.ok());
        const Batch& bp = **p;
        const Batch& bq = **q;
        EXPECT_EQ(bp.epoch, epoch);
        EXPECT_EQ(bp.index, b);
        EXPECT_EQ(bp.size, b < 5 ? 10 : 1);
        ASSERT_EQ(bp.size, bq.size);
        for (int i = 0; i < bp.size; ++i) {
          const int64_t ex = static_cast<int64_t>(bp.x[2 * i]);
          EXPECT_EQ(bq.x[2 * i], bp.x[2 * i]);
          EXPECT_EQ(bp.x[2 * i + 1], -bp.x[2 * i]);
          EXPECT_EQ(bp.y[i], ex % 10);
          EXPECT_EQ(ex % 2, rank);  // strided partition
          EXPECT_TRUE(seen.insert(ex).second)
              << "example " << ex << " twice in an epoch";
        }
      }
      EXPECT_EQ(seen.size(), 51u);
    }
  }
}

// 103 examples over 2 workers: 51 per epoch and rank, batches of 10: five
// full batches and one of a single example, which drop_last leaves out;
// everything else (order, epochs) is the same as without it.
TEST(BatchIteratorTest, DropLastDropsExactlyThePartialBatch) {
  Dataset d = MakeDataset(103);
  EXPECT_EQ(BatchesPerEpoch(103, 2, 10, false), 6);
  EXPECT_EQ(BatchesPerEpoch(103, 2, 10, true), 5);
  EXPECT_EQ(BatchesPerEpoch(100, 2, 10, true), 5);  // no partial batch
  EXPECT_EQ(BatchesPerEpoch(100, 2, 10, false), 5);
  for (int rank = 0; rank < 2; ++rank) {
    BatchOptions o;
    o.partition = {rank, 2, PartitionKind::kStrided, 42};
    o.batch_size = 10;
    o.prefetch = false;
    auto keep = BatchIterator::Create(&d, o);
    o.drop_last = true;
    o.prefetch = rank == 1;  // both iterator modes
    auto drop = BatchIterator::Create(&d, o);
    ASSERT_TRUE(keep.ok() && drop.ok());
    EXPECT_EQ((*drop)->batches_per_epoch(), 5);
    std::set<int64_t> dropped;
    for (int epoch = 0; epoch < 3; ++epoch) {
      for (int b = 0; b < 6; ++b) {
        auto k = (*keep)->Next();
        ASSERT_TRUE(k.ok());
        const Batch& bk = **k;
        if (b == 5) {  // the partial batch: not in the drop_last sequence
          ASSERT_EQ(bk.size, 1);
          dropped.insert(static_cast<int64_t>(bk.x[0]));
          continue;
        }
        auto p = (*drop)->Next();
        ASSERT_TRUE(p.ok());
        const Batch& bd = **p;
        EXPECT_EQ(bd.epoch, epoch);
        EXPECT_EQ(bd.index, b);
        ASSERT_EQ(bd.size, 10);
        EXPECT_EQ(bd.x, bk.x);
        EXPECT_EQ(bd.y, bk.y);
      }
    }
    // Each epoch leaves out another example (the partition is reshuffled).
    EXPECT_GT(dropped.size(), 1u);
  }
  // A partition shorter than one batch would train on nothing.
  BatchOptions o;
  o.partition = {0, 2, PartitionKind::kStrided, 1};
  o.batch_size = 60;
  o.drop_last = true;
  EXPECT_EQ(BatchIterator::Create(&d, o).status().code(),
            StatusCode::kInvalidArgument);
  o.drop_last = false;
  EXPECT_TRUE(BatchIterator::Create(&d, o).ok());
}

TEST(BatchIteratorTest, RejectsBadOptions) {
  Dataset d = MakeDataset(10);
  BatchOptions o;
  o.batch_size = 0;
  EXPECT_EQ(BatchIterator::Create(&d, o).status().code(),
            StatusCode::kInvalidArgument);
  o.batch_size = 4;
  o.partition.rank = 3;
  o.partition.num_workers = 3;
  EXPECT_EQ(BatchIterator::Create(&d, o).status().code(),
            StatusCode::kInvalidArgument);
  o.partition.rank = 0;
  o.partition.num_workers = 11;  // fewer examples than workers
  EXPECT_EQ(BatchIterator::Create(&d, o).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace asyncps::worker
