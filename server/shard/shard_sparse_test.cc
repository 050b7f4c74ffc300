// Sparse tables through Shard::Handle: rows in the same pushes, pulls and
// clocks as chunks; bad input; SSP and BSP; durable and checkpointed
// recovery.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <set>
#include <utility>

#include "compression/codec.h"
#include "server/loop/server_metrics.h"
#include "server/shard/shard.h"
#include "server/sparse/sparse_table.h"
#include "server/testing/test_util.h"

namespace asyncps::server {
namespace {

using testing::Floats;
using testing::Keys;
using testing::ShardHarness;
using testing::SmallLayout;
using testing::SmallModel;

TableSpec Emb(uint32_t dim = 4) {
  TableSpec t;
  t.name = "emb";
  t.dim = dim;
  t.init = InitKind::kUniform;
  t.init_param = 0.1f;
  t.seed = 3;
  t.optimizer.kind = RowOptimizerKind::kSgd;
  t.optimizer.lr = 0.5f;
  return t;
}

std::vector<float> Init(const TableSpec& t, uint64_t key) {
  std::vector<float> v(t.dim);
  InitializeRow(t, key, v.data());
  return v;
}

std::vector<float> Init(const std::vector<uint64_t>& keys) {
  std::vector<float> v;
  for (uint64_t k : keys) {
    const std::vector<float> r = Init(Emb(), k);
    v.insert(v.end(), r.begin(), r.end());
  }
  return v;
}

struct Sparse : ShardHarness {
  explicit Sparse(ShardOptions o, Store* store = nullptr,
                  std::vector<TableSpec> tables = {Emb()})
      : ShardHarness(o, store), tables(std::move(tables)) {
    RequestHeader r = Register(0, SmallModel(), SmallLayout(o.num_shards));
    r.tables = this->tables;
    ReplyHeader h = Call(r);
    EXPECT_TRUE(h.status.ok()) << h.status.ToString();
  }
  // A push of rows of table 0 (plus, optionally, one dense chunk).
  ReplyHeader PushRows(int rank, int64_t clock,
                       const std::vector<uint64_t>& keys,
                       const std::vector<float>& grads, uint8_t codec = 0,
                       bool with_chunk = false, uint64_t id = 0,
                       uint64_t done_below = 0, uint32_t table = 0) {
    std::vector<ByteView> data;
    RequestHeader r;
    if (with_chunk) {
      const uint32_t c = FirstChunk();
      data.push_back(Floats(std::vector<float>(ChunkElems(c), 1.0f)));
      r = Push(rank, clock, {c}, data);
    } else {
      r = Push(rank, clock, {}, {});
    }
    data.push_back(Keys(keys));
    if (codec == 0) {
      data.push_back(Floats(grads));
    } else {
      auto c = compression::CreateCodec(
          compression::CodecSpec{static_cast<compression::CodecId>(codec)});
      std::vector<uint8_t> p;
      EXPECT_TRUE((*c)->Encode(grads.data(), grads.size(), 0, &p).ok());
      BufferPtr b = Buffer::FromVector(std::move(p));
      data.push_back(ByteView{b->data(), b->size(), b});
    }
    RowsRef ref;
    ref.table = table;
    ref.keys_frame = static_cast<uint32_t>(data.size() - 1);
    ref.rows_frame = static_cast<uint32_t>(data.size());
    ref.num_keys = keys.size();
    ref.codec = codec;
    r.rows = {ref};
    r.id = id;
    r.done_below = done_below;
    return Call(r, data);
  }
  RequestHeader PullRows(int rank, int64_t clock,
                         const std::vector<uint64_t>& keys, uint8_t codec = 0,
                         bool dense = false, uint32_t table = 0) {
    RequestHeader r = Pull(rank, clock);
    r.pull_dense = dense;
    RowsRef ref;
    ref.table = table;
    ref.keys_frame = 1;
    ref.num_keys = keys.size();
    ref.codec = codec;
    r.rows = {ref};
    return r;
  }
  // Rows of a pull answered now.
  std::vector<float> Read(int rank, int64_t clock,
                          const std::vector<uint64_t>& keys,
                          uint32_t table = 0) {
    auto out = Send(PullRows(rank, clock, keys, 0, false, table), {Keys(keys)});
    EXPECT_EQ(out.size(), 1u);
    if (out.empty()) return {};
    return RowsOf(out[0]);
  }
  static std::vector<float> RowsOf(const OutgoingReply& r) {
    EXPECT_TRUE(r.header.status.ok()) << r.header.status.ToString();
    EXPECT_EQ(r.header.rows.size(), 1u);
    if (r.header.rows.empty()) return {};
    const ByteView& f = r.frames[r.header.rows[0].rows_frame - 1];
    std::vector<float> v(f.size / 4);
    std::memcpy(v.data(), f.data, f.size);
    return v;
  }
  std::vector<TableSpec> tables;
};

ShardOptions Opts(Consistency c = Consistency::kAsp, int workers = 1) {
  ShardOptions o;
  o.consistency = c;
  o.num_workers = workers;
  o.worker_timeout = std::chrono::milliseconds(0);
  return o;
}

TEST(ShardSparseTest, RowsAndChunksTravelInOnePushAndPull) {
  Sparse s(Opts());
  const TableSpec t = Emb();
  std::vector<uint64_t> keys = {5, 1ull << 40, 99};
  EXPECT_EQ(s.Read(0, 0, keys).size(), 12u);
  std::vector<float> g(12);
  for (int i = 0; i < 12; ++i) g[i] = 0.01f * i;
  const uint32_t chunk = s.FirstChunk();
  const std::vector<float> w0 = *s.shard->weights(chunk);
  ReplyHeader h = s.PushRows(0, 0, keys, g, 0, /*with_chunk=*/true);
  ASSERT_TRUE(h.status.ok()) << h.status.ToString();
  EXPECT_EQ(s.shard->shard_version(), 1u);
  // The chunk and the rows moved.
  EXPECT_NE(*s.shard->weights(chunk), w0);
  std::vector<float> got = s.Read(0, 1, keys);
  for (size_t k = 0; k < keys.size(); ++k) {
    std::vector<float> want = Init(t, keys[k]);
    for (int j = 0; j < 4; ++j) want[j] -= 0.5f * g[k * 4 + j];
    for (int j = 0; j < 4; ++j) EXPECT_EQ(got[k * 4 + j], want[j]);
  }
  // Unseen keys are their initial value; a dense+rows pull carries both.
  auto out = s.Send(s.PullRows(0, 1, {7}, 0, /*dense=*/true), {Keys({7})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].header.chunks.size(),
            s.shard->layout()->shard_chunks(0).size());
  EXPECT_EQ(Sparse::RowsOf(out[0]), Init(t, 7));
  // Sparse-only pushes count in the staleness histogram like dense ones.
  EXPECT_EQ(s.shard->staleness().count(), 1u);
  ASSERT_TRUE(s.PushRows(0, 1, {7}, {1, 1, 1, 1}).status.ok());
  EXPECT_EQ(s.shard->staleness().count(), 2u);
  std::string stats = s.shard->StatsJson();
  EXPECT_NE(stats.find("\"sparse\":{"), std::string::npos);
  EXPECT_NE(stats.find("\"name\":\"emb\""), std::string::npos);
}

TEST(ShardSparseTest, Fp16RowsBothWays) {
  Sparse s(Opts());
  std::vector<uint64_t> keys = {1, 2};
  std::vector<float> g = {0.5f, -0.25f, 1, 2, 0.125f, 4, -8, 0.0625f};
  ASSERT_TRUE(s.PushRows(0, 0, keys, g, /*fp16*/ 1).status.ok());
  auto out = s.Send(s.PullRows(0, 1, keys, /*fp16*/ 1), {Keys(keys)});
  ASSERT_EQ(out.size(), 1u);
  ASSERT_TRUE(out[0].header.status.ok());
  ASSERT_EQ(out[0].header.rows[0].codec, 1);
  const ByteView& f = out[0].frames[out[0].header.rows[0].rows_frame - 1];
  std::vector<float> got(8);
  ASSERT_TRUE(compression::CodecForId(compression::CodecId::kFp16)
                  .Decode(f.data, f.size, 8, got.data())
                  .ok());
  std::vector<float> exact = s.Read(0, 1, keys);
  for (int i = 0; i < 8; ++i)
    EXPECT_NEAR(got[i], exact[i], 1e-3 * std::max(1.0f, std::abs(exact[i])));
  // The gradients were exact in fp16: the rows equal an fp32 push's.
  for (int k = 0; k < 2; ++k) {
    std::vector<float> want = Init(Emb(), keys[k]);
    for (int j = 0; j < 4; ++j)
      EXPECT_EQ(exact[k * 4 + j], want[j] - 0.5f * g[k * 4 + j]);
  }
}

class SparseBadInputTest : public ::testing::Test {
 protected:
  SparseBadInputTest() : s(Opts2()) {
    for (uint64_t k = 0; mine.size() < 8 || theirs.empty(); ++k)
      (ShardOfKey(Emb(), k, 2) == 1 ? mine : theirs).push_back(k);
    before = s.Read(0, 0, {mine.begin(), mine.begin() + 6});
    chunk_before = *s.shard->weights(s.FirstChunk());
  }
  static ShardOptions Opts2() {
    ShardOptions o = Opts();
    o.shard_id = 1;
    o.num_shards = 2;
    o.sparse.max_keys_per_request = 6;
    return o;
  }
  void ExpectRejected(const ReplyHeader& h, const std::string& text,
                      RejectReason reason) {
    EXPECT_FALSE(h.status.ok());
    EXPECT_NE(h.status.message().find(text), std::string::npos)
        << h.status.ToString();
    EXPECT_GE(s.shard->counters().rejected[static_cast<size_t>(reason)], 1u)
        << h.status.ToString();
    // Nothing changed: rows, the chunk pushed with them, the version.
    EXPECT_EQ(s.Read(0, 0, {mine.begin(), mine.begin() + 6}),
              std::vector<float>(before.begin(), before.begin() + 24));
    EXPECT_EQ(*s.shard->weights(s.FirstChunk()), chunk_before);
    EXPECT_EQ(s.shard->shard_version(), 0u);
  }
  std::vector<float> Grads(size_t n, float v = 0.5f) {
    return std::vector<float>(n * 4, v);
  }
  Sparse s;
  std::vector<uint64_t> mine, theirs;
  std::vector<float> before, chunk_before;
};

TEST_F(SparseBadInputTest, UnknownTable) {
  RequestHeader r = s.Push(0, 0, {}, {});
  r.rows = {{3, 1, 2, 2, 0}};
  ExpectRejected(s.Call(r, {Keys({mine[0], mine[1]}), Floats(Grads(2))}),
                 "unknown table 3", RejectReason::kUnknownChunk);
}

TEST_F(SparseBadInputTest, WrongRowDimension) {
  // Rows of 3 floats for a table of 4.
  RequestHeader r = s.Push(0, 0, {}, {});
  r.rows = {{0, 1, 2, 2, 0}};
  ExpectRejected(s.Call(r, {Keys({mine[0], mine[1]}),
                            Floats(std::vector<float>(6, 0.5f))}),
                 "expected 2 rows of 4 floats", RejectReason::kSizeMismatch);
  // A keys frame that disagrees with num_keys.
  r.rows = {{0, 1, 2, 3, 0}};
  ExpectRejected(s.Call(r, {Keys({mine[0], mine[1]}), Floats(Grads(3))}),
                 "keys frame of 16 bytes for 3 keys",
                 RejectReason::kSizeMismatch);
}

TEST_F(SparseBadInputTest, DuplicateKeysInOnePush) {
  ExpectRejected(s.PushRows(0, 0, {mine[0], mine[1], mine[0]}, Grads(3), 0,
                            /*with_chunk=*/true),
                 "appears twice", RejectReason::kOther);
  // The same table twice in one push.
  RequestHeader r = s.Push(0, 0, {}, {});
  r.rows = {{0, 1, 2, 1, 0}, {0, 3, 4, 1, 0}};
  ExpectRejected(s.Call(r, {Keys({mine[0]}), Floats(Grads(1)), Keys({mine[1]}),
                            Floats(Grads(1))}),
                 "named twice", RejectReason::kOther);
}

TEST_F(SparseBadInputTest, KeysOwnedByAnotherShard) {
  ExpectRejected(s.PushRows(0, 0, {mine[0], theirs[0]}, Grads(2), 0, true),
                 "belongs to shard 0, not 1", RejectReason::kWrongShard);
  auto out = s.Send(s.PullRows(0, 0, {theirs[0]}), {Keys({theirs[0]})});
  EXPECT_NE(out[0].header.status.message().find("belongs to shard 0"),
            std::string::npos);
}

TEST_F(SparseBadInputTest, NanAndInfRows) {
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    std::vector<float> g = Grads(3);
    g[9] = bad;
    ExpectRejected(s.PushRows(0, 0, {mine[0], mine[1], mine[2]}, g, 0, true),
                   "key " + std::to_string(mine[2]) + " contains NaN or Inf",
                   RejectReason::kNonFinite);
  }
  // NaN inside an fp16 payload too.
  std::vector<float> g = Grads(2);
  g[0] = NAN;
  ExpectRejected(s.PushRows(0, 0, {mine[0], mine[1]}, g, 1, true), "NaN",
                 RejectReason::kNonFinite);
}

TEST_F(SparseBadInputTest, MoreKeysThanTheLimit) {
  ExpectRejected(
      s.PushRows(0, 0, {mine.begin(), mine.begin() + 7}, Grads(7), 0, true),
      "more than the 6 one request may name", RejectReason::kOversize);
  std::vector<uint64_t> seven(mine.begin(), mine.begin() + 7);
  auto out = s.Send(s.PullRows(0, 0, seven), {Keys(seven)});
  EXPECT_NE(out[0].header.status.message().find("split it"), std::string::npos);
}

TEST_F(SparseBadInputTest, FramesThatDoNotAddUp) {
  RequestHeader r = s.Push(0, 0, {}, {});
  r.rows = {{0, 1, 2, 1, 0}};
  ExpectRejected(s.Call(r, {Keys({mine[0]})}), "row refs (2 frames each)",
                 RejectReason::kSizeMismatch);
  r.rows = {{0, 1, 1, 1, 0}};
  ExpectRejected(s.Call(r, {Keys({mine[0]}), Floats(Grads(1))}),
                 "referenced twice", RejectReason::kSizeMismatch);
  r.rows = {{0, 0, 2, 1, 0}};
  ExpectRejected(s.Call(r, {Keys({mine[0]}), Floats(Grads(1))}), "out of range",
                 RejectReason::kSizeMismatch);
  // A sparse codec (top-k) for rows.
  r.rows = {{0, 1, 2, 1, 7}};
  ExpectRejected(s.Call(r, {Keys({mine[0]}), Floats(Grads(1))}), "dense codec",
                 RejectReason::kBadCodec);
  // Huge counts are refused before anything is allocated.
  r.rows = {{0, 1, 2, uint64_t{1} << 60, 0}};
  ExpectRejected(s.Call(r, {Keys({mine[0]}), Floats(Grads(1))}), "split it",
                 RejectReason::kOversize);
}

TEST(ShardSparseTest, MismatchingTableDefinitionIsRejected) {
  Sparse s(Opts());
  RequestHeader r = s.Register(0, SmallModel(), SmallLayout(1));
  r.tables = {Emb()};
  EXPECT_TRUE(s.Call(r).status.ok());  // idempotent
  r.tables[0].optimizer.kind = RowOptimizerKind::kAdaGrad;
  ReplyHeader h = s.Call(r);
  EXPECT_EQ(h.status.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(h.status.message().find("table 'emb' (index 0) does not match"),
            std::string::npos)
      << h.status.ToString();
  r.tables = {};
  h = s.Call(r);
  EXPECT_NE(h.status.message().find("(missing)"), std::string::npos);
  EXPECT_EQ(
      s.shard->counters()
          .rejected[static_cast<size_t>(RejectReason::kRegistrationMismatch)],
      2u);
  // An invalid definition at first registration.
  ShardHarness fresh(Opts());
  RequestHeader bad = fresh.Register(0, SmallModel(), SmallLayout(1));
  bad.tables = {Emb()};
  bad.tables[0].dim = 0;
  h = fresh.Call(bad);
  EXPECT_FALSE(h.status.ok());
  EXPECT_NE(h.status.message().find("dim 0"), std::string::npos);
  EXPECT_FALSE(fresh.shard->registered());
}

// SSP with bound 1: a pull of rows at clock c waits until every worker's
// clock is >= c - 1, and then holds every push of steps < c - 1.
TEST(ShardSparseTest, SspBoundHoldsForSparsePulls) {
  ShardOptions o = Opts(Consistency::kSsp, 2);
  o.staleness = 1;
  Sparse s(o);
  const std::vector<uint64_t> key = {11};
  const std::vector<float> one = {1, 1, 1, 1};
  // Worker 1 pushes step 0 and reaches clock 1; worker 0 races ahead.
  for (int64_t c = 0; c < 3; ++c) {
    ASSERT_TRUE(s.PushRows(0, c, key, one).status.ok());
    s.Call(s.Clock(0, c + 1));
  }
  ASSERT_TRUE(s.PushRows(1, 0, key, one).status.ok());
  s.Call(s.Clock(1, 1));
  // Worker 0 at clock 3 may not see rows older than clock 2 from anyone:
  // worker 1 is at 1 < 3 - 1, so the pull parks.
  auto out = s.Send(s.PullRows(0, 3, key), {Keys(key)});
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(s.shard->num_parked(), 1u);
  // Worker 1's step 1 arrives, then its clock 2: the pull is answered with
  // every push of steps < 2 (3 of worker 0, 2 of worker 1).
  ASSERT_TRUE(s.PushRows(1, 1, key, one).status.ok());
  out = s.Send(s.Clock(1, 2));
  ASSERT_EQ(out.size(), 2u);
  const OutgoingReply& pull = out[1];
  std::vector<float> want = Init(Emb(), 11);
  for (int push = 0; push < 5; ++push) {
    for (float& v : want) v -= 0.5f * 1.0f;
  }
  EXPECT_EQ(Sparse::RowsOf(pull), want);
  EXPECT_GE(pull.header.min_clock, 2);
}

TEST(ShardSparseTest, BspAppliesTheRowsOfARoundOnce) {
  Sparse s(Opts(Consistency::kBsp, 2));
  ASSERT_TRUE(s.PushRows(0, 0, {1, 2}, {1, 1, 1, 1, 2, 2, 2, 2}).status.ok());
  ASSERT_TRUE(s.PushRows(1, 0, {2, 3}, {4, 4, 4, 4, 6, 6, 6, 6}).status.ok());
  // Not applied before the round closes.
  EXPECT_EQ(s.Read(0, 0, {2}), Init(Emb(), 2));
  s.Call(s.Clock(0, 1));
  s.Call(s.Clock(1, 1));
  EXPECT_EQ(s.shard->bsp_round(), 1);
  auto row = [](uint64_t k, float g) {
    std::vector<float> v = Init(Emb(), k);
    for (float& x : v) x -= 0.5f * g;
    return v;
  };
  EXPECT_EQ(s.Read(0, 1, {1}), row(1, 0.5f));  // (1 + 0) / 2 pushes
  EXPECT_EQ(s.Read(0, 1, {2}), row(2, 3.0f));  // (2 + 4) / 2
  EXPECT_EQ(s.Read(0, 1, {3}), row(3, 3.0f));  // (0 + 6) / 2
  EXPECT_EQ(s.shard->shard_version(), 1u);
}

// The sums of a BSP round grow with every key pushed: they come from the
// memory budget, reserved before anything of the push (its chunk included)
// is applied or counted.
TEST(ShardSparseTest, BspRoundSumsComeFromTheBudget) {
  ShardOptions o = Opts(Consistency::kBsp, 1);
  o.memory_budget_bytes = 4 << 20;
  o.sparse.cache_bytes = 64 << 10;
  MemStore store;
  Sparse s(o, &store);
  std::vector<uint64_t> many(60000);
  for (size_t i = 0; i < many.size(); ++i) many[i] = i;
  ReplyHeader r =
      s.PushRows(0, 0, many, std::vector<float>(many.size() * 4, 1.0f), 0,
                 /*with_chunk=*/true);
  EXPECT_EQ(r.status.code(), StatusCode::kResourceExhausted)
      << r.status.ToString();
  EXPECT_NE(r.status.message().find("BSP sums"), std::string::npos)
      << r.status.ToString();
  EXPECT_EQ(s.shard->counters().pushes, 0u);
  // A push that fits is the round's only contribution.
  const uint32_t chunk = s.FirstChunk();
  const std::vector<float> w0 = *s.shard->weights(chunk);
  ASSERT_TRUE(s.PushRows(0, 0, {1, 2}, std::vector<float>(8, 1.0f), 0, true)
                  .status.ok());
  s.Call(s.Clock(0, 1));
  ASSERT_EQ(s.shard->bsp_round(), 1);
  EXPECT_EQ(s.shard->shard_version(), 1u);
  std::vector<float> once = Init(Emb(), 7);
  EXPECT_EQ(s.Read(0, 1, {7}), once);  // in the refused push only
  std::vector<float> row1 = Init(Emb(), 1);
  for (float& x : row1) x -= 0.5f;
  EXPECT_EQ(s.Read(0, 1, {1}), row1);
  EXPECT_NE(*s.shard->weights(chunk), w0);
}

TEST(ShardSparseTest, DurableRowsSurviveARestartCheckpointedOnesToo) {
  for (bool durable : {false, true}) {
    MemStore store;
    ShardOptions o = Opts();
    o.durable = durable;
    o.sparse.cache_bytes = 1024;  // a few rows: evictions write back
    std::vector<uint64_t> keys;
    for (uint64_t k = 0; k < 64; ++k) keys.push_back(k * 1000003);
    std::vector<float> g(64 * 4, 0.25f);
    std::vector<float> at_checkpoint, last;
    {
      Sparse s(o, &store);
      ASSERT_TRUE(s.PushRows(0, 0, keys, g).status.ok());
      ASSERT_TRUE(s.shard->Checkpoint().ok());
      at_checkpoint = s.Read(0, 1, keys);
      ASSERT_TRUE(s.PushRows(0, 1, keys, g).status.ok());
      last = s.Read(0, 2, keys);
      EXPECT_NE(last, at_checkpoint);
    }
    store.Reopen();  // kill -9: nothing else written
    Sparse again(o, &store);
    EXPECT_EQ(again.Read(0, 2, keys), durable ? last : at_checkpoint)
        << "durable " << durable;
  }
}

}  // namespace
}  // namespace asyncps::server

