// ps_server: one parameter-server shard.
//
//   ps_server --shard_id=0 --num_shards=2 --num_workers=3 --consistency=ssp
//             --staleness=2 --optimizer=adam --lr=0.001 --db_path=/tmp/ps0
//             --ready_file=/tmp/ps0.endpoint
//
// Flags are validated here (exit 2 with a message on a bad value); the
// library takes ServerOptions. SIGTERM/SIGINT shut down cleanly with a final
// checkpoint; a second signal, or the loop not stopping within
// --shutdown_timeout_s, exits at once (ShutdownWatchdog).
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <thread>

#include "common/etcd_flags.h"
#include "common/file_util.h"
#include "common/metrics_flags.h"
#include "common/tool_main.h"
#include "common/transport.h"
#include "server/loop/server.h"
#include "server/loop/shutdown_watchdog.h"
#include "server/replication/replica_auth.h"

DEFINE_string(endpoint, "tcp://127.0.0.1:*",
              "ZeroMQ endpoint to bind; tcp://127.0.0.1:* picks a free port");
DEFINE_string(ready_file, "",
              "once serving, write the bound endpoint to this file "
              "(atomically: tmp + rename)");
DEFINE_int32(shard_id, 0, "this shard's index in [0, num_shards)");
DEFINE_int32(num_shards, 1, "number of shards in the deployment");
DEFINE_int32(num_workers, 1, "number of workers (ranks 0..num_workers-1)");
DEFINE_string(consistency, "asp", "bsp | ssp | asp");
DEFINE_string(sparse_consistency, "",
              "consistency of sparse-table rows: empty (as --consistency) or "
              "asp with --consistency=bsp (hybrid, as Persia: rows applied "
              "on arrival, dense chunks in BSP rounds)");
DEFINE_int64(staleness, 0, "SSP staleness bound s (clocks)");
DEFINE_string(staleness_lr, "none",
              "learning rate by the staleness s of each push (ASP/SSP): none "
              "| one_plus (lr/(1+s)) | inverse (lr/s, Zhang et al. IJCAI'16); "
              "true/false are one_plus/none");
DEFINE_double(dc_lambda, 0.0,
              "delay compensation (DC-ASGD, Zheng et al. ICML'17; ASP/SSP): "
              "g + lambda*g*g*(w_now - w_read); 0: off. The shard keeps the "
              "weights each worker read (about one copy of its part per "
              "worker, charged to --memory_budget_mb)");
DEFINE_double(dc_meansquare_decay, 0.0,
              "DC-ASGD-a: lambda / sqrt(meansquare(g) + eps) with this decay "
              "of the running mean square (the paper: 0.95); 0: constant "
              "lambda (DC-ASGD-c)");
DEFINE_double(dc_eps, 1e-7, "DC-ASGD-a: epsilon under the square root");
DEFINE_uint64(lr_warmup_updates, 0,
              "linear learning-rate warm-up over this many applied updates of "
              "the shard (pushes under ASP/SSP, rounds under BSP); 0: none");
DEFINE_double(lr_warmup_epochs, 0.0,
              "warm-up in epochs instead: needs --updates_per_epoch");
DEFINE_uint64(updates_per_epoch, 0,
              "shard updates per epoch, for --lr_warmup_epochs: under BSP the "
              "steps per epoch of one worker, under ASP/SSP W times that");
DEFINE_double(lr_warmup_start, 0.0,
              "fraction of --lr at the first warm-up update, [0, 1] (Goyal et "
              "al.: 1/W for the linearly scaled rate of W workers)");
DEFINE_uint64(lr_decay_updates, 0,
              "cosine learning-rate decay ending at this applied update of "
              "the shard (0: constant rate); for W workers running N steps "
              "each under ASP/SSP that is W*N, under BSP N");
DEFINE_double(lr_final, 0.0, "final fraction of --lr for the decay, [0, 1]");
DEFINE_string(optimizer, "sgd", "sgd | momentum | nesterov | adam | adagrad");
DEFINE_double(lr, 0.01, "learning rate");
DEFINE_double(max_lr, 1.0,
              "largest learning rate a worker may set with its pushes and "
              "clocks (asyncps.torch lr schedules; worker-side optimizers "
              "set 1): a larger one is refused, not clamped; 0 refuses all");
DEFINE_double(momentum, 0.9, "momentum coefficient (momentum, nesterov)");
DEFINE_double(weight_decay, 0.0, "L2 weight decay");
DEFINE_double(beta1, 0.9, "Adam beta1");
DEFINE_double(beta2, 0.999, "Adam beta2");
DEFINE_double(eps, 1e-8, "Adam/AdaGrad epsilon");
DEFINE_string(db_path, "",
              "RocksDB directory of this shard; empty: no persistence");
