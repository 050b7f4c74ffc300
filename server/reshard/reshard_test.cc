// Reshard: real shards trained and checkpointed on S shards, restored onto
// S' and recovered by Shard::Create; weights, optimizer state and sparse
// rows compared bitwise; the merged clocks and push table; refusals that
// leave the destinations untouched; damaged records.
#include "server/reshard/reshard.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/sparse_table.h"
#include "server/shard/shard.h"
#include "server/sparse/sparse_tables.h"
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

constexpr int kWorkers = 2;
constexpr uint64_t kNumKeys = 48;

TableSpec Emb() {
  TableSpec t;
  t.name = "emb";
  t.dim = 3;
  t.init = InitKind::kUniform;
  t.init_param = 0.1f;
  t.seed = 5;
  t.optimizer.kind = RowOptimizerKind::kAdaGrad;
  t.optimizer.lr = 0.3f;
  return t;
}

ShardOptions Options(int shard, int num_shards) {
  ShardOptions o;
  o.shard_id = shard;
  o.num_shards = num_shards;
  o.num_workers = kWorkers;
  o.consistency = Consistency::kAsp;
  o.optimizer.kind = OptimizerKind::kAdam;
  o.optimizer.lr = 0.05f;
  return o;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

// S shards of one model (SmallModel + table "emb") on the given stores.
class Fleet {
 public:
  Fleet(const std::vector<Store*>& stores, bool register_model = true,
        std::vector<TensorSpec> model = SmallModel(), TableSpec t = Emb(),
        Placement placement = Placement::kBalanced)
      : table(std::move(t)) {
    const int n = static_cast<int>(stores.size());
    for (int s = 0; s < n; ++s) {
      shards.push_back(
          std::make_unique<ShardHarness>(Options(s, n), stores[s]));
      if (!register_model || shards.back()->shard->registered()) continue;
      RequestHeader r = ShardHarness::Register(0, model, SmallLayout(n));
      r.layout.placement = placement;
      r.tables = {table};
      ReplyHeader h = shards.back()->Call(r);
      EXPECT_TRUE(h.status.ok()) << h.status.ToString();
    }
  }
  int size() const { return static_cast<int>(shards.size()); }
  ShardHarness& Owner(uint32_t chunk) {
    return *shards[shards[0]->shard->layout()->chunks()[chunk].shard];
  }
  ShardHarness& OwnerOfKey(uint64_t key) {
    return *shards[ShardOfKey(table, key, size())];
  }

  // Rank `rank` pushes step `clock` to every shard: a gradient for each of
  // the shard's chunks and rows for its keys among a few of [0, kNumKeys).
  void Step(int rank, int64_t clock) {
    for (int s = 0; s < size(); ++s) {
      ShardHarness& h = *shards[s];
      std::vector<uint32_t> ids = h.shard->layout()->shard_chunks(s);
      std::vector<ByteView> data;
      for (uint32_t id : ids) {
        std::vector<float> g(h.ChunkElems(id));
        for (size_t i = 0; i < g.size(); ++i)
          g[i] = std::sin(0.37f * (clock + 1) + 0.11f * id + 0.013f * i + rank);
        data.push_back(Floats(g));
      }
      RequestHeader r = ShardHarness::Push(rank, clock, ids, data);
      std::vector<uint64_t> keys;
      for (uint64_t k = (clock + rank) % 3; k < kNumKeys; k += 3) {
        if (ShardOfKey(table, k, size()) == s) keys.push_back(k);
      }
      std::vector<float> grads;
      for (uint64_t k : keys) {
        for (uint32_t d = 0; d < table.dim; ++d)
          grads.push_back(std::cos(0.5f * clock + 0.07f * k + d + rank));
      }
      if (!keys.empty()) {
        data.push_back(Keys(keys));
        data.push_back(Floats(grads));
        RowsRef ref;
        ref.table = 0;
        ref.keys_frame = static_cast<uint32_t>(data.size() - 1);
        ref.rows_frame = static_cast<uint32_t>(data.size());
        ref.num_keys = keys.size();
        r.rows = {ref};
      }
      r.id = next_id[rank]++;
      last_id[s][rank] = r.id;
      ReplyHeader reply = h.Call(r, data);
      EXPECT_TRUE(reply.status.ok()) << reply.status.ToString();
      EXPECT_TRUE(h.Call(ShardHarness::Clock(rank, clock + 1)).status.ok());
    }
  }
  void Train(int steps) {
    for (int c = 0; c < steps; ++c) {
      for (int rank = 0; rank < kWorkers; ++rank) Step(rank, c);
    }
  }
  void Checkpoint() {
    for (auto& h : shards) ASSERT_TRUE(h->shard->Checkpoint().ok());
  }

  // Rows of keys [0, n) read by a tool (rank -1) from their owners.
  std::vector<float> Rows(uint64_t n = kNumKeys + 8) {
    std::vector<float> all;
    for (uint64_t k = 0; k < n; ++k) {
      RequestHeader r = ShardHarness::Pull(-1, 0);
      RowsRef ref;
      ref.keys_frame = 1;
      ref.num_keys = 1;
      r.rows = {ref};
      auto out = OwnerOfKey(k).Send(r, {Keys({k})});
      EXPECT_EQ(out.size(), 1u);
      if (out.empty()) return {};
      EXPECT_TRUE(out[0].header.status.ok()) << out[0].header.status.ToString();
      if (out[0].header.rows.empty()) return {};
      const ByteView& f = out[0].frames[out[0].header.rows[0].rows_frame - 1];
      std::vector<float> v(f.size / 4);
      std::memcpy(v.data(), f.data, f.size);
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  }

  TableSpec table;
  std::vector<std::unique_ptr<ShardHarness>> shards;
  uint64_t next_id[kWorkers] = {1, 1001};
  std::map<int, std::map<int, uint64_t>> last_id;  // shard -> rank -> id
};

// Every chunk of `a` and `b` bitwise equal (weights, optimizer state,
// version).
void ExpectSameChunks(Fleet& a, Fleet& b) {
  const Layout& l = *a.shards[0]->shard->layout();
  ASSERT_NE(b.shards[0]->shard->layout(), nullptr);
  ASSERT_EQ(l.chunks().size(), b.shards[0]->shard->layout()->chunks().size());
  for (const ChunkSpec& c : l.chunks()) {
    const Shard& x = *a.Owner(c.id).shard;
    const Shard& y = *b.Owner(c.id).shard;
    ASSERT_NE(y.weights(c.id), nullptr) << "chunk " << c.id;
    EXPECT_TRUE(SameBits(*x.weights(c.id), *y.weights(c.id)))
        << "chunk " << c.id;
    EXPECT_TRUE(SameBits(*x.optimizer_state(c.id), *y.optimizer_state(c.id)))
        << "chunk " << c.id;
    EXPECT_EQ(x.chunk_version(c.id), y.chunk_version(c.id)) << "chunk " << c.id;
  }
}

std::vector<Store*> Ptrs(std::vector<MemStore>& v) {
  std::vector<Store*> p;
  for (MemStore& s : v) p.push_back(&s);
  return p;
}

// Everything a MemStore holds in its default space.
std::map<std::string, std::string> Contents(Store* s) {
  std::map<std::string, std::string> m;
  EXPECT_TRUE(s->Scan([&](std::string_view k, std::string_view v) {
                 m.emplace(std::string(k), std::string(v));
                 return Status::OK();
               }).ok());
  return m;
}

TEST(ReshardTest, ThreeToTwoBitwise) {
  std::vector<MemStore> old_stores(3), new_stores(2);
  Fleet old_fleet(Ptrs(old_stores));
  old_fleet.Train(4);
  // Rank 1 gets a step further on shard 2 only: clocks differ per shard.
  old_fleet.shards[2]->Call(ShardHarness::Clock(1, 6));
  old_fleet.Checkpoint();
  const std::vector<float> rows = old_fleet.Rows();

  ReshardReport report;
  ASSERT_TRUE(Reshard(Ptrs(old_stores), Ptrs(new_stores), {}, &report).ok());
  EXPECT_EQ(report.from_shards, 3);
  EXPECT_EQ(report.to_shards, 2);
  EXPECT_EQ(report.chunks, 5u);
  EXPECT_EQ(report.chunk_records, 5u);
  EXPECT_GT(report.rows, 0u);
  EXPECT_EQ(report.rows_per_shard[0] + report.rows_per_shard[1], report.rows);

  Fleet new_fleet(Ptrs(new_stores), /*register_model=*/false);
  ASSERT_TRUE(new_fleet.shards[0]->shard->registered());
  ASSERT_TRUE(new_fleet.shards[1]->shard->registered());
  EXPECT_EQ(new_fleet.shards[0]->shard->layout()->num_shards(), 2);
  ExpectSameChunks(old_fleet, new_fleet);
  const std::vector<float> new_rows = new_fleet.Rows();
  EXPECT_TRUE(SameBits(rows, new_rows));

  // Clocks: the minimum over the sources; version: the maximum; counters:
  // the fleet's totals kept.
  uint64_t max_version = 0, old_pushes = 0, new_pushes = 0;
  for (auto& h : old_fleet.shards) {
    max_version = std::max(max_version, h->shard->shard_version());
    old_pushes += h->shard->counters().pushes;
  }
  for (auto& h : new_fleet.shards) {
    EXPECT_EQ(h->shard->clocks().clock(0), 4);
    EXPECT_EQ(h->shard->clocks().clock(1), 4);
    EXPECT_EQ(h->shard->shard_version(), max_version);
    new_pushes += h->shard->counters().pushes;
  }
  EXPECT_EQ(old_pushes, new_pushes);
  // A registration of the same model with the new shard count is accepted.
  for (int j = 0; j < 2; ++j) {
    RequestHeader r = ShardHarness::Register(0, SmallModel(), SmallLayout(2));
    r.tables = {Emb()};
    EXPECT_TRUE(new_fleet.shards[j]->Call(r).status.ok());
  }
}

// A model placed in order is restored in order onto the new shard count:
// the new shards own the chunks Layout::Create gives that count, and refuse
// a registration naming the balanced placement.
TEST(ReshardTest, InOrderPlacementIsKept) {
  std::vector<MemStore> old_stores(3), new_stores(2);
  Fleet old_fleet(Ptrs(old_stores), true, SmallModel(), Emb(),
                  Placement::kInOrder);
  old_fleet.Train(3);
  old_fleet.Checkpoint();
  ReshardReport report;
  ASSERT_TRUE(Reshard(Ptrs(old_stores), Ptrs(new_stores), {}, &report).ok());
  Fleet new_fleet(Ptrs(new_stores), /*register_model=*/false);
  LayoutOptions lo = SmallLayout(2);
  lo.placement = Placement::kInOrder;
  auto expect = Layout::Create(SmallModel(), lo);
  ASSERT_TRUE(expect.ok());
  for (int j = 0; j < 2; ++j) {
    const Layout* l = new_fleet.shards[j]->shard->layout();
    ASSERT_NE(l, nullptr);
    EXPECT_EQ(l->options().placement, Placement::kInOrder);
    EXPECT_EQ(l->Owners(), expect->Owners());
  }
  ExpectSameChunks(old_fleet, new_fleet);
  for (int j = 0; j < 2; ++j) {
    RequestHeader r = ShardHarness::Register(0, SmallModel(), SmallLayout(2));
    r.tables = {Emb()};
    EXPECT_EQ(new_fleet.shards[j]->Call(r).status.code(),
              StatusCode::kAlreadyExists);
    r.layout.placement = Placement::kInOrder;
    EXPECT_TRUE(new_fleet.shards[j]->Call(r).status.ok());
  }
}

// Rows expired at their source (by its expiry clock) read as their initial
// value there, and on the new shards although the merged clock is lower.
TEST(ReshardTest, ExpiredRowsStayExpired) {
  TableSpec t = Emb();
  t.expire_after_clocks = 3;
  std::vector<MemStore> old_stores(3), new_stores(2);
  Fleet old_fleet(Ptrs(old_stores), true, SmallModel(), t);
  old_fleet.Train(5);  // keys pushed at clocks 0..4
  // Shard 0's clock (and expiry clock) moves to 10: its rows expire there.
  for (int rank = 0; rank < kWorkers; ++rank)
    old_fleet.shards[0]->Call(ShardHarness::Clock(rank, 10));
  ASSERT_EQ(old_fleet.shards[0]->shard->sparse_tables()->clock(), 10);
  old_fleet.Checkpoint();
  const std::vector<float> rows = old_fleet.Rows();
  ReshardReport report;
  ASSERT_TRUE(Reshard(Ptrs(old_stores), Ptrs(new_stores), {}, &report).ok());
  EXPECT_GT(report.expired_rows, 0u);
  Fleet new_fleet(Ptrs(new_stores), false, SmallModel(), t);
  EXPECT_EQ(new_fleet.shards[0]->shard->sparse_tables()->clock(), 5);
  EXPECT_TRUE(SameBits(rows, new_fleet.Rows()));
}

TEST(ReshardTest, ResentPushIsNotAppliedAgain) {
  std::vector<MemStore> old_stores(3), new_stores(2);
  Fleet old_fleet(Ptrs(old_stores));
  old_fleet.Train(3);
  old_fleet.Checkpoint();
  ASSERT_TRUE(Reshard(Ptrs(old_stores), Ptrs(new_stores), {}, nullptr).ok());
  Fleet new_fleet(Ptrs(new_stores), false);
  // The last push rank 0 sent to old shard 1, resent to each new shard
  // (naming a chunk the new shard owns): a duplicate everywhere.
  const uint64_t id = old_fleet.last_id[1][0];
  for (int j = 0; j < 2; ++j) {
    ShardHarness& h = *new_fleet.shards[j];
    const uint32_t c = h.FirstChunk();
    const std::vector<float> before = *h.shard->weights(c);
    const uint64_t dups = h.shard->counters().duplicate_pushes;
    RequestHeader r = ShardHarness::Push(
        0, 3, {c}, {Floats(std::vector<float>(h.ChunkElems(c), 1.0f))});
    r.id = id;
    EXPECT_TRUE(h.Call(r, {Floats(std::vector<float>(h.ChunkElems(c), 1.0f))})
                    .status.ok());
    EXPECT_EQ(h.shard->counters().duplicate_pushes, dups + 1) << "shard " << j;
    EXPECT_TRUE(SameBits(before, *h.shard->weights(c))) << "shard " << j;
    // A new push is applied.
    r.id = old_fleet.next_id[0] + 10;
    EXPECT_TRUE(h.Call(r, {Floats(std::vector<float>(h.ChunkElems(c), 1.0f))})
                    .status.ok());
    EXPECT_FALSE(SameBits(before, *h.shard->weights(c))) << "shard " << j;
  }
}

class TempDirs {
 public:
  std::vector<std::unique_ptr<Store>> Open(const std::string& name, int n) {
    std::vector<std::unique_ptr<Store>> v;
    for (int i = 0; i < n; ++i) {
      RocksDbStoreOptions o;
      o.path = dir_.Sub(name + std::to_string(i));
      auto s = OpenRocksDbStore(o);
      EXPECT_TRUE(s.ok()) << s.status().ToString();
      if (s.ok()) v.push_back(std::move(s).value());
    }
    return v;
  }

 private:
  ::asyncps::testing::TempDir dir_;
};

std::vector<Store*> Ptrs(const std::vector<std::unique_ptr<Store>>& v) {
  std::vector<Store*> p;
  for (const auto& s : v) p.push_back(s.get());
  return p;
}

TEST(ReshardTest, RoundTripTwoThreeTwoOnRocksDb) {
  TempDirs dirs;
  std::vector<float> rows;
  std::unique_ptr<Fleet> a;
  auto s2 = dirs.Open("a", 2);
  a = std::make_unique<Fleet>(Ptrs(s2));
  a->Train(5);
  a->Checkpoint();
  rows = a->Rows();
  auto s3 = dirs.Open("b", 3);
  ASSERT_TRUE(Reshard(Ptrs(s2), Ptrs(s3), {}, nullptr).ok());
  auto back = dirs.Open("c", 2);
  ReshardOptions small_batches;
  small_batches.batch_bytes = 64;  // rows in many partial writes
  ASSERT_TRUE(Reshard(Ptrs(s3), Ptrs(back), small_batches, nullptr).ok());
  {
    Fleet b(Ptrs(s3), false);
    ExpectSameChunks(*a, b);
    EXPECT_TRUE(SameBits(rows, b.Rows()));
  }
  // The round trip's stores hold the originals' records byte for byte,
  // except the state (merged) and the sparse state (counters).
  for (int j = 0; j < 2; ++j) {
    auto x = Contents(s2[j].get());
    auto y = Contents(back[j].get());
    ASSERT_EQ(x.size(), y.size());
    for (const auto& [k, v] : x) {
      if (k == "1state" || k == "1sparse") continue;
      EXPECT_EQ(v, y[k]) << k;
    }
  }
  Fleet c(Ptrs(back), false);
  ExpectSameChunks(*a, c);
  EXPECT_TRUE(SameBits(rows, c.Rows()));
}

TEST(ReshardTest, RefusalsLeaveDestinationsUntouched) {
  std::vector<MemStore> a(3), b(3);
  Fleet fa(Ptrs(a));
  fa.Train(2);
  fa.Checkpoint();
  std::vector<TensorSpec> other = SmallModel();
  other[0].seed = 99;
  Fleet fb(Ptrs(b), true, other);
  fb.Train(1);
  fb.Checkpoint();

  auto expect_refused = [&](std::vector<Store*> from, StatusCode code,
                            const std::string& needle) {
    std::vector<MemStore> to(2);
    Status s = Reshard(from, Ptrs(to), {}, nullptr);
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.ToString();
    for (MemStore& t : to) {
      EXPECT_EQ(t.writes(), 0u);
      EXPECT_TRUE(Contents(&t).empty());
    }
  };
  // Another model's shard among the sources.
  expect_refused({&a[0], &b[1], &a[2]}, StatusCode::kFailedPrecondition,
                 "another model");
  // Out of order.
  expect_refused({&a[1], &a[0], &a[2]}, StatusCode::kFailedPrecondition,
                 "shard order");
  // A source missing.
  expect_refused({&a[0], &a[1]}, StatusCode::kFailedPrecondition,
                 "3 shards, 2 stores");
  // An empty store as a source.
  MemStore empty;
  expect_refused({&a[0], &a[1], &empty}, StatusCode::kFailedPrecondition,
                 "no registered model");
  // No destination.
  EXPECT_EQ(Reshard(Ptrs(a), {}, {}, nullptr).code(),
            StatusCode::kInvalidArgument);

  // A destination that is not empty: refused, none written.
  std::vector<MemStore> to(2);
  ASSERT_TRUE(to[1].Write({{"x", "y", {}}}, SyncMode::kSync).ok());
  Status s = Reshard(Ptrs(a), Ptrs(to), {}, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("destination 1 is not empty"), std::string::npos);
  EXPECT_EQ(to[0].writes(), 0u);
  EXPECT_EQ(to[1].writes(), 1u);
  EXPECT_EQ(Contents(&to[1]).size(), 1u);
  // Rows in a destination's key space count too.
  std::vector<MemStore> to2(2);
  auto space = to2[0].OpenSpace(sparse::SparseTables::SpaceName(0, Emb()));
  ASSERT_TRUE(space.ok());
  auto batch = to2[0].NewBatch();
  batch->Put(*space, "12345678", "row", "");
  ASSERT_TRUE(
      to2[0].Write({}, batch.get(), SyncMode::kSync, WriteKind::kCut).ok());
  s = Reshard(Ptrs(a), Ptrs(to2), {}, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_EQ(to2[1].writes(), 0u);

  // A dry run writes nothing.
  std::vector<MemStore> to3(2);
  ReshardOptions dry;
  dry.dry_run = true;
  ReshardReport report;
  ASSERT_TRUE(Reshard(Ptrs(a), Ptrs(to3), dry, &report).ok());
  EXPECT_EQ(report.chunks_per_shard.size(), 2u);
  EXPECT_EQ(to3[0].writes() + to3[1].writes(), 0u);
}

// 4000 floats cut into total / (8 S) pieces: 166-167 for 3 shards, 250 for
// 2: the chunks are re-cut.
std::vector<std::unique_ptr<ShardHarness>> BigModelFleet(
    std::vector<MemStore>& stores, Consistency consistency) {
  const std::vector<TensorSpec> model = {
      TensorSpec{"big", {4000}, InitKind::kUniform, 0.5f, 1}};
  std::vector<std::unique_ptr<ShardHarness>> fleet;
  const int n = static_cast<int>(stores.size());
  for (int s = 0; s < n; ++s) {
    ShardOptions o = Options(s, n);
    o.consistency = consistency;
    fleet.push_back(std::make_unique<ShardHarness>(o, &stores[s]));
    LayoutOptions lo;
    lo.chunk_elems = 4000;
    lo.min_chunk_elems = 1;
    lo.num_shards = n;
    if (fleet.back()->shard->registered()) continue;
    EXPECT_TRUE(
        fleet.back()->Call(ShardHarness::Register(0, model, lo)).status.ok());
  }
  return fleet;
}

// Pushes a gradient for `ids` (default: all the shard's chunks) to shard s.
void PushChunks(ShardHarness& h, int rank, int64_t clock, uint64_t id,
                std::vector<uint32_t> ids = {}) {
  if (ids.empty()) ids = h.shard->layout()->shard_chunks(h.options.shard_id);
  std::vector<ByteView> data;
  for (uint32_t c : ids) {
    std::vector<float> g(h.ChunkElems(c));
    for (size_t i = 0; i < g.size(); ++i)
      g[i] = std::sin(0.3f * clock + 0.01f * (c * 1000 + i));
    data.push_back(Floats(g));
  }
  RequestHeader r = ShardHarness::Push(rank, clock, ids, data);
  r.id = id;
  EXPECT_TRUE(h.Call(r, data).status.ok());
}

// Tensor 0's weights, then each optimizer-state component, gathered from
// the chunks' owners.
std::vector<std::vector<float>> TensorState(
    const std::vector<std::unique_ptr<ShardHarness>>& fleet) {
  const Layout& l = *fleet[0]->shard->layout();
  std::vector<std::vector<float>> out(1);
  for (uint32_t id : l.tensor_chunks(0)) {
    const Shard& s = *fleet[l.chunks()[id].shard]->shard;
    const std::vector<float>& w = *s.weights(id);
    const std::vector<float>& st = *s.optimizer_state(id);
    out[0].insert(out[0].end(), w.begin(), w.end());
    const size_t spe = st.size() / w.size();
    out.resize(1 + spe);
    for (size_t k = 0; k < spe; ++k)
      out[1 + k].insert(out[1 + k].end(), st.begin() + k * w.size(),
                        st.begin() + (k + 1) * w.size());
  }
  return out;
}

TEST(ReshardTest, DifferentChunkingIsRecutBitwise) {
  std::vector<MemStore> a(3);
  auto old_fleet = BigModelFleet(a, Consistency::kAsp);
  uint64_t id = 1;
  for (int step = 0; step < 4; ++step) {
    for (auto& h : old_fleet) PushChunks(*h, 0, step, id++);
  }
  for (auto& h : old_fleet) ASSERT_TRUE(h->shard->Checkpoint().ok());
  std::vector<MemStore> to(2);
  ReshardReport report;
  Status s = Reshard(Ptrs(a), Ptrs(to), {}, &report);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(report.recut);
  EXPECT_EQ(report.chunks, 16u);
  EXPECT_EQ(report.recut_chunks, 16u);
  EXPECT_EQ(report.step_mismatches, 0u);
  auto new_fleet = BigModelFleet(to, Consistency::kAsp);
  ASSERT_EQ(new_fleet[0]->shard->layout()->chunks().size(), 16u);
  const auto want = TensorState(old_fleet);
  const auto got = TensorState(new_fleet);
  ASSERT_EQ(want.size(), 3u);  // weights, Adam's m and v
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k)
    EXPECT_TRUE(SameBits(want[k], got[k])) << "array " << k;
  for (const ChunkSpec& c : new_fleet[0]->shard->layout()->chunks()) {
    EXPECT_EQ(new_fleet[c.shard]->shard->chunk_version(c.id), 4u);
  }
  // 2 -> 3 again gives the original chunks back, bitwise.
  std::vector<MemStore> back(3);
  ASSERT_TRUE(Reshard(Ptrs(to), Ptrs(back), {}, nullptr).ok());
  for (int j = 0; j < 3; ++j) {
    auto x = Contents(&a[j]);
    auto y = Contents(&back[j]);
    ASSERT_EQ(x.size(), y.size());
    for (const auto& [k, v] : x) {
      if (k != "1state") {
        EXPECT_EQ(v, y[k]) << k;
      }
    }
  }

  // Pieces pushed a different number of times: each new chunk takes the
  // largest step (counted), the elements stay bitwise; a never-written
  // chunk's initial value is re-cut too.
  std::vector<MemStore> c(3);
  auto partial = BigModelFleet(c, Consistency::kAsp);
  PushChunks(*partial[0], 0, 0, 1);
  PushChunks(*partial[1], 0, 0, 2, {partial[1]->FirstChunk()});
  for (auto& h : partial) ASSERT_TRUE(h->shard->Checkpoint().ok());
  std::vector<MemStore> to2(2);
  ASSERT_TRUE(Reshard(Ptrs(c), Ptrs(to2), {}, &report).ok());
  EXPECT_GT(report.step_mismatches, 0u);
  auto partial_new = BigModelFleet(to2, Consistency::kAsp);
  const auto want2 = TensorState(partial);
  const auto got2 = TensorState(partial_new);
  for (size_t k = 0; k < want2.size(); ++k)
    EXPECT_TRUE(SameBits(want2[k], got2[k])) << "array " << k;
}

TEST(ReshardTest, BspRoundInProgressCannotBeRecut) {
  std::vector<MemStore> a(3);
  auto fleet = BigModelFleet(a, Consistency::kBsp);
  // One push of worker 0 summed into shard 0's first chunk only.
  PushChunks(*fleet[0], 0, 0, 1, {fleet[0]->FirstChunk()});
  for (auto& h : fleet) ASSERT_TRUE(h->shard->Checkpoint().ok());
  std::vector<MemStore> to(2);
  Status s = Reshard(Ptrs(a), Ptrs(to), {}, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("BSP round"), std::string::npos) << s.ToString();
  EXPECT_EQ(to[0].writes() + to[1].writes(), 0u);
  // The same chunking (3 -> 3) copies the sums as they are.
  std::vector<MemStore> same(3);
  EXPECT_TRUE(Reshard(Ptrs(a), Ptrs(same), {}, nullptr).ok());
}

TEST(ReshardTest, DamagedRecordsAreCorruptionNamingTheKey) {
  std::vector<MemStore> a(3);
  Fleet f(Ptrs(a));
  f.Train(2);
  f.Checkpoint();
  // Damage one chunk record of shard 1 (truncate it).
  std::string chunk_key;
  std::string value;
  ASSERT_TRUE(a[1].Scan([&](std::string_view k, std::string_view v) {
                    if (k.substr(0, 7) == "2chunk/") {
                      chunk_key.assign(k);
                      value.assign(v);
                    }
                    return Status::OK();
                  })
                  .ok());
  ASSERT_FALSE(chunk_key.empty());
  std::vector<MemStore> damaged = a;  // copies
  ASSERT_TRUE(damaged[1]
                  .Write({{chunk_key, value.substr(0, value.size() - 3), {}}},
                         SyncMode::kSync)
                  .ok());
  std::vector<MemStore> to(2);
  Status s = Reshard(Ptrs(damaged), Ptrs(to), {}, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_NE(s.message().find("source 1"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("2chunk/"), std::string::npos) << s.ToString();
  EXPECT_EQ(to[0].writes() + to[1].writes(), 0u);

  // Damaged state and layout records; every truncation of them.
  for (const std::string key : {"1state", "0layout", "1sparse", "0tables"}) {
    std::string v = Contents(&a[2])[key];
    ASSERT_FALSE(v.empty()) << key;
    for (size_t cut = 0; cut < v.size(); cut += 1 + v.size() / 40) {
      std::vector<MemStore> d = a;
      ASSERT_TRUE(
          d[2].Write({{key, v.substr(0, cut), {}}}, SyncMode::kSync).ok());
      std::vector<MemStore> t(2);
      Status r = Reshard(Ptrs(d), Ptrs(t), {}, nullptr);
      EXPECT_FALSE(r.ok()) << key << " cut at " << cut;
      EXPECT_EQ(t[0].writes() + t[1].writes(), 0u);
    }
  }

  // A damaged row record: Corruption naming the key space.
  std::vector<MemStore> d = a;
  auto space = d[0].OpenSpace(sparse::SparseTables::SpaceName(0, Emb()));
  ASSERT_TRUE(space.ok());
  auto batch = d[0].NewBatch();
  batch->Put(*space, "1234567", "short", "");
  ASSERT_TRUE(
      d[0].Write({}, batch.get(), SyncMode::kSync, WriteKind::kCut).ok());
  std::vector<MemStore> t(2);
  s = Reshard(Ptrs(d), Ptrs(t), {}, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_NE(s.message().find("table/0/"), std::string::npos) << s.ToString();
  EXPECT_EQ(t[0].writes() + t[1].writes(), 0u);
}

}  // namespace
}  // namespace asyncps::server
