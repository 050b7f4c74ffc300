#include "worker/trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "worker/local_parameter_store.h"
#include "worker/model.h"

namespace asyncps::worker {
namespace {

const char kFashionDir[] = "/usr/share/datasets/fashion-mnist";

class TrainerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(std::string(kFashionDir) +
                                 "/train-images-idx3-ubyte.gz"))
      return;
    auto tr = LoadMnist(kFashionDir, Split::kTrain);
    auto te = LoadMnist(kFashionDir, Split::kTest);
    ASSERT_TRUE(tr.ok() && te.ok());
    train_ = new Dataset(std::move(tr).value());
    test_ = new Dataset(std::move(te).value());
  }
  static void TearDownTestSuite() {
    delete train_;
    delete test_;
    train_ = test_ = nullptr;
  }
  void SetUp() override {
    if (train_ == nullptr) GTEST_SKIP() << "Fashion-MNIST not installed";
  }

  static Dataset* train_;
  static Dataset* test_;
};
Dataset* TrainerTest::train_ = nullptr;
Dataset* TrainerTest::test_ = nullptr;

std::unique_ptr<Backend> Cpu(const std::vector<int>& layers) {
  BackendOptions o;
  o.layers = layers;
  o.device = DeviceKind::kCpu;
  return std::move(Backend::Create(o)).value();
}

TEST_F(TrainerTest, OneEpochReachesRealAccuracy) {
  TrainerOptions to;
  to.batch = 64;
  to.epochs = 1;
  to.eval_every = 400;
  to.log_every = 300;
  to.metrics_csv = ::testing::TempDir() + "/trainer_test_metrics.csv";
  auto backend = Cpu(to.layers);
  SgdOptions sgd;  // lr 0.05, momentum 0.9
  auto store = LocalParameterStore::Create(MlpTensorSpecs(to.layers, 1), sgd);
  ASSERT_TRUE(store.ok());
  auto trainer =
      Trainer::Create(to, backend.get(), store->get(), train_, test_);
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  EXPECT_EQ((*trainer)->total_steps(), 938);
  auto r = (*trainer)->Run();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->steps, 938);
  EXPECT_EQ(r->samples, 60000);
  EXPECT_GE(r->final_test_acc, 0.80);
  EXPECT_LT(r->final_train_loss, 0.6);
  EXPECT_GT(r->samples_per_s, 0);
  EXPECT_EQ(r->traffic.bytes_pushed_raw,
            938ull * 4 * (784 * 256 + 256 + 256 * 128 + 128 + 1290));
  EXPECT_NE(r->summary.find("SUMMARY rank=0 final_test_acc="),
            std::string::npos);

  std::ifstream csv(to.metrics_csv);
  std::string line;
  std::getline(csv, line);
  EXPECT_EQ(line, kMetricsCsvHeader);
  int rows = 0, with_acc = 0;
  while (std::getline(csv, line)) {
    ++rows;
    // test_acc is the 7th column.
    size_t pos = 0;
    for (int c = 0; c < 6; ++c) pos = line.find(',', pos) + 1;
    if (line[pos] != ',') ++with_acc;
  }
  // Rows at steps 300, 401 (evaluated on the weights pulled for step index
  // 400), 600, 801 (evaluated), 900 and 938 (final evaluation).
  EXPECT_EQ(rows, 6);
  EXPECT_EQ(with_acc, 3);
}

TEST_F(TrainerTest, MaxStepsAndNoEval) {
  TrainerOptions to;
  to.layers = {784, 32, 10};
  to.max_steps = 20;
  to.epochs = 0;
  to.eval = false;
  to.rank = 1;
  to.num_workers = 3;
  to.print_summary = false;
  auto backend = Cpu(to.layers);
  auto store =
      LocalParameterStore::Create(MlpTensorSpecs(to.layers, 1), SgdOptions{});
  auto trainer =
      Trainer::Create(to, backend.get(), store->get(), train_, nullptr);
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  auto r = (*trainer)->Run();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->steps, 20);
  EXPECT_EQ(r->final_test_acc, -1);
}

