// Issue 13, end to end with real ps_server processes and the worker's own
// Client / PsParameterStore: no acknowledged push lost when a durable shard
// is killed with pushes in flight, the SSP bound as documented (with and
// without prefetching), and requests too large for a shard refused at once.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <regex>
#include <thread>

#include "tests/util/process.h"
#include "worker/client.h"
#include "worker/ps_store.h"

namespace asyncps::testing {
namespace {

using std::chrono::milliseconds;
using worker::ChunkPayload;
using worker::Client;
using worker::ClientOptions;

uint64_t StatsValue(const std::string& json, const std::string& key) {
  std::smatch m;
  if (std::regex_search(json, m, std::regex("\"" + key + "\":([0-9]+)")))
    return std::stoull(m[1]);
  return ~uint64_t{0};
}

// Item 1: pushes of one client overtake each other after a reconnect (the
// socket's queued pushes go first, then the resends); each must be applied
// exactly once, so the recovered store holds every acknowledged push.
TEST(DurabilityTest, NoAcknowledgedPushLostWhenTheShardIsKilledMidFlight) {
  TempDir dir;
  const std::vector<std::string> flags = {
      "--shard_id=0", "--num_shards=1",         "--num_workers=1",  "--durable",
      "--lr=0.001",   "--checkpoint_every_s=0", "--consistency=asp"};
  auto first = StartServer(dir, "shard", flags);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const std::string endpoint = first->endpoint;
  ServerHandle shard = std::move(first).value();
  ClientOptions o;
  o.servers = {endpoint};
  o.rank = 0;
  o.attempt_timeout = milliseconds(500);
  o.deadline = milliseconds(60000);
  auto client = Client::Create(o);
  ASSERT_TRUE(client.ok());
  TensorSpec w{"w", {4096}, InitKind::kZeros, 0, 1};
  ASSERT_TRUE((*client)->Register({w}, {}).ok());
  auto push = [&]() {
    auto buf = Buffer::Allocate(4096 * 4);
    std::memset(buf->data(), 0, buf->size());
    std::vector<ChunkPayload> p{{0, 0, Frame::Ref(buf)}};
    auto t = (*client)->StartPush(0, std::move(p));
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return *t;
  };
  std::deque<Client::Ticket> in_flight;
  uint64_t acked = 0;
  auto wait_oldest = [&] {
    Status s = (*client)->Wait(in_flight.front(), milliseconds(60000));
    ASSERT_TRUE(s.ok()) << s.ToString();
    ++acked;
    in_flight.pop_front();
  };
  for (int kill = 0; kill < 6; ++kill) {
    for (int i = 0; i < 100; ++i) {
      in_flight.push_back(push());
      if (in_flight.size() > 4) wait_oldest();
    }
    // Kill -9 right behind a push, then push more while the shard is down:
    // they wait in the socket and reach the restarted shard before the
    // resends of the older ones.
    in_flight.push_back(push());
    shard.process->Kill(SIGKILL);
    for (int i = 0; i < 4; ++i) in_flight.push_back(push());
    auto again = StartServer(dir, "shard", flags, endpoint);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    shard = std::move(again).value();
  }
  while (!in_flight.empty()) wait_oldest();
  ASSERT_EQ(acked, 6u * 105);
  // What the store holds, read by a fresh shard process after kill -9.
  shard.process->Kill(SIGKILL);
  auto last = StartServer(dir, "shard", flags, endpoint);
  ASSERT_TRUE(last.ok());
  std::vector<std::string> stats;
  ASSERT_TRUE((*client)->Stats(&stats, milliseconds(10000)).ok());
  EXPECT_EQ(StatsValue(stats[0], "version"), acked) << stats[0];
}

// Item 10: the SSP bound, as docs/consistency.md "SSP bound" states it. Worker
// w's gradient of step c is 1 at element w*T+c and 0 elsewhere (SGD, lr 1, zero
// initial weights), so a pulled weight of -1 there proves that update is in.
// Every pull of step c must hold the updates of steps < c - s of every other
// worker, and of steps < c (without prefetching) or < c - 1 (with
// --prefetch_ahead) of the worker itself.
void CheckSspBound(bool prefetch) {
  constexpr int kWorkers = 3, kSteps = 40, kBound = 1;
  TempDir dir;
  auto shard = StartServer(
      dir, "shard",
      {"--shard_id=0", "--num_shards=1", "--num_workers=3", "--consistency=ssp",
       "--staleness=1", "--optimizer=sgd", "--lr=1", "--worker_timeout_s=60"});
  ASSERT_TRUE(shard.ok()) << shard.status().ToString();
  const std::vector<TensorSpec> model = {
      TensorSpec{"m", {kWorkers * kSteps}, InitKind::kZeros, 0, 1}};
  std::atomic<int> violations{0}, pulls{0}, errors{0};
  std::mutex mu;
  std::string first_violation;
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorkers; ++r) {
    threads.emplace_back([&, r] {
      ClientOptions o;
      o.servers = {shard->endpoint};
      o.rank = r;
      auto client = Client::Create(o);
      worker::PsStoreOptions so;
      so.prefetch_ahead = prefetch;
      auto store = client.ok() ? worker::PsParameterStore::Create(client->get(),
                                                                  model, so)
                               : client.status();
      if (!store.ok()) {
        ++errors;
        return;
      }
      std::mt19937 rng(17 + r);
      std::uniform_int_distribution<int> delay(0, 12);
      std::vector<float> w(kWorkers * kSteps), g(w.size());
      for (int c = 0; c < kSteps; ++c) {
        if (!(*store)->Pull(c, {w.data()}).ok()) {
          ++errors;
          return;
        }
        ++pulls;
        for (int other = 0; other < kWorkers; ++other) {
          const int need = other == r ? c - (prefetch ? 1 : 0) : c - kBound;
          for (int step = 0; step < need; ++step) {
            if (w[other * kSteps + step] != -1.0f) {
              ++violations;
              std::lock_guard<std::mutex> l(mu);
              if (first_violation.empty()) {
                first_violation = "rank " + std::to_string(r) + " at step " +
                                  std::to_string(c) + " lacks step " +
                                  std::to_string(step) + " of rank " +
                                  std::to_string(other);
              }
            }
          }
        }
        std::this_thread::sleep_for(milliseconds(delay(rng)));
        std::fill(g.begin(), g.end(), 0.0f);
        g[r * kSteps + c] = 1.0f;
        if (!(*store)->Push(c, {g.data()}).ok() ||
            !(*store)->Clock(c + 1).ok()) {
          ++errors;
          return;
        }
      }
      if (!(*store)->Flush().ok()) ++errors;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(pulls.load(), kWorkers * kSteps);
  EXPECT_EQ(violations.load(), 0) << first_violation;
}

TEST(SspBoundTest, HoldsWithoutPrefetching) { CheckSspBound(false); }
TEST(SspBoundTest, HoldsWithPrefetchAhead) { CheckSspBound(true); }

// Item 6: the client refuses a push a shard can never accept (the shard's
// limit came with the registration reply) instead of resending it until
// its deadline.
TEST(OversizeTest, ClientRefusesAPushOverTheShardsLimitAtOnce) {
  TempDir dir;
  auto shard = StartServer(dir, "shard",
                           {"--shard_id=0", "--num_shards=1", "--num_workers=1",
                            "--max_message_bytes=65536"});
  ASSERT_TRUE(shard.ok()) << shard.status().ToString();
  ClientOptions o;
  o.servers = {shard->endpoint};
  o.rank = 0;
  o.deadline = milliseconds(3000);
  auto client = Client::Create(o);
  ASSERT_TRUE(client.ok());
  LayoutOptions lo;
  lo.chunk_elems = 10000;
  lo.min_chunk_elems = 10000;
  TensorSpec w{"w", {100000}, InitKind::kZeros, 0, 1};
  ASSERT_TRUE((*client)->Register({w}, lo).ok());
  std::vector<ChunkPayload> p;
  for (const ChunkSpec& c : (*client)->layout().chunks()) {
    auto buf = Buffer::Allocate(c.num_elems * 4);
    std::memset(buf->data(), 0, buf->size());
    p.push_back({c.id, 0, Frame::Ref(buf)});
  }
  const auto start = std::chrono::steady_clock::now();
  Status st;
  auto t = (*client)->StartPush(0, std::move(p));
  st = t.ok() ? (*client)->Wait(*t, milliseconds(3000)) : t.status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1000));
}

}  // namespace
}  // namespace asyncps::testing
