// Network fuzz test: a real ps_server (shard 0 of 2) receives random and
// mutated messages and must neither crash nor change its state; afterwards
// a valid pull returns bitwise the weights it returned before.
//
// Message classes (each an invalid request by construction; mutated headers
// that still decode are never sent, so no fuzz message can be a legal
// update): garbage frames, truncated headers, bit-flipped headers, and
// pushes with exactly one inconsistency (wrong frame index, byte_size
// mismatch, huge num_elems, chunk id out of range, another shard's chunk,
// NaN/Inf payload, wrong protocol version, rank out of range, unknown codec,
// a payload of another codec, truncated codec payload, missing frame),
// pulls of unknown chunks / bad pull codecs / ranks out of range, and
// mismatching re-registrations.
//
// Environment: ASYNCPS_NET_FUZZ_MESSAGES (default 20000),
// ASYNCPS_NET_FUZZ_SEED (default 1). tests/fuzz/net_fuzz.sh runs the
// 1,000,000-message version.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/layout.h"
#include "common/transport.h"
#include "common/wire.h"
#include "compression/codec.h"
#include "tests/server_integration/test_client.h"
#include "tests/util/process.h"

namespace asyncps::testing {
namespace {

using std::chrono::milliseconds;

int64_t EnvInt(const char* name, int64_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoll(v) : dflt;
}

std::vector<TensorSpec> Model() {
  std::vector<TensorSpec> t(3);
  t[0].name = "w0";
  t[0].shape = {40, 25};
  t[0].init = InitKind::kUniform;
  t[0].init_param = 0.5f;
  t[0].seed = 7;
  t[1].name = "b0";
  t[1].shape = {300};
  t[1].init = InitKind::kNormal;
  t[1].init_param = 0.1f;
  t[1].seed = 8;
  t[2].name = "w1";
  t[2].shape = {10};
  t[2].init = InitKind::kConstant;
  t[2].init_param = 0.25f;
  return t;
}

LayoutOptions LayoutOpts() {
  LayoutOptions o;
  o.chunk_elems = 256;
  o.min_chunk_elems = 64;
  o.num_shards = 2;
  return o;
}

class Fuzzer {
 public:
  Fuzzer(const Layout& layout, uint64_t seed) : layout_(layout), rng_(seed) {
    mine_ = layout.shard_chunks(0);
    other_ = layout.shard_chunks(1);
  }

  // Fills `frames` with one fuzz message.
  void Next(std::vector<Frame>* frames) {
    frames->clear();
    ++id_;
    switch (Uniform(0, 9)) {
      case 0:
        return Garbage(frames);
      case 1:
        return Truncated(frames);
      case 2:
      case 3:
        return BitFlipped(frames);
      case 4:
        return BadPull(frames);
      case 5:
        return BadRegister(frames);
      default:
        return BadPush(frames);
    }
  }
  uint64_t skipped_valid() const { return skipped_valid_; }
  const std::vector<uint64_t>& push_kinds() const { return push_kinds_; }

 private:
  int64_t Uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  std::vector<uint8_t> RandomBytes(size_t n) {
    std::vector<uint8_t> b(n);
    for (auto& x : b) x = static_cast<uint8_t>(rng_());
    return b;
  }
  void Garbage(std::vector<Frame>* f) {
    const int n = static_cast<int>(Uniform(1, 4));
    for (int i = 0; i < n; ++i)
      f->push_back(Frame::Owned(RandomBytes(Uniform(0, 300))));
  }

