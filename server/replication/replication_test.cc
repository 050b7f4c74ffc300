// Replica groups against a real etcd (tests/util/etcd_fixture.h): the layout
// document; two servers of one group in this process (inproc sockets, one
// ZeroMQ context), their layout and leases in etcd: the backup applies what
// the primary acknowledged, refuses workers with a redirect, takes over when
// the primary leaves, refuses a deposed primary's updates; a process that
// comes back under a replaced name is a spare; a primary alone stops taking
// writes when it cannot confirm its lease. Skipped without /usr/bin/etcd.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "common/etcd_client.h"
#include "server/loop/server.h"
#include "server/replication/membership.h"
#include "server/replication/replica_auth.h"
#include "server/replication/replica_view.h"
#include "server/replication/replicator.h"
#include "server/testing/test_util.h"
#include "tests/util/etcd_fixture.h"

namespace asyncps::server::replication {
namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

TEST(ReplicaLayoutTest, RoundTripAndInitial) {
  ReplicaLayout l = ReplicaLayout::Initial(2, 3);
  EXPECT_EQ(l.epoch, 1u);
  ASSERT_EQ(l.groups.size(), 2u);
  EXPECT_EQ(l.groups[1].primary, "g1r0");
  EXPECT_EQ(l.groups[1].backups, (std::vector<std::string>{"g1r1", "g1r2"}));
  auto back = ReplicaLayout::FromJson(l.ToJson());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->epoch, 1u);
  EXPECT_EQ(back->groups[0].backups, l.groups[0].backups);
}

TEST(ReplicaLayoutTest, MalformedDocumentsAreCorruption) {
  for (const char* bad :
       {"", "[]", "{\"epoch\": \"x\", \"groups\": []}",
        "{\"epoch\": 1, \"groups\": [{\"primary\": 3, \"backups\": []}]}",
        "{\"epoch\": 1, \"groups\": {}}", "{\"epoch\": 1}"}) {
    auto l = ReplicaLayout::FromJson(bad);
    EXPECT_EQ(l.status().code(), StatusCode::kCorruption) << bad;
  }
}

// The primary's side alone, against a backup the test plays: a reply is
// released only once every backup acknowledged it and everything before
// it; a refusal stops a backup from counting (its later acknowledgements
// release nothing) until the view drops it.
TEST(ReplicaLayoutTest, HostileDocumentsAreRefusedNotCrashes) {
  // What a member with etcd write access (or a corrupted key) could leave
  // in <prefix>/layout: wrong types, huge lists, deep nesting, numbers out
  // of range. Each is refused as Corruption or read within bounds.
  std::string deep = "0";
  for (int i = 0; i < 300; ++i) deep = "[" + deep + "]";
  std::string many = "[";
  for (int i = 0; i < 100000; ++i) many += (i ? ",\"g0r1\"" : "\"g0r1\"");
  many += "]";
  for (const std::string& bad :
       {std::string("{\"epoch\": -1, \"groups\": []}"),
        std::string("{\"epoch\": 1e400, \"groups\": []}"),
        "{\"epoch\": 1, \"groups\": " + deep + "}",
        "{\"epoch\": 1, \"groups\": [{\"primary\": \"g0r0\", \"backups\": " +
            many + "}]}",
        std::string("{\"epoch\": 1, \"groups\": [{\"primary\": \"g0r0\", "
                    "\"backups\": [], "
                    "\"incarnations\": {\"g0r0\": \"x\"}}]}"),
        std::string("{\"epoch\": 1, \"groups\": [{\"epoch\": 9, \"primary\": "
                    "\"a\", \"backups\": []}]}")}) {
    auto l = ReplicaLayout::FromJson(bad);
    EXPECT_FALSE(l.ok()) << bad.substr(0, 80);
  }
}

TEST(ReplicaMacTest, HeaderTagsCoverTheHeaderTheShapeAndTheirCoverage) {
  const std::string secret(kReplicaSecretBytes, 'k');
  auto sender = ReplicaMac::Create(secret, 3);
  auto receiver = ReplicaMac::Create(secret, 3);
  ASSERT_TRUE(sender.ok() && receiver.ok());
  const std::string& session = (*sender)->session();
  const std::string header = "header", inner = "inner", data(1 << 16, 'd');
  auto frames_of = [](const std::string& h, const std::string& i,
                      const std::string& d) {
    return std::vector<TagPiece>{
        {h.data(), h.size()}, {i.data(), i.size()}, {d.data(), d.size()}};
  };
  const auto frames = frames_of(header, inner, data);
  uint64_t id = 1;
  auto tag = (*sender)->Sign(id, frames, Coverage::kHeader);
  // The header's bytes, a frame's length, the frame count and the coverage
  // are covered: each change is refused.
  std::string h2 = header;
  h2[2] ^= 1;
  EXPECT_FALSE((*receiver)
                   ->Verify(session, id, frames_of(h2, inner, data),
                            Coverage::kHeader, tag.data(), 16)
                   .ok());
  EXPECT_FALSE((*receiver)
                   ->Verify(session, id, frames_of(header, inner, data + "x"),
                            Coverage::kHeader, tag.data(), 16)
                   .ok());
  EXPECT_FALSE((*receiver)
                   ->Verify(session, id, {frames[0], frames[1]},
                            Coverage::kHeader, tag.data(), 16)
                   .ok());
  EXPECT_FALSE((*receiver)
                   ->Verify(session, id, frames, Coverage::kAll, tag.data(), 16)
                   .ok());
  // The payload's bytes are not: that is what kHeader leaves to the path.
  std::string d2 = data;
  d2[100] ^= 1;
  EXPECT_TRUE((*receiver)
                  ->Verify(session, id, frames_of(header, inner, d2),
                           Coverage::kHeader, tag.data(), 16)
                  .ok());
  // Still once per id.
  EXPECT_FALSE(
      (*receiver)
          ->Verify(session, id, frames, Coverage::kHeader, tag.data(), 16)
          .ok());
  // A kAll tag is not a kHeader tag of the same frames.
  ++id;
  auto all = (*sender)->Sign(id, frames, Coverage::kAll);
  EXPECT_FALSE(
      (*receiver)
          ->Verify(session, id, frames, Coverage::kHeader, all.data(), 16)
          .ok());
  EXPECT_TRUE((*receiver)
                  ->Verify(session, id, frames, Coverage::kAll, all.data(), 16)
                  .ok());
}

TEST(ReplicaMacTest, TagsVerifyOnceAndOnlyUnderTheirSecretGroupAndSession) {
  const std::string secret(kReplicaSecretBytes, 'k');
  auto sender = ReplicaMac::Create(secret, 3);
  auto receiver = ReplicaMac::Create(secret, 3);
  auto other_group = ReplicaMac::Create(secret, 4);
  auto other_secret =
      ReplicaMac::Create(std::string(kReplicaSecretBytes, 'j'), 3);
  ASSERT_TRUE(sender.ok() && receiver.ok() && other_group.ok() &&
              other_secret.ok());
  EXPECT_EQ((*sender)->session().size(), kReplicaSessionBytes);
  EXPECT_NE((*sender)->session(), (*receiver)->session());
  const std::string header = "header", data(1 << 20, 'd');
  const std::vector<TagPiece> frames{{header.data(), header.size()},
                                     {data.data(), data.size()}};
  constexpr Coverage kAll = Coverage::kAll;
  auto tag = (*sender)->Sign(10, frames, kAll);
  const std::string& session = (*sender)->session();
  EXPECT_TRUE((*receiver)
                  ->Verify(session, 10, frames, kAll, tag.data(), tag.size())
                  .ok());
  // Replayed, or an older id of the session: refused.
  EXPECT_EQ((*receiver)
                ->Verify(session, 10, frames, kAll, tag.data(), tag.size())
                .code(),
            StatusCode::kPermissionDenied);
  auto tag9 = (*sender)->Sign(9, frames, kAll);
  EXPECT_FALSE((*receiver)
                   ->Verify(session, 9, frames, kAll, tag9.data(), tag9.size())
                   .ok());
  // Another group, another secret, another id, a changed byte, frames cut
  // differently, a short tag: refused.
  auto tag11 = (*sender)->Sign(11, frames, kAll);
  EXPECT_FALSE(
      (*other_group)->Verify(session, 11, frames, kAll, tag11.data(), 16).ok());
  EXPECT_FALSE((*other_secret)
                   ->Verify(session, 11, frames, kAll, tag11.data(), 16)
                   .ok());
  EXPECT_FALSE(
      (*receiver)->Verify(session, 12, frames, kAll, tag11.data(), 16).ok());
  std::string changed = data;
  changed[12345] ^= 1;
  const std::vector<TagPiece> changed_frames{{header.data(), header.size()},
                                             {changed.data(), changed.size()}};
  EXPECT_FALSE((*receiver)
                   ->Verify(session, 11, changed_frames, kAll, tag11.data(), 16)
                   .ok());
  const std::string joined = header + data;
  const std::vector<TagPiece> one_frame{{joined.data(), joined.size()}};
  EXPECT_FALSE(
      (*receiver)->Verify(session, 11, one_frame, kAll, tag11.data(), 16).ok());
  EXPECT_FALSE(
      (*receiver)->Verify(session, 11, frames, kAll, tag11.data(), 15).ok());
  EXPECT_TRUE(
      (*receiver)->Verify(session, 11, frames, kAll, tag11.data(), 16).ok());
  // Made-up sessions never push the real one out of the cache: its replay
  // window survives any number of them.
  for (int i = 0; i < 100; ++i) {
    std::string fake(kReplicaSessionBytes, static_cast<char>(i));
    EXPECT_FALSE(
        (*receiver)->Verify(fake, 1, frames, kAll, tag11.data(), 16).ok());
  }
  EXPECT_FALSE(
      (*receiver)->Verify(session, 11, frames, kAll, tag11.data(), 16).ok());
  // Secrets: 64 hex digits, from files others cannot read.
  EXPECT_EQ(SecretFromHex(SecretToHex(secret)).value(), secret);
  EXPECT_FALSE(SecretFromHex("abc").ok());
  EXPECT_FALSE(SecretFromHex(std::string(64, 'z')).ok());
  EXPECT_FALSE(ReplicaMac::Create("short", 0).ok());
}

