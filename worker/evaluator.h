// Evaluator: a dedicated process that watches training from the side.
//
// It pulls the current weights as an observer (rank -1: the shards answer at
// once and it takes no part in the clocks; it does not register the model,
// its client only knows the layout (Client::UseLayout), and it waits until
// the workers have registered it), evaluates them on the test set,
// writes a metrics row, and repeats every `interval` until every shard
// reports a minimum worker clock of at least `final_clock` (training done);
// then it evaluates once more and returns. Workers then need not spend
// their own time evaluating (ps_worker --role=eval).
//
// Thread safety: RunEvaluator uses the client and the backend from the
// calling thread only.
#pragma once

#include <chrono>
#include <string>

#include "common/status.h"
#include "worker/backend.h"
#include "worker/client.h"
#include "worker/idx_reader.h"

namespace asyncps::worker {

struct EvaluatorOptions {
  // Time between evaluations. Default: 2 s.
  std::chrono::milliseconds interval{2000};
  // Stop once the shards' minimum worker clock reaches this (the workers'
  // planned steps). Required, >= 1.
  int64_t final_clock = 0;
  // Give up when the minimum clock has not moved (or no worker registered
  // the model) for this long. Default: 300 s.
  std::chrono::milliseconds stall_timeout{300000};
  // Metrics CSV (the trainer's columns; rank -1); empty = none.
  std::string metrics_csv;
};

struct EvaluatorResult {
  int evaluations = 0;
  double final_test_acc = -1;
  double final_test_loss = -1;
  int64_t final_clock = 0;  // shards' minimum clock at the last evaluation
  double wall_s = 0;
};

// REQUIRES: client->Register() succeeded (the layout is known).
StatusOr<EvaluatorResult> RunEvaluator(Client* client, Backend* backend,
                                       const Dataset& test,
                                       const EvaluatorOptions& options);

}  // namespace asyncps::worker
