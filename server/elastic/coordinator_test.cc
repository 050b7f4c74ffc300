// Coordinator against fake shards (a ROUTER socket each, speaking the
// kMigrate protocol of common/protocol.capnp from memory) and a real etcd
// (skipped without /usr/bin/etcd): chunks move with their bytes, the
// document in etcd flips by epoch, every failure leaves the shards on their
// old layout, bad input is refused with a message that says what to do.
#include "server/elastic/coordinator.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "common/etcd_client.h"
#include "common/wire.h"
#include "server/elastic/elastic_doc.h"
#include "tests/util/etcd_fixture.h"
#include "tests/util/process.h"

namespace asyncps::server::elastic {
namespace {

using json = nlohmann::json;
using std::chrono::milliseconds;

// A shard reduced to what kMigrate sees: chunk sizes, owners, the bytes of
// the chunks it owns ("c<id>@<owner at birth>"), clocks, freeze state.
class FakeShard {
 public:
  FakeShard(int id, bool registered, std::vector<uint64_t> sizes,
            std::vector<int> owners, std::string consistency = "bsp")
      : id_(id),
        registered_(registered),
        sizes_(std::move(sizes)),
        owners_(std::move(owners)),
        consistency_(std::move(consistency)) {
    for (size_t c = 0; c < owners_.size() && registered_; ++c)
      if (owners_[c] == id_)
        values_[c] = "c" + std::to_string(c) + "@" + std::to_string(id_);
    TransportOptions to;
    sock_ = std::move(ServerSocket::Bind("tcp://127.0.0.1:*", to)).value();
    thread_ = std::thread([this] { Loop(); });
  }
  ~FakeShard() {
    stop_ = true;
    thread_.join();
  }
  const std::string& endpoint() const { return sock_->endpoint(); }

  // Test hooks, called on the shard's thread.
  std::function<Status(const RequestHeader&)> on_request;
  std::atomic<int64_t> max_clock{5};
  // The latest round pushed for; kUnsaid: not in the description (a shard
  // that does not say counts as having pushed for round max_clock).
  static constexpr int64_t kUnsaid = -100;
  std::atomic<int64_t> max_pushed_round{kUnsaid};
  std::atomic<int> undrained_describes{0};  // describes answering drained=false

  std::map<uint32_t, std::string> values() {
    std::lock_guard<std::mutex> l(mu_);
    return values_;
  }
  bool frozen() {
    std::lock_guard<std::mutex> l(mu_);
    return frozen_;
  }
  uint64_t epoch() {
    std::lock_guard<std::mutex> l(mu_);
    return epoch_;
  }
  size_t staged() {
    std::lock_guard<std::mutex> l(mu_);
    return staged_.size();
  }
  std::vector<int64_t> freeze_clocks() {
    std::lock_guard<std::mutex> l(mu_);
    return freeze_clocks_;
  }

 private:
  void Loop() {
    while (!stop_) {
      std::string peer;
      Message msg;
      StatusOr<bool> got = sock_->Receive(&peer, &msg, milliseconds(20));
      if (!got.ok() || !*got) continue;
      RequestHeader req;
      ReplyHeader rep;
      std::vector<Frame> frames;
      Status s = DecodeRequest(msg.frames[0].data, msg.frames[0].size,
                               DecodeLimits(), &req);
      rep.id = req.id;
      rep.kind = req.kind;
      if (s.ok() && on_request) s = on_request(req);
      if (s.ok()) {
        std::lock_guard<std::mutex> l(mu_);
        s = Handle(req, msg, &rep, &frames);
      }
      rep.status = s;
      frames.insert(frames.begin(), Frame::Owned(EncodeReply(rep)));
      (void)sock_->Send(peer, frames);
    }
  }

