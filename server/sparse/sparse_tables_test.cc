// SparseTables against real RocksDB stores in temp dirs: larger-than-cache
// correctness (bitwise, against an independent in-memory reference with the
// same optimizer), checkpoints and crash recovery (with and without durable
// writes), admission, expiry, BSP rounds and bad input.
#include "server/sparse/sparse_tables.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <unordered_map>

#include "server/optimizer/optimizer.h"
#include "tests/util/process.h"

namespace asyncps::server::sparse {
namespace {

using asyncps::testing::TempDir;

TableSpec Table(const std::string& name, uint32_t dim, RowOptimizerKind kind) {
  TableSpec t;
  t.name = name;
  t.dim = dim;
  t.init = InitKind::kNormal;
  t.init_param = 0.1f;
  t.seed = 11;
  t.optimizer.kind = kind;
  t.optimizer.lr = kind == RowOptimizerKind::kSgd ? 0.1f : 0.01f;
  t.optimizer.initial_accumulator = 0.1f;
  return t;
}

// The reference: a std::map of rows, updated with server/optimizer/optimizer.h
// on the same gradients, written independently of the cache and the store.
class Reference {
 public:
  explicit Reference(std::vector<TableSpec> specs) : specs_(std::move(specs)) {
    for (const TableSpec& t : specs_) {
      OptimizerOptions o;
      o.kind = t.optimizer.kind == RowOptimizerKind::kSgd ? OptimizerKind::kSgd
               : t.optimizer.kind == RowOptimizerKind::kAdaGrad
                   ? OptimizerKind::kAdaGrad
                   : OptimizerKind::kAdam;
      o.lr = t.optimizer.lr;
      o.beta1 = t.optimizer.beta1;
      o.beta2 = t.optimizer.beta2;
      o.eps = t.optimizer.eps;
      opt_.push_back(std::move(Optimizer::Create(o)).value());
      rows_.emplace_back();
      pushes_.emplace_back();
    }
  }
  void Push(uint32_t t, const uint64_t* keys, const float* g, size_t n,
            float lr_scale = 1.0f) {
    const TableSpec& s = specs_[t];
    for (size_t i = 0; i < n; ++i) {
      const uint64_t count = ++pushes_[t][keys[i]];
      if (s.admit_after_pushes > 1 && count < s.admit_after_pushes) continue;
      auto it = rows_[t].find(keys[i]);
      if (it == rows_[t].end()) {
        Row r;
        r.w.resize(s.dim);
        InitializeRow(s, keys[i], r.w.data());
        r.state.assign(s.dim * s.optimizer.state_per_elem(),
                       s.optimizer.kind == RowOptimizerKind::kAdaGrad
                           ? s.optimizer.initial_accumulator
                           : 0.0f);
        it = rows_[t].emplace(keys[i], std::move(r)).first;
      }
      Row& r = it->second;
      ++r.steps;
      opt_[t]->Apply(r.w.data(), r.state.data(), g + i * s.dim, s.dim, lr_scale,
                     r.steps);
    }
  }
  std::vector<float> Get(uint32_t t, uint64_t key) const {
    auto it = rows_[t].find(key);
    if (it != rows_[t].end()) return it->second.w;
    std::vector<float> v(specs_[t].dim);
    InitializeRow(specs_[t], key, v.data());
    return v;
  }
  size_t rows(uint32_t t) const { return rows_[t].size(); }

 private:
  struct Row {
    std::vector<float> w, state;
    uint64_t steps = 0;
  };
  std::vector<TableSpec> specs_;
  std::vector<std::unique_ptr<Optimizer>> opt_;
  std::vector<std::map<uint64_t, Row>> rows_;
  std::vector<std::unordered_map<uint64_t, uint64_t>> pushes_;
};

// A shard's worth of tables on a RocksDB store that can be "restarted".
class Harness {
 public:
  Harness(const std::string& path, std::vector<TableSpec> specs,
          uint64_t cache_bytes)
      : path_(path), specs_(std::move(specs)), cache_bytes_(cache_bytes) {
    Open(false);
  }