namespace asyncps::server {
namespace {

// A store that fails while rows are written: the push gets an error, and
// its rows are not left pinned (they are evicted once writes work again).
TEST(ShardSparseTest, FailedWritesLeaveNoRowPinned) {
  MemStore store;
  ShardOptions o = Opts();
  o.durable = true;
  o.sparse.cache_bytes = 4096;
  Sparse s(o, &store);
  auto keys = [](uint64_t from, uint64_t n) {
    std::vector<uint64_t> k;
    for (uint64_t i = 0; i < n; ++i) k.push_back((from + i) * 7919);
    return k;
  };
  std::vector<float> g(64 * 4, 0.5f);
  store.FailWrites(true);
  // The durable write fails: rows stay dirty, unpinned.
  EXPECT_FALSE(s.PushRows(0, 0, keys(0, 64), g).status.ok());
  // Evicting those dirty rows fails: this push's rows must not stay pinned.
  EXPECT_FALSE(s.PushRows(0, 1, keys(1000, 64), g).status.ok());
  store.FailWrites(false);
  ASSERT_TRUE(s.shard->Checkpoint().ok());
  for (int i = 0; i < 4; ++i)
    ASSERT_TRUE(s.PushRows(0, 2 + i, keys(5000 + 64 * i, 64), g).status.ok());
  // Only the last push's rows (pinned while it ran) may exceed the budget;
  // rows left pinned by the failed push would still be here.
  EXPECT_LE(s.shard->sparse_tables()->table(0).cache_rows(), 64u);
}

}  // namespace
}  // namespace asyncps::server

