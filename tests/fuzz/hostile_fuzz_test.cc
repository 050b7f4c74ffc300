// Structure-aware network fuzz (issue 13): a real ps_server receives
// well-formed requests of every kind with extreme and random values
// (tests/fuzz/hostile_requests.h) while a real ps_worker trains beside them.
// Every request must be answered within its deadline, the shard must stay up
// with its memory bounded, the worker must finish with a sane accuracy, and
// the rejections must be counted by reason.
//
// The shard runs with CURVE and an admin key the fuzzer does not hold, so its
// checkpoint and shutdown requests are refused (as they must be).
//
// Environment: ASYNCPS_HOSTILE_FUZZ_MESSAGES (default 20000),
// ASYNCPS_HOSTILE_FUZZ_SEED (default 1). experiments/chaos/hostile_soak.py
// runs the long version (ps_hostile_fuzz against an ASan+UBSan shard).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <thread>

#include "tests/fuzz/hostile_requests.h"
#include "tests/util/process.h"
#include "worker/model.h"

namespace asyncps::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

int64_t EnvInt(const char* name, int64_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoll(v) : dflt;
}

struct Keys {
  std::string server_pub, server_sec, admin_pub, admin_sec, fuzz_pub, fuzz_sec;
};

Keys MakeKeys(const TempDir& dir) {
  Keys k;
  EXPECT_TRUE(GenerateCurveKeyPair(&k.server_pub, &k.server_sec).ok());
  EXPECT_TRUE(GenerateCurveKeyPair(&k.admin_pub, &k.admin_sec).ok());
  EXPECT_TRUE(GenerateCurveKeyPair(&k.fuzz_pub, &k.fuzz_sec).ok());
  std::ofstream(dir.Sub("server.key")) << k.server_sec << "\n";
  std::ofstream(dir.Sub("server.pub")) << k.server_pub << "\n";
  std::ofstream(dir.Sub("admins")) << k.admin_pub << "\n";
  return k;
}

std::string Summary(const std::string& log, const std::string& key) {
  std::smatch m;
  std::regex re("SUMMARY .*\\b" + key + "=([-0-9.eE+]+)");
  return std::regex_search(log, m, re) ? m[1].str() : "";
}

// Runs `messages` hostile requests against `endpoint`; returns the report.
fuzz::DriverReport Fuzz(const std::string& endpoint, const Keys& keys,
                        const Layout& layout,
                        const std::vector<TensorSpec>& tensors, int workers,
                        int64_t messages, uint64_t seed,
                        const std::function<bool()>& keep_going) {
  fuzz::DriverOptions o;
  o.endpoint = endpoint;
  o.transport.curve_server_key = keys.server_pub;
  o.transport.curve_public_key = keys.fuzz_pub;
  o.transport.curve_secret_key = keys.fuzz_sec;
  o.deadline = milliseconds(10000);
  auto driver = fuzz::HostileDriver::Create(o);
  EXPECT_TRUE(driver.ok());
  fuzz::HostileGenerator gen(layout, tensors, 0, workers, /*admin=*/true, seed);
  Status s = (*driver)->Run(gen, messages, keep_going);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return (*driver)->report();
}

std::vector<std::string> ServerFlags(const TempDir& dir,
                                     const std::string& consistency) {
  return {"--shard_id=0",
          "--num_shards=1",
          "--num_workers=2",
          "--consistency=" + consistency,
          "--optimizer=sgd",
          "--lr=0.05",
          "--checkpoint_every_s=0",
          "--worker_timeout_s=5",
          "--memory_budget_mb=256",
          "--max_park_s=2",
          "--curve_secret_key=" + dir.Sub("server.key"),
          "--curve_admin_clients=" + dir.Sub("admins")};
}

