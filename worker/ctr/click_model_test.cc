#include "worker/ctr/click_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "worker/ctr/planted.h"

namespace asyncps::worker::ctr {
namespace {

// Gradients of the mean log loss match central finite differences.
TEST(ClickModelTest, GradientsMatchFiniteDifferences) {
  ClickModel m(3);
  PlantedOptions po;
  po.vocab = 50;
  PlantedModel planted(po);
  std::mt19937_64 rng(5);
  std::vector<CriteoExample> ex(4);
  for (size_t i = 0; i < ex.size(); ++i) {
    planted.SampleFeatures(rng, &ex[i]);
    ex[i].label = static_cast<float>(i % 2);
  }
  const size_t dim = m.row_dim();
  const size_t nrows = ex.size() * kCriteoCats;
  std::normal_distribution<float> nd(0, 0.3f);
  std::vector<float> dense(ClickModel::kDenseParams), rows(nrows * dim);
  for (float& v : dense) v = nd(rng);
  for (float& v : rows) v = nd(rng);
  std::vector<float> dg(dense.size()), rg(rows.size());
  m.ForwardBackward(ex.data(), ex.size(), dense.data(), rows.data(), dg.data(),
                    rg.data());
  std::vector<float> dscratch(dense.size()), rscratch(rows.size());
  auto loss = [&] {
    return m.ForwardBackward(ex.data(), ex.size(), dense.data(), rows.data(),
                             dscratch.data(), rscratch.data());
  };
  const double h = 1e-3;
  for (size_t i = 0; i < dense.size(); ++i) {
    const float keep = dense[i];
    dense[i] = keep + h;
    const double up = loss();
    dense[i] = keep - h;
    const double down = loss();
    dense[i] = keep;
    EXPECT_NEAR(dg[i], (up - down) / (2 * h), 2e-4) << "dense " << i;
  }
  for (size_t i = 0; i < rows.size(); i += 7) {
    const float keep = rows[i];
    rows[i] = keep + h;
    const double up = loss();
    rows[i] = keep - h;
    const double down = loss();
    rows[i] = keep;
    EXPECT_NEAR(rg[i], (up - down) / (2 * h), 2e-4) << "row element " << i;
  }
  // Forward agrees with the loss the backward pass reports.
  std::vector<float> logits(ex.size());
  m.Forward(ex.data(), ex.size(), dense.data(), rows.data(), logits.data());
  EXPECT_NEAR(MeanLogLoss(logits.data(), ex.data(), ex.size()), loss(), 1e-6);
}

TEST(ClickModelTest, KeysAndSpecs) {
  ClickModel m(8);
  EXPECT_EQ(m.row_dim(), 9u);
  RowOptimizerOptions o;
  o.kind = RowOptimizerKind::kAdaGrad;
  TableSpec t = m.EmbeddingTable(o, 0.01f, 3);
  EXPECT_TRUE(t.Validate().ok());
  EXPECT_EQ(t.dim, 9u);
  EXPECT_EQ(ClickModel::DenseSpec().num_elements(), ClickModel::kDenseParams);
  CriteoExample ex[2];
  ex[0].cats[3] = 42;
  ex[0].cat_present = 1u << 3;
  uint64_t keys[2 * kCriteoCats];
  ClickModel::Keys(ex, 2, keys);
  EXPECT_EQ(keys[3], CriteoKey(3, ex[0]));
  EXPECT_EQ(keys[kCriteoCats + 3], CriteoKey(3, ex[1]));
  EXPECT_NE(keys[3], keys[kCriteoCats + 3]);
}

}  // namespace
}  // namespace asyncps::worker::ctr