// 60000 examples over 3 workers: 20000 each, 312 full batches of 64 and one
// of 32. drop_last trains on the full batches only.
TEST_F(TrainerTest, DropLastSkipsTheShortBatchOfEachEpoch) {
  for (bool drop : {false, true}) {
    TrainerOptions to;
    to.layers = {784, 16, 10};
    to.epochs = 2;
    to.eval = false;
    to.num_workers = 3;
    to.drop_last = drop;
    to.print_summary = false;
    EXPECT_EQ(Trainer::PlannedSteps(to, train_->num_examples),
              drop ? 624 : 626);
    auto backend = Cpu(to.layers);
    auto store =
        LocalParameterStore::Create(MlpTensorSpecs(to.layers, 1), SgdOptions{});
    auto trainer =
        Trainer::Create(to, backend.get(), store->get(), train_, nullptr);
    ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
    EXPECT_EQ((*trainer)->batches_per_epoch(), drop ? 312 : 313);
    auto r = (*trainer)->Run();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->steps, drop ? 624 : 626);
    EXPECT_EQ(r->samples, drop ? 624 * 64 : 2 * 20000);
  }
}

TEST_F(TrainerTest, RejectsBadOptions) {
  auto backend = Cpu({784, 16, 10});
  auto store = LocalParameterStore::Create(MlpTensorSpecs({784, 16, 10}, 1),
                                           SgdOptions{});
  auto check = [&](TrainerOptions to, const std::string& needle) {
    auto t = Trainer::Create(to, backend.get(), store->get(), train_, test_);
    ASSERT_FALSE(t.ok()) << needle;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find(needle), std::string::npos)
        << t.status().ToString();
  };
  TrainerOptions good;
  good.layers = {784, 16, 10};
  TrainerOptions o = good;
  o.layers = {780, 16, 10};
  check(o, "first layer size");
  o = good;
  o.layers = {784, 16, 5};
  check(o, "last layer size");
  o = good;
  o.layers = {784, 32, 10};
  check(o, "backend model");
  o = good;
  o.batch = 0;
  check(o, "batch");
  o = good;
  o.epochs = 0;
  check(o, "nothing to do");
  o = good;
  o.rank = 2;
  o.num_workers = 2;
  check(o, "rank");
  o = good;
  o.slowdown = 0.5;
  check(o, "slowdown");
  auto t = Trainer::Create(good, backend.get(), store->get(), train_, nullptr);
  EXPECT_FALSE(t.ok());
}

// A store that fails Pull at a given clock: errors surface from Run() with
// their code and the clock as context.
class FailingStore : public ParameterStore {
 public:
  FailingStore(ParameterStore* inner, int64_t fail_at)
      : inner_(inner), fail_at_(fail_at) {}
  Status Pull(int64_t clock, const std::vector<float*>& t) override {
    if (clock == fail_at_) return Status::Unavailable("shard 0 is down");
    return inner_->Pull(clock, t);
  }
  Status Push(int64_t clock, const std::vector<const float*>& g) override {
    return inner_->Push(clock, g);
  }
  Status Clock(int64_t c) override { return inner_->Clock(c); }
  TrafficStats traffic() const override { return inner_->traffic(); }

 private:
  ParameterStore* inner_;
  int64_t fail_at_;
};

TEST_F(TrainerTest, StoreErrorsPropagate) {
  TrainerOptions to;
  to.layers = {784, 16, 10};
  to.max_steps = 10;
  to.epochs = 0;
  to.eval = false;
  to.print_summary = false;
  auto backend = Cpu(to.layers);
  auto local =
      LocalParameterStore::Create(MlpTensorSpecs(to.layers, 1), SgdOptions{});
  FailingStore store(local->get(), 5);
  auto trainer = Trainer::Create(to, backend.get(), &store, train_, nullptr);
  ASSERT_TRUE(trainer.ok());
  auto r = (*trainer)->Run();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("clock 5"), std::string::npos)
      << r.status().ToString();
  EXPECT_EQ((*local)->version(), 5);
}

