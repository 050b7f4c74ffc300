#include "worker/ctr/click_model.h"

#include <cmath>
#include <cstring>

namespace asyncps::worker::ctr {
namespace {

// log(1 + e^x) without overflow.
double Softplus(double x) {
  return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
}

}  // namespace

TensorSpec ClickModel::DenseSpec() {
  return TensorSpec{"ctr.dense", {kDenseParams}, InitKind::kZeros, 0.0f, 0};
}

TableSpec ClickModel::EmbeddingTable(const RowOptimizerOptions& optimizer,
                                     float init_scale, uint64_t seed) const {
  TableSpec t;
  t.name = "ctr.emb";
  t.dim = row_dim();
  t.init = init_scale > 0 ? InitKind::kNormal : InitKind::kZeros;
  t.init_param = init_scale;
  t.seed = seed;
  t.optimizer = optimizer;
  return t;
}

void ClickModel::Keys(const CriteoExample* ex, size_t n, uint64_t* keys) {
  for (size_t i = 0; i < n; ++i) {
    for (int f = 0; f < kCriteoCats; ++f) {
      keys[i * kCriteoCats + f] = CriteoKey(f, ex[i]);
    }
  }
}

double ClickModel::Logit(const CriteoExample& ex, const float* dense,
                         const float* rows, float* sums) const {
  const size_t dim = row_dim();
  double logit = dense[0];
  for (int i = 0; i < kCriteoInts; ++i)
    logit += dense[1 + i] * CriteoDense(ex, i);
  double pair = 0;
  for (int j = 0; j < k_; ++j) sums[j] = 0.0f;
  for (int f = 0; f < kCriteoCats; ++f) {
    const float* r = rows + f * dim;
    logit += r[0];
    for (int j = 0; j < k_; ++j) {
      sums[j] += r[1 + j];
      pair -= double{r[1 + j]} * r[1 + j];
    }
  }
  for (int j = 0; j < k_; ++j) pair += double{sums[j]} * sums[j];
  return logit + 0.5 * pair;
}

void ClickModel::Forward(const CriteoExample* ex, size_t n, const float* dense,
                         const float* rows, float* logits) const {
  std::vector<float> sums(k_ + 1);
  const size_t stride = static_cast<size_t>(kCriteoCats) * row_dim();
  for (size_t i = 0; i < n; ++i) {
    logits[i] =
        static_cast<float>(Logit(ex[i], dense, rows + i * stride, sums.data()));
  }
}

double ClickModel::ForwardBackward(const CriteoExample* ex, size_t n,
                                   const float* dense, const float* rows,
                                   float* dense_grad, float* row_grads) const {
  const size_t dim = row_dim();
  const size_t stride = static_cast<size_t>(kCriteoCats) * dim;
  std::vector<float> sums(k_ + 1);
  std::memset(dense_grad, 0, kDenseParams * sizeof(float));
  double loss = 0;
  const double inv_n = 1.0 / static_cast<double>(n);
  for (size_t i = 0; i < n; ++i) {
    const float* r = rows + i * stride;
    const double z = Logit(ex[i], dense, r, sums.data());
    const double y = ex[i].label;
    loss += Softplus(z) - y * z;
    // d(mean loss)/d logit.
    const float g =
        static_cast<float>((1.0 / (1.0 + std::exp(-z)) - y) * inv_n);
    dense_grad[0] += g;
    for (int j = 0; j < kCriteoInts; ++j)
      dense_grad[1 + j] += g * CriteoDense(ex[i], j);
    float* gr = row_grads + i * stride;
    for (int f = 0; f < kCriteoCats; ++f) {
      const float* rf = r + f * dim;
      float* gf = gr + f * dim;
      gf[0] = g;
      for (int j = 0; j < k_; ++j) gf[1 + j] = g * (sums[j] - rf[1 + j]);
    }
  }
  return loss * inv_n;
}

double MeanLogLoss(const float* logits, const CriteoExample* ex, size_t n) {
  double loss = 0;
  for (size_t i = 0; i < n; ++i)
    loss += Softplus(logits[i]) - ex[i].label * double{logits[i]};
  return n == 0 ? 0.0 : loss / static_cast<double>(n);
}

}  // namespace asyncps::worker::ctr
