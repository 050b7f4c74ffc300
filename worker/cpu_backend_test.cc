// Gradient check of the CPU backend against central finite differences of
// an independent double-precision reference MLP.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "tests/util/layered_step_check.h"
#include "worker/backend.h"
#include "worker/model.h"

namespace asyncps::worker {
namespace {

// Mean softmax cross-entropy of the MLP in double precision.
double ReferenceLoss(const std::vector<int>& layers,
                     const std::vector<std::vector<double>>& p,
                     const std::vector<double>& x,
                     const std::vector<uint8_t>& y, int batch) {
  double total = 0;
  for (int r = 0; r < batch; ++r) {
    std::vector<double> a(x.begin() + r * layers[0],
                          x.begin() + (r + 1) * layers[0]);
    for (size_t l = 0; l + 1 < layers.size(); ++l) {
      const int in = layers[l], out = layers[l + 1];
      std::vector<double> z(out);
      for (int j = 0; j < out; ++j) {
        double s = p[2 * l + 1][j];
        for (int i = 0; i < in; ++i) s += a[i] * p[2 * l][i * out + j];
        z[j] = (l + 2 < layers.size()) ? std::max(s, 0.0) : s;
      }
      a = z;
    }
    double mx = a[0];
    for (double v : a) mx = std::max(mx, v);
    double s = 0;
    for (double v : a) s += std::exp(v - mx);
    total += std::log(s) - (a[y[r]] - mx);
  }
  return total / batch;
}

struct Problem {
  std::vector<int> layers;
  int batch;
  std::vector<std::vector<float>> params;
  std::vector<float> x;
  std::vector<uint8_t> y;
};

Problem MakeProblem(std::vector<int> layers, int batch, uint32_t seed) {
  Problem p{
      layers, batch, InitializeTensors(MlpTensorSpecs(layers, seed)), {}, {}};
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (auto& t : p.params) {
    for (auto& v : t) v += 0.1f * n(rng);  // non-zero biases too
  }
  p.x.resize(static_cast<size_t>(batch) * layers[0]);
  for (auto& v : p.x) v = n(rng);
  for (int i = 0; i < batch; ++i)
    p.y.push_back(static_cast<uint8_t>(rng() % layers.back()));
  return p;
}

std::unique_ptr<Backend> MakeCpu(const std::vector<int>& layers) {
  BackendOptions o;
  o.layers = layers;
  o.device = DeviceKind::kCpu;
  auto b = Backend::Create(o);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return std::move(b).value();
}

TEST(CpuBackendTest, GradientsMatchFiniteDifferences) {
  for (const auto& layers :
       std::vector<std::vector<int>>{{5, 7, 4, 3}, {6, 3}, {4, 9, 10}}) {
    Problem p = MakeProblem(layers, 6, 7);
    auto backend = MakeCpu(layers);
    std::vector<const float*> params;
    for (auto& t : p.params) params.push_back(t.data());
    ASSERT_TRUE(backend->SetParameters(params).ok());
    std::vector<std::vector<float>> grads;
    std::vector<float*> gptr;
    for (auto& t : p.params) grads.emplace_back(t.size(), 0.0f);
    for (auto& g : grads) gptr.push_back(g.data());
    auto loss = backend->ForwardBackward(p.x.data(), p.y.data(), p.batch, gptr);
    ASSERT_TRUE(loss.ok()) << loss.status().ToString();

    std::vector<std::vector<double>> dp;
    for (auto& t : p.params) dp.emplace_back(t.begin(), t.end());
    std::vector<double> dx(p.x.begin(), p.x.end());
    const double ref = ReferenceLoss(layers, dp, dx, p.y, p.batch);
    EXPECT_NEAR(*loss, ref, 1e-5 * std::max(1.0, std::fabs(ref)));

    const double h = 1e-6;
    for (size_t t = 0; t < dp.size(); ++t) {
      double diff2 = 0, norm2 = 0;
      for (size_t i = 0; i < dp[t].size(); ++i) {
        const double saved = dp[t][i];
        dp[t][i] = saved + h;
        const double up = ReferenceLoss(layers, dp, dx, p.y, p.batch);
        dp[t][i] = saved - h;
        const double down = ReferenceLoss(layers, dp, dx, p.y, p.batch);
        dp[t][i] = saved;
        const double fd = (up - down) / (2 * h);
        diff2 += (fd - grads[t][i]) * (fd - grads[t][i]);
        norm2 += fd * fd;
        EXPECT_NEAR(grads[t][i], fd, 1e-4 + 1e-3 * std::fabs(fd))
            << "tensor " << t << " elem " << i;
      }
      const double rel = std::sqrt(diff2) / std::max(std::sqrt(norm2), 1e-12);
      EXPECT_LT(rel, 1e-4) << "tensor " << t << " of "
                           << LayersToString(layers);
    }
  }
}

TEST(CpuBackendTest, EvaluateMatchesReferenceAndChunks) {
  const std::vector<int> layers = {8, 16, 10};
  Problem p = MakeProblem(layers, 2500, 3);  // > one evaluation chunk
  auto backend = MakeCpu(layers);
  std::vector<const float*> params;
  for (auto& t : p.params) params.push_back(t.data());
  ASSERT_TRUE(backend->SetParameters(params).ok());
  auto e = backend->Evaluate(p.x.data(), p.y.data(), p.batch);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  std::vector<std::vector<double>> dp;
  for (auto& t : p.params) dp.emplace_back(t.begin(), t.end());
  std::vector<double> dx(p.x.begin(), p.x.end());
  EXPECT_NEAR(e->loss, ReferenceLoss(layers, dp, dx, p.y, p.batch), 1e-4);
  EXPECT_EQ(e->examples, 2500);
  EXPECT_GE(e->accuracy, 0.0);
  EXPECT_LE(e->accuracy, 1.0);
}

TEST(CpuBackendTest, RejectsBadArguments) {
  auto backend = MakeCpu({4, 3});
  std::vector<float> w(12), b(3), gw(12), gb(3), x(8);
  std::vector<uint8_t> y = {0, 5};
  EXPECT_FALSE(backend->SetParameters({w.data()}).ok());
  ASSERT_TRUE(backend->SetParameters({w.data(), b.data()}).ok());
  auto r =
      backend->ForwardBackward(x.data(), y.data(), 2, {gw.data(), gb.data()});
  EXPECT_EQ(r.status().code(),
            StatusCode::kInvalidArgument);  // label 5 >= 3 outputs
  y[1] = 2;
  EXPECT_FALSE(
      backend->ForwardBackward(x.data(), y.data(), 0, {gw.data(), gb.data()})
          .ok());
  EXPECT_TRUE(
      backend->ForwardBackward(x.data(), y.data(), 2, {gw.data(), gb.data()})
          .ok());
  EXPECT_EQ(backend->device_grad(0), nullptr);
}

// --overlap's layered step: the weights set layer by layer just before
// each layer's forward and the gradients read in the hook as each layer's
// backward completes give the fused step's loss and gradients, bit for bit.
TEST(CpuBackendTest, LayeredStepIsBitwiseTheFusedStep) {
  const std::vector<int> layers = {20, 16, 12, 5};
  Problem p = MakeProblem(layers, 9, 11);
  auto fused = MakeCpu(layers);
  auto layered = MakeCpu(layers);
  ExpectLayeredStepIsTheFusedStep(fused.get(), layered.get(), p.params,
                                  p.x.data(), p.y.data(), p.batch);
}

TEST(BackendTest, DeviceSelection) {
  EXPECT_EQ(*ParseDeviceKind("cpu"), DeviceKind::kCpu);
  EXPECT_FALSE(ParseDeviceKind("tpu").ok());
  BackendOptions o;
  o.layers = {4, 3};
  o.device = DeviceKind::kCuda;
  auto b = Backend::Create(o);
  if (VisibleCudaDevices() == 0) {
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), StatusCode::kUnavailable);
  }
  o.device = DeviceKind::kAuto;
  auto a = Backend::Create(o);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  if (VisibleCudaDevices() == 0) {
    EXPECT_EQ((*a)->name().substr(0, 3), "cpu");
  }
  o.layers = {4};
  EXPECT_FALSE(Backend::Create(o).ok());
}

}  // namespace
}  // namespace asyncps::worker