// A backend whose gradients stay "on the device": host memory here, handed
// out through device_grad() as a CUDA backend hands out device pointers.
class FakeDeviceBackend : public Backend {
 public:
  explicit FakeDeviceBackend(std::unique_ptr<Backend> inner)
      : Backend(inner->layers()), inner_(std::move(inner)) {
    for (size_t i = 0; i < num_tensors(); ++i)
      dev_.emplace_back(tensor_elems(i));
  }
  std::string name() const override { return "fake-device"; }
  Status SetParameters(const std::vector<const float*>& t) override {
    return inner_->SetParameters(t);
  }
  StatusOr<float> ForwardBackward(const float* x, const uint8_t* y, int batch,
                                  const std::vector<float*>& host) override {
    if (host.empty()) ++steps_without_host_grads;
    std::vector<float*> d;
    for (auto& v : dev_) d.push_back(v.data());
    ASSIGN_OR_RETURN(float loss, inner_->ForwardBackward(x, y, batch, d));
    for (size_t i = 0; i < host.size(); ++i)
      std::memcpy(host[i], dev_[i].data(), dev_[i].size() * sizeof(float));
    return loss;
  }
  StatusOr<EvalResult> Evaluate(const float* x, const uint8_t* y,
                                int64_t n) override {
    return inner_->Evaluate(x, y, n);
  }
  const float* device_grad(size_t t) const override {
    return t < dev_.size() ? dev_[t].data() : nullptr;
  }
  int steps_without_host_grads = 0;

 private:
  std::unique_ptr<Backend> inner_;
  std::vector<std::vector<float>> dev_;
};

// Records every pushed gradient (copied), then forwards it as a host push.
// accepts: whether it takes device gradients.
class RecordingStore : public ParameterStore {
 public:
  RecordingStore(ParameterStore* inner, bool accepts, std::vector<int> layers)
      : inner_(inner), accepts_(accepts), layers_(std::move(layers)) {}
  Status Pull(int64_t clock, const std::vector<float*>& t) override {
    return inner_->Pull(clock, t);
  }
  Status Push(int64_t clock, const std::vector<const float*>& g) override {
    ++host_pushes;
    Record(g);
    return inner_->Push(clock, g);
  }
  bool AcceptsDeviceGradients() const override { return accepts_; }
  Status PushDevice(int64_t clock,
                    const std::vector<const float*>& g) override {
    ++device_pushes;
    Record(g);
    return inner_->Push(clock, g);
  }
  Status Clock(int64_t c) override { return inner_->Clock(c); }
  TrafficStats traffic() const override { return inner_->traffic(); }

  int host_pushes = 0, device_pushes = 0;
  std::vector<std::vector<float>> pushed;  // all tensors of a step, joined

 private:
  void Record(const std::vector<const float*>& g) {
    std::vector<float> all;
    const auto specs = MlpTensorSpecs(layers_, 1);
    for (size_t i = 0; i < g.size(); ++i)
      all.insert(all.end(), g[i], g[i] + specs[i].num_elements());
    pushed.push_back(std::move(all));
  }
  ParameterStore* inner_;
  bool accepts_;
  std::vector<int> layers_;
};

// The device path (device gradients + a store that accepts them) pushes the
// same gradients as the host path; without either, the host path is used.
TEST_F(TrainerTest, DeviceGradientsReachPushDeviceUnchanged) {
  TrainerOptions to;
  to.layers = {784, 16, 10};
  to.max_steps = 4;
  to.epochs = 0;
  to.eval = false;
  to.print_summary = false;
  struct Run {
    int host_pushes, device_pushes, no_host_grad_steps;
    std::vector<std::vector<float>> pushed;
  };
  auto run = [&](bool device_backend, bool accepts) {
    std::unique_ptr<Backend> cpu = Cpu(to.layers);
    FakeDeviceBackend* fake = nullptr;
    std::unique_ptr<Backend> backend;
    if (device_backend) {
      auto f = std::make_unique<FakeDeviceBackend>(std::move(cpu));
      fake = f.get();
      backend = std::move(f);
    } else {
      backend = std::move(cpu);
    }
    auto local =
        LocalParameterStore::Create(MlpTensorSpecs(to.layers, 1), SgdOptions{});
    EXPECT_TRUE(local.ok());
    RecordingStore store(local->get(), accepts, to.layers);
    auto trainer = Trainer::Create(to, backend.get(), &store, train_, nullptr);
    EXPECT_TRUE(trainer.ok()) << trainer.status().ToString();
    auto r = (*trainer)->Run();
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return Run{store.host_pushes, store.device_pushes,
               fake ? fake->steps_without_host_grads : 0,
               std::move(store.pushed)};
  };
  const Run device = run(true, true);
  EXPECT_EQ(device.device_pushes, 4);
  EXPECT_EQ(device.host_pushes, 0);
  EXPECT_EQ(device.no_host_grad_steps, 4);
  for (auto [dev_backend, accepts] :
       {std::pair{true, false}, std::pair{false, true},
        std::pair{false, false}}) {
    const Run host = run(dev_backend, accepts);
    EXPECT_EQ(host.device_pushes, 0);
    EXPECT_EQ(host.host_pushes, 4);
    EXPECT_EQ(host.no_host_grad_steps, 0);
    EXPECT_EQ(host.pushed, device.pushed);
  }
}

