#include "common/transport.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace asyncps {
namespace {

using std::chrono::milliseconds;

TEST(TransportTest, TcpRoundTripZeroCopy) {
  TransportOptions o;
  auto server = ServerSocket::Bind("tcp://127.0.0.1:0", o);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  EXPECT_NE((*server)->endpoint().find("127.0.0.1:"), std::string::npos);
  auto client = ClientSocket::Connect((*server)->endpoint(), o);
  ASSERT_TRUE(client.ok());

  BufferPtr big = Buffer::Allocate(1 << 20);
  for (size_t i = 0; i < big->size(); ++i)
    big->data()[i] = static_cast<uint8_t>(i * 7);
  std::weak_ptr<Buffer> watch = big;
  std::vector<Frame> frames{Frame::Copy("hdr", 3), Frame::Ref(big)};
  ASSERT_TRUE((*client)->Send(frames).ok());
  frames.clear();
  big.reset();  // the transport keeps its own reference until sent

  std::string peer;
  Message msg;
  auto got = (*server)->Receive(&peer, &msg, milliseconds(5000));
  ASSERT_TRUE(got.ok() && *got);
  ASSERT_EQ(msg.frames.size(), 2u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(msg.frames[0].data), 3),
            "hdr");
  ASSERT_EQ(msg.frames[1].size, size_t{1} << 20);
  EXPECT_EQ(msg.frames[1].data[12345], static_cast<uint8_t>(12345 * 7));
  for (int i = 0; i < 100 && !watch.expired(); ++i)
    std::this_thread::sleep_for(milliseconds(10));
  EXPECT_TRUE(watch.expired()) << "buffer still referenced after send";

  std::vector<Frame> reply{Frame::Owned(std::vector<uint8_t>{1, 2, 3})};
  ASSERT_TRUE((*server)->Send(peer, reply).ok());
  Message r;
  auto rgot = (*client)->Receive(&r, milliseconds(5000));
  ASSERT_TRUE(rgot.ok() && *rgot);
  ASSERT_EQ(r.frames.size(), 1u);
  EXPECT_EQ(r.frames[0].data[2], 3);
}

// SO_SNDBUF of this process's TCP sockets whose local (local == true) or
// peer port is `port`, read with getsockopt on each socket in /proc/self/fd
// (ZeroMQ's I/O thread made them; the descriptors are this process's).
std::vector<int> SendBuffersOfPort(int port, bool local) {
  std::vector<int> out;
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    const int fd = std::atoi(e->d_name);
    if (fd <= 2 || fd == dirfd(d)) continue;
    sockaddr_in a{};
    socklen_t len = sizeof(a);
    const int rc = local
                       ? getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len)
                       : getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len);
    if (rc != 0 || a.sin_family != AF_INET || ntohs(a.sin_port) != port)
      continue;
    int type = 0;
    socklen_t tl = sizeof(type);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) != 0 ||
        type != SOCK_STREAM)
      continue;
    if (local) {  // the listening socket has no peer: only connections count
      sockaddr_in peer{};
      socklen_t pl = sizeof(peer);
      if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0)
        continue;
    }
    int v = 0;
    socklen_t vl = sizeof(v);
    if (getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, &vl) == 0) out.push_back(v);
  }
  closedir(d);
  return out;
}