namespace asyncps::server {
namespace {

// Hostile row refs: valid pushes and pulls of rows with one random mutation
// (table, frame index, count, codec, frame size, a repeated key, NaN, huge
// counts) never crash the shard, and a push changes rows only when it is
// accepted whole.
// Some of the keys 0..7, at least one.
std::vector<uint64_t> SomeKeys(std::mt19937_64& rng) {
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 8; ++k) {
    if (rng() % 2) keys.push_back(k);
  }
  if (keys.empty()) keys.push_back(rng() % 8);
  return keys;
}

// Mutation `how` (0..4; others: none) of a rows ref: its table, frames,
// key count or codec.
void MutateRef(std::mt19937_64& rng, int how, RowsRef* ref) {
  switch (how) {
    case 0:
      ref->table = 1 + rng() % 5;
      break;
    case 1:
      ref->keys_frame = static_cast<uint32_t>(rng() % 4);
      break;
    case 2:
      ref->rows_frame = static_cast<uint32_t>(rng() % 4);
      break;
    case 3:
      ref->num_keys = rng() % 2 ? rng() : ref->num_keys + 1;
      break;
    case 4:
      ref->codec = static_cast<uint8_t>(1 + rng() % 12);
      break;
    default:
      break;
  }
}

TEST(ShardSparseTest, MutatedRowRefsNeverCrashOrHalfApply) {
  Sparse s(Opts());
  std::mt19937_64 rng(99);
  std::vector<uint64_t> probe = {0, 1, 2, 3, 4, 5, 6, 7};
  int applied = 0, rejected = 0;
  for (int it = 0; it < 3000; ++it) {
    const bool push = rng() % 3 != 0;
    std::vector<uint64_t> keys = SomeKeys(rng);
    std::vector<float> rows(keys.size() * 4);
    for (float& x : rows) x = 0.001f * static_cast<float>(rng() % 100);
    RequestHeader r = push ? s.Push(0, it, {}, {}) : s.PullRows(0, it, keys);
    std::vector<ByteView> data = {Keys(keys)};
    RowsRef ref;
    ref.keys_frame = 1;
    ref.num_keys = keys.size();
    if (push) {
      data.push_back(Floats(rows));
      ref.rows_frame = 2;
    }
    const bool mutate = rng() % 4 != 0;
    if (mutate) {
      const int how = static_cast<int>(rng() % 9);
      MutateRef(rng, how, &ref);
      switch (how) {
        case 5:
          data.push_back(Floats({1.0f}));
          break;  // a frame too many
        case 6:   // a repeated key
          keys.push_back(keys[0]);
          rows.resize(keys.size() * 4, 0.5f);
          data[0] = Keys(keys);
          if (push) data[1] = Floats(rows);
          ref.num_keys = keys.size();
          break;
        case 7:  // NaN (pushes), or a truncated keys frame
          if (push) {
            rows[rng() % rows.size()] = NAN;
            data[1] = Floats(rows);
          } else {
            data[0].size -= 1 + rng() % 8;
          }
          break;
        case 8:
          ref.rows_frame = ref.keys_frame;
          break;
      }
    }
    r.rows = {ref};
    const std::vector<float> before = s.Read(0, it, probe);
    auto out = s.Send(r, data);
    ASSERT_EQ(out.size(), 1u);
    const bool ok = out[0].header.status.ok();
    // A codec byte of 0..2 may still make a valid payload-less request
    // fail; a valid request with no mutation always succeeds.
    if (!mutate) {
      EXPECT_TRUE(ok) << out[0].header.status.ToString();
    }
    if (ok && push) ++applied;
    if (!ok) {
      ++rejected;
      EXPECT_EQ(s.Read(0, it, probe), before) << "iteration " << it;
      EXPECT_TRUE(out[0].frames.empty());
    }
  }
  EXPECT_GT(applied, 300);
  EXPECT_GT(rejected, 1000);
}

}  // namespace
}  // namespace asyncps::server

