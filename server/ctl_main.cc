// ps_ctl: admin client for ps_server shards.
//
//   ps_ctl --servers=tcp://127.0.0.1:5000,tcp://127.0.0.1:5001 stats
//   ps_ctl --servers=... checkpoint | shutdown [--timeout_ms=5000]
//
// Prints one JSON document: {"command":..,"ok":..,"shards":[{"endpoint":..,
// "ok":..,"code":..,"message":..,"version":..,"min_clock":..,"stats":{..}}]}.
// Exit status 0 if every shard answered OK, 1 otherwise, 2 on bad usage.
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "common/transport.h"
#include "common/wire.h"

DEFINE_string(servers, "", "comma-separated shard endpoints, in shard order");
DEFINE_int32(timeout_ms, 5000, "deadline for each shard's reply, milliseconds");

namespace {

using namespace asyncps;  // NOLINT: tool main

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Sends one admin request to `endpoint`, waits for the reply.
Status Call(const std::shared_ptr<Context>& ctx, const std::string& endpoint,
            RequestKind kind, ReplyHeader* reply) {
  TransportOptions to;
  to.context = ctx;
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

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "ps_ctl --servers=EP[,EP...] stats|checkpoint|shutdown");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  if (argc != 2) {
    std::fprintf(
        stderr,
        "usage: ps_ctl --servers=EP[,EP...] stats|checkpoint|shutdown\n");
    return 2;
  }
  const std::string cmd = argv[1];
  RequestKind kind;
  if (cmd == "stats") {
    kind = RequestKind::kStats;
  } else if (cmd == "checkpoint") {
    kind = RequestKind::kCheckpoint;
  } else if (cmd == "shutdown") {
    kind = RequestKind::kShutdown;
  } else {
    std::fprintf(stderr,
                 "ps_ctl: unknown command '%s' (stats, checkpoint, shutdown)\n",
                 cmd.c_str());
    return 2;
  }
  std::vector<std::string> endpoints;
  std::stringstream ss(FLAGS_servers);
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
  bool all_ok = true;
  std::string out = "{\"command\":" + JsonString(cmd) + ",\"shards\":[";
  for (size_t i = 0; i < endpoints.size(); ++i) {
    ReplyHeader reply;
    Status st = Call(ctx, endpoints[i], kind, &reply);
    if (st.ok()) st = reply.status;
    all_ok = all_ok && st.ok();
    if (i) out += ',';
    out += "{\"endpoint\":" + JsonString(endpoints[i]) +
           ",\"ok\":" + (st.ok() ? "true" : "false");
    out += ",\"code\":" + JsonString(StatusCodeName(st.code()));
    out += ",\"message\":" + JsonString(st.message());
    out += ",\"version\":" + std::to_string(reply.shard_version);
    out += ",\"min_clock\":" + std::to_string(reply.min_clock);
    if (kind == RequestKind::kStats && st.ok() && !reply.text.empty()) {
      out += ",\"stats\":" + reply.text;
    }
    out += '}';
  }
  out += "],\"ok\":" + std::string(all_ok ? "true" : "false") + "}";
  std::printf("%s\n", out.c_str());
  return all_ok ? 0 : 1;
}