DEFINE_double(checkpoint_every_s, 60.0,
              "seconds between automatic checkpoints; 0: off");
DEFINE_bool(durable, false,
            "write every applied push through the WAL before acknowledging it");
DEFINE_bool(durable_sync, false,
            "with --durable: fsync each write (survives power loss)");
DEFINE_double(
    worker_timeout_s, 30.0,
    "a worker silent this long is dropped from the clock minimum; 0: never");
DEFINE_int64(max_message_bytes, int64_t{1} << 30,
             "largest request accepted (all frames), bytes; a larger one is "
             "answered InvalidArgument with its id");
DEFINE_int32(send_buffer_kb, 0,
             "SO_SNDBUF of each worker's connection, KiB (4 to 65536; 0: the "
             "OS default, autotuned). On a saturated link a small one keeps "
             "this shard's replies from filling the link's queue ahead of "
             "the workers' acknowledgements and requests; too small caps a "
             "connection at about the buffer per round trip");
DEFINE_int64(max_frame_bytes, int64_t{256} << 20,
             "largest frame accepted, bytes (capped at --max_message_bytes): "
             "ZeroMQ "
             "drops a peer sending a larger one before buffering it; "
             "registrations whose chunks would not fit are refused");
DEFINE_int64(memory_budget_mb, 0,
             "memory this shard may hold for what peers ask of it (chunks, "
             "optimizer state, pull snapshots and payloads not yet sent, pull "
             "replicas, parked pulls), MiB; over it a request gets "
             "ResourceExhausted with the numbers. 0: half of the machine's "
             "memory (or of the cgroup limit), at least 256 MiB");
DEFINE_int64(max_unsent_mb_per_client, 256,
             "MiB of pull replies to one client (connection or rank) queued "
             "and not yet sent before its next pull gets ResourceExhausted");
DEFINE_int64(max_clock_jump, 1000000,
             "largest forward move of a worker's clock in one request, clocks");
DEFINE_double(max_park_s, 30.0,
              "a pull parked this long is answered Unavailable (the client "
              "resends it), seconds");
DEFINE_string(curve_admin_clients, "",
              "file of client public keys (Z85, one per line) that may send "
              "checkpoint and shutdown when CURVE is on (ps_ctl "
              "--curve_secret_key=admin.key); with CURVE and no such file "
              "those requests are refused");
DEFINE_bool(allow_remote_admin, false,
            "without CURVE, accept checkpoint and shutdown from any address "
            "(default: loopback only)");
DEFINE_double(shutdown_timeout_s, 60.0,
              "after SIGTERM/SIGINT, exit without a final checkpoint if the "
              "event loop has not stopped within this many seconds (a second "
              "signal exits at once)");
DEFINE_int64(max_parked_pulls, 4096, "most pulls waiting at once");
DEFINE_double(scan_snapshot_idle_s, 60.0,
              "a point-in-time scan of a sparse table (ps.state_dict()'s "
              "saved entries) with no page asked for this long is dropped "
              "(the worker starts it again)");
DEFINE_int64(max_shm_segments, 256,
             "most shared-memory segments of colocated clients mapped at "
             "once (the oldest is dropped past it); 0 refuses shared memory");
DEFINE_int64(max_shm_mb, 64 << 10,
             "largest shared-memory segment a client may attach, MiB");
DEFINE_int64(max_inflight_per_client, 1024,
             "most requests one client may have waiting in the shard "
             "(parked pulls); more get ResourceExhausted");
DEFINE_string(curve_secret_key, "",
              "CurveZMQ secret key of this server: a key file (from ps_ctl "
              "keygen) or the Z85 text; empty: no encryption");
DEFINE_string(curve_allowed_clients, "",
              "file of client public keys (Z85, one per line) allowed to "
              "connect; needs --curve_secret_key; empty: any client that "
              "knows the server's public key");
DEFINE_bool(insecure, false,
            "allow binding a non-loopback address without CURVE");
DEFINE_bool(transport_only, false,
            "benchmark mode: validate and acknowledge pushes, never apply");
DEFINE_int32(io_threads, 1, "ZeroMQ I/O threads");
DEFINE_uint64(embedding_cache_bytes, uint64_t{256} << 20,
              "memory for cached rows of sparse tables (and their cache "
              "indexes and admission counters), bytes; past it rows are "
              "evicted to RocksDB (--db_path); without --db_path every row "
              "stays in memory");
DEFINE_uint64(max_sparse_keys, uint64_t{1} << 18,
              "most keys of sparse tables one request may name on this shard");
DEFINE_uint64(max_sparse_reply_bytes, uint64_t{256} << 20,
              "largest sparse-row part of one pull reply, bytes (fp32)");
