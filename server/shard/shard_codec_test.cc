// Compressed pushes and pulls through the compression library.
#include <gtest/gtest.h>

#include <cmath>

#include "compression/codec.h"
#include "server/shard/shard.h"
#include "server/testing/test_util.h"

namespace asyncps::server {
namespace {

using testing::ShardHarness;
using testing::SmallLayout;
using testing::SmallModel;

ByteView Encode(const std::string& spec, const std::vector<float>& x,
                uint8_t* codec_id) {
  auto s = compression::CodecSpec::Parse(spec);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  auto codec = compression::CreateCodec(*s);
  EXPECT_TRUE(codec.ok());
  std::vector<uint8_t> payload;
  EXPECT_TRUE((*codec)->Encode(x.data(), x.size(), 1, &payload).ok());
  *codec_id = static_cast<uint8_t>((*codec)->id());
  BufferPtr b = Buffer::FromVector(std::move(payload));
  return ByteView{b->data(), b->size(), b};
}

RequestHeader CompressedPush(uint32_t chunk, size_t n, const ByteView& f,
                             uint8_t codec) {
  RequestHeader r = ShardHarness::Push(0, 0, {chunk}, {f});
  r.chunks[0].num_elems = n;
  r.chunks[0].codec = codec;
  return r;
}

ShardOptions Opts() {
  ShardOptions o;
  o.num_shards = 2;
  o.num_workers = 1;
  o.optimizer.lr = 0.5f;
  return o;
}

TEST(ShardCodecTest, Fp16PushDecodesExactValues) {
  ShardHarness h(Opts());
  ASSERT_TRUE(h.Call(ShardHarness::Register(0, SmallModel(), SmallLayout(2)))
                  .status.ok());
  std::vector<float> g(10, 0.5f);  // exact in fp16
  uint8_t id = 0;
  ByteView f = Encode("fp16", g, &id);
  ReplyHeader r = h.Call(CompressedPush(4, 10, f, id), {f});
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  for (float v : *h.shard->weights(4)) EXPECT_EQ(v, 0.25f - 0.5f * 0.5f);
  // Accounting: 10 elements are 40 raw bytes; on the wire a 24-byte payload
  // header plus 2 bytes per element.
  EXPECT_EQ(h.shard->counters().bytes_in_raw, 40u);
  EXPECT_EQ(h.shard->counters().bytes_in, f.size);
  EXPECT_NE(h.shard->StatsJson().find("\"bytes_in_raw\":40"),
            std::string::npos);
}

TEST(ShardCodecTest, TopKScattersExactly) {
  ShardHarness h(Opts());
  ASSERT_TRUE(h.Call(ShardHarness::Register(0, SmallModel(), SmallLayout(2)))
                  .status.ok());
  std::vector<float> g(16, 0.0f);
  g[3] = 2.0f;
  g[9] = -4.0f;
  const std::vector<float> w0 = *h.shard->weights(0);
  uint8_t id = 0;
  ByteView f = Encode("topk:ratio=0.125,min_elems=0", g, &id);
  ReplyHeader r = h.Call(CompressedPush(0, 16, f, id), {f});
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  const std::vector<float>& w = *h.shard->weights(0);
  for (size_t i = 0; i < 16; ++i) EXPECT_EQ(w[i], w0[i] - 0.5f * g[i]) << i;
}

// DC-ASGD with a sparse push: the payload is densified and compensated
// like a dense gradient (the zeros stay zero: g * g * ... is 0 there).
TEST(ShardCodecTest, TopKPushIsDelayCompensated) {
  ShardOptions o = Opts();
  o.num_workers = 2;
  o.delay_compensation.lambda = 0.5f;
  ShardHarness h(o);
  ASSERT_TRUE(h.Call(ShardHarness::Register(0, SmallModel(), SmallLayout(2)))
                  .status.ok());
  RequestHeader pull = ShardHarness::Pull(0, 0);
  pull.incarnation = 42;  // ShardHarness::Push's
  ASSERT_TRUE(h.Call(pull).status.ok());
  const std::vector<float> read = *h.shard->weights(0);
  // Another worker moves chunk 0 by a dense push.
  std::vector<float> other(16);
  for (size_t i = 0; i < 16; ++i) other[i] = 0.25f * static_cast<float>(i);
  ByteView fo = testing::Floats(other);
  RequestHeader push1 = ShardHarness::Push(1, 0, {0}, {fo});
  ASSERT_TRUE(h.Call(push1, {fo}).status.ok());
  const std::vector<float> now = *h.shard->weights(0);
  std::vector<float> g(16, 0.0f);
  g[3] = 2.0f;
  g[9] = -4.0f;
  uint8_t id = 0;
  ByteView f = Encode("topk:ratio=0.125,min_elems=0", g, &id);
  ReplyHeader r = h.Call(CompressedPush(0, 16, f, id), {f});
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  const std::vector<float>& w = *h.shard->weights(0);
  for (size_t i = 0; i < 16; ++i) {
    const double gi = g[i];
    const double want =
        now[i] - 0.5 * (gi + 0.5 * gi * gi * (double{now[i]} - read[i]));
    EXPECT_NEAR(w[i], want, 1e-6) << i;
  }
  EXPECT_NE(w[9], now[9] - 0.5f * g[9]);  // the correction is not zero
  EXPECT_EQ(h.shard->counters().dc_compensated, 1u);
}

TEST(ShardCodecTest, CorruptPayloadRejectedStateUntouched) {
  ShardHarness h(Opts());
  ASSERT_TRUE(h.Call(ShardHarness::Register(0, SmallModel(), SmallLayout(2)))
                  .status.ok());
  auto before = h.AllWeights();
  std::vector<float> g(10, 0.5f);
  uint8_t id = 0;
  ByteView f = Encode("int8:bucket=8", g, &id);
  // Truncate the payload: header and frame sizes agree, the codec refuses.
  ByteView cut{f.data, f.size - 3, f.owner};
  ReplyHeader r = h.Call(CompressedPush(4, 10, cut, id), {cut});
  EXPECT_FALSE(r.status.ok());
  EXPECT_EQ(h.shard->counters()
                .rejected[static_cast<size_t>(RejectReason::kBadCodec)],
            1u);
  EXPECT_EQ(h.AllWeights(), before);
}

TEST(ShardCodecTest, CompressedPull) {
  ShardHarness h(Opts());
  ASSERT_TRUE(h.Call(ShardHarness::Register(0, SmallModel(), SmallLayout(2)))
                  .status.ok());
  RequestHeader p = ShardHarness::Pull(0, 0, {4});
  p.pull_codec = "bf16";
  auto out = h.Send(p);
  ASSERT_EQ(out.size(), 1u);
  ASSERT_TRUE(out[0].header.status.ok()) << out[0].header.status.ToString();
  const ChunkRef& ref = out[0].header.chunks[0];
  EXPECT_EQ(ref.codec, static_cast<uint8_t>(compression::CodecId::kBf16));
  std::vector<float> w(10);
  ASSERT_TRUE(
      compression::CodecForId(compression::CodecId::kBf16)
          .Decode(out[0].frames[0].data, out[0].frames[0].size, 10, w.data())
          .ok());
  EXPECT_EQ(w, std::vector<float>(10, 0.25f));
  p.pull_codec = "nonsense";
  EXPECT_FALSE(h.Call(p).status.ok());
}

}  // namespace
}  // namespace asyncps::server