  // A valid push of 1-3 of this shard's chunks (raw fp32 or a codec).
  RequestHeader ValidPush(std::vector<std::vector<uint8_t>>* payloads) {
    RequestHeader h;
    h.id = id_;
    h.kind = RequestKind::kPush;
    h.rank = static_cast<int32_t>(Uniform(0, 1));
    h.incarnation = 99;
    h.clock = Uniform(0, 5);
    const int n = static_cast<int>(Uniform(1, 3));
    for (int i = 0; i < n; ++i) {
      const uint32_t id = mine_[Uniform(0, mine_.size() - 1)];
      const ChunkSpec& c = layout_.chunks()[id];
      std::vector<float> g(c.num_elems);
      for (auto& x : g) x = std::normal_distribution<float>(0, 1)(rng_);
      ChunkRef r;
      r.chunk = id;
      r.frame = static_cast<uint32_t>(payloads->size() + 1);
      r.num_elems = c.num_elems;
      const int codec =
          static_cast<int>(Uniform(0, 3)) == 0
              ? static_cast<int>(Uniform(1, compression::kNumCodecs - 1))
              : 0;
      std::vector<uint8_t> p;
      if (codec == 0) {
        p.resize(g.size() * 4);
        std::memcpy(p.data(), g.data(), p.size());
      } else {
        Status s =
            compression::CodecForId(static_cast<compression::CodecId>(codec))
                .Encode(g.data(), g.size(), rng_(), &p);
        if (!s.ok()) {
          p.resize(g.size() * 4);
          std::memcpy(p.data(), g.data(), p.size());
          r.codec = 0;
        } else {
          r.codec = static_cast<uint8_t>(codec);
        }
      }
      r.byte_size = p.size();
      h.chunks.push_back(r);
      payloads->push_back(std::move(p));
    }
    return h;
  }

  void Emit(const RequestHeader& h, std::vector<std::vector<uint8_t>>& payloads,
            std::vector<Frame>* f) {
    f->push_back(Frame::Owned(EncodeRequest(h)));
    for (auto& p : payloads) f->push_back(Frame::Owned(std::move(p)));
  }

  void Truncated(std::vector<Frame>* f) {
    std::vector<std::vector<uint8_t>> payloads;
    RequestHeader h = ValidPush(&payloads);
    std::vector<uint8_t> bytes = EncodeRequest(h);
    bytes.resize(Uniform(0, bytes.size() - 1));
    f->push_back(Frame::Owned(std::move(bytes)));
    for (auto& p : payloads) f->push_back(Frame::Owned(std::move(p)));
  }

  void BitFlipped(std::vector<Frame>* f) {
    std::vector<std::vector<uint8_t>> payloads;
    RequestHeader h = ValidPush(&payloads);
    if (Uniform(0, 2) == 0) h.kind = static_cast<RequestKind>(Uniform(0, 7));
    std::vector<uint8_t> bytes = EncodeRequest(h);
    const int flips = static_cast<int>(Uniform(1, 8));
    for (int i = 0; i < flips; ++i) {
      const size_t at = Uniform(0, bytes.size() - 1);
      bytes[at] ^= static_cast<uint8_t>(1u << Uniform(0, 7));
    }
    RequestHeader decoded;
    if (DecodeRequest(bytes.data(), bytes.size(), DecodeLimits(), &decoded)
            .ok()) {
      // Still a well-formed request (maybe a legal push, a checkpoint or a
      // shutdown): never sent, so the state may not legitimately change.
      ++skipped_valid_;
      return Garbage(f);
    }
    f->push_back(Frame::Owned(std::move(bytes)));
    for (auto& p : payloads) f->push_back(Frame::Owned(std::move(p)));
  }

  void BadPull(std::vector<Frame>* f) {
    RequestHeader h;
    h.id = id_;
    h.kind = RequestKind::kPull;
    h.incarnation = 99;
    switch (Uniform(0, 3)) {
      case 0:  // unknown or foreign chunk ids
        h.rank = -1;
        h.pull_chunks = {static_cast<uint32_t>(
            Uniform(0, 1) ? other_[Uniform(0, other_.size() - 1)]
                          : Uniform(layout_.chunks().size(), UINT32_MAX))};
        break;
      case 1:  // bad pull codec
        h.rank = -1;
        h.pull_codec = Uniform(0, 1) ? "topk:ratio=7" : "nonsense";
        break;
      case 2:  // rank out of range
        h.rank = static_cast<int32_t>(Uniform(2, INT32_MAX));
        h.clock = Uniform(-5, 1 << 30);
        break;
      default:  // a negative clock from a rank out of range
        h.rank = static_cast<int32_t>(Uniform(INT32_MIN, -2));
        break;
    }
    f->push_back(Frame::Owned(EncodeRequest(h)));
  }

