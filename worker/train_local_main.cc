// ps_train_local: trains the MLP on an MNIST-format dataset in one process,
// with the weights and the SGD optimizer held locally (LocalParameterStore).
// The single-process baseline for the parameter-server runs.
//
//   ps_train_local --epochs=10 --device=cpu --metrics_csv=/tmp/local.csv
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <cstdio>

#include "common/tool_main.h"
#include "worker/backend.h"
#include "worker/idx_reader.h"
#include "worker/local_parameter_store.h"
#include "worker/model.h"
#include "worker/trainer.h"

DEFINE_string(
    data_dir, "/usr/share/datasets/fashion-mnist",
    "Directory holding {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]");
DEFINE_string(layers, "784,256,128,10",
              "MLP layer sizes, input first, 10 classes last");
DEFINE_int32(batch, 64, "Minibatch size");
DEFINE_int32(epochs, 10,
             "Passes over the training set (0: use --max_steps only)");
DEFINE_int64(max_steps, 0, "Stop after this many steps (0: no limit)");
DEFINE_double(lr, 0.05, "Learning rate");
DEFINE_double(momentum, 0.9, "SGD momentum, in [0, 1)");
DEFINE_bool(nesterov, false, "Nesterov momentum");
DEFINE_double(weight_decay, 0.0, "L2 weight decay");
DEFINE_string(lr_schedule, "cosine",
              "constant | cosine (decays the lr to 0 over the run)");
DEFINE_string(device, "auto", "auto | cpu | cuda");
DEFINE_int32(threads, 1, "CPU backend: OpenBLAS threads");
DEFINE_uint64(seed, 1, "Seed for weights initialisation and shuffling");
DEFINE_int64(eval_every, 0,
             "Evaluate on the test set every N steps (0: at the end only)");
DEFINE_int64(log_every, 200, "Progress line and CSV row every N steps");
DEFINE_double(slowdown, 1.0,
              "Make each step's compute take this many times as long");
DEFINE_string(metrics_csv, "", "Write per-step metrics to this CSV file");
DEFINE_bool(drop_last, false, "Skip each epoch's short last batch");
DEFINE_bool(normalize, true,
            "Standardise pixels with Fashion-MNIST's mean/stddev");

namespace {

using namespace asyncps;
using namespace asyncps::worker;

Status Main() {
  ASSIGN_OR_RETURN(std::vector<int> layers, ParseLayers(FLAGS_layers));
  if (FLAGS_batch < 1) return Status::InvalidArgument("--batch must be >= 1");
  if (FLAGS_epochs < 0 || FLAGS_max_steps < 0) {
    return Status::InvalidArgument("--epochs and --max_steps must be >= 0");
  }
  if (FLAGS_epochs == 0 && FLAGS_max_steps == 0) {
    return Status::InvalidArgument(
        "one of --epochs or --max_steps must be > 0");
  }
  if (FLAGS_threads < 1)
    return Status::InvalidArgument("--threads must be >= 1");
  ASSIGN_OR_RETURN(DeviceKind device, ParseDeviceKind(FLAGS_device));
  SgdOptions sgd;
  sgd.lr = static_cast<float>(FLAGS_lr);
  sgd.momentum = static_cast<float>(FLAGS_momentum);
  sgd.nesterov = FLAGS_nesterov;
  sgd.weight_decay = static_cast<float>(FLAGS_weight_decay);
  RETURN_IF_ERROR(ValidateSgdOptions(sgd).WithContext("bad optimizer flags"));

  LOG(INFO) << "ps_train_local: data_dir=" << FLAGS_data_dir
            << " layers=" << LayersToString(layers) << " batch=" << FLAGS_batch
            << " epochs=" << FLAGS_epochs << " max_steps=" << FLAGS_max_steps
            << " lr=" << sgd.lr << " momentum=" << sgd.momentum
            << " nesterov=" << sgd.nesterov
            << " weight_decay=" << sgd.weight_decay
            << " device=" << FLAGS_device << " threads=" << FLAGS_threads
            << " seed=" << FLAGS_seed << " eval_every=" << FLAGS_eval_every
            << " lr_schedule=" << FLAGS_lr_schedule
            << " normalize=" << FLAGS_normalize
            << " slowdown=" << FLAGS_slowdown << " metrics_csv='"
            << FLAGS_metrics_csv << "'";

  MnistOptions mo;
  if (FLAGS_normalize) {
    mo.mean = kFashionMnistMean;
    mo.stddev = kFashionMnistStddev;
  }
  ASSIGN_OR_RETURN(Dataset train, LoadMnist(FLAGS_data_dir, Split::kTrain, mo));
  ASSIGN_OR_RETURN(Dataset test, LoadMnist(FLAGS_data_dir, Split::kTest, mo));
  LOG(INFO) << "loaded " << train.num_examples << " train and "
            << test.num_examples << " test examples of " << train.rows << "x"
            << train.cols;

  BackendOptions bo;
  bo.layers = layers;
  bo.device = device;
  bo.threads = FLAGS_threads;
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, Backend::Create(bo));
  TrainerOptions to;
  to.layers = layers;
  to.batch = FLAGS_batch;
  to.epochs = FLAGS_epochs;
  to.max_steps = FLAGS_max_steps;
  to.seed = FLAGS_seed;
  to.eval_every = FLAGS_eval_every;
  to.log_every = FLAGS_log_every;
  to.slowdown = FLAGS_slowdown;
  to.metrics_csv = FLAGS_metrics_csv;
  to.drop_last = FLAGS_drop_last;
  if (FLAGS_lr_schedule == "cosine") {
    sgd.decay_steps = Trainer::PlannedSteps(to, train.num_examples);
  } else if (FLAGS_lr_schedule != "constant") {
    return Status::InvalidArgument(
        "--lr_schedule must be constant or cosine, got '" + FLAGS_lr_schedule +
        "'");
  }
  ASSIGN_OR_RETURN(
      std::unique_ptr<LocalParameterStore> store,
      LocalParameterStore::Create(MlpTensorSpecs(layers, FLAGS_seed), sgd));

  ASSIGN_OR_RETURN(
      std::unique_ptr<Trainer> trainer,
      Trainer::Create(to, backend.get(), store.get(), &train, &test));
  LOG(INFO) << "training " << trainer->total_steps() << " steps ("
            << trainer->batches_per_epoch() << " per epoch) on "
            << backend->name();
  ASSIGN_OR_RETURN(TrainResult r, trainer->Run());
  LOG(INFO) << "done: test accuracy " << r.final_test_acc << ", "
            << r.samples_per_s << " samples/s";
  return Status::OK();
}

}  // namespace

int main(int argc, char** argv) {
  asyncps::InitTool("Train an MLP on (Fashion-)MNIST in one process", &argc,
                    &argv);
  Status s = Main();
  if (!s.ok()) {
    LOG(ERROR) << s.ToString();
    return 1;
  }
  return 0;
}
