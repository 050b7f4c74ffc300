#include <gtest/gtest.h>

#include "compression/codec.h"

namespace asyncps::compression {
namespace {

TEST(CodecSpecTest, ParsesExamples) {
  auto s = CodecSpec::Parse("none");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->id, CodecId::kNone);
  EXPECT_EQ(s->min_elems, 0u);

  s = CodecSpec::Parse("int8:bucket=256");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->id, CodecId::kInt8);
  EXPECT_EQ(s->bucket, 256);
  EXPECT_EQ(s->min_elems, 1024u);

  s = CodecSpec::Parse("qsgd:levels=4,bucket=512");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->id, CodecId::kQsgd);
  EXPECT_EQ(s->levels, 4);
  EXPECT_EQ(s->bucket, 512);

  s = CodecSpec::Parse("topk:ratio=0.01,mode=sampled");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->id, CodecId::kTopK);
  EXPECT_DOUBLE_EQ(s->ratio, 0.01);
  EXPECT_TRUE(s->sampled);
  EXPECT_FALSE(s->error_feedback);

  s = CodecSpec::Parse("topk:ratio=0.001,ef=1,momentum=0.9,warmup_epochs=4");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_DOUBLE_EQ(s->ratio, 0.001);
  EXPECT_TRUE(s->error_feedback);
  EXPECT_FLOAT_EQ(s->momentum, 0.9f);
  EXPECT_DOUBLE_EQ(s->warmup_epochs, 4.0);

  s = CodecSpec::Parse("randomk:ratio=0.05,min_elems=10");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->id, CodecId::kRandomK);
  EXPECT_EQ(s->min_elems, 10u);

  for (const char* name : {"fp16", "bf16", "terngrad", "sign"}) {
    s = CodecSpec::Parse(name);
    ASSERT_TRUE(s.ok()) << name;
    EXPECT_STREQ(CodecName(s->id), name);
  }
}

TEST(CodecSpecTest, ToStringRoundTrips) {
  for (const char* text :
       {"none", "fp16", "bf16:ef=1", "int8:bucket=512",
        "qsgd:levels=16,bucket=128", "terngrad:bucket=64", "sign",
        "topk:ratio=0.01", "topk:ratio=0.01,mode=sampled",
        "topk:ratio=0.001,ef=1,momentum=0.9,warmup_epochs=4",
        "randomk:ratio=0.25,ef=1", "int8:min_elems=0", "none:min_elems=4096"}) {
    auto s = CodecSpec::Parse(text);
    ASSERT_TRUE(s.ok()) << text << ": " << s.status().ToString();
    auto again = CodecSpec::Parse(s->ToString());
    ASSERT_TRUE(again.ok()) << s->ToString();
    EXPECT_TRUE(*again == *s) << text << " -> " << s->ToString();
  }
  EXPECT_EQ(CodecSpec::Parse("qsgd")->ToString(), "qsgd:levels=4,bucket=512");
  EXPECT_EQ(CodecSpec::Parse("topk:ratio=0.01,ef=1")->ToString(),
            "topk:ratio=0.01,ef=1");
}

TEST(CodecSpecTest, RejectsBadSpecsListingValidOnes) {
  for (const char* text : {"",
                           "foo",
                           "topk:",
                           "topk:ratio=",
                           "topk:ratio=2",
                           "topk:ratio=0",
                           "topk:ratio=abc",
                           "topk:ratio=0.1,",
                           "topk:mode=fast",
                           "int8:bucket=7",
                           "int8:bucket=0",
                           "int8:ratio=0.1",
                           "qsgd:levels=0",
                           "qsgd:levels=128",
                           "sign:levels=4",
                           "topk:foo=1",
                           "topk:ratio=0.01,momentum=0.9",
                           "int8:ef=1,momentum=0.5",
                           "none:ef=1",
                           "topk:ef=2",
                           "int8:warmup_epochs=2",
                           "topk:ratio=0.01,ef=1,momentum=1.5",
                           "topk:ratio=0.01,warmup_epochs=-1",
                           "int8:bucket",
                           "int8:min_elems=-1",
                           "TOPK"}) {
    auto s = CodecSpec::Parse(text);
    ASSERT_FALSE(s.ok()) << "accepted '" << text << "'";
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    const std::string& m = s.status().message();
    EXPECT_NE(m.find("valid specs"), std::string::npos) << m;
    for (const char* name :
         {"none", "fp16", "bf16", "int8", "qsgd[:levels=S,bucket=B]",
          "terngrad", "sign", "topk[:ratio=R,mode=exact|sampled]", "randomk",
          "ef=0|1", "momentum", "warmup_epochs", "min_elems"}) {
      EXPECT_NE(m.find(name), std::string::npos)
          << name << " missing in: " << m;
    }
  }
}

TEST(CodecSpecTest, NamesAndFactory) {
  EXPECT_STREQ(CodecName(CodecId::kTernGrad), "terngrad");
  EXPECT_STREQ(CodecName(static_cast<CodecId>(99)), "invalid");
  EXPECT_EQ(static_cast<int>(CodecId::kRandomK), 8);  // wire value
  for (int i = 0; i < kNumCodecs; ++i) {
    CodecSpec s;
    s.id = static_cast<CodecId>(i);
    auto c = CreateCodec(s);
    ASSERT_TRUE(c.ok());
    EXPECT_EQ((*c)->id(), s.id);
    EXPECT_EQ(CodecForId(s.id).id(), s.id);
    EXPECT_EQ((*c)->IsSparse(),
              s.id == CodecId::kTopK || s.id == CodecId::kRandomK);
  }
  CodecSpec bad;
  bad.id = CodecId::kInt8;
  bad.bucket = 12;
  EXPECT_FALSE(CreateCodec(bad).ok());
}

}  // namespace
}  // namespace asyncps::compression