  // Opens the store (rolling back to the last cut if marked) and recovers.
  void Open(bool recover) {
    tables.reset();
    store.reset();
    RocksDbStoreOptions so;
    so.path = path_;
    so.write_buffer_bytes = 1 << 20;
    so.block_cache_bytes = 1 << 20;
    auto s = OpenRocksDbStore(so);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store = std::move(s).value();
    std::vector<TableSpec> specs = specs_;
    std::string state;
    if (recover) {
      ASSERT_TRUE(store
                      ->Scan([&](std::string_view k, std::string_view v) {
                        if (k == SparseTables::kTablesKey) {
                          auto p = SparseTables::ParseSpecs(v);
                          if (!p.ok()) return p.status();
                          specs = *p;
                        }
                        if (k == SparseTables::kStateKey) state = v;
                        return Status::OK();
                      })
                      .ok());
      EXPECT_EQ(specs, specs_);
    }
    SparseOptions o;
    o.cache_bytes = cache_bytes_;
    o.checkpoint_batch_bytes = 4096;  // several partial batches per cut
    auto t = SparseTables::Create(o, specs, store.get());
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tables = std::move(t).value();
    if (!state.empty()) {
      Status st = tables->RestoreState(state);
      ASSERT_TRUE(st.ok()) << st.ToString();
    }
  }

  // What the shard does for a checkpoint.
  void Checkpoint() {
    auto batch = store->NewBatch();
    ASSERT_TRUE(tables->FlushForCheckpoint(batch.get()).ok());
    std::vector<StoreEntry> entries;
    tables->AddSpecsEntry(&entries);
    tables->AddStateEntry(&entries);
    Status s =
        store->Write(entries, batch.get(), SyncMode::kSync, WriteKind::kCut);
    ASSERT_TRUE(s.ok()) << s.ToString();
    tables->CommitCheckpoint();
  }

  // A checked push; durable pushes are written before returning.
  Status Push(uint32_t t, const std::vector<uint64_t>& keys,
              const std::vector<float>& grads, int64_t clock, bool durable) {
    tables->BeginRequest();
    RETURN_IF_ERROR(tables->Check(t, keys.data(), keys.size(), grads.data()));
    RETURN_IF_ERROR(tables->Apply(t, keys.data(), grads.data(), keys.size(),
                                  clock, 1.0f, durable));
    if (!durable) return Status::OK();
    auto batch = store->NewBatch();
    tables->AddDurable(batch.get());
    std::vector<StoreEntry> entries;
    tables->AddStateEntry(&entries);
    Status s =
        store->Write(entries, batch.get(), SyncMode::kNoSync, WriteKind::kCut);
    tables->CommitDurable(s.ok());
    return s;
  }

  std::vector<float> Read(uint32_t t, const std::vector<uint64_t>& keys) {
    std::vector<float> out(keys.size() * specs_[t].dim);
    tables->BeginRequest();
    Status s = tables->Check(t, keys.data(), keys.size(), nullptr);
    EXPECT_TRUE(s.ok()) << s.ToString();
    s = tables->Read(t, keys.data(), keys.size(), out.data());
    EXPECT_TRUE(s.ok()) << s.ToString();
    return out;
  }

  std::unique_ptr<Store> store;
  std::unique_ptr<SparseTables> tables;

 private:
  std::string path_;
  std::vector<TableSpec> specs_;
  uint64_t cache_bytes_;
};

// Zipf(1.1)-distributed unique keys over [0, vocab), hashed so neighbours
// in rank are far apart in key space.
class Keys {
 public:
  Keys(uint64_t vocab, uint64_t seed) : rng_(seed) {
    cdf_.resize(vocab);
    double sum = 0;
    for (uint64_t i = 0; i < vocab; ++i)
      cdf_[i] = sum += 1.0 / std::pow(i + 1, 1.1);
    for (double& c : cdf_) c /= sum;
  }
  std::vector<uint64_t> Batch(size_t n) {
    std::vector<uint64_t> out;
    std::unordered_map<uint64_t, bool> seen;
    std::uniform_real_distribution<double> u(0, 1);
    while (out.size() < n) {
      uint64_t r =
          std::lower_bound(cdf_.begin(), cdf_.end(), u(rng_)) - cdf_.begin();
      uint64_t k = r * 0x9e3779b97f4a7c15ULL + 12345;
      if (seen.emplace(k, true).second) out.push_back(k);
    }
    return out;
  }
  std::vector<float> Grads(size_t n) {
    std::normal_distribution<float> g(0, 1);
    std::vector<float> v(n);
    for (float& x : v) x = g(rng_);
    return v;
  }