// A LayeredStep over a LocalParameterStore: keeps each layer's gradients
// as its hook hands them over (a later change to the buffers would be
// missed), pushes them and pulls the next weights at EndStep, and writes
// them out layer by layer in WaitLayer. Records the calls.
class RecordingLayeredStep : public LayeredStep {
 public:
  RecordingLayeredStep(LocalParameterStore* store, size_t num_layers)
      : store_(store), num_layers_(num_layers) {
    for (const TensorSpec& t : store->specs()) {
      kept_.emplace_back(t.num_elements());
      pulled_.emplace_back(t.num_elements());
    }
  }
  Status BeginBackward(int64_t clock,
                       const std::vector<const float*>& grads) override {
    clock_ = clock, grads_ = grads;
    return Status::OK();
  }
  Status LayerGradientsReady(int layer) override {
    calls.push_back("g" + std::to_string(layer));
    if (pending_) return Status::FailedPrecondition("pull pending");
    for (size_t t : {2 * layer, 2 * layer + 1})
      std::memcpy(kept_[t].data(), grads_[t], kept_[t].size() * 4);
    return Status::OK();
  }
  Status EndStep() override {
    calls.push_back("end");
    std::vector<const float*> k;
    std::vector<float*> p;
    for (auto& t : kept_) k.push_back(t.data());
    for (auto& t : pulled_) p.push_back(t.data());
    RETURN_IF_ERROR(store_->Push(clock_, k));
    RETURN_IF_ERROR(store_->Clock(clock_ + 1));
    RETURN_IF_ERROR(store_->Pull(clock_ + 1, p));
    pending_ = true, written_ = 0;
    return Status::OK();
  }
  bool pull_pending() const override { return pending_; }
  int64_t uncounted_wait_ns() const override { return 0; }
  Status WaitLayer(int layer, const std::vector<float*>& tensors) override {
    calls.push_back("w" + std::to_string(layer));
    for (; pending_ && written_ <= static_cast<size_t>(layer); ++written_) {
      for (size_t t : {2 * written_, 2 * written_ + 1})
        std::memcpy(tensors[t], pulled_[t].data(), pulled_[t].size() * 4);
    }
    if (written_ == num_layers_) pending_ = false;
    return Status::OK();
  }
  std::vector<std::string> calls;

 private:
  LocalParameterStore* store_;
  size_t num_layers_;
  int64_t clock_ = 0;
  std::vector<const float*> grads_;
  std::vector<std::vector<float>> kept_, pulled_;
  bool pending_ = false;
  size_t written_ = 0;
};

