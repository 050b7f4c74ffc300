// ps_worker: trains an MLP on (Fashion-)MNIST through the parameter servers.
//
// Worker `rank` of `num_workers` trains on its own partition of the training
// set: it pulls weights (as fresh as the shards' consistency mode requires),
// computes the gradient of a minibatch on the CPU (OpenBLAS) or a GPU (cuBLAS),
// pushes it through the configured codec and advances its clock.
#include <fcntl.h>
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "common/curve_flags.h"
#include "common/etcd_flags.h"
#include "common/metrics_flags.h"
#include "common/tool_main.h"
#include "compression/codec.h"
#include "worker/backend.h"
#include "worker/client.h"
#include "worker/evaluator.h"
#include "worker/idx_reader.h"
#include "worker/model.h"
#include "worker/overlap.h"
#include "worker/ps_store.h"
#include "worker/trainer.h"

DEFINE_string(servers, "",
              "Comma-separated shard endpoints, shard 0 first "
              "(tcp://127.0.0.1:5555,...); a replicated shard is its replica "
              "group, members joined by '|'");
DEFINE_string(etcd, "",
              "Elastic fleets: etcd client URLs (http://127.0.0.1:2379,...); "
              "the worker reads the layout (<--etcd_prefix>/elastic) before "
              "it registers, so it joins even after every shard in "
              "--servers left (--servers stays the fleet's first shards)");
DEFINE_string(etcd_prefix, "/asyncps/default",
              "Key prefix of the fleet in etcd (with --etcd), as ps_server's");
DEFINE_int32(attempt_timeout_ms, 2000,
             "A request unanswered this long is resent; to a replicated "
             "shard, it goes to the next member of the group (failover)");
DEFINE_int32(rank, 0, "This worker's rank, in [0, num_workers)");
DEFINE_int32(num_workers, 1, "Number of workers sharing the training set");
DEFINE_string(data_dir, "/usr/share/datasets/fashion-mnist",
              "Directory with the MNIST-format IDX files");
DEFINE_string(layers, "784,256,128,10",
              "MLP layer sizes, input first, 10 classes last");
DEFINE_int32(batch, 64, "Minibatch size per worker");
DEFINE_int32(epochs, 1,
             "Passes over this worker's partition (0: use --max_steps only)");
DEFINE_int64(max_steps, 0, "Stop after this many steps (0: no limit)");
DEFINE_string(device, "auto", "auto | cpu | cuda");
DEFINE_int32(threads, 1, "CPU backend: OpenBLAS threads");
DEFINE_uint64(seed, 1,
              "Seed of the weights' initialisers (must match across workers) "
              "and shuffling");
DEFINE_int64(eval_every, 0,
             "Evaluate on the test set every N steps (0: at the end only)");
DEFINE_string(role, "train",
              "train: a training worker; eval: a dedicated evaluator that "
              "pulls as an observer every --eval_interval_ms and evaluates "
              "until the workers (--num_workers, --epochs/--max_steps) finish");
DEFINE_int32(eval_interval_ms, 2000, "--role=eval: time between evaluations");
DEFINE_string(eval, "auto",
              "Evaluate in this process: auto (rank 0) | true | false");
DEFINE_int64(log_every, 200, "Progress line and CSV row every N steps");
DEFINE_double(
    slowdown, 1.0,
    "Straggler injection: each step's compute takes this many times as long");
DEFINE_string(metrics_csv, "", "Write per-step metrics to this CSV file");
DEFINE_string(codec, "none",
              "Push compression, e.g. none, fp16, int8, qsgd:levels=4, "
              "topk:ratio=0.01,ef=1");
DEFINE_string(pull_codec, "",
              "Pull compression: '' (fp32), fp16, bf16, int8, or "
              "topk:ratio=R (the top-k of the change since this worker's "
              "last pull)");
DEFINE_int64(chunk_elems, 1 << 20, "Largest chunk of a tensor, in floats");
DEFINE_string(placement, "balanced",
              "Which shard holds each chunk: balanced (largest chunks first to "
              "the least-loaded shard) or in_order (contiguous ranges in layer "
              "order, the last layers on the last shard: with --overlap under "
              "BSP their pushes leave during backward). Every worker and "
              "observer of a job names the same one");