DEFINE_int32(apply_threads, 0,
             "threads applying a large push or BSP round (the event loop's "
             "included); 0: the cores this process may run on, at most 8. "
             "The weights are bitwise the same for any number");
DEFINE_string(etcd, "",
              "comma-separated etcd endpoints (http://host:port): this "
              "process is one replica of its shard's replica group, with its "
              "lease and the fleet's replica layout in etcd; empty: a static "
              "fleet");
DEFINE_string(elastic_etcd, "",
              "elastic shards (ps_ctl add-shard / remove-shard): comma-"
              "separated etcd endpoints where the fleet's changes are "
              "committed (<--etcd_prefix>/elastic); a shard frozen for a "
              "change whose coordinator went away asks etcd whether it "
              "committed (adopt) or not (abort). Empty: it stays frozen "
              "until ps_ctl ends the change");
DEFINE_string(etcd_prefix, "/asyncps/default",
              "key prefix of this fleet in etcd (one per job)");
DEFINE_int32(replicas, 1,
             "processes per replica group (shard): 1 primary + replicas-1 "
             "backups; > 1 needs --etcd");
DEFINE_int32(replica, 0, "this process's index in its group, [0, replicas)");
DEFINE_int32(lease_ms, 1000,
             "etcd lease TTL, ms (etcd counts whole seconds: rounded up); a "
             "primary whose lease ends is replaced by a backup");
DEFINE_int32(replica_suspect_ms, 500,
             "a backup that heard nothing from its primary (which pings "
             "when idle) for this long has etcd promote it without waiting "
             "for the primary's lease to end; 0: leases only");
DEFINE_bool(replicate_after_aggregation, true,
            "--consistency bsp with --replicas > 1: the primary hands its "
            "backups one record per round (the round's summed gradients "
            "and the headers of its pushes and clocks) instead of every "
            "push; false: every push is handed on (ASP/SSP always are)");
DEFINE_int32(round_record_flush_ms, 20,
             "with --replicate_after_aggregation: a worker's push that "
             "waited this long for that worker's clock sends the open "
             "round's record to the backups, releasing the push's reply "
             "(a worker rerouting pushes after an elastic change waits for "
             "them before it clocks); > 0");
DEFINE_string(advertise_endpoint, "",
              "endpoint other processes reach this one at (default: the "
              "bound --endpoint, with its real port); checked at start by a "
              "probe that must come back to this process");
DEFINE_string(
    replica_tag, "header",
    "with --etcd and no --curve_secret_key: what the tag of each "
    "update a primary hands its backups covers. header: its header "
    "(sender, session, id, epoch) and every frame's length, which "
    "stops any peer off the network path from forging or "
    "replaying replica traffic, at no measurable cost; all: every "
    "byte too, so that a host on the path cannot alter an update "
    "either (a Poly1305 pass over each byte on both sides, 0.65-0.86x "
    "push throughput here; a backup set to all refuses "
    "updates tagged header only). A worker's own pushes are "
    "covered only by CurveZMQ: use it where the path is not trusted");
DEFINE_string(replica_secret_file, "",
              "with --etcd and no --curve_secret_key: a file (mode 600) "
              "holding the replica group's secret, 64 hex digits (ps_ctl "
              "secretgen), the same for every replica of the group; replica "
              "traffic carries a tag of it. Empty: the group's secret in etcd "
              "(<--etcd_prefix>/secrets/g<shard_id>, created with the group; "
              "give etcd authentication so that workers cannot read it)");

namespace {

using asyncps::Status;
using asyncps::StatusOr;
namespace srv = asyncps::server;

// The cores this process may run on (its affinity mask), at most 8: more
// threads than memory channels only contend for them.
int DefaultApplyThreads() {
  cpu_set_t set;
  int n = 0;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) n = CPU_COUNT(&set);
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, std::min(n, 8));
}