  Status Handle(const RequestHeader& req, const Message& msg, ReplyHeader* rep,
                std::vector<Frame>* frames) {
    if (req.kind != RequestKind::kMigrate || req.rank != -1)
      return Status::InvalidArgument("fake shard: migrate from rank -1 only");
    switch (req.migrate_op) {
      case MigrateOp::kDescribe: {
        json j = {{"shard", id_}, {"registered", registered_}};
        if (registered_) {
          bool drained = frozen_;
          if (frozen_ && undrained_describes > 0) {
            --undrained_describes;
            drained = false;
          }
          std::vector<uint32_t> owned;
          for (const auto& [c, v] : values_) owned.push_back(c);
          j.update({{"epoch", epoch_},
                    {"consistency", consistency_},
                    {"frozen", frozen_},
                    {"drained", drained},
                    {"max_clock", max_clock.load()},
                    {"min_clock", max_clock.load()},
                    {"bsp_round", max_clock.load()},
                    {"num_chunks", sizes_.size()},
                    {"chunk_elems", sizes_},
                    {"owners", owners_},
                    {"owned", owned},
                    {"num_shards", 2}});
          if (max_pushed_round != kUnsaid)
            j["max_pushed_round"] = max_pushed_round.load();
        }
        rep->text = j.dump();
        return Status::OK();
      }
      case MigrateOp::kFreeze:
        if (frozen_) return Status::FailedPrecondition("already frozen");
        if (req.migrate_at_clock >= 0 &&
            (max_clock > req.migrate_at_clock ||
             max_pushed_round >= req.migrate_at_clock))
          return Status::FailedPrecondition(
              "a worker is past the freeze clock");
        frozen_ = true;
        freeze_epoch_ = req.migrate_epoch;
        freeze_clocks_.push_back(req.migrate_at_clock);
        return Status::OK();
      case MigrateOp::kExport: {
        if (!frozen_ || req.migrate_epoch != freeze_epoch_)
          return Status::FailedPrecondition(
              "export: not frozen toward this epoch");
        frames->push_back(Frame::Copy("layout", 6));
        frames->push_back(Frame::Copy("state", 5));
        for (uint32_t c : req.migrate_chunks) {
          auto it = values_.find(c);
          if (it == values_.end())
            return Status::NotFound("export: chunk not owned");
          frames->push_back(Frame::Copy(it->second.data(), it->second.size()));
        }
        return Status::OK();
      }
      case MigrateOp::kImport: {
        if (!frozen_ || req.migrate_epoch != freeze_epoch_)
          return Status::FailedPrecondition(
              "import: not frozen toward this epoch");
        if (msg.frames.size() != req.migrate_chunks.size() + 3)
          return Status::InvalidArgument("import: frame count");
        if (std::string(reinterpret_cast<const char*>(msg.frames[1].data),
                        msg.frames[1].size) != "layout")
          return Status::InvalidArgument("import: frame 1 is not the layout");
        for (size_t k = 0; k < req.migrate_chunks.size(); ++k) {
          const ByteView& f = msg.frames[k + 3];
          staged_[req.migrate_chunks[k]] =
              std::string(reinterpret_cast<const char*>(f.data), f.size);
        }
        return Status::OK();
      }
      case MigrateOp::kAdopt: {
        if (!frozen_ || req.migrate_epoch != freeze_epoch_)
          return Status::FailedPrecondition(
              "adopt: not frozen toward this epoch");
        StatusOr<ElasticDoc> d = ElasticDoc::FromJson(req.migrate_doc);
        if (!d.ok()) return d.status();
        if (d->epoch != req.migrate_epoch)
          return Status::InvalidArgument("adopt: epoch");
        std::map<uint32_t, std::string> next;
        for (uint32_t c = 0; c < d->owners.size(); ++c) {
          if (d->owners[c] != id_) continue;
          if (staged_.count(c)) {
            next[c] = staged_[c];
          } else if (values_.count(c)) {
            next[c] = values_[c];
          } else {
            return Status::FailedPrecondition(
                "adopt: chunk neither owned nor staged");
          }
        }
        values_ = std::move(next);
        staged_.clear();
        owners_ = d->owners;
        epoch_ = d->epoch;
        sizes_.resize(owners_.size());
        registered_ = true;
        frozen_ = false;
        return Status::OK();
      }
      case MigrateOp::kAbort:
        staged_.clear();
        frozen_ = false;
        return Status::OK();
    }
    return Status::InvalidArgument("fake shard: op");
  }

