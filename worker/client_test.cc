// Client tests against a scripted in-process shard on real loopback sockets.
#include "worker/client.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "common/wire.h"
#include "compression/cuda_codec.h"
#include "worker/ps_store.h"

namespace asyncps::worker {
namespace {

using std::chrono::milliseconds;

// A fake shard: answers each request with `handler`, on its own thread.
class FakeShard {
 public:
  using Handler = std::function<bool(const RequestHeader&, const Message&,
                                     ReplyHeader*, std::vector<Frame>*)>;

  explicit FakeShard(Handler h, std::string endpoint = "tcp://127.0.0.1:0")
      : handler_(std::move(h)) {
    auto s = ServerSocket::Bind(endpoint, {});
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    socket_ = std::move(*s);
    thread_ = std::thread([this] { Run(); });
  }
  ~FakeShard() {
    stop_ = true;
    thread_.join();
  }
  std::string endpoint() const { return socket_->endpoint(); }
  int requests() const { return requests_; }

 private:
  void Run() {
    while (!stop_) {
      std::string peer;
      Message msg;
      auto got = socket_->Receive(&peer, &msg, milliseconds(20));
      if (!got.ok() || !*got) continue;
      RequestHeader req;
      if (!DecodeRequest(msg.frames[0].data, msg.frames[0].size, {}, &req).ok())
        continue;
      ++requests_;
      ReplyHeader rep;
      rep.id = req.id;
      rep.kind = req.kind;
      std::vector<Frame> data;
      if (!handler_(req, msg, &rep, &data)) continue;  // drop: no reply
      std::vector<Frame> frames{Frame::Owned(EncodeReply(rep))};
      for (auto& f : data) frames.push_back(std::move(f));
      (void)socket_->Send(peer, frames);
    }
  }

  Handler handler_;
  std::unique_ptr<ServerSocket> socket_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int> requests_{0};
};

std::vector<TensorSpec> Model() {
  TensorSpec w{"w", {100, 50}, InitKind::kZeros, 0, 1};
  TensorSpec b{"b", {50}, InitKind::kZeros, 0, 1};
  return {w, b};
}

// Serves pulls from a model whose element i of tensor t is t*1000 + i.
bool ServeModel(const Layout& layout, int shard, const RequestHeader& req,
                ReplyHeader* rep, std::vector<Frame>* data) {
  if (req.kind != RequestKind::kPull) return true;
  for (uint32_t id : layout.shard_chunks(shard)) {
    const ChunkSpec& c = layout.chunks()[id];
    std::vector<float> v(c.num_elems);
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = c.tensor * 1000.0f + static_cast<float>(c.offset + i);
    ChunkRef r{id,
               static_cast<uint32_t>(data->size() + 1),
               0,
               c.num_elems,
               c.num_elems * 4,
               1};
    rep->chunks.push_back(r);
    data->push_back(Frame::Copy(v.data(), v.size() * 4));
  }
  return true;
}

TEST(ClientTest, RegisterPushPullAcrossTwoShards) {
  LayoutOptions lo;
  lo.num_shards = 2;
  lo.min_chunk_elems = 256;
  auto layout = Layout::Create(Model(), lo);
  ASSERT_TRUE(layout.ok());
  std::atomic<int> pushed_elems{0};
  auto handler = [&](int shard) {
    return [&, shard](const RequestHeader& req, const Message& msg,
                      ReplyHeader* rep, std::vector<Frame>* data) {
      if (req.kind == RequestKind::kPush) {
        for (const ChunkRef& c : req.chunks) {
          EXPECT_EQ(layout->chunks()[c.chunk].shard, shard);
          EXPECT_EQ(msg.frames[c.frame].size, c.byte_size);
          pushed_elems += static_cast<int>(c.num_elems);
        }
        rep->staleness = 3 + shard;
      }
      return ServeModel(*layout, shard, req, rep, data);
    };
  };
  FakeShard s0(handler(0)), s1(handler(1));
  ClientOptions o;
  o.servers = {s0.endpoint(), s1.endpoint()};
  o.rank = 0;
  // The fake shards count every copy of a push and do not de-duplicate: no
  // resend here, however slow the machine (a sanitizer build under load took
  // over the default 2 s for one reply). Resends are tested below.
  o.attempt_timeout = std::chrono::seconds(60);
  auto client = Client::Create(o);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Register(Model(), lo).ok());
  const Layout& l = (*client)->layout();
  ASSERT_EQ(l.chunks().size(), layout->chunks().size());

  std::vector<ChunkPayload> payloads;
  for (const ChunkSpec& c : l.chunks()) {
    auto buf = Buffer::Allocate(c.num_elems * 4);
    payloads.push_back({c.id, 0, Frame::Ref(buf)});
  }
  auto t = (*client)->StartPush(0, std::move(payloads));
  ASSERT_TRUE(t.ok());
  TicketResult r;
  ASSERT_TRUE((*client)->Wait(*t, milliseconds(5000), &r).ok());
  EXPECT_EQ(r.max_staleness, 4);
  EXPECT_EQ(pushed_elems, 5050);

