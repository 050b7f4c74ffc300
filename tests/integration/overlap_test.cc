// ps_worker --overlap (issue 22: the C++ worker overlaps communication with
// backward) end to end: real ps_server and ps_worker processes on loopback,
// real Fashion-MNIST data. Under BSP the final weights are bitwise those
// without --overlap; the SSP bound holds for the OverlapScheduler's pushes
// by layer, per-shard clocks and pulls by layer groups; bad flag
// combinations are clear errors.
#include "worker/overlap.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <random>
#include <regex>
#include <thread>

#include "tests/util/process.h"
#include "worker/backend.h"
#include "worker/client.h"
#include "worker/ps_store.h"

namespace asyncps::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

const char kFashionDir[] = "/usr/share/datasets/fashion-mnist";

bool HaveData() {
  return std::filesystem::exists(std::string(kFashionDir) +
                                 "/train-images-idx3-ubyte.gz");
}

// Value of `key=` on the worker's line starting with `tag`, or NaN.
double LineValue(const std::string& log, const std::string& tag,
                 const std::string& key) {
  std::smatch m;
  std::regex re(tag + " .*\\b" + key + "=([-0-9.eE+]+)");
  if (std::regex_search(log, m, re)) return std::stod(m[1]);
  return std::nan("");
}

struct FleetRun {
  std::vector<std::string> logs;     // per worker
  std::vector<std::string> weights;  // per worker: --weights_out bytes
};

// `shards` shards with `server_flags`, 2 workers with `worker_flags`; every
// worker must exit 0.
FleetRun RunFleet(int shards, const std::vector<std::string>& server_flags,
                  const std::vector<std::string>& worker_flags) {
  TempDir dir;
  std::vector<ServerHandle> servers;
  std::string endpoints;
  for (int s = 0; s < shards; ++s) {
    std::vector<std::string> f = {"--shard_id=" + std::to_string(s),
                                  "--num_shards=" + std::to_string(shards),
                                  "--num_workers=2", "--checkpoint_every_s=0"};
    f.insert(f.end(), server_flags.begin(), server_flags.end());
    auto h = StartServer(dir, "shard" + std::to_string(s), f);
    EXPECT_TRUE(h.ok()) << h.status().ToString();
    if (!h.ok()) return {};
    endpoints += (s ? "," : "") + h->endpoint;
    servers.push_back(std::move(h).value());
  }
  std::vector<std::unique_ptr<Process>> workers;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> a = {BinPath("ps_worker"),
                                  "--servers=" + endpoints,
                                  "--rank=" + std::to_string(r),
                                  "--num_workers=2",
                                  "--device=cpu",
                                  "--timeout_s=60",
                                  "--weights_out=" + dir.Sub("w{rank}")};
    a.insert(a.end(), worker_flags.begin(), worker_flags.end());
    auto w = Process::Start(a, dir.Sub("worker" + std::to_string(r) + ".log"));
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    if (!w.ok()) return {};
    workers.push_back(std::move(w).value());
  }
  FleetRun run;
  for (int r = 0; r < 2; ++r) {
    auto code = workers[r]->Wait(seconds(240));
    EXPECT_TRUE(code.ok()) << "worker " << r << " hung:\n" << workers[r]->Log();
    if (code.ok()) {
      EXPECT_EQ(*code, 0) << workers[r]->Log();
    }
    run.logs.push_back(workers[r]->Log());
    run.weights.push_back(ReadFile(dir.Sub("w" + std::to_string(r))));
  }
  return run;
}

