// ps_ctl: admin client for ps_server shards.
//
//   ps_ctl --servers=tcp://127.0.0.1:5000,tcp://127.0.0.1:5001 stats
//   ps_ctl --servers=... checkpoint | shutdown [--timeout_ms=5000]
//   ps_ctl keygen [--out=PREFIX [--force]]  # CurveZMQ key pair
//   ps_ctl secretgen [--out=FILE [--force]] # a replica group's secret
//                                    # (ps_server --replica_secret_file)
//   ps_ctl --servers=... top [--interval_ms=1000] [--iterations=N]
//                                    # live view until Ctrl-C (ctl_top.h)
//   ps_ctl --etcd=http://127.0.0.1:2379 [--etcd_prefix=/asyncps/JOB]
//          [--servers=...] add-shard|remove-shard ENDPOINT
//                                    # elastic shards while training
//                                    # (server/elastic/coordinator.h)
//
// add-shard / remove-shard move chunks onto / off the shard at ENDPOINT and
// print one JSON line {"command", "ok", "epoch", "moved_chunks",
// "moved_bytes", "frozen_ms", "imbalance_before", "imbalance_after", ...};
// --servers (the fleet's endpoints in shard order) is needed for the first
// change of a fleet only (later ones read the layout from etcd). A shard
// added must run with --shard_id=N --num_shards=N+1, N the fleet's shard
// count so far. Errors: {"command", "ok": false, "code", "message"}, exit 1.
//
// keygen writes PREFIX.key (the secret key, mode 0600 from its creation) and
// PREFIX.pub (the public key), Z85 text on one line each after a comment;
// without --out it prints both. A file or symlink already at either path is
// refused (exit 1, nothing written) unless --force, which replaces it
// without following a symlink. A server takes --curve_secret_key=server.key;
// its clients
// --curve_server_key=server.pub plus their own --curve_secret_key; the
// server's --curve_allowed_clients file lists the clients' .pub lines.
//
// Prints one JSON document: {"command":..,"ok":..,"shards":[{"endpoint":..,
// "ok":..,"code":..,"message":..,"version":..,"min_clock":..,"stats":{..}}]}.
// Exit status 0 if every shard answered OK, 1 otherwise, 2 on bad usage.
#include <fcntl.h>
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/curve_flags.h"
#include "common/etcd_flags.h"
#include "common/tool_main.h"
#include "common/transport.h"
#include "common/wire.h"
#include "server/ctl/ctl_top.h"
#include "server/elastic/coordinator.h"
#include "server/replication/replica_auth.h"

DEFINE_string(servers, "",
              "comma-separated shard endpoints, in shard order; a replica "
              "group 'ep1|ep2' is asked member by member");
DEFINE_int32(timeout_ms, 5000, "deadline for each shard's reply, milliseconds");
DEFINE_string(out, "", "keygen: write PREFIX.key and PREFIX.pub");
DEFINE_bool(force, false,
            "keygen: replace an existing PREFIX.key / PREFIX.pub (a symlink "
            "there is replaced, never followed); without it they are refused");
DEFINE_int32(interval_ms, 1000, "top: milliseconds between frames");
DEFINE_int32(iterations, 0, "top: frames to draw, 0: until Ctrl-C");
DEFINE_string(etcd, "",
              "add-shard/remove-shard: comma-separated etcd endpoints "
              "(http://host:port) holding the fleet's elastic layout");
DEFINE_string(etcd_prefix, "/asyncps/default",
              "add-shard/remove-shard: the fleet's key prefix in etcd (the "
              "layout is <prefix>/elastic)");
DEFINE_int32(freeze_deadline_ms, 10000,
             "add-shard/remove-shard: a frozen shard aborts the change by "
             "itself when it hears nothing for this long, ms");
DEFINE_int32(drain_timeout_ms, 5000,
             "add-shard/remove-shard: longest wait for the frozen shards to "
             "finish the round under way, ms");