  std::vector<float> w(5000, -1), b(50, -1);
  auto p = (*client)->StartPull(1, {w.data(), b.data()});
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE((*client)->Wait(*p, milliseconds(5000), &r).ok());
  for (int i = 0; i < 5000; ++i) ASSERT_EQ(w[i], static_cast<float>(i));
  for (int i = 0; i < 50; ++i) ASSERT_EQ(b[i], 1000.0f + i);
  EXPECT_EQ(r.bytes_received, 5050u * 4);
}

TEST(ClientTest, PipelinedRequestsAllComplete) {
  FakeShard s([](const RequestHeader&, const Message&, ReplyHeader*,
                 std::vector<Frame>*) { return true; });
  ClientOptions o;
  o.servers = {s.endpoint()};
  o.rank = 1;
  auto client = Client::Create(o);
  ASSERT_TRUE(client.ok());
  std::vector<Client::Ticket> tickets;
  for (int i = 0; i < 100; ++i) tickets.push_back(*(*client)->StartClock(i));
  for (auto it = tickets.rbegin(); it != tickets.rend(); ++it) {
    EXPECT_TRUE((*client)->Wait(*it, milliseconds(5000)).ok());
  }
  EXPECT_EQ(s.requests(), 100);
}

TEST(ClientTest, DroppedRequestIsResent) {
  std::atomic<int> seen{0};
  FakeShard s([&](const RequestHeader&, const Message&, ReplyHeader*,
                  std::vector<Frame>*) {
    return ++seen > 1;  // drop the first attempt
  });
  ClientOptions o;
  o.servers = {s.endpoint()};
  o.attempt_timeout = milliseconds(100);
  auto client = Client::Create(o);
  ASSERT_TRUE(client.ok());
  EXPECT_TRUE((*client)->Heartbeat(milliseconds(5000)).ok());
  EXPECT_GE((*client)->resends(), 1u);
}

TEST(ClientTest, DeadShardTimesOutWithItsName) {
  // Nothing listens on this port: bind and close to find a free one.
  std::string endpoint;
  {
    auto tmp = ServerSocket::Bind("tcp://127.0.0.1:0", {});
    endpoint = (*tmp)->endpoint();
  }
  ClientOptions o;
  o.servers = {endpoint};
  o.attempt_timeout = milliseconds(50);
  auto client = Client::Create(o);
  ASSERT_TRUE(client.ok());
  auto start = std::chrono::steady_clock::now();
  Status st = (*client)->Heartbeat(milliseconds(300));
  EXPECT_EQ(st.code(), StatusCode::kTimedOut);
  EXPECT_NE(st.message().find(endpoint), std::string::npos) << st.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
}

TEST(ClientTest, InterruptEndsAWaitWithinThePollInterval) {
  // A shard that never answers: only the interrupt hook can end the wait.
  FakeShard s([](const RequestHeader&, const Message&, ReplyHeader*,
                 std::vector<Frame>*) { return false; });
  std::atomic<int> calls{0};
  ClientOptions o;
  o.servers = {s.endpoint()};
  o.interrupt_poll = milliseconds(20);
  o.interrupt = [&calls]() {
    return ++calls >= 3 ? Status::Cancelled("stop") : Status::OK();
  };
  auto client = Client::Create(o);
  ASSERT_TRUE(client.ok());
  auto start = std::chrono::steady_clock::now();
  Status st = (*client)->Heartbeat(milliseconds(10000));
  EXPECT_EQ(st.code(), StatusCode::kCancelled) << st.ToString();
  EXPECT_EQ(calls.load(), 3);
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(2000));
  // The abandoned ticket is gone: nothing is left to wait for.
  EXPECT_TRUE((*client)->WaitAll(milliseconds(100)).ok());
}

TEST(ClientTest, InterruptIsNotCalledForQuickReplies) {
  FakeShard s([](const RequestHeader&, const Message&, ReplyHeader*,
                 std::vector<Frame>*) { return true; });
  std::atomic<int> calls{0};
  ClientOptions o;
  o.servers = {s.endpoint()};
  o.interrupt_poll = milliseconds(5000);
  o.interrupt = [&calls]() {
    ++calls;
    return Status::Cancelled("stop");
  };
  auto client = Client::Create(o);
  ASSERT_TRUE(client.ok());
  EXPECT_TRUE((*client)->Heartbeat(milliseconds(4000)).ok());
  EXPECT_EQ(calls.load(), 0);
}

TEST(ClientTest, ShardErrorIsReported) {
  FakeShard s([](const RequestHeader&, const Message&, ReplyHeader* rep,
                 std::vector<Frame>*) {
    rep->status =
        Status::AlreadyExists("tensor 'w' registered with another shape");
    return true;
  });
  ClientOptions o;
  o.servers = {s.endpoint()};
  auto client = Client::Create(o);
  ASSERT_TRUE(client.ok());
  Status st = (*client)->Register(Model(), {});
  EXPECT_EQ(st.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(st.message().find("another shape"), std::string::npos);
}

TEST(ClientTest, InconsistentPullReplyIsCorruptionAndWritesNothing) {
  FakeShard s([](const RequestHeader& req, const Message&, ReplyHeader* rep,
                 std::vector<Frame>* data) {
    if (req.kind == RequestKind::kPull) {
      rep->chunks.push_back(
          {0, 1, 0, 5000, 400, 1});  // declares more bytes than sent
      std::vector<float> v(100, 7.0f);
      data->push_back(Frame::Copy(v.data(), 400));
    }
    return true;
  });
  ClientOptions o;
  o.servers = {s.endpoint()};
  auto client = Client::Create(o);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Register({Model()[0]}, {}).ok());
  std::vector<float> w(5000, -1);
  auto t = (*client)->StartPull(0, {w.data()});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*client)->Wait(*t, milliseconds(5000)).code(),
            StatusCode::kCorruption);
  EXPECT_EQ(w[0], -1.0f);
}

