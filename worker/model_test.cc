#include "worker/model.h"

#include <gtest/gtest.h>

namespace asyncps::worker {
namespace {

TEST(ModelTest, TensorSpecsFollowTheLayers) {
  auto specs = MlpTensorSpecs({784, 256, 10}, 9);
  ASSERT_EQ(specs.size(), 4u);
  EXPECT_EQ(specs[0].name, "fc0.weight");
  EXPECT_EQ(specs[0].shape, (std::vector<int64_t>{784, 256}));
  EXPECT_EQ(specs[0].init, InitKind::kHeNormal);
  EXPECT_EQ(specs[0].seed, 9u);
  EXPECT_EQ(specs[1].name, "fc0.bias");
  EXPECT_EQ(specs[1].shape, (std::vector<int64_t>{256}));
  EXPECT_EQ(specs[1].init, InitKind::kZeros);
  EXPECT_EQ(specs[3].name, "fc1.bias");
  EXPECT_EQ(specs[3].shape, (std::vector<int64_t>{10}));
  // The specs form a valid layout.
  EXPECT_TRUE(Layout::Create(specs, LayoutOptions{}).ok());
}

TEST(ModelTest, InitialisationIsSeededAndHeScaled) {
  auto a = InitializeTensors(MlpTensorSpecs({784, 256, 10}, 1));
  auto b = InitializeTensors(MlpTensorSpecs({784, 256, 10}, 1));
  auto c = InitializeTensors(MlpTensorSpecs({784, 256, 10}, 2));
  EXPECT_EQ(a, b);
  EXPECT_NE(a[0], c[0]);
  double sq = 0;
  for (float v : a[0]) sq += v * v;
  EXPECT_NEAR(sq / a[0].size(), 2.0 / 784, 0.1 * 2.0 / 784);
  for (float v : a[1]) EXPECT_EQ(v, 0.0f);
}

TEST(ModelTest, ParseLayers) {
  auto l = ParseLayers("784,256,128,10");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(*l, (std::vector<int>{784, 256, 128, 10}));
  EXPECT_EQ(LayersToString(*l), "784-256-128-10");
  for (const char* bad :
       {"", "784", "784,,10", "784,x,10", "784,-3,10", "784,10,"}) {
    EXPECT_EQ(ParseLayers(bad).status().code(), StatusCode::kInvalidArgument)
        << bad;
  }
}

}  // namespace
}  // namespace asyncps::worker