TEST(TransportTest, SendBufferIsSetOnEveryTcpConnection) {
  // Sizes no autotuned buffer would have; Linux reports twice the value set
  // (socket(7)), both well under the default net.core.wmem_max (208 KiB).
  TransportOptions so, co;
  so.send_buffer_bytes = 44 << 10;
  co.send_buffer_bytes = 36 << 10;
  auto server = ServerSocket::Bind("tcp://127.0.0.1:0", so);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const std::string ep = (*server)->endpoint();
  const int port = std::atoi(ep.substr(ep.rfind(':') + 1).c_str());
  ASSERT_GT(port, 0) << ep;
  auto client = ClientSocket::Connect(ep, co);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto plain = ClientSocket::Connect(ep, TransportOptions{});
  ASSERT_TRUE(plain.ok());
  // A round trip on each: both connections are up on both sides.
  for (auto* c : {client->get(), plain->get()}) {
    std::vector<Frame> ping{Frame::Copy("x", 1)};
    ASSERT_TRUE(c->Send(ping).ok());
    std::string peer;
    Message msg;
    ASSERT_TRUE(*(*server)->Receive(&peer, &msg, milliseconds(5000)));
    std::vector<Frame> pong{Frame::Copy("y", 1)};
    ASSERT_TRUE((*server)->Send(peer, pong).ok());
    Message r;
    ASSERT_TRUE(*c->Receive(&r, milliseconds(5000)));
  }
  // The server's two accepted connections have its buffer.
  EXPECT_EQ(SendBuffersOfPort(port, true),
            (std::vector<int>{2 * (44 << 10), 2 * (44 << 10)}));
  // Of the two client connections, one has 36 KiB and the other, made
  // without the option, the OS's own (not 36 KiB).
  std::vector<int> clients = SendBuffersOfPort(port, false);
  ASSERT_EQ(clients.size(), 2u);
  EXPECT_EQ(std::count(clients.begin(), clients.end(), 2 * (36 << 10)), 1);

  // Out of range: refused before any socket is made, naming the option.
  for (int bad : {-1, 100, 4095, (64 << 20) + 1}) {
    TransportOptions b;
    b.send_buffer_bytes = bad;
    auto c = ClientSocket::Connect(ep, b);
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument)
        << c.status().ToString();
    EXPECT_NE(c.status().ToString().find("send_buffer_bytes"),
              std::string::npos);
    EXPECT_FALSE(ServerSocket::Bind("tcp://127.0.0.1:0", b).ok()) << bad;
  }
  EXPECT_TRUE(CheckSendBufferKb(0, "x").ok());
  EXPECT_TRUE(CheckSendBufferKb(4, "x").ok());
  EXPECT_TRUE(CheckSendBufferKb(65536, "x").ok());
  for (int64_t bad :
       {int64_t{-4}, int64_t{3}, int64_t{65537}, int64_t{1} << 40}) {
    Status s = CheckSendBufferKb(bad, "--send_buffer_kb");
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(
        s.ToString().find(
            "--send_buffer_kb must be 0 (the OS default) or 4 to 65536 KiB"),
        std::string::npos)
        << s.ToString();
  }
}

TEST(TransportTest, ReceiveTimesOut) {
  auto server = ServerSocket::Bind("tcp://127.0.0.1:*", {});
  ASSERT_TRUE(server.ok());
  std::string peer;
  Message msg;
  auto got = (*server)->Receive(&peer, &msg, milliseconds(20));
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(*got);
}

TEST(TransportTest, OversizeMessageIsFlagged) {
  TransportOptions o;
  o.max_message_bytes = 1000;
  o.max_frames = 4;
  auto server = ServerSocket::Bind("tcp://127.0.0.1:0", o);
  ASSERT_TRUE(server.ok());
  auto client = ClientSocket::Connect((*server)->endpoint(), {});
  ASSERT_TRUE(client.ok());
  std::vector<uint8_t> blob(2000, 1);
  std::vector<Frame> f{Frame::Copy("h", 1),
                       Frame::Copy(blob.data(), blob.size())};
  ASSERT_TRUE((*client)->Send(f).ok());
  std::vector<Frame> many;
  for (int i = 0; i < 10; ++i) many.push_back(Frame::Copy("x", 1));
  ASSERT_TRUE((*client)->Send(many).ok());
  std::string peer;
  Message msg;
  ASSERT_TRUE(*(*server)->Receive(&peer, &msg, milliseconds(5000)));
  EXPECT_EQ(msg.error.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(msg.frames.size(), 1u);
  ASSERT_TRUE(*(*server)->Receive(&peer, &msg, milliseconds(5000)));
  EXPECT_EQ(msg.error.code(), StatusCode::kResourceExhausted);
}

TEST(TransportTest, InprocWithSharedContextAndPollAny) {
  TransportOptions o;
  o.context = Context::Create();
  auto s1 = ServerSocket::Bind("inproc://a", o);
  auto s2 = ServerSocket::Bind("inproc://b", o);
  ASSERT_TRUE(s1.ok() && s2.ok());
  auto c1 = ClientSocket::Connect("inproc://a", o);
  auto c2 = ClientSocket::Connect("inproc://b", o);
  ASSERT_TRUE(c1.ok() && c2.ok());
  std::vector<Frame> f{Frame::Copy("ping", 4)};
  ASSERT_TRUE((*c2)->Send(f).ok());
  std::string peer;
  Message msg;
  ASSERT_TRUE(*(*s2)->Receive(&peer, &msg, milliseconds(2000)));
  std::vector<Frame> back{Frame::Copy("pong", 4)};
  ASSERT_TRUE((*s2)->Send(peer, back).ok());
  auto idx = ClientSocket::PollAny({c1->get(), c2->get()}, milliseconds(2000));
  ASSERT_TRUE(idx.ok());
  EXPECT_EQ(*idx, 1);
  auto none = ClientSocket::PollAny({c1->get()}, milliseconds(10));
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, -1);
}