DEFINE_int32(
    timeout_s, 120,
    "Longest wait for any reply (a shard restart must finish within it)");
DEFINE_int32(heartbeat_ms, 1000, "Heartbeat interval (0: off)");
DEFINE_int64(shared_memory_mb, 0,
             "Pull from shards on this host through shared memory of this "
             "many MiB (at least the model's fp32 size; 0: off). Shards "
             "elsewhere, or that refuse it, are pulled from over sockets");
DEFINE_string(device_compression, "auto",
              "Compress gradients on the GPU and copy only payloads to the "
              "host: auto (when the backend is CUDA and --codec is not none) "
              "| on (fail if impossible) | off");
DEFINE_bool(normalize, true,
            "Standardise pixels with Fashion-MNIST's mean/stddev (as "
            "ps_train_local does)");
DEFINE_string(push_log, "",
              "Append one line per push request sent to a shard and per "
              "acknowledgement ('sent|acked SHARD ID MICROS', MICROS the wall "
              "clock in microseconds since the epoch), after a first line "
              "'incarnation N rank R', written through at once (survives "
              "kill -9): exact accounting of acknowledged pushes in chaos "
              "experiments; '{rank}' in the path is replaced by the rank");
DEFINE_string(drop_last, "auto",
              "Skip each epoch's short last batch: auto (when the shards run "
              "BSP, read from their stats: a short batch weighs as much as a "
              "full one in the round's average) | true | false");
DEFINE_int32(send_buffer_kb, 0,
             "SO_SNDBUF of each shard connection, KiB (4 to 65536; 0: the OS "
             "default, autotuned). On a saturated link a small one keeps a "
             "push from filling the link's queue ahead of the next pull's "
             "request and the acknowledgements of the pull coming in; too "
             "small caps a connection at about the buffer per round trip");
DEFINE_bool(prefetch_ahead, false,
            "Pull the next step's weights while computing this one: the "
            "network overlaps compute, and the weights lack this worker's "
            "own latest update (for ASP, or SSP with s >= 1)");

DEFINE_bool(overlap, false,
            "Overlap communication with backward (CPU or CUDA backend): each "
            "layer's gradients are pushed as soon as backward has them "
            "(one push per shard under BSP), each shard is clocked as soon "
            "as its pushes are out, and the next pull comes by layer groups "
            "in forward order, each waited for just before its layer's "
            "forward. Needs raw pulls (no --pull_codec), no --prefetch_ahead, "
            "no --etcd; under BSP the weights are bitwise those without it");
DEFINE_int32(pipeline_shards, 0,
             "--overlap: after this many shards were clocked, the next push "
             "waits until the shards pushed to have received their pushes, "
             "so that their rounds close and their weights come down while "
             "it goes up (about the number of hosts the shards run on); 0: "
             "never wait");
DEFINE_bool(overlap_sender_thread, false,
            "--overlap: push from a thread of its own, so that a bucket is "
            "compressed (--codec) and sent, and the stage waits of "
            "--pipeline_shards are waited, while backward computes the "
            "layers below; the step's end waits for the last bucket");

DEFINE_string(weights_out, "",
              "After training, pull the final weights (at the last clock) "
              "and write them to this file: every tensor's fp32 values in "
              "model order, raw little-endian bytes (bitwise comparisons of "
              "runs); '{rank}' is replaced by the rank");

DEFINE_double(metrics_linger_s, 0,
              "Keep serving metrics this long after training, so a scraper "
              "sees the final values");