// "a,b,,c" -> {a, b, c}: a flag's comma-separated endpoints.
std::vector<std::string> SplitEndpoints(const std::string& list) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= list.size()) {
    size_t comma = list.find(',', at);
    if (comma == std::string::npos) comma = list.size();
    if (comma > at) out.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

[[noreturn]] void BadFlag(const std::string& message) {
  std::fprintf(stderr, "ps_server: %s\n", message.c_str());
  std::exit(2);
}

// True for endpoints only this machine can reach: tcp on a loopback
// address, inproc and ipc.
bool IsLocalEndpoint(const std::string& ep) {
  if (ep.rfind("inproc://", 0) == 0 || ep.rfind("ipc://", 0) == 0) return true;
  if (ep.rfind("tcp://", 0) != 0) return false;
  std::string host = ep.substr(6);
  const size_t colon = host.rfind(':');
  if (colon != std::string::npos) host = host.substr(0, colon);
  if (host == "localhost" || host == "[::1]" || host == "::1") return true;
  return host.rfind("127.", 0) == 0 &&
         host.find_first_not_of("0123456789.") == std::string::npos;
}

// --endpoint, --db_path, checkpoints, message sizes and I/O threads.
void TransportFromFlags(srv::ServerOptions* out) {
  srv::ServerOptions& o = *out;
  o.endpoint = FLAGS_endpoint;
  o.db_path = FLAGS_db_path;
  if (FLAGS_checkpoint_every_s < 0)
    BadFlag("--checkpoint_every_s must be >= 0");
  o.checkpoint_every = std::chrono::milliseconds(
      static_cast<int64_t>(FLAGS_checkpoint_every_s * 1000));
  o.max_message_bytes = FLAGS_max_message_bytes;
  if (FLAGS_max_frame_bytes < 1024)
    BadFlag("--max_frame_bytes must be >= 1024");
  o.max_frame_bytes = FLAGS_max_frame_bytes;
  if (Status sb =
          asyncps::CheckSendBufferKb(FLAGS_send_buffer_kb, "--send_buffer_kb");
      !sb.ok())
    BadFlag(sb.ToString());
  o.send_buffer_bytes = FLAGS_send_buffer_kb * 1024;
  o.allow_remote_admin = FLAGS_allow_remote_admin;
  if (FLAGS_io_threads < 1 || FLAGS_io_threads > 64)
    BadFlag("--io_threads must be in [1, 64]");
  o.context = asyncps::Context::Create(FLAGS_io_threads);
}

// The shard's place in the fleet and its consistency model.
void ConsistencyFromFlags(srv::ShardOptions* shard) {
  srv::ShardOptions& s = *shard;
  s.shard_id = FLAGS_shard_id;
  s.num_shards = FLAGS_num_shards;
  s.num_workers = FLAGS_num_workers;
  StatusOr<srv::Consistency> c = srv::ParseConsistency(FLAGS_consistency);
  if (!c.ok()) BadFlag("--consistency: " + c.status().message());
  s.consistency = *c;
  s.staleness = FLAGS_staleness;
  if (!FLAGS_sparse_consistency.empty() &&
      FLAGS_sparse_consistency != FLAGS_consistency) {
    if (FLAGS_sparse_consistency != "asp" ||
        s.consistency != srv::Consistency::kBsp) {
      BadFlag(
          "--sparse_consistency: only asp with --consistency=bsp (or "
          "the same as --consistency)");
    }
    s.sparse_async = true;
  }
  if (s.consistency != srv::Consistency::kSsp && FLAGS_staleness != 0) {
    BadFlag("--staleness only applies to --consistency=ssp");
  }
  StatusOr<srv::StalenessLr> slr = srv::ParseStalenessLr(FLAGS_staleness_lr);
  if (!slr.ok()) BadFlag("--staleness_lr: " + slr.status().message());
  s.staleness_lr = *slr;
  s.delay_compensation.lambda = static_cast<float>(FLAGS_dc_lambda);
  s.delay_compensation.meansquare_decay =
      static_cast<float>(FLAGS_dc_meansquare_decay);
  s.delay_compensation.eps = static_cast<float>(FLAGS_dc_eps);
  if (Status dc = s.delay_compensation.Validate(); !dc.ok())
    BadFlag(dc.message());
  if (s.delay_compensation.enabled() &&
      s.consistency == srv::Consistency::kBsp) {
    BadFlag("--dc_lambda needs --consistency=ssp or asp");
  }
}

// The learning-rate schedule: warm-up and decay.
void LrScheduleFromFlags(srv::ShardOptions* shard) {
  srv::ShardOptions& s = *shard;
  if (FLAGS_lr_final < 0 || FLAGS_lr_final > 1) {
    BadFlag("--lr_final must be in [0, 1]");
  }
  if (FLAGS_lr_warmup_start < 0 || FLAGS_lr_warmup_start > 1) {
    BadFlag("--lr_warmup_start must be in [0, 1]");
  }
  if (FLAGS_lr_warmup_epochs < 0) BadFlag("--lr_warmup_epochs must be >= 0");
  if (FLAGS_lr_warmup_epochs > 0 && FLAGS_lr_warmup_updates > 0) {
    BadFlag("give --lr_warmup_updates or --lr_warmup_epochs, not both");
  }
  s.lr_warmup_updates = FLAGS_lr_warmup_updates;
  if (FLAGS_lr_warmup_epochs > 0) {
    if (FLAGS_updates_per_epoch == 0) {
      BadFlag(
          "--lr_warmup_epochs needs --updates_per_epoch (the shard counts "
          "updates, not epochs)");
    }
    s.lr_warmup_updates = static_cast<uint64_t>(
        FLAGS_lr_warmup_epochs * static_cast<double>(FLAGS_updates_per_epoch) +
        0.5);
  }
  s.lr_warmup_start = static_cast<float>(FLAGS_lr_warmup_start);
  s.lr_decay_updates = FLAGS_lr_decay_updates;
  s.lr_final = static_cast<float>(FLAGS_lr_final);
  if (Status ls = s.lr_schedule().Validate(); !ls.ok()) BadFlag(ls.message());
}

// --optimizer and its hyperparameters.
void OptimizerFromFlags(srv::ShardOptions* shard) {
  srv::ShardOptions& s = *shard;
  std::string opt = FLAGS_optimizer;
  if (opt == "nesterov") {
    opt = "momentum";
    s.optimizer.nesterov = true;
  }
  StatusOr<srv::OptimizerKind> k = srv::ParseOptimizerKind(opt);
  if (!k.ok()) BadFlag("--optimizer: " + k.status().message());
  s.optimizer.kind = *k;
  s.optimizer.lr = static_cast<float>(FLAGS_lr);
  s.max_lr = static_cast<float>(FLAGS_max_lr);
  s.optimizer.momentum = static_cast<float>(FLAGS_momentum);
  s.optimizer.weight_decay = static_cast<float>(FLAGS_weight_decay);
  s.optimizer.beta1 = static_cast<float>(FLAGS_beta1);
  s.optimizer.beta2 = static_cast<float>(FLAGS_beta2);
  s.optimizer.eps = static_cast<float>(FLAGS_eps);
}

// Timeouts and the limits on what clients may hold.
void LimitsFromFlags(srv::ShardOptions* shard) {
  srv::ShardOptions& s = *shard;
  if (FLAGS_worker_timeout_s < 0) BadFlag("--worker_timeout_s must be >= 0");
  s.worker_timeout = std::chrono::milliseconds(
      static_cast<int64_t>(FLAGS_worker_timeout_s * 1000));
  if (FLAGS_max_parked_pulls < 1) BadFlag("--max_parked_pulls must be >= 1");
  s.max_parked_pulls = static_cast<size_t>(FLAGS_max_parked_pulls);
  if (FLAGS_max_shm_segments < 0 || FLAGS_max_shm_segments > 65536)
    BadFlag("--max_shm_segments must be in [0, 65536]");
  s.max_shm_segments = static_cast<size_t>(FLAGS_max_shm_segments);
  if (FLAGS_max_shm_mb < 1 || FLAGS_max_shm_mb > (int64_t{1} << 30))
    BadFlag("--max_shm_mb must be in [1, 2^30]");
  s.max_shm_bytes = static_cast<uint64_t>(FLAGS_max_shm_mb) << 20;
  if (FLAGS_max_inflight_per_client < 1)
    BadFlag("--max_inflight_per_client must be >= 1");
  s.max_inflight_per_client =
      static_cast<size_t>(FLAGS_max_inflight_per_client);
  if (FLAGS_memory_budget_mb < 0 || FLAGS_memory_budget_mb > (int64_t{1} << 40))
    BadFlag("--memory_budget_mb must be in [0, 2^40]");
  s.memory_budget_bytes = FLAGS_memory_budget_mb == 0
                              ? srv::MemoryBudget::DefaultCapacity()
                              : static_cast<uint64_t>(FLAGS_memory_budget_mb)
                                    << 20;
  if (FLAGS_max_unsent_mb_per_client < 1 ||
      FLAGS_max_unsent_mb_per_client > (int64_t{1} << 30))
    BadFlag("--max_unsent_mb_per_client must be in [1, 2^30]");
  s.max_unsent_bytes_per_client =
      static_cast<uint64_t>(FLAGS_max_unsent_mb_per_client) << 20;
  s.max_clock_jump = FLAGS_max_clock_jump;
  if (FLAGS_max_park_s < 0.001 || FLAGS_max_park_s > 1e6)
    BadFlag("--max_park_s must be in [0.001, 1e6]");
  s.max_park_time =
      std::chrono::milliseconds(static_cast<int64_t>(FLAGS_max_park_s * 1000));
  if (FLAGS_scan_snapshot_idle_s < 0.001 || FLAGS_scan_snapshot_idle_s > 1e6)
    BadFlag("--scan_snapshot_idle_s must be in [0.001, 1e6]");
  s.scan_snapshot_idle = std::chrono::milliseconds(
      static_cast<int64_t>(FLAGS_scan_snapshot_idle_s * 1000));
  if (FLAGS_shutdown_timeout_s <= 0)
    BadFlag("--shutdown_timeout_s must be > 0");
}

// Replicas (--etcd) and elastic shards (--elastic_etcd).
void ReplicationFromFlags(srv::ServerOptions* out) {
  srv::ServerOptions& o = *out;
  const srv::ShardOptions& s = o.shard;
  if (FLAGS_replicas < 1 || FLAGS_replicas > 16)
    BadFlag("--replicas must be in [1, 16]");
  if (FLAGS_replica < 0 || FLAGS_replica >= FLAGS_replicas)
    BadFlag("--replica must be in [0, --replicas)");
  if (FLAGS_replicas > 1 && FLAGS_etcd.empty())
    BadFlag("--replicas > 1 needs --etcd (the replica layout lives there)");
  {
    asyncps::EtcdSecurity security;
    Status sec = asyncps::EtcdSecurityFromFlags(&security);
    if (!sec.ok()) BadFlag(sec.message());
    o.replication.etcd_security = security;
    o.elastic_etcd_security = security;
  }
  if (!FLAGS_elastic_etcd.empty()) {
    if (FLAGS_etcd_prefix.empty() || FLAGS_etcd_prefix[0] != '/')
      BadFlag("--etcd_prefix must start with /");
    o.elastic_etcd_endpoints = SplitEndpoints(FLAGS_elastic_etcd);
    if (o.elastic_etcd_endpoints.empty())
      BadFlag("--elastic_etcd: no endpoint");
    o.elastic_prefix = FLAGS_etcd_prefix;
  }
  if (!FLAGS_etcd.empty()) {
    // Backups see the updates, not the pulls: rules that depend on what a
    // worker read would differ between replicas.
    if (s.staleness_lr != srv::StalenessLr::kNone ||
        s.delay_compensation.enabled()) {
      BadFlag(
          "--staleness_lr and --dc_lambda depend on pulls, which "
          "backups do not see: not supported with --etcd");
    }
    if (FLAGS_replica_tag == "all") {
      o.replica_tag_coverage = srv::replication::Coverage::kAll;
    } else if (FLAGS_replica_tag != "header") {
      BadFlag("--replica_tag must be header or all, not '" + FLAGS_replica_tag +
              "'");
    }
    if (FLAGS_replica_tag == "all" && !FLAGS_curve_secret_key.empty()) {
      BadFlag(
          "--replica_tag=all with --curve_secret_key: CurveZMQ already "
          "authenticates every byte");
    }
    if (!FLAGS_replica_secret_file.empty()) {
      if (!FLAGS_curve_secret_key.empty()) {
        BadFlag(
            "--replica_secret_file with --curve_secret_key: with CURVE "
            "the replicas' keys authenticate replica traffic");
      }
      StatusOr<std::string> secret =
          srv::replication::LoadReplicaSecret(FLAGS_replica_secret_file);
      if (!secret.ok())
        BadFlag("--replica_secret_file: " + secret.status().message());
      o.replica_secret = *secret;
    }
    if (FLAGS_lease_ms < 100 || FLAGS_lease_ms > 600000)
      BadFlag("--lease_ms must be in [100, 600000]");
    if (FLAGS_etcd_prefix.empty() || FLAGS_etcd_prefix[0] != '/')
      BadFlag("--etcd_prefix must start with /");
    o.replication.etcd_endpoints = SplitEndpoints(FLAGS_etcd);
    if (o.replication.etcd_endpoints.empty()) BadFlag("--etcd: no endpoint");
    o.replication.prefix = FLAGS_etcd_prefix;
    o.replication.replicas = FLAGS_replicas;
    o.replication.replica = FLAGS_replica;
    o.replication.lease_ttl = std::chrono::milliseconds(FLAGS_lease_ms);
    o.replication.poll = std::chrono::milliseconds(
        std::max(10, std::min(100, FLAGS_lease_ms / 5)));
    o.replication.endpoint = FLAGS_advertise_endpoint;
    if (FLAGS_replica_suspect_ms < 0 || FLAGS_replica_suspect_ms > 600000)
      BadFlag("--replica_suspect_ms must be in [0, 600000]");
    if (FLAGS_replica_suspect_ms > 0 && FLAGS_replica_suspect_ms < 200)
      BadFlag("--replica_suspect_ms below 200 would depose busy primaries");
    o.replica_suspect_after =
        std::chrono::milliseconds(FLAGS_replica_suspect_ms);
    o.replicate_after_aggregation = FLAGS_replicate_after_aggregation;
    if (FLAGS_round_record_flush_ms < 1 || FLAGS_round_record_flush_ms > 600000)
      BadFlag("--round_record_flush_ms must be in [1, 600000]");
    o.round_record_flush_after =
        std::chrono::milliseconds(FLAGS_round_record_flush_ms);
  }
}

// CurveZMQ keys, and the refusal to serve a remote endpoint in the clear.
void CurveFromFlags(srv::ServerOptions* out) {
  srv::ServerOptions& o = *out;
  if (!FLAGS_curve_secret_key.empty()) {
    StatusOr<std::string> k = asyncps::LoadCurveKey(FLAGS_curve_secret_key);
    if (!k.ok()) BadFlag("--curve_secret_key: " + k.status().message());
    o.curve_secret_key = *k;
  }
  if (!FLAGS_curve_allowed_clients.empty()) {
    if (o.curve_secret_key.empty())
      BadFlag("--curve_allowed_clients needs --curve_secret_key");
    StatusOr<std::vector<std::string>> keys =
        asyncps::LoadCurveKeyList(FLAGS_curve_allowed_clients);
    if (!keys.ok())
      BadFlag("--curve_allowed_clients: " + keys.status().message());
    if (keys->empty())
      BadFlag("--curve_allowed_clients: no key in " +
              FLAGS_curve_allowed_clients);
    o.curve_allowed_client_keys = *keys;
  }
  if (!FLAGS_curve_admin_clients.empty()) {
    if (o.curve_secret_key.empty())
      BadFlag("--curve_admin_clients needs --curve_secret_key");
    StatusOr<std::vector<std::string>> keys =
        asyncps::LoadCurveKeyList(FLAGS_curve_admin_clients);
    if (!keys.ok())
      BadFlag("--curve_admin_clients: " + keys.status().message());
    if (keys->empty())
      BadFlag("--curve_admin_clients: no key in " + FLAGS_curve_admin_clients);
    o.curve_admin_keys = *keys;
  }
  if (o.curve_secret_key.empty() && !FLAGS_insecure &&
      !IsLocalEndpoint(FLAGS_endpoint)) {
    BadFlag("--endpoint=" + FLAGS_endpoint +
            " is not a loopback address: give --curve_secret_key (keys from "
            "ps_ctl keygen) or --insecure to serve it unencrypted");
  }
}

// Apply threads, sparse tables and durability.
void ExecutionFromFlags(srv::ShardOptions* shard) {
  srv::ShardOptions& s = *shard;
  if (FLAGS_apply_threads < 0 || FLAGS_apply_threads > 256)
    BadFlag("--apply_threads must be in [0, 256]");
  s.apply_threads =
      FLAGS_apply_threads > 0 ? FLAGS_apply_threads : DefaultApplyThreads();
  s.transport_only = FLAGS_transport_only;
  if (FLAGS_embedding_cache_bytes < (1u << 20))
    BadFlag("--embedding_cache_bytes must be >= 1 MiB");
  if (FLAGS_max_sparse_keys < 1 || FLAGS_max_sparse_reply_bytes < 1)
    BadFlag("--max_sparse_keys and --max_sparse_reply_bytes must be >= 1");
  s.sparse.cache_bytes = FLAGS_embedding_cache_bytes;
  s.sparse.max_keys_per_request = FLAGS_max_sparse_keys;
  s.sparse.max_reply_bytes = FLAGS_max_sparse_reply_bytes;
  s.durable = FLAGS_durable;
  if (FLAGS_durable && FLAGS_db_path.empty())
    BadFlag("--durable needs --db_path");
  if (FLAGS_durable_sync && !FLAGS_durable)
    BadFlag("--durable_sync needs --durable");
  s.durable_sync = FLAGS_durable_sync ? asyncps::server::SyncMode::kSync
                                      : asyncps::server::SyncMode::kNoSync;
  if (FLAGS_max_message_bytes < 1024)
    BadFlag("--max_message_bytes must be >= 1024");
}

srv::ServerOptions OptionsFromFlags() {
  srv::ServerOptions o;
  TransportFromFlags(&o);
  srv::ShardOptions& s = o.shard;
  ConsistencyFromFlags(&s);
  LrScheduleFromFlags(&s);
  OptimizerFromFlags(&s);
  LimitsFromFlags(&s);
  ReplicationFromFlags(&o);
  CurveFromFlags(&o);
  ExecutionFromFlags(&s);
  Status mv = asyncps::metrics::ValidateMetricsFlags();
  if (!mv.ok()) BadFlag(mv.message());
  Status v = s.Validate();
  if (!v.ok()) BadFlag(v.message());
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  asyncps::ToolOptions tool;
  tool.tune_allocator_for_messages = true;
  asyncps::InitTool("ps_server: one shard of the asyncps parameter server",
                    &argc, &argv, tool);
  if (argc > 1) BadFlag(std::string("unexpected argument '") + argv[1] + "'");

  // Signals are taken by a dedicated thread (sigtimedwait): no global flag.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  srv::ServerOptions options = OptionsFromFlags();
  const srv::ShardOptions& s = options.shard;
  LOG(INFO) << "ps_server shard " << s.shard_id << "/" << s.num_shards
            << ": workers " << s.num_workers << ", consistency "
            << srv::ConsistencyName(s.consistency) << " staleness "
            << s.staleness << ", staleness lr "
            << srv::StalenessLrName(s.staleness_lr) << ", delay compensation "
            << s.delay_compensation.ToString() << ", lr schedule "
            << s.lr_schedule().ToString() << ", optimizer "
            << s.optimizer.ToString() << ", db_path '" << options.db_path
            << "', checkpoint every " << options.checkpoint_every.count()
            << " ms, durable " << s.durable
            << (FLAGS_durable_sync ? " (fsync)" : "") << ", worker timeout "
            << s.worker_timeout.count() << " ms, max message "
            << options.max_message_bytes << " B (frames "
            << options.max_frame_bytes << " B), memory budget "
            << s.memory_budget_bytes << " B, max unsent per client "
            << s.max_unsent_bytes_per_client << " B, max clock jump "
            << s.max_clock_jump << ", max park " << s.max_park_time.count()
            << " ms, admin from "
            << (options.curve_secret_key.empty()
                    ? (options.allow_remote_admin ? "anywhere" : "loopback")
                    : std::to_string(options.curve_admin_keys.size()) +
                          " CURVE admin keys")
            << ", max parked pulls " << s.max_parked_pulls
            << ", max in flight per client " << s.max_inflight_per_client
            << ", apply threads " << s.apply_threads << ", embedding cache "
            << s.sparse.cache_bytes << " B, max sparse keys "
            << s.sparse.max_keys_per_request << ", CURVE "
            << (options.curve_secret_key.empty()
                    ? std::string("off")
                    : "on (" +
                          (options.curve_allowed_client_keys.empty()
                               ? std::string("any client key")
                               : std::to_string(
                                     options.curve_allowed_client_keys.size()) +
                                     " allowed client keys") +
                          ")")
            << (s.transport_only ? ", TRANSPORT ONLY (pushes not applied)"
                                 : "");

  // The registry outlives the server that feeds it and the HTTP server
  // that reads it (declared first, destroyed last).
  asyncps::metrics::Registry registry;
  std::unique_ptr<asyncps::metrics::MetricsServer> metrics_server;
  if (asyncps::metrics::MetricsRequested()) {
    asyncps::metrics::AddProcessMetrics(&registry);
    options.metrics = &registry;
  }
  StatusOr<std::unique_ptr<srv::Server>> server = srv::Server::Create(options);
  if (!server.ok()) {
    LOG(ERROR) << "cannot start: " << server.status().ToString();
    return 1;
  }
  LOG(INFO) << "serving on " << (*server)->endpoint();
  if (asyncps::metrics::MetricsRequested()) {
    auto m = asyncps::metrics::StartMetricsFromFlags(&registry);
    if (!m.ok()) {
      LOG(ERROR) << "metrics: " << m.status().ToString();
      return 1;
    }
    metrics_server = std::move(m).value();
  }
  if (!options.curve_secret_key.empty()) {
    StatusOr<std::string> pub =
        asyncps::DeriveCurvePublicKey(options.curve_secret_key);
    if (pub.ok()) LOG(INFO) << "CURVE server public key " << *pub;
  }
  if (!FLAGS_ready_file.empty()) {
    Status st = asyncps::WriteFileAtomically(FLAGS_ready_file,
                                             (*server)->endpoint() + "\n");
    if (!st.ok()) {
      LOG(ERROR) << st.ToString();
      return 1;
    }
  }

  std::atomic<bool> stop{false};
  std::atomic<bool> done{false};
  srv::ShutdownWatchdog::Options wo;
  wo.grace = std::chrono::milliseconds(
      static_cast<int64_t>(FLAGS_shutdown_timeout_s * 1000));
  wo.force_exit = [](const std::string& why) {
    LOG(ERROR) << why << ": exiting now, without a final checkpoint";
    google::FlushLogFiles(google::GLOG_INFO);
    std::fflush(nullptr);
    _exit(3);
  };
  srv::ShutdownWatchdog watchdog(std::move(wo));
  // Signals are seen here, not by the event loop: a stuck loop cannot keep
  // the process from stopping.
  std::thread signal_thread([&] {
    timespec wait{0, 200 * 1000 * 1000};
    while (!done.load()) {
      int sig = sigtimedwait(&sigs, nullptr, &wait);
      if (sig == SIGTERM || sig == SIGINT) {
        LOG(INFO) << "signal " << sig << ": shutting down";
        stop.store(true);
        watchdog.StopRequested();
      }
    }
  });
  Status st = (*server)->Run(stop);
  watchdog.Done();
  done.store(true);
  signal_thread.join();
  if (!st.ok()) {
    LOG(ERROR) << "final checkpoint failed: " << st.ToString();
    return 1;
  }
  LOG(INFO) << "ps_server shard " << s.shard_id << " exited cleanly";
  return 0;
}
