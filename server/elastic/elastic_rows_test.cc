// Elastic shards, sparse tables: the rows of key-range buckets moved between
// in-process shards on RocksDB (kMigrate with buckets), bitwise equal to a
// fleet that never moved; stale rows requests refused with the document; a
// restart of the receiver keeps rows and owners; hostile bucket lists and
// documents change nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>

#include "common/elastic_doc.h"
#include "common/hash.h"
#include "server/elastic/elastic_doc.h"
#include "server/shard/shard.h"
#include "server/store/store.h"
#include "server/testing/test_util.h"
#include "tests/util/process.h"

namespace asyncps::server {
namespace {

using testing::Floats;
using testing::Keys;
using testing::ShardHarness;
using testing::SmallLayout;
using testing::SmallModel;

std::vector<TableSpec> Tables() {
  TableSpec emb;
  emb.name = "emb";
  emb.dim = 4;
  emb.init = InitKind::kUniform;
  emb.init_param = 0.1f;
  emb.seed = 5;
  emb.optimizer.kind = RowOptimizerKind::kAdaGrad;
  emb.optimizer.lr = 0.1f;
  TableSpec ctr = emb;
  ctr.name = "ctr";
  ctr.dim = 2;
  ctr.optimizer.kind = RowOptimizerKind::kAdam;
  ctr.admit_after_pushes = 2;  // some keys are only counted when they move
  return {emb, ctr};
}

std::vector<uint64_t> AllKeys() {
  std::vector<uint64_t> k;
  for (uint64_t i = 0; i < 300; ++i) k.push_back(i * 7919 + 13);
  return k;
}

// The keys of table t pushed at `clock`: all of "emb", two thirds of "ctr".
std::vector<uint64_t> PushedKeys(size_t t, int64_t clock) {
  std::vector<uint64_t> out;
  const std::vector<uint64_t> all = AllKeys();
  for (size_t i = 0; i < all.size(); ++i)
    if (t == 0 || (i + static_cast<size_t>(clock)) % 3 != 0)
      out.push_back(all[i]);
  return out;
}

float RowGrad(int rank, int64_t clock, size_t t, uint64_t key, size_t j) {
  return 0.01f * static_cast<float>((rank + 1) * (clock + 2)) +
         0.001f * static_cast<float>(key % 97) -
         0.002f * static_cast<float>(j + t);
}

ShardOptions Options(int id, int num_shards) {
  ShardOptions o = testing::ElasticTestOptions(id, num_shards);
  // A small row cache: most rows live in RocksDB only.
  o.sparse.cache_bytes = 4096;
  return o;
}

// The fleet that never moves keeps its rows in memory (no store: a cache
// that holds them all).
ShardOptions Reference(int id) {
  ShardOptions o = Options(id, 2);
  o.sparse.cache_bytes = uint64_t{64} << 20;
  return o;
}

RequestHeader Migrate(MigrateOp op, uint64_t epoch) {
  return testing::MigrateRequest(op, epoch);
}

// Shards in index order and how keys are routed to them.
struct Fleet {
  std::vector<ShardHarness*> shards;
  std::function<int(uint64_t name_hash, uint64_t key)> owner;
  uint64_t epoch = 0;
};

// The push of `rank` at `clock` to shard `s`: its chunks and its rows.
RequestHeader PushOf(const Fleet& f, int s, int rank, int64_t clock,
                     std::vector<ByteView>* data) {
  ShardHarness& h = *f.shards[s];
  const std::vector<TableSpec> tables = Tables();
  std::vector<uint32_t> ids;
  if (h.shard->registered()) {
    for (uint32_t id : h.shard->layout()->shard_chunks(h.options.shard_id)) {
      ids.push_back(id);
      data->push_back(testing::ChunkGrad(rank, clock, id, h.ChunkElems(id)));
    }
  }
  RequestHeader p = ShardHarness::Push(rank, clock, ids, *data);
  p.layout_epoch = f.epoch;
  for (size_t t = 0; t < tables.size(); ++t) {
    std::vector<uint64_t> keys;
    std::vector<float> rows;
    for (uint64_t k : PushedKeys(t, clock)) {
      if (f.owner(HashName(tables[t].name), k) != s) continue;
      keys.push_back(k);
      for (size_t j = 0; j < tables[t].dim; ++j)
        rows.push_back(RowGrad(rank, clock, t, k, j));
    }
    if (keys.empty()) continue;
    RowsRef ref;
    ref.table = static_cast<uint32_t>(t);
    ref.num_keys = keys.size();
    data->push_back(Keys(keys));
    ref.keys_frame = static_cast<uint32_t>(data->size());
    data->push_back(Floats(rows));
    ref.rows_frame = static_cast<uint32_t>(data->size());
    p.rows.push_back(ref);
  }
  return p;
}

// One BSP step of both workers on every shard of `f`: push, then clock.
void Step(const Fleet& f, int64_t clock) {
  for (size_t s = 0; s < f.shards.size(); ++s) {
    for (int rank = 0; rank < 2; ++rank) {
      std::vector<ByteView> data;
      RequestHeader p = PushOf(f, static_cast<int>(s), rank, clock, &data);
      ReplyHeader r = f.shards[s]->Call(p, data);
      ASSERT_TRUE(r.status.ok())
          << "shard " << s << ": " << r.status.ToString();
    }
    for (int rank = 0; rank < 2; ++rank) {
      RequestHeader c = ShardHarness::Clock(rank, clock + 1);
      c.layout_epoch = f.epoch;
      ReplyHeader r = f.shards[s]->Call(c);
      ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    }
  }
}

// Every key's row of table t, read from its owner in `f`.
std::vector<float> Rows(const Fleet& f, size_t t) {
  const std::vector<TableSpec> tables = Tables();
  std::vector<float> out;
  for (uint64_t k : AllKeys()) {
    const int s = f.owner(HashName(tables[t].name), k);
    std::vector<float> row(tables[t].dim);
    EXPECT_TRUE(
        f.shards[s]->shard->sparse_tables()->Read(t, &k, 1, row.data()).ok());
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

std::unique_ptr<Store> Open(const ::asyncps::testing::TempDir& dir,
                            const std::string& name) {
  RocksDbStoreOptions o;
  o.path = dir.Sub(name);
  o.write_buffer_bytes = 1 << 20;
  o.block_cache_bytes = 1 << 20;
  auto s = OpenRocksDbStore(o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::move(s).value();
}

class RowsMigrateTest : public ::testing::Test {
 protected:
  RowsMigrateTest()
      : sa(Open(dir, "a")),
        sb(Open(dir, "b")),
        sc(Open(dir, "c")),
        a(Options(0, 2), sa.get()),
        b(Options(1, 2), sb.get()),
        c(Options(2, 3), sc.get()),
        ra(Reference(0)),
        rb(Reference(1)) {
    for (ShardHarness* h : {&a, &b, &ra, &rb}) {
      RequestHeader r = ShardHarness::Register(0, SmallModel(), SmallLayout(2));
      r.tables = Tables();
      EXPECT_TRUE(h->Call(r).status.ok());
    }
    ref.shards = {&ra, &rb};
    ref.owner = [](uint64_t h, uint64_t k) {
      return ShardOfKeyHashed(h, k, 2);
    };
    moved.shards = {&a, &b};
    moved.owner = ref.owner;
    // Epoch 1: shard 2 joins, takes chunk 4 and a third of the buckets.
    doc.epoch = 1;
    doc.servers = {"tcp://127.0.0.1:1", "tcp://127.0.0.1:2",
                   "tcp://127.0.0.1:3"};
    doc.owners = {0, 1, 0, 1, 2};
    const KeyRanges initial = KeyRanges::Static(2);
    doc.num_buckets = initial.num_buckets;
    before = initial.owners;
    doc.bucket_owners = elastic::RebalanceBuckets(before, {0, 1, 2});
  }

  void Freeze(int64_t at) {
    for (ShardHarness* h : {&a, &b, &c}) {
      RequestHeader f = Migrate(MigrateOp::kFreeze, 1);
      f.migrate_at_clock = at;
      ReplyHeader r = h->Call(f);
      ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    }
  }

  RequestHeader Buckets(MigrateOp op, std::vector<uint32_t> buckets) {
    RequestHeader r = Migrate(op, 1);
    r.migrate_num_buckets = doc.num_buckets;
    r.migrate_buckets = std::move(buckets);
    return r;
  }

  // The buckets shard `from` gives shard 2.
  std::vector<uint32_t> Moving(int from) const {
    std::vector<uint32_t> out;
    for (uint32_t i = 0; i < doc.num_buckets; ++i)
      if (before[i] == from && doc.bucket_owners[i] == 2) out.push_back(i);
    return out;
  }

  // A pushed key of "emb" in one of `buckets`, and its bucket.
  std::pair<uint64_t, uint32_t> KeyIn(
      const std::vector<uint32_t>& buckets) const {
    for (uint64_t k : AllKeys()) {
      const uint32_t b = MulHigh(KeyHash(HashName("emb"), k), doc.num_buckets);
      if (std::find(buckets.begin(), buckets.end(), b) != buckets.end())
        return {k, b};
    }
    ADD_FAILURE() << "no key in these buckets";
    return {0, 0};
  }

  // Chunk 4 and every moving bucket to c, then adopt (receiver first).
  // resend: every import is sent twice, and a part of the first source's
  // buckets a third time (exported again), as a coordinator retries one
  // that a promoted backup had staged already: the staged rows are replaced,
  // never kept twice.
  // between: called once the receiver has adopted, before the sources do.
  void MoveAndAdopt(bool resend = false,
                    const std::function<void()>& between = nullptr) {
    RequestHeader e = Migrate(MigrateOp::kExport, 1);
    e.migrate_chunks = {4};
    auto out = a.Send(e);
    ASSERT_TRUE(out[0].header.status.ok()) << out[0].header.status.ToString();
    RequestHeader i = Migrate(MigrateOp::kImport, 1);
    i.migrate_chunks = {4};
    ASSERT_TRUE(c.Call(i, out[0].frames).status.ok());
    for (ShardHarness* from : {&a, &b}) {
      const std::vector<uint32_t> buckets = Moving(from->options.shard_id);
      ASSERT_FALSE(buckets.empty());
      auto rows = from->Send(Buckets(MigrateOp::kExport, buckets));
      ASSERT_TRUE(rows[0].header.status.ok())
          << rows[0].header.status.ToString();
      ASSERT_EQ(rows[0].frames.size(), 2 + Tables().size());
      ReplyHeader r =
          c.Call(Buckets(MigrateOp::kImport, buckets), rows[0].frames);
      ASSERT_TRUE(r.status.ok()) << r.status.ToString();
      if (!resend) continue;
      const uint64_t staged = c.shard->sparse_tables()->staged_bytes();
      r = c.Call(Buckets(MigrateOp::kImport, buckets), rows[0].frames);
      ASSERT_TRUE(r.status.ok()) << r.status.ToString();
      EXPECT_EQ(c.shard->sparse_tables()->staged_bytes(), staged);
      if (from != &a) continue;
      const std::vector<uint32_t> part(buckets.begin(),
                                       buckets.begin() + buckets.size() / 2);
      auto again = from->Send(Buckets(MigrateOp::kExport, part));
      ASSERT_TRUE(again[0].header.status.ok())
          << again[0].header.status.ToString();
      r = c.Call(Buckets(MigrateOp::kImport, part), again[0].frames);
      ASSERT_TRUE(r.status.ok()) << r.status.ToString();
      EXPECT_EQ(c.shard->sparse_tables()->staged_bytes(), staged);
    }
    for (ShardHarness* h : {&c, &a, &b}) {
      RequestHeader d = Migrate(MigrateOp::kAdopt, 1);
      d.migrate_doc = doc.ToJson();
      ReplyHeader r = h->Call(d);
      ASSERT_TRUE(r.status.ok()) << r.status.ToString();
      if (h == &c && between) between();
    }
    auto ranges = std::make_shared<KeyRanges>();
    ranges->num_buckets = doc.num_buckets;
    ranges->owners = doc.bucket_owners;
    moved.shards = {&a, &b, &c};
    moved.owner = [ranges](uint64_t h, uint64_t k) {
      return ranges->Owner(h, k);
    };
    moved.epoch = 1;
  }

  ::asyncps::testing::TempDir dir;
  std::unique_ptr<Store> sa, sb, sc;
  ShardHarness a, b, c, ra, rb;
  Fleet ref, moved;
  ElasticDoc doc;
  std::vector<int> before;
};

TEST(KeyRangesTest, StaticRangesRouteAsTheStaticFunction) {
  const KeyRanges r = KeyRanges::Static(3);
  for (uint64_t k : AllKeys()) {
    const uint64_t h = HashName("emb");
    EXPECT_EQ(r.Owner(h, k), ShardOfKeyHashed(h, k, 3)) << k;
  }
}

// Issue 22: a scan of a table (kAssign phase 6) routed by a layout epoch is
// answered only by shards serving that epoch, so while key ranges move --
// the receiver adopted, the sources not yet -- the pages of one epoch hold
// every key exactly once: the receiver refuses epoch 0 with its document
// (it would repeat the moved keys), a source refuses epoch 1 until it
// adopts (retry); after the move the three shards' epoch-1 pages hold every
// key once and epoch 0 is refused everywhere.
// Keys of table `table` a shard answers to a paged scan by `epoch` (pages
// of 7), or the refusal.
StatusOr<std::vector<uint64_t>> ScanKeys(ShardHarness& h, uint32_t table,
                                         uint64_t epoch) {
  std::vector<uint64_t> keys;
  uint64_t from = 0;
  for (;;) {
    auto got = h.Send(testing::ScanRequest(table, from, 7, epoch));
    if (got.size() != 1) return Status::Internal("no reply");
    const ReplyHeader& rep = got[0].header;
    if (!rep.status.ok()) {
      if (rep.status.code() == StatusCode::kFailedPrecondition &&
          rep.layout_doc.empty())
        return Status::Internal("refused without the document");
      if (rep.status.code() == StatusCode::kUnavailable && rep.retry_ms == 0)
        return Status::Internal("asked to retry without retry_ms");
      return rep.status;
    }
    const RowsRef& out = rep.rows.at(0);
    const ByteView& k = got[0].frames.at(out.keys_frame - 1);
    const size_t at = keys.size();
    keys.resize(at + out.num_keys);
    if (k.size > 0) std::memcpy(keys.data() + at, k.data, k.size);
    if (out.num_keys < 7) return keys;
    from = keys.back() + 1;
  }
}

// Every key of table 0 ("emb": all pushed) exactly once over `parts`.
void ExpectEveryKeyOnce(const std::vector<std::vector<uint64_t>>& parts) {
  std::vector<uint64_t> all;
  for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
  std::sort(all.begin(), all.end());
  std::vector<uint64_t> want = AllKeys();
  std::sort(want.begin(), want.end());
  EXPECT_EQ(all, want);
}

TEST_F(RowsMigrateTest, ScansDuringAMoveSeeEveryKeyOnce) {
  for (int64_t clock = 0; clock < 3; ++clock) Step(moved, clock);
  auto keys = [](ShardHarness& h, uint64_t epoch) {
    auto k = ScanKeys(h, 0, epoch);
    EXPECT_TRUE(k.ok()) << k.status().ToString();
    return k.ok() ? *k : std::vector<uint64_t>();
  };
  ExpectEveryKeyOnce({keys(a, 0), keys(b, 0)});
  Freeze(-1);
  ExpectEveryKeyOnce({keys(a, 0), keys(b, 0)});  // frozen: still epoch 0
  bool checked = false;
  MoveAndAdopt(false, [&] {
    // The receiver serves epoch 1 (the moved keys), the sources epoch 0
    // (those keys still): one epoch's pages never hold a key twice.
    auto stale = ScanKeys(c, 0, 0);
    EXPECT_EQ(stale.status().code(), StatusCode::kFailedPrecondition)
        << stale.status().ToString();
    auto early = ScanKeys(a, 0, 1);
    EXPECT_EQ(early.status().code(), StatusCode::kUnavailable)
        << early.status().ToString();
    EXPECT_FALSE(keys(c, 1).empty());
    ExpectEveryKeyOnce({keys(a, 0), keys(b, 0)});
    checked = true;
  });
  ASSERT_TRUE(checked);
  ExpectEveryKeyOnce({keys(a, 1), keys(b, 1), keys(c, 1)});
  for (ShardHarness* h : {&a, &b, &c}) {
    EXPECT_EQ(ScanKeys(*h, 0, 0).status().code(),
              StatusCode::kFailedPrecondition);
  }
}

TEST_F(RowsMigrateTest, MoveUnderBspIsBitwiseTheSameAsNoMove) {
  for (int64_t clock = 0; clock < 3; ++clock) {
    Step(moved, clock);
    Step(ref, clock);
  }
  Freeze(4);
  Step(moved, 3);
  Step(ref, 3);
  MoveAndAdopt();
  EXPECT_EQ(c.shard->layout_epoch(), 1u);
  // Rows given away are gone from the source, store included: a moved key
  // reads as its initial value there.
  {
    const uint64_t key = KeyIn(Moving(0)).first;
    std::vector<float> there(4), init(4), moved_row(4);
    ASSERT_TRUE(a.shard->sparse_tables()->Read(0, &key, 1, there.data()).ok());
    ASSERT_TRUE(
        c.shard->sparse_tables()->Read(0, &key, 1, moved_row.data()).ok());
    InitializeRow(Tables()[0], key, init.data());
    EXPECT_EQ(there, init);
    EXPECT_NE(moved_row, init);  // trained, and moved with its state
  }
  for (size_t t = 0; t < 2; ++t) EXPECT_EQ(Rows(moved, t), Rows(ref, t)) << t;
  // Training goes on by epoch 1 on three shards.
  for (int64_t clock = 4; clock < 7; ++clock) {
    Step(moved, clock);
    Step(ref, clock);
  }
  for (size_t t = 0; t < 2; ++t) EXPECT_EQ(Rows(moved, t), Rows(ref, t)) << t;
  EXPECT_EQ(*a.shard->weights(0), *ra.shard->weights(0));
  EXPECT_EQ(*b.shard->weights(1), *rb.shard->weights(1));
  EXPECT_EQ(*c.shard->weights(4), *ra.shard->weights(4));
  EXPECT_EQ(*c.shard->optimizer_state(4), *ra.shard->optimizer_state(4));

  // The receiver restarts from its store: rows and owners stay.
  ASSERT_TRUE(c.shard->Checkpoint().ok());
  const std::vector<float> emb = Rows(moved, 0), ctr = Rows(moved, 1);
  c.shard.reset();
  auto again = CreateShard(Options(2, 3), sc.get(), c.now);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  c.shard = std::move(again).value();
  EXPECT_EQ(c.shard->layout_epoch(), 1u);
  EXPECT_EQ(Rows(moved, 0), emb);
  EXPECT_EQ(Rows(moved, 1), ctr);
  Step(moved, 7);
  Step(ref, 7);
  for (size_t t = 0; t < 2; ++t) EXPECT_EQ(Rows(moved, t), Rows(ref, t)) << t;
}

// A resent import (the coordinator's retry after a failover of the
// receiving group) replaces what it staged: the move still ends bitwise
// equal to the fleet that never moved.
TEST_F(RowsMigrateTest, ResentImportsReplaceTheirStagedRows) {
  for (int64_t clock = 0; clock < 2; ++clock) {
    Step(moved, clock);
    Step(ref, clock);
  }
  Freeze(3);
  Step(moved, 2);
  Step(ref, 2);
  MoveAndAdopt(/*resend=*/true);
  EXPECT_EQ(c.shard->layout_epoch(), 1u);
  for (size_t t = 0; t < 2; ++t) EXPECT_EQ(Rows(moved, t), Rows(ref, t)) << t;
  for (int64_t clock = 3; clock < 5; ++clock) {
    Step(moved, clock);
    Step(ref, clock);
  }
  for (size_t t = 0; t < 2; ++t) EXPECT_EQ(Rows(moved, t), Rows(ref, t)) << t;
}

// A client re-routes a refused push by its keys' new owners, so one shard
// may get a rank's rows of one round in pieces: under BSP they count as the
// one push they are (the average is over ranks, not requests).
TEST_F(RowsMigrateTest, BspCountsThePiecesOfOneSplitRowsPush) {
  const std::vector<TableSpec> tables = Tables();
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<ByteView> whole;
    RequestHeader p = PushOf(ref, 0, rank, 0, &whole);
    ASSERT_TRUE(ra.Call(p, whole).status.ok());
    // `a` gets rank 0's rows in two pushes, half the keys of each table in
    // each (the chunks with the first).
    std::vector<ByteView> data;
    RequestHeader q = PushOf(moved, 0, rank, 0, &data);
    if (rank == 1) {
      ASSERT_TRUE(a.Call(q, data).status.ok());
      continue;
    }
    RequestHeader first = q, second = ShardHarness::Push(rank, 0, {}, {});
    std::vector<ByteView> d1(data.begin(), data.begin() + q.chunks.size()), d2;
    first.rows.clear();
    for (const RowsRef& r : q.rows) {
      const size_t dim = tables[r.table].dim, half = r.num_keys / 2;
      const ByteView& k = data[r.keys_frame - 1];
      const ByteView& g = data[r.rows_frame - 1];
      for (int piece = 0; piece < 2; ++piece) {
        const size_t from = piece == 0 ? 0 : half,
                     n = piece == 0 ? half : r.num_keys - half;
        std::vector<ByteView>& d = piece == 0 ? d1 : d2;
        RowsRef part = r;
        part.num_keys = n;
        d.push_back(ByteView{k.data + from * 8, n * 8, k.owner});
        part.keys_frame = static_cast<uint32_t>(d.size());
        d.push_back(ByteView{g.data + from * dim * 4, n * dim * 4, g.owner});
        part.rows_frame = static_cast<uint32_t>(d.size());
        (piece == 0 ? first : second).rows.push_back(part);
      }
    }
    ASSERT_TRUE(a.Call(first, d1).status.ok());
    ASSERT_TRUE(a.Call(second, d2).status.ok());
  }
  for (ShardHarness* h : {&a, &ra}) {
    for (int rank = 0; rank < 2; ++rank)
      ASSERT_TRUE(h->Call(ShardHarness::Clock(rank, 1)).status.ok());
  }
  for (size_t t = 0; t < tables.size(); ++t) {
    for (uint64_t k : AllKeys()) {
      if (ref.owner(HashName(tables[t].name), k) != 0) continue;
      std::vector<float> x(tables[t].dim), y(tables[t].dim);
      ASSERT_TRUE(a.shard->sparse_tables()->Read(t, &k, 1, x.data()).ok());
      ASSERT_TRUE(ra.shard->sparse_tables()->Read(t, &k, 1, y.data()).ok());
      ASSERT_EQ(x, y) << "table " << t << " key " << k;
    }
  }
}

TEST_F(RowsMigrateTest, StaleRowsRequestsAreRefusedWithTheDocument) {
  Step(moved, 0);
  Freeze(2);
  Step(moved, 1);
  MoveAndAdopt();
  // A push routed by epoch 0 (the static function): refused, nothing applied.
  const std::vector<float> emb = Rows(moved, 0);
  Fleet stale = moved;
  stale.epoch = 0;
  stale.owner = ref.owner;
  stale.shards = {&a, &b};
  std::vector<ByteView> data;
  RequestHeader p = PushOf(stale, 0, 0, 2, &data);
  ReplyHeader r = a.Call(p, data);
  EXPECT_EQ(r.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.layout_doc, doc.ToJson());
  // A pull of rows routed by epoch 0 too.
  RequestHeader pull = ShardHarness::Pull(0, 2);
  pull.pull_dense = false;
  RowsRef ref0;
  ref0.keys_frame = 1;
  ref0.num_keys = 1;
  pull.rows = {ref0};
  r = a.Call(pull, {Keys({AllKeys()[0]})});
  EXPECT_EQ(r.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.layout_doc, doc.ToJson());
  // Routed by epoch 1 but to the old owner of a moved key: the wrong shard.
  const uint64_t key = KeyIn(Moving(0)).first;
  pull.layout_epoch = 1;
  r = a.Call(pull, {Keys({key})});
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Rows(moved, 0), emb);
}

TEST_F(RowsMigrateTest, HostileBucketListsChangeNothing) {
  Step(moved, 0);
  Freeze(2);
  Step(moved, 1);
  const std::vector<float> emb = Rows(moved, 0), ctr = Rows(moved, 1);
  const std::vector<uint32_t> mine = Moving(0);
  auto code = [&](ShardHarness& h, RequestHeader r,
                  std::vector<ByteView> d = {}) {
    return h.Call(std::move(r), std::move(d)).status.code();
  };
  // Exports: out of range, repeated, more than the cut, a wrong cut, a
  // bucket of another shard, chunks and buckets together.
  EXPECT_EQ(code(a, Buckets(MigrateOp::kExport, {500})),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(a, Buckets(MigrateOp::kExport, {mine[0], mine[0]})),
            StatusCode::kInvalidArgument);
  std::vector<uint32_t> huge(doc.num_buckets + 1);
  for (size_t i = 0; i < huge.size(); ++i) huge[i] = static_cast<uint32_t>(i);
  EXPECT_EQ(code(a, Buckets(MigrateOp::kExport, huge)),
            StatusCode::kInvalidArgument);
  RequestHeader cut = Buckets(MigrateOp::kExport, mine);
  cut.migrate_num_buckets = 129;
  EXPECT_EQ(code(a, cut), StatusCode::kInvalidArgument);
  cut.migrate_num_buckets = kMaxBuckets + 1;
  EXPECT_EQ(code(a, cut), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(a, Buckets(MigrateOp::kExport, Moving(1))),
            StatusCode::kNotFound);
  RequestHeader both = Buckets(MigrateOp::kExport, mine);
  both.migrate_chunks = {4};
  EXPECT_EQ(code(a, both), StatusCode::kInvalidArgument);

  // Imports: a damaged record, rows of a bucket the import does not name,
  // a frame missing, a repeated list; the empty shard stays empty.
  auto out = a.Send(Buckets(MigrateOp::kExport, mine));
  ASSERT_TRUE(out[0].header.status.ok()) << out[0].header.status.ToString();
  std::vector<ByteView> frames = out[0].frames;
  ASSERT_GT(frames[2].size, 16u);
  std::vector<ByteView> cut_short = frames;
  cut_short[2].size -= 3;
  EXPECT_EQ(code(c, Buckets(MigrateOp::kImport, mine), cut_short),
            StatusCode::kInvalidArgument);
  const uint32_t full = KeyIn(mine).second;  // has rows in the export
  std::vector<uint32_t> others;
  for (uint32_t x : mine)
    if (x != full) others.push_back(x);
  EXPECT_EQ(code(c, Buckets(MigrateOp::kImport, others), frames),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(c, Buckets(MigrateOp::kImport, mine), {frames[0], frames[1]}),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(c, Buckets(MigrateOp::kImport, {mine[0], mine[0]}), frames),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(c.shard->sparse_tables(), nullptr);
  // An adopt that gives c buckets it never received is refused.
  RequestHeader d = Migrate(MigrateOp::kAdopt, 1);
  d.migrate_doc = doc.ToJson();
  EXPECT_EQ(code(c, d), StatusCode::kFailedPrecondition);
  EXPECT_EQ(c.shard->layout_epoch(), 0u);
  // Nothing moved on the sources either.
  EXPECT_EQ(Rows(moved, 0), emb);
  EXPECT_EQ(Rows(moved, 1), ctr);
  for (ShardHarness* h : {&a, &b, &c}) {
    EXPECT_TRUE(h->Call(Migrate(MigrateOp::kAbort, 1)).status.ok());
    EXPECT_FALSE(h->shard->frozen());
  }
}

TEST(ElasticDocBucketsTest, RoundTripAndHostileDocuments) {
  ElasticDoc d;
  d.epoch = 2;
  d.servers = {"a", "b", "c"};
  d.owners = {0, 1};
  d.num_buckets = 6;
  d.bucket_owners = {0, 0, 2, 2, 1, 0};
  StatusOr<ElasticDoc> back = ElasticDoc::FromJson(d.ToJson());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->num_buckets, 6u);
  EXPECT_EQ(back->bucket_owners, d.bucket_owners);
  EXPECT_EQ(back->Active(), (std::vector<int>{0, 1, 2}));
  EXPECT_NE(d.ToJson().find("[[0,2],[2,2],[1,1],[0,1]]"), std::string::npos)
      << d.ToJson();
  const std::string head =
      R"({"epoch": 1, "servers": ["a", "b"], "owners": [0], )";
  for (const char* bad : {
           R"("buckets": 4})",                       // runs missing
           R"("bucket_owners": [[0, 4]]})",          // count missing
           R"("buckets": 0, "bucket_owners": []})",  // no bucket
           R"("buckets": 4294967296, "bucket_owners": [[0, 1]]})",  // huge
           R"("buckets": 4, "bucket_owners": [[0, 3]]})",           // short
           R"("buckets": 4, "bucket_owners": [[0, 3], [1, 2]]})",   // long
           R"("buckets": 4, "bucket_owners": [[2, 4]]})",  // no such shard
           R"("buckets": 4, "bucket_owners": [[-1, 4]]})",
           R"("buckets": 4, "bucket_owners": [[0, 0], [1, 4]]})",  // empty run
           R"("buckets": 4, "bucket_owners": [[0, 2, 1], [1, 2]]})",
           R"("buckets": 4, "bucket_owners": [0, 1, 1, 1]})",
           R"("buckets": 2, "bucket_owners": [[0, 1], [0, 1], [1, 0]]})",
       }) {
    EXPECT_EQ(ElasticDoc::FromJson(head + bad).status().code(),
              StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(RebalanceBucketsTest, JoinTakesAThirdAndLeaveGivesItsBucketsAway) {
  const std::vector<int> two = KeyRanges::Static(2).owners;  // 64 + 64
  const std::vector<int> three = elastic::RebalanceBuckets(two, {0, 1, 2});
  std::vector<int> held(3, 0);
  int moved = 0;
  for (size_t b = 0; b < two.size(); ++b) {
    ++held[three[b]];
    moved += three[b] != two[b];
    if (three[b] != two[b]) {
      EXPECT_EQ(three[b], 2);  // only to the shard that joins
    }
  }
  EXPECT_EQ(moved, held[2]);
  EXPECT_LE(std::max({held[0], held[1], held[2]}) -
                std::min({held[0], held[1], held[2]}),
            1);
  const std::vector<int> back = elastic::RebalanceBuckets(three, {0, 1});
  for (size_t b = 0; b < two.size(); ++b) {
    EXPECT_NE(back[b], 2);
    if (three[b] != 2) {
      EXPECT_EQ(back[b], three[b]);
    }
  }
  EXPECT_EQ(std::count(back.begin(), back.end(), 0), 64);
}

}  // namespace
}  // namespace asyncps::server