TEST(HostileFuzzTest, ShardAnswersEveryHostileRequestBesideARealWorker) {
  const int64_t messages = EnvInt("ASYNCPS_HOSTILE_FUZZ_MESSAGES", 20000);
  const uint64_t seed = EnvInt("ASYNCPS_HOSTILE_FUZZ_SEED", 1);
  TempDir dir;
  const Keys keys = MakeKeys(dir);
  auto server = StartServer(dir, "shard", ServerFlags(dir, "asp"));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const std::vector<int> layers = {784, 256, 128, 10};
  const std::vector<TensorSpec> tensors = worker::MlpTensorSpecs(layers, 1);
  LayoutOptions lo;
  lo.num_shards = 1;
  auto layout = Layout::Create(tensors, lo);
  ASSERT_TRUE(layout.ok());
  // The real worker registers the model and trains; rank 1 never comes
  // (ASP does not wait for it).
  auto worker = Process::Start(
      {BinPath("ps_worker"), "--servers=" + server->endpoint, "--rank=0",
       "--num_workers=2", "--max_steps=600", "--epochs=0", "--eval=true",
       "--log_every=100", "--timeout_s=60",
       "--curve_server_key=" + dir.Sub("server.pub")},
      dir.Sub("worker.log"));
  ASSERT_TRUE(worker.ok());
  // Hostile traffic once the worker has registered the model (a hostile
  // registration first would be a different model, and the worker's own
  // registration would fail, as it must).
  bool registered = false;
  for (int i = 0; i < 600 && !registered; ++i) {
    auto ctl =
        Process::Start({BinPath("ps_ctl"), "--servers=" + server->endpoint,
                        "--curve_server_key=" + dir.Sub("server.pub"), "stats"},
                       dir.Sub("registered.json"));
    ASSERT_TRUE(ctl.ok());
    (void)(*ctl)->Wait(seconds(10));
    registered =
        ReadFile(dir.Sub("registered.json")).find("\"registered\":true") !=
        std::string::npos;
    if (!registered) std::this_thread::sleep_for(milliseconds(100));
  }
  ASSERT_TRUE(registered) << (*worker)->Log();
  auto report = Fuzz(server->endpoint, keys, *layout, tensors, 2, messages,
                     seed, [&] { return true; });
  auto code = (*worker)->Wait(seconds(180));
  ASSERT_TRUE(code.ok()) << (*worker)->Log();
  EXPECT_EQ(*code, 0) << (*worker)->Log();
  const std::string acc = Summary((*worker)->Log(), "final_test_acc");
  ASSERT_FALSE(acc.empty()) << (*worker)->Log();
  EXPECT_GE(std::stod(acc), 0.70) << (*worker)->Log();

  ASSERT_TRUE(server->process->Running()) << server->process->Log();
  EXPECT_EQ(report.sent, messages);
  EXPECT_EQ(report.unanswered, 0) << report.ToJson();
  EXPECT_EQ(report.answered, report.sent) << report.ToJson();
  const uint64_t hwm_kib = ProcStatusKib(server->process->pid(), "VmHWM");
  EXPECT_LT(hwm_kib, 768u * 1024) << "peak RSS " << hwm_kib << " KiB";
  EXPECT_GT(report.codes["InvalidArgument"], 0);
  // The shard's own count of rejections by reason.
  std::ofstream(dir.Sub("admin.key")) << keys.admin_sec << "\n";
  auto ctl =
      Process::Start({BinPath("ps_ctl"), "--servers=" + server->endpoint,
                      "--curve_server_key=" + dir.Sub("server.pub"),
                      "--curve_secret_key=" + dir.Sub("admin.key"), "stats"},
                     dir.Sub("stats.json"));
  ASSERT_TRUE(ctl.ok());
  ASSERT_EQ(*(*ctl)->Wait(seconds(10)), 0);
  const std::string stats = ReadFile(dir.Sub("stats.json"));
  EXPECT_NE(stats.find("\"admin_denied\":"), std::string::npos) << stats;
  EXPECT_NE(stats.find("\"repeated_chunk\":"), std::string::npos) << stats;
  EXPECT_NE(stats.find("\"bad_clock\":"), std::string::npos) << stats;
  std::printf(
      "{\"hostile_fuzz\":%s,\"worker_acc\":%s,\"shard_peak_rss_kib\":%llu}\n",
      report.ToJson().c_str(), acc.c_str(),
      static_cast<unsigned long long>(hwm_kib));
  std::printf("shard stats: %s\n", stats.c_str());
}

// Hostile clocks against the waiting consistency modes, where a pull may park
// and a clock drives rounds: still every request answered in time.
TEST(HostileFuzzTest, BspAndSspShardsAnswerEveryHostileRequest) {
  const int64_t messages = EnvInt("ASYNCPS_HOSTILE_FUZZ_MESSAGES", 20000) / 4;
  TempDir dir;
  const Keys keys = MakeKeys(dir);
  const std::vector<TensorSpec> tensors = {
      TensorSpec{"w", {300, 40}, InitKind::kUniform, 0.1f, 3},
      TensorSpec{"b", {40}, InitKind::kZeros, 0, 3}};
  LayoutOptions lo;
  lo.num_shards = 1;
  lo.chunk_elems = 4096;
  auto layout = Layout::Create(tensors, lo);
  ASSERT_TRUE(layout.ok());
  for (const std::string mode : {"bsp", "ssp"}) {
    std::vector<std::string> flags = ServerFlags(dir, mode);
    if (mode == "ssp") flags.push_back("--staleness=2");
    auto server = StartServer(dir, "shard-" + mode, flags);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    auto report = Fuzz(server->endpoint, keys, *layout, tensors, 2, messages, 7,
                       [] { return true; });
    ASSERT_TRUE(server->process->Running()) << server->process->Log();
    EXPECT_EQ(report.unanswered, 0) << mode << ": " << report.ToJson();
    EXPECT_EQ(report.answered, report.sent) << mode;
    std::printf("{\"mode\":\"%s\",\"hostile_fuzz\":%s}\n", mode.c_str(),
                report.ToJson().c_str());
  }
}

}  // namespace
}  // namespace asyncps::testing