// Issue 22's correctness bar: BSP with --overlap ends on the same bits.
// `both` go to both runs.
void CheckBspBitwise(int shards, const std::vector<std::string>& overlap,
                     const std::vector<std::string>& both = {}) {
  if (!HaveData()) GTEST_SKIP() << "Fashion-MNIST not installed";
  const std::vector<std::string> server = {"--consistency=bsp",
                                           "--optimizer=momentum", "--lr=0.05"};
  std::vector<std::string> common = {"--epochs=0", "--max_steps=24",
                                     "--batch=32", "--eval_every=10"};
  common.insert(common.end(), both.begin(), both.end());
  FleetRun plain = RunFleet(shards, server, common);
  std::vector<std::string> flags = common;
  flags.insert(flags.end(), overlap.begin(), overlap.end());
  FleetRun over = RunFleet(shards, server, flags);
  ASSERT_EQ(plain.weights.size(), 2u);
  ASSERT_EQ(over.weights.size(), 2u);
  // 784-256-128-10 in fp32.
  const size_t bytes = 4 * (784 * 256 + 256 + 256 * 128 + 128 + 1290);
  ASSERT_EQ(plain.weights[0].size(), bytes) << plain.logs[0];
  EXPECT_EQ(plain.weights[0], plain.weights[1]);
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(over.weights[r] == plain.weights[0])
        << "rank " << r << " with --overlap differs\n"
        << over.logs[r];
    // The overlapped path ran: one push per shard and step (BSP), a clock
    // per shard as soon as its push was out, 2 pull groups per step
    // (fc0; fc1 with fc2).
    EXPECT_EQ(LineValue(over.logs[r], "OVERLAP", "steps"), 24) << over.logs[r];
    EXPECT_EQ(LineValue(over.logs[r], "OVERLAP", "pushes"), 24 * shards);
    EXPECT_GE(LineValue(over.logs[r], "OVERLAP", "shard_clocks"), 24);
    EXPECT_EQ(LineValue(over.logs[r], "OVERLAP", "pull_groups"), 24 * 2);
    // With a sender thread, each step's end waited for it once.
    const bool sender = std::find(overlap.begin(), overlap.end(),
                                  "--overlap_sender_thread") != overlap.end();
    EXPECT_EQ(LineValue(over.logs[r], "OVERLAP", "sender_waits"),
              sender ? 24 : 0);
    EXPECT_TRUE(std::isnan(LineValue(plain.logs[r], "OVERLAP", "steps")));
  }
  // Rank 0 evaluated on the same weights both ways.
  EXPECT_EQ(LineValue(over.logs[0], "SUMMARY", "final_test_acc"),
            LineValue(plain.logs[0], "SUMMARY", "final_test_acc"));
}

TEST(OverlapIntegrationTest, BspOneShardIsBitwiseEqualWithoutOverlap) {
  CheckBspBitwise(1, {"--overlap"});
}

TEST(OverlapIntegrationTest, BspTwoShardsPipelinedIsBitwiseEqual) {
  CheckBspBitwise(2, {"--overlap", "--pipeline_shards=1"});
}

// The pushes, stage waits and per-shard clocks from the sender thread, with
// a compressing codec (error feedback on the sender's side) and the layers in
// order on the shards (fc2 and the end of fc0 first): the same bits.
TEST(OverlapIntegrationTest, BspSenderThreadIsBitwiseEqual) {
  CheckBspBitwise(
      2, {"--overlap", "--pipeline_shards=1", "--overlap_sender_thread"},
      {"--codec=topk:ratio=0.05,ef=1", "--placement=in_order"});
}

// The same on the GPU (the CUDA backend's layered step; tests/gpu/run.sh
// runs it on a GPU machine): both runs train on the device.
TEST(OverlapIntegrationTest, CudaBspIsBitwiseEqual) {
  if (!worker::BuiltWithCuda()) GTEST_SKIP() << "built without CUDA";
  if (worker::VisibleCudaDevices() == 0)
    GTEST_SKIP() << "no CUDA device visible";
  CheckBspBitwise(2, {"--overlap", "--pipeline_shards=1"}, {"--device=cuda"});
}

