// The device push path end to end: a Trainer with the CUDA backend and an
// in-process store that compresses on the device (DeviceCompressor) pushes
// byte-identical payloads to the host path (gradients copied to the host,
// Compressor), step after step, for deterministic codecs with error
// feedback and DGC. Skips without a visible GPU.
#include <gtest/gtest.h>

#include <random>

#include "compression/codec.h"
#include "compression/compressor.h"
#include "compression/device_compressor.h"
#include "worker/backend.h"
#include "worker/model.h"
#include "worker/parameter_store.h"
#include "worker/trainer.h"

namespace asyncps::worker {
namespace {

using compression::CodecSpec;
using compression::CompressorOptions;

// One chunk per tensor; applies each payload to its weights with SGD and
// records it. `device`: compress on the GPU and accept device gradients.
class CompressingStore : public ParameterStore {
 public:
  CompressingStore(const std::vector<TensorSpec>& specs,
                   const std::string& codec, bool device)
      : weights_(InitializeTensors(specs)) {
    CompressorOptions o;
    o.spec = *CodecSpec::Parse(codec);
    o.seed = 99;
    std::vector<size_t> sizes;
    for (const auto& w : weights_) sizes.push_back(w.size());
    if (device) {
      auto d = compression::DeviceCompressor::Create(o, sizes);
      EXPECT_TRUE(d.ok()) << d.status().ToString();
      if (d.ok()) device_ = std::move(d).value();
    } else {
      host_ = std::move(compression::Compressor::Create(o, sizes)).value();
    }
  }
  Status Pull(int64_t, const std::vector<float*>& t) override {
    for (size_t i = 0; i < t.size(); ++i)
      std::copy(weights_[i].begin(), weights_[i].end(), t[i]);
    return Status::OK();
  }
  Status Push(int64_t clock, const std::vector<const float*>& g) override {
    ++host_pushes;
    return Apply(clock, g, false);
  }
  bool AcceptsDeviceGradients() const override { return device_ != nullptr; }
  Status PushDevice(int64_t clock,
                    const std::vector<const float*>& g) override {
    ++device_pushes;
    return Apply(clock, g, true);
  }
  Status Clock(int64_t) override { return Status::OK(); }
  TrafficStats traffic() const override { return {}; }

  std::vector<std::vector<uint8_t>> payloads;
  int host_pushes = 0, device_pushes = 0;

 private:
  Status Apply(int64_t clock, const std::vector<const float*>& g, bool dev) {
    const double epoch = clock / 4.0;  // warm-up over the first steps
    for (size_t i = 0; i < g.size(); ++i) {
      std::vector<uint8_t> out;
      StatusOr<compression::CodecId> id =
          dev ? device_->Compress(i, g[i], epoch, clock, &out)
              : host_->Compress(i, g[i], epoch, clock, &out);
      RETURN_IF_ERROR(id.status());
      RETURN_IF_ERROR(compression::DecodeAddAny(out.data(), out.size(),
                                                weights_[i].size(), -0.1f,
                                                weights_[i].data()));
      payloads.push_back(std::move(out));
    }
    return Status::OK();
  }

  std::vector<std::vector<float>> weights_;
  std::unique_ptr<compression::Compressor> host_;
  std::unique_ptr<compression::DeviceCompressor> device_;
};

Dataset Synthetic(int64_t n) {
  Dataset d;
  d.num_examples = n;
  d.rows = d.cols = 28;
  std::mt19937 rng(5);
  std::normal_distribution<float> x(0.0f, 1.0f);
  d.images.resize(static_cast<size_t>(n) * 784);
  for (auto& v : d.images) v = x(rng);
  for (int64_t i = 0; i < n; ++i) d.labels.push_back(rng() % 10);
  return d;
}

class DevicePushTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!BuiltWithCuda()) GTEST_SKIP() << "built without CUDA";
    if (VisibleCudaDevices() == 0) GTEST_SKIP() << "no CUDA device visible";
  }
};

TEST_P(DevicePushTest, SamePushesAsHostPath) {
  const Dataset train = Synthetic(1024);
  TrainerOptions to;
  to.layers = {784, 256, 128, 10};
  to.batch = 64;
  to.epochs = 0;
  to.max_steps = 8;
  to.eval = false;
  to.print_summary = false;
  to.log_every = 0;
  auto run = [&](bool device) {
    BackendOptions bo;
    bo.layers = to.layers;
    bo.device = DeviceKind::kCuda;
    auto backend = Backend::Create(bo);
    EXPECT_TRUE(backend.ok()) << backend.status().ToString();
    auto store = std::make_unique<CompressingStore>(
        MlpTensorSpecs(to.layers, 3), GetParam(), device);
    auto t = Trainer::Create(to, backend->get(), store.get(), &train, nullptr);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    auto r = (*t)->Run();
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return store;
  };
  auto host = run(false);
  auto dev = run(true);
  EXPECT_EQ(host->host_pushes, 8);
  EXPECT_EQ(host->device_pushes, 0);
  EXPECT_EQ(dev->host_pushes, 0);
  EXPECT_EQ(dev->device_pushes, 8);
  ASSERT_EQ(host->payloads.size(), dev->payloads.size());
  for (size_t i = 0; i < host->payloads.size(); ++i) {
    ASSERT_TRUE(host->payloads[i] == dev->payloads[i])
        << "payload " << i << " (step " << i / 6 << ", tensor " << i % 6
        << ") differs";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, DevicePushTest,
    ::testing::Values("int8:ef=1", "fp16", "sign:ef=1",
                      "topk:ratio=0.01,ef=1,momentum=0.9,warmup_epochs=1",
                      "randomk:ratio=0.05,ef=1"));

}  // namespace
}  // namespace asyncps::worker
