#include "worker/trainer.h"

#include <glog/logging.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "worker/model.h"

namespace asyncps::worker {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

const char kMetricsCsvHeader[] =
    "wall_s,rank,step,epoch,samples,train_loss,test_acc,bytes_pushed_raw,bytes_"
    "pushed_wire,"
    "bytes_pulled,pull_wait_ms,compute_ms,staleness";

Trainer::Trainer(const TrainerOptions& options, Backend* backend,
                 ParameterStore* store, const Dataset* train,
                 const Dataset* test, LayeredStep* layered)
    : options_(options),
      backend_(backend),
      store_(store),
      layered_(layered),
      train_(train),
      test_(test) {}

Trainer::~Trainer() = default;

int64_t Trainer::batches_per_epoch() const {
  return batches_->batches_per_epoch();
}

StatusOr<std::unique_ptr<Trainer>> Trainer::Create(
    const TrainerOptions& o, Backend* backend, ParameterStore* store,
    const Dataset* train, const Dataset* test, LayeredStep* layered) {
  if (backend == nullptr || store == nullptr || train == nullptr) {
    return Status::InvalidArgument(
        "Trainer needs a backend, a parameter store and training data");
  }
  RETURN_IF_ERROR(ValidateLayers(o.layers));
  if (o.layers.front() != train->dim()) {
    return Status::InvalidArgument(
        "first layer size " + std::to_string(o.layers.front()) +
        " does not match the data's " + std::to_string(train->dim()) +
        " inputs per example");
  }
  if (o.layers.back() != Dataset::kNumClasses) {
    return Status::InvalidArgument(
        "last layer size " + std::to_string(o.layers.back()) +
        " does not match the " + std::to_string(Dataset::kNumClasses) +
        " classes");
  }
  if (backend->layers() != o.layers) {
    return Status::InvalidArgument(
        "backend model " + LayersToString(backend->layers()) +
        " differs from trainer model " + LayersToString(o.layers));
  }
  if (o.batch < 1)
    return Status::InvalidArgument("batch must be >= 1, got " +
                                   std::to_string(o.batch));
  if (o.epochs < 0) return Status::InvalidArgument("epochs must be >= 0");
  if (o.max_steps < 0) return Status::InvalidArgument("max_steps must be >= 0");
  if (o.epochs == 0 && o.max_steps == 0) {
    return Status::InvalidArgument(
        "nothing to do: epochs and max_steps are both 0");
  }
  if (o.eval_every < 0 || o.log_every < 0) {
    return Status::InvalidArgument("eval_every and log_every must be >= 0");
  }
  if (!(o.slowdown >= 1.0) || !std::isfinite(o.slowdown)) {
    return Status::InvalidArgument("slowdown must be >= 1, got " +
                                   std::to_string(o.slowdown));
  }
  if (o.eval) {
    if (test == nullptr)
      return Status::InvalidArgument("eval is on but no test set was given");
    if (test->dim() != train->dim()) {
      return Status::InvalidArgument(
          "test images have " + std::to_string(test->dim()) +
          " pixels, train images " + std::to_string(train->dim()));
    }
  }
  if (layered != nullptr && !backend->supports_layered_steps()) {
    return Status::InvalidArgument(
        "overlapping communication with backward needs a backend with "
        "layered steps (the CPU and CUDA backends); " +
        backend->name() + " has none");
  }
  std::unique_ptr<Trainer> t(
      new Trainer(o, backend, store, train, test, layered));
  BatchOptions bo;
  bo.partition.rank = o.rank;
  bo.partition.num_workers = o.num_workers;
  bo.partition.kind = o.partition;
  bo.partition.seed = o.seed;
  bo.batch_size = o.batch;
  bo.drop_last = o.drop_last;
  ASSIGN_OR_RETURN(t->batches_, BatchIterator::Create(train, bo));
  t->total_steps_ = PlannedSteps(o, train->num_examples);
  for (size_t i = 0; i < backend->num_tensors(); ++i) {
    t->weights_.emplace_back(backend->tensor_elems(i));
    t->grads_.emplace_back(backend->tensor_elems(i));
  }
  if (!o.metrics_csv.empty()) {
    t->csv_.reset(std::fopen(o.metrics_csv.c_str(), "w"));
    if (!t->csv_) {
      return Status::InvalidArgument("cannot open metrics CSV '" +
                                     o.metrics_csv + "' for writing");
    }
    std::fprintf(t->csv_.get(), "%s\n", kMetricsCsvHeader);
  }
  return t;
}

int64_t Trainer::PlannedSteps(const TrainerOptions& o, int64_t n) {
  if (o.batch < 1 || o.num_workers < 1) return 0;
  const int64_t per_epoch =
      BatchesPerEpoch(n, o.num_workers, o.batch, o.drop_last);
  int64_t steps = o.epochs > 0 ? per_epoch * o.epochs : o.max_steps;
  if (o.max_steps > 0) steps = std::min(steps, o.max_steps);
  return steps;
}

StatusOr<EvalResult> Trainer::Evaluate() {
  return backend_->Evaluate(test_->images.data(), test_->labels.data(),
                            test_->num_examples);
}

double Trainer::StoreSeconds() const {
  const TrafficStats t = store_->traffic();
  const int64_t uncounted = layered_ ? layered_->uncounted_wait_ns() : 0;
  return (t.pull_wait_ns + t.push_ns + t.clock_ns + uncounted) / 1e9;
}

// What Run carries from one step to the next.
struct Trainer::RunState {
  TrainResult result;
  std::vector<float*> weight_ptrs;
  std::vector<const float*> weight_cptrs, grad_cptrs;
  std::vector<float*> grad_ptrs;
  // Device path: the gradients stay on the GPU and the store compresses
  // them there; otherwise they are copied to grads_ and pushed from there.
  bool device_push = false;
  std::vector<const float*> device_grads;
  const std::vector<float*> no_host_grads{};

