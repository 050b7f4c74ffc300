// Trust boundaries of a replicated fleet, end to end (issue 40): real
// ps_server processes on 127.0.0.1, a real etcd (skipped without Debian's
// etcd-server), requests built by hand.
//  - A replica whose advertised endpoint does not parse or does not reach it
//    refuses to start.
//  - A member record naming an endpoint that cannot be connected to (an
//    operator's typo in etcd) never crashes the primary nor makes it
//    acknowledge a write its view's backups did not apply: the backup is
//    dropped through etcd, and after kill -9 of the primary no
//    acknowledged write is lost, with 3 replicas (the other backup takes
//    over) and with 2 (the dropped one does not resume from its stale
//    store; the primary, started again on its --durable store, does).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/etcd_client.h"
#include "common/transport.h"
#include "common/wire.h"
#include "tests/util/etcd_fixture.h"
#include "tests/util/process.h"

namespace asyncps {
namespace {

using asyncps::testing::BinPath;
using asyncps::testing::EtcdServer;
using asyncps::testing::Process;
using asyncps::testing::ServerHandle;
using asyncps::testing::StartServer;
using asyncps::testing::TempDir;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr char kPrefix[] = "/asyncps/trust";

// Requests built by hand: connections, retried calls, register, pushes,
// stats.
class TrustCalls {
 public:
  std::unique_ptr<ClientSocket> Connect(const std::string& endpoint) {
    auto c = ClientSocket::Connect(endpoint, TransportOptions{});
    EXPECT_TRUE(c.ok());
    return std::move(c).value();
  }

  // Sends `req` (id kept: a resend is de-duplicated) until it is answered
  // OK or `wait` passes; the last reply.
  // (*reply_data, when set: the reply's data frames, one after another.)
  ReplyHeader Until(ClientSocket& c, RequestHeader req,
                    const std::vector<std::vector<float>>& data = {},
                    milliseconds wait = milliseconds(20000),
                    std::vector<uint8_t>* reply_data = nullptr) {
    ReplyHeader r;
    const auto until = Clock::now() + wait;
    do {
      std::vector<Frame> frames{Frame::Owned(EncodeRequest(req))};
      for (const auto& d : data)
        frames.push_back(Frame::Copy(d.data(), d.size() * sizeof(float)));
      EXPECT_TRUE(c.Send(frames).ok());
      r = Await(c, req.id, milliseconds(2000), reply_data);
      if (r.status.ok()) return r;
      std::this_thread::sleep_for(milliseconds(50));
    } while (Clock::now() < until);
    return r;
  }
  ReplyHeader Await(ClientSocket& c, uint64_t id, milliseconds wait,
                    std::vector<uint8_t>* reply_data = nullptr) {
    ReplyHeader r;
    r.status = Status::TimedOut("no reply");
    const auto until = Clock::now() + wait;
    Message msg;
    while (Clock::now() < until) {
      auto got = c.Receive(&msg, milliseconds(20));
      if (!got.ok() || !*got || msg.frames.empty()) continue;
      ReplyHeader h;
      if (!DecodeReply(msg.frames[0].data, msg.frames[0].size, {}, &h).ok() ||
          h.id != id)
        continue;
      if (reply_data != nullptr) {
        reply_data->clear();
        for (size_t i = 1; i < msg.frames.size(); ++i)
          reply_data->insert(reply_data->end(), msg.frames[i].data,
                             msg.frames[i].data + msg.frames[i].size);
      }
      return h;
    }
    return r;
  }

