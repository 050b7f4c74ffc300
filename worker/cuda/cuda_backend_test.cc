// CUDA backend vs CPU backend on random inputs: loss, gradients and
// evaluation must agree within 1e-4 relative. Skips without a visible GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "tests/util/layered_step_check.h"
#include "worker/backend.h"
#include "worker/model.h"

namespace asyncps::worker {
namespace {

std::unique_ptr<Backend> Make(DeviceKind kind, const std::vector<int>& layers) {
  BackendOptions o;
  o.layers = layers;
  o.device = kind;
  auto b = Backend::Create(o);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return b.ok() ? std::move(b).value() : nullptr;
}

// ||a - b|| / max(||b||, tiny)
double RelErr(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    n += double(b[i]) * b[i];
  }
  return std::sqrt(d) / std::max(std::sqrt(n), 1e-30);
}

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!BuiltWithCuda()) GTEST_SKIP() << "built without CUDA";
    if (VisibleCudaDevices() == 0) GTEST_SKIP() << "no CUDA device visible";
  }
};

TEST_F(CudaBackendTest, AgreesWithCpu) {
  for (int batch : {1, 37, 256}) {
    const std::vector<int> layers = {784, 256, 128, 10};
    auto cpu = Make(DeviceKind::kCpu, layers);
    auto gpu = Make(DeviceKind::kCuda, layers);
    ASSERT_TRUE(cpu && gpu);
    EXPECT_EQ(gpu->name().substr(0, 4), "cuda");
    auto params = InitializeTensors(MlpTensorSpecs(layers, batch));
    std::mt19937 rng(batch);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (auto& t : params) {
      for (auto& v : t) v += 0.01f * (u(rng) - 0.5f);
    }
    std::vector<const float*> pp;
    for (auto& t : params) pp.push_back(t.data());
    ASSERT_TRUE(cpu->SetParameters(pp).ok());
    ASSERT_TRUE(gpu->SetParameters(pp).ok());
    std::vector<float> x(static_cast<size_t>(batch) * 784);
    for (auto& v : x) v = u(rng);
    std::vector<uint8_t> y(batch);
    for (auto& v : y) v = rng() % 10;

    std::vector<std::vector<float>> gc, gg;
    std::vector<float*> pc, pg;
    for (auto& t : params) gc.emplace_back(t.size()), gg.emplace_back(t.size());
    for (size_t i = 0; i < params.size(); ++i)
      pc.push_back(gc[i].data()), pg.push_back(gg[i].data());
    auto lc = cpu->ForwardBackward(x.data(), y.data(), batch, pc);
    auto lg = gpu->ForwardBackward(x.data(), y.data(), batch, pg);
    ASSERT_TRUE(lc.ok() && lg.ok()) << lg.status().ToString();
    EXPECT_NEAR(*lg, *lc, 1e-4 * std::fabs(*lc)) << "batch " << batch;
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_LT(RelErr(gg[i], gc[i]), 1e-4)
          << "tensor " << i << " batch " << batch;
      EXPECT_NE(gpu->device_grad(i), nullptr);
    }
    // Gradients kept on the device only.
    auto ld = gpu->ForwardBackward(x.data(), y.data(), batch, {});
    ASSERT_TRUE(ld.ok());
    EXPECT_FLOAT_EQ(*ld, *lg);

    auto ec = cpu->Evaluate(x.data(), y.data(), batch);
    auto eg = gpu->Evaluate(x.data(), y.data(), batch);
    ASSERT_TRUE(ec.ok() && eg.ok());
    EXPECT_NEAR(eg->loss, ec->loss, 1e-4 * std::fabs(ec->loss));
    EXPECT_NEAR(eg->accuracy, ec->accuracy, 1.0 / batch + 1e-9);
  }
}

TEST_F(CudaBackendTest, EvaluateManyChunks) {
  const std::vector<int> layers = {20, 64, 10};
  auto cpu = Make(DeviceKind::kCpu, layers);
  auto gpu = Make(DeviceKind::kCuda, layers);
  ASSERT_TRUE(cpu && gpu);
  auto params = InitializeTensors(MlpTensorSpecs(layers, 5));
  std::vector<const float*> pp;
  for (auto& t : params) pp.push_back(t.data());
  ASSERT_TRUE(cpu->SetParameters(pp).ok() && gpu->SetParameters(pp).ok());
  const int n = 10000;
  std::mt19937 rng(1);
  std::normal_distribution<float> g;
  std::vector<float> x(static_cast<size_t>(n) * 20);
  for (auto& v : x) v = g(rng);
  std::vector<uint8_t> y(n);
  for (auto& v : y) v = rng() % 10;
  auto ec = cpu->Evaluate(x.data(), y.data(), n);
  auto eg = gpu->Evaluate(x.data(), y.data(), n);
  ASSERT_TRUE(ec.ok() && eg.ok());
  EXPECT_NEAR(eg->loss, ec->loss, 1e-4 * ec->loss);
  EXPECT_NEAR(eg->accuracy, ec->accuracy, 2e-4);
}

// ps_worker --overlap on the GPU: the layered step runs the fused step's
// kernels in the same order, so loss and gradients are the same bits; each
// layer's gradients are on the host when its hook runs, and parameters set
// by before_forward (stale ones everywhere before) are the ones used.
TEST_F(CudaBackendTest, LayeredStepIsBitwiseTheFusedStep) {
  const std::vector<int> layers = {784, 64, 32, 10};
  const int batch = 37;
  auto params = InitializeTensors(MlpTensorSpecs(layers, 5));
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(batch) * layers[0]);
  for (auto& v : x) v = u(rng);
  std::vector<uint8_t> y(batch);
  for (auto& v : y) v = rng() % 10;
  auto fused = Make(DeviceKind::kCuda, layers);
  auto layered = Make(DeviceKind::kCuda, layers);
  ASSERT_TRUE(fused && layered);
  ExpectLayeredStepIsTheFusedStep(fused.get(), layered.get(), params, x.data(),
                                  y.data(), batch);
}

}  // namespace
}  // namespace asyncps::worker