  Clock::time_point start;
  double eval_s = 0;
  double interval_loss = 0, interval_compute_s = 0;
  int64_t interval_steps = 0;
  int64_t samples = 0;
  double last_acc = -1, last_eval_loss = -1;
  Clock::time_point last_log;
  int64_t last_log_samples = 0;
  double last_log_eval_s = 0;

  // Layered steps: each layer's weights of the pull in flight are waited
  // for right before its forward (`arriving`: this step's weights are
  // those of a pull by layers), each layer's gradients handed over as soon
  // as they are complete.
  int num_layers = 0;
  bool arriving = false;
  LayerHooks hooks;
};

StatusOr<TrainResult> Trainer::Run() {
  RunState rs;
  StartRun(&rs);
  for (int64_t step = 0; step < total_steps_; ++step) {
    RETURN_IF_ERROR(RunStep(&rs, step));
  }
  return FinishRun(&rs);
}

void Trainer::StartRun(RunState* rs) {
  for (auto& w : weights_)
    rs->weight_ptrs.push_back(w.data()), rs->weight_cptrs.push_back(w.data());
  for (auto& g : grads_)
    rs->grad_ptrs.push_back(g.data()), rs->grad_cptrs.push_back(g.data());
  rs->device_push = layered_ == nullptr &&
                    backend_->device_grad(0) != nullptr &&
                    store_->AcceptsDeviceGradients();
  rs->device_grads.assign(backend_->num_tensors(), nullptr);
  rs->start = Clock::now();
  rs->last_log = rs->start;
  rs->num_layers = static_cast<int>(options_.layers.size()) - 1;
  if (layered_ != nullptr) {
    rs->hooks.before_forward = [this, rs](int l) -> Status {
      if (!rs->arriving) return Status::OK();
      RETURN_IF_ERROR(layered_->WaitLayer(l, rs->weight_ptrs));
      return backend_->SetLayerParameters(l, weights_[2 * l].data(),
                                          weights_[2 * l + 1].data());
    };
    rs->hooks.after_backward = [this](int l) {
      return layered_->LayerGradientsReady(l);
    };
  }
}

// Completes a pull by layers in flight into weights_ and the backend.
Status Trainer::FinishLayeredPull(RunState* rs) {
  RETURN_IF_ERROR(layered_->WaitLayer(rs->num_layers - 1, rs->weight_ptrs));
  rs->arriving = false;
  return backend_->SetParameters(rs->weight_cptrs);
}

Status Trainer::EvaluateNow(RunState* rs) {
  const auto t0 = Clock::now();
  ASSIGN_OR_RETURN(EvalResult e, Evaluate());
  rs->eval_s += Seconds(t0, Clock::now());
  rs->last_acc = e.accuracy;
  rs->last_eval_loss = e.loss;
  if (options_.metrics) options_.metrics->OnEval(e.accuracy, e.loss);
  return Status::OK();
}

Status Trainer::RunStep(RunState* rs, int64_t step) {
  ASSIGN_OR_RETURN(const Batch* batch, batches_->Next());
  const std::string at = " at clock " + std::to_string(step);
  rs->arriving = layered_ != nullptr && layered_->pull_pending();
  if (!rs->arriving) {
    RETURN_IF_ERROR(
        store_->Pull(step, rs->weight_ptrs).WithContext("pull" + at));
    RETURN_IF_ERROR(backend_->SetParameters(rs->weight_cptrs));
  }
  bool evaluated = false;
  if (options_.eval && options_.eval_every > 0 && step > 0 &&
      step % options_.eval_every == 0) {
    if (rs->arriving) {
      RETURN_IF_ERROR(FinishLayeredPull(rs).WithContext("pull" + at));
    }
    RETURN_IF_ERROR(EvaluateNow(rs));
    evaluated = true;
  }
  double compute_s = 0;
  ASSIGN_OR_RETURN(const float loss, ComputeStep(rs, *batch, step, &compute_s));
  if (!std::isfinite(loss)) {
    return Status::Internal(
        "training diverged: loss is " + std::to_string(loss) + " at step " +
        std::to_string(step) + " (lower the learning rate)");
  }
  if (options_.slowdown > 1.0) {
    std::this_thread::sleep_for(
        std::chrono::duration<double>((options_.slowdown - 1.0) * compute_s));
  }
  RETURN_IF_ERROR(PushStep(rs, step));
  rs->samples += batch->size;
  rs->result.compute_s += compute_s;
  rs->interval_loss += loss;
  rs->interval_compute_s += compute_s;
  ++rs->interval_steps;
  if (options_.metrics) {
    options_.metrics->OnStep(loss, batch->size, compute_s, store_->traffic());
  }

  const bool last = step + 1 == total_steps_;
  if (last && options_.eval) {
    // Final evaluation with the weights after the last update.
    if (layered_ != nullptr && layered_->pull_pending()) {
      RETURN_IF_ERROR(FinishLayeredPull(rs).WithContext("final pull"));
    } else {
      RETURN_IF_ERROR(
          store_->Pull(step + 1, rs->weight_ptrs).WithContext("final pull"));
      RETURN_IF_ERROR(backend_->SetParameters(rs->weight_cptrs));
    }
    RETURN_IF_ERROR(EvaluateNow(rs));
    evaluated = true;
  }
  const bool log =
      last || (options_.log_every > 0 && (step + 1) % options_.log_every == 0);
  if (log || evaluated) LogInterval(rs, *batch, step, last, log, evaluated);
  return Status::OK();
}

// Forward and backward on `batch`: the loss, and in *compute_s the time
// spent computing (the store's waits of a layered step left out).
StatusOr<float> Trainer::ComputeStep(RunState* rs, const Batch& batch,
                                     int64_t step, double* compute_s) {
  const auto c0 = Clock::now();
  float loss = 0;
  if (layered_ != nullptr) {
    if (store_->NextGradientBuffers(&rs->grad_ptrs)) {
      // The store's buffers: each layer's push sends them without a copy.
      rs->grad_cptrs.assign(rs->grad_ptrs.begin(), rs->grad_ptrs.end());
    }
    const double store_s = StoreSeconds();
    RETURN_IF_ERROR(layered_->BeginBackward(step, rs->grad_cptrs));
    ASSIGN_OR_RETURN(loss, backend_->ForwardBackwardLayered(
                               batch.x.data(), batch.y.data(), batch.size,
                               rs->grad_ptrs, rs->hooks));
    *compute_s = Seconds(c0, Clock::now()) - (StoreSeconds() - store_s);
  } else {
    if (!rs->device_push && store_->NextGradientBuffers(&rs->grad_ptrs)) {
      // The store's buffers: pushed from there without a copy.
      rs->grad_cptrs.assign(rs->grad_ptrs.begin(), rs->grad_ptrs.end());
    }
    ASSIGN_OR_RETURN(loss,
                     backend_->ForwardBackward(
                         batch.x.data(), batch.y.data(), batch.size,
                         rs->device_push ? rs->no_host_grads : rs->grad_ptrs));
    *compute_s = Seconds(c0, Clock::now());
  }
  return loss;
}

// The step's gradients to the store, then (without a LayeredStep) the
// clock.
Status Trainer::PushStep(RunState* rs, int64_t step) {
  const std::string at = " at clock " + std::to_string(step);
  if (layered_ != nullptr) {
    RETURN_IF_ERROR(layered_->EndStep().WithContext("overlapped push" + at));
  } else if (rs->device_push) {
    for (size_t i = 0; i < rs->device_grads.size(); ++i)
      rs->device_grads[i] = backend_->device_grad(i);
    RETURN_IF_ERROR(
        store_->PushDevice(step, rs->device_grads)
            .WithContext("device push at clock " + std::to_string(step)));
  } else {
    RETURN_IF_ERROR(store_->Push(step, rs->grad_cptrs)
                        .WithContext("push at clock " + std::to_string(step)));
  }
  if (layered_ == nullptr) RETURN_IF_ERROR(store_->Clock(step + 1));
  return Status::OK();
}

// The interval's CSV row and (when `log`) its log line; starts a new
// interval.
void Trainer::LogInterval(RunState* rs, const Batch& batch, int64_t step,
                          bool last, bool log, bool evaluated) {
  const auto now = Clock::now();
  const TrafficStats tr = store_->traffic();
  const double mean_loss =
      rs->interval_loss / std::max<int64_t>(rs->interval_steps, 1);
  rs->result.final_train_loss = mean_loss;
  if (csv_) {
    std::fprintf(csv_.get(), "%.3f,%d,%lld,%lld,%lld,%.6f,",
                 Seconds(rs->start, now), options_.rank,
                 static_cast<long long>(step + 1),
                 static_cast<long long>(batch.epoch),
                 static_cast<long long>(rs->samples), mean_loss);
    if (evaluated) std::fprintf(csv_.get(), "%.4f", rs->last_acc);
    std::fprintf(
        csv_.get(), ",%llu,%llu,%llu,%.3f,%.4f,%lld\n",
        static_cast<unsigned long long>(tr.bytes_pushed_raw),
        static_cast<unsigned long long>(tr.bytes_pushed_wire),
        static_cast<unsigned long long>(tr.bytes_pulled), tr.pull_wait_ns / 1e6,
        1e3 * rs->interval_compute_s / std::max<int64_t>(rs->interval_steps, 1),
        static_cast<long long>(tr.last_staleness));
    if (last) std::fflush(csv_.get());
  }
  if (log) {
    // Training throughput: evaluation time is left out.
    const double dt =
        Seconds(rs->last_log, now) - (rs->eval_s - rs->last_log_eval_s);
    std::fprintf(
        stderr,
        "[rank %d] epoch %lld step %lld/%lld  %.0f samples/s  loss %.4f  "
        "test_acc %s\n",
        options_.rank, static_cast<long long>(batch.epoch),
        static_cast<long long>(step + 1), static_cast<long long>(total_steps_),
        dt > 0 ? (rs->samples - rs->last_log_samples) / dt : 0.0, mean_loss,
        rs->last_acc < 0 ? "-"
                         : std::to_string(rs->last_acc).substr(0, 6).c_str());
    rs->last_log = now;
    rs->last_log_samples = rs->samples;
    rs->last_log_eval_s = rs->eval_s;
  }
  rs->interval_loss = 0;
  rs->interval_compute_s = 0;
  rs->interval_steps = 0;
}

// The run's totals and SUMMARY line.
StatusOr<TrainResult> Trainer::FinishRun(RunState* rs) {
  TrainResult& result = rs->result;
  const auto end = Clock::now();
  result.steps = total_steps_;
  result.samples = rs->samples;
  result.wall_s = Seconds(rs->start, end);
  result.eval_s = rs->eval_s;
  const double train_s = result.wall_s - rs->eval_s;
  result.samples_per_s = train_s > 0 ? rs->samples / train_s : 0;
  result.final_test_acc = rs->last_acc;
  result.final_test_loss = rs->last_eval_loss;
  result.traffic = store_->traffic();
  char line[512];
  std::snprintf(
      line, sizeof(line),
      "SUMMARY rank=%d final_test_acc=%.4f samples_per_s=%.1f "
      "bytes_pushed_raw=%llu "
      "bytes_pushed_wire=%llu bytes_pulled=%llu steps=%lld wall_s=%.3f",
      options_.rank, result.final_test_acc, result.samples_per_s,
      static_cast<unsigned long long>(result.traffic.bytes_pushed_raw),
      static_cast<unsigned long long>(result.traffic.bytes_pushed_wire),
      static_cast<unsigned long long>(result.traffic.bytes_pulled),
      static_cast<long long>(result.steps), result.wall_s);
  result.summary = line;
  if (options_.print_summary) {
    std::fprintf(stdout, "%s\n", line);
    std::fflush(stdout);
  }
  if (csv_ && std::ferror(csv_.get())) {
    return Status::Internal("writing the metrics CSV '" + options_.metrics_csv +
                            "' failed");
  }
  return std::move(result);
}

}  // namespace asyncps::worker