  void BadRegister(std::vector<Frame>* f) {
    RequestHeader h;
    h.id = id_;
    h.kind = RequestKind::kRegister;
    h.rank = 0;
    h.tensors = Model();
    h.layout = LayoutOpts();
    switch (Uniform(0, 3)) {
      case 0:
        h.tensors[Uniform(0, 2)].shape[0] += Uniform(1, 1000);
        break;
      case 1:
        h.tensors.pop_back();
        break;
      case 2:
        h.layout.num_shards = static_cast<int>(Uniform(3, 100));
        break;
      default:
        h.tensors[Uniform(0, 2)].seed += 1;
        break;
    }
    f->push_back(Frame::Owned(EncodeRequest(h)));
  }

  void BadPush(std::vector<Frame>* f) {
    std::vector<std::vector<uint8_t>> payloads;
    RequestHeader h = ValidPush(&payloads);
    const size_t i = Uniform(0, h.chunks.size() - 1);
    ChunkRef& r = h.chunks[i];
    const int kind = static_cast<int>(Uniform(0, 11));
    if (push_kinds_.size() < 12) push_kinds_.resize(12);
    ++push_kinds_[kind];
    switch (kind) {
      case 0:  // frame index 0 or past the last frame
        r.frame = Uniform(0, 1) ? 0
                                : static_cast<uint32_t>(
                                      Uniform(payloads.size() + 1, UINT32_MAX));
        break;
      case 1: {  // byte_size disagrees with the frame
        int64_t d = Uniform(1, 1 << 20);
        r.byte_size = Uniform(0, 1) || r.byte_size < static_cast<uint64_t>(d)
                          ? r.byte_size + d
                          : r.byte_size - d;
        break;
      }
      case 2:  // huge num_elems
        r.num_elems = static_cast<uint64_t>(Uniform(1LL << 32, INT64_MAX));
        break;
      case 3:  // chunk id out of range
        r.chunk =
            static_cast<uint32_t>(Uniform(layout_.chunks().size(), UINT32_MAX));
        break;
      case 4:  // another shard's chunk (same size so only ownership is wrong)
        r.chunk = other_[Uniform(0, other_.size() - 1)];
        break;
      case 5: {  // NaN or Inf in a raw fp32 payload
        const ChunkSpec& c = layout_.chunks()[r.chunk];
        std::vector<float> g(c.num_elems, 0.5f);
        g[Uniform(0, g.size() - 1)] =
            Uniform(0, 1) ? std::numeric_limits<float>::quiet_NaN()
                          : -std::numeric_limits<float>::infinity();
        payloads[i].resize(g.size() * 4);
        std::memcpy(payloads[i].data(), g.data(), payloads[i].size());
        r.codec = 0;
        r.byte_size = payloads[i].size();
        break;
      }
      case 6:  // wrong protocol version
        h.version = static_cast<uint16_t>(Uniform(2, 65535));
        if (Uniform(0, 1)) h.version = 0;
        break;
      case 7:  // rank out of range
        h.rank = static_cast<int32_t>(Uniform(0, 1) ? Uniform(2, INT32_MAX)
                                                    : Uniform(INT32_MIN, -1));
        break;
      case 8:  // unknown codec id
        r.codec = static_cast<uint8_t>(Uniform(compression::kNumCodecs, 255));
        break;
      case 9: {  // the payload of one codec labelled as another
        if (r.codec == 0) {
          r.codec =
              static_cast<uint8_t>(Uniform(1, compression::kNumCodecs - 1));
        } else {
          r.codec = static_cast<uint8_t>(
              (r.codec + Uniform(1, compression::kNumCodecs - 1)) %
              compression::kNumCodecs);
        }
        if (r.codec == 0) {
          // raw fp32 claimed: the size no longer matches num_elems * 4
          // unless the codec payload happened to be exactly that long.
          if (payloads[i].size() == r.num_elems * 4) payloads[i].pop_back();
          r.byte_size = payloads[i].size();
        }
        break;
      }
      case 10:  // truncated payload (byte_size follows the frame)
        payloads[i].resize(Uniform(0, payloads[i].size() - 1));
        r.byte_size = payloads[i].size();
        break;
      default:  // a referenced frame is missing
        payloads.pop_back();
        if (payloads.empty()) h.chunks[0].frame = 1;
        break;
    }
    Emit(h, payloads, f);
  }