// Issue 40, finding 4: the client followed any redirect a reply named. A
// replica that says "not the primary, go to X" is followed only to a member
// of the group the client was given; a redirect elsewhere is not followed
// (the process at X sees nothing of this worker) and the client keeps
// asking its member, which answers once it is the primary.
TEST(ClientTest, RedirectOutsideTheReplicaGroupIsNotFollowed) {
  std::atomic<int> rogue_seen{0};
  FakeShard rogue([&](const RequestHeader&, const Message&, ReplyHeader*,
                      std::vector<Frame>*) {
    ++rogue_seen;
    return true;
  });
  std::atomic<int> seen{0};
  FakeShard replica([&](const RequestHeader&, const Message&, ReplyHeader* rep,
                        std::vector<Frame>*) {
    rep->epoch = 3;
    if (++seen < 5) {
      rep->status = Status::Unavailable("not the primary");
      rep->redirect = rogue.endpoint();
    }
    return true;
  });
  FakeShard other([&](const RequestHeader&, const Message&, ReplyHeader* rep,
                      std::vector<Frame>*) {
    rep->epoch = 3;
    return true;
  });
  ClientOptions o;
  o.servers = {replica.endpoint() + "|" + other.endpoint()};
  o.attempt_timeout = milliseconds(200);
  auto client = Client::Create(o);
  ASSERT_TRUE(client.ok());
  EXPECT_TRUE((*client)->Heartbeat(milliseconds(10000)).ok());
  EXPECT_EQ(rogue_seen, 0);
  EXPECT_GE(seen + other.requests(), 5);
}

TEST(ClientTest, RetryableErrorIsRetried) {
  std::atomic<int> seen{0};
  FakeShard s([&](const RequestHeader&, const Message&, ReplyHeader* rep,
                  std::vector<Frame>*) {
    if (++seen < 3) rep->status = Status::Unavailable("recovering");
    return true;
  });
  ClientOptions o;
  o.servers = {s.endpoint()};
  o.attempt_timeout = milliseconds(50);
  auto client = Client::Create(o);
  ASSERT_TRUE(client.ok());
  EXPECT_TRUE((*client)->Heartbeat(milliseconds(5000)).ok());
  EXPECT_GE(seen, 3);
}

}  // namespace
}  // namespace asyncps::worker

