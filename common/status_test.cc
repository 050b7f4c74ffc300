#include "common/status.h"

#include <gtest/gtest.h>

namespace asyncps {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2) return Status::InvalidArgument("odd");
  return x / 2;
}

Status UseHalf(int x, int* out) {
  ASSIGN_OR_RETURN(int h, Half(x));
  *out = h;
  RETURN_IF_ERROR(h > 100 ? Status::ResourceExhausted("big") : Status::OK());
  return Status::OK();
}

TEST(StatusTest, CodesAndRetryability) {
  EXPECT_TRUE(Status::OK().ok());
  EXPECT_EQ(Status::OK().ToString(), "OK");
  Status s = Status::Unavailable("shard down");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.IsRetryable());
  EXPECT_FALSE(Status::InvalidArgument("x").IsRetryable());
  EXPECT_EQ(s.ToString(), "Unavailable: shard down");
  EXPECT_EQ(s.WithContext("pull").message(), "pull: shard down");
}

TEST(StatusTest, MacrosPropagate) {
  int out = 0;
  EXPECT_TRUE(UseHalf(8, &out).ok());
  EXPECT_EQ(out, 4);
  EXPECT_EQ(UseHalf(7, &out).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(UseHalf(400, &out).code(), StatusCode::kResourceExhausted);
  StatusOr<int> bad =
      Status::OK();  // a programming error, reported as Internal
  EXPECT_EQ(bad.status().code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace asyncps