  const Layout& layout_;
  std::mt19937_64 rng_;
  std::vector<uint32_t> mine_, other_;
  uint64_t id_ = 1000;
  uint64_t skipped_valid_ = 0;
  std::vector<uint64_t> push_kinds_;
};

// Everything observable about shard 0 that input may not change.
struct Snapshot {
  std::vector<std::vector<float>> weights;
  uint64_t version = 0;
  std::string pushes;
};

std::string Field(const std::string& json, const std::string& key) {
  const size_t at = json.find("\"" + key + "\":");
  if (at == std::string::npos) return "";
  const size_t b = at + key.size() + 3;
  return json.substr(b, json.find_first_of(",}", b) - b);
}

Snapshot Take(TestClient& observer) {
  Snapshot s;
  std::vector<ReplyHeader> replies;
  EXPECT_TRUE(observer.Pull(0, &s.weights, &replies).ok());
  ReplyHeader st;
  EXPECT_TRUE(observer.Simple(0, RequestKind::kStats, &st).ok());
  s.version = st.shard_version;
  s.pushes = Field(st.text, "pushes");
  return s;
}

TEST(NetFuzzTest, ServerSurvivesMalformedTrafficWithStateUnchanged) {
  const int64_t total = EnvInt("ASYNCPS_NET_FUZZ_MESSAGES", 20000);
  const uint64_t seed =
      static_cast<uint64_t>(EnvInt("ASYNCPS_NET_FUZZ_SEED", 1));
  TempDir dir;
  std::vector<ServerHandle> servers;
  for (int s = 0; s < 2; ++s) {
    auto h = StartServer(
        dir, "shard" + std::to_string(s),
        {"--shard_id=" + std::to_string(s), "--num_shards=2", "--num_workers=2",
         "--consistency=asp", "--optimizer=adam",
         "--db_path=" + dir.Sub("db" + std::to_string(s)), "--durable",
         "--checkpoint_every_s=0", "--max_message_bytes=4194304"});
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    servers.push_back(std::move(h).value());
  }
  std::vector<std::string> eps = {servers[0].endpoint, servers[1].endpoint};
  auto worker = TestClient::Connect(eps, 0, 1);
  ASSERT_TRUE(worker.ok());
  const Layout* layout = nullptr;
  ASSERT_TRUE((*worker)->Register(Model(), LayoutOpts(), &layout).ok());
  // A few real updates so the weights and Adam state are not initial.
  for (int step = 0; step < 3; ++step) {
    std::vector<std::vector<float>> g;
    for (const TensorSpec& t : Model())
      g.emplace_back(t.num_elements(), 0.01f * (step + 1));
    ASSERT_TRUE((*worker)->Push(step, g).ok());
  }
  // Snapshots are pulls by the worker at clock 0 (ASP: they never wait).
  auto& observer = worker;
  const Snapshot before = Take(**observer);
  ASSERT_GT(before.version, 0u);

  TransportOptions to;
  to.context = Context::Create(1);
  auto sock = ClientSocket::Connect(servers[0].endpoint, to);
  ASSERT_TRUE(sock.ok());
  Fuzzer fuzz((*observer)->layout(), seed);
  std::vector<Frame> frames;
  int64_t sent = 0, replies = 0, error_replies = 0;
  const auto t0 = std::chrono::steady_clock::now();
  Message msg;
  auto drain = [&](int64_t until_outstanding, int wait_ms) {
    const auto end = std::chrono::steady_clock::now() + milliseconds(wait_ms);
    while (sent - replies > until_outstanding &&
           std::chrono::steady_clock::now() < end) {
      auto got = (*sock)->Receive(&msg, milliseconds(100));
      if (!got.ok() || !*got) {
        if (!servers[0].process->Running()) return;
        continue;
      }
      ++replies;
      ReplyHeader r;
      if (DecodeReply(msg.frames[0].data, msg.frames[0].size, DecodeLimits(),
                      &r)
              .ok() &&
          !r.status.ok()) {
        ++error_replies;
      }
    }
  };
  while (sent < total) {
    if (sent % 1000 == 0 && !servers[0].process->Running()) break;  // died
    fuzz.Next(&frames);
    Status s = (*sock)->Send(frames);
    if (!s.ok()) {
      drain(0, 10000);
      continue;
    }
    ++sent;
    if (sent - replies >= 256) drain(64, 20000);
    if (sent % 100000 == 0) {
      std::fprintf(stderr, "net fuzz: %lld sent, %lld replies\n",
                   static_cast<long long>(sent),
                   static_cast<long long>(replies));
    }
  }
  drain(0, 20000);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  ASSERT_TRUE(servers[0].process->Running()) << servers[0].process->Log();
  EXPECT_EQ(replies, sent) << "every request gets exactly one reply";
  const Snapshot after = Take(**observer);
  EXPECT_EQ(after.version, before.version);
  EXPECT_EQ(after.pushes, before.pushes);
  ASSERT_EQ(after.weights.size(), before.weights.size());
  for (size_t t = 0; t < before.weights.size(); ++t) {
    ASSERT_EQ(after.weights[t].size(), before.weights[t].size());
    EXPECT_EQ(std::memcmp(after.weights[t].data(), before.weights[t].data(),
                          before.weights[t].size() * 4),
              0)
        << "tensor " << t << " changed";
  }
  // And it still applies a legal push.
  std::vector<std::vector<float>> g;
  for (const TensorSpec& t : Model()) g.emplace_back(t.num_elements(), 0.5f);
  ASSERT_TRUE((*worker)->Push(10, g).ok());
  EXPECT_GT(Take(**observer).version, before.version);
  ReplyHeader st;
  ASSERT_TRUE((*observer)->Simple(0, RequestKind::kStats, &st).ok());
  std::string kinds;
  for (uint64_t k : fuzz.push_kinds()) kinds += std::to_string(k) + " ";
  std::printf(
      "{\"net_fuzz\":{\"messages\":%lld,\"replies\":%lld,\"error_replies\":%"
      "lld,"
      "\"seconds\":%.1f,\"msgs_per_s\":%.0f,\"mutated_still_valid_skipped\":%"
      "llu,"
      "\"state_unchanged\":%s,\"rejected_total\":%s}}\n",
      static_cast<long long>(sent), static_cast<long long>(replies),
      static_cast<long long>(error_replies), secs, sent / secs,
      static_cast<unsigned long long>(fuzz.skipped_valid()),
      after.version == before.version ? "true" : "false",
      Field(st.text, "rejected_total").c_str());
  std::printf("push corruption kinds sent: %s\n", kinds.c_str());
  std::printf(
      "rejected by reason: %s\n",
      st.text.substr(st.text.find("\"rejected\":")).substr(0, 400).c_str());
}

}  // namespace
}  // namespace asyncps::testing
