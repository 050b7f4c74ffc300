// Damaged payloads: every truncation, random byte flips, huge declared
// counts, bad indices and scales. Decoders must fail cleanly, leave dst
// untouched and never touch memory outside the payload and dst (run under
// AddressSanitizer: payload copies are exactly sized heap blocks).
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>

#include "compression/codec.h"
#include "compression/internal/format.h"
#include "compression/test_util.h"

namespace asyncps::compression {
namespace {

using testing::Gaussian;

constexpr size_t kN = 1037;  // partial last bucket, odd count

std::vector<uint8_t> EncodeWith(const std::string& text, size_t n = kN) {
  auto spec = CodecSpec::Parse(text);
  EXPECT_TRUE(spec.ok());
  auto c = CreateCodec(*spec);
  auto x = Gaussian(n, 17);
  std::vector<uint8_t> p;
  EXPECT_TRUE((*c)->Encode(x.data(), n, 3, &p).ok());
  return p;
}

// Decodes a copy of p[0, len) in an exactly sized block; checks that failure
// leaves dst untouched. Returns the status.
Status TryDecode(const std::vector<uint8_t>& p, size_t len, size_t n,
                 CodecId id) {
  std::unique_ptr<uint8_t[]> copy(new uint8_t[len == 0 ? 1 : len]);
  if (len) std::memcpy(copy.get(), p.data(), len);
  std::vector<float> dst(n, 7.0f);
  Status v = CodecForId(id).Validate(copy.get(), len, n);
  Status st = CodecForId(id).DecodeAdd(copy.get(), len, n, 1.0f, dst.data());
  EXPECT_EQ(v.ok(), st.ok());
  Status st2 = CodecForId(id).Decode(copy.get(), len, n, dst.data());
  EXPECT_EQ(st.ok(), st2.ok());
  if (!st.ok()) {
    for (size_t i = 0; i < n; ++i) {
      if (dst[i] != 7.0f) {
        ADD_FAILURE() << "dst written on error at " << i;
        break;
      }
    }
  }
  return st;
}

const char* kSpecs[] = {"none",
                        "fp16",
                        "bf16",
                        "int8:bucket=64",
                        "qsgd:bucket=64",
                        "qsgd:levels=100,bucket=64",
                        "terngrad:bucket=64",
                        "sign:bucket=64",
                        "topk:ratio=0.05",
                        "randomk:ratio=0.05"};

class CorruptionTest : public ::testing::TestWithParam<const char*> {};

TEST_P(CorruptionTest, EveryTruncationFails) {
  auto p = EncodeWith(GetParam());
  const auto id = static_cast<CodecId>(p[1]);
  ASSERT_TRUE(TryDecode(p, p.size(), kN, id).ok());
  for (size_t len = 0; len < p.size(); ++len) {
    Status st = TryDecode(p, len, kN, id);
    ASSERT_FALSE(st.ok()) << "truncated to " << len;
    ASSERT_TRUE(st.code() == StatusCode::kCorruption ||
                st.code() == StatusCode::kInvalidArgument);
  }
  // Trailing garbage too.
  auto longer = p;
  longer.push_back(0);
  EXPECT_FALSE(TryDecode(longer, longer.size(), kN, id).ok());
}

TEST_P(CorruptionTest, RandomByteFlipsNeverCrash) {
  auto p = EncodeWith(GetParam());
  const auto id = static_cast<CodecId>(p[1]);
  std::mt19937 rng(1);
  int failures = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    auto q = p;
    const int flips = 1 + trial % 3;
    for (int f = 0; f < flips; ++f) {
      // Half the flips hit the header, where most checks live.
      const size_t pos =
          trial % 2 ? rng() % kPayloadHeaderBytes : rng() % q.size();
      q[pos] ^= static_cast<uint8_t>(1u << (rng() % 8));
    }
    failures += !TryDecode(q, q.size(), kN, id).ok();
  }
  EXPECT_GT(failures, 0);
}

TEST_P(CorruptionTest, WrongCountOrCodecIsRejected) {
  auto p = EncodeWith(GetParam());
  const auto id = static_cast<CodecId>(p[1]);
  EXPECT_EQ(TryDecode(p, p.size(), kN - 1, id).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(TryDecode(p, p.size(), kN + 1, id).code(),
            StatusCode::kInvalidArgument);
  const auto other = id == CodecId::kFp16 ? CodecId::kBf16 : CodecId::kFp16;
  EXPECT_EQ(TryDecode(p, p.size(), kN, other).code(),
            StatusCode::kInvalidArgument);
  // Huge declared count: does not match the caller's count.
  auto q = p;
  const uint32_t huge = 0xffffffffu;
  std::memcpy(q.data() + 4, &huge, 4);
  EXPECT_EQ(TryDecode(q, q.size(), kN, id).code(),
            StatusCode::kInvalidArgument);
  std::vector<float> small(4, 7.0f);
  if (!CodecForId(id).IsSparse()) {
    // Even if the caller's count agrees, a dense body cannot be that short.
    // (A sparse payload with k pairs is valid for any n > its indices.)
    Status st =
        CodecForId(id).DecodeAdd(q.data(), q.size(), huge, 1.0f, small.data());
    EXPECT_EQ(st.code(), StatusCode::kCorruption);
    EXPECT_EQ(small, std::vector<float>(4, 7.0f));
  }
  // More than 2^32 elements cannot be described.
  EXPECT_FALSE(
      CodecForId(id).Validate(q.data(), q.size(), size_t{1} << 33).ok());
  // Bad magic / version.
  q = p;
  q[0] ^= 1;
  EXPECT_EQ(TryDecode(q, q.size(), kN, id).code(), StatusCode::kCorruption);
  q = p;
  q[2] = 9;
  EXPECT_EQ(TryDecode(q, q.size(), kN, id).code(), StatusCode::kCorruption);
  EXPECT_FALSE(CodecForId(id).Decode(nullptr, 0, kN, small.data()).ok());
}

INSTANTIATE_TEST_SUITE_P(Codecs, CorruptionTest, ::testing::ValuesIn(kSpecs));

void PutF32(std::vector<uint8_t>* p, size_t off, float v) {
  std::memcpy(p->data() + off, &v, 4);
}
void PutU32(std::vector<uint8_t>* p, size_t off, uint32_t v) {
  std::memcpy(p->data() + off, &v, 4);
}

TEST(CorruptionTest, NonFiniteOrNegativeScales) {
  for (const char* text : {"int8:bucket=64", "qsgd:bucket=64",
                           "terngrad:bucket=64", "sign:bucket=64"}) {
    auto p = EncodeWith(text);
    const auto id = static_cast<CodecId>(p[1]);
    for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                      std::numeric_limits<float>::infinity(), -1.0f}) {
      for (size_t b : {size_t{0}, size_t{16}}) {  // first and last bucket
        auto q = p;
        PutF32(&q, kPayloadHeaderBytes + 4 * b, bad);
        EXPECT_EQ(TryDecode(q, q.size(), kN, id).code(),
                  StatusCode::kCorruption)
            << text << " " << bad;
      }
    }
    // Bucket sizes that do not fit the rules or the size.
    for (uint32_t bucket : {0u, 7u, 12u, 128u, 0x80000000u}) {
      auto q = p;
      PutU32(&q, 8, bucket);
      EXPECT_FALSE(TryDecode(q, q.size(), kN, id).ok())
          << text << " " << bucket;
    }
  }
  auto p = EncodeWith("qsgd:bucket=64");
  for (uint32_t levels : {0u, 128u, 255u, 8u}) {
    auto q = p;
    PutU32(&q, 12, levels);
    EXPECT_FALSE(TryDecode(q, q.size(), kN, CodecId::kQsgd).ok()) << levels;
  }
}