namespace asyncps::server {
namespace {

TEST(ShardCodecTest, SparsePullSendsTheChangeSinceTheWorkersLastPull) {
  ShardHarness h(Opts());
  ASSERT_TRUE(h.Call(ShardHarness::Register(0, SmallModel(), SmallLayout(2)))
                  .status.ok());
  std::vector<float> copy(10, -1.0f);  // the worker's copy of chunk 4
  auto pull = [&](uint64_t base, uint8_t* codec) {
    RequestHeader p = ShardHarness::Pull(0, 0, {4});
    p.pull_codec = "topk:ratio=0.3";
    p.pull_base_seq = base;
    auto out = h.Send(p);
    EXPECT_EQ(out.size(), 1u);
    EXPECT_TRUE(out[0].header.status.ok()) << out[0].header.status.ToString();
    const ChunkRef& ref = out[0].header.chunks[0];
    const ByteView& f = out[0].frames[0];
    *codec = ref.codec;
    if (ref.codec == 0) {
      std::memcpy(copy.data(), f.data, f.size);
    } else {
      EXPECT_TRUE(
          compression::CodecForId(static_cast<compression::CodecId>(ref.codec))
              .DecodeAdd(f.data, f.size, 10, 1.0f, copy.data())
              .ok());
    }
    return out[0].header.pull_seq;
  };
  uint8_t codec = 99;
  uint64_t seq = pull(0, &codec);  // first pull: whole weights
  EXPECT_EQ(codec, 0);
  EXPECT_NE(seq, 0u);
  EXPECT_EQ(copy, *h.shard->weights(4));

  std::vector<float> g(10);
  for (int i = 0; i < 10; ++i) g[i] = 0.1f * i;
  auto gf = testing::Floats(g);
  ASSERT_TRUE(h.Call(ShardHarness::Push(0, 0, {4}, {gf}), {gf}).status.ok());
  const std::vector<float> w = *h.shard->weights(4);
  seq = pull(seq, &codec);  // the 3 largest changes: elements 7, 8, 9
  EXPECT_EQ(codec, static_cast<uint8_t>(compression::CodecId::kTopK));
  EXPECT_EQ(copy[9], w[9]);
  EXPECT_EQ(copy[7], w[7]);
  EXPECT_NE(copy[6], w[6]);
  // Without new pushes the rest of the change follows, exactly.
  for (int i = 0; i < 3; ++i) seq = pull(seq, &codec);
  EXPECT_EQ(copy, w);

  // A reply the worker never applied (stale base): whole weights again.
  std::fill(copy.begin(), copy.end(), -7.0f);
  pull(seq - 1, &codec);
  EXPECT_EQ(codec, 0);
  EXPECT_EQ(copy, w);

  // Observers hold no replica: sparse pull codecs need a worker rank.
  RequestHeader obs = ShardHarness::Pull(-1, 0, {4});
  obs.pull_codec = "topk:ratio=0.3";
  EXPECT_EQ(h.Call(obs).status.code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace asyncps::server
