// Trainer: the data-parallel training loop of one worker.
//
// Each step c = 0, 1, ... runs
//   Pull(c) -> Backend::SetParameters -> [evaluate] -> ForwardBackward(batch)
//   -> Push(c, grads) -> Clock(c + 1)
// (with a device backend whose store AcceptsDeviceGradients(), the
// gradients stay on the device: ForwardBackward gets no host buffers and
// PushDevice(c, Backend::device_grad(...)) replaces Push)
// while a background thread prepares the next minibatch of this worker's
// partition (worker/data_partition.h). When `eval` is on, the test set is
// evaluated with the freshly pulled weights every `eval_every` steps and
// after the last step.
//
// With a LayeredStep (worker/layered_step.h; ps_worker --overlap) every
// step after the first runs Backend::ForwardBackwardLayered instead: each
// layer waits for its own weights of the pull in flight before its forward
// (Backend::SetLayerParameters), and each layer's gradients go to the
// LayeredStep as soon as backward has them; LayeredStep::EndStep replaces
// Push and Clock. compute_ms then leaves out the time spent in the store
// (pull waits, pushes, clocks, LayeredStep::uncounted_wait_ns) during the
// step.
//
// Output: a metrics CSV (one row per logged step, columns below), a
// progress line on stderr every `log_every` steps, and a SUMMARY line on
// stdout at the end:
//   SUMMARY rank=<r> final_test_acc=<a> samples_per_s=<x> bytes_pushed_raw=<n>
//     bytes_pushed_wire=<n> bytes_pulled=<n> steps=<n> wall_s=<s>
// (one line; final_test_acc is -1 when this process does not evaluate).
//
// Ownership: the Trainer borrows the backend, the store and the datasets;
// they must outlive it. A Trainer is used from one thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/backend.h"
#include "worker/data_partition.h"
#include "worker/idx_reader.h"
#include "worker/layered_step.h"
#include "worker/parameter_store.h"
#include "worker/worker_metrics.h"

namespace asyncps::worker {

struct TrainerOptions {
  // MLP sizes; must match the data: 784 inputs, 10 classes.
  std::vector<int> layers = {784, 256, 128, 10};
  // Examples per step and worker, >= 1. Default: 64.
  int batch = 64;
  // Passes over this worker's partition, >= 0. Default: 1.
  int epochs = 1;
  // Stop after this many steps; 0 = no limit. At least one of epochs and
  // max_steps must be > 0. Default: 0.
  int64_t max_steps = 0;
  // This worker, in [0, num_workers). Default: 0.
  int rank = 0;
  // Workers sharing the training set. Default: 1.
  int num_workers = 1;
  // Skip each epoch's last batch when it is short (BatchOptions::drop_last).
  // ps_worker turns it on by default when the shards run BSP. Default: false.
  bool drop_last = false;
  // How the training set is split between workers. Default: strided.
  PartitionKind partition = PartitionKind::kStrided;
  // Shuffling seed (the weights' seed is in the tensor specs). Default: 1.
  uint64_t seed = 1;
  // This process evaluates on the test set. Default: true.
  bool eval = true;
  // Evaluate every N steps (and after the last); 0 = only after the last.
  // Default: 0.
  int64_t eval_every = 0;
  // Progress line and CSV row every N steps; 0 = only the last step.
  // Default: 100.
  int64_t log_every = 100;
  // >= 1: every step sleeps (slowdown - 1) x its compute time, to emulate a
  // straggler. Default: 1.
  double slowdown = 1.0;
  // Path of the metrics CSV; empty = none. Default: empty.
  std::string metrics_csv;
  // Print the SUMMARY line to stdout. Default: true.
  bool print_summary = true;
  // Prometheus metrics fed after every step and evaluation; null: none.
  // Default: null.
  std::shared_ptr<WorkerMetrics> metrics;
};

// Metrics CSV columns, in order:
//   wall_s, rank, step, epoch, samples, train_loss, test_acc, bytes_pushed_raw,
//   bytes_pushed_wire, bytes_pulled, pull_wait_ms, compute_ms, staleness
// step = steps completed; samples = examples processed so far by this worker;
// train_loss = mean minibatch loss since the previous row; test_acc is empty
// when not evaluated at that step; byte counters and pull_wait_ms are
// cumulative; compute_ms = mean ForwardBackward time per step since the
// previous row; staleness = the store's last_staleness.
extern const char kMetricsCsvHeader[];

struct TrainResult {
  int64_t steps = 0;
  int64_t samples = 0;
  double wall_s = 0;            // whole Run()
  double eval_s = 0;            // of which evaluating
  double samples_per_s = 0;     // samples / (wall_s - eval_s)
  double compute_s = 0;         // in ForwardBackward (no --slowdown sleep)
  double final_train_loss = 0;  // mean loss over the last logging interval
  double final_test_acc = -1;   // -1 when not evaluated
  double final_test_loss = -1;
  TrafficStats traffic;
  std::string summary;  // the SUMMARY line, without newline
};

class Trainer {
 public:
  // Validates options against the data and the backend (layer sizes, batch,
  // rank, test set present when eval is on). `test` may be null when
  // options.eval is false. `layered` (borrowed; may be null: no overlap)
  // must drive the same store; the backend must then support layered steps.
  static StatusOr<std::unique_ptr<Trainer>> Create(
      const TrainerOptions& options, Backend* backend, ParameterStore* store,
      const Dataset* train, const Dataset* test,
      LayeredStep* layered = nullptr);
  ~Trainer();

  // Steps a run with these options takes on a training set of n examples:
  // min(epochs * batches_per_epoch, max_steps) (0 when options are invalid).
  static int64_t PlannedSteps(const TrainerOptions& options, int64_t n);

  // Steps this run will take: min(epochs * batches_per_epoch, max_steps).
  int64_t total_steps() const { return total_steps_; }
  int64_t batches_per_epoch() const;

  // Runs the whole loop. Returns the first error of any component.
  StatusOr<TrainResult> Run();

 private:
  Trainer(const TrainerOptions& options, Backend* backend,
          ParameterStore* store, const Dataset* train, const Dataset* test,
          LayeredStep* layered);
  StatusOr<EvalResult> Evaluate();
  // The store's time (pull waits, pushes, clocks, the LayeredStep's other
  // waits) so far, in seconds.
  double StoreSeconds() const;
  // The parts of Run; RunState carries what one step hands the next.
  struct RunState;
  void StartRun(RunState* rs);
  Status RunStep(RunState* rs, int64_t step);
  StatusOr<float> ComputeStep(RunState* rs, const Batch& batch, int64_t step,
                              double* compute_s);
  Status PushStep(RunState* rs, int64_t step);
  Status FinishLayeredPull(RunState* rs);
  Status EvaluateNow(RunState* rs);
  void LogInterval(RunState* rs, const Batch& batch, int64_t step, bool last,
                   bool log, bool evaluated);
  StatusOr<TrainResult> FinishRun(RunState* rs);

  const TrainerOptions options_;
  Backend* const backend_;
  ParameterStore* const store_;
  LayeredStep* const layered_;
  const Dataset* const train_;
  const Dataset* const test_;
  std::unique_ptr<BatchIterator> batches_;
  int64_t total_steps_ = 0;
  std::vector<std::vector<float>> weights_;  // pulled weights
  std::vector<std::vector<float>> grads_;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> csv_{nullptr, &std::fclose};
};

}  // namespace asyncps::worker