DEFINE_string(clear, "auto",
              "top: clear the screen between frames: auto (when stdout is a "
              "terminal) | true | false");

namespace {

using namespace asyncps;  // NOLINT: tool main

using Json = nlohmann::ordered_json;

// Sends one admin request to `endpoint`, waits for the reply.
Status Call(const std::shared_ptr<Context>& ctx, const std::string& endpoint,
            RequestKind kind, ReplyHeader* reply) {
  TransportOptions to;
  to.context = ctx;
  RETURN_IF_ERROR(CurveClientKeysFromFlags(&to));
  ASSIGN_OR_RETURN(std::unique_ptr<ClientSocket> sock,
                   ClientSocket::Connect(endpoint, to));
  RequestHeader req;
  req.id = 1;
  req.rank = -1;
  req.kind = kind;
  std::vector<Frame> frames;
  frames.push_back(Frame::Owned(EncodeRequest(req)));
  RETURN_IF_ERROR(sock->Send(frames));
  Message msg;
  ASSIGN_OR_RETURN(
      bool got,
      sock->Receive(&msg, std::chrono::milliseconds(FLAGS_timeout_ms)));
  if (!got)
    return Status::TimedOut("no reply within " +
                            std::to_string(FLAGS_timeout_ms) + " ms");
  RETURN_IF_ERROR(msg.error);
  if (msg.frames.empty()) return Status::Corruption("empty reply");
  return DecodeReply(msg.frames[0].data, msg.frames[0].size, DecodeLimits(),
                     reply);
}

// Creates `path` (which must not exist: O_EXCL, and O_NOFOLLOW so that a
// symlink there is never followed) with permissions exactly `mode` from the
// first moment (open's mode, then fchmod for what the umask took away; the
// umask only ever removes bits), and writes `text` to it.
Status CreateKeyFile(const std::string& path, const std::string& text,
                     mode_t mode) {
  const int fd = open(
      path.c_str(), O_CREAT | O_EXCL | O_NOFOLLOW | O_WRONLY | O_CLOEXEC, mode);
  if (fd < 0) {
    return errno == EEXIST
               ? Status::AlreadyExists(path + " exists (a file or a symlink)")
               : Status::Unavailable("cannot create " + path + ": " +
                                     std::strerror(errno));
  }
  auto fail = [&](Status s) {
    close(fd);
    unlink(path.c_str());  // ours: just created with O_EXCL
    return s;
  };
  auto io_error = [&](const std::string& what) {
    return fail(Status::Unavailable("cannot " + what + " " + path + ": " +
                                    std::strerror(errno)));
  };
  struct stat st {};
  if (fchmod(fd, mode) != 0 || fstat(fd, &st) != 0) return io_error("chmod");
  if ((st.st_mode & 07777) != mode) {
    std::ostringstream m;
    m << path << " has mode 0" << std::oct << (st.st_mode & 07777)
      << " after fchmod, not 0" << mode;
    return fail(Status::Internal(m.str()));
  }
  for (size_t at = 0; at < text.size();) {
    const ssize_t n = write(fd, text.data() + at, text.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return io_error("write");
    at += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) return io_error("sync");
  if (close(fd) != 0) {
    unlink(path.c_str());
    return Status::Unavailable("cannot write " + path + ": " +
                               std::strerror(errno));
  }
  return Status::OK();
}

// Writes a key file at `path`. Without `replace`, whatever exists there (a
// file or a symlink) is refused. With it, the new file is made beside it
// (CreateKeyFile) and renamed over it: a symlink at `path` is replaced,
// never followed, and the old file stays whole until the new one is.
Status WriteKeyFile(const std::string& path, const std::string& text,
                    mode_t mode, bool replace) {
  if (!replace) return CreateKeyFile(path, text, mode);
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  RETURN_IF_ERROR(CreateKeyFile(tmp, text, mode));
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    Status s = Status::Unavailable("cannot rename " + tmp + " to " + path +
                                   ": " + std::strerror(errno));
    unlink(tmp.c_str());
    return s;
  }
  return Status::OK();
}

int KeyGen() {
  std::string pub, sec;
  Status s = GenerateCurveKeyPair(&pub, &sec);
  if (!s.ok()) {
    std::fprintf(stderr, "ps_ctl keygen: %s\n", s.ToString().c_str());
    return 1;
  }
  if (FLAGS_out.empty()) {
    std::printf("public=%s\nsecret=%s\n", pub.c_str(), sec.c_str());
    return 0;
  }
  const std::string key = FLAGS_out + ".key", pubf = FLAGS_out + ".pub";
  // Both refused before either is written: a refusal leaves nothing behind.
  struct stat st {};
  for (const std::string& path : {key, pubf}) {
    if (!FLAGS_force && lstat(path.c_str(), &st) == 0) {
      std::fprintf(stderr,
                   "ps_ctl keygen: %s exists (a file or a symlink); not "
                   "replaced without --force\n",
                   path.c_str());
      return 1;
    }
  }
  s = WriteKeyFile(
      key, "# asyncps CurveZMQ secret key (Z85); keep private\n" + sec + "\n",
      0600, FLAGS_force);
  if (s.ok()) {
    s = WriteKeyFile(pubf, "# asyncps CurveZMQ public key (Z85)\n" + pub + "\n",
                     0644, FLAGS_force);
    // Without --force the .key is new (O_EXCL): no half pair is left.
    if (!s.ok() && !FLAGS_force) unlink(key.c_str());
  }
  if (!s.ok()) {
    std::fprintf(stderr, "ps_ctl keygen: %s%s\n", s.message().c_str(),
                 s.code() == StatusCode::kAlreadyExists
                     ? "; not replaced without --force"
                     : "");
    return 1;
  }
  const Json out = {{"command", "keygen"},
                    {"ok", true},
                    {"secret_key_file", key},
                    {"public_key_file", pubf},
                    {"public_key", pub}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

// ps_ctl secretgen: a replica group's secret (server/replication/
// replica_auth.h) for ps_server --replica_secret_file, written like a key.
int SecretGen() {
  StatusOr<std::string> secret = server::replication::NewReplicaSecret();
  if (!secret.ok()) {
    std::fprintf(stderr, "ps_ctl secretgen: %s\n",
                 secret.status().ToString().c_str());
    return 1;
  }
  const std::string hex = server::replication::SecretToHex(*secret);
  if (FLAGS_out.empty()) {
    std::printf("%s\n", hex.c_str());
    return 0;
  }
  struct stat st {};
  if (!FLAGS_force && lstat(FLAGS_out.c_str(), &st) == 0) {
    std::fprintf(stderr,
                 "ps_ctl secretgen: %s exists (a file or a symlink); not "
                 "replaced without --force\n",
                 FLAGS_out.c_str());
    return 1;
  }
  Status s = WriteKeyFile(FLAGS_out,
                          "# asyncps replica group secret: for the group's "
                          "replicas only (--replica_secret_file)\n" +
                              hex + "\n",
                          0600, FLAGS_force);
  if (!s.ok()) {
    std::fprintf(stderr, "ps_ctl secretgen: %s\n", s.message().c_str());
    return 1;
  }
  std::printf(
      "%s\n",
      Json{{"command", "secretgen"}, {"ok", true}, {"secret_file", FLAGS_out}}
          .dump()
          .c_str());
  return 0;
}

// ps_ctl top: frames until Ctrl-C (SIGINT/SIGTERM are blocked and polled,
// so the loop ends within its 50 ms polling step and the terminal is left
// clean).
int Top(const std::shared_ptr<Context>& ctx,
        const std::vector<std::string>& endpoints) {
  if (FLAGS_interval_ms < 1 || FLAGS_iterations < 0) {
    std::fprintf(stderr,
                 "ps_ctl top: --interval_ms must be >= 1, --iterations >= 0\n");
    return 2;
  }
  if (FLAGS_clear != "auto" && FLAGS_clear != "true" &&
      FLAGS_clear != "false") {
    std::fprintf(stderr, "ps_ctl top: --clear must be auto, true or false\n");
    return 2;
  }
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  server::TopOptions o;
  o.interval = std::chrono::milliseconds(FLAGS_interval_ms);
  o.iterations = FLAGS_iterations;
  o.clear_screen = FLAGS_clear == "true" ||
                   (FLAGS_clear == "auto" && isatty(fileno(stdout)));
  auto fetch = [&](size_t i) -> StatusOr<std::string> {
    ReplyHeader reply;
    RETURN_IF_ERROR(Call(ctx, endpoints[i], RequestKind::kStats, &reply));
    RETURN_IF_ERROR(reply.status);
    return reply.text;
  };
  auto stop = [&sigs] {
    sigset_t pending;
    sigpending(&pending);
    return sigismember(&pending, SIGINT) == 1 ||
           sigismember(&pending, SIGTERM) == 1;
  };
  Status s = server::RunTop(endpoints, fetch, stop, o);
  if (!s.ok()) {
    std::fprintf(stderr, "ps_ctl top: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

// Comma-separated items; with `members`, a replica group "ep1|ep2" counts
// as its members (stats of every process), else as one shard.
std::vector<std::string> SplitList(std::string list, bool members = true) {
  if (members) std::replace(list.begin(), list.end(), '|', ',');
  std::vector<std::string> out;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// add-shard / remove-shard ENDPOINT (server/elastic/coordinator.h).
int Elastic(const std::string& cmd, const std::string& endpoint) {
  auto fail = [&](const Status& s, int code) {
    const Json out = {{"command", cmd},
                      {"ok", false},
                      {"endpoint", endpoint},
                      {"code", StatusCodeName(s.code())},
                      {"message", s.message()}};
    std::printf("%s\n", out.dump().c_str());
    std::fprintf(stderr, "ps_ctl %s: %s\n", cmd.c_str(), s.ToString().c_str());
    return code;
  };
  if (FLAGS_etcd.empty()) {
    return fail(Status::InvalidArgument(
                    "--etcd is required: the fleet's elastic layout lives in "
                    "etcd (psrun starts one with elastic flags)"),
                2);
  }
  if (FLAGS_timeout_ms < 1 || FLAGS_freeze_deadline_ms < 1 ||
      FLAGS_drain_timeout_ms < 1) {
    return fail(
        Status::InvalidArgument("--timeout_ms, --freeze_deadline_ms and "
                                "--drain_timeout_ms must be >= 1"),
        2);
  }
  server::elastic::CoordinatorOptions o;
  o.etcd_endpoints = SplitList(FLAGS_etcd);
  o.etcd_prefix = FLAGS_etcd_prefix;
  Status security = EtcdSecurityFromFlags(&o.etcd_security);
  if (!security.ok()) return fail(security, 2);
  o.servers = SplitList(FLAGS_servers, /*members=*/false);  // groups whole
  o.request_timeout = std::chrono::milliseconds(FLAGS_timeout_ms);
  o.drain_timeout = std::chrono::milliseconds(FLAGS_drain_timeout_ms);
  o.freeze_deadline_ms = static_cast<uint32_t>(FLAGS_freeze_deadline_ms);
  Status keys = CurveClientKeysFromFlags(&o.transport);
  if (!keys.ok()) return fail(keys, 2);
  StatusOr<std::unique_ptr<server::elastic::Coordinator>> c =
      server::elastic::Coordinator::Create(o);
  if (!c.ok()) return fail(c.status(), 2);
  StatusOr<server::elastic::ChangeReport> r = cmd == "add-shard"
                                                  ? (*c)->AddShard(endpoint)
                                                  : (*c)->RemoveShard(endpoint);
  if (!r.ok()) return fail(r.status(), 1);
  std::printf("%s\n", r->ToJson().c_str());
  return r->adopt_failures.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  asyncps::InitTool(
      "ps_ctl --servers=EP[,EP...] stats|checkpoint|shutdown | ps_ctl keygen "
      "[--out=PREFIX [--force]]",
      &argc, &argv);
  if (argc >= 2 && (std::string(argv[1]) == "add-shard" ||
                    std::string(argv[1]) == "remove-shard")) {
    if (argc != 3) {
      std::fprintf(stderr,
                   "usage: ps_ctl --etcd=EP [--etcd_prefix=P] "
                   "[--servers=...] %s ENDPOINT\n",
                   argv[1]);
      return 2;
    }
    return Elastic(argv[1], argv[2]);
  }
  if (argc != 2) {
    std::fprintf(
        stderr,
        "usage: ps_ctl --servers=EP[,EP...] stats|checkpoint|shutdown\n"
        "       ps_ctl keygen [--out=PREFIX [--force]]\n"
        "       ps_ctl secretgen [--out=FILE [--force]]\n"
        "       ps_ctl --etcd=EP [--servers=...] add-shard|remove-shard "
        "ENDPOINT\n");
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "keygen") return KeyGen();
  if (cmd == "secretgen") return SecretGen();
  RequestKind kind = RequestKind::kStats;
  if (cmd == "stats" || cmd == "top") {
    kind = RequestKind::kStats;
  } else if (cmd == "checkpoint") {
    kind = RequestKind::kCheckpoint;
  } else if (cmd == "shutdown") {
    kind = RequestKind::kShutdown;
  } else {
    std::fprintf(stderr,
                 "ps_ctl: unknown command '%s' (stats, checkpoint, shutdown, "
                 "top, add-shard, remove-shard)\n",
                 cmd.c_str());
    return 2;
  }
  // A replicated shard is its replica group "ep1|ep2": every member is
  // asked (each answers for itself; stats say which is the primary).
  std::vector<std::string> endpoints;
  std::string list = FLAGS_servers;
  std::replace(list.begin(), list.end(), '|', ',');
  std::stringstream ss(list);
  for (std::string ep; std::getline(ss, ep, ',');) {
    if (!ep.empty()) endpoints.push_back(ep);
  }
  if (endpoints.empty()) {
    std::fprintf(stderr, "ps_ctl: --servers is required\n");
    return 2;
  }
  if (FLAGS_timeout_ms < 1) {
    std::fprintf(stderr, "ps_ctl: --timeout_ms must be >= 1\n");
    return 2;
  }
  std::shared_ptr<Context> ctx = Context::Create(1);
  if (cmd == "top") return Top(ctx, endpoints);
  bool all_ok = true;
  Json shards = Json::array();
  for (const std::string& endpoint : endpoints) {
    ReplyHeader reply;
    Status st = Call(ctx, endpoint, kind, &reply);
    if (st.ok()) st = reply.status;
    all_ok = all_ok && st.ok();
    Json shard = {{"endpoint", endpoint},
                  {"ok", st.ok()},
                  {"code", StatusCodeName(st.code())},
                  {"message", st.message()},
                  {"version", reply.shard_version},
                  {"min_clock", reply.min_clock}};
    if (kind == RequestKind::kStats && st.ok() && !reply.text.empty()) {
      // The shard's own document, embedded as JSON (a damaged one as text).
      Json stats = Json::parse(reply.text, nullptr, /*allow_exceptions=*/false);
      shard["stats"] = stats.is_discarded() ? Json(reply.text) : stats;
    }
    shards.push_back(std::move(shard));
  }
  const Json out = {
      {"command", cmd}, {"shards", std::move(shards)}, {"ok", all_ok}};
  std::printf("%s\n", out.dump().c_str());
  return all_ok ? 0 : 1;
}