TEST(TransportTest, PollAnyNeverSleepsOnAQueuedReply) {
  // PollAny waits in one poll() on the sockets' file descriptors once they
  // were read dry; a reply that arrives before, during or after that wait,
  // or while a send of the client takes ZeroMQ's signal, must end it at once.
  auto server = ServerSocket::Bind("tcp://127.0.0.1:0", {});
  ASSERT_TRUE(server.ok());
  std::atomic<bool> stop{false};
  std::thread echo([&] {
    std::string peer;
    Message msg;
    int n = 0;
    while (!stop) {
      auto got = (*server)->Receive(&peer, &msg, milliseconds(10));
      if (!got.ok() || !*got) continue;
      if (++n % 4 == 0) std::this_thread::sleep_for(milliseconds(1));
      std::vector<Frame> back{Frame::Copy("pong", 4)};
      (void)(*server)->Send(peer, back);
    }
  });
  auto c = ClientSocket::Connect((*server)->endpoint(), {});
  ASSERT_TRUE(c.ok());
  const auto start = std::chrono::steady_clock::now();
  int sent = 0, received = 0;
  Message r;
  for (int i = 0; i < 300; ++i) {
    // Two requests every third round: a send while a reply may be queued.
    for (int k = 0; k < (i % 3 == 0 ? 2 : 1); ++k) {
      std::vector<Frame> f{Frame::Copy("ping", 4)};
      ASSERT_TRUE((*c)->Send(f).ok());
      ++sent;
    }
    while (received < sent) {
      auto got = (*c)->Receive(&r, milliseconds(0));
      ASSERT_TRUE(got.ok());
      if (*got) {
        ++received;
        continue;
      }
      auto wait_start = std::chrono::steady_clock::now();
      auto idx = ClientSocket::PollAny({c->get()}, milliseconds(3000));
      ASSERT_TRUE(idx.ok());
      (void)(*c)->TakeConnects();
      ASSERT_LT(std::chrono::steady_clock::now() - wait_start,
                milliseconds(2000))
          << "slept with a reply queued, round " << i;
    }
  }
  // A reply queued, then a send (ZeroMQ takes the reply's signal while
  // sending), then the wait.
  std::vector<Frame> a{Frame::Copy("ping", 4)};
  ASSERT_TRUE((*c)->Send(a).ok());
  std::this_thread::sleep_for(milliseconds(50));
  std::vector<Frame> b{Frame::Copy("ping", 4)};
  ASSERT_TRUE((*c)->Send(b).ok());
  sent += 2;
  const auto wait_start = std::chrono::steady_clock::now();
  auto idx = ClientSocket::PollAny({c->get()}, milliseconds(3000));
  ASSERT_TRUE(idx.ok());
  EXPECT_EQ(*idx, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - wait_start, milliseconds(2000));
  while (received < sent) {
    auto got = (*c)->Receive(&r, milliseconds(2000));
    ASSERT_TRUE(got.ok() && *got);
    ++received;
  }
  stop = true;
  echo.join();
  EXPECT_EQ(received, sent);
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(20000));
}

