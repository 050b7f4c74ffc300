// Checkpoint / recovery / durable mode, on the in-memory store and RocksDB.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "server/shard/shard.h"
#include "server/store/store.h"
#include "server/testing/fault_store.h"
#include "server/testing/test_util.h"

namespace asyncps::server {
namespace {

using testing::FaultInjectionStore;
using testing::Floats;
using testing::ShardHarness;
using testing::SmallLayout;
using testing::SmallModel;

ShardOptions AdamOpts(Consistency c = Consistency::kAsp) {
  ShardOptions o;
  o.num_shards = 2;
  o.num_workers = 2;
  o.consistency = c;
  o.optimizer.kind = OptimizerKind::kAdam;
  o.optimizer.lr = 0.01f;
  return o;
}

// Registers and applies a few pushes with varied gradients.
void Drive(ShardHarness& h, int pushes) {
  ASSERT_TRUE(h.Call(ShardHarness::Register(0, SmallModel(), SmallLayout(2)))
                  .status.ok());
  for (int i = 0; i < pushes; ++i) {
    std::vector<float> a(16), b(10);
    for (size_t j = 0; j < a.size(); ++j)
      a[j] = 0.01f * static_cast<float>(i * 16 + j) - 0.3f;
    for (size_t j = 0; j < b.size(); ++j)
      b[j] = 0.5f - 0.07f * static_cast<float>(i + j);
    auto fa = Floats(a), fb = Floats(b);
    if (h.options.consistency == Consistency::kBsp) {
      // Both workers push for round i, then both clock.
      for (int rank = 0; rank < 2; ++rank) {
        ReplyHeader r =
            h.Call(ShardHarness::Push(rank, i, {2, 4}, {fa, fb}), {fa, fb});
        ASSERT_TRUE(r.status.ok()) << r.status.ToString();
      }
      for (int rank = 0; rank < 2; ++rank) {
        ASSERT_TRUE(h.Call(ShardHarness::Clock(rank, i + 1)).status.ok());
      }
      continue;
    }
    ReplyHeader r =
        h.Call(ShardHarness::Push(i % 2, i, {2, 4}, {fa, fb}), {fa, fb});
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    ASSERT_TRUE(h.Call(ShardHarness::Clock(i % 2, i + 1)).status.ok());
  }
}

void ExpectSameState(const ShardHarness& a, const ShardHarness& b) {
  EXPECT_EQ(a.AllWeights(),
            b.AllWeights());  // weights + optimizer state, bitwise
  EXPECT_EQ(a.shard->shard_version(), b.shard->shard_version());
  for (uint32_t id : {0u, 2u, 4u})
    EXPECT_EQ(a.shard->chunk_version(id), b.shard->chunk_version(id));
  EXPECT_EQ(a.shard->clocks().clocks(), b.shard->clocks().clocks());
  EXPECT_EQ(a.shard->counters().pushes, b.shard->counters().pushes);
  EXPECT_EQ(a.shard->staleness().buckets(), b.shard->staleness().buckets());
}

TEST(ShardPersistTest, CheckpointRecoversBitwise) {
  MemStore store;
  ShardHarness a(AdamOpts(), &store);
  Drive(a, 5);
  ASSERT_TRUE(a.shard->Checkpoint().ok());
  ShardHarness b(AdamOpts(), &store);
  ASSERT_TRUE(b.shard->registered());
  ExpectSameState(a, b);
  // Recovered shards keep their weights on re-registration.
  ReplyHeader r =
      b.Call(ShardHarness::Register(1, SmallModel(), SmallLayout(2)));
  EXPECT_TRUE(r.status.ok());
  EXPECT_FALSE(r.created);
  ExpectSameState(a, b);
  // Both continue identically, including the resent-push dedup table.
  Drive(a, 0);
}

// A model registered with in-order placement: the shard holds the chunks
// that placement gives it, refuses a registration naming another placement,
// and keeps the placement across a restart (the layout record's version 2).
TEST(ShardPersistTest, InOrderPlacementIsKeptAndEnforced) {
  MemStore store;
  LayoutOptions in_order = SmallLayout(2);
  in_order.placement = Placement::kInOrder;
  ShardHarness a(AdamOpts(), &store);
  ReplyHeader r = a.Call(ShardHarness::Register(0, SmallModel(), in_order));
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(a.shard->layout()->options().placement, Placement::kInOrder);
  // 74 floats: "w" in chunks 0-3 of 16, "b" chunk 4. In order: 0-1 here.
  EXPECT_EQ(a.shard->layout()->shard_chunks(0), (std::vector<uint32_t>{0, 1}));
  r = a.Call(ShardHarness::Register(1, SmallModel(), SmallLayout(2)));
  EXPECT_EQ(r.status.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(r.status.message().find("placement balanced"), std::string::npos)
      << r.status.ToString();
  EXPECT_EQ(
      a.shard->counters()
          .rejected[static_cast<size_t>(RejectReason::kRegistrationMismatch)],
      1u);
  auto g = Floats(std::vector<float>(16, 0.5f));
  ASSERT_TRUE(a.Call(ShardHarness::Push(0, 0, {1}, {g}), {g}).status.ok());
  ASSERT_TRUE(a.shard->Checkpoint().ok());

  ShardHarness b(AdamOpts(), &store);
  ASSERT_TRUE(b.shard->registered());
  EXPECT_EQ(b.shard->layout()->options().placement, Placement::kInOrder);
  EXPECT_EQ(b.shard->layout()->shard_chunks(0), (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(b.AllWeights(), a.AllWeights());
  EXPECT_EQ(b.Call(ShardHarness::Register(1, SmallModel(), SmallLayout(2)))
                .status.code(),
            StatusCode::kAlreadyExists);
  r = b.Call(ShardHarness::Register(1, SmallModel(), in_order));
  EXPECT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_FALSE(r.created);
  EXPECT_EQ(b.AllWeights(), a.AllWeights());
}

TEST(ShardPersistTest, WithoutCheckpointRestartLosesPushesButKeepsLayout) {
  MemStore store;
  ShardHarness a(AdamOpts(), &store);
  Drive(a, 3);
  ShardHarness b(AdamOpts(), &store);
  ASSERT_TRUE(b.shard->registered());
  EXPECT_EQ(b.shard->shard_version(), 0u);
}

TEST(ShardPersistTest, DurableModeKeepsEveryAcknowledgedPush) {
  for (Consistency c : {Consistency::kAsp, Consistency::kBsp}) {
    MemStore store;
    ShardOptions o = AdamOpts(c);
    o.durable = true;
    ShardHarness a(o, &store);
    Drive(a, 4);
    // BSP: a push of the open round is acknowledged; it must survive too.
    auto g = Floats(std::vector<float>(10, 1.0f));
    if (c == Consistency::kBsp) {
      ASSERT_TRUE(
          a.Call(ShardHarness::Push(0, a.shard->bsp_round(), {4}, {g}), {g})
              .status.ok());
    }
    ShardHarness b(o, &store);
    ExpectSameState(a, b);
    // The dedup table survived: a resent push is not applied twice.
    auto req = ShardHarness::Push(1, b.shard->bsp_round(), {4}, {g});
    req.id = 1000;
    ASSERT_TRUE(b.Call(req, {g}).status.ok());
    ShardHarness c2(o, &store);
    ASSERT_TRUE(c2.Call(req, {g}).status.ok());
    EXPECT_EQ(c2.shard->counters().duplicate_pushes, 1u);
    ExpectSameState(b, c2);
  }
}

TEST(ShardPersistTest, FailedDurableWriteIsNotAcknowledged) {
  MemStore store;
  ShardOptions o = AdamOpts();
  o.durable = true;
  ShardHarness a(o, &store);
  Drive(a, 1);
  store.FailWrites(true);
  auto g = Floats(std::vector<float>(10, 1.0f));
  ReplyHeader r = a.Call(ShardHarness::Push(0, 1, {4}, {g}), {g});
  EXPECT_EQ(r.status.code(), StatusCode::kUnavailable);
  EXPECT_FALSE(a.shard->Checkpoint().ok());
}

TEST(ShardPersistTest, StoreOfAnotherShardIsRefused) {
  MemStore store;
  ShardHarness a(AdamOpts(), &store);
  Drive(a, 1);
  ASSERT_TRUE(a.shard->Checkpoint().ok());
  ShardOptions o = AdamOpts();
  o.shard_id = 1;
  auto s = Shard::Create(o, &store, std::chrono::steady_clock::now());
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
}

// A RocksDB store in a fresh temp dir, removed with it.
struct TempRocksDb {
  TempRocksDb() {
    char tmpl[] = "/tmp/asyncps_store_XXXXXX";
    EXPECT_NE(mkdtemp(tmpl), nullptr);
    dir = tmpl;
    options.path = dir + "/db";
  }
  ~TempRocksDb() { std::filesystem::remove_all(dir); }
  std::string dir;
  RocksDbStoreOptions options;
};

TEST(ShardPersistTest, RocksDbCheckpointRecoversBitwise) {
  TempRocksDb db;
  const RocksDbStoreOptions& so = db.options;
  {
    auto store = OpenRocksDbStore(so);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    ShardHarness a(AdamOpts(), store->get());
    Drive(a, 6);
    ASSERT_TRUE(a.shard->Checkpoint().ok());
    auto snapshot = a.AllWeights();
    Drive(a, 0);
    store->reset();  // close
    auto reopened = OpenRocksDbStore(so);
    ASSERT_TRUE(reopened.ok());
    ShardHarness b(AdamOpts(), reopened->get());
    ExpectSameState(a, b);
  }
}

// Issue 13, item 2: a push whose durable write failed must not be
// acknowledged until it is stored, so kill -9 after its acknowledgement
// loses nothing. A child process drives a shard on RocksDB through a
// fault-injecting store and is killed with SIGKILL; the parent recovers.
TEST(ShardPersistTest, AckedPushSurvivesAFailedWriteAndKill9) {
  TempRocksDb db;
  const RocksDbStoreOptions& so = db.options;
  ShardOptions o = AdamOpts();
  o.durable = true;
  auto grad = [] { return Floats(std::vector<float>(10, 1.0f)); };
  auto push = [&](uint64_t id) {
    auto g = grad();
    RequestHeader req = ShardHarness::Push(0, 0, {4}, {g});
    req.id = id;
    return req;
  };
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: a byte per check, then SIGKILL (no destructor, no checkpoint).
    close(pipefd[0]);
    auto report = [&](char c) { (void)!write(pipefd[1], &c, 1); };
    auto base = OpenRocksDbStore(so);
    if (!base.ok()) report('S');
    FaultInjectionStore store(base->get());
    ShardHarness a(o, &store);
    if (!a.Call(ShardHarness::Register(0, SmallModel(), SmallLayout(2)))
             .status.ok())
      report('R');
    if (!a.Call(push(10), {grad()}).status.ok()) report('A');
    store.FailWrites(true);
    if (a.Call(push(11), {grad()}).status.code() != StatusCode::kUnavailable)
      report('B');
    // The client's retry while the store fails: not acknowledged.
    if (a.Call(push(11), {grad()}).status.ok()) report('C');
    store.FailWrites(false);
    std::vector<OutgoingReply> out;
    a.now += std::chrono::seconds(1);
    a.shard->Tick(a.now, &out);  // the repair checkpoint
    if (!a.Call(push(11), {grad()}).status.ok()) report('D');  // acked now
    report('K');
    close(pipefd[1]);
    kill(getpid(), SIGKILL);
  }
  close(pipefd[1]);
  std::string got;
  char c;
  while (read(pipefd[0], &c, 1) == 1) got += c;
  close(pipefd[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_EQ(got, "K") << "failed checks in the child: " << got;
  {
    auto store = OpenRocksDbStore(so);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    ShardHarness b(o, store->get());
    EXPECT_EQ(b.shard->shard_version(), 2u);  // both acknowledged pushes
    // Push 11 is known as applied: the client's next resend is no update.
    ASSERT_TRUE(b.Call(push(11), {grad()}).status.ok());
    EXPECT_EQ(b.shard->shard_version(), 2u);
    EXPECT_EQ(b.shard->counters().duplicate_pushes, 1u);
  }
}

}  // namespace
}  // namespace asyncps::server