  RequestHeader Register() {
    RequestHeader r;
    r.kind = RequestKind::kRegister;
    r.id = ++next_id_;
    r.rank = 0;
    r.tensors = {TensorSpec{"w", {4, 4}, InitKind::kConstant, 0.0f, 1}};
    r.layout.chunk_elems = 16;
    r.layout.min_chunk_elems = 16;
    r.layout.num_shards = 1;
    return r;
  }
  RequestHeader Push() {
    RequestHeader p;
    p.kind = RequestKind::kPush;
    p.id = ++next_id_;
    p.rank = 0;
    p.incarnation = 77;
    ChunkRef c;
    c.chunk = 0;
    c.frame = 1;
    c.num_elems = 16;
    c.byte_size = 16 * sizeof(float);
    p.chunks = {c};
    return p;
  }
  // Pushes `n` updates through `c` and returns how many were acknowledged.
  int PushAll(ClientSocket& c, int n) {
    int acked = 0;
    for (int i = 0; i < n; ++i) {
      ReplyHeader r = Until(c, Push(), {std::vector<float>(16, 0.1f)});
      EXPECT_TRUE(r.status.ok()) << r.status.ToString();
      if (r.status.ok()) ++acked;
    }
    return acked;
  }
  // Every weight the shard at `c` serves (retried while it fails over).
  std::vector<uint8_t> Weights(ClientSocket& c) {
    RequestHeader pull;
    pull.kind = RequestKind::kPull;
    pull.id = ++next_id_;
    pull.rank = 0;
    std::vector<uint8_t> bytes;
    EXPECT_TRUE(Until(c, pull, {}, milliseconds(20000), &bytes).status.ok());
    return bytes;
  }
  // Sends `frames` once and returns the reply to `id`.
  ReplyHeader Once(ClientSocket& c, uint64_t id, std::vector<Frame> frames) {
    EXPECT_TRUE(c.Send(frames).ok());
    return Await(c, id, milliseconds(3000));
  }
  uint64_t NextId() { return ++next_id_; }
  // The stats of the shard at `c` once it is its group's primary (15 s at
  // most: then the last ones read).
  nlohmann::json AwaitPrimary(ClientSocket& c) {
    const auto until = Clock::now() + milliseconds(15000);
    nlohmann::json s;
    while (Clock::now() < until) {
      s = Stats(c);
      if (s["replication"].value("role", "") == "primary") break;
      std::this_thread::sleep_for(milliseconds(100));
    }
    return s;
  }
  nlohmann::json Stats(ClientSocket& c) {
    RequestHeader s;
    s.kind = RequestKind::kStats;
    s.id = ++next_id_;
    ReplyHeader r = Until(c, s, {}, milliseconds(5000));
    auto j = nlohmann::json::parse(r.text, nullptr, false);
    return j.is_object() ? j : nlohmann::json::object();
  }

 private:
  uint64_t next_id_ = 0;
};

class TrustIntegrationTest : public ::testing::Test, public TrustCalls {
 protected:
  void SetUp() override {
    if (!EtcdServer::Available())
      GTEST_SKIP() << "etcd not installed (Debian's etcd-server)";
    auto e = EtcdServer::Start(dir_.Sub("etcd"), dir_.path().string());
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    etcd_ = std::move(e).value();
    auto c = etcd_->NewClient();
    ASSERT_TRUE(c.ok());
    etcd_client_ = std::move(c).value();
  }

  std::vector<std::string> Flags(int replicas, int replica,
                                 std::vector<std::string> extra = {}) {
    std::vector<std::string> f = {"--num_workers=1",
                                  "--consistency=asp",
                                  "--optimizer=sgd",
                                  "--lr=0.5",
                                  "--replicas=" + std::to_string(replicas),
                                  "--replica=" + std::to_string(replica),
                                  "--etcd=" + etcd_->endpoint(),
                                  std::string("--etcd_prefix=") + kPrefix,
                                  "--lease_ms=1000"};
    f.insert(f.end(), extra.begin(), extra.end());
    return f;
  }

  StatusOr<ServerHandle> Start(int replicas, int replica,
                               std::vector<std::string> extra = {},
                               const std::string& tag = "") {
    return StartServer(dir_, "g0r" + std::to_string(replica) + tag,
                       Flags(replicas, replica, std::move(extra)),
                       "tcp://127.0.0.1:*");
  }

  // The group's layout in etcd.
  nlohmann::json Layout() {
    auto kv = etcd_client_->Get(std::string(kPrefix) + "/layout");
    if (!kv.ok() || !kv->has_value()) return nlohmann::json::object();
    return nlohmann::json::parse((*kv)->value, nullptr, false)["groups"][0];
  }
  // Rewrites `name`'s member record with `endpoint` (what a typo in etcd
  // by an operator, or a replica started with a bad --advertise_endpoint
  // before it was checked, leaves there).
  void MistypeEndpoint(const std::string& name, const std::string& endpoint) {
    const std::string key = std::string(kPrefix) + "/members/" + name;
    auto kv = etcd_client_->Get(key);
    ASSERT_TRUE(kv.ok() && kv->has_value());
    auto j = nlohmann::json::parse((*kv)->value);
    j["endpoint"] = endpoint;
    ASSERT_TRUE(etcd_client_->Put(key, j.dump(), (*kv)->lease).ok());
  }
  // Waits until `name` is no longer listed in the group; its epoch then.
  uint64_t AwaitDropped(const std::string& name) {
    const auto until = Clock::now() + milliseconds(15000);
    while (Clock::now() < until) {
      nlohmann::json g = Layout();
      bool listed = g.value("primary", "") == name;
      for (const auto& b : g.value("backups", nlohmann::json::array()))
        listed = listed || b == name;
      if (!listed && g.contains("epoch")) return g["epoch"].get<uint64_t>();
      std::this_thread::sleep_for(milliseconds(50));
    }
    ADD_FAILURE() << name << " still listed: " << Layout().dump();
    return 0;
  }

