// ps_reshard end to end: 3 ps_server processes (RocksDB in a temp dir)
// trained through the worker Client (dense chunks with Adam and a sparse
// table with AdaGrad), checkpointed and shut down; ps_reshard onto 2 new
// stores; 2 ps_server processes started on them answer the same pulls
// bitwise. Refusals of ps_reshard leave no destination behind.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "tests/util/process.h"
#include "worker/client.h"

namespace asyncps::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using worker::ChunkPayload;
using worker::Client;
using worker::ClientOptions;
using worker::RowsPull;
using worker::RowsPush;

constexpr uint64_t kVocab = 500;

TableSpec Emb() {
  TableSpec t;
  t.name = "emb";
  t.dim = 8;
  t.init = InitKind::kUniform;
  t.init_param = 0.25f;
  t.seed = 17;
  t.optimizer.kind = RowOptimizerKind::kAdaGrad;
  t.optimizer.lr = 0.2f;
  return t;
}

std::vector<TensorSpec> Model() {
  return {TensorSpec{"w", {3, 1000}, InitKind::kUniform, 0.1f, 3},
          TensorSpec{"b", {100}, InitKind::kZeros, 0, 4}};
}

// 256-float pieces whatever the shard count (the chunks stay); or pieces of
// total / (8 S) floats: 129 on 3 shards, 193 on 2 (the chunks are re-cut).
LayoutOptions Chunking(bool recut) {
  LayoutOptions lo;
  lo.chunk_elems = 256;
  lo.min_chunk_elems = recut ? 16 : 256;
  return lo;
}

std::vector<std::string> Flags() {
  return {"--num_workers=1", "--optimizer=adam", "--lr=0.01",
          "--checkpoint_every_s=0"};
}

std::vector<ServerHandle> StartShards(const TempDir& dir, int shards,
                                      const std::string& prefix) {
  std::vector<ServerHandle> out;
  for (int s = 0; s < shards; ++s) {
    std::vector<std::string> f = Flags();
    f.push_back("--shard_id=" + std::to_string(s));
    f.push_back("--num_shards=" + std::to_string(shards));
    auto h =
        StartServer(dir, prefix + std::to_string(s), f, "tcp://127.0.0.1:*");
    EXPECT_TRUE(h.ok()) << h.status().ToString();
    if (h.ok()) out.push_back(std::move(h).value());
  }
  return out;
}

