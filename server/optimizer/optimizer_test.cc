#include "server/optimizer/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace asyncps::server {
namespace {

std::unique_ptr<Optimizer> Make(OptimizerOptions o) {
  auto opt = Optimizer::Create(o);
  EXPECT_TRUE(opt.ok()) << opt.status().ToString();
  return std::move(opt).value();
}

TEST(OptimizerTest, SgdAndWeightDecay) {
  OptimizerOptions o;
  o.lr = 0.1f;
  auto sgd = Make(o);
  EXPECT_EQ(sgd->state_per_elem(), 0u);
  EXPECT_TRUE(sgd->exact_sparse());
  float w[2] = {1.0f, -2.0f};
  const float g[2] = {0.5f, 1.0f};
  sgd->Apply(w, nullptr, g, 2, 1.0f, 1);
  EXPECT_FLOAT_EQ(w[0], 0.95f);
  EXPECT_FLOAT_EQ(w[1], -2.1f);
  sgd->Apply(w, nullptr, g, 2, 0.5f, 2);  // lr_scale halves the step
  EXPECT_FLOAT_EQ(w[0], 0.925f);

  o.weight_decay = 0.1f;
  auto wd = Make(o);
  EXPECT_FALSE(wd->exact_sparse());
  float w2[1] = {1.0f};
  wd->Apply(w2, nullptr, g, 1, 1.0f, 1);
  EXPECT_FLOAT_EQ(w2[0], 1.0f - 0.1f * (0.5f + 0.1f));
}

TEST(OptimizerTest, SparseScatterEqualsDense) {
  OptimizerOptions o;
  o.lr = 0.25f;
  auto sgd = Make(o);
  std::vector<float> a(8, 1.0f), b(8, 1.0f), dense(8, 0.0f);
  const uint32_t idx[2] = {1, 6};
  const float vals[2] = {2.0f, -4.0f};
  dense[1] = 2.0f;
  dense[6] = -4.0f;
  sgd->ApplySparse(a.data(), idx, vals, 2, 1.0f);
  sgd->Apply(b.data(), nullptr, dense.data(), 8, 1.0f, 1);
  EXPECT_EQ(a, b);
  EXPECT_FLOAT_EQ(a[1], 0.5f);
  EXPECT_FLOAT_EQ(a[6], 2.0f);
}

TEST(OptimizerTest, MomentumAndNesterov) {
  OptimizerOptions o;
  o.kind = OptimizerKind::kMomentum;
  o.lr = 0.1f;
  o.momentum = 0.9f;
  auto m = Make(o);
  EXPECT_EQ(m->state_per_elem(), 1u);
  float w = 1.0f, v = 0.0f, g = 1.0f;
  m->Apply(&w, &v, &g, 1, 1.0f, 1);
  EXPECT_FLOAT_EQ(v, 1.0f);
  EXPECT_FLOAT_EQ(w, 0.9f);
  m->Apply(&w, &v, &g, 1, 1.0f, 2);
  EXPECT_FLOAT_EQ(v, 1.9f);
  EXPECT_FLOAT_EQ(w, 0.71f);

  o.nesterov = true;
  auto n = Make(o);
  w = 1.0f;
  v = 0.0f;
  n->Apply(&w, &v, &g, 1, 1.0f, 1);  // v = 1; w -= 0.1 * (1 + 0.9 * 1)
  EXPECT_FLOAT_EQ(w, 0.81f);
  n->Apply(&w, &v, &g, 1, 1.0f, 2);  // v = 1.9; w -= 0.1 * (1 + 1.71)
  EXPECT_FLOAT_EQ(w, 0.81f - 0.271f);
}

TEST(OptimizerTest, AdamBiasCorrected) {
  OptimizerOptions o;
  o.kind = OptimizerKind::kAdam;
  o.lr = 0.1f;
  auto adam = Make(o);
  EXPECT_EQ(adam->state_per_elem(), 2u);
  float w = 1.0f, g = 2.0f;
  float state[2] = {0.0f, 0.0f};
  adam->Apply(&w, state, &g, 1, 1.0f, 1);
  // m = 0.2, v = 0.004; m_hat = 2, v_hat = 4: step = 0.1 * 2 / 2.
  EXPECT_NEAR(state[0], 0.2f, 1e-7);
  EXPECT_NEAR(state[1], 0.004f, 1e-7);
  EXPECT_NEAR(w, 0.9f, 1e-6);
  adam->Apply(&w, state, &g, 1, 1.0f, 2);  // constant gradient: same step
  EXPECT_NEAR(w, 0.8f, 1e-5);
  // A different gradient: hand-computed m=0.38-ish path.
  g = -1.0f;
  adam->Apply(&w, state, &g, 1, 1.0f, 3);
  const double m3 = 0.9 * 0.38 + 0.1 * -1.0,
               v3 = 0.999 * 0.007996 + 0.001 * 1.0;
  const double mh = m3 / (1 - 0.729), vh = v3 / (1 - std::pow(0.999, 3));
  EXPECT_NEAR(w, 0.8 - 0.1 * mh / (std::sqrt(vh) + 1e-8), 1e-5);
}

TEST(OptimizerTest, AdaGrad) {
  OptimizerOptions o;
  o.kind = OptimizerKind::kAdaGrad;
  o.lr = 0.1f;
  auto a = Make(o);
  float w = 1.0f, h = 0.0f, g = 2.0f;
  a->Apply(&w, &h, &g, 1, 1.0f, 1);
  EXPECT_FLOAT_EQ(h, 4.0f);
  EXPECT_NEAR(w, 0.9f, 1e-6);
  a->Apply(&w, &h, &g, 1, 1.0f, 2);
  EXPECT_FLOAT_EQ(h, 8.0f);
  EXPECT_NEAR(w, 0.9f - 0.2f / std::sqrt(8.0f), 1e-6);
}

TEST(OptimizerTest, VectorLengthsAgreeWithScalar) {
  // The vectorised loop must equal element-wise application (odd length).
  for (OptimizerKind k : {OptimizerKind::kSgd, OptimizerKind::kMomentum,
                          OptimizerKind::kAdam, OptimizerKind::kAdaGrad}) {
    OptimizerOptions o;
    o.kind = k;
    o.weight_decay = 0.01f;
    auto opt = Make(o);
    const size_t n = 37, spe = opt->state_per_elem();
    std::vector<float> w(n), g(n), st(n * spe, 0.0f);
    for (size_t i = 0; i < n; ++i) {
      w[i] = 0.1f * static_cast<float>(i) - 1.0f;
      g[i] = 0.05f * static_cast<float>(i % 7) - 0.1f;
    }
    std::vector<float> w1 = w, st1 = st;
    opt->Apply(w1.data(), st1.data(), g.data(), n, 1.0f, 1);
    for (size_t i = 0; i < n; ++i) {
      float wi = w[i];
      std::vector<float> si(spe, 0.0f);
      opt->Apply(&wi, si.data(), &g[i], 1, 1.0f, 1);
      EXPECT_FLOAT_EQ(w1[i], wi) << OptimizerKindName(k) << " " << i;
    }
  }
}

TEST(OptimizerTest, RejectsBadOptions) {
  OptimizerOptions o;
  o.lr = 0.0f;
  EXPECT_FALSE(Optimizer::Create(o).ok());
  o = OptimizerOptions();
  o.momentum = 1.0f;
  EXPECT_FALSE(Optimizer::Create(o).ok());
  o = OptimizerOptions();
  o.eps = 0.0f;
  EXPECT_FALSE(Optimizer::Create(o).ok());
  EXPECT_FALSE(ParseOptimizerKind("rmsprop").ok());
  EXPECT_EQ(*ParseOptimizerKind("adam"), OptimizerKind::kAdam);
}

}  // namespace
}  // namespace asyncps::server