namespace {

using namespace asyncps;
using namespace asyncps::worker;

// Where a training step's time went, mean ms per step (parsed by
// experiments/bench/bench_worker.py):
//   STEP_TIME rank=<r> steps=<n> step_ms=<wall per step, evaluation left
//   out> compute_ms=<forward+backward> pull_wait_ms=<blocked for weights>
//   pull_copy_ms=<copying them in> encode_ms=<compressing gradients>
//   push_copy_ms=<copying uncompressed ones> send_ms=<rest of Push: framing,
//   hand-off to the client> clock_ms=<Clock()> other_ms=<the rest: batches,
//   SetParameters, --slowdown sleeps, logging>
void PrintStepTime(const asyncps::worker::TrainResult& r) {
  if (r.steps <= 0) return;
  const asyncps::worker::TrafficStats& t = r.traffic;
  const double n = static_cast<double>(r.steps);
  const double step = 1e3 * (r.wall_s - r.eval_s) / n;
  const double compute = 1e3 * r.compute_s / n;
  const double wait = (t.pull_wait_ns - t.pull_copy_ns) / 1e6 / n;
  const double pull_copy = t.pull_copy_ns / 1e6 / n;
  const double encode = t.encode_ns / 1e6 / n;
  const double push_copy = t.push_copy_ns / 1e6 / n;
  const double send = (t.push_ns - t.encode_ns - t.push_copy_ns) / 1e6 / n;
  const double clock = t.clock_ns / 1e6 / n;
  const double other =
      step - compute - wait - pull_copy - encode - push_copy - send - clock;
  std::printf(
      "STEP_TIME rank=%d steps=%lld step_ms=%.4f compute_ms=%.4f "
      "pull_wait_ms=%.4f pull_copy_ms=%.4f encode_ms=%.4f push_copy_ms=%.4f "
      "send_ms=%.4f clock_ms=%.4f other_ms=%.4f\n",
      FLAGS_rank, static_cast<long long>(r.steps), step, compute, wait,
      pull_copy, encode, push_copy, send, clock, other);
  std::fflush(stdout);
}

// Shard 0's consistency mode ("bsp", "ssp", "asp"), read from its stats.
StatusOr<std::string> ShardConsistency(Client* client) {
  std::vector<std::string> stats;
  RETURN_IF_ERROR(client->Stats(&stats, std::chrono::seconds(FLAGS_timeout_s)));
  const nlohmann::json j = nlohmann::json::parse(
      stats.empty() ? std::string("{}") : stats[0], nullptr,
      /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("consistency") ||
      !j["consistency"].is_string()) {
    return Status::Internal("shard 0's stats do not name its consistency");
  }
  return j["consistency"].get<std::string>();
}

// --drop_last: true/false, or auto = on when shard 0 runs BSP.
StatusOr<bool> ResolveDropLast(Client* client) {
  if (FLAGS_drop_last == "true") return true;
  if (FLAGS_drop_last == "false") return false;
  StatusOr<std::string> mode = ShardConsistency(client);
  RETURN_IF_ERROR(mode.status().WithContext(
      "--drop_last=auto reads the shards' consistency"));
  return *mode == "bsp";
}

// --overlap's checks that need no shard: InvalidArgument naming the flags.
Status CheckOverlapFlags(bool eval_role) {
  if (FLAGS_pipeline_shards < 0)
    return Status::InvalidArgument("--pipeline_shards must be >= 0");
  if (!FLAGS_overlap) {
    if (FLAGS_pipeline_shards > 0) {
      return Status::InvalidArgument(
          "--pipeline_shards applies to --overlap only");
    }
    if (FLAGS_overlap_sender_thread) {
      return Status::InvalidArgument(
          "--overlap_sender_thread applies to --overlap only");
    }
    return Status::OK();
  }
  if (FLAGS_prefetch_ahead) {
    return Status::InvalidArgument(
        "--overlap pulls by layer groups behind each shard's clock and "
        "cannot be combined with --prefetch_ahead");
  }
  if (!FLAGS_pull_codec.empty() && FLAGS_pull_codec != "none") {
    return Status::InvalidArgument(
        "--overlap needs raw pulls: drop --pull_codec=" + FLAGS_pull_codec);
  }
  if (!FLAGS_etcd.empty()) {
    return Status::InvalidArgument(
        "--overlap needs a fixed layout: an elastic fleet (--etcd) moves "
        "chunks between shards during a step");
  }
  if (eval_role)
    return Status::InvalidArgument("--overlap is for --role=train");
  return Status::OK();
}

// --weights_out: the weights after the last update, pulled at `clock`.
Status WriteFinalWeights(PsParameterStore* store,
                         const std::vector<int>& layers, int64_t clock) {
  std::vector<std::vector<float>> weights;
  std::vector<float*> ptrs;
  for (const TensorSpec& t : MlpTensorSpecs(layers, FLAGS_seed)) {
    weights.emplace_back(static_cast<size_t>(t.num_elements()));
  }
  for (std::vector<float>& w : weights) ptrs.push_back(w.data());
  RETURN_IF_ERROR(store->Pull(clock, ptrs));
  std::string path = FLAGS_weights_out;
  for (size_t at = path.find("{rank}"); at != std::string::npos;
       at = path.find("{rank}"))
    path.replace(at, 6, std::to_string(FLAGS_rank));
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  for (const std::vector<float>& w : weights) {
    f.write(reinterpret_cast<const char*>(w.data()),
            static_cast<std::streamsize>(w.size() * sizeof(float)));
  }
  if (!f.flush()) return Status::Internal("cannot write " + path);
  LOG(INFO) << "final weights at clock " << clock << " written to " << path;
  return Status::OK();
}

// What the flags say once checked (CheckFlags).
struct CheckedFlags {
  std::vector<std::string> servers;
  std::vector<int> layers;
  bool eval_role = false;
  compression::CodecSpec push_spec;
  DeviceKind device = DeviceKind::kCpu;
};

// Every check of the flags that needs no shard nor data: InvalidArgument
// naming the flag.
StatusOr<CheckedFlags> CheckFlags() {
  CheckedFlags f;
  f.servers = ParseEndpoints(FLAGS_servers);
  if (f.servers.empty())
    return Status::InvalidArgument(
        "--servers is required (comma-separated endpoints)");
  if (FLAGS_num_workers < 1)
    return Status::InvalidArgument("--num_workers must be >= 1");
  if (FLAGS_rank < 0 || FLAGS_rank >= FLAGS_num_workers) {
    return Status::InvalidArgument("--rank must be in [0, --num_workers)");
  }
  ASSIGN_OR_RETURN(f.layers, ParseLayers(FLAGS_layers));
  if (FLAGS_batch < 1) return Status::InvalidArgument("--batch must be >= 1");
  if (FLAGS_epochs < 0 || FLAGS_max_steps < 0)
    return Status::InvalidArgument("--epochs and --max_steps must be >= 0");
  if (FLAGS_epochs == 0 && FLAGS_max_steps == 0) {
    return Status::InvalidArgument(
        "one of --epochs or --max_steps must be > 0");
  }
  if (FLAGS_threads < 1)
    return Status::InvalidArgument("--threads must be >= 1");
  if (FLAGS_slowdown < 1.0)
    return Status::InvalidArgument("--slowdown must be >= 1");
  if (FLAGS_chunk_elems < 1)
    return Status::InvalidArgument("--chunk_elems must be >= 1");
  RETURN_IF_ERROR(
      ParsePlacement(FLAGS_placement).status().WithContext("--placement"));
  if (FLAGS_timeout_s < 1)
    return Status::InvalidArgument("--timeout_s must be >= 1");
  if (FLAGS_role != "train" && FLAGS_role != "eval") {
    return Status::InvalidArgument("--role must be train or eval");
  }
  f.eval_role = FLAGS_role == "eval";
  if (f.eval_role && FLAGS_eval_interval_ms < 1) {
    return Status::InvalidArgument("--eval_interval_ms must be >= 1");
  }
  if (FLAGS_eval != "auto" && FLAGS_eval != "true" && FLAGS_eval != "false") {
    return Status::InvalidArgument("--eval must be auto, true or false");
  }
  if (FLAGS_drop_last != "auto" && FLAGS_drop_last != "true" &&
      FLAGS_drop_last != "false") {
    return Status::InvalidArgument("--drop_last must be auto, true or false");
  }
  const StatusOr<compression::CodecSpec> push_spec =
      compression::CodecSpec::Parse(FLAGS_codec);
  RETURN_IF_ERROR(push_spec.status().WithContext("--codec"));
  f.push_spec = *push_spec;
  if (FLAGS_device_compression != "auto" && FLAGS_device_compression != "on" &&
      FLAGS_device_compression != "off") {
    return Status::InvalidArgument(
        "--device_compression must be auto, on or off");
  }
  ASSIGN_OR_RETURN(f.device, ParseDeviceKind(FLAGS_device));
  RETURN_IF_ERROR(CheckOverlapFlags(f.eval_role));
  RETURN_IF_ERROR(metrics::ValidateMetricsFlags());
  if (FLAGS_metrics_linger_s < 0) {
    return Status::InvalidArgument("--metrics_linger_s must be >= 0");
  }
  return f;
}

void LogFlags(const std::vector<int>& layers) {
  LOG(INFO) << "ps_worker: servers=" << FLAGS_servers << " rank=" << FLAGS_rank
            << "/" << FLAGS_num_workers << " layers=" << LayersToString(layers)
            << " batch=" << FLAGS_batch << " epochs=" << FLAGS_epochs
            << " max_steps=" << FLAGS_max_steps << " device=" << FLAGS_device
            << " threads=" << FLAGS_threads << " seed=" << FLAGS_seed
            << " codec=" << FLAGS_codec << " pull_codec='" << FLAGS_pull_codec
            << "' eval=" << FLAGS_eval << " eval_every=" << FLAGS_eval_every
            << " slowdown=" << FLAGS_slowdown
            << " chunk_elems=" << FLAGS_chunk_elems
            << " normalize=" << FLAGS_normalize
            << " prefetch_ahead=" << FLAGS_prefetch_ahead
            << " overlap=" << FLAGS_overlap
            << " pipeline_shards=" << FLAGS_pipeline_shards
            << " device_compression=" << FLAGS_device_compression
            << " metrics_csv='" << FLAGS_metrics_csv << "'";
}

// --push_log: opened for appending into *fd, and co->on_push writing a
// line per push to it.
Status OpenPushLog(ClientOptions* co, int* fd) {
  // "{rank}" in the path: one file per worker of a fleet sharing flags.
  std::string path = FLAGS_push_log;
  for (size_t at = path.find("{rank}"); at != std::string::npos;
       at = path.find("{rank}"))
    path.replace(at, 6, std::to_string(FLAGS_rank));
  const int push_log = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (push_log < 0)
    return Status::InvalidArgument("cannot open --push_log=" + path);
  *fd = push_log;
  co->on_push = [push_log](int shard, uint64_t id, bool acked) {
    // The wall-clock time (microseconds since the epoch) lets a test put
    // the acknowledgements beside events of other processes (a kill).
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
    char line[96];
    const int n = std::snprintf(
        line, sizeof(line), "%s %d %llu %lld\n", acked ? "acked" : "sent",
        shard, static_cast<unsigned long long>(id), static_cast<long long>(us));
    (void)!write(push_log, line, n);
  };
  return Status::OK();
}

// The client's options from the flags; with --push_log, its descriptor in
// *push_log (else -1).
Status ClientOptionsFromFlags(const CheckedFlags& f, ClientOptions* co,
                              int* push_log) {
  co->servers = f.servers;
  co->rank = f.eval_role ? -1 : FLAGS_rank;
  co->deadline = std::chrono::seconds(FLAGS_timeout_s);
  if (!FLAGS_etcd.empty()) {
    if (FLAGS_etcd_prefix.empty() || FLAGS_etcd_prefix[0] != '/')
      return Status::InvalidArgument("--etcd_prefix must start with /");
    co->etcd_endpoints = ParseEndpoints(FLAGS_etcd);
    co->etcd_prefix = FLAGS_etcd_prefix;
  }
  RETURN_IF_ERROR(EtcdSecurityFromFlags(&co->etcd_security));
  if (FLAGS_attempt_timeout_ms < 10 || FLAGS_attempt_timeout_ms > 600000)
    return Status::InvalidArgument(
        "--attempt_timeout_ms must be in [10, 600000]");
  co->attempt_timeout = std::chrono::milliseconds(FLAGS_attempt_timeout_ms);
  co->max_backoff = std::max(co->attempt_timeout, co->max_backoff);
  co->heartbeat_interval = std::chrono::milliseconds(FLAGS_heartbeat_ms);
  if (FLAGS_shared_memory_mb < 0 || FLAGS_shared_memory_mb > (1 << 20)) {
    return Status::InvalidArgument("--shared_memory_mb must be in [0, 2^20]");
  }
  co->shared_memory_bytes = static_cast<size_t>(FLAGS_shared_memory_mb) << 20;
  RETURN_IF_ERROR(CheckSendBufferKb(FLAGS_send_buffer_kb, "--send_buffer_kb"));
  co->transport.send_buffer_bytes = FLAGS_send_buffer_kb * 1024;
  RETURN_IF_ERROR(CurveClientKeysFromFlags(&co->transport));
  *push_log = -1;
  if (!FLAGS_push_log.empty()) RETURN_IF_ERROR(OpenPushLog(co, push_log));
  return Status::OK();
}

StatusOr<TrainerOptions> TrainerOptionsFromFlags(
    const std::vector<int>& layers, std::shared_ptr<WorkerMetrics> metrics,
    Client* client) {
  TrainerOptions to;
  to.layers = layers;
  to.batch = FLAGS_batch;
  to.epochs = FLAGS_epochs;
  to.max_steps = FLAGS_max_steps;
  to.rank = FLAGS_rank;
  to.num_workers = FLAGS_num_workers;
  to.seed = FLAGS_seed;
  to.eval = FLAGS_eval == "true" || (FLAGS_eval == "auto" && FLAGS_rank == 0);
  to.eval_every = FLAGS_eval_every;
  to.log_every = FLAGS_log_every;
  to.slowdown = FLAGS_slowdown;
  to.metrics_csv = FLAGS_metrics_csv;
  to.metrics = std::move(metrics);
  ASSIGN_OR_RETURN(to.drop_last, ResolveDropLast(client));
  LOG(INFO) << "drop_last=" << (to.drop_last ? "true" : "false")
            << " (--drop_last=" << FLAGS_drop_last << ")";
  return to;
}

// --role=eval: evaluates what the workers train until they are done.
Status RunEvalRole(Client* client, Backend* backend, const Dataset& train,
                   const Dataset& test, const std::vector<int>& layers,
                   const TrainerOptions& to) {
  LayoutOptions lo;
  lo.chunk_elems = static_cast<size_t>(FLAGS_chunk_elems);
  lo.placement = *ParsePlacement(FLAGS_placement);
  // An observer does not register: it pulls what the workers registered
  // (and waits for them to do so).
  RETURN_IF_ERROR(client->UseLayout(MlpTensorSpecs(layers, FLAGS_seed), lo)
                      .WithContext("model layout"));
  EvaluatorOptions eo;
  eo.interval = std::chrono::milliseconds(FLAGS_eval_interval_ms);
  eo.final_clock = Trainer::PlannedSteps(to, train.num_examples);
  eo.metrics_csv = FLAGS_metrics_csv;
  LOG(INFO) << "evaluating every " << FLAGS_eval_interval_ms
            << " ms until the workers reach clock " << eo.final_clock;
  return RunEvaluator(client, backend, test, eo).status();
}

// The parameter store the trainer pushes to and pulls from.
StatusOr<std::unique_ptr<PsParameterStore>> CreateStore(const CheckedFlags& f,
                                                        Client* client,
                                                        Backend* backend,
                                                        const Dataset& train) {
  PsStoreOptions so;
  so.push_codec = FLAGS_codec;
  so.pull_codec = FLAGS_pull_codec;
  so.seed = FLAGS_seed;
  so.prefetch_ahead = FLAGS_prefetch_ahead;
  so.timeout = std::chrono::seconds(FLAGS_timeout_s);
  so.layout.chunk_elems = static_cast<size_t>(FLAGS_chunk_elems);
  so.layout.placement = *ParsePlacement(FLAGS_placement);
  so.steps_per_epoch = std::max<int64_t>(
      1, train.num_examples / FLAGS_num_workers / FLAGS_batch);
  const bool cuda_backend = backend->device_grad(0) != nullptr;
  const bool codec_set = f.push_spec.id != compression::CodecId::kNone;
  so.device_compression =
      FLAGS_device_compression == "on" ||
      (FLAGS_device_compression == "auto" && cuda_backend && codec_set);
  ASSIGN_OR_RETURN(std::unique_ptr<PsParameterStore> store,
                   PsParameterStore::Create(
                       client, MlpTensorSpecs(f.layers, FLAGS_seed), so));
  const bool device_push = cuda_backend && store->AcceptsDeviceGradients();
  if (FLAGS_device_compression == "on" && !device_push) {
    return Status::InvalidArgument(
        "--device_compression=on needs a CUDA backend, a --codec other than "
        "none and a visible GPU");
  }
  LOG(INFO) << "gradient compression on the "
            << (device_push ? "device" : "host")
            << " (--device_compression=" << FLAGS_device_compression << ")";
  return store;
}

// --overlap: the scheduler that pipelines pulls and pushes by layer.
StatusOr<std::unique_ptr<OverlapScheduler>> CreateOverlap(
    const std::vector<int>& layers, Client* client, PsParameterStore* store) {
  OverlapOptions oo;
  for (size_t l = 0; l + 1 < layers.size(); ++l) {
    oo.layers.push_back(
        {static_cast<uint32_t>(2 * l), static_cast<uint32_t>(2 * l + 1)});
  }
  ASSIGN_OR_RETURN(std::string mode, ShardConsistency(client));
  oo.buckets = mode == "bsp" ? PushBuckets::kPerShard : PushBuckets::kPerLayer;
  oo.pipeline_shards = FLAGS_pipeline_shards;
  oo.sender_thread = FLAGS_overlap_sender_thread;
  ASSIGN_OR_RETURN(std::unique_ptr<OverlapScheduler> overlap,
                   OverlapScheduler::Create(store, client->layout(), oo));
  LOG(INFO) << "overlap: " << mode << " shards, pushes "
            << (mode == "bsp" ? "per shard" : "per layer") << ", "
            << overlap->pull_groups().size() << " pull groups";
  return overlap;
}

// The lines experiments/ and the tests parse after a run.
void PrintRunStats(const TrainResult& r, const PsParameterStore& store,
                   const OverlapScheduler* overlap) {
  for (const PsParameterStore::TensorBytes& t : store.tensor_bytes()) {
    std::printf(
        "TENSOR_BYTES rank=%d tensor=%s raw=%llu wire=%llu ratio=%.2f\n",
        FLAGS_rank, t.name.c_str(), static_cast<unsigned long long>(t.raw),
        static_cast<unsigned long long>(t.wire),
        t.wire ? static_cast<double>(t.raw) / static_cast<double>(t.wire)
               : 0.0);
  }
  // Parsed by experiments/ (encode ms per step); the SUMMARY line is left
  // as it is for launch/psrun.
  LOG(INFO) << "codec: encode_ms_total=" << r.traffic.encode_ns / 1e6
            << " steps=" << r.steps;
  PrintStepTime(r);
  if (overlap) {
    // Parsed by the overlap tests and experiments/bench (stage waits are in
    // STEP_TIME's other_ms).
    const OverlapStats& os = overlap->stats();
    std::printf(
        "OVERLAP rank=%d steps=%lld pushes=%lld shard_clocks=%lld "
        "stage_waits=%lld stage_wait_ms=%.3f pull_groups=%lld "
        "sender_waits=%lld sender_wait_ms=%.3f\n",
        FLAGS_rank, static_cast<long long>(os.steps),
        static_cast<long long>(os.pushes),
        static_cast<long long>(os.shard_clocks),
        static_cast<long long>(os.stage_waits), os.stage_wait_ns / 1e6,
        static_cast<long long>(os.pull_groups),
        static_cast<long long>(os.sender_waits), os.sender_wait_ns / 1e6);
    std::fflush(stdout);
  }
}

Status Main() {
  ASSIGN_OR_RETURN(const CheckedFlags f, CheckFlags());
  const std::vector<int>& layers = f.layers;
  LogFlags(layers);

  MnistOptions mo;
  if (FLAGS_normalize)
    mo.mean = kFashionMnistMean, mo.stddev = kFashionMnistStddev;
  ASSIGN_OR_RETURN(Dataset train, LoadMnist(FLAGS_data_dir, Split::kTrain, mo));
  ASSIGN_OR_RETURN(Dataset test, LoadMnist(FLAGS_data_dir, Split::kTest, mo));

  // Check the model against the data before registering it on the shards.
  const int64_t pixels = static_cast<int64_t>(train.rows) * train.cols;
  if (layers.front() != pixels || layers.back() != 10) {
    return Status::InvalidArgument(
        "--layers=" + LayersToString(layers) +
        " does not fit the data: the input must be " + std::to_string(pixels) +
        " (" + std::to_string(train.rows) + "x" + std::to_string(train.cols) +
        " pixels) and the output 10 classes");
  }

  BackendOptions bo;
  bo.layers = layers;
  bo.device = f.device;
  bo.threads = FLAGS_threads;
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, Backend::Create(bo));
  if (FLAGS_overlap && !backend->supports_layered_steps()) {
    return Status::InvalidArgument(
        "--overlap needs a backend with a layered step (cpu, cuda); the " +
        backend->name() + " backend has none");
  }