TEST(CorruptionTest, SparseIndicesAndValues) {
  auto p = EncodeWith("topk:ratio=0.05");
  const uint32_t k = 52;  // round(0.05 * 1037)
  uint32_t hk;
  std::memcpy(&hk, p.data() + 8, 4);
  ASSERT_EQ(hk, k);
  const size_t idx0 = kPayloadHeaderBytes, val0 = kPayloadHeaderBytes + 4 * k;
  auto q = p;
  PutU32(&q, idx0 + 4 * (k - 1), kN);  // out of range
  EXPECT_EQ(TryDecode(q, q.size(), kN, CodecId::kTopK).code(),
            StatusCode::kCorruption);
  q = p;
  PutU32(&q, idx0 + 4 * (k - 1), 0xffffffffu);
  EXPECT_EQ(TryDecode(q, q.size(), kN, CodecId::kTopK).code(),
            StatusCode::kCorruption);
  q = p;
  uint32_t first;
  std::memcpy(&first, p.data() + idx0, 4);
  PutU32(&q, idx0 + 4, first);  // duplicate
  EXPECT_EQ(TryDecode(q, q.size(), kN, CodecId::kTopK).code(),
            StatusCode::kCorruption);
  q = p;
  PutF32(&q, val0 + 8, std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(TryDecode(q, q.size(), kN, CodecId::kTopK).code(),
            StatusCode::kCorruption);
  for (uint32_t bad_k : {k + 1, uint32_t{kN + 1}, 0x7fffffffu, 0xffffffffu}) {
    q = p;
    PutU32(&q, 8, bad_k);
    EXPECT_FALSE(TryDecode(q, q.size(), kN, CodecId::kTopK).ok()) << bad_k;
  }
  int calls = 0;
  q = p;
  PutU32(&q, idx0, kN + 5);
  EXPECT_FALSE(ForEachSparse(q.data(), q.size(), kN, [&](uint32_t, float) {
                 ++calls;
               }).ok());
  EXPECT_EQ(calls, 0);

  auto r = EncodeWith("randomk:ratio=0.05");
  for (uint32_t bad_k : {uint32_t{kN + 1}, 0xffffffffu}) {
    q = r;
    PutU32(&q, 8, bad_k);
    EXPECT_FALSE(TryDecode(q, q.size(), kN, CodecId::kRandomK).ok()) << bad_k;
  }
  q = r;
  PutF32(&q, kPayloadHeaderBytes, std::numeric_limits<float>::infinity());
  EXPECT_EQ(TryDecode(q, q.size(), kN, CodecId::kRandomK).code(),
            StatusCode::kCorruption);
}

TEST(CorruptionTest, UnknownCodecIds) {
  auto p = EncodeWith("int8:bucket=64");
  p[1] = 200;
  EXPECT_FALSE(PeekCodecId(p.data(), p.size()).ok());
  std::vector<float> dst(kN, 1.0f);
  EXPECT_FALSE(DecodeAddAny(p.data(), p.size(), kN, 1.0f, dst.data()).ok());
  const Codec& bad = CodecForId(static_cast<CodecId>(200));
  EXPECT_EQ(bad.Decode(p.data(), p.size(), kN, dst.data()).code(),
            StatusCode::kInvalidArgument);
  std::vector<uint8_t> out;
  EXPECT_FALSE(bad.Encode(dst.data(), kN, 0, &out).ok());
  EXPECT_EQ(dst, std::vector<float>(kN, 1.0f));
}

}  // namespace
}  // namespace asyncps::compression
