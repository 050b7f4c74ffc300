// End-to-end training: ps_server shards + ps_worker processes on loopback.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <regex>
#include <thread>

#include "tests/util/process.h"

namespace asyncps::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Value of `key=` in the worker's SUMMARY line, or NaN.
double SummaryValue(const std::string& log, const std::string& key) {
  std::smatch m;
  std::regex re("SUMMARY .*\\b" + key + "=([-0-9.eE+]+)");
  if (std::regex_search(log, m, re)) return std::stod(m[1]);
  return std::nan("");
}

std::vector<std::string> WorkerArgs(const std::string& servers, int rank,
                                    int workers,
                                    const std::vector<std::string>& extra) {
  std::vector<std::string> a = {BinPath("ps_worker"),
                                "--servers=" + servers,
                                "--rank=" + std::to_string(rank),
                                "--num_workers=" + std::to_string(workers),
                                "--log_every=100",
                                "--timeout_s=60"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// Starts `n` workers of `n` against `servers` (logs worker<r>.log in `dir`);
// `extra(r)` gives each rank's own flags.
std::vector<std::unique_ptr<Process>> StartWorkers(
    const TempDir& dir, const std::string& servers, int n,
    const std::function<std::vector<std::string>(int)>& extra) {
  std::vector<std::unique_ptr<Process>> workers;
  for (int r = 0; r < n; ++r) {
    auto w = Process::Start(WorkerArgs(servers, r, n, extra(r)),
                            dir.Sub("worker" + std::to_string(r) + ".log"));
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    if (w.ok()) workers.push_back(std::move(*w));
  }
  return workers;
}

// Waits for every worker; each must exit 0.
void ExpectAllFinish(const std::vector<std::unique_ptr<Process>>& workers) {
  for (size_t r = 0; r < workers.size(); ++r) {
    auto code = workers[r]->Wait(seconds(240));
    ASSERT_TRUE(code.ok()) << "worker " << r << " hung:\n" << workers[r]->Log();
    EXPECT_EQ(*code, 0) << workers[r]->Log();
  }
}

TEST(TrainingIntegrationTest, OneShardTwoWorkersReachAccuracyBarInOneEpoch) {
  TempDir dir;
  auto server = StartServer(
      dir, "shard0",
      {"--shard_id=0", "--num_shards=1", "--num_workers=2", "--consistency=ssp",
       "--staleness=2", "--optimizer=sgd", "--lr=0.1"});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto workers = StartWorkers(dir, server->endpoint, 2, [&](int r) {
    return std::vector<std::string>{
        "--epochs=1", "--batch=64",
        "--metrics_csv=" + dir.Sub("m" + std::to_string(r))};
  });
  ASSERT_EQ(workers.size(), 2u);
  ExpectAllFinish(workers);
  std::string log0 = workers[0]->Log();
  double acc = SummaryValue(log0, "final_test_acc");
  EXPECT_GE(acc, 0.75) << log0;
  EXPECT_GT(SummaryValue(log0, "bytes_pulled"), 0);
  // Each worker trained on its own half: one epoch is 30000 / 64 steps.
  EXPECT_EQ(SummaryValue(workers[1]->Log(), "steps"), 469);
  std::string csv = ReadFile(dir.Sub("m0"));
  EXPECT_NE(csv.find("wall_s,rank,step"), std::string::npos)
      << csv.substr(0, 200);
}

TEST(TrainingIntegrationTest, WorkerResumesWhenItsShardIsRestarted) {
  TempDir dir;
  std::vector<std::string> flags = {
      "--shard_id=0",          "--num_shards=1",       "--num_workers=1",
      "--consistency=asp",     "--optimizer=momentum", "--lr=0.05",
      "--checkpoint_every_s=1"};
  auto server = StartServer(dir, "shard0", flags);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const std::string endpoint = server->endpoint;
  auto w = Process::Start(
      WorkerArgs(endpoint, 0, 1,
                 {"--max_steps=2500", "--epochs=0", "--slowdown=2"}),
      dir.Sub("worker.log"));
  ASSERT_TRUE(w.ok());
  std::this_thread::sleep_for(milliseconds(2500));
  ASSERT_TRUE((*w)->Running()) << (*w)->Log();
  server->process->Kill(SIGKILL);
  std::this_thread::sleep_for(milliseconds(300));
  // Same endpoint, same RocksDB store: the shard recovers its last checkpoint.
  auto again = StartServer(dir, "shard0", flags, endpoint);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  auto code = (*w)->Wait(seconds(180));
  ASSERT_TRUE(code.ok()) << (*w)->Log();
  std::string log = (*w)->Log();
  EXPECT_EQ(*code, 0) << log;
  EXPECT_EQ(SummaryValue(log, "steps"), 2500) << log;
  EXPECT_GE(SummaryValue(log, "final_test_acc"), 0.7) << log;
}

TEST(TrainingIntegrationTest, BadWorkerFlagsAreClearErrors) {
  TempDir dir;
  auto bad_batch = Process::Start(
      WorkerArgs("tcp://127.0.0.1:1", 0, 1, {"--batch=0"}), dir.Sub("a.log"));
  ASSERT_TRUE(bad_batch.ok());
  EXPECT_NE(*(*bad_batch)->Wait(seconds(30)), 0);
  EXPECT_NE((*bad_batch)->Log().find("--batch"), std::string::npos)
      << (*bad_batch)->Log();

  auto bad_rank = Process::Start(WorkerArgs("tcp://127.0.0.1:1", 3, 2, {}),
                                 dir.Sub("b.log"));
  ASSERT_TRUE(bad_rank.ok());
  EXPECT_NE(*(*bad_rank)->Wait(seconds(30)), 0);
  EXPECT_NE((*bad_rank)->Log().find("--rank"), std::string::npos)
      << (*bad_rank)->Log();

  auto no_data =
      Process::Start(WorkerArgs("tcp://127.0.0.1:1", 0, 1,
                                {"--data_dir=" + dir.Sub("nothing")}),
                     dir.Sub("c.log"));
  ASSERT_TRUE(no_data.ok());
  EXPECT_NE(*(*no_data)->Wait(seconds(30)), 0);
  EXPECT_NE((*no_data)->Log().find("nothing/train-images"), std::string::npos)
      << (*no_data)->Log();

  auto bad_layers =
      Process::Start(WorkerArgs("tcp://127.0.0.1:1", 0, 1, {"--layers=100,10"}),
                     dir.Sub("d.log"));
  ASSERT_TRUE(bad_layers.ok());
  EXPECT_NE(*(*bad_layers)->Wait(seconds(30)), 0);
  EXPECT_NE((*bad_layers)->Log().find("784"), std::string::npos)
      << (*bad_layers)->Log();
}

}  // namespace
}  // namespace asyncps::testing

