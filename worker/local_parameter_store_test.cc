#include "worker/local_parameter_store.h"

#include <gtest/gtest.h>

#include "worker/model.h"

namespace asyncps::worker {
namespace {

TEST(SgdUpdateTest, MatchesPyTorchRule) {
  SgdOptions o;
  o.lr = 0.1f;
  o.momentum = 0.5f;
  o.weight_decay = 0.01f;
  for (bool nesterov : {false, true}) {
    o.nesterov = nesterov;
    float w = 2.0f, v = 0.0f;
    double rw = 2.0, rv = 0.0;
    for (int step = 0; step < 3; ++step) {
      const float g = 0.3f * (step + 1);
      SgdUpdate(o, &g, 1, &w, &v);
      const double gg = g + 0.01 * rw;
      rv = 0.5 * rv + gg;
      rw -= 0.1 * (nesterov ? gg + 0.5 * rv : rv);
    }
    EXPECT_NEAR(w, rw, 1e-6);
  }
  o.momentum = 0.0f;
  o.nesterov = false;
  float w = 1.0f;
  const float g = 1.0f;
  SgdUpdate(o, &g, 1, &w, nullptr);
  EXPECT_NEAR(w, 1.0f - 0.1f * (1.0f + 0.01f), 1e-7);
}

TEST(SgdUpdateTest, CosineSchedule) {
  SgdOptions o;
  o.lr = 0.1f;
  EXPECT_FLOAT_EQ(ScheduledLr(o, 1000), 0.1f);  // constant by default
  o.decay_steps = 100;
  o.final_lr_fraction = 0.1f;
  EXPECT_FLOAT_EQ(ScheduledLr(o, 0), 0.1f);
  EXPECT_NEAR(ScheduledLr(o, 50), 0.1f * (0.1f + 0.9f * 0.5f), 1e-7);
  EXPECT_NEAR(ScheduledLr(o, 100), 0.01f, 1e-8);
  EXPECT_NEAR(ScheduledLr(o, 500), 0.01f, 1e-8);
}

TEST(LocalParameterStoreTest, PullGivesServerInitAndPushApplies) {
  auto specs = MlpTensorSpecs({6, 4, 3}, 11);
  SgdOptions o;
  o.lr = 0.5f;
  o.momentum = 0.0f;
  auto store = LocalParameterStore::Create(specs, o);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto expected = InitializeTensors(specs);
  std::vector<std::vector<float>> got;
  std::vector<float*> ptrs;
  for (auto& e : expected) got.emplace_back(e.size(), -1.0f);
  for (auto& g : got) ptrs.push_back(g.data());
  ASSERT_TRUE((*store)->Pull(0, ptrs).ok());
  EXPECT_EQ(got, expected);

  std::vector<std::vector<float>> grads;
  std::vector<const float*> gptrs;
  for (auto& e : expected) grads.emplace_back(e.size(), 1.0f);
  for (auto& g : grads) gptrs.push_back(g.data());
  ASSERT_TRUE((*store)->Push(0, gptrs).ok());
  ASSERT_TRUE((*store)->Clock(1).ok());
  ASSERT_TRUE((*store)->Pull(1, ptrs).ok());
  for (size_t t = 0; t < got.size(); ++t) {
    for (size_t i = 0; i < got[t].size(); ++i)
      EXPECT_FLOAT_EQ(got[t][i], expected[t][i] - 0.5f);
  }
  const TrafficStats tr = (*store)->traffic();
  const uint64_t bytes = (6 * 4 + 4 + 4 * 3 + 3) * 4;
  EXPECT_EQ(tr.bytes_pulled, 2 * bytes);
  EXPECT_EQ(tr.bytes_pushed_raw, bytes);
  EXPECT_EQ(tr.last_staleness, 0);
  EXPECT_EQ((*store)->version(), 1);
  EXPECT_FALSE((*store)->Clock(-1).ok());
  EXPECT_EQ((*store)->Pull(1, {ptrs[0]}).code(), StatusCode::kInvalidArgument);
}

TEST(LocalParameterStoreTest, RejectsBadOptions) {
  auto specs = MlpTensorSpecs({2, 2}, 1);
  SgdOptions o;
  o.lr = 0;
  EXPECT_FALSE(LocalParameterStore::Create(specs, o).ok());
  o.lr = 0.1f;
  o.momentum = 1.0f;
  EXPECT_FALSE(LocalParameterStore::Create(specs, o).ok());
  o.momentum = 0.0f;
  o.nesterov = true;
  EXPECT_FALSE(LocalParameterStore::Create(specs, o).ok());
}

}  // namespace
}  // namespace asyncps::worker