TEST(TransportTest, PollAnyInterruptedBySignalIsNotAnError) {
  // A handler without SA_RESTART: the signal interrupts zmq_poll (EINTR),
  // as Ctrl-C does in a Python process blocked in a pull.
  struct sigaction sa = {}, old = {};
  sa.sa_handler = [](int) {};
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR1, &sa, &old), 0);
  auto server = ServerSocket::Bind("tcp://127.0.0.1:0", {});
  ASSERT_TRUE(server.ok());
  auto c = ClientSocket::Connect((*server)->endpoint(), {});
  ASSERT_TRUE(c.ok());
  // Drain the connection events of the socket monitor first.
  for (int i = 0; i < 50; ++i) {
    auto r = ClientSocket::PollAny({c->get()}, milliseconds(20));
    ASSERT_TRUE(r.ok());
    (void)(*c)->TakeConnects();
    if (*r == -1) break;
  }
  const pthread_t self = pthread_self();
  std::thread killer([self] {
    std::this_thread::sleep_for(milliseconds(100));
    pthread_kill(self, SIGUSR1);
  });
  auto start = std::chrono::steady_clock::now();
  auto got = ClientSocket::PollAny({c->get()}, milliseconds(3000));
  killer.join();
  sigaction(SIGUSR1, &old, nullptr);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, -1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(2500));
}

TEST(TransportTest, BindConflictIsAnError) {
  auto a = ServerSocket::Bind("tcp://127.0.0.1:0", {});
  ASSERT_TRUE(a.ok());
  auto b = ServerSocket::Bind((*a)->endpoint(), {});
  EXPECT_FALSE(b.ok());
  auto bad = ServerSocket::Bind("nonsense://x", {});
  EXPECT_FALSE(bad.ok());
}

TEST(TransportTest, CurveKeyPair) {
  std::string pub, sec;
  Status s = GenerateCurveKeyPair(&pub, &sec);
  if (s.code() == StatusCode::kUnimplemented) GTEST_SKIP() << s.ToString();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(pub.size(), 40u);
  EXPECT_EQ(sec.size(), 40u);
}

// Receives on `server` until a message arrives or `ms` pass, collecting
// security events on the way.
bool ReceiveFor(ServerSocket& server, int ms, std::vector<std::string>* events,
                Message* msg) {
  const auto end = std::chrono::steady_clock::now() + milliseconds(ms);
  std::string peer;
  while (std::chrono::steady_clock::now() < end) {
    auto got = server.Receive(&peer, msg, milliseconds(50));
    for (auto& e : server.TakeSecurityEvents()) events->push_back(e);
    if (got.ok() && *got) return true;
  }
  return false;
}

bool Contains(const std::vector<std::string>& v, const std::string& what) {
  for (const auto& s : v)
    if (s.find(what) != std::string::npos) return true;
  return false;
}

TEST(TransportTest, CurveAllowsListedClientsAndRefusesOthers) {
  std::string spub, ssec, cpub, csec, opub, osec;
  Status s = GenerateCurveKeyPair(&spub, &ssec);
  if (s.code() == StatusCode::kUnimplemented) GTEST_SKIP() << s.ToString();
  ASSERT_TRUE(GenerateCurveKeyPair(&cpub, &csec).ok());
  ASSERT_TRUE(GenerateCurveKeyPair(&opub, &osec).ok());
  auto derived = DeriveCurvePublicKey(csec);
  ASSERT_TRUE(derived.ok());
  EXPECT_EQ(*derived, cpub);

  auto ctx = Context::Create(1);
  TransportOptions so;
  so.context = ctx;
  so.curve_secret_key = ssec;
  so.curve_allowed_client_keys = {cpub};
  auto server = ServerSocket::Bind("tcp://127.0.0.1:0", so);
  ASSERT_TRUE(server.ok()) << server.status().ToString();

  auto send_from = [&](TransportOptions co) {
    co.context = ctx;
    auto c = ClientSocket::Connect((*server)->endpoint(), co);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    std::vector<Frame> f{Frame::Copy("hello", 5)};
    // Whether the send is queued depends on how far the (possibly refused)
    // handshake got; what is checked is what arrives at the server.
    (void)(*c)->Send(f);
    return std::move(c).value();
  };
  std::vector<std::string> events;
  Message msg;
  {
    // The allowed key (public key derived from the secret one).
    TransportOptions co;
    co.curve_server_key = spub;
    co.curve_secret_key = csec;
    auto c = send_from(co);
    ASSERT_TRUE(ReceiveFor(**server, 5000, &events, &msg));
    EXPECT_EQ(msg.frames[0].size, 5u);
  }
  {
    // A key pair the server does not know.
    TransportOptions co;
    co.curve_server_key = spub;
    co.curve_public_key = opub;
    co.curve_secret_key = osec;
    auto c = send_from(co);
    EXPECT_FALSE(ReceiveFor(**server, 700, &events, &msg));
    EXPECT_TRUE(Contains(events, opub + " from 127.0.0.1 refused"))
        << events.size();
  }
  {
    // The right client key but the wrong server key.
    TransportOptions co;
    co.curve_server_key = opub;
    co.curve_secret_key = csec;
    auto c = send_from(co);
    EXPECT_FALSE(ReceiveFor(**server, 700, &events, &msg));
  }
  {
    // No encryption at all.
    auto c = send_from(TransportOptions());
    EXPECT_FALSE(ReceiveFor(**server, 700, &events, &msg));
    EXPECT_TRUE(Contains(events, "handshake failed")) << events.size();
  }
  EXPECT_TRUE(LoadCurveKey(spub).ok());
  EXPECT_FALSE(LoadCurveKey("not-a-key").ok());
  TransportOptions bad = so;
  bad.curve_allowed_client_keys = {"short"};
  EXPECT_EQ(ServerSocket::Bind("tcp://127.0.0.1:0", bad).status().code(),
            StatusCode::kInvalidArgument);
}