// SSP: pushes go per layer; training reaches the plain path's accuracy bar.
TEST(OverlapIntegrationTest, SspTrainsWithPushesPerLayer) {
  if (!HaveData()) GTEST_SKIP() << "Fashion-MNIST not installed";
  FleetRun run = RunFleet(
      2, {"--consistency=ssp", "--staleness=2", "--optimizer=sgd", "--lr=0.1"},
      {"--epochs=1", "--batch=64", "--overlap"});
  ASSERT_EQ(run.logs.size(), 2u);
  EXPECT_GE(LineValue(run.logs[0], "SUMMARY", "final_test_acc"), 0.75)
      << run.logs[0];
  for (const std::string& log : run.logs) {
    EXPECT_EQ(LineValue(log, "OVERLAP", "steps"), 469) << log;
    EXPECT_EQ(LineValue(log, "OVERLAP", "pushes"), 469 * 3) << log;
  }
}

// The SSP bound (docs/consistency.md "SSP bound") with the OverlapScheduler's
// pushes by layer, per-shard clocks and pulls by layer groups: worker w's
// gradient of step c is 1 at element w*T+c of every tensor (SGD, lr 1, zero
// initial weights), so a weight of -1 there proves that update is in. A pull of
// step c must hold every other worker's steps < c - s and the worker's own
// steps < c, in every layer.
TEST(OverlapIntegrationTest, SspBoundHoldsWithLayeredSteps) {
  constexpr int kWorkers = 3, kSteps = 30, kBound = 1, kShards = 2;
  constexpr int kElems = kWorkers * kSteps;
  TempDir dir;
  std::vector<ServerHandle> shards;
  std::vector<std::string> endpoints;
  for (int s = 0; s < kShards; ++s) {
    auto h = StartServer(
        dir, "shard" + std::to_string(s),
        {"--shard_id=" + std::to_string(s), "--num_shards=2", "--num_workers=3",
         "--consistency=ssp", "--staleness=1", "--optimizer=sgd", "--lr=1",
         "--worker_timeout_s=60", "--checkpoint_every_s=0"});
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    endpoints.push_back(h->endpoint);
    shards.push_back(std::move(h).value());
  }
  // Two layers of two tensors each, spread over both shards.
  std::vector<TensorSpec> model;
  for (const char* n : {"l0.w", "l0.b", "l1.w", "l1.b"})
    model.push_back(TensorSpec{n, {kElems}, InitKind::kZeros, 0, 1});
  std::atomic<int> violations{0}, pulls{0}, errors{0}, shard_clocks{0};
  std::mutex mu;
  std::string first_problem;
  auto fail = [&](const std::string& what, const Status& s) {
    ++errors;
    std::lock_guard<std::mutex> l(mu);
    if (first_problem.empty()) first_problem = what + ": " + s.ToString();
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorkers; ++r) {
    threads.emplace_back([&, r] {
      worker::ClientOptions o;
      o.servers = endpoints;
      o.rank = r;
      auto client = worker::Client::Create(o);
      if (!client.ok()) return fail("client", client.status());
      auto store = worker::PsParameterStore::Create(client->get(), model, {});
      if (!store.ok()) return fail("store", store.status());
      worker::OverlapOptions oo;
      oo.layers = {{0, 1}, {2, 3}};
      oo.buckets = worker::PushBuckets::kPerLayer;
      oo.min_pull_group_bytes = 0;  // one group per layer
      auto sched = worker::OverlapScheduler::Create(store->get(),
                                                    (*client)->layout(), oo);
      if (!sched.ok()) return fail("scheduler", sched.status());
      std::mt19937 rng(17 + r);
      std::uniform_int_distribution<int> delay(0, 10);
      std::vector<std::vector<float>> w(4, std::vector<float>(kElems));
      std::vector<std::vector<float>> g(4, std::vector<float>(kElems));
      std::vector<float*> wp;
      std::vector<const float*> gp;
      for (auto& t : w) wp.push_back(t.data());
      for (auto& t : g) gp.push_back(t.data());
      for (int c = 0; c < kSteps; ++c) {
        Status s = c == 0 ? (*store)->Pull(0, wp) : Status::OK();
        for (int layer = 0; s.ok() && layer < 2; ++layer)
          s = (*sched)->WaitLayer(layer, wp);
        if (!s.ok()) return fail("pull at step " + std::to_string(c), s);
        ++pulls;
        for (int other = 0; other < kWorkers; ++other) {
          const int need = other == r ? c : c - kBound;
          for (int step = 0; step < need; ++step) {
            for (int t = 0; t < 4; ++t) {
              if (w[t][other * kSteps + step] == -1.0f) continue;
              ++violations;
              std::lock_guard<std::mutex> l(mu);
              if (first_problem.empty()) {
                first_problem = "rank " + std::to_string(r) + " at step " +
                                std::to_string(c) + " lacks step " +
                                std::to_string(step) + " of rank " +
                                std::to_string(other) + " in tensor " +
                                std::to_string(t);
              }
            }
          }
        }
        std::this_thread::sleep_for(milliseconds(delay(rng)));
        s = (*sched)->BeginBackward(c, gp);
        // Backward order; each layer's gradient written just before its
        // hook, as the backend does.
        for (int layer = 1; s.ok() && layer >= 0; --layer) {
          for (int t : {2 * layer, 2 * layer + 1}) {
            std::fill(g[t].begin(), g[t].end(), 0.0f);
            g[t][r * kSteps + c] = 1.0f;
          }
          s = (*sched)->LayerGradientsReady(layer);
          if (s.ok() && layer == 1)
            std::this_thread::sleep_for(milliseconds(delay(rng)));
        }
        if (s.ok()) s = (*sched)->EndStep();
        if (!s.ok()) return fail("step " + std::to_string(c), s);
      }
      if (Status s = (*sched)->WaitLayer(1, wp); !s.ok())
        return fail("last pull", s);
      if (Status s = (*store)->Flush(); !s.ok()) return fail("flush", s);
      shard_clocks += static_cast<int>((*sched)->stats().shard_clocks);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0) << first_problem;
  EXPECT_EQ(pulls.load(), kWorkers * kSteps);
  EXPECT_EQ(violations.load(), 0) << first_problem;
  EXPECT_GT(shard_clocks.load(), 0);
}

TEST(OverlapIntegrationTest, BadFlagCombinationsAreClearErrors) {
  TempDir dir;
  struct Case {
    std::vector<std::string> flags;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"--overlap", "--prefetch_ahead"}, "--prefetch_ahead"},
      {{"--overlap", "--pull_codec=fp16"}, "--pull_codec"},
      {{"--pipeline_shards=2"}, "--pipeline_shards applies to --overlap"},
      {{"--overlap_sender_thread"},
       "--overlap_sender_thread applies to --overlap"},
      {{"--overlap", "--pipeline_shards=-1"}, "--pipeline_shards must be"},
      {{"--overlap", "--etcd=http://127.0.0.1:1"}, "--etcd"},
      {{"--overlap", "--role=eval"}, "--role=train"},
      {{"--placement=lpt"}, "--placement: unknown placement 'lpt'"},
      {{"--send_buffer_kb=3"},
       "--send_buffer_kb must be 0 (the OS default) or 4 to 65536 KiB, got 3"},
      {{"--send_buffer_kb=-64"}, "--send_buffer_kb must be 0"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    std::vector<std::string> a = {BinPath("ps_worker"),
                                  "--servers=tcp://127.0.0.1:1"};
    a.insert(a.end(), cases[i].flags.begin(), cases[i].flags.end());
    auto p = Process::Start(a, dir.Sub("bad" + std::to_string(i) + ".log"));
    ASSERT_TRUE(p.ok());
    auto code = (*p)->Wait(seconds(30));
    ASSERT_TRUE(code.ok()) << (*p)->Log();
    EXPECT_NE(*code, 0) << (*p)->Log();
    EXPECT_NE((*p)->Log().find(cases[i].says), std::string::npos)
        << cases[i].flags[0] << ":\n"
        << (*p)->Log();
  }
}

}  // namespace
}  // namespace asyncps::testing