namespace asyncps::worker {
namespace {

TEST(ClientTest, ResendsAtOnceWhenARestartedShardIsBack) {
  auto silent = std::make_unique<FakeShard>(
      [](const RequestHeader&, const Message&, ReplyHeader*,
         std::vector<Frame>*) { return false; });
  const std::string endpoint = silent->endpoint();
  ClientOptions o;
  o.servers = {endpoint};
  o.attempt_timeout = std::chrono::seconds(30);  // only a reconnect can help
  auto client = Client::Create(o);
  ASSERT_TRUE(client.ok());
  auto t = (*client)->StartClock(1);
  ASSERT_TRUE(t.ok());
  for (int i = 0; i < 200 && silent->requests() == 0; ++i)
    std::this_thread::sleep_for(milliseconds(10));
  ASSERT_EQ(silent->requests(), 1);
  // The first request was swallowed: wait for it, then "restart" the shard.
  EXPECT_EQ((*client)->Wait(*t, milliseconds(200)).code(),
            StatusCode::kTimedOut);
  auto t2 = (*client)->StartClock(2);
  ASSERT_TRUE(t2.ok());
  std::this_thread::sleep_for(milliseconds(100));
  silent.reset();
  FakeShard back([](const RequestHeader&, const Message&, ReplyHeader*,
                    std::vector<Frame>*) { return true; },
                 endpoint);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE((*client)->Wait(*t2, milliseconds(10000)).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_GE((*client)->resends(), 1u);
}

// A shard restarted from an older checkpoint has forgotten the clock this
// worker announced and had acknowledged; the worker's next pull waits for
// that clock (BSP/SSP), so the client announces it again on reconnecting.
// Before: the restarted shard never heard of clock 7 and the pull hung.
TEST(ClientTest, ReannouncesItsClockToARestartedShard) {
  std::atomic<int64_t> clock_seen{-1};
  auto handler = [&](const RequestHeader& req, const Message&, ReplyHeader*,
                     std::vector<Frame>*) {
    if (req.kind == RequestKind::kClock) {
      int64_t c = clock_seen.load();
      while (req.clock > c && !clock_seen.compare_exchange_weak(c, req.clock)) {
      }
    }
    return true;
  };
  auto first = std::make_unique<FakeShard>(handler);
  const std::string endpoint = first->endpoint();
  ClientOptions o;
  o.servers = {endpoint};
  o.rank = 0;
  auto client = Client::Create(o);
  ASSERT_TRUE(client.ok());
  for (int64_t c = 1; c <= 7; ++c) {
    auto t = (*client)->StartClock(c);
    ASSERT_TRUE(t.ok());
    ASSERT_TRUE((*client)->Wait(*t, milliseconds(5000)).ok());
  }
  EXPECT_EQ(clock_seen.load(), 7);
  first.reset();
  clock_seen = -1;  // the new incarnation knows nothing
  FakeShard back(handler, endpoint);
  // Any wait drives the client: a heartbeat, answered by the new shard.
  ASSERT_TRUE((*client)->Heartbeat(milliseconds(10000)).ok());
  for (int i = 0; i < 500 && clock_seen.load() < 7; ++i)
    std::this_thread::sleep_for(milliseconds(10));
  EXPECT_EQ(clock_seen.load(), 7);
}

// Per-shard clocks (StartClockShards): a clock to some shards leaves the
// others' untouched, and a shard that reconnects gets its own highest clock
// again, not another shard's.
TEST(ClientTest, ClockToSomeShardsIsKeptPerShard) {
  std::atomic<int64_t> seen[2] = {{-1}, {-1}};
  auto handler = [&](int shard) {
    return [&, shard](const RequestHeader& req, const Message&, ReplyHeader*,
                      std::vector<Frame>*) {
      if (req.kind == RequestKind::kClock) {
        int64_t c = seen[shard].load();
        while (req.clock > c &&
               !seen[shard].compare_exchange_weak(c, req.clock)) {
        }
      }
      return true;
    };
  };
  auto s0 = std::make_unique<FakeShard>(handler(0));
  auto s1 = std::make_unique<FakeShard>(handler(1));
  const std::string e0 = s0->endpoint(), e1 = s1->endpoint();
  ClientOptions o;
  o.servers = {e0, e1};
  o.rank = 0;
  auto client = Client::Create(o);
  ASSERT_TRUE(client.ok());
  for (int64_t c = 1; c <= 3; ++c) {
    auto t = (*client)->StartClock(c);
    ASSERT_TRUE(t.ok());
    ASSERT_TRUE((*client)->Wait(*t, milliseconds(5000)).ok());
  }
  auto t = (*client)->StartClockShards(5, {0});
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE((*client)->Wait(*t, milliseconds(5000)).ok());
  EXPECT_EQ(seen[0].load(), 5);
  EXPECT_EQ(seen[1].load(), 3);
  auto back = (*client)->StartClockShards(4, {0});  // sent, not kept
  ASSERT_TRUE(back.ok());
  ASSERT_TRUE((*client)->Wait(*back, milliseconds(5000)).ok());
  EXPECT_EQ((*client)->StartClockShards(6, {2}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*client)->StartClockShards(6, {1, 1}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(seen[1].load(), 3);
  // Both shards restart knowing nothing.
  s0.reset();
  s1.reset();
  seen[0] = -1;
  seen[1] = -1;
  s0 = std::make_unique<FakeShard>(handler(0), e0);
  s1 = std::make_unique<FakeShard>(handler(1), e1);
  ASSERT_TRUE((*client)->Heartbeat(milliseconds(10000)).ok());
  for (int i = 0; i < 500 && (seen[0].load() < 5 || seen[1].load() < 3); ++i)
    std::this_thread::sleep_for(milliseconds(10));
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(seen[0].load(), 5);
  EXPECT_EQ(seen[1].load(), 3);
}

// The stage wait of the overlap pipeline: a heartbeat to some shards goes
// behind the requests started to them and completes without their replies
// (a replicated primary holds a push's until its round closed).
TEST(ClientTest, HeartbeatToSomeShardsFollowsTheirRequests) {
  std::mutex mu;
  std::vector<RequestKind> kinds[2];  // arrival order per shard
  auto handler = [&](int shard) {
    return [&, shard](const RequestHeader& req, const Message&, ReplyHeader*,
                      std::vector<Frame>*) {
      if (req.kind == RequestKind::kRegister) return true;
      std::lock_guard<std::mutex> l(mu);
      kinds[shard].push_back(req.kind);
      return req.kind != RequestKind::kPush;  // pushes stay unanswered
    };
  };
  FakeShard s0(handler(0));
  FakeShard s1(handler(1));
  ClientOptions o;
  o.servers = {s0.endpoint(), s1.endpoint()};
  o.rank = 0;
  o.attempt_timeout = milliseconds(5000);
  auto client = Client::Create(o);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Register({Model()[1]}, {}).ok());
  const int owner = (*client)->layout().shard_chunks(0).empty() ? 1 : 0;
  auto buf = Buffer::Allocate(50 * 4);
  std::vector<ChunkPayload> p{{0, 0, Frame::Ref(buf)}};
  auto push = (*client)->StartPush(0, std::move(p));
  ASSERT_TRUE(push.ok());
  auto hb = (*client)->StartHeartbeatShards({owner});
  ASSERT_TRUE(hb.ok());
  EXPECT_TRUE((*client)->Wait(*hb, milliseconds(3000)).ok());
  {
    std::lock_guard<std::mutex> l(mu);
    EXPECT_EQ(kinds[owner], (std::vector<RequestKind>{
                                RequestKind::kPush, RequestKind::kHeartbeat}));
    EXPECT_TRUE(kinds[1 - owner].empty());
  }
  EXPECT_EQ((*client)->StartHeartbeatShards({2}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*client)->StartHeartbeatShards({0, 0}).status().code(),
            StatusCode::kInvalidArgument);
  // An empty list sends nothing and completes.
  auto none = (*client)->StartHeartbeatShards({});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE((*client)->Wait(*none, milliseconds(1000)).ok());
}

// device_compression without a GPU (or without CUDA): the store takes host
// gradients only, and Push compresses and counts as before.
TEST(PsStoreTest, DeviceCompressionFallsBackToHostPushes) {
  if (compression::DeviceCodec::DeviceAvailable())
    GTEST_SKIP() << "a GPU is visible";
  std::atomic<uint64_t> wire{0};
  std::atomic<int> compressed{0};
  FakeShard s0([&](const RequestHeader& req, const Message&, ReplyHeader*,
                   std::vector<Frame>*) {
    if (req.kind == RequestKind::kPush) {
      for (const ChunkRef& c : req.chunks) {
        wire += c.byte_size;
        compressed += c.codec != 0;
      }
    }
    return true;
  });
  ClientOptions o;
  o.servers = {s0.endpoint()};
  auto client = Client::Create(o);
  ASSERT_TRUE(client.ok());
  PsStoreOptions so;
  so.push_codec = "int8:ef=1";
  so.device_compression = true;
  so.timeout = milliseconds(5000);
  auto store = PsParameterStore::Create(client->get(), Model(), so);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_FALSE((*store)->AcceptsDeviceGradients());
  std::vector<float> w(5000, 0.5f), b(50, 0.25f);
  EXPECT_EQ((*store)->PushDevice(0, {w.data(), b.data()}).code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*store)->Push(0, {w.data(), b.data()}).ok());
  ASSERT_TRUE((*store)->Flush().ok());
  const TrafficStats t = (*store)->traffic();
  EXPECT_EQ(t.bytes_pushed_raw, 5050u * 4);
  EXPECT_EQ(t.bytes_pushed_wire, wire.load());
  int big = 0;  // chunks at or above int8's min_elems (1024) are int8
  for (const ChunkSpec& c : (*client)->layout().chunks())
    big += c.num_elems >= 1024;
  EXPECT_EQ(compressed, big);
  EXPECT_GE(big, 1);
  EXPECT_LT(t.bytes_pushed_wire, 5000u * 2);
  // The step-time counters of STEP_TIME: the int8 chunks were encoded, the
  // small ones copied raw, both inside the push's own time.
  EXPECT_GT(t.encode_ns, 0);
  EXPECT_GT(t.push_copy_ns, 0);
  EXPECT_GE(t.push_ns, t.encode_ns + t.push_copy_ns);
  EXPECT_EQ(t.pull_wait_ns, 0);
  EXPECT_EQ(t.pull_copy_ns, 0);
}

// PushSubset sends only the listed chunks; a layered pull asks for each
// group in order and writes only the group it waits for.
// Answers a pull of the chunks `ids` with element values tensor*1000 + id.
void ServeChunks(const Layout& layout, const std::vector<uint32_t>& ids,
                 ReplyHeader* rep, std::vector<Frame>* data) {
  for (uint32_t id : ids) {
    const ChunkSpec& c = layout.chunks()[id];
    std::vector<float> v(c.num_elems, c.tensor * 1000.0f + id);
    rep->chunks.push_back({id, static_cast<uint32_t>(data->size() + 1), 0,
                           c.num_elems, c.num_elems * 4, 1});
    data->push_back(Frame::Copy(v.data(), v.size() * 4));
  }
}

// Model() in chunks of at most 1024 floats over `shards` shards.
LayoutOptions SmallChunks(int shards) {
  LayoutOptions lo;
  lo.num_shards = shards;
  lo.chunk_elems = 1024;
  lo.min_chunk_elems = 256;
  return lo;
}

// A client of `servers` (rank 0) and a store of Model() laid out by `lo`.
void ConnectStore(const std::vector<std::string>& servers,
                  const LayoutOptions& lo, std::unique_ptr<Client>* client,
                  std::unique_ptr<PsParameterStore>* store) {
  ClientOptions o;
  o.servers = servers;
  o.rank = 0;
  o.attempt_timeout = std::chrono::seconds(60);
  auto c = Client::Create(o);
  ASSERT_TRUE(c.ok());
  *client = std::move(*c);
  PsStoreOptions so;
  so.layout = lo;
  so.timeout = milliseconds(5000);
  auto st = PsParameterStore::Create(client->get(), Model(), so);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  *store = std::move(*st);
}

// Gradients written into NextGradientBuffers' sets go to the shard as they
// are (no copy: push_copy_ns stays 0), exactly; a set is reused once the
// transport let go of it, never the set of the last push; a tensor pushed
// from the caller's own buffer is copied as before.
TEST(PsStoreTest, GradientBuffersArePushedWithoutACopy) {
  std::mutex mu;
  std::map<uint32_t, std::vector<float>> got;  // GUARDED_BY(mu): last push
  FakeShard s0([&](const RequestHeader& req, const Message& msg, ReplyHeader*,
                   std::vector<Frame>*) {
    if (req.kind != RequestKind::kPush) return true;
    std::lock_guard<std::mutex> l(mu);
    for (const ChunkRef& c : req.chunks) {
      EXPECT_EQ(c.codec, 0);
      EXPECT_LT(c.frame, msg.frames.size());
      if (c.frame >= msg.frames.size()) continue;
      const ByteView& f = msg.frames[c.frame];
      EXPECT_EQ(f.size, c.num_elems * 4);
      std::vector<float> v(f.size / 4);
      if (!v.empty()) std::memcpy(v.data(), f.data, v.size() * 4);
      got[c.chunk] = std::move(v);
    }
    return true;
  });
  std::unique_ptr<Client> client;
  std::unique_ptr<PsParameterStore> store;
  ASSERT_NO_FATAL_FAILURE(
      ConnectStore({s0.endpoint()}, SmallChunks(1), &client, &store));
  const Layout& l = client->layout();
  // What the shard must hold of the push of tensors (w, b).
  auto expect_pushed = [&](const float* w, const float* b) {
    std::lock_guard<std::mutex> lock(mu);
    for (const ChunkSpec& c : l.chunks()) {
      const float* want = (c.tensor == 0 ? w : b) + c.offset;
      ASSERT_EQ(got[c.id].size(), c.num_elems) << "chunk " << c.id;
      EXPECT_EQ(std::memcmp(got[c.id].data(), want, c.num_elems * 4), 0)
          << "chunk " << c.id;
    }
  };
  std::vector<std::vector<float*>> handed;
  for (int step = 0; step < 6; ++step) {
    std::vector<float*> g;
    ASSERT_TRUE(store->NextGradientBuffers(&g));
    ASSERT_EQ(g.size(), 2u);
    for (int i = 0; i < 5000; ++i) g[0][i] = step * 10000.0f + i;
    for (int i = 0; i < 50; ++i) g[1][i] = -step - i / 64.0f;
    handed.push_back(g);
    ASSERT_TRUE(store->Push(step, {g[0], g[1]}).ok());
    ASSERT_TRUE(store->Flush().ok());
    ASSERT_NO_FATAL_FAILURE(expect_pushed(g[0], g[1]));
  }
  EXPECT_EQ(store->traffic().push_copy_ns, 0);
  EXPECT_EQ(store->traffic().bytes_pushed_raw, 6u * 5050 * 4);
  for (size_t k = 1; k < handed.size(); ++k) {
    EXPECT_NE(handed[k][0], handed[k - 1][0]) << "the last push's set again";
    // Two sets take turns once the transport released them: nothing is
    // allocated per step.
    if (k >= 2) {
      EXPECT_EQ(handed[k][0], handed[k - 2][0]);
    }
  }

  // The bias from the caller's own buffer: copied, the weights still not.
  std::vector<float*> g;
  ASSERT_TRUE(store->NextGradientBuffers(&g));
  std::vector<float> own_b(50, 7.5f);
  std::fill(g[0], g[0] + 5000, 0.125f);
  ASSERT_TRUE(store->Push(6, {g[0], own_b.data()}).ok());
  ASSERT_TRUE(store->Flush().ok());
  ASSERT_NO_FATAL_FAILURE(expect_pushed(g[0], own_b.data()));
  EXPECT_GT(store->traffic().push_copy_ns, 0);
}

TEST(PsStoreTest, PushSubsetAndPullGroupsTouchOnlyTheirChunks) {
  const LayoutOptions lo = SmallChunks(1);
  auto layout = Layout::Create(Model(), lo);
  ASSERT_TRUE(layout.ok());
  std::mutex mu;
  std::vector<std::vector<uint32_t>> pushed, pulled;  // GUARDED_BY(mu)
  FakeShard s0([&](const RequestHeader& req, const Message&, ReplyHeader* rep,
                   std::vector<Frame>* data) {
    std::lock_guard<std::mutex> l(mu);
    if (req.kind == RequestKind::kPush) {
      pushed.emplace_back();
      for (const ChunkRef& c : req.chunks) pushed.back().push_back(c.chunk);
    }
    if (req.kind != RequestKind::kPull) return true;
    pulled.push_back(req.pull_chunks);
    ServeChunks(*layout, req.pull_chunks, rep, data);
    return true;
  });
  std::unique_ptr<Client> client;
  std::unique_ptr<PsParameterStore> store;
  ASSERT_NO_FATAL_FAILURE(ConnectStore({s0.endpoint()}, lo, &client, &store));
  const Layout& l = client->layout();
  ASSERT_GE(l.chunks().size(), 3u);
  std::vector<uint32_t> w_ids, b_ids;
  for (const ChunkSpec& c : l.chunks())
    (c.tensor == 0 ? w_ids : b_ids).push_back(c.id);

  std::vector<float> gw(5000, 1.0f), gb(50, 1.0f);
  ASSERT_TRUE(store->PushSubset(0, {w_ids[1]}, {gw.data(), gb.data()}).ok());
  ASSERT_TRUE(store->PushSubset(0, b_ids, {nullptr, gb.data()}).ok());
  EXPECT_EQ(
      store->PushSubset(0, {b_ids[0], b_ids[0]}, {gw.data(), gb.data()}).code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(store->PushSubset(0, {w_ids[0]}, {nullptr, gb.data()}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(store->traffic().bytes_pushed_raw,
            (l.chunks()[w_ids[1]].num_elems + 50) * 4);

  // Groups in forward order: b first, then w.
  ASSERT_TRUE(store->ClockAndPullGroups(1, {b_ids, w_ids}).ok());
  EXPECT_EQ(store->pull_groups_pending(), 2u);
  std::vector<float> w(5000, -1), b(50, -1);
  EXPECT_EQ(store->Pull(1, {w.data(), b.data()}).code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store->WaitPullGroup(1, {w.data(), b.data()}).ok());
  for (uint32_t id : w_ids) {
    ASSERT_EQ(w[l.chunks()[id].offset], static_cast<float>(id));
  }
  EXPECT_EQ(b[0], -1.0f);  // not yet
  EXPECT_EQ(store->WaitPullGroup(1, {w.data(), b.data()}).code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store->WaitPullGroup(0, {w.data(), b.data()}).ok());
  EXPECT_EQ(b[49], 1000.0f + b_ids.back());
  EXPECT_EQ(store->pull_groups_pending(), 0u);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(pushed.size(), 2u);
  EXPECT_EQ(pushed[0], std::vector<uint32_t>{w_ids[1]});
  EXPECT_EQ(pushed[1], b_ids);
  ASSERT_EQ(pulled.size(), 2u);
  EXPECT_EQ(pulled[0], b_ids);
  EXPECT_EQ(pulled[1], w_ids);
}

// The overlap pipeline: a shard's clock and its part of each pull group go
// as soon as its pushes did; a group waits until every shard holding it was
// clocked; a later push to a clocked shard is refused; ClockAndPullGroups
// clocks the rest.
TEST(PsStoreTest, PerShardClocksPullEachShardBehindItsOwnClock) {
  const LayoutOptions lo = SmallChunks(2);
  auto layout = Layout::Create(Model(), lo);
  ASSERT_TRUE(layout.ok());
  std::mutex mu;
  std::vector<std::string> log;  // GUARDED_BY(mu): "<shard> <kind> <clock>"
  auto handler = [&](int shard) {
    return [&, shard](const RequestHeader& req, const Message&,
                      ReplyHeader* rep, std::vector<Frame>* data) {
      std::lock_guard<std::mutex> l(mu);
      if (req.kind != RequestKind::kPush && req.kind != RequestKind::kClock &&
          req.kind != RequestKind::kPull) {
        return true;  // registration
      }
      log.push_back(std::to_string(shard) + " " + RequestKindName(req.kind) +
                    " " + std::to_string(req.clock));
      if (req.kind != RequestKind::kPull) return true;
      for (uint32_t id : req.pull_chunks)
        EXPECT_EQ(layout->chunks()[id].shard, shard);
      ServeChunks(*layout, req.pull_chunks, rep, data);
      return true;
    };
  };
  FakeShard s0(handler(0)), s1(handler(1));
  std::unique_ptr<Client> client;
  std::unique_ptr<PsParameterStore> store;
  ASSERT_NO_FATAL_FAILURE(
      ConnectStore({s0.endpoint(), s1.endpoint()}, lo, &client, &store));
  const Layout& l = client->layout();
  const std::vector<uint32_t> on0 = l.shard_chunks(0), on1 = l.shard_chunks(1);
  ASSERT_FALSE(on0.empty());
  ASSERT_FALSE(on1.empty());
  // Group 0 holds chunks of both shards, group 1 only shard 0's.
  std::vector<uint32_t> g0{on0[0], on1[0]};
  std::vector<uint32_t> g1(on0.begin() + 1, on0.end());
  std::vector<uint32_t> rest(on1.begin() + 1, on1.end());
  if (!rest.empty()) g0.insert(g0.end(), rest.begin(), rest.end());
  const std::vector<std::vector<uint32_t>> groups{g0, g1};
  std::vector<float> gw(5000, 1.0f), gb(50, 1.0f);
  std::vector<float> w(5000, -1), b(50, -1);
  const std::vector<float*> out{w.data(), b.data()};

  ASSERT_TRUE(store->PushSubset(0, on0, {gw.data(), gb.data()}).ok());
  ASSERT_TRUE(store->ClockShardsAndPullGroups(1, {0}, groups).ok());
  EXPECT_EQ(store->ClockShardsAndPullGroups(1, {0}, groups).code(),
            StatusCode::kInvalidArgument);  // shard 0 has clock 1
  EXPECT_EQ(store->PushSubset(0, {on0[0]}, {gw.data(), gb.data()}).code(),
            StatusCode::kFailedPrecondition);  // would follow its clock
  EXPECT_EQ(store->Clock(1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->WaitPullGroup(0, out).code(),
            StatusCode::kFailedPrecondition);  // shard 1 not clocked
  ASSERT_TRUE(store->WaitPullGroup(1, out).ok());
  for (uint32_t id : g1) {
    const ChunkSpec& c = l.chunks()[id];
    EXPECT_EQ((c.tensor == 0 ? w : b)[c.offset], c.tensor * 1000.0f + id);
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(log, (std::vector<std::string>{"0 push 0", "0 clock 1",
                                             "0 pull 1", "0 pull 1"}));
  }
  ASSERT_TRUE(store->PushSubset(0, on1, {gw.data(), gb.data()}).ok());
  ASSERT_TRUE(store->ClockAndPullGroups(1, groups).ok());
  ASSERT_TRUE(store->WaitPullGroup(0, out).ok());
  EXPECT_EQ(store->pull_groups_pending(), 0u);
  for (uint32_t id : g0) {
    const ChunkSpec& c = l.chunks()[id];
    EXPECT_EQ((c.tensor == 0 ? w : b)[c.offset], c.tensor * 1000.0f + id);
  }
  ASSERT_TRUE(store->Flush().ok());
  std::lock_guard<std::mutex> lock(mu);
  // Shard 0 got one clock and two pulls (one per group it holds chunks of),
  // shard 1 its push, clock and one pull after shard 0's round.
  EXPECT_EQ(log, (std::vector<std::string>{"0 push 0", "0 clock 1", "0 pull 1",
                                           "0 pull 1", "1 push 0", "1 clock 1",
                                           "1 pull 1"}));
}

}  // namespace
}  // namespace asyncps::worker

// Regression tests of issue 13 (client side).
namespace asyncps::worker {
namespace {

// Item 1: after a timeout or a reconnect, pending requests go out again
// oldest first, and each push says below which id this client has finished
// with its pushes to that shard.
TEST(ClientTest, ResendsInIdOrderAndPushesCarryTheirFloor) {
  std::mutex mu;
  std::vector<uint64_t> ids;  // every push received, in arrival order
  std::vector<std::pair<uint64_t, uint64_t>> floors;  // (id, done_below)
  std::atomic<bool> answer{false};
  FakeShard s([&](const RequestHeader& req, const Message&, ReplyHeader*,
                  std::vector<Frame>*) {
    if (req.kind != RequestKind::kPush) return true;
    std::lock_guard<std::mutex> l(mu);
    ids.push_back(req.id);
    floors.push_back({req.id, req.done_below});
    return answer.load();
  });
  ClientOptions o;
  o.servers = {s.endpoint()};
  o.rank = 0;
  o.attempt_timeout = milliseconds(200);
  o.max_backoff = milliseconds(200);
  auto client = Client::Create(o);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Register({Model()[1]}, {}).ok());
  auto push = [&] {
    auto buf = Buffer::Allocate(50 * 4);
    std::vector<ChunkPayload> p{{0, 0, Frame::Ref(buf)}};
    return *(*client)->StartPush(0, std::move(p));
  };
  std::vector<Client::Ticket> tickets;
  for (int i = 0; i < 12; ++i) tickets.push_back(push());
  // Nothing is answered: let every push be resent at least once.
  EXPECT_EQ((*client)->Wait(tickets[0], milliseconds(700)).code(),
            StatusCode::kTimedOut);  // gives up on the first one only
  answer = true;
  for (size_t i = 1; i < tickets.size(); ++i)
    EXPECT_TRUE((*client)->Wait(tickets[i], milliseconds(5000)).ok());
  // A push after the others finished: nothing below it is pending.
  tickets.push_back(push());
  EXPECT_TRUE((*client)->Wait(tickets.back(), milliseconds(5000)).ok());
  std::lock_guard<std::mutex> l(mu);
  ASSERT_GT(ids.size(), 24u);
  for (size_t i = 1; i < 12; ++i) EXPECT_GT(ids[i], ids[i - 1]);
  // Resends go out in rounds, each oldest first: the id only goes down when
  // a new round starts. (Resending in hash-map order goes down at almost
  // every message.)
  size_t downs = 0;
  for (size_t i = 12; i < ids.size(); ++i) downs += ids[i] < ids[i - 1];
  const size_t resends = ids.size() - 12;
  EXPECT_LT(downs * 4, resends) << downs << " of " << resends;
  // The floor is the oldest push still pending when the push was made.
  for (size_t i = 0; i < 12; ++i) {
    EXPECT_EQ(floors[i].second, ids[0]) << "push " << floors[i].first;
  }
  EXPECT_EQ(floors.back().first, floors.back().second);
}

// Item 6: a push a shard can never accept is refused before it is sent (the
// shard states its limit in every reply), not resent until the deadline.
TEST(ClientTest, PushOverTheShardsLimitIsRefusedAtOnce) {
  std::atomic<int> pushes{0};
  FakeShard s([&](const RequestHeader& req, const Message&, ReplyHeader* rep,
                  std::vector<Frame>*) {
    rep->max_request_bytes = 8192;
    rep->max_frame_bytes = 8192;
    pushes += req.kind == RequestKind::kPush;
    return true;
  });
  ClientOptions o;
  o.servers = {s.endpoint()};
  o.rank = 0;
  auto client = Client::Create(o);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Register({Model()[0]}, {}).ok());  // 5000 floats
  auto buf = Buffer::Allocate(5000 * 4);
  std::vector<ChunkPayload> p{{0, 0, Frame::Ref(buf)}};
  auto t = (*client)->StartPush(0, std::move(p));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("8192"), std::string::npos)
      << t.status().ToString();
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(pushes.load(), 0);
}

// Small one: the client's own message limit does not make a shard larger
// than it unpullable; Register raises it to what a pull can need.
TEST(ClientTest, ShardLargerThanTheConfiguredMessageLimitIsPullable) {
  LayoutOptions lo;
  auto layout = Layout::Create(Model(), lo);
  ASSERT_TRUE(layout.ok());
  FakeShard s([&](const RequestHeader& req, const Message&, ReplyHeader* rep,
                  std::vector<Frame>* data) {
    return ServeModel(*layout, 0, req, rep, data);
  });
  ClientOptions o;
  o.servers = {s.endpoint()};
  o.rank = 0;
  o.transport.max_message_bytes = 4096;  // the model is 20,200 bytes
  auto client = Client::Create(o);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Register(Model(), lo).ok());
  std::vector<float> w(5000, -1), b(50, -1);
  auto t = (*client)->StartPull(0, {w.data(), b.data()});
  ASSERT_TRUE(t.ok());
  Status st = (*client)->Wait(*t, milliseconds(5000));
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(w[4999], 4999.0f);
}

}  // namespace
}  // namespace asyncps::worker