  const int id_;
  std::unique_ptr<ServerSocket> sock_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  bool registered_;                         // guarded by mu_
  std::vector<uint64_t> sizes_;             // guarded by mu_
  std::vector<int> owners_;                 // guarded by mu_
  std::string consistency_;                 // guarded by mu_
  std::map<uint32_t, std::string> values_;  // guarded by mu_
  std::map<uint32_t, std::string> staged_;  // guarded by mu_
  bool frozen_ = false;                     // guarded by mu_
  uint64_t freeze_epoch_ = 0;               // guarded by mu_
  uint64_t epoch_ = 0;                      // guarded by mu_
  std::vector<int64_t> freeze_clocks_;      // guarded by mu_
};

// 12 chunks of uneven sizes, spread over 2 shards by a static layout.
const std::vector<uint64_t> kSizes = {4096, 4096, 4096, 2048, 2048, 1024,
                                      1024, 512,  4096, 3000, 100,  2048};
const std::vector<int> kOwners = {0, 1, 0, 1, 0, 1, 0, 1, 1, 0, 1, 0};

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::EtcdServer::Available())
      GTEST_SKIP() << "etcd not installed (Debian's etcd-server)";
    auto e = testing::EtcdServer::Start(dir_.Sub("etcd"), dir_.path().string());
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    etcd_ = std::move(e).value();
    EtcdOptions eo;
    eo.endpoints = {etcd_->endpoint()};
    client_ = std::move(EtcdClient::Create(eo)).value();
    for (int i = 0; i < 2; ++i)
      shards_.push_back(std::make_unique<FakeShard>(i, true, kSizes, kOwners));
  }

  CoordinatorOptions Options() {
    CoordinatorOptions o;
    o.etcd_endpoints = {etcd_->endpoint()};
    o.etcd_prefix = "/asyncps/test";
    o.servers = {shards_[0]->endpoint(), shards_[1]->endpoint()};
    o.request_timeout = milliseconds(2000);
    o.drain_timeout = milliseconds(2000);
    return o;
  }

  std::unique_ptr<Coordinator> Make(const CoordinatorOptions& o) {
    auto c = Coordinator::Create(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }

  ElasticDoc Doc() {
    auto kv = client_->Get("/asyncps/test/elastic");
    EXPECT_TRUE(kv.ok() && kv->has_value());
    return std::move(ElasticDoc::FromJson((*kv)->value)).value();
  }

  // Every chunk is held by exactly the shard the document names, with the
  // bytes it was born with.
  void ExpectHeldAsDoc(const ElasticDoc& d) {
    std::map<uint32_t, int> held;
    for (size_t i = 0; i < shards_.size(); ++i) {
      for (const auto& [c, v] : shards_[i]->values()) {
        EXPECT_EQ(held.count(c), 0u) << "chunk " << c << " held twice";
        held[c] = static_cast<int>(i);
        EXPECT_EQ(v,
                  "c" + std::to_string(c) + "@" + std::to_string(kOwners[c]));
      }
    }
    ASSERT_EQ(held.size(), d.owners.size());
    for (uint32_t c = 0; c < d.owners.size(); ++c)
      EXPECT_EQ(held[c], d.owners[c]) << c;
  }

  void ExpectAllUnfrozen() {
    for (auto& s : shards_) {
      EXPECT_FALSE(s->frozen());
      EXPECT_EQ(s->staged(), 0u);
    }
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::EtcdServer> etcd_;
  std::unique_ptr<EtcdClient> client_;
  std::vector<std::unique_ptr<FakeShard>> shards_;
};

TEST_F(CoordinatorTest, AddsThenRemovesAShard) {
  shards_.push_back(std::make_unique<FakeShard>(
      2, false, std::vector<uint64_t>{}, std::vector<int>{}));
  shards_[0]->undrained_describes = 3;  // the drain is waited for
  auto c = Make(Options());
  ASSERT_NE(c, nullptr);
  auto r = c->AddShard(shards_[2]->endpoint());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->epoch_before, 0u);
  EXPECT_EQ(r->epoch_after, 1u);
  EXPECT_EQ(r->shard, 2);
  EXPECT_GT(r->moved_chunks, 0u);
  EXPECT_GT(r->moved_bytes, 0u);
  EXPECT_EQ(r->freeze_clock, 6);  // max_clock + 1 under BSP
  EXPECT_LE(r->imbalance_after, 1.15);
  EXPECT_TRUE(r->adopt_failures.empty());
  ElasticDoc d = Doc();
  EXPECT_EQ(d.epoch, 1u);
  ASSERT_EQ(d.servers.size(), 3u);
  EXPECT_EQ(d.servers[2], shards_[2]->endpoint());
  EXPECT_EQ(d.Active(), (std::vector<int>{0, 1, 2}));
  ExpectHeldAsDoc(d);
  for (auto& s : shards_) EXPECT_EQ(s->epoch(), 1u);
  ExpectAllUnfrozen();
  const json report = json::parse(r->ToJson());
  EXPECT_EQ(report["epoch"], 1);
  EXPECT_TRUE(report["ok"].get<bool>());

  // The second change reads the document from etcd (no --servers needed).
  CoordinatorOptions o = Options();
  o.servers.clear();
  auto c2 = Make(o);
  auto r2 = c2->RemoveShard(shards_[1]->endpoint());
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_EQ(r2->epoch_after, 2u);
  d = Doc();
  EXPECT_EQ(d.Active(), (std::vector<int>{0, 2}));
  EXPECT_EQ(shards_[1]->values().size(), 0u);
  ExpectHeldAsDoc(d);
  EXPECT_LE(r2->imbalance_after, 1.15);
  ExpectAllUnfrozen();

  // Gone is gone; the last shard cannot leave.
  auto again = c2->RemoveShard(shards_[1]->endpoint());
  EXPECT_EQ(again.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(again.status().message().find("holds no chunk"), std::string::npos);
  ASSERT_TRUE(c2->RemoveShard(shards_[2]->endpoint()).ok());
  auto last = c2->RemoveShard(shards_[0]->endpoint());
  EXPECT_EQ(last.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(last.status().message().find("only shard"), std::string::npos);
}

TEST_F(CoordinatorTest, ASPFreezesEveryPush) {
  shards_.clear();
  for (int i = 0; i < 2; ++i)
    shards_.push_back(
        std::make_unique<FakeShard>(i, true, kSizes, kOwners, "asp"));
  auto c = Make(Options());
  auto r = c->RemoveShard(shards_[0]->endpoint());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->freeze_clock, -1);
  EXPECT_EQ(shards_[0]->freeze_clocks(), (std::vector<int64_t>{-1}));
  ExpectHeldAsDoc(Doc());
}

TEST_F(CoordinatorTest, WrongShardIdSaysHowToStartIt) {
  shards_.push_back(std::make_unique<FakeShard>(
      5, false, std::vector<uint64_t>{}, std::vector<int>{}));
  auto c = Make(Options());
  auto r = c->AddShard(shards_[2]->endpoint());
  ASSERT_EQ(r.status().code(), StatusCode::kInvalidArgument)
      << r.status().ToString();
  EXPECT_NE(r.status().message().find("--shard_id=2 --num_shards=3"),
            std::string::npos)
      << r.status().message();
  ExpectAllUnfrozen();
  auto kv = client_->Get("/asyncps/test/elastic");
  EXPECT_FALSE(kv->has_value());
}

TEST_F(CoordinatorTest, BadInputIsRefused) {
  auto c = Make(Options());
  // Not in the fleet.
  auto r = c->RemoveShard("tcp://127.0.0.1:1");
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("not a shard of the fleet"),
            std::string::npos);
  // Already in it.
  r = c->AddShard(shards_[1]->endpoint());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  // Nobody there (a port nothing listens on).
  CoordinatorOptions o = Options();
  o.request_timeout = milliseconds(300);
  auto c2 = Make(o);
  r = c2->AddShard("tcp://127.0.0.1:9");
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable)
      << r.status().ToString();
  EXPECT_NE(r.status().message().find("tcp://127.0.0.1:9"), std::string::npos);
  // No layout in etcd and no --servers.
  o.servers.clear();
  auto c3 = Make(o);
  r = c3->RemoveShard(shards_[0]->endpoint());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("--servers"), std::string::npos);
  // No etcd.
  CoordinatorOptions none = Options();
  none.etcd_endpoints.clear();
  EXPECT_EQ(Coordinator::Create(none).status().code(),
            StatusCode::kInvalidArgument);
  CoordinatorOptions dead = Options();
  dead.etcd_endpoints = {"http://127.0.0.1:9"};
  auto c4 = Make(dead);
  r = c4->RemoveShard(shards_[0]->endpoint());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable)
      << r.status().ToString();
  ExpectAllUnfrozen();
}

