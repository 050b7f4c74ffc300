// The check every backend's layered step passes (ps_worker --overlap,
// Backend::ForwardBackwardLayered): with stale parameters everywhere and
// each layer's real ones set by before_forward just in time, the loss and
// gradients are the fused ForwardBackward's, bitwise; each layer's
// gradients are complete in the host buffers when after_backward(l) runs;
// the hooks run in forward, then backward order; a hook's error ends the
// step with it; bad layers, tensors and buffers are refused.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "worker/backend.h"

namespace asyncps::worker {

inline void ExpectLayeredStepIsTheFusedStep(
    Backend* fused, Backend* layered,
    const std::vector<std::vector<float>>& params, const float* x,
    const uint8_t* y, int batch) {
  ASSERT_TRUE(layered->supports_layered_steps());
  std::vector<const float*> pp;
  for (const auto& t : params) pp.push_back(t.data());
  ASSERT_TRUE(fused->SetParameters(pp).ok());
  std::vector<std::vector<float>> g1, g2, seen, stale;
  std::vector<float*> p1, p2;
  std::vector<const float*> stale_ptrs;
  for (const auto& t : params) {
    g1.emplace_back(t.size(), 0.0f);
    g2.emplace_back(t.size(), -7.0f);
    seen.emplace_back(t.size(), 0.0f);
    stale.emplace_back(t.size(), 0.5f);
  }
  for (size_t i = 0; i < g1.size(); ++i) {
    p1.push_back(g1[i].data());
    p2.push_back(g2[i].data());
    stale_ptrs.push_back(stale[i].data());
  }
  auto loss1 = fused->ForwardBackward(x, y, batch, p1);
  ASSERT_TRUE(loss1.ok()) << loss1.status().ToString();

  ASSERT_TRUE(layered->SetParameters(stale_ptrs).ok());
  std::vector<int> order;
  LayerHooks hooks;
  hooks.before_forward = [&](int l) {
    order.push_back(l);
    return layered->SetLayerParameters(l, pp[2 * l], pp[2 * l + 1]);
  };
  hooks.after_backward = [&](int l) {
    order.push_back(100 + l);
    seen[2 * l] = g2[2 * l];
    seen[2 * l + 1] = g2[2 * l + 1];
    return Status::OK();
  };
  auto loss2 = layered->ForwardBackwardLayered(x, y, batch, p2, hooks);
  ASSERT_TRUE(loss2.ok()) << loss2.status().ToString();
  const int num_layers = static_cast<int>(params.size() / 2);
  std::vector<int> expected;
  for (int l = 0; l < num_layers; ++l) expected.push_back(l);
  for (int l = num_layers; l-- > 0;) expected.push_back(100 + l);
  EXPECT_EQ(order, expected);
  EXPECT_EQ(std::memcmp(&*loss1, &*loss2, sizeof(float)), 0);
  for (size_t t = 0; t < g1.size(); ++t) {
    ASSERT_EQ(std::memcmp(g1[t].data(), g2[t].data(), g1[t].size() * 4), 0)
        << "tensor " << t;
    ASSERT_EQ(std::memcmp(g1[t].data(), seen[t].data(), g1[t].size() * 4), 0)
        << "tensor " << t << " was not complete when its hook ran";
  }

  hooks.after_backward = [](int l) {
    return l == 1 ? Status::Unavailable("shard gone") : Status::OK();
  };
  EXPECT_EQ(
      layered->ForwardBackwardLayered(x, y, batch, p2, hooks).status().code(),
      StatusCode::kUnavailable);
  EXPECT_FALSE(layered->SetLayerParameters(num_layers, pp[0], pp[1]).ok());
  EXPECT_FALSE(layered->SetLayerParameters(0, nullptr, pp[1]).ok());
  EXPECT_FALSE(layered->ForwardBackwardLayered(x, y, batch, {}, hooks).ok());
  p2[0] = nullptr;
  EXPECT_FALSE(layered->ForwardBackwardLayered(x, y, batch, p2, hooks).ok());
}

}  // namespace asyncps::worker
