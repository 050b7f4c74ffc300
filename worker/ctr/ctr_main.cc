// ps_ctr_worker: trains the click model (a factorization machine whose
// embeddings live in a sparse table on the parameter servers) on Criteo
// display-advertising data, real (Kaggle train.txt, 1TB day_N.gz) or from
// ps_criteo_gen.
//
//   ps_ctr_worker --servers=tcp://127.0.0.1:5000,tcp://127.0.0.1:5001
//       --rank=0 --num_workers=2 --train=train.txt --test=test.txt
//       --batch=1024 --epochs=1 --factor_dim=8 --metrics_csv=m0.csv
//       [--planted_json=planted.json]
//
// With --planted_json (written by ps_criteo_gen) the SUMMARY line also
// reports the planted model's Bayes-optimal log loss and AUC on the test
// file and the gap to them.
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/curve_flags.h"
#include "common/tool_main.h"
#include "worker/client.h"
#include "worker/ctr/ctr_trainer.h"

DEFINE_string(servers, "", "comma-separated shard endpoints, shard 0 first");
DEFINE_int32(rank, 0, "this worker's rank, in [0, num_workers)");
DEFINE_int32(num_workers, 1, "workers sharing the training file");
DEFINE_string(train, "", "Criteo-format training file (plain or .gz)");
DEFINE_string(test, "", "labelled Criteo-format test file; empty: no eval");
DEFINE_int64(test_examples, 0, "test examples used (0: all)");
DEFINE_string(eval, "auto", "auto (rank 0) | true | false");
DEFINE_int64(eval_every, 0, "evaluate every N steps (0: after the last)");
DEFINE_int32(batch, 1024, "examples per step and worker");
DEFINE_int32(epochs, 1, "passes over this worker's lines");
DEFINE_int64(max_steps, 0, "stop after this many steps (0: no limit)");
DEFINE_int32(factor_dim, 8, "FM factor dimension k (rows of 1 + k floats)");
DEFINE_double(init_scale, 0.05, "initial rows N(0, s^2)");
DEFINE_string(row_optimizer, "adagrad", "sgd | adagrad | adam (per row)");
DEFINE_double(row_lr, 0.05, "learning rate of the rows");
DEFINE_double(row_initial_accumulator, 0.0, "AdaGrad initial accumulator");
DEFINE_uint32(admit_after, 0,
              "store a row from its N-th push on (0, 1: at once)");
DEFINE_int64(expire_after, 0, "delete rows unseen for N clocks (0: never)");
DEFINE_string(rows_codec, "none", "rows on the wire: none | fp16 | bf16");
DEFINE_uint64(seed, 1, "seed of the initial rows");
DEFINE_int64(log_every, 100, "progress line and CSV row every N steps");
DEFINE_string(metrics_csv, "", "per-step metrics CSV");
DEFINE_string(planted_json, "",
              "ps_criteo_gen's stats file: report the gap to the optimum");
DEFINE_int32(timeout_s, 120, "deadline of any request, seconds");
DEFINE_int32(heartbeat_ms, 1000, "heartbeat interval (0: off)");