TEST_F(CoordinatorTest, FreezeRetriedWhenAWorkerGotPast) {
  std::atomic<int> freezes{0};
  shards_[1]->on_request = [&](const RequestHeader& req) {
    if (req.migrate_op == MigrateOp::kFreeze && freezes++ == 0)
      shards_[1]->max_clock = 9;  // the workers ran on meanwhile
    return Status::OK();
  };
  auto c = Make(Options());
  auto r = c->RemoveShard(shards_[1]->endpoint());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->freeze_tries, 2);
  EXPECT_EQ(r->freeze_clock, 11);  // 9 + try 2
  // Shard 0 was frozen at 6, aborted, frozen again at 11.
  EXPECT_EQ(shards_[0]->freeze_clocks(), (std::vector<int64_t>{6, 11}));
  ExpectHeldAsDoc(Doc());
}

TEST_F(CoordinatorTest, IdleBspFleetFreezesAtItsClock) {
  // Every worker at clock 5 and nobody pushed for round 5 yet: the freeze
  // holds round 5 (drained at once) instead of waiting for a round 6 that
  // an idle fleet never starts.
  for (auto& s : shards_) s->max_pushed_round = 4;
  shards_.push_back(std::make_unique<FakeShard>(
      2, false, std::vector<uint64_t>{}, std::vector<int>{}));
  auto c = Make(Options());
  auto r = c->AddShard(shards_[2]->endpoint());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->freeze_clock, 5);
  EXPECT_EQ(r->freeze_tries, 1);
  ExpectHeldAsDoc(Doc());
  ExpectAllUnfrozen();

  // A push for round 5 on one shard: round 5 is under way, freeze at 6.
  shards_[1]->max_pushed_round = 5;
  auto r2 = c->RemoveShard(shards_[2]->endpoint());
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_EQ(r2->freeze_clock, 6);
  EXPECT_EQ(r2->freeze_tries, 1);
  ExpectHeldAsDoc(Doc());
}