namespace asyncps::server {
namespace {

// Exact de-duplication covers rows as it covers chunks (issue 13 item 1
// after the merge of issues 12 and 13): a push with rows is applied once,
// whatever resends and late copies follow, also across a restart.
std::vector<float> MinusOnce(std::vector<float> v, float step) {
  for (float& x : v) x -= step;
  return v;
}

// A write-back of evicted dirty rows that fails keeps them in the cache: no
// acknowledged row is lost, the push that needed the room is applied whole
// (in memory, not acknowledged: Unavailable, the shard degraded), and once
// the repair checkpoint has stored everything its resend is acknowledged as
// a duplicate: applied exactly once.
TEST(ShardSparseTest, FailedWriteBackOfEvictedRowsLosesNothing) {
  MemStore store;
  ShardOptions o = Opts();
  o.sparse.cache_bytes = 16 << 10;  // about 300 rows of 4 floats
  Sparse s(o, &store);
  auto keys = [](uint64_t from, uint64_t n) {
    std::vector<uint64_t> k;
    for (uint64_t i = 0; i < n; ++i) k.push_back((from + i) * 6151);
    return k;
  };
  const std::vector<float> g(200 * 4, 0.5f);
  const std::vector<uint64_t> a = keys(0, 200), b = keys(5000, 200);
  const std::vector<float> acked = MinusOnce(s.Read(0, 0, a), 0.25f);
  const std::vector<float> b_once = MinusOnce(s.Read(0, 0, b), 0.25f);
  ASSERT_TRUE(s.PushRows(0, 0, a, g).status.ok());
  ASSERT_EQ(s.Read(0, 0, a), acked);
  store.FailWrites(true);
  for (int i = 0; i < 2; ++i) {  // the push, then its resend
    ReplyHeader r = s.PushRows(0, 0, b, g, 0, false, /*id=*/77);
    EXPECT_EQ(r.status.code(), StatusCode::kUnavailable) << r.status.ToString();
  }
  EXPECT_TRUE(s.shard->degraded());
  store.FailWrites(false);
  std::vector<OutgoingReply> out;
  s.now += std::chrono::seconds(10);
  s.shard->Tick(s.now, &out);
  ASSERT_FALSE(s.shard->degraded());
  EXPECT_EQ(s.Read(0, 0, a), acked);
  ASSERT_TRUE(s.PushRows(0, 0, b, g, 0, false, 77).status.ok());
  EXPECT_EQ(s.Read(0, 0, b), b_once);
  store.Reopen();
  Sparse again(o, &store);
  EXPECT_EQ(again.Read(0, 0, a), acked);
  EXPECT_EQ(again.Read(0, 0, b), b_once);
}

// A store read that fails in the middle of a push (its rows span three
// slices, most of them only in the store) leaves nothing of the push
// applied: not the slices read before the failure, not its dense chunk.
// The push is refused as retryable, not recorded, so its resend (same id)
// is applied, once; and no row stays held in the cache.
TEST(ShardSparseTest, FailedReadMidPushAppliesNothing) {
  MemStore store;
  ShardOptions o = Opts();
  o.sparse.cache_bytes = 64 << 10;
  Sparse s(o, &store);
  std::vector<uint64_t> keys(3 * sparse::SparseTable::kSliceKeys - 100);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i * 7919 + 1;
  const std::vector<float> g(keys.size() * 4, 0.5f);
  ASSERT_TRUE(s.PushRows(0, 0, keys, g).status.ok());  // rows into the store
  const std::vector<float> before = s.Read(0, 0, keys);
  ASSERT_EQ(before, MinusOnce(Init(keys), 0.25f));
  const uint32_t chunk = s.FirstChunk();
  const std::vector<float> w0 = *s.shard->weights(chunk);
  const uint64_t version = s.shard->shard_version();

  store.FailReadsAfter(1);
  ReplyHeader r = s.PushRows(0, 1, keys, g, 0, /*with_chunk=*/true, /*id=*/9);
  EXPECT_EQ(r.status.code(), StatusCode::kUnavailable) << r.status.ToString();
  EXPECT_NE(r.status.message().find("nothing of it was applied"),
            std::string::npos)
      << r.status.ToString();
  store.FailReadsAfter(-1);
  EXPECT_FALSE(s.shard->degraded());
  EXPECT_EQ(s.shard->shard_version(), version);
  EXPECT_EQ(*s.shard->weights(chunk), w0);
  EXPECT_EQ(s.Read(0, 1, keys), before);
  // Nothing held: reading other rows evicts the push's rows down to what
  // the budget holds (the index keeps its capacity, so count rows).
  std::vector<uint64_t> other(2000);
  for (size_t i = 0; i < other.size(); ++i) other[i] = i * 7919 + 2;
  s.Read(0, 1, other);
  const sparse::SparseTable& t = s.shard->sparse_tables()->table(0);
  EXPECT_LE(t.cache_rows() * t.entry_bytes(), o.sparse.cache_bytes);

  // The resend is applied, whole and once.
  ASSERT_TRUE(s.PushRows(0, 1, keys, g, 0, true, 9).status.ok());
  ASSERT_TRUE(s.PushRows(0, 1, keys, g, 0, true, 9).status.ok());
  EXPECT_EQ(s.Read(0, 1, keys), MinusOnce(before, 0.25f));
  EXPECT_NE(*s.shard->weights(chunk), w0);
  EXPECT_EQ(s.shard->shard_version(), version + 1);
}

// BSP: when the rows of a round cannot be read, nothing of the round is
// applied (its sums are kept, its pulls wait) and the shard applies it,
// once, at a Tick after the store reads again.
TEST(ShardSparseTest, FailedReadOfABspRoundIsRetriedWhole) {
  MemStore store;
  ShardOptions o = Opts(Consistency::kBsp, 1);
  o.sparse.cache_bytes = 64 << 10;
  Sparse s(o, &store);
  std::vector<uint64_t> keys(2 * sparse::SparseTable::kSliceKeys + 100);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i * 7919 + 1;
  const std::vector<float> g(keys.size() * 4, 0.5f);
  ASSERT_TRUE(s.PushRows(0, 0, keys, g).status.ok());
  s.Call(s.Clock(0, 1));
  ASSERT_EQ(s.shard->bsp_round(), 1);
  const std::vector<float> before = s.Read(0, 1, keys);
  ASSERT_EQ(before, MinusOnce(Init(keys), 0.25f));

  ASSERT_TRUE(s.PushRows(0, 1, keys, g, 0, /*with_chunk=*/true).status.ok());
  const uint32_t chunk = s.FirstChunk();
  const std::vector<float> w0 = *s.shard->weights(chunk);
  store.FailReadsAfter(1);
  s.Call(s.Clock(0, 2));
  EXPECT_EQ(s.shard->bsp_round(), 1);  // not applied
  std::vector<OutgoingReply> out;
  s.now += std::chrono::seconds(1);
  s.shard->Tick(s.now, &out);  // still failing
  EXPECT_EQ(s.shard->bsp_round(), 1);
  store.FailReadsAfter(-1);
  EXPECT_EQ(*s.shard->weights(chunk), w0);
  EXPECT_EQ(s.Read(0, 1, keys), before);
  s.now += std::chrono::seconds(1);
  s.shard->Tick(s.now, &out);
  ASSERT_EQ(s.shard->bsp_round(), 2);
  EXPECT_EQ(s.Read(0, 2, keys), MinusOnce(before, 0.25f));
  EXPECT_NE(*s.shard->weights(chunk), w0);
  s.now += std::chrono::seconds(1);
  s.shard->Tick(s.now, &out);  // applied once
  EXPECT_EQ(s.Read(0, 2, keys), MinusOnce(before, 0.25f));
}

// Without a store the cache is all the shard has: pushes of ever new keys
// stop at its budget (ResourceExhausted, nothing applied) instead of growing
// the shard without limit; rows it holds still take pushes.
TEST(ShardSparseTest, MemoryOnlyTablesStopAtTheCacheBudget) {
  ShardOptions o = Opts();
  o.sparse.cache_bytes = 64 << 10;
  Sparse s(o);  // no store
  const std::vector<float> g(64 * 4, 0.5f);
  std::vector<uint64_t> first;
  int accepted = 0;
  ReplyHeader r;
  for (uint64_t b = 0; b < 100; ++b) {
    std::vector<uint64_t> keys;
    for (uint64_t i = 0; i < 64; ++i) keys.push_back(b * 64 + i);
    r = s.PushRows(0, 0, keys, g);
    if (!r.status.ok()) break;
    if (first.empty()) first = keys;
    ++accepted;
  }
  EXPECT_EQ(r.status.code(), StatusCode::kResourceExhausted)
      << r.status.ToString();
  EXPECT_GT(accepted, 5);
  EXPECT_LE(s.shard->sparse_tables()->cache_bytes(), o.sparse.cache_bytes);
  const std::vector<float> held = s.Read(0, 0, first);
  ASSERT_TRUE(s.PushRows(0, 0, first, g).status.ok());
  EXPECT_EQ(s.Read(0, 0, first), MinusOnce(held, 0.25f));
}

TEST(ShardSparseDedupTest, ResentAndLateRowPushesAreAppliedOnce) {
  Sparse s(Opts());
  const std::vector<uint64_t> keys = {3, 1ull << 33, 77};
  const std::vector<float> g(keys.size() * 4, 0.25f);
  const std::vector<float> before = s.Read(0, 0, keys);
  ASSERT_TRUE(s.PushRows(0, 0, keys, g, 0, false, /*id=*/10).status.ok());
  const std::vector<float> once = s.Read(0, 0, keys);
  EXPECT_EQ(once, MinusOnce(before, 0.5f * 0.25f));  // SGD, lr 0.5
  // A resend (same id) and another arrival of it: acknowledged, not applied.
  for (int i = 0; i < 2; ++i) {
    ReplyHeader r = s.PushRows(0, 0, keys, g, 0, false, 10);
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  }
  EXPECT_EQ(s.Read(0, 0, keys), once);
  EXPECT_EQ(s.shard->counters().duplicate_pushes, 2u);
  // A push the client has finished with (below done_below) is never applied.
  ASSERT_TRUE(
      s.PushRows(0, 0, keys, g, 0, false, 13, /*done_below=*/13).status.ok());
  const std::vector<float> twice = s.Read(0, 0, keys);
  EXPECT_EQ(twice, MinusOnce(once, 0.5f * 0.25f));
  ASSERT_TRUE(s.PushRows(0, 0, keys, g, 0, false, 12).status.ok());
  EXPECT_EQ(s.Read(0, 0, keys), twice);
  EXPECT_EQ(s.shard->counters().duplicate_pushes, 3u);
}

TEST(ShardSparseDedupTest, AckedRowPushIsAppliedOnceAfterARestart) {
  // Durable: every acknowledged push; checkpointed: what the checkpoint
  // holds. Either way a resend after the restart is a duplicate.
  for (bool durable : {true, false}) {
    MemStore store;
    ShardOptions o = Opts();
    o.durable = durable;
    o.sparse.cache_bytes = 1024;  // evictions write rows back meanwhile
    std::vector<uint64_t> keys;
    for (uint64_t k = 0; k < 40; ++k) keys.push_back(k * 104729 + 1);
    const std::vector<float> g(keys.size() * 4, 0.125f);
    std::vector<float> acked;
    {
      Sparse s(o, &store);
      ASSERT_TRUE(s.PushRows(0, 0, keys, g, 0, false, 10).status.ok());
      ASSERT_TRUE(s.PushRows(0, 0, keys, g, 0, false, 11).status.ok());
      if (!durable) {
        ASSERT_TRUE(s.shard->Checkpoint().ok());
      }
      acked = s.Read(0, 0, keys);
    }
    store.Reopen();  // kill -9
    Sparse again(o, &store);
    ASSERT_EQ(again.Read(0, 0, keys), acked) << "durable " << durable;
    for (uint64_t id : {11, 10}) {
      ReplyHeader r = again.PushRows(0, 0, keys, g, 0, false, id);
      ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    }
    EXPECT_EQ(again.Read(0, 0, keys), acked) << "durable " << durable;
    EXPECT_EQ(again.shard->counters().duplicate_pushes, 2u);
  }
}

TEST(ShardSparseDedupTest, RowPushWhoseWriteFailedIsAckedOnlyOnceStored) {
  MemStore store;
  ShardOptions o = Opts();
  o.durable = true;
  const std::vector<uint64_t> keys = {8, 9, 10, 11};
  const std::vector<float> g(keys.size() * 4, 0.5f);
  Sparse s(o, &store);
  const std::vector<float> before = s.Read(0, 0, keys);
  store.FailWrites(true);
  ReplyHeader r = s.PushRows(0, 0, keys, g, 0, false, 20);
  EXPECT_EQ(r.status.code(), StatusCode::kUnavailable) << r.status.ToString();
  // Retries while nothing can be stored: no acknowledgement.
  r = s.PushRows(0, 0, keys, g, 0, false, 20);
  EXPECT_EQ(r.status.code(), StatusCode::kUnavailable) << r.status.ToString();
  EXPECT_TRUE(s.shard->degraded());
  std::vector<OutgoingReply> out;
  store.FailWrites(false);
  s.now += std::chrono::seconds(10);
  s.shard->Tick(s.now, &out);  // the repair checkpoint stores the rows
  ASSERT_FALSE(s.shard->degraded());
  r = s.PushRows(0, 0, keys, g, 0, false, 20);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  const std::vector<float> once = MinusOnce(before, 0.5f * 0.5f);
  EXPECT_EQ(s.Read(0, 0, keys), once);
  store.Reopen();
  Sparse again(o, &store);
  EXPECT_EQ(again.Read(0, 0, keys), once);
  ASSERT_TRUE(again.PushRows(0, 0, keys, g, 0, false, 20).status.ok());
  EXPECT_EQ(again.Read(0, 0, keys), once);
}

}  // namespace
}  // namespace asyncps::server