std::unique_ptr<Client> Connect(const std::vector<ServerHandle>& servers) {
  ClientOptions o;
  for (const auto& s : servers) o.servers.push_back(s.endpoint);
  o.rank = 0;
  o.deadline = seconds(60);
  o.attempt_timeout = milliseconds(500);
  auto c = Client::Create(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

// Every weight of the model and rows [0, kVocab) of the table.
struct Snapshot {
  std::vector<std::vector<float>> tensors;
  std::vector<float> rows;
};

Snapshot PullAll(Client& c, int64_t clock) {
  Snapshot s;
  std::vector<float*> dst;
  for (const TensorSpec& t : Model()) {
    s.tensors.emplace_back(t.num_elements(), -99.0f);
    dst.push_back(s.tensors.back().data());
  }
  std::vector<uint64_t> keys(kVocab);
  for (uint64_t k = 0; k < kVocab; ++k) keys[k] = k;
  s.rows.assign(kVocab * Emb().dim, -99.0f);
  RowsPull p{0, keys.data(), keys.size(), s.rows.data()};
  auto t = c.StartPullRows(clock, dst, {p});
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  if (t.ok()) {
    Status st = c.Wait(*t, seconds(60));
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
  return s;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

StatusOr<int> RunReshard(const TempDir& dir,
                         const std::vector<std::string>& from,
                         const std::vector<std::string>& to,
                         const std::string& log, std::string* out) {
  auto join = [&](const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& p : v) s += (s.empty() ? "" : ",") + dir.Sub(p);
    return s;
  };
  ASSIGN_OR_RETURN(std::unique_ptr<Process> p,
                   Process::Start({BinPath("ps_reshard"),
                                   "--from=" + join(from), "--to=" + join(to)},
                                  dir.Sub(log)));
  ASSIGN_OR_RETURN(int code, p->Wait(seconds(60)));
  *out = p->Log();
  return code;
}

// The JSON line ps_reshard printed.
nlohmann::json Result(const std::string& log) {
  size_t at = log.rfind("{\"");
  if (at == std::string::npos) return nlohmann::json();
  return nlohmann::json::parse(log.substr(at, log.find('\n', at) - at), nullptr,
                               false);
}

class ReshardIntegrationTest : public ::testing::TestWithParam<bool> {};

TEST_P(ReshardIntegrationTest, ThreeShardsRestoredOnTwo) {
  const bool recut = GetParam();
  TempDir dir;
  Snapshot before;
  {
    auto servers = StartShards(dir, 3, "old");
    ASSERT_EQ(servers.size(), 3u);
    auto c = Connect(servers);
    ASSERT_TRUE(c->RegisterModel(Model(), Chunking(recut), {Emb()}).ok());
    std::mt19937 rng(7);
    std::normal_distribution<float> g(0.0f, 1.0f);
    for (int step = 0; step < 8; ++step) {
      std::vector<ChunkPayload> chunks;
      for (const ChunkSpec& s : c->layout().chunks()) {
        BufferPtr b = Buffer::Allocate(s.num_elems * sizeof(float));
        for (size_t i = 0; i < s.num_elems; ++i) b->floats()[i] = g(rng);
        chunks.push_back({s.id, 0, Frame::Ref(b)});
      }
      std::vector<uint64_t> keys;
      for (uint64_t k = step; k < kVocab; k += 7) keys.push_back(k);
      std::vector<float> grads(keys.size() * Emb().dim);
      for (float& v : grads) v = g(rng);
      RowsPush rows{0, keys.data(), keys.size(), grads.data()};
      auto t = c->StartPushRows(step, std::move(chunks), {rows});
      ASSERT_TRUE(t.ok()) << t.status().ToString();
      ASSERT_TRUE(c->Wait(*t, seconds(30)).ok());
      auto k = c->StartClock(step + 1);
      ASSERT_TRUE(k.ok());
      ASSERT_TRUE(c->Wait(*k, seconds(30)).ok());
    }
    before = PullAll(*c, 8);
    ASSERT_TRUE(c->Checkpoint(seconds(30)).ok());
    ASSERT_TRUE(c->Shutdown(seconds(30)).ok());
    for (auto& s : servers) {
      auto code = s.process->Wait(seconds(30));
      ASSERT_TRUE(code.ok());
      EXPECT_EQ(*code, 0) << s.process->Log();
    }
  }
  const std::vector<std::string> from = {"old0.db", "old1.db", "old2.db"};

  // Refused: sources out of order, a source missing. Nothing is created.
  std::string log;
  auto code = RunReshard(dir, {"old1.db", "old0.db", "old2.db"},
                         {"new0.db", "new1.db"}, "refused1.log", &log);
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 1) << log;
  EXPECT_EQ(Result(log)["code"], "FailedPrecondition") << log;
  code = RunReshard(dir, {"old0.db", "missing.db", "old2.db"},
                    {"new0.db", "new1.db"}, "refused2.log", &log);
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 1) << log;
  EXPECT_EQ(Result(log)["code"], "NotFound") << log;
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("new0.db")));
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("missing.db")));

  code = RunReshard(dir, from, {"new0.db", "new1.db"}, "reshard.log", &log);
  ASSERT_TRUE(code.ok());
  ASSERT_EQ(*code, 0) << log;
  nlohmann::json r = Result(log);
  EXPECT_EQ(r["ok"], true) << log;
  EXPECT_EQ(r["to_shards"], 2) << log;
  EXPECT_EQ(r["recut"], recut) << log;
  EXPECT_GT(r["rows"].get<uint64_t>(), 0u) << log;

  // Refused: the destinations now hold a model.
  code = RunReshard(dir, from, {"new0.db", "new1.db"}, "refused3.log", &log);
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 1) << log;
  EXPECT_EQ(Result(log)["code"], "FailedPrecondition") << log;

  auto servers = StartShards(dir, 2, "new");
  ASSERT_EQ(servers.size(), 2u);
  auto c = Connect(servers);
  ASSERT_TRUE(c->RegisterModel(Model(), Chunking(recut), {Emb()}).ok());
  Snapshot after = PullAll(*c, 8);
  ASSERT_EQ(after.tensors.size(), before.tensors.size());
  for (size_t t = 0; t < before.tensors.size(); ++t)
    EXPECT_TRUE(SameBits(before.tensors[t], after.tensors[t]))
        << "tensor " << t;
  EXPECT_TRUE(SameBits(before.rows, after.rows));
  // Training continues on the 2 shards.
  std::vector<ChunkPayload> chunks;
  for (const ChunkSpec& s : c->layout().chunks()) {
    BufferPtr b = Buffer::Allocate(s.num_elems * sizeof(float));
    for (size_t i = 0; i < s.num_elems; ++i) b->floats()[i] = 0.5f;
    chunks.push_back({s.id, 0, Frame::Ref(b)});
  }
  auto t = c->StartPush(8, std::move(chunks));
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(c->Wait(*t, seconds(30)).ok());
  Snapshot later = PullAll(*c, 8);
  EXPECT_FALSE(SameBits(before.tensors[0], later.tensors[0]));
  ASSERT_TRUE(c->Shutdown(seconds(30)).ok());
  for (auto& s : servers) (void)s.process->Wait(seconds(30));
}

INSTANTIATE_TEST_SUITE_P(Chunking, ReshardIntegrationTest,
                         ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "Recut" : "SameChunks";
                         });

}  // namespace
}  // namespace asyncps::testing