TEST_F(CoordinatorTest, LostCompareAndSwapAbortsEveryShard) {
  // Another writer changes the document while chunks are copied.
  shards_[1]->on_request = [&](const RequestHeader& req) {
    if (req.migrate_op == MigrateOp::kImport) {
      ElasticDoc other;
      other.servers = {"tcp://x:1"};
      other.owners = std::vector<int>(kSizes.size(), 0);
      (void)client_->Put("/asyncps/test/elastic", other.ToJson());
    }
    return Status::OK();
  };
  auto c = Make(Options());
  auto r = c->RemoveShard(shards_[0]->endpoint());
  ASSERT_EQ(r.status().code(), StatusCode::kFailedPrecondition)
      << r.status().ToString();
  EXPECT_NE(r.status().message().find("changed in etcd"), std::string::npos);
  ExpectAllUnfrozen();
  for (auto& s : shards_) EXPECT_EQ(s->epoch(), 0u);
  ExpectHeldAsDoc(ElasticDoc{0, {}, kOwners, 0, {}});
}

TEST_F(CoordinatorTest, NotDrainedInTimeAborts) {
  shards_[0]->undrained_describes = 1 << 30;
  CoordinatorOptions o = Options();
  o.drain_timeout = milliseconds(200);
  auto c = Make(o);
  auto r = c->RemoveShard(shards_[1]->endpoint());
  ASSERT_EQ(r.status().code(), StatusCode::kTimedOut) << r.status().ToString();
  ExpectAllUnfrozen();
}

}  // namespace
}  // namespace asyncps::server::elastic