namespace {

using namespace asyncps;               // NOLINT: tool main
using namespace asyncps::worker;       // NOLINT
using namespace asyncps::worker::ctr;  // NOLINT

Status Main() {
  ClientOptions co;
  co.servers = ParseEndpoints(FLAGS_servers);
  if (co.servers.empty())
    return Status::InvalidArgument("--servers is required");
  if (FLAGS_train.empty())
    return Status::InvalidArgument("--train is required");
  if (FLAGS_num_workers < 1 || FLAGS_rank < 0 ||
      FLAGS_rank >= FLAGS_num_workers) {
    return Status::InvalidArgument("--rank must be in [0, --num_workers)");
  }
  if (FLAGS_timeout_s < 1) return Status::InvalidArgument("--timeout_s >= 1");
  if (FLAGS_eval != "auto" && FLAGS_eval != "true" && FLAGS_eval != "false")
    return Status::InvalidArgument("--eval must be auto, true or false");
  if (FLAGS_rows_codec == "none") {
    co.rows_codec = 0;
  } else if (FLAGS_rows_codec == "fp16") {
    co.rows_codec = 1;
  } else if (FLAGS_rows_codec == "bf16") {
    co.rows_codec = 2;
  } else {
    return Status::InvalidArgument("--rows_codec must be none, fp16 or bf16");
  }
  co.rank = FLAGS_rank;
  co.deadline = std::chrono::seconds(FLAGS_timeout_s);
  RETURN_IF_ERROR(CurveClientKeysFromFlags(&co.transport));
  co.heartbeat_interval = std::chrono::milliseconds(FLAGS_heartbeat_ms);

  CtrTrainerOptions o;
  o.train_path = FLAGS_train;
  const bool eval =
      FLAGS_eval == "true" || (FLAGS_eval == "auto" && FLAGS_rank == 0);
  if (eval) o.test_path = FLAGS_test;
  o.test_examples = FLAGS_test_examples;
  o.rank = FLAGS_rank;
  o.num_workers = FLAGS_num_workers;
  o.batch = FLAGS_batch;
  o.epochs = FLAGS_epochs;
  o.max_steps = FLAGS_max_steps;
  o.factor_dim = FLAGS_factor_dim;
  o.init_scale = static_cast<float>(FLAGS_init_scale);
  ASSIGN_OR_RETURN(o.row_optimizer.kind,
                   ParseRowOptimizerKind(FLAGS_row_optimizer));
  o.row_optimizer.lr = static_cast<float>(FLAGS_row_lr);
  o.row_optimizer.initial_accumulator =
      static_cast<float>(FLAGS_row_initial_accumulator);
  o.admit_after_pushes = FLAGS_admit_after;
  o.expire_after_clocks = FLAGS_expire_after;
  o.seed = FLAGS_seed;
  o.eval_every = FLAGS_eval_every;
  o.log_every = FLAGS_log_every;
  o.metrics_csv = FLAGS_metrics_csv;
  o.timeout = std::chrono::seconds(FLAGS_timeout_s);

  nlohmann::json planted;
  if (!FLAGS_planted_json.empty()) {
    std::ifstream f(FLAGS_planted_json);
    planted = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
    if (planted.is_discarded() || !planted.contains("test")) {
      return Status::InvalidArgument(FLAGS_planted_json +
                                     ": not a ps_criteo_gen stats file");
    }
  }
  LOG(INFO) << "ps_ctr_worker: rank " << o.rank << "/" << o.num_workers
            << " train " << o.train_path << " test '" << o.test_path
            << "' batch " << o.batch << " epochs " << o.epochs << " factor_dim "
            << o.factor_dim << " rows "
            << RowOptimizerKindName(o.row_optimizer.kind) << " lr "
            << o.row_optimizer.lr << " rows_codec " << FLAGS_rows_codec;
  ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Create(co));
  o.print_summary = false;
  ASSIGN_OR_RETURN(std::unique_ptr<CtrTrainer> trainer,
                   CtrTrainer::Create(o, client.get()));
  ASSIGN_OR_RETURN(CtrResult r, trainer->Run());
  std::string extra;
  if (!planted.is_null() && r.test.logloss >= 0) {
    const double opt = planted["test"].value("bayes_logloss_sample", -1.0);
    const double opt_auc = planted["test"].value("bayes_auc", -1.0);
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  " bayes_logloss=%.6f logloss_gap=%.6f bayes_auc=%.6f "
                  "auc_gap=%.6f",
                  opt, r.test.logloss - opt, opt_auc, opt_auc - r.test.auc);
    extra = buf;
  }
  std::printf(
      "SUMMARY rank=%d test_logloss=%.6f test_auc=%.6f examples_per_s=%.1f "
      "steps=%lld wall_s=%.2f pull_wait_s=%.2f%s\n",
      o.rank, r.test.logloss, r.test.auc, r.examples_per_s,
      static_cast<long long>(r.steps), r.wall_s, r.pull_wait_s, extra.c_str());
  std::fflush(stdout);
  return Status::OK();
}

}  // namespace

int main(int argc, char** argv) {
  asyncps::InitTool("ps_ctr_worker: click model with sparse embeddings", &argc,
                    &argv);
  Status s = Main();
  if (!s.ok()) {
    std::fprintf(stderr, "ps_ctr_worker: %s\n", s.ToString().c_str());
    return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