// Layered steps (--overlap) train exactly as plain ones: same final
// weights and accuracy, bit for bit, with evaluations in between.
TEST_F(TrainerTest, LayeredStepsTrainBitwiseAsPlainSteps) {
  TrainerOptions to;
  to.layers = {784, 32, 16, 10};
  to.max_steps = 25;
  to.epochs = 0;
  to.eval_every = 10;
  to.print_summary = false;
  auto train = [&](bool layered, std::vector<std::string>* calls) {
    auto backend = Cpu(to.layers);
    auto store =
        LocalParameterStore::Create(MlpTensorSpecs(to.layers, 1), SgdOptions{});
    EXPECT_TRUE(store.ok());
    RecordingLayeredStep step(store->get(), to.layers.size() - 1);
    auto trainer = Trainer::Create(to, backend.get(), store->get(), train_,
                                   test_, layered ? &step : nullptr);
    EXPECT_TRUE(trainer.ok()) << trainer.status().ToString();
    auto r = (*trainer)->Run();
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    std::vector<std::vector<float>> w;
    std::vector<float*> p;
    for (const TensorSpec& t : (*store)->specs())
      w.emplace_back(t.num_elements());
    for (auto& t : w) p.push_back(t.data());
    EXPECT_TRUE((*store)->Pull(to.max_steps, p).ok());
    w.push_back({static_cast<float>(r->final_test_acc)});
    *calls = step.calls;
    return w;
  };
  std::vector<std::string> plain_calls, calls;
  EXPECT_EQ(train(false, &plain_calls), train(true, &calls));
  EXPECT_TRUE(plain_calls.empty());
  // Step 0 pulls whole; steps 1.. wait per layer before its forward (the
  // evaluations at steps 10 and 20 and the final one wait for all first).
  const std::vector<std::string> step0 = {"g2", "g1", "g0", "end"};
  ASSERT_GE(calls.size(), 12u);
  EXPECT_EQ(std::vector<std::string>(calls.begin(), calls.begin() + 4), step0);
  EXPECT_EQ(
      std::vector<std::string>(calls.begin() + 4, calls.begin() + 11),
      (std::vector<std::string>{"w0", "w1", "w2", "g2", "g1", "g0", "end"}));
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "end"), 25);
  EXPECT_EQ(calls.back(), "w2");  // the final evaluation's pull
}

// The default ParameterStore takes host gradients only.
TEST(ParameterStoreTest, DeviceGradientsAreOptIn) {
  auto local = LocalParameterStore::Create(MlpTensorSpecs({784, 16, 10}, 1),
                                           SgdOptions{});
  ASSERT_TRUE(local.ok());
  EXPECT_FALSE((*local)->AcceptsDeviceGradients());
  EXPECT_EQ((*local)->PushDevice(0, {}).code(), StatusCode::kUnimplemented);
}

// Two workers in two threads share one in-process store (asynchronous
// SGD without a server): each trains on its own half, rank 0 evaluates.
TEST_F(TrainerTest, TwoAsyncWorkersShareAStore) {
  const std::vector<int> layers = {784, 64, 10};
  SgdOptions sgd;
  sgd.lr = 0.02f;
  auto store = LocalParameterStore::Create(MlpTensorSpecs(layers, 3), sgd);
  ASSERT_TRUE(store.ok());
  StatusOr<TrainResult> results[2] = {Status::Internal("not run"),
                                      Status::Internal("not run")};
  std::thread threads[2];
  for (int rank = 0; rank < 2; ++rank) {
    threads[rank] = std::thread([&, rank] {
      TrainerOptions to;
      to.layers = layers;
      to.rank = rank;
      to.num_workers = 2;
      to.epochs = 1;
      to.eval = rank == 0;
      to.log_every = 0;
      to.print_summary = false;
      auto backend = Cpu(layers);
      auto t = Trainer::Create(to, backend.get(), store->get(), train_,
                               rank == 0 ? test_ : nullptr);
      if (!t.ok()) {
        results[rank] = t.status();
        return;
      }
      results[rank] = (*t)->Run();
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(results[0].ok()) << results[0].status().ToString();
  ASSERT_TRUE(results[1].ok()) << results[1].status().ToString();
  EXPECT_EQ(results[0]->steps, 469);  // ceil(30000 / 64)
  EXPECT_EQ(results[1]->steps, 469);
  EXPECT_EQ((*store)->version(), 2 * 469);
  // Rank 0's final pull may precede rank 1's last pushes; the bar is loose.
  EXPECT_GE(results[0]->final_test_acc, 0.78);
}

}  // namespace
}  // namespace asyncps::worker
