// CtrTrainer: the data-parallel training loop of the click model
// (worker/ctr/click_model.h) against the parameter server.
//
// Each step c = 0, 1, ... of worker `rank`:
//   read a batch of this worker's lines of the training file (CriteoReader)
//   Pull(c): the dense tensor and the rows of the batch's keys, in one
//            request per shard (each shard gets the unique keys it owns)
//   forward/backward of the factorization machine on the CPU
//   Push(c): the dense gradient and the rows' gradients (repeated keys
//            summed), one message per shard; Clock(c + 1)
// The push and the clock of step c and the pull of step c + 1 leave in one
// burst on each connection, so a step costs one round trip per shard.
// Consistency (BSP/SSP/ASP) is the servers'.
//
// Evaluation (log loss and AUC on the test file) pulls the rows of the test
// examples in batches with the weights of the moment, every eval_every
// steps and after the last.
//
// Output: a metrics CSV (one row per logged step), progress on stderr, and
//   SUMMARY rank=<r> test_logloss=<x> test_auc=<x> examples_per_s=<x>
//     steps=<n> wall_s=<s>
// on stdout (test figures -1 when not evaluated).
//
// Ownership: borrows the Client (which must outlive the trainer).
// Thread safety: one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/sparse_table.h"
#include "common/status.h"
#include "worker/client.h"
#include "worker/ctr/click_model.h"
#include "worker/ctr/criteo.h"

namespace asyncps::worker::ctr {

struct CtrTrainerOptions {
  // Criteo-format training file (plain or gzip). Required.
  std::string train_path;
  // Test file (labelled); empty: no evaluation. Default: "".
  std::string test_path;
  // This worker, in [0, num_workers). Default: 0 of 1.
  int rank = 0;
  int num_workers = 1;
  // Examples per step and worker, >= 1. Default: 1024.
  int batch = 1024;
  // Passes over this worker's lines. Default: 1.
  int epochs = 1;
  // Stop after this many steps; 0: no limit. Default: 0.
  int64_t max_steps = 0;
  // Factor dimension k of the FM (rows hold 1 + k floats). Default: 8.
  int factor_dim = 8;
  // Initial rows N(0, init_scale^2) (factors must start away from 0 to
  // learn). Default: 0.05.
  float init_scale = 0.05f;
  // Per-row optimizer of the embedding table. Default: AdaGrad, lr 0.05,
  // initial accumulator 0 (the gradients are of the batch's mean loss, so
  // small; dense parameters: the servers' --optimizer).
  RowOptimizerOptions row_optimizer = [] {
    RowOptimizerOptions o;
    o.kind = RowOptimizerKind::kAdaGrad;
    o.lr = 0.05f;
    return o;
  }();
  // Admission and expiry of the table (TableSpec). Default: 0, 0 (off).
  uint32_t admit_after_pushes = 0;
  int64_t expire_after_clocks = 0;
  // Seed of the initial rows. Default: 1.
  uint64_t seed = 1;
  // Evaluate on the test file every N steps (and after the last); 0: only
  // after the last. Default: 0.
  int64_t eval_every = 0;
  // Test examples used (0: the whole file). Default: 0.
  int64_t test_examples = 0;
  // Progress and CSV row every N steps. Default: 100.
  int64_t log_every = 100;
  // Metrics CSV path; empty: none. Default: "".
  std::string metrics_csv;
  // Longest wait for any request. Default: 120 s.
  std::chrono::milliseconds timeout{120000};
  // Print the SUMMARY line. Default: true.
  bool print_summary = true;
};

struct CtrEval {
  double logloss = -1;
  double auc = -1;
  int64_t examples = 0;
};

struct CtrResult {
  int64_t steps = 0;
  int64_t examples = 0;
  double wall_s = 0;
  double examples_per_s = 0;    // training examples / (wall - eval time)
  double final_train_loss = 0;  // mean over the last logging interval
  CtrEval test;                 // last evaluation (-1: none)
  double pull_wait_s = 0;       // blocked in pulls
};

class CtrTrainer {
 public:
  // Registers the model (dense tensor + embedding table; idempotent) and
  // opens the data. `client` must have been created with this rank.
  static StatusOr<std::unique_ptr<CtrTrainer>> Create(
      const CtrTrainerOptions& options, Client* client);
  ~CtrTrainer();

  StatusOr<CtrResult> Run();
  // Log loss and AUC on the test file with the current weights.
  StatusOr<CtrEval> Evaluate(int64_t clock);

  const ClickModel& model() const { return model_; }

 private:
  CtrTrainer(const CtrTrainerOptions& options, Client* client);
  // Reads the next batch (rewinding at the end of an epoch); false when the
  // run is over.
  StatusOr<bool> NextBatch(std::vector<CriteoExample>* batch);
  Status StartPull(int64_t clock, const std::vector<CriteoExample>& batch,
                   std::vector<uint64_t>* keys, std::vector<float>* rows,
                   Client::Ticket* ticket);

  const CtrTrainerOptions options_;
  Client* const client_;
  ClickModel model_;
  std::unique_ptr<CriteoReader> reader_;
  std::vector<CriteoExample> test_;
  int epoch_ = 0;
  int64_t steps_ = 0;
  std::vector<float> dense_;
};

}  // namespace asyncps::worker::ctr