// A primary's Replicator (g0r0, incarnation 42, a fixed secret, no pings)
// and a backup the test plays, bound at `backup_endpoint`, on one context.
struct FakeGroup {
  explicit FakeGroup(const std::string& backup_endpoint) {
    TransportOptions to;
    to.context = ctx;
    auto b = ServerSocket::Bind(backup_endpoint, to);
    EXPECT_TRUE(b.ok());
    if (b.ok()) backup = std::move(b).value();
    ReplicatorOptions ro;
    ro.transport.context = ctx;
    ro.ping_every = milliseconds(100000);  // no pings in these tests
    ro.name = "g0r0";
    ro.incarnation = 42;
    ro.secret = std::string(kReplicaSecretBytes, 's');
    auto made = Replicator::Create(ro);
    EXPECT_TRUE(made.ok()) << made.status().ToString();
    if (made.ok()) rep = std::move(made).value();
  }
  bool ok() const { return backup && rep; }
  std::shared_ptr<Context> ctx = Context::Create(1);
  std::unique_ptr<ServerSocket> backup;
  std::unique_ptr<Replicator> rep;
};

// A primary's view at `epoch` with `backups` and a lease for an hour.
ReplicaView PrimaryView(uint64_t epoch, std::vector<std::string> backups) {
  ReplicaView v;
  v.epoch = epoch;
  v.primary = true;
  v.backup_endpoints = std::move(backups);
  v.lease_valid_until = SteadyClock::now() + std::chrono::hours(1);
  return v;
}

TEST(ReplicatorTest, RepliesWaitForEveryUpdateBeforeThemOnTheBackup) {
  FakeGroup g("inproc://fake-backup");
  ASSERT_TRUE(g.ok());
  Replicator& rep = *g.rep;
  auto* backup = &g.backup;
  ReplicaView v = PrimaryView(3, {"inproc://fake-backup"});
  std::vector<OutgoingReply> out;
  ASSERT_TRUE(rep.SetView(v, &out).ok());
  auto of = [](RequestKind kind, MigrateOp op = MigrateOp::kDescribe) {
    RequestHeader h;
    h.kind = kind;
    h.migrate_op = op;
    return h;
  };
  ASSERT_TRUE(rep.Replicates(of(RequestKind::kPush)));
  ASSERT_TRUE(rep.Replicates(of(RequestKind::kAssign)));  // uploads (issue 22)
  EXPECT_FALSE(rep.Replicates(of(RequestKind::kPull)));
  // Steps of an elastic change: those that alter the shard, not the reads.
  for (MigrateOp op : {MigrateOp::kFreeze, MigrateOp::kImport,
                       MigrateOp::kAdopt, MigrateOp::kAbort})
    EXPECT_TRUE(rep.Replicates(of(RequestKind::kMigrate, op)));
  for (MigrateOp op : {MigrateOp::kDescribe, MigrateOp::kExport})
    EXPECT_FALSE(rep.Replicates(of(RequestKind::kMigrate, op)));
  Message worker_msg;  // what a worker sent: one header frame
  auto bytes =
      std::make_shared<std::vector<uint8_t>>(EncodeRequest(RequestHeader{}));
  worker_msg.frames.push_back({bytes->data(), bytes->size(), bytes});
  for (uint64_t id = 1; id <= 3; ++id) {
    OutgoingReply r;
    r.peer = "worker";
    r.header.id = id;
    rep.Forward(worker_msg, &r, &out);
  }
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(rep.num_held(), 3u);
  // The backup receives three kReplicate requests, in order, stamped with
  // the epoch, and answers: OK, refused, OK.
  std::vector<uint64_t> seqs;
  for (int i = 0; i < 3; ++i) {
    std::string peer;
    Message m;
    auto got = (*backup)->Receive(&peer, &m, milliseconds(2000));
    ASSERT_TRUE(got.ok() && *got);
    RequestHeader h;
    ASSERT_TRUE(DecodeRequest(m.frames[0].data, m.frames[0].size, {}, &h).ok());
    EXPECT_EQ(h.kind, RequestKind::kReplicate);
    EXPECT_EQ(h.replicate_epoch, 3u);
    // Header, the worker's header, the tag (replica_auth.h); the sender.
    EXPECT_EQ(m.frames.size(), 3u);
    EXPECT_EQ(m.frames.back().size, kReplicaTagBytes);
    EXPECT_EQ(h.replica_sender, "g0r0");
    EXPECT_EQ(h.replica_incarnation, 42u);
    EXPECT_EQ(h.replica_session.size(), kReplicaSessionBytes);
    seqs.push_back(h.id);
    ReplyHeader a;
    a.id = h.id;
    a.kind = RequestKind::kReplicate;
    if (i == 1) a.status = Status::FailedPrecondition("stale epoch");
    std::vector<Frame> f{Frame::Owned(EncodeReply(a))};
    ASSERT_TRUE((*backup)->Send(peer, f).ok());
  }
  EXPECT_LT(seqs[0], seqs[1]);
  EXPECT_LT(seqs[1], seqs[2]);
  const auto until = SteadyClock::now() + milliseconds(2000);
  while (out.empty() && SteadyClock::now() < until) rep.Poll(&out);
  std::this_thread::sleep_for(milliseconds(100));
  rep.Poll(&out);
  ASSERT_EQ(out.size(), 1u);  // only the first: the second was refused
  EXPECT_EQ(out[0].header.id, 1u);
  EXPECT_EQ(rep.num_held(), 2u);
  // The view drops the backup: this primary alone holds the group now.
  v.epoch = 4;
  v.backup_endpoints.clear();
  ASSERT_TRUE(rep.SetView(v, &out).ok());
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[2].header.id, 3u);
  // Deposed: held replies are dropped unanswered.
  OutgoingReply r;
  r.header.id = 9;
  v.backup_endpoints = {"inproc://fake-backup"};
  v.epoch = 5;
  ASSERT_TRUE(rep.SetView(v, &out).ok());
  rep.Forward(worker_msg, &r, &out);
  EXPECT_EQ(rep.num_held(), 1u);
  v.primary = false;
  v.epoch = 6;
  ASSERT_TRUE(rep.SetView(v, &out).ok());
  EXPECT_EQ(rep.num_held(), 0u);
  EXPECT_EQ(out.size(), 3u);
}

// Issue 40, finding 2: a view naming a backup whose endpoint does not
// parse left null entries behind (the primary crashed in wake_sockets() or
// Admit(), or acknowledged writes replicated to nobody). Now the view takes
// effect whole: the unreachable backup stays listed, holds every reply, and
// is reported for Membership to drop through etcd; once the view drops it,
// the replies the reachable backup acknowledged are released.
TEST(ReplicatorTest,
     ABackupThatCannotBeConnectedHoldsRepliesUntilTheViewDropsIt) {
  FakeGroup g("inproc://good-backup");
  ASSERT_TRUE(g.ok());
  Replicator& rep = *g.rep;
  ReplicaView v =
      PrimaryView(3, {"inproc://good-backup", "tcp://127.0.0.1:notaport"});
  std::vector<OutgoingReply> out;
  Status set = rep.SetView(v, &out);
  EXPECT_FALSE(set.ok());
  EXPECT_NE(set.message().find("notaport"), std::string::npos)
      << set.ToString();
  EXPECT_EQ(rep.TakeBroken(),
            std::vector<std::string>{"tcp://127.0.0.1:notaport"});
  EXPECT_EQ(rep.wake_sockets().size(), 1u);  // no null socket handed out
  std::string redirect;
  EXPECT_TRUE(
      rep.Admit(RequestKind::kPush, SteadyClock::now(), &redirect).ok());
  Message worker_msg;
  auto bytes =
      std::make_shared<std::vector<uint8_t>>(EncodeRequest(RequestHeader{}));
  worker_msg.frames.push_back({bytes->data(), bytes->size(), bytes});
  OutgoingReply r;
  r.header.id = 1;
  rep.Forward(worker_msg, &r, &out);
  // The good backup applies and acknowledges it; the reply still waits.
  std::string peer;
  Message m;
  auto got = g.backup->Receive(&peer, &m, milliseconds(2000));
  ASSERT_TRUE(got.ok() && *got);
  RequestHeader h;
  ASSERT_TRUE(DecodeRequest(m.frames[0].data, m.frames[0].size, {}, &h).ok());
  ReplyHeader a;
  a.id = h.id;
  a.kind = RequestKind::kReplicate;
  std::vector<Frame> f{Frame::Owned(EncodeReply(a))};
  ASSERT_TRUE(g.backup->Send(peer, f).ok());
  const auto until = SteadyClock::now() + milliseconds(500);
  while (SteadyClock::now() < until) rep.Poll(&out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(rep.num_held(), 1u);
  // Membership dropped it (a new epoch): the reply is released.
  v.epoch = 4;
  v.backup_endpoints = {"inproc://good-backup"};
  ASSERT_TRUE(rep.SetView(v, &out).ok());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].header.id, 1u);
}

// One replica: a Server on inproc://<name> running on its own thread.
struct Replica {
  std::unique_ptr<Server> server;
  std::thread thread;
  std::atomic<bool> stop{false};
  Status run_status;
  ~Replica() { Stop(); }
  void Stop() {
    stop = true;
    if (thread.joinable()) thread.join();
  }
};

class ReplicationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!asyncps::testing::EtcdServer::Available())
      GTEST_SKIP() << "etcd not installed (Debian's etcd-server)";
    dir_ = std::filesystem::temp_directory_path() /
           ("replication_test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    auto e = asyncps::testing::EtcdServer::Start((dir_ / "etcd").string(),
                                                 dir_.string());
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    etcd_ = std::move(e).value();
    ctx_ = Context::Create(1);
  }
  void TearDown() override {
    replicas_.clear();
    etcd_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::unique_ptr<Replica> StartReplica(
      int replica, int replicas, const std::string& tag = "",
      const std::function<void(ServerOptions*)>& tweak = {}) {
    ServerOptions o;
    o.endpoint = "inproc://g0r" + std::to_string(replica) + tag;
    o.context = ctx_;
    o.shard.num_workers = 1;
    o.shard.num_shards = 1;
    o.shard.optimizer.lr = 0.5f;
    o.replication.etcd_endpoints = {etcd_->endpoint()};
    o.replication.prefix = "/asyncps/test";
    o.replication.replicas = replicas;
    o.replication.replica = replica;
    o.replication.lease_ttl = milliseconds(1000);
    o.replication.poll = milliseconds(50);
    o.replication.startup_grace = milliseconds(3000);
    o.db_path = (dir_ / ("db-g0r" + std::to_string(replica) + tag)).string();
    if (tweak) tweak(&o);
    auto r = std::make_unique<Replica>();
    auto s = Server::Create(o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return nullptr;
    r->server = std::move(s).value();
    Replica* p = r.get();
    r->thread = std::thread([p] { p->run_status = p->server->Run(p->stop); });
    return r;
  }

  std::unique_ptr<ClientSocket> Connect(const std::string& endpoint) {
    TransportOptions to;
    to.context = ctx_;
    auto c = ClientSocket::Connect(endpoint, to);
    EXPECT_TRUE(c.ok());
    return std::move(c).value();
  }

  // One request, its reply (5 s at most).
  // A request with id 0 gets a new one; else it is sent with its own (a
  // resend).
  ReplyHeader Call(ClientSocket& c, RequestHeader req,
                   const std::vector<ByteView>& data = {}) {
    if (req.id == 0) req.id = ++next_id_;
    last_id_ = req.id;
    std::vector<Frame> frames;
    frames.push_back(Frame::Owned(EncodeRequest(req)));
    for (const ByteView& v : data)
      frames.push_back(Frame::Ref(v.data, v.size, v.owner));
    EXPECT_TRUE(c.Send(frames).ok());
    return AwaitReply(c, req.id);
  }
  // The reply to request `id` on `c` (5 s at most).
  ReplyHeader AwaitReply(ClientSocket& c, uint64_t id) {
    Message msg;
    ReplyHeader r;
    const auto until = SteadyClock::now() + milliseconds(5000);
    while (SteadyClock::now() < until) {
      auto got = c.Receive(&msg, milliseconds(100));
      if (!got.ok() || !*got || msg.frames.empty()) continue;
      EXPECT_TRUE(
          DecodeReply(msg.frames[0].data, msg.frames[0].size, {}, &r).ok());
      if (r.id == id) return r;
    }
    r.status = Status::TimedOut("no reply");
    return r;
  }

  // Retries `req` until it is answered OK (a group still starting or
  // failing over answers Unavailable), at most `wait`.
  ReplyHeader CallUntilOk(ClientSocket& c, const RequestHeader& req,
                          const std::vector<ByteView>& data = {},
                          milliseconds wait = milliseconds(8000)) {
    const auto until = SteadyClock::now() + wait;
    ReplyHeader r;
    do {
      r = Call(c, req, data);
      if (r.status.ok()) return r;
      std::this_thread::sleep_for(milliseconds(20));
    } while (SteadyClock::now() < until);
    return r;
  }

  nlohmann::json Stats(ClientSocket& c) {
    RequestHeader s;
    s.kind = RequestKind::kStats;
    ReplyHeader r = Call(c, s);
    EXPECT_TRUE(r.status.ok()) << r.status.ToString();
    auto j = nlohmann::json::parse(r.text, nullptr, false);
    return j.is_object() ? j : nlohmann::json::object();
  }
  uint64_t Version(ClientSocket& c) {
    return Stats(c).value("version", uint64_t{0});
  }

  // Sends without waiting (BSP replies are held until the round's record
  // is acknowledged); returns the id.
  uint64_t Send(ClientSocket& c, RequestHeader req,
                const std::vector<ByteView>& data = {}) {
    if (req.id == 0) req.id = ++next_id_;
    std::vector<Frame> frames;
    frames.push_back(Frame::Owned(EncodeRequest(req)));
    for (const ByteView& v : data)
      frames.push_back(Frame::Ref(v.data, v.size, v.owner));
    EXPECT_TRUE(c.Send(frames).ok());
    return req.id;
  }
  // Waits up to `wait` for the replies to `ids` on `c`: their statuses.
  std::map<uint64_t, Status> Await(ClientSocket& c,
                                   const std::set<uint64_t>& ids,
                                   milliseconds wait = milliseconds(5000)) {
    std::map<uint64_t, Status> got;
    const auto until = SteadyClock::now() + wait;
    Message msg;
    while (got.size() < ids.size() && SteadyClock::now() < until) {
      auto r = c.Receive(&msg, milliseconds(20));
      if (!r.ok() || !*r || msg.frames.empty()) continue;
      ReplyHeader h;
      if (!DecodeReply(msg.frames[0].data, msg.frames[0].size, {}, &h).ok())
        continue;
      if (ids.count(h.id)) got.emplace(h.id, h.status);
    }
    return got;
  }

  // A fresh group of two replicas (inproc://g0r0<tag>, g0r1<tag>) with
  // `opts` (its etcd prefix too): `workers` sockets on the primary, returned
  // once the first registered SmallModel() (*reg); *backup on the backup.
  // Empty when the group did not start.
  std::vector<std::unique_ptr<ClientSocket>> StartGroup(
      const std::string& tag, int workers,
      const std::function<void(ServerOptions*)>& opts,
      std::unique_ptr<ClientSocket>* backup, RequestHeader* reg) {
    replicas_.clear();
    replicas_.push_back(StartReplica(0, 2, tag, opts));
    replicas_.push_back(StartReplica(1, 2, tag, opts));
    std::vector<std::unique_ptr<ClientSocket>> ws;
    if (!replicas_[0] || !replicas_[1]) return ws;
    for (int r = 0; r < workers; ++r)
      ws.push_back(Connect("inproc://g0r0" + tag));
    *backup = Connect("inproc://g0r1" + tag);
    *reg = server::testing::ShardHarness::Register(
        0, server::testing::SmallModel(), server::testing::SmallLayout(1));
    EXPECT_TRUE(CallUntilOk(*ws[0], *reg).status.ok());
    return ws;
  }

  static RequestHeader Push(uint64_t incarnation) {
    RequestHeader p = server::testing::ShardHarness::Push(
        0, 0, {0}, {server::testing::Floats(grad_)});
    p.incarnation = incarnation;
    return p;
  }

  // The group's secret, as its replicas read it from etcd.
  std::string GroupSecret(const std::string& prefix = "/asyncps/test") {
    EtcdOptions eo;
    eo.endpoints = {etcd_->endpoint()};
    auto c = EtcdClient::Create(eo);
    EXPECT_TRUE(c.ok());
    auto kv = (*c)->Get(prefix + "/secrets/g0");
    EXPECT_TRUE(kv.ok() && kv->has_value());
    if (!kv.ok() || !kv->has_value()) return "";
    auto secret = SecretFromHex((*kv)->value);
    EXPECT_TRUE(secret.ok());
    return secret.ok() ? *secret : "";
  }
  // The incarnation in `name`'s member record.
  uint64_t IncarnationOf(const std::string& name) {
    EtcdOptions eo;
    eo.endpoints = {etcd_->endpoint()};
    auto c = EtcdClient::Create(eo);
    auto kv = (*c)->Get("/asyncps/test/members/" + name);
    EXPECT_TRUE(kv.ok() && kv->has_value()) << name;
    if (!kv.ok() || !kv->has_value()) return 0;
    auto j = nlohmann::json::parse((*kv)->value, nullptr, false);
    return j.value("incarnation", uint64_t{0});
  }
  // Sends the replica request `h` (kReplicate, kSnapshot) with `data`, with
  // the tag of `mac` as its last frame when `mac` is set (signed as
  // replica_auth.h says; `tamper` flips a bit of the tag), and returns the
  // reply.
  ReplyHeader CallReplica(ClientSocket& c, RequestHeader h,
                          const std::vector<ByteView>& data, ReplicaMac* mac,
                          bool tamper = false, int tag_all = -1) {
    if (h.id == 0) h.id = ++next_id_;
    if (mac != nullptr) h.replica_session = mac->session();
    // By default tagged as the group's primary tags it.
    h.replica_tag_all = tag_all >= 0
                            ? tag_all == 1
                            : h.kind == RequestKind::kSnapshot || tag_all_;
    const std::vector<uint8_t> header = EncodeRequest(h);
    std::vector<Frame> frames;
    frames.push_back(Frame::Copy(header.data(), header.size()));
    std::vector<TagPiece> pieces{{header.data(), header.size()}};
    for (const ByteView& v : data) {
      frames.push_back(Frame::Ref(v.data, v.size, v.owner));
      pieces.emplace_back(v.data, v.size);
    }
    if (mac != nullptr) {
      auto tag = mac->Sign(
          h.id, pieces, h.replica_tag_all ? Coverage::kAll : Coverage::kHeader);
      if (tamper) tag[3] ^= 1;
      frames.push_back(Frame::Copy(tag.data(), tag.size()));
    }
    EXPECT_TRUE(c.Send(frames).ok());
    return AwaitReply(c, h.id);
  }
  // Every weight the shard at `c` serves, its pull reply's data frames one
  // after another (retried while the group fails over).
  std::vector<uint8_t> PullAll(ClientSocket& c) {
    const auto until = SteadyClock::now() + milliseconds(8000);
    while (SteadyClock::now() < until) {
      RequestHeader pull = server::testing::ShardHarness::Pull(0, 0);
      pull.id = ++next_id_;
      std::vector<Frame> frames{Frame::Owned(EncodeRequest(pull))};
      EXPECT_TRUE(c.Send(frames).ok());
      Message msg;
      const auto reply_by = SteadyClock::now() + milliseconds(2000);
      while (SteadyClock::now() < reply_by) {
        auto got = c.Receive(&msg, milliseconds(50));
        if (!got.ok() || !*got || msg.frames.empty()) continue;
        ReplyHeader r;
        if (!DecodeReply(msg.frames[0].data, msg.frames[0].size, {}, &r).ok() ||
            r.id != pull.id)
          continue;
        if (!r.status.ok()) break;
        std::vector<uint8_t> all;
        for (size_t i = 1; i < msg.frames.size(); ++i)
          all.insert(all.end(), msg.frames[i].data,
                     msg.frames[i].data + msg.frames[i].size);
        return all;
      }
      std::this_thread::sleep_for(milliseconds(50));
    }
    ADD_FAILURE() << "no pull answered";
    return {};
  }
  // What a forgery must not change on a backup: its version, clocks,
  // liveness, round and de-duplication table (its stats).
  static nlohmann::json StateOf(const nlohmann::json& stats) {
    return {{"version", stats.value("version", nlohmann::json())},
            {"worker_clocks", stats.value("worker_clocks", nlohmann::json())},
            {"worker_live", stats.value("worker_live", nlohmann::json())},
            {"min_clock", stats.value("min_clock", nlohmann::json())},
            {"bsp_round", stats.value("bsp_round", nlohmann::json())},
            {"push_table", stats.value("push_table", nlohmann::json())},
            {"pushes", stats.value("pushes", nlohmann::json())}};
  }

  void ForgeriesAreRefused(bool tag_all);

  std::filesystem::path dir_;
  std::unique_ptr<asyncps::testing::EtcdServer> etcd_;
  std::shared_ptr<Context> ctx_;
  std::vector<std::unique_ptr<Replica>> replicas_;
  uint64_t next_id_ = 0;
  uint64_t last_id_ = 0;
  bool tag_all_ = false;  // the group's replicas run with Coverage::kAll
  static inline const std::vector<float> grad_ = std::vector<float>(16, 0.1f);
};

// A primary's request to drop a silent backup survives a lost race for the
// layout key. In a fleet, a host kill makes one group's backup promote
// itself and another group's primary drop its backup in the same
// millisecond; whichever write loses its compare-and-put used to lose the
// drop too, so the primary's view kept the dead backup (and held its
// acknowledgements) until the backup's lease ended: the 1.25-1.36 s
// host-kill outliers (experiments/results/failover/README.md). Here the
// layout key is rewritten as fast as etcd takes it while the drop is
// asked for, so the primary's writes conflict; once it stops, the drop is
// made, although the backup is alive (its lease never ends).
TEST_F(ReplicationTest, BackupDropSurvivesALayoutWriteConflict) {
  using replication::Membership;
  using replication::MembershipOptions;
  using replication::ReplicaView;
  // A round: a fresh group of 2 under its own prefix, the drop asked for
  // while the key's revision moves. The drop's first write usually
  // conflicts, not always (it may land between two rewrites, more often on
  // a loaded machine, where the rewriters get less CPU: a CI run once had
  // none in 6 rounds): rounds run until one had conflicts, at most 24, and
  // in every round the drop is made.
  int conflicted_rounds = 0;
  for (int round = 0; round < 24 && conflicted_rounds == 0; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const std::string prefix = "/asyncps/conflict" + std::to_string(round);
    std::vector<std::unique_ptr<Membership>> m;
    for (int r = 0; r < 2; ++r) {
      MembershipOptions o;
      o.etcd_endpoints = {etcd_->endpoint()};
      o.prefix = prefix;
      o.replicas = 2;
      o.replica = r;
      o.endpoint = "tcp://127.0.0.1:" + std::to_string(41000 + r);
      o.poll = milliseconds(20);
      o.startup_grace = milliseconds(3000);
      auto mm = Membership::Create(o);
      ASSERT_TRUE(mm.ok()) << mm.status().ToString();
      m.push_back(std::move(mm).value());
    }
    ReplicaView v;
    auto wait_view = [&](const std::function<bool(const ReplicaView&)>& want) {
      const auto until =
          std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (std::chrono::steady_clock::now() < until) {
        m[0]->TakeView(&v);
        if (want(v)) return true;
        std::this_thread::sleep_for(milliseconds(5));
      }
      return false;
    };
    ASSERT_TRUE(wait_view([](const ReplicaView& x) {
      return x.primary && x.backup_endpoints.size() == 1;
    }));
    // Four threads rewrite the key with its own current value (each a
    // compare-and-put on the revision it just read, so a write of the
    // primary is never undone): its revision moves every fraction of a
    // millisecond.
    std::atomic<bool> bump{true};
    std::vector<std::thread> bumpers;
    for (int i = 0; i < 4; ++i) {
      bumpers.emplace_back([&] {
        EtcdOptions eo;
        eo.endpoints = {etcd_->endpoint()};
        auto etcd = EtcdClient::Create(eo);
        ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
        while (bump) {
          auto kv = (*etcd)->Get(prefix + "/layout");
          if (!kv.ok() || !kv->has_value()) continue;
          (void)(*etcd)->CompareAndPut(prefix + "/layout", (*kv)->value,
                                       (*kv)->mod_revision);
        }
      });
    }
    std::this_thread::sleep_for(milliseconds(100));
    const uint64_t conflicts = m[0]->counters().cas_conflicts;
    m[0]->DropBackup("tcp://127.0.0.1:41001", /*silent=*/true);
    std::this_thread::sleep_for(milliseconds(500));
    bump = false;
    for (std::thread& t : bumpers) t.join();
    if (m[0]->counters().cas_conflicts > conflicts) ++conflicted_rounds;
    EXPECT_TRUE(wait_view([](const ReplicaView& x) {
      return x.primary && x.backup_endpoints.empty();
    })) << "the backup is still listed: the drop was lost (conflicts "
        << m[0]->counters().cas_conflicts - conflicts << ")";
    EXPECT_EQ(m[0]->counters().backups_dropped, 1u);
    for (auto& x : m) x->Stop(/*revoke=*/true);
  }
  EXPECT_EQ(conflicted_rounds, 1);
}

TEST_F(ReplicationTest, BackupAppliesWhatThePrimaryAcknowledgesAndTakesOver) {
  replicas_.push_back(StartReplica(0, 2));
  replicas_.push_back(StartReplica(1, 2));
  ASSERT_TRUE(replicas_[0] && replicas_[1]);
  auto c0 = Connect("inproc://g0r0");
  auto c1 = Connect("inproc://g0r1");
  RequestHeader reg = server::testing::ShardHarness::Register(
      0, server::testing::SmallModel(), server::testing::SmallLayout(1));
  ASSERT_TRUE(CallUntilOk(*c0, reg).status.ok());
  const std::vector<ByteView> data{server::testing::Floats(grad_)};
  RequestHeader push = Push(7);
  for (int i = 0; i < 5; ++i) {
    ReplyHeader r = CallUntilOk(*c0, push, data);
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    EXPECT_EQ(r.epoch, 1u);
  }
  const uint64_t acked_last = last_id_;
  // Acknowledged on the primary = applied on the backup, before the reply.
  EXPECT_EQ(Version(*c1), 5u);
  EXPECT_EQ(Version(*c0), 5u);

  // The backup refuses workers and names the primary.
  ReplyHeader refused = Call(*c1, push, data);
  EXPECT_EQ(refused.status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(refused.redirect, "inproc://g0r0");
  EXPECT_EQ(refused.epoch, 1u);

  // The primary leaves (its lease is revoked): the backup takes over with
  // everything acknowledged so far, and de-duplicates a resend.
  const auto left = SteadyClock::now();
  replicas_[0]->Stop();
  RequestHeader again = push;  // the last push, resent after the failover
  again.id = acked_last;
  ReplyHeader r = CallUntilOk(*c1, again, data);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  const double took =
      std::chrono::duration<double>(SteadyClock::now() - left).count();
  EXPECT_EQ(r.epoch, 2u);
  EXPECT_LT(took, 5.0);
  EXPECT_EQ(Version(*c1), 5u);  // the resend was a duplicate
  ReplyHeader fresh = CallUntilOk(*c1, Push(7), data);
  ASSERT_TRUE(fresh.status.ok());
  EXPECT_EQ(Version(*c1), 6u);

  // A deposed primary's replicate request is refused by the new primary
  // (signed with the group's secret, as the deposed one would: it is a
  // member, its epoch is stale); unsigned, it is refused before that.
  RequestHeader rep;
  rep.kind = RequestKind::kReplicate;
  rep.replicate_epoch = 1;
  rep.replicate_group = 0;
  rep.replica_sender = "g0r0";
  auto mac = ReplicaMac::Create(GroupSecret(), 0);
  ASSERT_TRUE(mac.ok());
  ReplyHeader stale = CallReplica(*c1, rep, {}, mac->get());
  EXPECT_EQ(stale.status.code(), StatusCode::kFailedPrecondition)
      << stale.status.ToString();
  EXPECT_EQ(Call(*c1, rep).status.code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(Version(*c1), 6u);

  // A process back under the old name is a spare: not primary, not backup.
  replicas_.push_back(StartReplica(0, 2, "-again"));
  auto c2 = Connect("inproc://g0r0-again");
  std::this_thread::sleep_for(milliseconds(300));
  // (The primary may already have copied its state to it and made it a
  // backup: either way it serves no worker and takes no stale update.)
  ReplyHeader spare = Call(*c2, Push(8), data);
  EXPECT_EQ(spare.status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(spare.redirect, "inproc://g0r1");
  EXPECT_EQ(CallReplica(*c2, rep, {}, mac->get()).status.code(),
            StatusCode::kFailedPrecondition);
}

TEST_F(ReplicationTest, ReplacementIsCopiedToAndBecomesABackup) {
  // Backups are dropped for silence only after 3 s here, not 500 ms: under
  // TSan beside other tests, g0r1 was once dropped as silent while it took
  // the registration, so the acknowledged pushes below lived on g0r0 alone
  // and g0r1 resumed the group without them. The primary's loss is still
  // seen through its lease (Stop revokes it).
  auto patient = [](ServerOptions* o) {
    o->replica_suspect_after = milliseconds(3000);
  };
  replicas_.push_back(StartReplica(0, 2, "", patient));
  replicas_.push_back(StartReplica(1, 2, "", patient));
  auto c0 = Connect("inproc://g0r0");
  auto c1 = Connect("inproc://g0r1");
  RequestHeader reg = server::testing::ShardHarness::Register(
      0, server::testing::SmallModel(), server::testing::SmallLayout(1));
  ASSERT_TRUE(CallUntilOk(*c0, reg).status.ok());
  const std::vector<ByteView> data{server::testing::Floats(grad_)};
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(CallUntilOk(*c0, Push(7), data).status.ok());
  replicas_[0]->Stop();  // g0r1 takes over, alone
  for (int i = 0; i < 2; ++i)
    ASSERT_TRUE(CallUntilOk(*c1, Push(7), data).status.ok());
  EXPECT_EQ(Version(*c1), 5u);
  // A replacement under the old name, its disk empty: a spare, copied to
  // by the primary (a checkpoint of its store), then listed as a backup.
  replicas_.push_back(StartReplica(0, 2, "-new"));
  auto c2 = Connect("inproc://g0r0-new");
  const auto until = SteadyClock::now() + milliseconds(10000);
  uint64_t v = 0;
  while (SteadyClock::now() < until && (v = Version(*c2)) != 5u)
    std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(v, 5u);
  // Updates go to it before they are acknowledged: once the layout lists
  // it (new epoch), what g0r1 acknowledges is on g0r0-new too.
  ReplyHeader r;
  do {
    r = CallUntilOk(*c1, Push(7), data);
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  } while (r.epoch < 3u && SteadyClock::now() < until);
  EXPECT_GE(r.epoch, 3u);
  const uint64_t on_primary = Version(*c1);
  EXPECT_EQ(Version(*c2), on_primary);
  // And it takes over with all of it when g0r1 leaves.
  replicas_[1]->Stop();
  ASSERT_TRUE(CallUntilOk(*c2, Push(7), data).status.ok());
  EXPECT_EQ(Version(*c2), on_primary + 1);
}

TEST_F(ReplicationTest, PrimaryAloneStopsWritingWithoutItsLease) {
  replicas_.push_back(StartReplica(0, 1));
  ASSERT_TRUE(replicas_[0]);
  auto c0 = Connect("inproc://g0r0");
  RequestHeader reg = server::testing::ShardHarness::Register(
      0, server::testing::SmallModel(), server::testing::SmallLayout(1));
  ASSERT_TRUE(CallUntilOk(*c0, reg).status.ok());
  const std::vector<ByteView> data{server::testing::Floats(grad_)};
  ASSERT_TRUE(CallUntilOk(*c0, Push(9), data).status.ok());
  // etcd gone: within the lease TTL (1 s) the primary refuses writes, as a
  // backup may be promoted once etcd lets the lease go.
  etcd_->Stop();
  std::this_thread::sleep_for(milliseconds(1300));
  ReplyHeader r = Call(*c0, Push(9), data);
  EXPECT_EQ(r.status.code(), StatusCode::kUnavailable) << r.status.ToString();
  EXPECT_NE(r.status.message().find("lease"), std::string::npos);
  // Reads go on.
  ReplyHeader pull = Call(*c0, server::testing::ShardHarness::Pull(0, 0));
  EXPECT_TRUE(pull.status.ok()) << pull.status.ToString();
  // etcd back: the lease is confirmed (or replaced) and writes resume.
  ASSERT_TRUE(etcd_->Restart().ok());
  ReplyHeader back = CallUntilOk(*c0, Push(9), data, milliseconds(10000));
  EXPECT_TRUE(back.status.ok()) << back.status.ToString();
}

// Replication after aggregation (BSP): `workers` workers, Adam, one shard.
// `flush_after`: how long a push waits for its rank's clock before the open
// round's record goes out; the default (an hour) keeps a round's replies
// held until it closes, which the tests below count on.
std::function<void(ServerOptions*)> BspOptions(
    int workers, bool aggregate, const std::string& prefix,
    milliseconds flush_after = milliseconds(3600 * 1000)) {
  return [=](ServerOptions* o) {
    o->shard.num_workers = workers;
    o->shard.consistency = Consistency::kBsp;
    o->shard.optimizer.kind = OptimizerKind::kAdam;
    o->shard.optimizer.lr = 0.01f;
    o->replicate_after_aggregation = aggregate;
    o->round_record_flush_after = flush_after;
    o->replication.prefix = prefix;
  };
}

// `opts`, with a primary that waits 3 s (not 500 ms) before it drops a
// silent backup: under ThreadSanitizer on a loaded machine a backup that
// just joined can take longer than 500 ms to answer its first records, and
// a dropped backup releases the replies these tests expect held.
std::function<void(ServerOptions*)> Patient(
    std::function<void(ServerOptions*)> opts) {
  return [opts](ServerOptions* o) {
    opts(o);
    o->replica_suspect_after = milliseconds(3000);
  };
}

// A push of every chunk of SmallModel() on one shard. Multiples of 1/16:
// their sums are exact in any order, so the weights do not depend on the
// order pushes of one round arrive in.
RequestHeader BspPush(int rank, int64_t clock, std::vector<ByteView>* data) {
  static const std::vector<uint64_t> kSizes{16, 16, 16, 16, 10};
  data->clear();
  std::vector<uint32_t> ids;
  for (uint32_t id = 0; id < kSizes.size(); ++id) {
    std::vector<float> g(kSizes[id]);
    for (size_t i = 0; i < g.size(); ++i)
      g[i] = 0.125f * static_cast<float>(rank + 1) +
             0.0625f * static_cast<float>(i % 4) -
             0.25f * static_cast<float>(clock % 3) +
             0.5f * static_cast<float>(id);
    data->push_back(server::testing::Floats(g));
    ids.push_back(id);
  }
  return server::testing::ShardHarness::Push(rank, clock, ids, *data);
}

// Weights, optimizer state and versions of every chunk, as bytes.
std::vector<std::vector<float>> ShardState(const Shard& shard) {
  std::vector<std::vector<float>> all;
  for (uint32_t id : shard.layout()->shard_chunks(0)) {
    all.push_back(*shard.weights(id));
    all.push_back(*shard.optimizer_state(id));
    all.push_back({static_cast<float>(shard.chunk_version(id))});
  }
  all.push_back({static_cast<float>(shard.bsp_round()),
                 static_cast<float>(shard.shard_version())});
  return all;
}

bool BitwiseEqual(const std::vector<std::vector<float>>& a,
                  const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size() ||
        std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0)
      return false;
  }
  return true;
}

// The state of one shard (no replication) that registered `reg` and saw
// BspPush(r, c) and Clock(r, c + 1) once for each of `rounds` rounds and
// `workers` ranks; empty if any was refused.
std::vector<std::vector<float>> BspReference(int workers, int rounds,
                                             const RequestHeader& reg) {
  ServerOptions so;
  BspOptions(workers, true, "")(&so);
  so.shard.num_shards = 1;
  server::testing::ShardHarness ref(so.shard);
  if (!ref.Call(reg).status.ok()) return {};
  for (int64_t c = 0; c < rounds; ++c) {
    for (int r = 0; r < workers; ++r) {
      std::vector<ByteView> g;
      const RequestHeader p = BspPush(r, c, &g);
      if (!ref.Call(p, g).status.ok() ||
          !ref.Call(server::testing::ShardHarness::Clock(r, c + 1)).status.ok())
        return {};
    }
  }
  EXPECT_EQ(ref.shard->shard_version(), static_cast<uint64_t>(rounds));
  return ShardState(*ref.shard);
}

// Several BSP rounds of 3 workers: with aggregation the backup applies one
// record per round (not one kReplicate per push and clock), the replies of
// a round's pushes wait until the round closed and its record was
// acknowledged, and the backup's weights, Adam state, versions and round
// are bitwise the primary's, and the same as with every push handed on.
TEST_F(ReplicationTest,
       BspRoundsAreHandedOnOnceAggregatedAndBackupIsBitwiseEqual) {
  constexpr int kWorkers = 3;
  constexpr int kRounds = 4;
  std::vector<std::vector<float>> primary_state[2];
  for (bool aggregate : {true, false}) {
    const std::string tag = aggregate ? "-agg" : "-push";
    std::unique_ptr<ClientSocket> c1;
    RequestHeader reg;
    auto ws = StartGroup(tag, kWorkers,
                         Patient(BspOptions(kWorkers, aggregate, "/t" + tag)),
                         &c1, &reg);
    ASSERT_EQ(ws.size(), size_t{kWorkers});
    auto observer = Connect("inproc://g0r0" + tag);
    for (int64_t c = 0; c < kRounds; ++c) {
      std::vector<std::set<uint64_t>> ids(kWorkers);
      std::vector<ByteView> data;
      for (int r = 0; r < kWorkers; ++r) {
        ids[r].insert(Send(*ws[r], BspPush(r, c, &data), data));
        if (c == 1 && r == 1) {
          // A request handed on by itself mid-round (a registration again):
          // the batched pushes go first, in a record of their own, and it
          // is acknowledged without waiting for the round. (Sent once the
          // primary counted this round's pushes so far: other sockets.)
          const auto until = SteadyClock::now() + milliseconds(5000);
          while (Stats(*observer).value("pushes", uint64_t{0}) <
                     uint64_t(kWorkers + 2) &&
                 SteadyClock::now() < until)
            std::this_thread::sleep_for(milliseconds(5));
          RequestHeader again = reg;
          again.rank = 1;
          ASSERT_TRUE(Call(*observer, again).status.ok());
        }
        if (r + 1 < kWorkers)
          ids[r].insert(
              Send(*ws[r], server::testing::ShardHarness::Clock(r, c + 1)));
      }
      if (aggregate && c == 0) {
        // The round is open (the last worker has not clocked): nothing of
        // it is acknowledged yet.
        EXPECT_TRUE(Await(*ws[0], ids[0], milliseconds(300)).empty());
      }
      ids[kWorkers - 1].insert(
          Send(*ws[kWorkers - 1],
               server::testing::ShardHarness::Clock(kWorkers - 1, c + 1)));
      for (int r = 0; r < kWorkers; ++r) {
        auto got = Await(*ws[r], ids[r]);
        ASSERT_EQ(got.size(), ids[r].size()) << "round " << c << " rank " << r;
        for (const auto& [id, st] : got) EXPECT_TRUE(st.ok()) << st.ToString();
      }
    }
    // Acknowledged = on the backup: its stats before anything is stopped.
    nlohmann::json b = Stats(*c1);
    EXPECT_EQ(b.value("version", uint64_t{0}), uint64_t{kRounds});
    EXPECT_EQ(b.value("bsp_round", int64_t{0}), int64_t{kRounds});
    const nlohmann::json& rb = b["replication"];
    const nlohmann::json rp = Stats(*ws[0])["replication"];
    if (aggregate) {
      // One record per round (plus the registration), every push and clock
      // folded into them
      // (and the mid-round registration, after a record of what came
      // before it).
      EXPECT_EQ(rb.value("records_applied", uint64_t{0}),
                uint64_t{kRounds + 1});
      EXPECT_EQ(rb.value("applied", uint64_t{0}), uint64_t{2 + kRounds + 1});
      EXPECT_EQ(rp.value("batched", uint64_t{0}),
                uint64_t{2 * kWorkers * kRounds});
    } else {
      EXPECT_EQ(rb.value("records_applied", uint64_t{1}), 0u);
      EXPECT_EQ(rb.value("applied", uint64_t{0}),
                uint64_t{2 + 2 * kWorkers * kRounds});
    }
    replicas_[0]->Stop();
    replicas_[1]->Stop();
    const auto on_primary = ShardState(replicas_[0]->server->shard());
    EXPECT_TRUE(
        BitwiseEqual(on_primary, ShardState(replicas_[1]->server->shard())))
        << (aggregate ? "aggregated" : "per push");
    primary_state[aggregate ? 0 : 1] = on_primary;
  }
  EXPECT_TRUE(BitwiseEqual(primary_state[0], primary_state[1]));
}

// The overlap pipeline's stage wait (PsParameterStore::WaitReceived): a
// heartbeat sent behind a push is answered once the push arrived, while the
// push's own acknowledgement is held until its round closed and the backup
// has the round's record.
TEST_F(ReplicationTest, HeartbeatBehindAHeldPushIsAnsweredAtOnce) {
  constexpr int kWorkers = 2;
  std::unique_ptr<ClientSocket> backup;
  RequestHeader reg;
  auto ws =
      StartGroup("-hb", kWorkers, Patient(BspOptions(kWorkers, true, "/t-hb")),
                 &backup, &reg);
  ASSERT_EQ(ws.size(), size_t{kWorkers});
  std::vector<ByteView> data;
  const uint64_t push0 = Send(*ws[0], BspPush(0, 0, &data), data);
  const uint64_t clock0 =
      Send(*ws[0], server::testing::ShardHarness::Clock(0, 1));
  RequestHeader hb;
  hb.kind = RequestKind::kHeartbeat;
  hb.rank = 0;
  const uint64_t heartbeat = Send(*ws[0], hb);
  auto got = Await(*ws[0], {push0, clock0, heartbeat}, milliseconds(1000));
  ASSERT_EQ(got.size(), 1u) << "only the heartbeat is answered";
  ASSERT_EQ(got.count(heartbeat), 1u);
  EXPECT_TRUE(got[heartbeat].ok()) << got[heartbeat].ToString();
  // The round closes with rank 1: rank 0's push and clock are acknowledged.
  std::set<uint64_t> ids1 = {Send(*ws[1], BspPush(1, 0, &data), data)};
  ids1.insert(Send(*ws[1], server::testing::ShardHarness::Clock(1, 1)));
  got = Await(*ws[0], {push0, clock0});
  ASSERT_EQ(got.size(), 2u);
  for (const auto& [id, st] : got) EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(Await(*ws[1], ids1).size(), 2u);
  EXPECT_EQ(Stats(*backup).value("version", uint64_t{0}), 1u);
}

// The primary is lost mid-round (it applied pushes and a clock of round 1
// and handed nothing of them on): the backup holds round 0 only, takes
// over, and applies the workers' resends once each (a second resend and a
// resend of an acknowledged round-0 push are duplicates): the weights are
// those of every push applied exactly once.
TEST_F(ReplicationTest, BspPrimaryLostMidRoundBackupAppliesEachResendOnce) {
  constexpr int kWorkers = 2;
  replicas_.push_back(
      StartReplica(0, 2, "", BspOptions(kWorkers, true, "/asyncps/test")));
  replicas_.push_back(
      StartReplica(1, 2, "", BspOptions(kWorkers, true, "/asyncps/test")));
  ASSERT_TRUE(replicas_[0] && replicas_[1]);
  std::vector<std::unique_ptr<ClientSocket>> ws;
  for (int r = 0; r < kWorkers; ++r) ws.push_back(Connect("inproc://g0r0"));
  auto c1 = Connect("inproc://g0r1");
  const RequestHeader reg = server::testing::ShardHarness::Register(
      0, server::testing::SmallModel(), server::testing::SmallLayout(1));
  ASSERT_TRUE(CallUntilOk(*ws[0], reg).status.ok());
  // Round 0, acknowledged.
  std::vector<ByteView> data;
  std::vector<RequestHeader> round0(kWorkers);
  for (int r = 0; r < kWorkers; ++r) {
    round0[r] = BspPush(r, 0, &data);
    round0[r].id = Send(*ws[r], round0[r], data);
    const uint64_t clock =
        Send(*ws[r], server::testing::ShardHarness::Clock(r, 1));
    if (r + 1 == kWorkers) {
      for (int q = 0; q < kWorkers; ++q) {
        std::set<uint64_t> want{round0[q].id};
        if (q == r) want.insert(clock);
        ASSERT_EQ(Await(*ws[q], want).size(), want.size());
      }
    }
  }
  // Round 1: rank 0 pushes and clocks, rank 1 pushes; then the primary goes.
  RequestHeader p0 = BspPush(0, 1, &data);
  p0.id = Send(*ws[0], p0, data);
  RequestHeader k0 = server::testing::ShardHarness::Clock(0, 2);
  k0.id = Send(*ws[0], k0);
  RequestHeader p1 = BspPush(1, 1, &data);
  p1.id = Send(*ws[1], p1, data);
  EXPECT_TRUE(Await(*ws[0], {p0.id, k0.id}, milliseconds(300)).empty());
  nlohmann::json b = Stats(*c1);
  EXPECT_EQ(b.value("version", uint64_t{9}), 1u);  // round 0 only
  EXPECT_EQ(b.value("duplicate_pushes", uint64_t{9}), 0u);
  EXPECT_EQ(b["replication"].value("records_applied", uint64_t{0}), 1u);
  replicas_[0]->Stop();
  EXPECT_TRUE(
      Await(*ws[0], {p0.id, k0.id}, milliseconds(200)).empty());  // dropped

  // The workers resend what was not acknowledged to the promoted backup.
  std::vector<ByteView> d0, d1, dr;
  BspPush(0, 1, &d0);
  BspPush(1, 1, &d1);
  BspPush(0, 0, &dr);
  ASSERT_TRUE(CallUntilOk(*c1, p0, d0).status.ok());
  ASSERT_TRUE(Call(*c1, p0, d0).status.ok());         // a second resend
  ASSERT_TRUE(Call(*c1, round0[0], dr).status.ok());  // acknowledged before
  ASSERT_TRUE(Call(*c1, k0).status.ok());
  ASSERT_TRUE(Call(*c1, p1, d1).status.ok());
  ASSERT_TRUE(
      Call(*c1, server::testing::ShardHarness::Clock(1, 2)).status.ok());
  b = Stats(*c1);
  EXPECT_EQ(b.value("version", uint64_t{0}), 2u);
  EXPECT_EQ(b.value("bsp_round", int64_t{0}), 2);
  EXPECT_EQ(b.value("duplicate_pushes", uint64_t{0}), 2u);
  replicas_[1]->Stop();

  // Every push once: a shard that saw each push exactly once.
  const auto want = BspReference(kWorkers, 2, reg);
  ASSERT_FALSE(want.empty());
  EXPECT_TRUE(BitwiseEqual(ShardState(replicas_[1]->server->shard()), want));
}

// A worker whose clock a shard refused for a stale elastic layout sends it
// again only once its rerouted pushes are acknowledged
// (worker/client/elastic_router.cc, Reroute). With rounds handed on aggregated,
// those replies are held until the round's record, and the round waits for that
// clock: a push that sees no clock of its rank for round_record_flush_after
// sends the open round's record, so the backups hold the push and its reply
// goes out. The clock then closes the round: both replicas bitwise a shard that
// saw each push once. (launch.elastic's --replicas 2 run stalled without this.)
TEST_F(ReplicationTest,
       BspPushWaitingForItsClockIsAcknowledgedThroughAnOpenRecord) {
  constexpr int kWorkers = 2;
  for (const milliseconds flush :
       {milliseconds(20), milliseconds(3600 * 1000)}) {
    const std::string tag = flush.count() < 1000 ? "-flush" : "-held";
    std::unique_ptr<ClientSocket> c1;
    RequestHeader reg;
    auto ws =
        StartGroup(tag, kWorkers, BspOptions(kWorkers, true, "/f" + tag, flush),
                   &c1, &reg);
    ASSERT_EQ(ws.size(), size_t{kWorkers});
    // Rank 0 pushes and clocks; rank 1 pushes and waits for the reply.
    std::vector<ByteView> data;
    const uint64_t p0 = Send(*ws[0], BspPush(0, 0, &data), data);
    const uint64_t k0 =
        Send(*ws[0], server::testing::ShardHarness::Clock(0, 1));
    const uint64_t p1 = Send(*ws[1], BspPush(1, 0, &data), data);
    if (flush.count() >= 1000) {
      // Held until the round closes, which needs rank 1's clock.
      EXPECT_TRUE(Await(*ws[1], {p1}, milliseconds(500)).empty());
      EXPECT_TRUE(Await(*ws[0], {p0, k0}, milliseconds(10)).empty());
      continue;
    }
    auto got = Await(*ws[1], {p1}, milliseconds(5000));
    ASSERT_EQ(got.size(), 1u)
        << "the push waiting for its clock was not acknowledged";
    EXPECT_TRUE(got[p1].ok()) << got[p1].ToString();
    got = Await(*ws[0], {p0, k0}, milliseconds(5000));
    ASSERT_EQ(got.size(), 2u);
    // Acknowledged = held by the backup: both pushes counted, round open.
    nlohmann::json b = Stats(*c1);
    EXPECT_EQ(b.value("bsp_round", int64_t{9}), 0);
    EXPECT_EQ(b.value("pushes", uint64_t{0}), 2u);
    EXPECT_GE(b["replication"].value("records_applied", uint64_t{0}), 1u);
    // The clock closes the round on both.
    ASSERT_TRUE(
        Call(*ws[1], server::testing::ShardHarness::Clock(1, 1)).status.ok());
    b = Stats(*c1);
    EXPECT_EQ(b.value("bsp_round", int64_t{0}), 1);
    EXPECT_EQ(b.value("version", uint64_t{0}), 1u);
    EXPECT_EQ(b.value("duplicate_pushes", uint64_t{9}), 0u);
    replicas_[0]->Stop();
    replicas_[1]->Stop();
    const auto want = BspReference(kWorkers, 1, reg);
    ASSERT_FALSE(want.empty());
    EXPECT_TRUE(BitwiseEqual(ShardState(replicas_[0]->server->shard()), want));
    EXPECT_TRUE(BitwiseEqual(ShardState(replicas_[1]->server->shard()), want));
  }
}

// Only the primary evicts a silent worker (2 s here). Here the workers'
// heartbeats go to the primary alone, so the backup hears nothing from them: it
// keeps them (it evicted both on its own timer before), and takes the primary's
// eviction of rank 1 and the rank's return (a heartbeat to the primary,
// which is not handed on) at the same points of the primary's order. Rounds
// close on rank 0 alone meanwhile; liveness, clocks, rounds and weights stay
// bitwise the primary's, with rounds handed on aggregated or push by push.
TEST_F(ReplicationTest,
       OnlyThePrimaryEvictsAndItsEvictionsAndRejoinsReachTheBackup) {
  constexpr int kWorkers = 2;
  for (bool aggregate : {true, false}) {
    const std::string tag = aggregate ? "-agg" : "-push";
    auto opts = [&](ServerOptions* o) {
      BspOptions(kWorkers, aggregate, "/live" + tag)(o);
      // Long enough for a sanitizer build under load to keep rank 0 live.
      o->shard.worker_timeout = milliseconds(2000);
    };
    std::unique_ptr<ClientSocket> c1;
    RequestHeader reg;
    auto ws = StartGroup(tag, kWorkers, opts, &c1, &reg);
    ASSERT_EQ(ws.size(), size_t{kWorkers});
    auto beat = [&](int rank) {
      RequestHeader h;
      h.kind = RequestKind::kHeartbeat;
      h.rank = rank;
      EXPECT_TRUE(Call(*ws[rank], h).status.ok());
    };
    // Liveness records reach the backup behind the primary's reply: wait.
    auto live = [&](ClientSocket& c, const nlohmann::json& want) {
      nlohmann::json got;
      const auto until = SteadyClock::now() + milliseconds(5000);
      do {
        got = Stats(c)["worker_live"];
        if (got == want) break;
        std::this_thread::sleep_for(milliseconds(20));
      } while (SteadyClock::now() < until);
      return got;
    };
    auto round = [&](const std::vector<int>& ranks, int64_t c) {
      std::vector<std::set<uint64_t>> ids(kWorkers);
      std::vector<ByteView> data;
      for (int r : ranks) {
        ids[r].insert(Send(*ws[r], BspPush(r, c, &data), data));
        ids[r].insert(
            Send(*ws[r], server::testing::ShardHarness::Clock(r, c + 1)));
      }
      for (int r : ranks) {
        auto got = Await(*ws[r], ids[r]);
        ASSERT_EQ(got.size(), ids[r].size()) << "round " << c << " rank " << r;
        for (const auto& [id, st] : got) EXPECT_TRUE(st.ok()) << st.ToString();
      }
    };
    // Both beat the primary for longer than the timeout: nobody is evicted.
    for (int i = 0; i < 25; ++i) {
      beat(0);
      beat(1);
      std::this_thread::sleep_for(milliseconds(100));
    }
    EXPECT_EQ(live(*c1, {true, true}), nlohmann::json({true, true})) << tag;
    EXPECT_EQ(live(*ws[0], {true, true}), nlohmann::json({true, true}));
    round({0, 1}, 0);
    // Rank 1 goes silent: the primary evicts it, the backup with it.
    const auto until = SteadyClock::now() + milliseconds(8000);
    while (Stats(*ws[0])["worker_live"] != nlohmann::json({true, false}) &&
           SteadyClock::now() < until) {
      beat(0);
      std::this_thread::sleep_for(milliseconds(50));
    }
    ASSERT_EQ(Stats(*ws[0])["worker_live"], nlohmann::json({true, false}));
    round({0}, 1);
    round({0}, 2);
    nlohmann::json b = Stats(*c1), p = Stats(*ws[0]);
    EXPECT_EQ(b["worker_live"], nlohmann::json({true, false}));
    EXPECT_EQ(b["worker_clocks"], p["worker_clocks"]);
    EXPECT_EQ(b.value("bsp_round", int64_t{0}), 3);
    // It comes back with a heartbeat to the primary, at the round the
    // others reached: the backup takes it back at the same clock.
    beat(1);
    beat(0);
    EXPECT_EQ(live(*c1, {true, true}), nlohmann::json({true, true}));
    b = Stats(*c1);
    p = Stats(*ws[0]);
    EXPECT_EQ(p["worker_clocks"], nlohmann::json({3, 3}));
    EXPECT_EQ(b["worker_clocks"], p["worker_clocks"]);
    EXPECT_GE(p["replication"].value("liveness_forwarded", uint64_t{0}), 2u);
    round({0, 1}, 3);
    EXPECT_EQ(Stats(*c1).value("bsp_round", int64_t{0}), 4);
    replicas_[0]->Stop();
    replicas_[1]->Stop();
    EXPECT_TRUE(BitwiseEqual(ShardState(replicas_[0]->server->shard()),
                             ShardState(replicas_[1]->server->shard())))
        << tag;
  }
}

// A push refused by a replica that is not (yet) the primary holds back the
// rank's later clocks there: promoted, it refuses them (retry) until the
// push came back, so a clock never closes a BSP round without the push
// (its refusal and the clock's acceptance on either side of a promotion).
TEST_F(ReplicationTest,
       BspClockWaitsForAPushTheReplicaRefusedBeforeItsPromotion) {
  replicas_.push_back(
      StartReplica(0, 2, "", BspOptions(1, true, "/asyncps/test")));
  replicas_.push_back(
      StartReplica(1, 2, "", BspOptions(1, true, "/asyncps/test")));
  ASSERT_TRUE(replicas_[0] && replicas_[1]);
  auto c0 = Connect("inproc://g0r0");
  auto c1 = Connect("inproc://g0r1");
  ASSERT_TRUE(CallUntilOk(*c0, server::testing::ShardHarness::Register(
                                   0, server::testing::SmallModel(),
                                   server::testing::SmallLayout(1)))
                  .status.ok());
  std::vector<ByteView> data;
  RequestHeader push = BspPush(0, 0, &data);
  push.id = ++next_id_;
  ReplyHeader refused = Call(*c1, push, data);
  ASSERT_EQ(refused.status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(refused.redirect, "inproc://g0r0");
  replicas_[0]->Stop();  // g0r1 takes over
  RequestHeader clock = server::testing::ShardHarness::Clock(0, 1);
  ReplyHeader r;
  const auto until = SteadyClock::now() + milliseconds(8000);
  do {  // until promoted and past any refusal of writes while it starts
    r = Call(*c1, clock);
    std::this_thread::sleep_for(milliseconds(20));
  } while ((r.epoch < 2 || (!r.status.ok() && r.retry_ms == 0)) &&
           SteadyClock::now() < until);
  EXPECT_EQ(r.status.code(), StatusCode::kUnavailable) << r.status.ToString();
  EXPECT_GT(r.retry_ms, 0u);
  EXPECT_EQ(Stats(*c1).value("bsp_round", int64_t{9}), 0);  // not closed
  ASSERT_TRUE(CallUntilOk(*c1, push, data).status.ok());
  ASSERT_TRUE(CallUntilOk(*c1, clock).status.ok());
  nlohmann::json b = Stats(*c1);
  EXPECT_EQ(b.value("bsp_round", int64_t{0}), 1);
  EXPECT_EQ(b.value("pushes", uint64_t{0}), 1u);
  EXPECT_EQ(b.value("skipped_pushes", uint64_t{9}), 0u);
}

namespace {

// A kReplicate header carrying `inner` (frame 1) for group 0 at `epoch`,
// sent as `sender`.
RequestHeader ReplicateOf(uint64_t epoch, const std::string& sender = "g0r0",
                          uint64_t incarnation = 0) {
  RequestHeader h;
  h.kind = RequestKind::kReplicate;
  h.rank = -1;
  h.replicate_epoch = epoch;
  h.replicate_group = 0;
  h.replica_sender = sender;
  h.replica_incarnation = incarnation;
  return h;
}

ByteView HeaderFrame(const RequestHeader& inner) {
  auto bytes = std::make_shared<std::vector<uint8_t>>(EncodeRequest(inner));
  return ByteView{bytes->data(), bytes->size(), bytes};
}

}  // namespace

// Issue 40, finding 1: a backup applied replica traffic from anyone. Every
// forgery below (a push, a liveness record, a migrate freeze wrapped in a
// replicate, a snapshot piece, a ping), sent without the group's secret, with
// a wrong one, with a tampered tag, as a member that is not the primary, or
// replayed, is refused; the backup's clocks, liveness, round and
// de-duplication table are what they were, and after a failover it serves
// the true weights, bitwise.
// Run for each tag coverage (replica_auth.h Coverage).
void ReplicationTest::ForgeriesAreRefused(bool tag_all) {
  tag_all_ = tag_all;
  std::unique_ptr<ClientSocket> c1;
  RequestHeader reg;
  auto workers = StartGroup(
      "", 1,
      [&](ServerOptions* o) {
        if (tag_all) o->replica_tag_coverage = Coverage::kAll;
      },
      &c1, &reg);
  ASSERT_EQ(workers.size(), 1u);
  ClientSocket* c0 = workers[0].get();
  const std::vector<ByteView> data{server::testing::Floats(grad_)};
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(CallUntilOk(*c0, Push(7), data).status.ok());
  const std::vector<uint8_t> weights = PullAll(*c0);
  ASSERT_FALSE(weights.empty());
  const nlohmann::json before = StateOf(Stats(*c1));
  ASSERT_EQ(before["version"], 3u);

  // The forgeries' payloads.
  const std::vector<float> huge(16, 1000.0f);
  RequestHeader push = Push(9);
  push.id = 1000;
  const std::vector<ByteView> forged_push{HeaderFrame(push),
                                          server::testing::Floats(huge)};
  RequestHeader freeze = server::testing::MigrateRequest(MigrateOp::kFreeze, 5);
  freeze.migrate_at_clock = -1;
  const std::vector<ByteView> forged_freeze{HeaderFrame(freeze)};
  RequestHeader liveness = ReplicateOf(1);
  liveness.replicate_workers = {WorkerLiveness{0, true, 777777}};
  RequestHeader snapshot = ReplicateOf(1);
  snapshot.kind = RequestKind::kSnapshot;
  snapshot.snapshot_file = "CURRENT";
  snapshot.snapshot_file_size = 4;
  snapshot.snapshot_total_bytes = 4;
  snapshot.snapshot_last = true;
  const std::vector<float> four(1, 0.0f);
  const std::vector<ByteView> piece{server::testing::Floats(four)};

  auto wrong = ReplicaMac::Create(std::string(kReplicaSecretBytes, 'x'), 0);
  auto right = ReplicaMac::Create(GroupSecret(), 0);
  ASSERT_TRUE(wrong.ok() && right.ok());
  const uint64_t primary = IncarnationOf("g0r0");
  ASSERT_NE(primary, 0u);
  struct Forgery {
    const char* what;
    RequestHeader header;
    std::vector<ByteView> data;
  };
  const std::vector<Forgery> forgeries = {
      {"push", ReplicateOf(1, "g0r0", primary), forged_push},
      {"liveness record", liveness, {}},
      {"wrapped migrate freeze", ReplicateOf(1, "g0r0", primary),
       forged_freeze},
      {"snapshot piece", snapshot, piece},
      {"ping", ReplicateOf(1, "g0r0", primary), {}}};
  for (const Forgery& f : forgeries) {
    SCOPED_TRACE(f.what);
    // No key at all; another secret; the group's secret with a bit flipped.
    EXPECT_EQ(CallReplica(*c1, f.header, f.data, nullptr).status.code(),
              StatusCode::kPermissionDenied);
    EXPECT_EQ(CallReplica(*c1, f.header, f.data, wrong->get()).status.code(),
              StatusCode::kPermissionDenied);
    EXPECT_EQ(CallReplica(*c1, f.header, f.data, right->get(), /*tamper=*/true)
                  .status.code(),
              StatusCode::kPermissionDenied);
    // A member of the group (it has the secret) that is not the primary:
    // refused for its role.
    RequestHeader other = f.header;
    other.replica_sender = "g0r0";
    other.replica_incarnation = primary + 1;
    EXPECT_EQ(CallReplica(*c1, other, f.data, right->get()).status.code(),
              StatusCode::kFailedPrecondition);
    // Tagged over its header only (the group's secret, a fresh id): a
    // snapshot piece never, and nothing by a replica set to kAll. (A
    // forgery with a valid header tag from the primary's own session
    // would need the secret: the checks above.)
    if (f.header.kind == RequestKind::kSnapshot || tag_all) {
      EXPECT_EQ(
          CallReplica(*c1, f.header, f.data, right->get(), false, /*tag_all=*/0)
              .status.code(),
          StatusCode::kPermissionDenied);
    }
  }
  // A replayed message of the primary's session is refused: the first
  // (a ping, which changes nothing) is taken, the same id again is not.
  RequestHeader ping = ReplicateOf(1, "g0r0", primary);
  ping.id = ++next_id_;
  EXPECT_TRUE(CallReplica(*c1, ping, {}, right->get()).status.ok());
  EXPECT_EQ(CallReplica(*c1, ping, {}, right->get()).status.code(),
            StatusCode::kPermissionDenied);
  // Replica traffic wrapped in replica traffic, even signed: never applied.
  RequestHeader inner = ReplicateOf(1);
  EXPECT_EQ(CallReplica(*c1, ReplicateOf(1, "g0r0", primary),
                        {HeaderFrame(inner)}, right->get())
                .status.code(),
            StatusCode::kInvalidArgument);

  const nlohmann::json after_stats = Stats(*c1);
  EXPECT_EQ(StateOf(after_stats), before);
  EXPECT_GE(after_stats["replication"].value("refused_sender", 0), 15);
  // The primary is lost: the backup takes over with the true weights.
  replicas_[0]->Stop();
  EXPECT_EQ(PullAll(*c1), weights);
  EXPECT_EQ(Version(*c1), 3u);
}

TEST_F(ReplicationTest, ForgedReplicaTrafficIsRefusedAndChangesNothing) {
  ForgeriesAreRefused(/*tag_all=*/false);
}

// The same with --replica_tag=all: the primary tags every byte, and the
// backup takes nothing tagged over its header only.
TEST_F(ReplicationTest, ForgedReplicaTrafficIsRefusedWithEveryByteTagged) {
  ForgeriesAreRefused(/*tag_all=*/true);
}

// With CurveZMQ the replicas' own keys authenticate replica traffic: the
// primary hands its backup every update over a connection whose client key
// is its replica key (taken by the backup although its allowed-key list
// holds only the worker's), what a worker sends as replica traffic, with
// its own valid key, is refused and changes nothing, and a key outside the
// list is refused.
TEST_F(ReplicationTest, WithCurveOnlyThePrimarysReplicaKeyIsTaken) {
  std::string server_pub, server_sec, worker_pub, worker_sec;
  ASSERT_TRUE(GenerateCurveKeyPair(&server_pub, &server_sec).ok());
  ASSERT_TRUE(GenerateCurveKeyPair(&worker_pub, &worker_sec).ok());
  auto curve = [&](ServerOptions* o) {
    o->endpoint = "tcp://127.0.0.1:*";
    o->curve_secret_key = server_sec;
    o->curve_allowed_client_keys = {worker_pub};
  };
  replicas_.push_back(StartReplica(0, 2, "", curve));
  replicas_.push_back(StartReplica(1, 2, "", curve));
  ASSERT_TRUE(replicas_[0] && replicas_[1]);
  auto connect = [&](const std::string& endpoint) {
    TransportOptions to;
    to.curve_server_key = server_pub;
    to.curve_secret_key = worker_sec;
    auto c = ClientSocket::Connect(endpoint, to);
    EXPECT_TRUE(c.ok());
    return std::move(c).value();
  };
  auto c0 = connect(replicas_[0]->server->endpoint());
  auto c1 = connect(replicas_[1]->server->endpoint());
  RequestHeader reg = server::testing::ShardHarness::Register(
      0, server::testing::SmallModel(), server::testing::SmallLayout(1));
  ASSERT_TRUE(CallUntilOk(*c0, reg).status.ok());
  const std::vector<ByteView> data{server::testing::Floats(grad_)};
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(CallUntilOk(*c0, Push(7), data).status.ok());
  EXPECT_EQ(Version(*c1), 3u);  // replicated over CURVE before acknowledged
  const std::vector<uint8_t> weights = PullAll(*c0);
  const nlohmann::json before = StateOf(Stats(*c1));
  // The worker's key is valid for the socket, not for replica traffic.
  RequestHeader push = Push(9);
  push.id = 1000;
  RequestHeader liveness = ReplicateOf(1, "g0r0", IncarnationOf("g0r0"));
  liveness.replicate_workers = {WorkerLiveness{0, true, 777777}};
  EXPECT_EQ(
      CallReplica(*c1, ReplicateOf(1, "g0r0", IncarnationOf("g0r0")),
                  {HeaderFrame(push),
                   server::testing::Floats(std::vector<float>(16, 1000.0f))},
                  nullptr)
          .status.code(),
      StatusCode::kPermissionDenied);
  EXPECT_EQ(CallReplica(*c1, liveness, {}, nullptr).status.code(),
            StatusCode::kPermissionDenied);
  EXPECT_EQ(StateOf(Stats(*c1)), before);
  // A client whose key is not in the allowed list is refused (a replica
  // checks the list when it dispatches, not in the handshake).
  std::string stranger_pub, stranger_sec;
  ASSERT_TRUE(GenerateCurveKeyPair(&stranger_pub, &stranger_sec).ok());
  TransportOptions st;
  st.curve_server_key = server_pub;
  st.curve_secret_key = stranger_sec;
  auto stranger = ClientSocket::Connect(replicas_[0]->server->endpoint(), st);
  ASSERT_TRUE(stranger.ok());
  EXPECT_EQ(Call(**stranger, Push(7), data).status.code(),
            StatusCode::kPermissionDenied);
  EXPECT_EQ(Version(*c0), 3u);
  replicas_[0]->Stop();
  EXPECT_EQ(PullAll(*c1), weights);
}

}  // namespace
}  // namespace asyncps::server::replication