namespace asyncps::testing {
namespace {

TEST(TrainingIntegrationTest, DedicatedEvaluatorWatchesTrainingToTheEnd) {
  TempDir dir;
  auto server = StartServer(
      dir, "shard0",
      {"--shard_id=0", "--num_shards=1", "--num_workers=2", "--consistency=ssp",
       "--staleness=1", "--optimizer=sgd", "--lr=0.1"});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto eval = Process::Start(
      WorkerArgs(server->endpoint, 0, 2,
                 {"--role=eval", "--epochs=1", "--eval_interval_ms=300",
                  "--metrics_csv=" + dir.Sub("eval.csv")}),
      dir.Sub("eval.log"));
  ASSERT_TRUE(eval.ok());
  auto workers = StartWorkers(dir, server->endpoint, 2, [](int) {
    return std::vector<std::string>{"--epochs=1", "--eval=false"};
  });
  ASSERT_EQ(workers.size(), 2u);
  ExpectAllFinish(workers);
  for (auto& w : workers) {
    EXPECT_EQ(SummaryValue(w->Log(), "final_test_acc"), -1)
        << "workers did not evaluate";
  }
  auto code = (*eval)->Wait(seconds(60));
  ASSERT_TRUE(code.ok()) << (*eval)->Log();
  EXPECT_EQ(*code, 0) << (*eval)->Log();
  std::string log = (*eval)->Log();
  EXPECT_GE(SummaryValue(log, "final_test_acc"), 0.75) << log;
  EXPECT_EQ(SummaryValue(log, "min_clock"), 469) << log;
  EXPECT_GE(SummaryValue(log, "evaluations"), 2) << log;
  EXPECT_NE(ReadFile(dir.Sub("eval.csv")).find(",-1,"), std::string::npos);
}

}  // namespace
}  // namespace asyncps::testing

namespace asyncps::testing {
namespace {

TEST(TrainingIntegrationTest,
     TopKPullsOfTheChangeKeepAccuracyAndCutPulledBytes) {
  TempDir dir;
  auto server = StartServer(
      dir, "shard0",
      {"--shard_id=0", "--num_shards=1", "--num_workers=2", "--consistency=ssp",
       "--staleness=2", "--optimizer=sgd", "--lr=0.1"});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto workers = StartWorkers(dir, server->endpoint, 2, [](int) {
    return std::vector<std::string>{
        "--epochs=1", "--pull_codec=topk:ratio=0.02", "--codec=int8"};
  });
  ASSERT_EQ(workers.size(), 2u);
  ExpectAllFinish(workers);
  std::string log = workers[0]->Log();
  EXPECT_GE(SummaryValue(log, "final_test_acc"), 0.75) << log;
  // Dense fp32 pulls of 469 steps would be 469 x 940584 bytes; top-k 2% of
  // the change (index + value per element) is a small fraction of that.
  EXPECT_LT(SummaryValue(log, "bytes_pulled"), 0.15 * 469 * 940584.0) << log;
  EXPECT_LT(SummaryValue(log, "bytes_pushed_wire"),
            0.3 * SummaryValue(log, "bytes_pushed_raw"))
      << log;
}

}  // namespace
}  // namespace asyncps::testing

