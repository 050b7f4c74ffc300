// Store: key spaces, MultiGet, batches and preserved cuts, on RocksDB in a
// temp dir and on MemStore (same contract).
#include "server/store/store.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <map>

#include "tests/util/process.h"

namespace asyncps::server {
namespace {

using asyncps::testing::TempDir;

std::map<std::string, std::string> Get(Store& s, SpaceId space,
                                       const std::vector<std::string>& keys) {
  std::vector<std::string_view> views(keys.begin(), keys.end());
  std::map<std::string, std::string> out;
  Status st = s.MultiGet(
      space, views.data(), views.size(),
      [&](size_t i, std::string_view v) { out[keys[i]] = std::string(v); });
  EXPECT_TRUE(st.ok()) << st.ToString();
  return out;
}

std::map<std::string, std::string> ScanAll(Store& s) {
  std::map<std::string, std::string> out;
  EXPECT_TRUE(s.Scan([&](std::string_view k, std::string_view v) {
                 out[std::string(k)] = std::string(v);
                 return Status::OK();
               }).ok());
  return out;
}

// Puts key -> value into `space` and the default-space entry d -> value in
// one atomic write.
Status Put(Store& s, SpaceId space, const std::string& key,
           const std::string& value, WriteKind kind) {
  auto b = s.NewBatch();
  b->Put(space, key, value.substr(0, 2), value.substr(2));
  StoreEntry e;
  e.key = "d";
  e.head = value;
  return s.Write({e}, b.get(), SyncMode::kNoSync, kind);
}

TEST(StoreTest, RocksDbSpacesMultiGetAndCutsSurviveReopen) {
  TempDir dir;
  RocksDbStoreOptions o;
  o.path = dir.Sub("db");
  SpaceId a, b;
  {
    auto s = std::move(OpenRocksDbStore(o)).value();
    a = *s->OpenSpace("rows/a");
    b = *s->OpenSpace("rows/b");
    EXPECT_NE(a, b);
    EXPECT_EQ(*s->OpenSpace("rows/a"), a);
    ASSERT_TRUE(Put(*s, a, "k1", "cut-1", WriteKind::kCut).ok());
    ASSERT_TRUE(Put(*s, b, "k1", "other", WriteKind::kCut).ok());
    auto got = Get(*s, a, {"k1", "k2"});
    EXPECT_EQ(got.size(), 1u);
    EXPECT_EQ(got["k1"], "cut-1");
    EXPECT_EQ(Get(*s, b, {"k1"})["k1"], "other");
    // The default space does not see the key spaces.
    EXPECT_EQ(ScanAll(*s).size(), 1u);
    // Deletes in a batch.
    auto batch = s->NewBatch();
    batch->Delete(b, "k1");
    ASSERT_TRUE(
        s->Write({}, batch.get(), SyncMode::kNoSync, WriteKind::kCut).ok());
    EXPECT_TRUE(Get(*s, b, {"k1"}).empty());
    // A partial write after the cut: preserved, and then "kill -9".
    ASSERT_TRUE(Put(*s, a, "k1", "partial", WriteKind::kPartial).ok());
    ASSERT_TRUE(Put(*s, a, "k2", "partial", WriteKind::kPartial).ok());
    EXPECT_EQ(Get(*s, a, {"k1"})["k1"], "partial");
    EXPECT_TRUE(std::filesystem::exists(o.path + ".cut"));
  }
  {
    // Reopening rolls back to the cut: the partial writes are gone.
    auto s = std::move(OpenRocksDbStore(o)).value();
    a = *s->OpenSpace("rows/a");
    auto got = Get(*s, a, {"k1", "k2"});
    EXPECT_EQ(got.size(), 1u);
    EXPECT_EQ(got["k1"], "cut-1");
    EXPECT_EQ(ScanAll(*s)["d"], "other");  // the last cut's
    EXPECT_FALSE(std::filesystem::exists(o.path + ".cut"));
    // Partial, then a cut: the cut wins and the preserved copy goes.
    ASSERT_TRUE(Put(*s, a, "k1", "partial-2", WriteKind::kPartial).ok());
    ASSERT_TRUE(Put(*s, a, "k2", "cut-2", WriteKind::kCut).ok());
    EXPECT_FALSE(std::filesystem::exists(o.path + ".cut"));
  }
  {
    auto s = std::move(OpenRocksDbStore(o)).value();
    a = *s->OpenSpace("rows/a");
    auto got = Get(*s, a, {"k1", "k2"});
    EXPECT_EQ(got["k1"], "partial-2");
    EXPECT_EQ(got["k2"], "cut-2");
  }
}

// A range delete drops [begin, end) of one space, nothing else; a partial
// one is rolled back by a reopen. Same on RocksDB and MemStore.
void CheckDeleteRange(Store& s, const std::function<void()>& reopen,
                      const std::function<Store&()>& store) {
  const SpaceId a = *s.OpenSpace("rows/a");
  const SpaceId b = *s.OpenSpace("rows/b");
  auto batch = s.NewBatch();
  for (const char* k : {"a", "b", "c", "d"}) {
    batch->Put(a, k, "v", k);
    batch->Put(b, k, "w", k);
  }
  ASSERT_TRUE(
      s.Write({}, batch.get(), SyncMode::kNoSync, WriteKind::kCut).ok());
  batch = s.NewBatch();
  batch->DeleteRange(a, "b", "d");
  ASSERT_TRUE(
      s.Write({}, batch.get(), SyncMode::kNoSync, WriteKind::kCut).ok());
  const std::vector<std::string> all = {"a", "b", "c", "d"};
  auto left = Get(s, a, all);
  EXPECT_EQ(left.size(), 2u);
  EXPECT_EQ(left.count("a") + left.count("d"), 2u);
  EXPECT_EQ(Get(s, b, all).size(), 4u);
  // The whole space, as a partial write: rolled back by a reopen.
  batch = s.NewBatch();
  batch->DeleteRange(a, "", std::string(9, '\xff'));
  ASSERT_TRUE(
      s.Write({}, batch.get(), SyncMode::kNoSync, WriteKind::kPartial).ok());
  EXPECT_TRUE(Get(s, a, all).empty());
  bool scanned = false;
  ASSERT_TRUE(s.ScanSpaceFrom(a, "", [&](std::string_view, std::string_view) {
                 scanned = true;
                 return true;
               }).ok());
  EXPECT_FALSE(scanned);
  reopen();
  Store& again = store();
  EXPECT_EQ(Get(again, *again.OpenSpace("rows/a"), all).size(), 2u);
  EXPECT_EQ(Get(again, *again.OpenSpace("rows/b"), all).size(), 4u);
}

TEST(StoreTest, DeleteRangeDropsOneRangeOfOneSpace) {
  TempDir dir;
  RocksDbStoreOptions o;
  o.path = dir.Sub("db");
  std::unique_ptr<Store> rocks = std::move(OpenRocksDbStore(o)).value();
  CheckDeleteRange(
      *rocks,
      [&] {
        rocks.reset();
        rocks = std::move(OpenRocksDbStore(o)).value();
      },
      [&]() -> Store& { return *rocks; });
  MemStore mem;
  CheckDeleteRange(
      mem, [&] { mem.Reopen(); }, [&]() -> Store& { return mem; });
}

TEST(StoreTest, MarkedStoreWithoutItsCutIsCorruption) {
  TempDir dir;
  RocksDbStoreOptions o;
  o.path = dir.Sub("db");
  {
    auto s = std::move(OpenRocksDbStore(o)).value();
    SpaceId a = *s->OpenSpace("x");
    ASSERT_TRUE(Put(*s, a, "k", "v1", WriteKind::kCut).ok());
    ASSERT_TRUE(Put(*s, a, "k", "v2", WriteKind::kPartial).ok());
  }
  std::filesystem::remove_all(o.path + ".cut");
  auto s = OpenRocksDbStore(o);
  EXPECT_EQ(s.status().code(), StatusCode::kCorruption);
  EXPECT_NE(s.status().message().find("preserved cut"), std::string::npos);
}

// Records "key<c>" for clocks c in [0, n), each value's first 8 bytes its
// clock (what the expiry filter reads), in one cut.
Status PutClocked(Store& s, SpaceId a, int64_t n) {
  auto batch = s.NewBatch();
  for (int64_t clock = 0; clock < n; ++clock) {
    std::string head(8, '\0');
    std::memcpy(head.data(), &clock, 8);
    batch->Put(a, "key" + std::to_string(clock), head, "body");
  }
  return s.Write({}, batch.get(), SyncMode::kNoSync, WriteKind::kCut);
}

TEST(StoreTest, ExpiryDropsOldRecordsOnCompaction) {
  TempDir dir;
  RocksDbStoreOptions o;
  o.path = dir.Sub("db");
  auto s = std::move(OpenRocksDbStore(o)).value();
  SpaceId a = *s->OpenSpace("x");
  ASSERT_TRUE(PutClocked(*s, a, 10).ok());
  s->SetSpaceExpiry(a, 0, 6);
  ASSERT_TRUE(s->CompactSpace(a).ok());
  std::vector<std::string> keys;
  for (int i = 0; i < 10; ++i) keys.push_back("key" + std::to_string(i));
  auto got = Get(*s, a, keys);
  EXPECT_EQ(got.size(), 4u);
  EXPECT_EQ(got.count("key5"), 0u);
  EXPECT_EQ(got.count("key6"), 1u);
  SpaceStats st = s->GetSpaceStats(a);
  EXPECT_EQ(st.estimated_keys, 4u);
  EXPECT_GT(st.disk_bytes, 0u);
}

// Everything a snapshot's scan sees, key -> value, from `start`.
std::map<std::string, std::string> SnapshotScan(const StoreSnapshot& snap,
                                                SpaceId space,
                                                std::string_view start = "") {
  std::map<std::string, std::string> out;
  Status st = snap.ScanSpaceFrom(space, start,
                                 [&](std::string_view k, std::string_view v) {
                                   out[std::string(k)] = std::string(v);
                                   return true;
                                 });
  EXPECT_TRUE(st.ok()) << st.ToString();
  return out;
}

// A snapshot sees a space as it was when it was taken: later puts, range
// deletes and partial writes do not show; the live store sees them. Same
// on RocksDB and MemStore.
void CheckSnapshot(Store& s) {
  const SpaceId a = *s.OpenSpace("rows/a");
  auto batch = s.NewBatch();
  for (const char* k : {"k1", "k2", "k3"}) batch->Put(a, k, "old-", k);
  ASSERT_TRUE(
      s.Write({}, batch.get(), SyncMode::kNoSync, WriteKind::kCut).ok());
  StatusOr<std::unique_ptr<StoreSnapshot>> snap = s.NewSnapshot();
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  batch = s.NewBatch();
  batch->Put(a, "k1", "new-", "k1");
  batch->DeleteRange(a, "k2", "k3");
  batch->Put(a, "k4", "new-", "k4");
  ASSERT_TRUE(
      s.Write({}, batch.get(), SyncMode::kNoSync, WriteKind::kPartial).ok());
  const std::map<std::string, std::string> then = {
      {"k1", "old-k1"}, {"k2", "old-k2"}, {"k3", "old-k3"}};
  EXPECT_EQ(SnapshotScan(**snap, a), then);
  EXPECT_EQ(
      SnapshotScan(**snap, a, "k2"),
      (std::map<std::string, std::string>{{"k2", "old-k2"}, {"k3", "old-k3"}}));
  auto now = Get(s, a, {"k1", "k2", "k3", "k4"});
  EXPECT_EQ(now, (std::map<std::string, std::string>{
                     {"k1", "new-k1"}, {"k3", "old-k3"}, {"k4", "new-k4"}}));
  // A scan stops where its function says.
  int seen = 0;
  ASSERT_TRUE((*snap)
                  ->ScanSpaceFrom(a, "",
                                  [&](std::string_view, std::string_view) {
                                    return ++seen < 2;
                                  })
                  .ok());
  EXPECT_EQ(seen, 2);
  EXPECT_FALSE(
      (*snap)->ScanSpaceFrom(99, "", [](auto, auto) { return true; }).ok());
}

TEST(StoreTest, SnapshotsSeeTheStoreAsItWasTaken) {
  TempDir dir;
  RocksDbStoreOptions o;
  o.path = dir.Sub("db");
  auto rocks = std::move(OpenRocksDbStore(o)).value();
  CheckSnapshot(*rocks);
  MemStore mem;
  CheckSnapshot(mem);
}

// RocksDB's compaction filter (expiry) does not spare what a snapshot sees
// (RocksDB 7: filters ignore snapshots): a record the expiry drops is gone
// from the snapshot's scan too. That is why the sparse tables hold their
// expiry back while a point-in-time scan is open
// (SparseTables::HoldExpiry).
TEST(StoreTest, ExpiryCompactionReachesIntoSnapshots) {
  TempDir dir;
  RocksDbStoreOptions o;
  o.path = dir.Sub("db");
  auto s = std::move(OpenRocksDbStore(o)).value();
  SpaceId a = *s->OpenSpace("x");
  ASSERT_TRUE(PutClocked(*s, a, 4).ok());
  auto snap = std::move(s->NewSnapshot()).value();
  EXPECT_EQ(SnapshotScan(*snap, a).size(), 4u);
  s->SetSpaceExpiry(a, 0, 2);
  ASSERT_TRUE(s->CompactSpace(a).ok());
  EXPECT_EQ(SnapshotScan(*snap, a).size(), 2u);
}

TEST(StoreTest, MemStoreHasTheSameCutSemantics) {
  MemStore s;
  SpaceId a = *s.OpenSpace("a");
  ASSERT_TRUE(Put(s, a, "k", "cut-1", WriteKind::kCut).ok());
  ASSERT_TRUE(Put(s, a, "k", "partial", WriteKind::kPartial).ok());
  EXPECT_EQ(Get(s, a, {"k"})["k"], "partial");
  s.Reopen();
  EXPECT_EQ(Get(s, a, {"k"})["k"], "cut-1");
  EXPECT_EQ(ScanAll(s)["d"], "cut-1");
  ASSERT_TRUE(Put(s, a, "k", "partial", WriteKind::kPartial).ok());
  ASSERT_TRUE(Put(s, a, "j", "cut-2", WriteKind::kCut).ok());
  s.Reopen();
  EXPECT_EQ(Get(s, a, {"k"})["k"], "partial");
  EXPECT_EQ(s.GetSpaceStats(a).estimated_keys, 2u);
}

}  // namespace
}  // namespace asyncps::server