 private:
  std::mt19937_64 rng_;
  std::vector<double> cdf_;
};

void ExpectSame(Harness& h, const Reference& ref, uint32_t t,
                const std::vector<uint64_t>& keys, uint32_t dim) {
  std::vector<float> got = h.Read(t, keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    std::vector<float> want = ref.Get(t, keys[i]);
    ASSERT_EQ(
        0, std::memcmp(got.data() + i * dim, want.data(), dim * sizeof(float)))
        << "table " << t << " key " << keys[i] << ": got " << got[i * dim]
        << " want " << want[0];
  }
}

std::vector<uint64_t> AllKeys(uint64_t vocab) {
  std::vector<uint64_t> k(vocab);
  for (uint64_t i = 0; i < vocab; ++i) k[i] = i * 0x9e3779b97f4a7c15ULL + 12345;
  return k;
}

class LargerThanCacheTest : public ::testing::TestWithParam<RowOptimizerKind> {
};

// Three tables share a cache that holds a small fraction of their rows;
// after thousands of evictions and write-backs every row reads back bitwise
// equal to the reference.
TEST_P(LargerThanCacheTest, EveryRowBitwiseEqualAfterManyEvictions) {
  TempDir dir;
  std::vector<TableSpec> specs = {Table("a", 8, GetParam()),
                                  Table("b", 16, GetParam()),
                                  Table("c", 3, GetParam())};
  const uint64_t vocab = 4000;
  Harness h(dir.Sub("db"), specs, 48 << 10);  // ~1/10 of the rows
  Reference ref(specs);
  Keys gen(vocab, 5);
  for (int step = 0; step < 120; ++step) {
    const uint32_t t = step % 3;
    std::vector<uint64_t> keys = gen.Batch(300);
    std::vector<float> g = gen.Grads(keys.size() * specs[t].dim);
    ASSERT_TRUE(h.Push(t, keys, g, step, false).ok());
    ref.Push(t, keys.data(), g.data(), keys.size());
    if (step % 7 == 0) ExpectSame(h, ref, t, gen.Batch(200), specs[t].dim);
    EXPECT_LE(h.tables->cache_bytes(), 48u << 10);
  }
  for (uint32_t t = 0; t < 3; ++t)
    ExpectSame(h, ref, t, AllKeys(vocab), specs[t].dim);
  const TableCounters& c = h.tables->table(0).counters();
  EXPECT_GT(c.evictions, 1000u);
  EXPECT_GT(c.write_backs, 500u);
  EXPECT_GT(c.store_found, 500u);
  EXPECT_EQ(c.admitted, ref.rows(0));
}

INSTANTIATE_TEST_SUITE_P(Optimizers, LargerThanCacheTest,
                         ::testing::Values(RowOptimizerKind::kSgd,
                                           RowOptimizerKind::kAdaGrad,
                                           RowOptimizerKind::kAdam));

// A cache too small to keep one slice of rows: pulls copy the store's
// records straight into the reply (nothing enters the cache) and read the
// same values; rows still admitted by counters or not yet pushed read as
// their initial value.
TEST(SparseTablesTest, PullsPastATinyCacheReadTheStoreDirectly) {
  TempDir dir;
  TableSpec spec = Table("a", 8, RowOptimizerKind::kAdam);
  spec.admit_after_pushes = 2;
  std::vector<TableSpec> specs = {spec};
  Harness h(dir.Sub("db"), specs, 1);
  Reference ref(specs);
  Keys gen(2000, 13);
  for (int step = 0; step < 20; ++step) {
    auto keys = gen.Batch(200);
    auto g = gen.Grads(keys.size() * 8);
    ASSERT_TRUE(h.Push(0, keys, g, step, false).ok());
    ref.Push(0, keys.data(), g.data(), keys.size());
  }
  const TableCounters before = h.tables->table(0).counters();
  ExpectSame(h, ref, 0, AllKeys(2000), 8);
  const TableCounters& after = h.tables->table(0).counters();
  EXPECT_GT(after.store_found, before.store_found);
  EXPECT_EQ(after.evictions, before.evictions);  // nothing entered the cache
  EXPECT_EQ(h.tables->table(0).cache_rows(), 0u);
  EXPECT_EQ(h.tables->table(0).cache_counters(), 0u);
}

// Scan pages (rows evicted to RocksDB and cached ones merged, admission
// counters, expired entries left out) restored into a fresh store with
// their kinds and clocks: the tables then train on bitwise equal.
std::pair<std::vector<uint64_t>, std::vector<uint8_t>> ScanTable(
    SparseTables& t, size_t page) {
  std::vector<uint64_t> keys;
  std::vector<uint8_t> recs;
  const size_t bytes = t.table(0).saved_record_bytes();
  uint64_t from = 0;
  for (;;) {
    std::vector<uint64_t> k(page);
    std::vector<uint8_t> r(page * bytes);
    size_t n = 0;
    EXPECT_TRUE(t.Scan(0, from, page, k.data(), r.data(), &n).ok());
    keys.insert(keys.end(), k.begin(), k.begin() + n);
    recs.insert(recs.end(), r.begin(), r.begin() + n * bytes);
    if (n < page) break;
    from = keys.back() + 1;
  }
  return {keys, recs};
}

TEST(SparseTablesTest, ScannedEntriesRestoreThroughRocksDb) {
  TempDir dir;
  TableSpec spec = Table("a", 8, RowOptimizerKind::kAdam);
  spec.admit_after_pushes = 2;
  spec.expire_after_clocks = 3;
  std::vector<TableSpec> specs = {spec};
  Harness a(dir.Sub("a"), specs, 16 << 10);  // most rows in RocksDB
  Keys gen(3000, 21);
  for (int step = 0; step < 12; ++step) {
    a.tables->AdvanceClock(step / 2);
    auto keys = gen.Batch(200);
    ASSERT_TRUE(
        a.Push(0, keys, gen.Grads(keys.size() * 8), step / 2, false).ok());
  }
  a.Checkpoint();
  const auto all = ScanTable(*a.tables, 4096);
  EXPECT_EQ(ScanTable(*a.tables, 7), all);
  ASSERT_GT(all.first.size(), 500u);
  EXPECT_TRUE(std::is_sorted(all.first.begin(), all.first.end()));
  const size_t bytes = a.tables->table(0).saved_record_bytes();
  const size_t n = all.first.size();
  std::vector<uint32_t> kinds(n);
  std::vector<uint64_t> counts(n);
  std::vector<int64_t> clocks(n);
  std::vector<float> values(n * 8), state(n * 16);
  size_t counters = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* r = all.second.data() + i * bytes;
    std::memcpy(&kinds[i], r, 4);
    std::memcpy(&counts[i], r + 8, 8);
    std::memcpy(&clocks[i], r + 16, 8);
    std::memcpy(&values[i * 8], r + 24, 32);
    std::memcpy(&state[i * 16], r + 56, 64);
    counters += kinds[i] == kSavedCounter;
    EXPECT_GE(clocks[i], 5 - 3);  // expired entries are left out
  }
  EXPECT_GT(counters, 0u);
  EXPECT_LT(counters, n);
  Harness b(dir.Sub("b"), specs, 16 << 10);
  b.tables->AdvanceClock(5);
  b.tables->BeginRequest();
  ASSERT_TRUE(b.tables->Check(0, all.first.data(), n, values.data()).ok());
  ASSERT_TRUE(b.tables
                  ->Assign(0, all.first.data(), values.data(), n, 5, false,
                           state.data(), counts.data(), kinds.data(),
                           clocks.data())
                  .ok());
  EXPECT_EQ(ScanTable(*b.tables, 4096), all);
  for (int step = 12; step < 16; ++step) {
    auto keys = gen.Batch(200);
    auto g = gen.Grads(keys.size() * 8);
    for (Harness* h : {&a, &b}) {
      h->tables->AdvanceClock(step / 2);
      ASSERT_TRUE(h->Push(0, keys, g, step / 2, false).ok());
    }
  }
  EXPECT_EQ(ScanTable(*b.tables, 4096), ScanTable(*a.tables, 4096));
  const auto every = AllKeys(3000);
  EXPECT_EQ(b.Read(0, every), a.Read(0, every));
}

// Without durable writes a restart returns exactly the last checkpoint,
// although evicted rows newer than it had been written back in between.
TEST(SparseTablesTest, CrashRecoversTheLastCheckpointBitwise) {
  TempDir dir;
  std::vector<TableSpec> specs = {Table("a", 8, RowOptimizerKind::kAdam)};
  const uint64_t vocab = 3000;
  Harness h(dir.Sub("db"), specs, 32 << 10);
  Reference ref(specs);
  Keys gen(vocab, 9);
  for (int step = 0; step < 30; ++step) {
    auto keys = gen.Batch(300);
    auto g = gen.Grads(keys.size() * 8);
    ASSERT_TRUE(h.Push(0, keys, g, step, false).ok());
    ref.Push(0, keys.data(), g.data(), keys.size());
  }
  h.Checkpoint();
  const uint64_t writes_at_cut = h.tables->table(0).counters().store_writes;
  // More pushes: write-backs put rows newer than the cut into the store.
  for (int step = 30; step < 60; ++step) {
    auto keys = gen.Batch(300);
    auto g = gen.Grads(keys.size() * 8);
    ASSERT_TRUE(h.Push(0, keys, g, step, false).ok());
  }
  ASSERT_GT(h.tables->table(0).counters().store_writes, writes_at_cut + 100);
  h.Open(true);  // kill -9: nothing flushed, store reopened
  ExpectSame(h, ref, 0, AllKeys(vocab), 8);
  EXPECT_EQ(h.tables->table(0).counters().store_writes, writes_at_cut);
}

// With durable writes every acknowledged push survives a crash, also after
// a checkpoint followed by more write-backs.
TEST(SparseTablesTest, DurablePushesSurviveACrash) {
  TempDir dir;
  std::vector<TableSpec> specs = {Table("a", 4, RowOptimizerKind::kAdaGrad),
                                  Table("b", 8, RowOptimizerKind::kSgd)};
  const uint64_t vocab = 2000;
  Harness h(dir.Sub("db"), specs, 16 << 10);
  Reference ref(specs);
  Keys gen(vocab, 13);
  for (int step = 0; step < 40; ++step) {
    const uint32_t t = step % 2;
    auto keys = gen.Batch(200);
    auto g = gen.Grads(keys.size() * specs[t].dim);
    ASSERT_TRUE(h.Push(t, keys, g, step, true).ok());
    ref.Push(t, keys.data(), g.data(), keys.size());
    if (step == 20) h.Checkpoint();
  }
  h.Open(true);
  for (uint32_t t = 0; t < 2; ++t)
    ExpectSame(h, ref, t, AllKeys(vocab), specs[t].dim);
}

// Admission: the row exists from the N-th push on; earlier gradients are
// dropped and the key reads as its initial value.
TEST(SparseTablesTest, AdmissionStoresARowFromItsNthPush) {
  TempDir dir;
  TableSpec spec = Table("a", 4, RowOptimizerKind::kSgd);
  spec.admit_after_pushes = 3;
  Harness h(dir.Sub("db"), {spec}, 1 << 20);
  std::vector<float> init(4);
  InitializeRow(spec, 77, init.data());
  std::vector<float> g = {1, 2, 3, 4};
  for (int push = 1; push <= 2; ++push) {
    ASSERT_TRUE(h.Push(0, {77}, g, push, false).ok());
    EXPECT_EQ(h.Read(0, {77}), init) << "push " << push;
  }
  EXPECT_EQ(h.tables->table(0).counters().admitted, 0u);
  EXPECT_EQ(h.tables->table(0).counters().counted, 2u);
  h.Checkpoint();  // the counter survives a restart
  h.Open(true);
  EXPECT_EQ(h.Read(0, {77}), init);
  ASSERT_TRUE(h.Push(0, {77}, g, 3, false).ok());
  std::vector<float> want = init;
  for (int i = 0; i < 4; ++i) want[i] -= 0.1f * g[i];
  EXPECT_EQ(h.Read(0, {77}), want);
  EXPECT_EQ(h.tables->table(0).counters().admitted, 1u);
  // The reference agrees, and an admitted row then takes every push.
  Reference ref({spec});
  for (int i = 0; i < 4; ++i)
    ref.Push(0, std::vector<uint64_t>{77}.data(), g.data(), 1);
  ASSERT_TRUE(h.Push(0, {77}, g, 4, false).ok());
  EXPECT_EQ(h.Read(0, {77}), ref.Get(0, 77));
}

// Expiry: a row not pushed for more than N clocks reads as its initial
// value, and compaction deletes its record.
TEST(SparseTablesTest, RowsUnseenForNClocksExpire) {
  TempDir dir;
  TableSpec spec = Table("a", 4, RowOptimizerKind::kSgd);
  spec.expire_after_clocks = 5;
  Harness h(dir.Sub("db"), {spec}, 1 << 20);
  std::vector<float> g = {1, 1, 1, 1};
  std::vector<uint64_t> old_keys, fresh_keys;
  for (uint64_t k = 0; k < 100; ++k) old_keys.push_back(k);
  for (uint64_t k = 100; k < 200; ++k) fresh_keys.push_back(k);
  std::vector<float> g100(100 * 4, 1.0f);
  ASSERT_TRUE(h.Push(0, old_keys, g100, 1, false).ok());
  h.tables->AdvanceClock(4);
  ASSERT_TRUE(h.Push(0, fresh_keys, g100, 4, false).ok());
  h.Checkpoint();
  std::vector<float> init(4);
  InitializeRow(spec, 3, init.data());
  h.tables->AdvanceClock(6);  // 6 - 1 = 5: not yet expired
  EXPECT_NE(h.Read(0, {3}), init);
  h.tables->AdvanceClock(7);  // 7 - 1 > 5: expired
  EXPECT_EQ(h.Read(0, {3}), init);
  EXPECT_NE(h.Read(0, {103}), init);  // pushed at 4: alive
  EXPECT_GE(h.tables->table(0).counters().expired, 1u);
  // Expired in the store as well (after a restart, nothing cached).
  h.Checkpoint();
  h.Open(true);
  EXPECT_EQ(h.tables->clock(), 7);
  EXPECT_EQ(h.Read(0, {50}), [&] {
    std::vector<float> v(4);
    InitializeRow(spec, 50, v.data());
    return v;
  }());
  // Compaction drops the 100 expired records and keeps the others.
  ASSERT_TRUE(h.store->CompactSpace(h.tables->table(0).space()).ok());
  SpaceStats st = h.store->GetSpaceStats(h.tables->table(0).space());
  EXPECT_EQ(st.estimated_keys, 100u);
  // A pushed expired key starts again from its initial value.
  ASSERT_TRUE(h.Push(0, {3}, g, 8, false).ok());
  std::vector<float> want = init;
  for (float& v : want) v -= 0.1f;
  EXPECT_EQ(h.Read(0, {3}), want);
}

// BSP: the sums of a round are applied once, averaged over the pushes that
// carried the table, and survive a restart mid-round.
TEST(SparseTablesTest, BspRoundAppliesTheAverageOnce) {
  TempDir dir;
  TableSpec spec = Table("a", 2, RowOptimizerKind::kSgd);
  Harness h(dir.Sub("db"), {spec}, 1 << 20);
  std::vector<uint64_t> k1 = {1, 2}, k2 = {2, 3};
  std::vector<float> g1 = {1, 1, 2, 2}, g2 = {4, 4, 6, 6};
  h.tables->BeginRequest();
  ASSERT_TRUE(h.tables->Check(0, k1.data(), 2, g1.data()).ok());
  h.tables->Accumulate(0, k1.data(), g1.data(), 2);
  h.tables->Accumulate(0, k2.data(), g2.data(), 2);
  EXPECT_TRUE(h.tables->HasRoundSums());
  h.Checkpoint();
  h.Open(true);
  ASSERT_TRUE(h.tables->HasRoundSums());
  ASSERT_TRUE(h.tables->ApplyRound(1, 1.0f, false).ok());
  EXPECT_FALSE(h.tables->HasRoundSums());
  auto row = [&](uint64_t k, float g0) {
    std::vector<float> v(2);
    InitializeRow(spec, k, v.data());
    for (float& x : v) x -= 0.1f * g0;
    return v;
  };
  EXPECT_EQ(h.Read(0, {1}), row(1, 1.0f / 2));           // (1 + 0) / 2
  EXPECT_EQ(h.Read(0, {2}), row(2, (2.0f + 4.0f) / 2));  // (2 + 4) / 2
  EXPECT_EQ(h.Read(0, {3}), row(3, 6.0f / 2));
}

TEST(SparseTablesTest, BadInputIsRejectedWithAClearError) {
  TempDir dir;
  RocksDbStoreOptions so;
  so.path = dir.Sub("db");
  auto store = std::move(OpenRocksDbStore(so)).value();
  SparseOptions o;
  o.shard_id = 1;
  o.num_shards = 2;
  o.max_keys_per_request = 100;
  TableSpec spec = Table("emb", 2, RowOptimizerKind::kSgd);
  auto tables = std::move(SparseTables::Create(o, {spec}, store.get())).value();
  std::vector<uint64_t> mine, theirs;
  for (uint64_t k = 0; mine.size() < 60 || theirs.empty(); ++k) {
    (ShardOfKey(spec, k, 2) == 1 ? mine : theirs).push_back(k);
  }
  std::vector<float> rows(60 * 2, 0.5f);
  tables->BeginRequest();
  EXPECT_TRUE(tables->Check(0, mine.data(), 30, rows.data()).ok());
  // Unknown table.
  tables->BeginRequest();
  Status s = tables->Check(1, mine.data(), 1, rows.data());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("unknown table 1"), std::string::npos);
  // A key of shard 0.
  tables->BeginRequest();
  s = tables->Check(0, theirs.data(), 1, nullptr);
  EXPECT_NE(s.message().find("belongs to shard 0, not 1"), std::string::npos)
      << s.ToString();
  // Duplicate key.
  std::vector<uint64_t> dup = {mine[0], mine[1], mine[0]};
  tables->BeginRequest();
  s = tables->Check(0, dup.data(), 3, rows.data());
  EXPECT_NE(s.message().find("appears twice"), std::string::npos);
  // NaN and Inf rows.
  for (float bad : {NAN, INFINITY}) {
    std::vector<float> r = rows;
    r[7] = bad;
    tables->BeginRequest();
    s = tables->Check(0, mine.data(), 10, r.data());
    EXPECT_NE(s.message().find("key " + std::to_string(mine[3]) +
                               " contains NaN or Inf"),
              std::string::npos)
        << s.ToString();
  }
  // More keys than the limit, in one part or over several tables' parts.
  tables->BeginRequest();
  EXPECT_TRUE(tables->Check(0, mine.data(), 60, nullptr).ok());
  s = tables->Check(0, mine.data(), 41, nullptr);
  EXPECT_NE(s.message().find("more than 100 keys"), std::string::npos);
  // Nothing was applied by any of it.
  EXPECT_EQ(tables->table(0).counters().rows_pushed, 0u);
  EXPECT_EQ(tables->table(0).cache_rows(), 0u);
}

TEST(SparseTablesTest, StatsNameEveryCounter) {
  SparseOptions o;
  auto tables =
      std::move(SparseTables::Create(
                    o, {Table("emb", 4, RowOptimizerKind::kAdam)}, nullptr))
          .value();
  std::string j = tables->StatsJson();
  for (const char* f :
       {"\"name\":\"emb\"", "\"rows\":", "\"cache_bytes\":", "\"hit_rate\":",
        "\"rocksdb_reads\":", "\"rocksdb_writes\":", "\"admitted\":",
        "\"expired\":", "\"evictions\":", "\"cache_budget_bytes\":"}) {
    EXPECT_NE(j.find(f), std::string::npos) << f << " in " << j;
  }
}

}  // namespace
}  // namespace asyncps::server::sparse