// Regression tests of issue 13, item 9: BSP workers rejoin instead of
// failing on a missed round.
namespace asyncps::testing {
namespace {

std::vector<std::string> BspFlags() {
  return {"--shard_id=0",         "--num_shards=1",        "--num_workers=2",
          "--consistency=bsp",    "--optimizer=sgd",       "--lr=0.1",
          "--worker_timeout_s=2", "--checkpoint_every_s=1"};
}

// A worker that starts after --worker_timeout_s (the round moved on without
// it) and a worker restarted mid-run (a new process at step 0) skip to the
// current round and finish.
TEST(TrainingIntegrationTest, BspLateAndRestartedWorkersRejoin) {
  TempDir dir;
  auto server = StartServer(dir, "shard0", BspFlags());
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto args = [&](int rank, int steps) {
    return WorkerArgs(server->endpoint, rank, 2,
                      {"--max_steps=" + std::to_string(steps), "--epochs=0",
                       "--eval=false", "--slowdown=2"});
  };
  auto w0 = Process::Start(args(0, 4000), dir.Sub("w0.log"));
  ASSERT_TRUE(w0.ok());
  std::this_thread::sleep_for(milliseconds(4000));  // rank 1 evicted
  ASSERT_TRUE((*w0)->Running()) << (*w0)->Log();
  auto w1 = Process::Start(args(1, 300), dir.Sub("w1.log"));
  ASSERT_TRUE(w1.ok());
  auto code = (*w1)->Wait(seconds(120));
  ASSERT_TRUE(code.ok()) << (*w1)->Log();
  EXPECT_EQ(*code, 0) << (*w1)->Log();
  EXPECT_NE((*w1)->Log().find("skipping ahead"), std::string::npos)
      << (*w1)->Log();
  // Rank 1 again, as a new process starting at step 0.
  auto w1b = Process::Start(args(1, 300), dir.Sub("w1b.log"));
  ASSERT_TRUE(w1b.ok());
  code = (*w1b)->Wait(seconds(120));
  ASSERT_TRUE(code.ok()) << (*w1b)->Log();
  EXPECT_EQ(*code, 0) << (*w1b)->Log();
  ASSERT_TRUE((*w0)->Running()) << (*w0)->Log();
  (*w0)->Kill(SIGKILL);
}

// --prefetch_ahead under BSP: the prefetched pull waits for the round and
// does not count as the worker's clock, so rounds stay whole.
TEST(TrainingIntegrationTest, BspWithPrefetchAheadTrains) {
  TempDir dir;
  auto server = StartServer(dir, "shard0", BspFlags());
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto workers = StartWorkers(dir, server->endpoint, 2, [](int) {
    return std::vector<std::string>{"--max_steps=300", "--epochs=0",
                                    "--prefetch_ahead", "--eval=false"};
  });
  ASSERT_EQ(workers.size(), 2u);
  ExpectAllFinish(workers);
  EXPECT_EQ(SummaryValue(workers[0]->Log(), "steps"), 300);
}

// --drop_last=auto (the default) reads the shards' consistency: under BSP
// every worker skips the short last batch of its epoch (30000 examples per
// worker: 468 full batches of 64, the 48 left over are not a step), under
// SSP it does not (OneShardTwoWorkersReachAccuracyBarInOneEpoch: 469).
TEST(TrainingIntegrationTest, BspDropsTheShortLastBatchByDefault) {
  TempDir dir;
  auto server = StartServer(dir, "shard0", BspFlags());
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto workers = StartWorkers(dir, server->endpoint, 2, [](int) {
    return std::vector<std::string>{"--epochs=1", "--batch=64", "--eval=false"};
  });
  ASSERT_EQ(workers.size(), 2u);
  ExpectAllFinish(workers);
  for (const auto& w : workers) {
    EXPECT_EQ(SummaryValue(w->Log(), "steps"), 468) << w->Log();
    EXPECT_NE(w->Log().find("drop_last=true (--drop_last=auto)"),
              std::string::npos);
  }
}

// A non-durable BSP shard killed and restarted from its last checkpoint: the
// workers' pushes for rounds the shard lost count for the round it is in.
TEST(TrainingIntegrationTest, BspShardRestartedFromACheckpointGoesOn) {
  TempDir dir;
  auto server = StartServer(dir, "shard0", BspFlags());
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const std::string endpoint = server->endpoint;
  auto workers = StartWorkers(dir, endpoint, 2, [](int) {
    return std::vector<std::string>{"--max_steps=2000", "--epochs=0",
                                    "--eval=false", "--slowdown=2"};
  });
  ASSERT_EQ(workers.size(), 2u);
  std::this_thread::sleep_for(milliseconds(3500));
  ASSERT_TRUE(workers[0]->Running()) << workers[0]->Log();
  server->process->Kill(SIGKILL);
  auto again = StartServer(dir, "shard0", BspFlags(), endpoint);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ExpectAllFinish(workers);
}

}  // namespace
}  // namespace asyncps::testing