  ClientOptions co;
  int push_log = -1;
  RETURN_IF_ERROR(ClientOptionsFromFlags(f, &co, &push_log));
  ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Create(co));
  if (push_log >= 0) {
    const std::string head = "incarnation " +
                             std::to_string(client->incarnation()) + " rank " +
                             std::to_string(FLAGS_rank) + "\n";
    (void)!write(push_log, head.data(), head.size());
  }

  // Metrics: the registry outlives the HTTP server that reads it.
  metrics::Registry registry;
  std::unique_ptr<metrics::MetricsServer> metrics_server;
  std::shared_ptr<WorkerMetrics> worker_metrics;
  if (metrics::MetricsRequested()) {
    metrics::AddProcessMetrics(&registry);
    Client* raw_client = client.get();
    worker_metrics = std::make_shared<WorkerMetrics>(
        &registry, [raw_client] { return raw_client->resends(); });
    ASSIGN_OR_RETURN(metrics_server, metrics::StartMetricsFromFlags(&registry));
  }

  ASSIGN_OR_RETURN(
      const TrainerOptions to,
      TrainerOptionsFromFlags(layers, worker_metrics, client.get()));
  if (f.eval_role) {
    return RunEvalRole(client.get(), backend.get(), train, test, layers, to);
  }

  ASSIGN_OR_RETURN(std::unique_ptr<PsParameterStore> store,
                   CreateStore(f, client.get(), backend.get(), train));
  std::unique_ptr<OverlapScheduler> overlap;
  if (FLAGS_overlap) {
    ASSIGN_OR_RETURN(overlap, CreateOverlap(layers, client.get(), store.get()));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                   Trainer::Create(to, backend.get(), store.get(), &train,
                                   &test, overlap.get()));
  LOG(INFO) << "training " << trainer->total_steps() << " steps ("
            << trainer->batches_per_epoch() << " per epoch) on "
            << backend->name() << " against " << f.servers.size()
            << " shard(s)";
  ASSIGN_OR_RETURN(TrainResult r, trainer->Run());
  RETURN_IF_ERROR(store->Flush());
  if (!FLAGS_weights_out.empty()) {
    RETURN_IF_ERROR(
        WriteFinalWeights(store.get(), layers, trainer->total_steps())
            .WithContext("--weights_out"));
  }
  LOG(INFO) << "done: test accuracy " << r.final_test_acc << ", "
            << r.samples_per_s << " samples/s, " << client->resends()
            << " resends";
  PrintRunStats(r, *store, overlap.get());
  if (metrics_server && FLAGS_metrics_linger_s > 0) {
    std::fflush(stdout);
    std::this_thread::sleep_for(
        std::chrono::duration<double>(FLAGS_metrics_linger_s));
  }
  return Status::OK();
}

}  // namespace

int main(int argc, char** argv) {
  asyncps::ToolOptions tool;
  tool.tune_allocator_for_messages = true;
  asyncps::InitTool("Train an MLP through the asyncps parameter servers", &argc,
                    &argv, tool);
  Status s = Main();
  if (!s.ok()) {
    LOG(ERROR) << "ps_worker failed: " << s.ToString();
    return 1;
  }
  return 0;
}