namespace asyncps::server {
namespace {

double Sample(const std::string& text, const std::string& series) {
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::atof(text.c_str() + at + series.size() + 2);
}

// The shard's metrics carry each table's counters and RocksDB's own
// figures (a real RocksDB in a temporary folder).
TEST(ShardSparseTest, MetricsFollowTheTablesAndRocksDb) {
  char tmpl[] = "/tmp/asyncps_sparse_metrics_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  {
    RocksDbStoreOptions so;
    so.path = dir + "/db";
    auto store = OpenRocksDbStore(so);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    ShardOptions o = Opts();
    o.durable = true;
    o.sparse.cache_bytes = 1024;  // a few rows: evictions write back
    Sparse s(o, store->get());
    std::vector<uint64_t> keys;
    for (uint64_t k = 0; k < 64; ++k) keys.push_back(k * 1000003);
    std::vector<float> g(64 * 4, 0.25f);
    ASSERT_TRUE(s.PushRows(0, 0, keys, g).status.ok());
    ASSERT_TRUE(s.PushRows(0, 1, keys, g).status.ok());
    EXPECT_EQ(s.Read(0, 2, keys).size(), 64u * 4);
    ASSERT_TRUE(s.shard->Checkpoint().ok());

    metrics::Registry registry;
    ServerMetricsOptions mo;
    mo.publish_every = std::chrono::milliseconds(0);
    ServerMetrics m(&registry, 1, mo);
    m.Publish(*s.shard, s.now);
    const std::string text = registry.Render();
    const sparse::SparseTable& t = s.shard->sparse_tables()->table(0);
    const sparse::TableCounters& c = t.counters();
    const std::string emb = "{table=\"emb\"}";
    EXPECT_EQ(c.rows_pushed, 128u);
    EXPECT_EQ(Sample(text, "asyncps_shard_table_pushed_rows_total" + emb), 128);
    EXPECT_EQ(Sample(text, "asyncps_shard_table_pulled_rows_total" + emb), 64);
    EXPECT_GT(c.evictions, 0u);
    EXPECT_EQ(Sample(text, "asyncps_shard_table_evictions_total" + emb),
              static_cast<double>(c.evictions));
    EXPECT_EQ(Sample(text, "asyncps_shard_table_cache_hits_total" + emb) +
                  Sample(text, "asyncps_shard_table_cache_misses_total" + emb),
              static_cast<double>(c.hits + c.misses));
    EXPECT_EQ(Sample(text, "asyncps_shard_table_cache_rows" + emb),
              static_cast<double>(t.cache_rows()));
    EXPECT_EQ(Sample(text, "asyncps_shard_row_cache_budget_bytes"), 1024);
    // RocksDB's own counters: the durable pushes went through its WAL.
    const StoreStats st = (*store)->GetStoreStats();
    EXPECT_GT(st.bytes_written, 64u * 4 * 4);
    EXPECT_GT(st.wal_bytes, 0u);
    EXPECT_EQ(Sample(text, "asyncps_shard_rocksdb_written_bytes_total"),
              static_cast<double>(st.bytes_written));
    EXPECT_EQ(Sample(text, "asyncps_shard_rocksdb_wal_bytes_total"),
              static_cast<double>(st.wal_bytes));
    EXPECT_GE(Sample(text, "asyncps_shard_rocksdb_memtable_bytes"), 0);
    EXPECT_GE(
        Sample(text, "asyncps_shard_rocksdb_compaction_write_bytes_total"), 0);
  }
  std::filesystem::remove_all(dir);
}

// Issue 22 item 2: an upload (kAssign) sets rows with fresh optimizer state;
// a hostile row refuses the whole request, its chunk included.
TEST(ShardSparseTest, AssignSetsRowsAndRefusesHostileRowsWhole) {
  Sparse s(testing::TestOptions(Consistency::kAsp));
  std::vector<uint64_t> mine, theirs;
  for (uint64_t k = 1; mine.size() < 2 || theirs.empty(); ++k)
    (ShardOfKey(Emb(), k, 2) == 0 ? mine : theirs).push_back(k);
  RequestHeader begin;
  begin.kind = RequestKind::kAssign;
  begin.rank = 0;
  begin.incarnation = 7;
  begin.assign_upload = 5;
  ASSERT_TRUE(s.Call(begin).created);
  const uint32_t c = s.FirstChunk();
  // Chunk values `v`, then rows of `keys` with values `rows`.
  auto values = [&](float v, const std::vector<uint64_t>& keys,
                    const std::vector<float>& rows) {
    RequestHeader r = begin;
    r.assign_phase = AssignOp::kValues;
    std::vector<ByteView> data = {
        Floats(std::vector<float>(s.ChunkElems(c), v)), Keys(keys),
        Floats(rows)};
    ChunkRef ref;
    ref.chunk = c;
    ref.frame = 1;
    ref.num_elems = s.ChunkElems(c);
    ref.byte_size = data[0].size;
    r.chunks = {ref};
    RowsRef rr;
    rr.keys_frame = 2;
    rr.rows_frame = 3;
    rr.num_keys = keys.size();
    r.rows = {rr};
    return s.Call(r, data);
  };
  ASSERT_TRUE(values(2.0f, mine, std::vector<float>(8, 7.0f)).status.ok());
  EXPECT_EQ((*s.shard->weights(c))[0], 2.0f);
  EXPECT_EQ(s.Read(0, 0, mine), std::vector<float>(8, 7.0f));
  const auto before = s.AllWeights();
  std::vector<float> nan_row(8, 1.0f);
  nan_row[5] = std::numeric_limits<float>::quiet_NaN();
  for (const auto& [keys, rows] :
       std::vector<std::pair<std::vector<uint64_t>, std::vector<float>>>{
           {{mine[0], theirs[0]}, std::vector<float>(8, 3.0f)},  // not ours
           {{mine[0], mine[0]}, std::vector<float>(8, 3.0f)},    // repeated
           {mine, nan_row},                                      // NaN
           {mine, std::vector<float>(5, 3.0f)}}) {               // short
    EXPECT_FALSE(values(3.0f, keys, rows).status.ok());
    EXPECT_EQ(s.AllWeights(), before);
    EXPECT_EQ(s.Read(0, 0, mine), std::vector<float>(8, 7.0f));
  }
  // The rows train from the uploaded values (SGD lr 0.5).
  ASSERT_TRUE(
      s.PushRows(0, 0, {mine[0]}, std::vector<float>(4, 1.0f)).status.ok());
  EXPECT_EQ(s.Read(0, 1, {mine[0]}), std::vector<float>(4, 6.5f));
}

// Issue 22 item 4: rows with their optimizer state read (kAssign phase 3
// naming rows) and restored (phase 5); a hostile record refuses the whole
// request and changes no row.
// A phase 3 read of the row records of `keys` of table 0 (rank 0).
std::vector<OutgoingReply> ReadRecords(Sparse& s,
                                       const std::vector<uint64_t>& keys) {
  RequestHeader r;
  r.kind = RequestKind::kAssign;
  r.rank = 0;
  r.assign_upload = 1;
  r.assign_phase = AssignOp::kRead;
  RowsRef ref;
  ref.keys_frame = 1;
  ref.num_keys = keys.size();
  r.rows = {ref};
  return s.Send(r, {Keys(keys)});
}

// Rank 0 (incarnation 7) claims the upload 5 of `s` (a restore: overwrite).
RequestHeader Claim(Sparse& s) {
  RequestHeader begin;
  begin.kind = RequestKind::kAssign;
  begin.rank = 0;
  begin.incarnation = 7;
  begin.assign_upload = 5;
  begin.assign_overwrite = true;
  EXPECT_TRUE(s.Call(begin).created);
  begin.assign_overwrite = false;
  return begin;
}

struct RowRecord {
  uint64_t steps = 0;
  std::vector<float> floats;  // weights[dim], state[dim x k]
  bool operator==(const RowRecord& o) const {
    return steps == o.steps && floats == o.floats;
  }
};

ByteView Records(const std::vector<RowRecord>& recs) {
  std::string b;
  for (const RowRecord& r : recs) {
    b.append(reinterpret_cast<const char*>(&r.steps), sizeof(r.steps));
    b.append(reinterpret_cast<const char*>(r.floats.data()),
             r.floats.size() * sizeof(float));
  }
  auto buf = Buffer::FromVector(std::vector<uint8_t>(b.begin(), b.end()));
  return ByteView{buf->data(), buf->size(), buf};
}

TEST(ShardSparseTest, RowRecordsCarryTheOptimizerStateBothWays) {
  TableSpec t = Emb();
  t.optimizer.kind = RowOptimizerKind::kAdaGrad;
  t.optimizer.lr = 0.5f;
  TableSpec side = Emb(2);
  side.name = "side";
  Sparse s(testing::TestOptions(Consistency::kAsp), nullptr, {t, side});
  std::vector<uint64_t> mine, theirs;
  for (uint64_t k = 1; mine.size() < 2 || theirs.empty(); ++k)
    (ShardOfKey(t, k, 2) == 0 ? mine : theirs).push_back(k);
  const size_t floats = 4 + 4;  // weights, AdaGrad's sums
  auto read = [&](const std::vector<uint64_t>& keys, ReplyHeader* status) {
    auto out = ReadRecords(s, keys);
    std::vector<RowRecord> recs;
    EXPECT_EQ(out.size(), 1u);
    if (out.empty()) return recs;
    *status = out[0].header;
    if (!out[0].header.status.ok()) return recs;
    EXPECT_EQ(out[0].header.rows.size(), 1u);
    const ByteView& f = out[0].frames[out[0].header.rows[0].rows_frame - 1];
    EXPECT_EQ(f.size, keys.size() * (8 + floats * 4));
    for (size_t i = 0; i < keys.size(); ++i) {
      RowRecord rec;
      rec.floats.resize(floats);
      const uint8_t* p = f.data + i * (8 + floats * 4);
      std::memcpy(&rec.steps, p, 8);
      std::memcpy(rec.floats.data(), p + 8, floats * 4);
      recs.push_back(rec);
    }
    return recs;
  };
  ReplyHeader st;
  // A pushed row (sum g^2 = 4, one step) and one never pushed.
  ASSERT_TRUE(
      s.PushRows(0, 0, {mine[0]}, std::vector<float>(4, 2.0f)).status.ok());
  std::vector<RowRecord> got = read(mine, &st);
  ASSERT_TRUE(st.status.ok()) << st.status.ToString();
  EXPECT_EQ(got[0].steps, 1u);
  EXPECT_EQ(
      std::vector<float>(got[0].floats.begin(), got[0].floats.begin() + 4),
      s.Read(0, 1, {mine[0]}));
  EXPECT_EQ(std::vector<float>(got[0].floats.begin() + 4, got[0].floats.end()),
            std::vector<float>(4, 4.0f));
  RowRecord fresh{0, Init(t, mine[1])};
  fresh.floats.resize(floats, 0.0f);
  EXPECT_EQ(got[1], fresh);
  // Reads are checked like pulls: a key of another shard, a repeat.
  read({mine[0], theirs[0]}, &st);
  EXPECT_EQ(st.status.code(), StatusCode::kInvalidArgument);
  read({mine[0], mine[0]}, &st);
  EXPECT_EQ(st.status.code(), StatusCode::kInvalidArgument);

  // Phase 5: the claimant sets rows with their state and steps.
  RequestHeader begin = Claim(s);
  RowRecord saved{7, {1, 2, 3, 4, 0.25f, 0.5f, 1, 0}};
  auto write = [&](RequestHeader r, const std::vector<uint64_t>& keys,
                   const std::vector<RowRecord>& recs) {
    r.assign_phase = AssignOp::kRows;
    if (r.assign_optimizer.empty()) r.assign_optimizer = "adagrad";
    RowsRef ref;
    ref.keys_frame = 1;
    ref.rows_frame = 2;
    ref.num_keys = keys.size();
    if (r.rows.empty()) r.rows = {ref};
    return s.Call(r, {Keys(keys), Records(recs)});
  };
  ASSERT_TRUE(write(begin, mine, {saved, saved}).status.ok());
  got = read(mine, &st);
  EXPECT_EQ(got, (std::vector<RowRecord>{saved, saved}));
  // Training goes on from the restored sums and steps.
  ASSERT_TRUE(
      s.PushRows(0, 0, {mine[0]}, std::vector<float>(4, 1.0f)).status.ok());
  got = read({mine[0]}, &st);
  EXPECT_EQ(got[0].steps, 8u);
  EXPECT_EQ(std::vector<float>(got[0].floats.begin() + 4, got[0].floats.end()),
            (std::vector<float>{1.25f, 1.5f, 2, 1}));

  // Hostile records: refused whole, no row changes.
  const std::vector<RowRecord> before = read(mine, &st);
  auto nan = saved, negative = saved, steps = saved, nan_weight = saved;
  nan.floats[5] = std::numeric_limits<float>::quiet_NaN();
  negative.floats[6] = -1.0f;
  steps.steps = (uint64_t{1} << 53) + 1;
  nan_weight.floats[0] = std::numeric_limits<float>::infinity();
  RequestHeader adam = begin, codec = begin, unknown = begin, chunk = begin,
                other = begin;
  adam.assign_optimizer = "adam";
  other.assign_upload = 6;  // without the claim
  for (RequestHeader* r : {&codec, &unknown}) {
    RowsRef ref;
    ref.keys_frame = 1;
    ref.rows_frame = 2;
    ref.num_keys = 2;
    ref.codec = r == &codec ? 1 : 0;
    ref.table = r == &unknown ? 7 : 0;
    r->rows = {ref};
  }
  chunk.chunks.resize(1);
  struct Case {
    RequestHeader req;
    std::vector<uint64_t> keys;
    std::vector<RowRecord> recs;
    StatusCode code;
  };
  const RowRecord short_rec{7, {1, 2, 3, 4, 0.25f, 0.5f, 1}};
  for (const Case& c : std::vector<Case>{
           {adam, mine, {saved, saved}, StatusCode::kInvalidArgument},
           {begin, mine, {saved, nan}, StatusCode::kInvalidArgument},
           {begin, mine, {negative, saved}, StatusCode::kInvalidArgument},
           {begin, mine, {saved, steps}, StatusCode::kInvalidArgument},
           {begin, mine, {saved, nan_weight}, StatusCode::kInvalidArgument},
           {begin, mine, {saved, short_rec}, StatusCode::kInvalidArgument},
           {begin,
            {mine[0], theirs[0]},
            {saved, saved},
            StatusCode::kInvalidArgument},
           {begin,
            {mine[0], mine[0]},
            {saved, saved},
            StatusCode::kInvalidArgument},
           {codec, mine, {saved, saved}, StatusCode::kInvalidArgument},
           {unknown, mine, {saved, saved}, StatusCode::kNotFound},
           {chunk, mine, {saved, saved}, StatusCode::kInvalidArgument},
           {other, mine, {saved, saved}, StatusCode::kFailedPrecondition}}) {
    const Status got_status = write(c.req, c.keys, c.recs).status;
    EXPECT_EQ(got_status.code(), c.code) << got_status.ToString();
    EXPECT_EQ(read(mine, &st), before) << got_status.ToString();
  }
  EXPECT_NE(write(adam, mine, {saved, saved})
                .status.message()
                .find("saved from 'adam', the table runs 'adagrad'"),
            std::string::npos);
}

// Hostile reads (phase 3) and writes (phase 5) of row records, mutated at
// random: a shard never crashes, a refused write changes no row, and an
// accepted one reads back byte for byte.
TEST(ShardSparseTest, MutatedRowRecordsNeverCrashOrHalfApply) {
  TableSpec t = Emb();
  t.optimizer.kind = RowOptimizerKind::kAdam;  // [m | v], v >= 0
  Sparse s(Opts(), nullptr, {t});
  constexpr size_t kRecord = 8 + 4 * (4 + 8);
  std::mt19937_64 rng(7);
  const std::vector<uint64_t> probe = {0, 1, 2, 3, 4, 5, 6, 7};
  const RequestHeader begin = Claim(s);
  // The records of `keys` as a phase 3 read answers them (empty: refused).
  auto read = [&](const std::vector<uint64_t>& keys) {
    auto out = ReadRecords(s, keys);
    std::vector<uint8_t> b;
    if (out.size() == 1 && out[0].header.status.ok()) {
      const ByteView& f = out[0].frames[out[0].header.rows[0].rows_frame - 1];
      b.assign(f.data, f.data + f.size);
    }
    return b;
  };
  int written = 0, refused = 0;
  for (int it = 0; it < 3000; ++it) {
    const bool write = rng() % 3 != 0;
    std::vector<uint64_t> keys = SomeKeys(rng);
    std::vector<uint8_t> records(keys.size() * kRecord);
    for (size_t i = 0; i < keys.size(); ++i) {
      const uint64_t steps = rng() % 1000;
      std::memcpy(&records[i * kRecord], &steps, 8);
      for (size_t j = 0; j < 12; ++j) {
        const float v = 0.01f * static_cast<float>(rng() % 100);
        std::memcpy(&records[i * kRecord + 8 + 4 * j], &v, 4);
      }
    }
    RequestHeader r = begin;
    r.assign_phase = write ? AssignOp::kRows : AssignOp::kRead;
    r.assign_optimizer = "adam";
    RowsRef ref;
    ref.keys_frame = 1;
    ref.num_keys = keys.size();
    if (write) ref.rows_frame = 2;
    const bool mutate = rng() % 4 != 0;
    int how = mutate ? static_cast<int>(rng() % 11) : -1;
    MutateRef(rng, how, &ref);
    switch (how) {
      case 5:
        keys.push_back(keys[0]);
        records.resize(keys.size() * kRecord);
        ref.num_keys = keys.size();
        break;  // a repeated key
      case 6:   // any byte: NaN, a negative second moment, 2^56 steps, ...
        for (int n = 0; n < 3; ++n) records[rng() % records.size()] = rng();
        break;
      case 7:
        records.pop_back();
        break;
      case 8:
        r.assign_optimizer = rng() % 2 ? "adagrad" : "";
        break;
      case 9:
        r.chunks.resize(1);
        break;
      case 10:
        r.assign_upload = 6;
        break;  // not the claimant
    }
    r.rows = {ref};
    std::vector<ByteView> data = {Keys(keys)};
    if (write) {
      auto buf = Buffer::FromVector(std::vector<uint8_t>(records));
      data.push_back(ByteView{buf->data(), buf->size(), buf});
    }
    if (how == 9) data.push_back(Floats({1.0f}));
    const std::vector<uint8_t> before = read(probe);
    auto out = s.Send(r, data);
    ASSERT_EQ(out.size(), 1u);
    const bool ok = out[0].header.status.ok();
    if (!mutate) {
      EXPECT_TRUE(ok) << out[0].header.status.ToString();
    }
    if (!ok || !write) {
      refused += ok ? 0 : 1;
      EXPECT_EQ(read(probe), before) << "iteration " << it;
      if (!ok) {
        EXPECT_TRUE(out[0].frames.empty());
      } else {
        EXPECT_EQ(out[0].frames[0].size, keys.size() * kRecord);
      }
      continue;
    }
    ++written;
    EXPECT_EQ(read(keys), records) << "iteration " << it;
  }
  EXPECT_GT(written, 500);
  EXPECT_GT(refused, 1000);
}

// Issue 22 item 4: a paged scan (kAssign phase 6) returns every entry a
// shard holds -- rows and admission counters, with steps and last-push
// clocks, expired ones left out -- and saved rows (phase 7) restore them on
// a fresh shard so that both train on bitwise equal; hostile scans and
// hostile saved records are refused and change nothing.
struct Saved {
  std::vector<uint64_t> keys;
  std::vector<uint8_t> records;
  bool operator==(const Saved& o) const {
    return keys == o.keys && records == o.records;
  }
};

ReplyHeader ScanPage(Sparse& s, uint64_t from, uint32_t max, Saved* out,
                     uint32_t table = 0, std::vector<ByteView> data = {}) {
  auto got = s.Send(testing::ScanRequest(table, from, max), std::move(data));
  EXPECT_EQ(got.size(), 1u);
  if (got.empty()) return ReplyHeader{};
  const OutgoingReply& reply = got[0];
  if (!reply.header.status.ok()) return reply.header;
  EXPECT_EQ(reply.header.rows.size(), 1u);
  const RowsRef& rows = reply.header.rows[0];
  const ByteView& k = reply.frames[rows.keys_frame - 1];
  const ByteView& v = reply.frames[rows.rows_frame - 1];
  EXPECT_EQ(k.size, rows.num_keys * 8);
  const size_t at = out->keys.size();
  out->keys.resize(at + rows.num_keys);
  // An empty page has no frame data (null pointers, size 0).
  if (k.size > 0) std::memcpy(out->keys.data() + at, k.data, k.size);
  if (v.size > 0)
    out->records.insert(out->records.end(), v.data, v.data + v.size);
  return reply.header;
}

// Every entry of table `table`, in pages of `page`.
Saved ScanAll(Sparse& s, uint32_t page, uint32_t table = 0) {
  Saved all;
  uint64_t from = 0;
  for (;;) {
    const size_t before = all.keys.size();
    ReplyHeader h = ScanPage(s, from, page, &all, table);
    EXPECT_TRUE(h.status.ok()) << h.status.ToString();
    if (!h.status.ok() || all.keys.size() - before < page) break;
    from = all.keys.back() + 1;
  }
  return all;
}

ReplyHeader WriteSaved(Sparse& s, RequestHeader claim, const Saved& saved,
                       const std::string& optimizer = "adagrad") {
  claim.assign_phase = AssignOp::kSaved;
  claim.assign_optimizer = optimizer;
  RowsRef ref;
  ref.keys_frame = 1;
  ref.rows_frame = 2;
  ref.num_keys = saved.keys.size();
  claim.rows = {ref};
  auto rb = Buffer::FromVector(std::vector<uint8_t>(saved.records));
  return s.Call(claim,
                {Keys(saved.keys), ByteView{rb->data(), rb->size(), rb}});
}

TEST(ShardSparseTest, ScannedEntriesRestoreATableExactly) {
  TableSpec t = Emb();
  t.optimizer.kind = RowOptimizerKind::kAdaGrad;
  t.optimizer.lr = 0.5f;
  t.admit_after_pushes = 3;
  t.expire_after_clocks = 4;
  const ShardOptions o = testing::TestOptions(Consistency::kAsp, 1);
  Sparse a(o, nullptr, {t});
  // Hashed 64-bit keys this shard (0 of 2) owns.
  std::vector<uint64_t> keys;
  for (uint64_t i = 1; keys.size() < 6; ++i) {
    const uint64_t k = i * 0x9e3779b97f4a7c15ULL;
    if (ShardOfKey(t, k, 2) == 0) keys.push_back(k);
  }
  auto push = [&](Sparse& s, int64_t clock, std::vector<uint64_t> ks, float g) {
    std::vector<float> grads(ks.size() * 4, g);
    ReplyHeader h = s.PushRows(0, clock, ks, grads);
    EXPECT_TRUE(h.status.ok()) << h.status.ToString();
  };
  // keys[0..1]: rows (3 pushes); keys[2]: a counter of 2; keys[3]: a
  // counter of 1 that expires; keys[4]: a row that expires.
  push(a, 0, {keys[0], keys[1], keys[2], keys[3], keys[4]}, 1.0f);
  push(a, 0, {keys[0], keys[1], keys[4]}, 2.0f);
  push(a, 0, {keys[4]}, 0.5f);  // keys[4] admitted at clock 0
  for (int64_t c = 1; c <= 3; ++c) a.Call(ShardHarness::Clock(0, c));
  push(a, 3, {keys[0], keys[1], keys[2]}, 3.0f);
  a.Call(ShardHarness::Clock(0, 6));  // keys[3], keys[4] expire (6 - 0 > 4)
  const Saved all = ScanAll(a, 100);
  std::vector<uint64_t> live = {keys[0], keys[1], keys[2]};
  std::sort(live.begin(), live.end());
  EXPECT_EQ(all.keys, live);
  const size_t bytes = SavedRecordBytes(t);
  ASSERT_EQ(all.records.size(), 3 * bytes);
  for (size_t i = 0; i < 3; ++i) {
    uint32_t kind;
    uint64_t count;
    int64_t clock;
    std::memcpy(&kind, &all.records[i * bytes], 4);
    std::memcpy(&count, &all.records[i * bytes + 8], 8);
    std::memcpy(&clock, &all.records[i * bytes + 16], 8);
    EXPECT_EQ(clock, 3);
    if (all.keys[i] == keys[2]) {
      EXPECT_EQ(kind, kSavedCounter);
      EXPECT_EQ(count, 2u);
    } else {
      EXPECT_EQ(kind, kSavedRow);
      EXPECT_EQ(count, 1u);  // admitted on the third push, pushed once more
    }
  }
  // Pages of one entry give the same.
  EXPECT_EQ(ScanAll(a, 1), all);

  // Hostile scans.
  Saved none;
  EXPECT_EQ(ScanPage(a, 0, 0, &none).status.code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ScanPage(a, 0, 1u << 30, &none).status.code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ScanPage(a, 0, 10, &none, 9).status.code(), StatusCode::kNotFound);
  EXPECT_EQ(ScanPage(a, 0, 10, &none, 0, {Keys({1})}).status.code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(ScanPage(a, ~uint64_t{0}, 10, &none).status.ok());
  EXPECT_TRUE(none.keys.empty());

  // A fresh shard at the same clock, restored from the scan.
  Sparse b(o, nullptr, {t});
  for (int64_t c = 1; c <= 6; ++c) b.Call(ShardHarness::Clock(0, c));
  RequestHeader claim = Claim(b);
  // Hostile saved records: refused whole, nothing written.
  auto mutated = [&](size_t offset, const void* v, size_t n) {
    Saved m = all;
    std::memcpy(&m.records[offset], v, n);
    return m;
  };
  const uint32_t bad_kind = 3, one = 1;
  const uint64_t zero = 0, three = 3;
  const int64_t far = int64_t{1} << 60;
  const size_t counter = static_cast<size_t>(
      std::find(all.keys.begin(), all.keys.end(), keys[2]) - all.keys.begin());
  Saved short_records = all;
  short_records.records.resize(all.records.size() - 4);
  for (const Saved& bad : {mutated(0, &bad_kind, 4), mutated(4, &one, 4),
                           mutated(counter * bytes + 8, &zero, 8),
                           mutated(counter * bytes + 8, &three, 8),
                           mutated(16, &far, 8), short_records}) {
    EXPECT_EQ(WriteSaved(b, claim, bad).status.code(),
              StatusCode::kInvalidArgument);
    EXPECT_TRUE(ScanAll(b, 100).keys.empty());
  }
  EXPECT_EQ(WriteSaved(b, claim, all, "adam").status.code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(WriteSaved(b, claim, all).status.ok());
  EXPECT_EQ(ScanAll(b, 100), all);
  // Both train on: the counter admits its row, the rows step on, an expired
  // key starts again from its initial value; all bitwise equal.
  for (Sparse* s : {&a, &b}) {
    push(*s, 6, {keys[0], keys[2], keys[3], keys[4]}, 0.75f);
    push(*s, 6, {keys[1], keys[2], keys[4]}, -1.5f);
  }
  EXPECT_EQ(ScanAll(b, 100), ScanAll(a, 100));
  EXPECT_EQ(b.Read(0, 7, keys), a.Read(0, 7, keys));
}

// A page of a point-in-time scan: `open` starts one (the harness's clock
// moved past the shard's interval between opens first), else `*snapshot`
// names it; the reply's id goes to *snapshot.
ReplyHeader SnapshotPage(Sparse& s, uint64_t from, uint32_t max, Saved* out,
                         uint64_t* snapshot, bool open, uint32_t table = 0) {
  if (open) s.now += std::chrono::milliseconds(60);
  RequestHeader r = testing::ScanRequest(table, from, max);
  r.assign_open_snapshot = open;
  r.assign_snapshot = open ? 0 : *snapshot;
  auto got = s.Send(r);
  EXPECT_EQ(got.size(), 1u);
  if (got.empty()) return ReplyHeader{};
  const OutgoingReply& reply = got[0];
  if (!reply.header.status.ok()) return reply.header;
  *snapshot = reply.header.scan_snapshot;
  const RowsRef& rows = reply.header.rows.at(0);
  const ByteView& k = reply.frames[rows.keys_frame - 1];
  const ByteView& v = reply.frames[rows.rows_frame - 1];
  const size_t at = out->keys.size();
  out->keys.resize(at + rows.num_keys);
  if (k.size > 0) std::memcpy(out->keys.data() + at, k.data, k.size);
  if (v.size > 0)
    out->records.insert(out->records.end(), v.data, v.data + v.size);
  return reply.header;
}

// Issue 22 item 4: a point-in-time scan (Assign.openSnapshot) reads every
// page from the table as it stood at its first page, whatever is pushed
// between pages -- updated rows, new keys before and after the cursor,
// admitted counters -- with a store (the shard checkpoints, then takes the
// store's snapshot; a small cache, so most rows live only in the store) and
// without (a copy charged to the budget). A plain scan meanwhile sees the
// pushes. The snapshot is dropped after its last page, when idle, and is
// bounded in number; hostile pages are refused.
TEST(ShardSparseTest, PointInTimeScanSeesTheTableAsItWasOpened) {
  for (bool with_store : {true, false}) {
    SCOPED_TRACE(with_store ? "with a store" : "without a store");
    TableSpec t = Emb();
    t.admit_after_pushes = 2;
    ShardOptions o = testing::TestOptions(Consistency::kAsp, 1);
    o.scan_snapshot_idle = std::chrono::seconds(5);
    if (with_store) o.sparse.cache_bytes = 16 << 10;
    MemStore store;
    Sparse a(o, with_store ? &store : nullptr, {t});
    std::vector<uint64_t> keys;
    for (uint64_t i = 1; keys.size() < 400; ++i) {
      const uint64_t k = i * 0x9e3779b97f4a7c15ULL;
      if (ShardOfKey(t, k, 2) == 0) keys.push_back(k);
    }
    auto push = [&](int64_t clock, const std::vector<uint64_t>& ks, float g) {
      std::vector<float> grads(ks.size() * 4, g);
      ReplyHeader h = a.PushRows(0, clock, ks, grads);
      ASSERT_TRUE(h.status.ok()) << h.status.ToString();
    };
    // keys[0..300): rows; keys[300..350): counters of 1; the rest unseen.
    const std::vector<uint64_t> rows(keys.begin(), keys.begin() + 300);
    push(0, rows, 1.0f);
    push(0, rows, 0.5f);
    push(0, std::vector<uint64_t>(keys.begin() + 300, keys.begin() + 350),
         1.0f);
    const Saved before = ScanAll(a, 1000);
    ASSERT_EQ(before.keys.size(), 350u);

    Saved got;
    uint64_t id = 0;
    ReplyHeader h = SnapshotPage(a, 0, 64, &got, &id, /*open=*/true);
    ASSERT_TRUE(h.status.ok()) << h.status.ToString();
    ASSERT_NE(id, 0u);
    // Pushes between pages: every row again, the counters admitted, new
    // keys everywhere in the key space.
    push(1, rows, 2.0f);
    push(1, std::vector<uint64_t>(keys.begin() + 300, keys.begin() + 400),
         1.0f);
    push(1, std::vector<uint64_t>(keys.begin() + 350, keys.begin() + 400),
         1.0f);
    const Saved after = ScanAll(a, 1000);
    ASSERT_EQ(after.keys.size(), 400u);
    for (;;) {
      const size_t n = got.keys.size();
      const uint64_t was = id;
      h = SnapshotPage(a, got.keys.back() + 1, 64, &got, &id, false);
      ASSERT_TRUE(h.status.ok()) << h.status.ToString();
      EXPECT_EQ(id, was);
      if (got.keys.size() - n < 64) break;
      push(2, rows, -1.0f);  // and more, while it pages
    }
    EXPECT_EQ(got, before);
    EXPECT_FALSE(ScanAll(a, 1000) == before);
    // The last page dropped it.
    Saved none;
    EXPECT_EQ(SnapshotPage(a, 0, 64, &none, &id, false).status.code(),
              StatusCode::kFailedPrecondition);

    // Idle past --scan_snapshot_idle_s: dropped at a Tick.
    ASSERT_TRUE(SnapshotPage(a, 0, 8, &none, &id, true).status.ok());
    std::vector<OutgoingReply> out;
    a.now += std::chrono::seconds(6);
    a.shard->Tick(a.now, &out);
    EXPECT_EQ(SnapshotPage(a, 9, 8, &none, &id, false).status.code(),
              StatusCode::kFailedPrecondition);
    // At most 4 open: a fifth is Unavailable; one finished makes room.
    std::vector<uint64_t> open(4, 0);
    for (uint64_t& s : open)
      ASSERT_TRUE(SnapshotPage(a, 0, 8, &none, &s, true).status.ok());
    uint64_t fifth = 0;
    EXPECT_EQ(SnapshotPage(a, 0, 8, &none, &fifth, true).status.code(),
              StatusCode::kUnavailable);
    EXPECT_EQ(std::set<uint64_t>(open.begin(), open.end()).size(), 4u);
    ASSERT_TRUE(
        SnapshotPage(a, ~uint64_t{0}, 8, &none, &open[0], false).status.ok());
    EXPECT_TRUE(SnapshotPage(a, 0, 8, &none, &fifth, true).status.ok());
    // One open per 50 ms: with room for one more, an open right after the
    // last is Unavailable (retry).
    ASSERT_TRUE(
        SnapshotPage(a, ~uint64_t{0}, 8, &none, &fifth, false).status.ok());
    RequestHeader again = testing::ScanRequest(0, 0, 8);
    again.assign_open_snapshot = true;
    {
      auto replies = a.Send(again);
      ASSERT_EQ(replies.size(), 1u);
      EXPECT_EQ(replies[0].header.status.code(), StatusCode::kUnavailable);
      EXPECT_EQ(replies[0].header.retry_ms, 50u);
      EXPECT_EQ(replies[0].header.scan_snapshot, 0u);
    }
    // Hostile pages: both open and named, an unknown id, an unknown table.
    RequestHeader both = testing::ScanRequest(0, 0, 8);
    both.assign_open_snapshot = true;
    both.assign_snapshot = open[1];
    EXPECT_EQ(a.Call(both).status.code(), StatusCode::kInvalidArgument);
    uint64_t unknown = open[1] ^ 0x5555;
    EXPECT_EQ(SnapshotPage(a, 0, 8, &none, &unknown, false).status.code(),
              StatusCode::kFailedPrecondition);
    EXPECT_EQ(SnapshotPage(a, 0, 8, &none, &open[2], false, 5).status.code(),
              StatusCode::kNotFound);
    // A page of 0 entries, or too many, opens nothing.
    uint64_t bad = 0;
    EXPECT_EQ(SnapshotPage(a, 0, 0, &none, &bad, true).status.code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(bad, 0u);
  }
}

// With RocksDB and expiring rows: rows live when a point-in-time scan was
// opened stay in it while the expiry clock moves on and compaction runs
// (the tables hold the store's expiry back while it is open: RocksDB's
// compaction filter does not spare snapshots); once it is closed, the
// expiry catches up.
TEST(ShardSparseTest, PointInTimeScanKeepsRowsThatExpireWhileItIsOpen) {
  char tmpl[] = "/tmp/asyncps_pit_expiry_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  TableSpec t = Emb();
  t.expire_after_clocks = 2;
  ShardOptions o = testing::TestOptions(Consistency::kAsp, 1);
  RocksDbStoreOptions so;
  so.path = dir + "/db";
  auto store = OpenRocksDbStore(so);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  {
    Sparse s(o, store->get(), {t});
    std::vector<uint64_t> keys;
    for (uint64_t i = 1; keys.size() < 100; ++i) {
      const uint64_t k = i * 0x9e3779b97f4a7c15ULL;
      if (ShardOfKey(t, k, 2) == 0) keys.push_back(k);
    }
    ASSERT_TRUE(
        s.PushRows(0, 0, keys, std::vector<float>(400, 1.0f)).status.ok());
    for (int64_t c = 1; c <= 2; ++c) s.Call(ShardHarness::Clock(0, c));
    Saved got;
    uint64_t id = 0;
    ASSERT_TRUE(SnapshotPage(s, 0, 10, &got, &id, true).status.ok());
    // The rows expire (clock 9 - 0 > 2); a checkpoint sets the store's
    // expiry, and compaction runs over every key space.
    for (int64_t c = 3; c <= 9; ++c) s.Call(ShardHarness::Clock(0, c));
    ASSERT_TRUE(s.shard->Checkpoint().ok());
    for (SpaceId sp = 1; sp <= 2; ++sp) (void)(*store)->CompactSpace(sp);
    EXPECT_TRUE(ScanAll(s, 1000).keys.empty());
    for (;;) {
      const size_t n = got.keys.size();
      ASSERT_TRUE(SnapshotPage(s, got.keys.back() + 1, 10, &got, &id, false)
                      .status.ok());
      if (got.keys.size() - n < 10) break;
    }
    std::sort(keys.begin(), keys.end());
    EXPECT_EQ(got.keys, keys);
    // Closed: the next checkpoint lets compaction drop them.
    ASSERT_TRUE(s.shard->Checkpoint().ok());
    for (SpaceId sp = 1; sp <= 2; ++sp) (void)(*store)->CompactSpace(sp);
    EXPECT_EQ((*store)->GetSpaceStats(1).estimated_keys +
                  (*store)->GetSpaceStats(2).estimated_keys,
              0u);
  }
  store->reset();
  std::filesystem::remove_all(dir);
}

// Without a store, a point-in-time scan copies the table: one that does not
// fit the memory budget is refused (ResourceExhausted) and opens nothing.
TEST(ShardSparseTest, PointInTimeScanCopyIsChargedToTheBudget) {
  TableSpec t = Emb(64);
  ShardOptions o = testing::TestOptions(Consistency::kAsp, 1);
  Sparse a(o, nullptr, {t});
  std::vector<uint64_t> keys;
  for (uint64_t i = 1; keys.size() < 2000; ++i) {
    const uint64_t k = i * 0x9e3779b97f4a7c15ULL;
    if (ShardOfKey(t, k, 2) == 0) keys.push_back(k);
  }
  ASSERT_TRUE(a.PushRows(0, 0, keys, std::vector<float>(keys.size() * 64, 1.0f))
                  .status.ok());
  const uint64_t copy = keys.size() * (8 + SavedRecordBytes(t));
  const uint64_t used = a.shard->budget().used();
  // Room for a page, not for the copy.
  ShardOptions tight = o;
  tight.memory_budget_bytes = used + copy / 2;
  Sparse b(tight, nullptr, {t});
  ASSERT_TRUE(b.PushRows(0, 0, keys, std::vector<float>(keys.size() * 64, 1.0f))
                  .status.ok());
  Saved none;
  uint64_t id = 0;
  const ReplyHeader h = SnapshotPage(b, 0, 16, &none, &id, true);
  EXPECT_EQ(h.status.code(), StatusCode::kResourceExhausted)
      << h.status.ToString();
  EXPECT_EQ(id, 0u);
  EXPECT_TRUE(none.keys.empty());
  // A plain page still fits; with room, the copy is made.
  Saved plain;
  EXPECT_TRUE(ScanPage(b, 0, 16, &plain).status.ok());
  EXPECT_TRUE(SnapshotPage(a, 0, 16, &none, &id, true).status.ok());
  EXPECT_NE(id, 0u);
}

// Issue 22: a clear (kAssign phase 8) drops every entry of a table on the
// shard -- cached, dirty, or evicted to RocksDB -- so saved entries restored
// after it leave the table equal to the save: ids pushed after the save are
// gone (read as their initial value), also after a restart from RocksDB;
// other tables keep theirs; hostile clears are refused and drop nothing.
ReplyHeader Clear(Sparse& s, RequestHeader claim, std::vector<RowsRef> refs,
                  std::vector<ByteView> data = {}) {
  claim.assign_phase = AssignOp::kClear;
  claim.rows = std::move(refs);
  return s.Call(claim, std::move(data));
}

RowsRef TableRef(uint32_t table) {
  RowsRef r;
  r.table = table;
  return r;
}

TEST(ShardSparseTest, ClearedTableHoldsExactlyTheRestoredEntries) {
  char tmpl[] = "/tmp/asyncps_sparse_clear_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  TableSpec t = Emb();
  t.optimizer.kind = RowOptimizerKind::kAdaGrad;
  t.admit_after_pushes = 2;
  TableSpec other = Emb(4);
  other.name = "other";
  ShardOptions o = Opts();
  o.sparse.cache_bytes = 2048;  // a few rows: most go to RocksDB
  auto keys_from = [](uint64_t first, size_t n) {
    std::vector<uint64_t> k;
    for (uint64_t i = 0; i < n; ++i)
      k.push_back((first + i) * 0x9e3779b97f4a7c15ULL);
    return k;
  };
  const std::vector<uint64_t> saved_keys = keys_from(1, 200);
  const std::vector<uint64_t> extra = keys_from(1000, 150);
  const std::vector<uint64_t> other_keys = keys_from(5000, 40);
  auto grads = [](size_t n, float g) { return std::vector<float>(n * 4, g); };
  Saved saved, other_before;
  std::vector<float> other_rows;
  RocksDbStoreOptions so;
  so.path = dir + "/db";
  {
    auto store = OpenRocksDbStore(so);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    Sparse s(o, store->get(), {t, other});
    // Rows of saved_keys (2 pushes: admitted), counters of half of extra.
    ASSERT_TRUE(s.PushRows(0, 0, saved_keys, grads(200, 1.0f)).status.ok());
    ASSERT_TRUE(s.PushRows(0, 0, saved_keys, grads(200, 0.5f)).status.ok());
    ASSERT_TRUE(s.shard->Checkpoint().ok());
    saved = ScanAll(s, 64);
    ASSERT_EQ(saved.keys.size(), 200u);
    // Trained on after the save: the saved rows step on, extra ids become
    // rows (the first 100) or admission counters, table 1 gets rows.
    std::vector<uint64_t> rows_extra(extra.begin(), extra.begin() + 100);
    ASSERT_TRUE(s.PushRows(0, 1, saved_keys, grads(200, 2.0f)).status.ok());
    ASSERT_TRUE(s.PushRows(0, 1, extra, grads(150, 1.0f)).status.ok());
    ASSERT_TRUE(s.PushRows(0, 1, rows_extra, grads(100, 1.0f)).status.ok());
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(
          s.PushRows(0, 1, other_keys, grads(40, 0.25f), 0, false, 0, 0, 1)
              .status.ok());
    }
    const Saved trained = ScanAll(s, 64);
    ASSERT_EQ(trained.keys.size(), 350u);
    EXPECT_GT(s.shard->sparse_tables()->table(0).counters().write_backs, 0u);
    other_before = ScanAll(s, 64, 1);
    other_rows = s.Read(0, 2, other_keys, 1);
    ASSERT_EQ(other_before.keys.size(), 40u);

    // Hostile clears: refused, nothing dropped.
    RequestHeader claim = Claim(s);
    RequestHeader stranger = claim;
    stranger.assign_upload = 6;
    RowsRef with_keys = TableRef(0);
    with_keys.num_keys = 1;
    RowsRef with_frame = TableRef(0);
    with_frame.keys_frame = 1;
    struct Bad {
      RequestHeader claim;
      std::vector<RowsRef> refs;
      std::vector<ByteView> data;
      StatusCode code;
    };
    const std::vector<Bad> bad = {
        {stranger, {TableRef(0)}, {}, StatusCode::kFailedPrecondition},
        {claim, {}, {}, StatusCode::kInvalidArgument},
        {claim, {TableRef(2)}, {}, StatusCode::kNotFound},
        {claim, {TableRef(0), TableRef(0)}, {}, StatusCode::kInvalidArgument},
        {claim,
         {TableRef(0), TableRef(1), TableRef(0)},
         {},
         StatusCode::kInvalidArgument},
        {claim, {TableRef(1), with_keys}, {}, StatusCode::kInvalidArgument},
        {claim, {with_frame}, {Keys({1})}, StatusCode::kInvalidArgument},
        {claim, {TableRef(0)}, {Keys({1})}, StatusCode::kInvalidArgument},
    };
    for (const Bad& b : bad) {
      EXPECT_EQ(Clear(s, b.claim, b.refs, b.data).status.code(), b.code);
      EXPECT_EQ(ScanAll(s, 64), trained);
      EXPECT_EQ(ScanAll(s, 64, 1), other_before);
    }
    // The clear: table 0 is empty, cached and stored; table 1 untouched.
    ASSERT_TRUE(Clear(s, claim, {TableRef(0)}).status.ok());
    EXPECT_TRUE(ScanAll(s, 64).keys.empty());
    EXPECT_EQ(s.shard->sparse_tables()->table(0).cache_rows(), 0u);
    EXPECT_EQ(s.Read(0, 2, extra), Init(extra));
    EXPECT_EQ(ScanAll(s, 64, 1), other_before);
    // Resent (idempotent), then the saved entries and the commit.
    ASSERT_TRUE(Clear(s, claim, {TableRef(0)}).status.ok());
    ASSERT_TRUE(WriteSaved(s, claim, saved).status.ok());
    RequestHeader commit = claim;
    commit.assign_phase = AssignOp::kCommit;
    ASSERT_TRUE(s.Call(commit).status.ok());
    EXPECT_EQ(ScanAll(s, 64), saved);
    EXPECT_EQ(ScanAll(s, 64, 1), other_before);
    ASSERT_TRUE(s.shard->Checkpoint().ok());
  }
  // Restarted from RocksDB: the dropped ids do not come back.
  auto store = OpenRocksDbStore(so);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  Sparse again(o, store->get(), {t, other});
  EXPECT_EQ(ScanAll(again, 64), saved);
  EXPECT_EQ(ScanAll(again, 7), saved);
  EXPECT_EQ(again.Read(0, 2, extra), Init(extra));
  EXPECT_EQ(again.Read(0, 2, other_keys, 1), other_rows);
  std::filesystem::remove_all(dir);
}

// Issue 22: a scan page is charged to the shard's memory budget -- its
// reply (keys and saved records) until the reply is gone, and the scan's
// scratch (the cached entries of the page) while it is gathered -- and a
// page the budget cannot hold is refused (ResourceExhausted) before
// anything is allocated; the budget is back where it was afterwards.
TEST(ShardSparseTest, ScanPagesAreChargedToTheMemoryBudget) {
  ShardOptions o = Opts();
  o.memory_budget_bytes = 2 << 20;
  o.sparse.cache_bytes = 256 << 10;
  Sparse s(o);
  std::vector<uint64_t> keys;
  for (uint64_t i = 1; i <= 100; ++i) keys.push_back(i * 0x9e3779b97f4a7c15ULL);
  ASSERT_TRUE(
      s.PushRows(0, 0, keys, std::vector<float>(400, 0.5f)).status.ok());
  const MemoryBudget& budget = s.shard->budget();
  const uint64_t base = budget.used();
  const uint64_t free = budget.capacity() - base;
  const uint64_t reply_per_entry = 8 + SavedRecordBytes(Emb());
  const uint64_t per_entry =
      reply_per_entry + sparse::SparseTable::scan_scratch_bytes(1);
  auto scan = [&](uint64_t max) {
    return s.Send(testing::ScanRequest(0, 0, static_cast<uint32_t>(max)), {});
  };
  // Too big for the reply alone, and for the reply with its scratch (the
  // reply alone would fit).
  for (uint64_t max : {free / reply_per_entry + 1,
                       free / ((reply_per_entry + per_entry) / 2)}) {
    ASSERT_GT(max * per_entry, free);
    auto got = scan(max);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].header.status.code(), StatusCode::kResourceExhausted)
        << max << " entries: " << got[0].header.status.ToString();
    EXPECT_EQ(budget.used(), base);
  }
  // A page that fits: its reply stays charged while it exists.
  const uint64_t max = free / per_entry;
  auto got = scan(max);
  ASSERT_EQ(got.size(), 1u);
  ASSERT_TRUE(got[0].header.status.ok()) << got[0].header.status.ToString();
  ASSERT_EQ(got[0].header.rows.size(), 1u);
  EXPECT_EQ(got[0].header.rows[0].num_keys, 100u);
  EXPECT_EQ(budget.used(), base + max * reply_per_entry);
  got.clear();
  EXPECT_EQ(budget.used(), base);
}

}  // namespace
}  // namespace asyncps::server