// Messages already queued are taken without a poll() per message; what
// arrives must be the same as with one: every message whole, in order, the
// limits still checked, and an empty queue still waits for the timeout.
TEST(TransportTest, QueuedBurstKeepsOrderFramesAndLimits) {
  TransportOptions o;
  o.max_message_bytes = 1000;
  auto server = ServerSocket::Bind("tcp://127.0.0.1:0", o);
  ASSERT_TRUE(server.ok());
  auto client = ClientSocket::Connect((*server)->endpoint(), {});
  ASSERT_TRUE(client.ok());
  constexpr int kMessages = 700;  // more than one monitor period
  constexpr int kOversize = 333;
  std::vector<uint8_t> blob(2000, 9);
  for (int i = 0; i < kMessages; ++i) {
    uint32_t v = static_cast<uint32_t>(i);
    std::vector<Frame> f{Frame::Copy(&v, sizeof(v)),
                         Frame::Copy(&v, sizeof(v))};
    if (i == kOversize) f[1] = Frame::Copy(blob.data(), blob.size());
    ASSERT_TRUE((*client)->Send(f).ok());
  }
  std::string peer;
  Message msg;
  for (int i = 0; i < kMessages; ++i) {
    auto got = (*server)->Receive(&peer, &msg, milliseconds(5000));
    ASSERT_TRUE(got.ok() && *got) << i;
    uint32_t v;
    ASSERT_EQ(msg.frames[0].size, sizeof(v));
    std::memcpy(&v, msg.frames[0].data, sizeof(v));
    EXPECT_EQ(v, static_cast<uint32_t>(i));
    if (i == kOversize) {
      EXPECT_EQ(msg.error.code(), StatusCode::kResourceExhausted);
      EXPECT_EQ(msg.frames.size(), 1u);
    } else {
      EXPECT_TRUE(msg.error.ok()) << i;
      ASSERT_EQ(msg.frames.size(), 2u);
      std::memcpy(&v, msg.frames[1].data, sizeof(v));
      EXPECT_EQ(v, static_cast<uint32_t>(i));
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto got = (*server)->Receive(&peer, &msg, milliseconds(50));
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(*got);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, milliseconds(45));
}

TEST(TransportTest, AllocatorTuningRejectsBadThresholds) {
  AllocatorTuning bad;
  bad.mmap_threshold_bytes = -1;
  EXPECT_EQ(TuneAllocatorForMessages(bad).code(), StatusCode::kInvalidArgument);
  bad = AllocatorTuning();
  bad.mmap_threshold_bytes = (int64_t{32} << 20) + 1;
  EXPECT_EQ(TuneAllocatorForMessages(bad).code(), StatusCode::kInvalidArgument);
  bad = AllocatorTuning();
  bad.trim_threshold_bytes = int64_t{1} << 40;
  EXPECT_EQ(TuneAllocatorForMessages(bad).code(), StatusCode::kInvalidArgument);
  Status s = TuneAllocatorForMessages();
  if (s.code() == StatusCode::kUnimplemented) GTEST_SKIP() << s.ToString();
  EXPECT_TRUE(s.ok()) << s.ToString();
}

}  // namespace
}  // namespace asyncps