  TempDir dir_;
  std::unique_ptr<EtcdServer> etcd_;
  std::unique_ptr<EtcdClient> etcd_client_;
};

TEST_F(TrustIntegrationTest,
       AReplicaWhoseAdvertisedEndpointIsWrongRefusesToStart) {
  for (int replicas : {2, 3}) {
    SCOPED_TRACE(replicas);
    auto bad = Start(replicas, replicas - 1,
                     {"--advertise_endpoint=tcp://127.0.0.1:notaport"},
                     "-notaport" + std::to_string(replicas));
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("advertised endpoint"),
              std::string::npos)
        << bad.status().ToString();
    EXPECT_NE(bad.status().message().find("notaport"), std::string::npos);
  }
  // An endpoint that parses but is another process's: the probe lands there.
  auto other = StartServer(dir_, "other", {"--num_workers=1"});
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  auto foreign =
      Start(2, 1, {"--advertise_endpoint=" + other->endpoint}, "-foreign");
  ASSERT_FALSE(foreign.ok());
  EXPECT_NE(foreign.status().message().find("did not reach this process"),
            std::string::npos)
      << foreign.status().ToString();
  // Neither joined the fleet: no member record was written.
  auto members = etcd_client_->GetPrefix(std::string(kPrefix) + "/members/");
  ASSERT_TRUE(members.ok());
  EXPECT_TRUE(members->empty());
}

TEST_F(TrustIntegrationTest,
       MistypedBackupEndpointLosesNoAcknowledgedPushThreeReplicas) {
  std::vector<ServerHandle> r;
  for (int i = 0; i < 3; ++i) {
    auto h = Start(3, i);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    r.push_back(std::move(h).value());
  }
  auto c0 = Connect(r[0].endpoint);
  auto c1 = Connect(r[1].endpoint);
  ASSERT_TRUE(Until(*c0, Register()).status.ok());
  int acked = PushAll(*c0, 5);
  const uint64_t epoch = Layout().value("epoch", uint64_t{0});
  MistypeEndpoint("g0r2", "tcp://127.0.0.1:notaport");
  acked += PushAll(*c0, 20);
  EXPECT_GT(AwaitDropped("g0r2"), epoch);
  acked += PushAll(*c0, 5);
  EXPECT_TRUE(r[0].process->Running()) << r[0].process->Log();
  EXPECT_EQ(acked, 30);
  r[0].process->Kill(9);
  // g0r1 takes over with every acknowledged push.
  nlohmann::json s = AwaitPrimary(*c1);
  EXPECT_EQ(s["replication"].value("role", ""), "primary") << s.dump();
  EXPECT_EQ(s.value("version", uint64_t{0}), static_cast<uint64_t>(acked));
}

TEST_F(TrustIntegrationTest,
       MistypedBackupEndpointLosesNoAcknowledgedPushTwoReplicas) {
  auto p = Start(2, 0, {"--durable"});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto b = Start(2, 1);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto c0 = Connect(p->endpoint);
  auto c1 = Connect(b->endpoint);
  ASSERT_TRUE(Until(*c0, Register()).status.ok());
  int acked = PushAll(*c0, 5);
  MistypeEndpoint("g0r1", "tcp://127.0.0.1:notaport");
  acked += PushAll(*c0, 5);
  AwaitDropped("g0r1");
  acked += PushAll(*c0, 5);  // the primary alone now, --durable
  EXPECT_TRUE(p->process->Running()) << p->process->Log();
  EXPECT_EQ(acked, 15);
  p->process->Kill(9);
  // The dropped backup stopped at an older epoch: it must not resume the
  // group from its store (it would serve a model without the last pushes).
  std::this_thread::sleep_for(milliseconds(4000));
  nlohmann::json s = Stats(*c1);
  EXPECT_NE(s["replication"].value("role", ""), "primary") << s.dump();
  RequestHeader push = Push();
  std::vector<Frame> frames{
      Frame::Owned(EncodeRequest(push)),
      Frame::Copy(std::vector<float>(16, 0.1f).data(), 64)};
  ASSERT_TRUE(c1->Send(frames).ok());
  EXPECT_EQ(Await(*c1, push.id, milliseconds(2000)).status.code(),
            StatusCode::kUnavailable);
  // The primary, started again on its store, resumes with all of them.
  auto again = StartServer(dir_, "g0r0", Flags(2, 0, {"--durable"}),
                           "tcp://127.0.0.1:*");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  auto c2 = Connect(again->endpoint);
  s = AwaitPrimary(*c2);
  EXPECT_EQ(s["replication"].value("role", ""), "primary") << s.dump();
  EXPECT_EQ(s.value("version", uint64_t{0}), static_cast<uint64_t>(acked));
}

// Issue 40, finding 1, against real processes: an ordinary client (no
// group secret) sends a replica group's backup a forged push, a forged
// liveness record and a migrate freeze wrapped in a replicate, and pings.
// Each is refused, the backup's clocks, liveness and de-duplication table
// are unchanged, and after kill -9 of the primary the promoted backup
// serves the true weights, bitwise. (Run against binaries of before the
// fix with ASYNCPS_TEST_BIN_DIR: the backup applied them, and served the
// forged weights.)
TEST_F(TrustIntegrationTest,
       ForgedReplicaTrafficToABackupProcessChangesNothing) {
  auto p = Start(2, 0);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto b = Start(2, 1);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto c0 = Connect(p->endpoint);
  auto c1 = Connect(b->endpoint);
  ASSERT_TRUE(Until(*c0, Register()).status.ok());
  ASSERT_EQ(PushAll(*c0, 3), 3);
  const std::vector<uint8_t> weights = Weights(*c0);
  ASSERT_EQ(weights.size(), 16 * sizeof(float));
  auto state = [&] {
    nlohmann::json st = Stats(*c1);
    return nlohmann::json{{"version", st["version"]},
                          {"clocks", st["worker_clocks"]},
                          {"live", st["worker_live"]},
                          {"min_clock", st["min_clock"]},
                          {"push_table", st["push_table"]}};
  };
  const nlohmann::json before = state();
  const uint64_t epoch = Layout().value("epoch", uint64_t{1});
  auto replicate = [&] {
    RequestHeader h;
    h.kind = RequestKind::kReplicate;
    h.id = NextId();
    h.rank = -1;
    h.replicate_epoch = epoch;
    h.replicate_group = 0;
    h.replica_sender = "g0r0";
    return h;
  };
  RequestHeader inner_push = Push();
  const std::vector<float> huge(16, 1000.0f);
  RequestHeader freeze;
  freeze.kind = RequestKind::kMigrate;
  freeze.rank = -1;
  freeze.id = NextId();
  freeze.migrate_op = MigrateOp::kFreeze;
  freeze.migrate_epoch = 9;
  freeze.migrate_at_clock = -1;
  freeze.migrate_deadline_ms = 600000;
  for (int kind = 0; kind < 4; ++kind) {
    SCOPED_TRACE(kind);
    RequestHeader h = replicate();
    std::vector<Frame> frames;
    if (kind == 1) h.replicate_workers = {WorkerLiveness{0, true, 777777}};
    frames.push_back(Frame::Owned(EncodeRequest(h)));
    if (kind == 0) {
      frames.push_back(Frame::Owned(EncodeRequest(inner_push)));
      frames.push_back(Frame::Copy(huge.data(), huge.size() * sizeof(float)));
    } else if (kind == 2) {
      frames.push_back(Frame::Owned(EncodeRequest(freeze)));
    }  // kind 3: a ping
    ReplyHeader r = Once(*c1, h.id, std::move(frames));
    EXPECT_FALSE(r.status.ok());
  }
  EXPECT_EQ(state(), before);
  // The true weights after a failover.
  p->process->Kill(9);
  EXPECT_EQ(Weights(*c1), weights);
  EXPECT_TRUE(Until(*c1, Push(), {std::vector<float>(16, 0.1f)}).status.ok());
}

// A group's secret from a file (ps_ctl secretgen, ps_server
// --replica_secret_file) instead of etcd: the group replicates with it
// (every byte tagged, --replica_tag=all), the secret never reaches etcd, and
// a file others can read is refused, as is a --replica_tag that is neither
// header nor all.
TEST_F(TrustIntegrationTest, ReplicaSecretFileAuthenticatesTheGroup) {
  const std::string secret = dir_.Sub("group0.secret");
  auto gen = Process::Start({BinPath("ps_ctl"), "secretgen", "--out=" + secret},
                            dir_.Sub("secretgen.log"));
  ASSERT_TRUE(gen.ok());
  ASSERT_EQ(*(*gen)->Wait(std::chrono::seconds(10)), 0) << (*gen)->Log();
  // Every byte tagged (--replica_tag=all) on both.
  auto p =
      Start(2, 0, {"--replica_secret_file=" + secret, "--replica_tag=all"});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto b =
      Start(2, 1, {"--replica_secret_file=" + secret, "--replica_tag=all"});
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto c0 = Connect(p->endpoint);
  auto c1 = Connect(b->endpoint);
  ASSERT_TRUE(Until(*c0, Register()).status.ok());
  EXPECT_EQ(PushAll(*c0, 3), 3);
  EXPECT_EQ(Stats(*c1).value("version", uint64_t{0}), 3u);
  auto kv = etcd_client_->Get(std::string(kPrefix) + "/secrets/g0");
  ASSERT_TRUE(kv.ok());
  EXPECT_FALSE(kv->has_value());
  ASSERT_EQ(chmod(secret.c_str(), 0644), 0);
  auto open_file =
      Start(2, 1, {"--replica_secret_file=" + secret}, "-world-readable");
  ASSERT_FALSE(open_file.ok());
  EXPECT_NE(open_file.status().message().find("readable by others"),
            std::string::npos)
      << open_file.status().ToString();
  auto bad_tag = Start(2, 1, {"--replica_tag=none"}, "-bad-tag");
  ASSERT_FALSE(bad_tag.ok());
  EXPECT_NE(
      bad_tag.status().message().find("--replica_tag must be header or all"),
      std::string::npos)
      << bad_tag.status().ToString();
}

// A replica group whose etcd is secured (TLS, client certificates, users):
// the replicas sign in as asyncps-server, replicate, fail over; the group's
// secret in etcd is out of the workers' reach.
TEST(TrustSecureEtcdTest, ReplicaGroupOverTlsAndAuthenticatedEtcd) {
  if (!EtcdServer::Available())
    GTEST_SKIP() << "etcd not installed (Debian's etcd-server)";
  TempDir dir;
  auto e = EtcdServer::StartSecure(dir.Sub("etcd"), dir.path().string(),
                                   dir.Sub("tls"), kPrefix);
  if (!e.ok() &&
      e.status().message().find("not installed") != std::string::npos)
    GTEST_SKIP() << e.status().ToString();
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const std::string tls = dir.Sub("tls");
  std::vector<std::string> flags = {
      "--num_workers=1",
      "--consistency=asp",
      "--lr=0.5",
      "--replicas=2",
      "--etcd=" + (*e)->endpoint(),
      std::string("--etcd_prefix=") + kPrefix,
      "--etcd_ca_file=" + tls + "/ca.pem",
      "--etcd_cert_file=" + tls + "/asyncps-server.pem",
      "--etcd_key_file=" + tls + "/asyncps-server.key",
      "--etcd_user=asyncps-server",
      "--etcd_password_file=" + tls + "/asyncps-server.password"};
  std::vector<ServerHandle> r;
  for (int i = 0; i < 2; ++i) {
    std::vector<std::string> f = flags;
    f.push_back("--replica=" + std::to_string(i));
    auto h =
        StartServer(dir, "g0r" + std::to_string(i), f, "tcp://127.0.0.1:*");
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    r.push_back(std::move(h).value());
  }
  // With etcd's CA and a client certificate but no user and password, a
  // replica cannot even join: etcd refuses it.
  std::vector<std::string> bare(flags.begin(), flags.begin() + 9);
  bare.push_back("--replica=1");
  auto refused = StartServer(dir, "g0r1-bare", bare, "tcp://127.0.0.1:*");
  EXPECT_FALSE(refused.ok());
  TrustCalls calls;
  auto c0 = calls.Connect(r[0].endpoint);
  auto c1 = calls.Connect(r[1].endpoint);
  ASSERT_TRUE(calls.Until(*c0, calls.Register()).status.ok());
  EXPECT_EQ(calls.PushAll(*c0, 5), 5);
  EtcdOptions as_worker;
  as_worker.endpoints = {(*e)->endpoint()};
  as_worker.security = (*e)->Security("asyncps-worker");
  auto worker = EtcdClient::Create(as_worker);
  ASSERT_TRUE(worker.ok());
  EXPECT_EQ(
      (*worker)->Get(std::string(kPrefix) + "/secrets/g0").status().code(),
      StatusCode::kPermissionDenied);
  r[0].process->Kill(9);
  nlohmann::json s = calls.AwaitPrimary(*c1);
  EXPECT_EQ(s["replication"].value("role", ""), "primary") << s.dump();
  EXPECT_EQ(s.value("version", uint64_t{0}), 5u);
  EXPECT_EQ(s["replication"].value("etcd_errors", 0), 0) << s.dump();
}

}  // namespace
}  // namespace asyncps
