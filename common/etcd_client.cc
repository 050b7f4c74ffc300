#include "common/etcd_client.h"

#include <httplib.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/mutex.h"

// The gateway's JSON, as etcd 3.4 speaks it (grpc-gateway over the gRPC
// messages of etcdserverpb, proto3 JSON mapping):
//  - requests are POST with a JSON body; bytes fields (key, value,
//    range_end) are standard base64 with padding; int64 fields are decimal
//    strings both ways (numbers are accepted in requests);
//  - fields at their default (0, false, "", empty list, enum value 0 such
//    as event type PUT) are left out of answers;
//  - an error answers a non-200 status with
//    {"error": "...", "message": "...", "code": <gRPC code>};
//  - streaming calls (/v3/watch, /v3/lease/keepalive) answer one JSON
//    object per line, {"result": {...}} or {"error": {"grpc_code": ...,
//    "http_code": ..., "message": ...}}.
// Paths: /v3/kv/{put,range,deleterange,txn}, /v3/lease/{grant,keepalive,
// revoke}, /v3/watch. /v3/lease/revoke is also served as
// /v3/kv/lease/revoke in 3.4; the former is the one kept in 3.5.

namespace asyncps {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// ---- base64 (RFC 4648, standard alphabet, padded) ----

constexpr char kBase64Chars[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string Base64Encode(const std::string& in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (uint32_t(uint8_t(in[i])) << 16) |
                 (uint32_t(uint8_t(in[i + 1])) << 8) | uint8_t(in[i + 2]);
    out += kBase64Chars[v >> 18];
    out += kBase64Chars[(v >> 12) & 63];
    out += kBase64Chars[(v >> 6) & 63];
    out += kBase64Chars[v & 63];
  }
  if (i + 1 == in.size()) {
    uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    out += kBase64Chars[v >> 18];
    out += kBase64Chars[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    uint32_t v =
        (uint32_t(uint8_t(in[i])) << 16) | (uint32_t(uint8_t(in[i + 1])) << 8);
    out += kBase64Chars[v >> 18];
    out += kBase64Chars[(v >> 12) & 63];
    out += kBase64Chars[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

int Base64Value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

bool Base64Decode(const std::string& in, std::string* out) {
  out->clear();
  if (in.size() % 4 != 0) return false;
  out->reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    int pad = 0;
    if (last && in[i + 3] == '=') pad = in[i + 2] == '=' ? 2 : 1;
    uint32_t v = 0;
    for (int j = 0; j < 4; ++j) {
      int d = j >= 4 - pad ? 0 : Base64Value(in[i + j]);
      if (d < 0) return false;
      v = (v << 6) | uint32_t(d);
    }
    out->push_back(char(v >> 16));
    if (pad < 2) out->push_back(char((v >> 8) & 0xff));
    if (pad < 1) out->push_back(char(v & 0xff));
  }
  return true;
}

// ---- JSON field access (never throws) ----

Status BadField(const char* name, const char* what) {
  return Status::Corruption(std::string("etcd answer: field ") + name +
                            " is not " + what);
}

// The field `name` of `obj`, nullptr when absent or null (a proto3 default).
Status FindField(const json& obj, const char* name, const json** field) {
  *field = nullptr;
  if (!obj.is_object()) return Status::Corruption("etcd answer: not an object");
  auto it = obj.find(name);
  if (it != obj.end() && !it->is_null()) *field = &*it;
  return Status::OK();
}

// An int64 field (a decimal string, or a JSON integer): absent is 0.
Status GetInt(const json& obj, const char* name, int64_t* out) {
  *out = 0;
  const json* f;
  RETURN_IF_ERROR(FindField(obj, name, &f));
  if (f == nullptr) return Status::OK();
  if (f->is_number_integer()) {
    *out = f->get<int64_t>();
    return Status::OK();
  }
  if (f->is_string()) {
    const std::string& s = f->get_ref<const std::string&>();
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
    if (ec == std::errc() && end == s.data() + s.size() && !s.empty()) {
      return Status::OK();
    }
  }
  return BadField(name, "an int64");
}

// A bytes field (base64): absent is "".
Status GetBytes(const json& obj, const char* name, std::string* out) {
  out->clear();
  const json* f;
  RETURN_IF_ERROR(FindField(obj, name, &f));
  if (f == nullptr) return Status::OK();
  if (!f->is_string() || !Base64Decode(f->get_ref<const std::string&>(), out)) {
    return BadField(name, "base64");
  }
  return Status::OK();
}

// A sub-object (`list` false) or a list (`list` true): absent is empty.
// `*out` points into `obj`.
Status GetComposite(const json& obj, const char* name, bool list,
                    const json** out) {
  static const json kEmptyObject = json::object();
  static const json kEmptyList = json::array();
  RETURN_IF_ERROR(FindField(obj, name, out));
  if (*out == nullptr) {
    *out = list ? &kEmptyList : &kEmptyObject;
  } else if (list ? !(*out)->is_array() : !(*out)->is_object()) {
    return BadField(name, list ? "a list" : "an object");
  }
  return Status::OK();
}
Status GetObject(const json& obj, const char* name, const json** out) {
  return GetComposite(obj, name, /*list=*/false, out);
}
Status GetArray(const json& obj, const char* name, const json** out) {
  return GetComposite(obj, name, /*list=*/true, out);
}

bool GetBool(const json& obj, const char* name) {
  if (!obj.is_object()) return false;
  auto it = obj.find(name);
  return it != obj.end() && it->is_boolean() && it->get<bool>();
}

std::string GetString(const json& obj, const char* name) {
  if (!obj.is_object()) return "";
  auto it = obj.find(name);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : "";
}

Status ParseKeyValue(const json& j, EtcdKeyValue* kv) {
  RETURN_IF_ERROR(GetBytes(j, "key", &kv->key));
  RETURN_IF_ERROR(GetBytes(j, "value", &kv->value));
  RETURN_IF_ERROR(GetInt(j, "create_revision", &kv->create_revision));
  RETURN_IF_ERROR(GetInt(j, "mod_revision", &kv->mod_revision));
  RETURN_IF_ERROR(GetInt(j, "version", &kv->version));
  return GetInt(j, "lease", &kv->lease);
}

Status HeaderRevision(const json& answer, int64_t* revision) {
  const json* header;
  RETURN_IF_ERROR(GetObject(answer, "header", &header));
  return GetInt(*header, "revision", revision);
}

// gRPC status code (as the gateway reports it) -> Status.
Status FromGrpc(int64_t code, const std::string& message) {
  // Indexed by gRPC code: CANCELLED, UNKNOWN, INVALID_ARGUMENT,
  // DEADLINE_EXCEEDED, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED,
  // RESOURCE_EXHAUSTED, FAILED_PRECONDITION, ABORTED, OUT_OF_RANGE (e.g. a
  // compacted or future revision), UNIMPLEMENTED, INTERNAL, UNAVAILABLE,
  // DATA_LOSS, UNAUTHENTICATED.
  using C = StatusCode;
  static constexpr C kCodes[] = {
      C::kInternal,           C::kCancelled,        C::kInternal,
      C::kInvalidArgument,    C::kTimedOut,         C::kNotFound,
      C::kAlreadyExists,      C::kPermissionDenied, C::kResourceExhausted,
      C::kFailedPrecondition, C::kUnavailable,      C::kFailedPrecondition,
      C::kUnimplemented,      C::kInternal,         C::kUnavailable,
      C::kCorruption,         C::kPermissionDenied};
  const bool known = code > 0 && code < int64_t(std::size(kCodes));
  return Status(known ? kCodes[code] : C::kInternal, message);
}

// An error object of the gateway, in either shape (see the top of the
// file): a Status carrying etcd's message.
Status GatewayError(const json& err, const json& outer,
                    const std::string& where) {
  int64_t code = 2;
  std::string message;
  if (err.is_object()) {  // streaming shape
    if (!GetInt(err, "grpc_code", &code).ok()) code = 2;
    message = GetString(err, "message");
  } else {  // unary shape
    if (!GetInt(outer, "code", &code).ok()) code = 2;
    message = GetString(outer, "message");
    if (message.empty()) message = GetString(outer, "error");
  }
  if (message.empty()) message = "unknown error";
  // etcd answers missing or wrong credentials with InvalidArgument ("user
  // name is empty", "authentication failed"): they are refusals of who
  // asks, as its PERMISSION_DENIED and UNAUTHENTICATED are.
  if (message.find("user name is empty") != std::string::npos ||
      message.find("authentication failed") != std::string::npos) {
    return Status::PermissionDenied(where + ": " + message);
  }
  return FromGrpc(code, where + ": " + message);
}

// First byte string after every string starting with `prefix`: the
// range_end of a prefix range. "\0" (to the end of the keyspace) when
// there is none (empty prefix or only 0xff bytes).
std::string PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (uint8_t(end.back()) < 0xff) {
      end.back() = char(uint8_t(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

// First key of the range over `prefix`: "\0" (all keys) for "".
std::string PrefixStart(const std::string& prefix) {
  return prefix.empty() ? std::string(1, '\0') : prefix;
}

// The range over `prefix`: key and range_end in the gateway's JSON.
void SetPrefixRange(const std::string& prefix, json* req) {
  (*req)["key"] = Base64Encode(PrefixStart(prefix));
  (*req)["range_end"] = Base64Encode(PrefixEnd(prefix));
}

// The gateway's names of a compare target and of its operand's field.
struct CompareTargetJson {
  const char* target;
  const char* field;
};
constexpr CompareTargetJson kTargets[] = {  // Indexed by EtcdCompare::Target.
    {"VERSION", "version"},
    {"CREATE", "create_revision"},
    {"MOD", "mod_revision"},
    {"VALUE", "value"},
    {"LEASE", "lease"}};
constexpr const char* kResults[] = {  // Indexed by EtcdCompare::Result.
    "EQUAL", "GREATER", "LESS", "NOT_EQUAL"};

json OpToJson(const EtcdOp& op) {
  if (op.type == EtcdOp::Type::kDelete) {
    return {{"request_delete_range", {{"key", Base64Encode(op.key)}}}};
  }
  json put = {{"key", Base64Encode(op.key)}, {"value", Base64Encode(op.value)}};
  if (op.lease != 0) put["lease"] = std::to_string(op.lease);
  return {{"request_put", std::move(put)}};
}

struct Endpoint {
  std::string url;  // As given, for messages.
  std::string host;
  int port = 0;
  bool tls = false;  // https://
};

Status ParseEndpoint(const std::string& url, Endpoint* ep) {
  const std::string bad = "etcd endpoint \"" + url + "\": ";
  constexpr std::string_view kHttp = "http://", kHttps = "https://";
  ep->tls = url.compare(0, kHttps.size(), kHttps) == 0;
  if (!ep->tls && url.compare(0, kHttp.size(), kHttp) != 0) {
    return Status::InvalidArgument(bad + "must start with http:// or https://");
  }
  std::string rest = url.substr(ep->tls ? kHttps.size() : kHttp.size());
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.find('/') != std::string::npos) {
    return Status::InvalidArgument(bad + "must have no path");
  }
  size_t colon = rest.rfind(':');
  size_t bracket = rest.rfind(']');
  if (colon == std::string::npos ||
      (bracket != std::string::npos && colon < bracket)) {
    return Status::InvalidArgument(bad + "needs a port (http://host:port)");
  }
  std::string host = rest.substr(0, colon);
  std::string port = rest.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty() || host.find_first_of("[]@ ") != std::string::npos) {
    return Status::InvalidArgument(bad + "bad host");
  }
  int p = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() ||
      p < 1 || p > 65535) {
    return Status::InvalidArgument(bad + "port must be in [1, 65535]");
  }
  ep->url = url;
  ep->host = std::move(host);
  ep->port = p;
  return Status::OK();
}

// What one POST came back with.
struct Exchange {
  const Endpoint* endpoint = nullptr;  // The one last tried.
  httplib::Error error = httplib::Error::Success;
  int http_status = 0;
  std::string body;       // Unless the caller's receiver took it.
  bool oversize = false;  // The answer was over max_answer_bytes.
  std::string refused;    // Endpoints that could not be reached, for messages.
};

}  // namespace

EtcdCompare EtcdCompare::ModRevision(std::string key, Result r, int64_t n) {
  EtcdCompare c;
  c.key = std::move(key);
  c.target = Target::kModRevision;
  c.result = r;
  c.number = n;
  return c;
}

EtcdCompare EtcdCompare::CreateRevision(std::string key, Result r, int64_t n) {
  EtcdCompare c = ModRevision(std::move(key), r, n);
  c.target = Target::kCreateRevision;
  return c;
}

EtcdCompare EtcdCompare::Version(std::string key, Result r, int64_t n) {
  EtcdCompare c = ModRevision(std::move(key), r, n);
  c.target = Target::kVersion;
  return c;
}

EtcdCompare EtcdCompare::Lease(std::string key, Result r, int64_t lease) {
  EtcdCompare c = ModRevision(std::move(key), r, lease);
  c.target = Target::kLease;
  return c;
}

EtcdCompare EtcdCompare::Value(std::string key, Result r, std::string value) {
  EtcdCompare c = ModRevision(std::move(key), r, 0);
  c.target = Target::kValue;
  c.value = std::move(value);
  return c;
}

EtcdOp EtcdOp::Put(std::string key, std::string value, int64_t lease) {
  EtcdOp op;
  op.type = Type::kPut;
  op.key = std::move(key);
  op.value = std::move(value);
  op.lease = lease;
  return op;
}

EtcdOp EtcdOp::Delete(std::string key) {
  EtcdOp op;
  op.type = Type::kDelete;
  op.key = std::move(key);
  return op;
}

namespace {

// Blocks SIGPIPE for the calling thread while it lives, then takes a SIGPIPE
// raised meanwhile off the thread's pending set (one that was pending before
// is left alone) and restores the mask: a library must not change the
// process's signal handlers.
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    was_pending_ =
        sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1;
    blocked_ = pthread_sigmask(SIG_BLOCK, &pipe_, &old_) == 0;
  }
  ~ScopedSigpipeBlock() {
    if (!blocked_) return;
    if (!was_pending_) {
      const struct timespec zero = {0, 0};
      while (sigtimedwait(&pipe_, nullptr, &zero) == SIGPIPE) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_;
  bool was_pending_ = false;
  bool blocked_ = false;
};

}  // namespace

struct EtcdClient::Impl {
  std::vector<Endpoint> endpoints;
  std::chrono::milliseconds request_timeout{2000};
  EtcdSecurity security;
  size_t max_answer_bytes = size_t{16} << 20;
  // etcd's auth token (POST /v3/auth/authenticate), taken again when etcd
  // says it is no longer valid.
  Mutex token_mu;
  std::string token GUARDED_BY(token_mu);

  // A new connection to `ep` (TLS with the CA and client certificate for
  // https://).
  std::unique_ptr<httplib::Client> NewClient(const Endpoint& ep) const {
    std::unique_ptr<httplib::Client> cli;
    if (ep.tls) {
      const std::string origin =
          "https://" +
          (ep.host.find(':') != std::string::npos ? "[" + ep.host + "]"
                                                  : ep.host) +
          ":" + std::to_string(ep.port);
      cli = security.cert_file.empty()
                ? std::make_unique<httplib::Client>(origin)
                : std::make_unique<httplib::Client>(origin, security.cert_file,
                                                    security.key_file);
      cli->set_ca_cert_path(security.ca_file.c_str());
      cli->enable_server_certificate_verification(true);
    } else {
      cli = std::make_unique<httplib::Client>(ep.host, ep.port);
    }
    return cli;
  }

  std::string Token() {
    MutexLock l(&token_mu);
    return token;
  }
  // Index of the endpoint that answered last: tried first.
  std::atomic<size_t> preferred{0};
  bool keep_alive = true;  // EtcdOptions::keep_alive

  // Idle keep-alive connections of unary calls, per endpoint index: a call
  // takes one (or opens one) and gives it back once its answer was read
  // whole, so that a poll every 100 ms costs etcd no TCP accept and no new
  // gateway connection (0.72 -> 0.50 ms of etcd CPU per range read). A
  // connection whose call failed in any way is closed, never reused: its
  // stream may stand mid-answer. httplib checks an idle socket before it
  // writes on it and reconnects when etcd closed it (a restart).
  static constexpr size_t kMaxIdlePerEndpoint = 4;
  Mutex idle_mu;
  std::vector<std::vector<std::unique_ptr<httplib::Client>>> idle
      GUARDED_BY(idle_mu);

  std::unique_ptr<httplib::Client> TakeIdle(size_t idx) {
    MutexLock lock(&idle_mu);
    if (idle.size() <= idx || idle[idx].empty()) return nullptr;
    std::unique_ptr<httplib::Client> cli = std::move(idle[idx].back());
    idle[idx].pop_back();
    return cli;
  }

  void GiveBack(size_t idx, std::unique_ptr<httplib::Client> cli) {
    MutexLock lock(&idle_mu);
    if (idle.size() <= idx) idle.resize(endpoints.size());
    if (idle[idx].size() < kMaxIdlePerEndpoint)
      idle[idx].push_back(std::move(cli));
  }

  // POSTs `body` to `path`, trying the endpoints in turn while none can be
  // connected to. `receiver`, when set, gets the answer's body as it
  // streams in instead of Exchange::body. Never throws.
  Exchange Post(const char* path, const std::string& body,
                std::chrono::milliseconds read_timeout,
                const httplib::ContentReceiverWithProgress* receiver,
                const std::string& token = std::string()) {
    // A TLS write to a connection etcd closed (it refused the client's
    // certificate, or restarted) raises SIGPIPE, which would end the
    // process: OpenSSL writes without MSG_NOSIGNAL.
    const ScopedSigpipeBlock no_sigpipe;
    Exchange ex;
    const size_t n = endpoints.size();
    const size_t first = preferred.load(std::memory_order_relaxed) % n;
    for (size_t i = 0; i < n; ++i) {
      const size_t idx = (first + i) % n;
      const Endpoint& ep = endpoints[idx];
      ex.endpoint = &ep;
      // Streams (watch) get a connection of their own, closed after; so
      // does every call without keep-alive.
      const bool unary = receiver == nullptr && keep_alive;
      std::unique_ptr<httplib::Client> cli;
      try {
        if (unary) cli = TakeIdle(idx);
        if (cli == nullptr) {
          cli = NewClient(ep);
          cli->set_connection_timeout(request_timeout);
          cli->set_write_timeout(request_timeout);
          cli->set_keep_alive(unary);
          // httplib writes a request's headers and body apart: on a kept
          // connection Nagle would hold the body for the delayed ACK of
          // the headers (40 ms a call, measured by ps_bench_etcd).
          cli->set_tcp_nodelay(true);
        }
        cli->set_read_timeout(read_timeout);
        httplib::Request req;
        req.method = "POST";
        req.path = path;
        req.body = body;
        req.set_header("Content-Type", "application/json");
        if (!token.empty()) req.set_header("Authorization", token);
        // The body goes to a receiver and the status is taken from the
        // headers as they arrive, so that both survive the library's
        // failure on the trailers the gateway appends to error answers.
        req.response_handler = [&ex](const httplib::Response& r) {
          ex.http_status = r.status;
          return true;
        };
        if (receiver != nullptr) {
          req.content_receiver = *receiver;
        } else {
          // An answer is read within max_answer_bytes: a larger one ends
          // the call (Canceled), it is never buffered whole.
          req.content_receiver = [this, &ex](const char* data, size_t len,
                                             uint64_t, uint64_t) {
            if (ex.body.size() + len > max_answer_bytes) {
              ex.oversize = true;
              return false;
            }
            ex.body.append(data, len);
            return true;
          };
        }
        ex.http_status = 0;
        ex.body.clear();
        ex.oversize = false;
        httplib::Result res = cli->send(req);
        ex.error = res.error();
        if (unary && ex.error == httplib::Error::Success)
          GiveBack(idx, std::move(cli));
      } catch (...) {  // httplib may throw (allocation, regex): never past us
        ex.error = httplib::Error::Unknown;
      }
      if (ex.error == httplib::Error::Connection ||
          ex.error == httplib::Error::ConnectionTimeout) {
        ex.refused += (ex.refused.empty() ? "" : ", ") + ep.url + " (" +
                      httplib::to_string(ex.error) + ")";
        continue;
      }
      preferred.store(idx, std::memory_order_relaxed);
      return ex;
    }
    return ex;
  }

  // Takes an auth token for security.user (POST /v3/auth/authenticate).
  Status Authenticate() {
    StatusOr<json> answer = CallOnce(
        "/v3/auth/authenticate",
        {{"name", security.user}, {"password", security.password}}, "");
    if (!answer.ok()) {
      if (answer.status().IsRetryable()) return answer.status();
      return Status::PermissionDenied("etcd authentication as user '" +
                                      security.user +
                                      "' failed: " + answer.status().message());
    }
    std::string t = GetString(*answer, "token");
    if (t.empty()) return Status::Corruption("etcd authenticate: no token");
    MutexLock l(&token_mu);
    token = std::move(t);
    return Status::OK();
  }

  // The token to send (taken first when there is none yet); "" without a
  // user.
  StatusOr<std::string> CurrentToken() {
    if (security.user.empty()) return std::string();
    std::string t = Token();
    if (t.empty()) {
      RETURN_IF_ERROR(Authenticate());
      t = Token();
    }
    return t;
  }

  // True for etcd's answer to a token it no longer takes (expired, or from
  // before a restart): authenticate again and retry once.
  static bool TokenRefused(const Status& s) {
    return s.code() == StatusCode::kPermissionDenied &&
           (s.message().find("token") != std::string::npos ||
            s.message().find("user name is empty") != std::string::npos);
  }

  // A unary call: the answer's JSON object, or the error it carries.
  StatusOr<json> Call(const char* path, const json& request) {
    ASSIGN_OR_RETURN(std::string t, CurrentToken());
    StatusOr<json> answer = CallOnce(path, request, t);
    if (!security.user.empty() && TokenRefused(answer.status())) {
      RETURN_IF_ERROR(Authenticate());
      answer = CallOnce(path, request, Token());
    }
    return answer;
  }

  StatusOr<json> CallOnce(const char* path, const json& request,
                          const std::string& token) {
    Exchange ex = Post(path, request.dump(), request_timeout, nullptr, token);
    const std::string where = std::string("etcd ") + path + " at " +
                              (ex.endpoint ? ex.endpoint->url : "?");
    if (ex.error == httplib::Error::Connection ||
        ex.error == httplib::Error::ConnectionTimeout) {
      return Status::Unavailable(std::string("etcd ") + path +
                                 ": no endpoint reachable: " + ex.refused);
    }
    if (ex.oversize) {
      return Status::ResourceExhausted(
          where + ": answer over " + std::to_string(max_answer_bytes) +
          " bytes (EtcdOptions::max_answer_bytes)");
    }
    if (ex.error == httplib::Error::SSLConnection ||
        ex.error == httplib::Error::SSLServerVerification) {
      return Status::Unavailable(where + ": TLS failed (" +
                                 httplib::to_string(ex.error) +
                                 "): check the CA and client certificates");
    }
    json answer = json::parse(ex.body, nullptr, /*allow_exceptions=*/false);
    // cpp-httplib 0.11 fails (Read) on the HTTP trailers
    // ("Grpc-Trailer-Content-Type") that the gateway appends to every error
    // answer, after the whole body arrived: a complete JSON body with a
    // status is the answer.
    const bool trailer_failure = ex.error == httplib::Error::Read &&
                                 ex.http_status != 0 && answer.is_object();
    if (ex.error != httplib::Error::Success && !trailer_failure) {
      return Status::Unavailable(
          where + ": " + httplib::to_string(ex.error) + " (timeout " +
          std::to_string(request_timeout.count()) + " ms)");
    }
    if (answer.is_discarded() || !answer.is_object()) {
      std::string head = ex.body.substr(0, 200);
      if (ex.http_status == 404) {
        return Status::Unimplemented(
            where + ": path not served (HTTP 404: " + head + ")");
      }
      if (ex.http_status >= 500) {
        return Status::Unavailable(
            where + ": HTTP " + std::to_string(ex.http_status) + ": " + head);
      }
      return Status::Corruption(where + ": answer is not a JSON object (HTTP " +
                                std::to_string(ex.http_status) + "): " + head);
    }
    if (ex.http_status != 200 ||
        (answer.contains("error") && answer.contains("code"))) {
      auto err = answer.find("error");
      return GatewayError(err != answer.end() ? *err : json(), answer, where);
    }
    return answer;
  }

  // Lines (JSON objects) of a streaming answer. `on_message` returns
  // false to stop reading.
  struct LineSplitter {
    std::string pending;
    std::function<bool(const json&)> on_message;
    Status status;  // Corruption when a line is not JSON.
    size_t max_line = size_t{16} << 20;

    bool Feed(const char* data, size_t len) {
      // httplib hands the stream over in pieces of a few KiB: `pending`
      // stays within max_line plus one piece.
      pending.append(data, len);
      size_t start = 0;
      auto too_long = [&] {
        // A line (one event batch) longer than any answer may be.
        status = Status::ResourceExhausted("etcd stream: a line over " +
                                           std::to_string(max_line) + " bytes");
        return false;
      };
      for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos;
           start = nl + 1) {
        if (nl - start > max_line) return too_long();
        std::string_view line(pending.data() + start, nl - start);
        if (line.find_first_not_of(" \r\t") == std::string_view::npos) continue;
        json msg = json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (msg.is_discarded() || !msg.is_object()) {
          status =
              Status::Corruption("etcd stream: line is not a JSON object: " +
                                 std::string(line.substr(0, 200)));
          return false;
        }
        if (!on_message(msg)) return false;
      }
      pending.erase(0, start);
      if (pending.size() > max_line) return too_long();
      return true;
    }
  };
};

EtcdClient::EtcdClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EtcdClient::~EtcdClient() = default;

StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(
    const EtcdOptions& options) {
  if (options.endpoints.empty()) {
    return Status::InvalidArgument("etcd: no endpoints");
  }
  if (options.request_timeout.count() < 1) {
    return Status::InvalidArgument("etcd: request_timeout must be >= 1 ms");
  }
  if (options.max_answer_bytes < 1024) {
    return Status::InvalidArgument("etcd: max_answer_bytes must be >= 1024");
  }
  auto impl = std::make_unique<Impl>();
  impl->request_timeout = options.request_timeout;
  impl->keep_alive = options.keep_alive;
  impl->security = options.security;
  impl->max_answer_bytes = options.max_answer_bytes;
  bool tls = false;
  for (const std::string& url : options.endpoints) {
    Endpoint ep;
    RETURN_IF_ERROR(ParseEndpoint(url, &ep));
    tls = tls || ep.tls;
    impl->endpoints.push_back(std::move(ep));
  }
  const EtcdSecurity& sec = options.security;
  if (tls && sec.ca_file.empty()) {
    return Status::InvalidArgument(
        "etcd: https:// endpoints need the CA that signed etcd's certificate "
        "(--etcd_ca_file)");
  }
  if (sec.cert_file.empty() != sec.key_file.empty()) {
    return Status::InvalidArgument(
        "etcd: a client certificate needs its key, and a key its certificate "
        "(--etcd_cert_file, --etcd_key_file)");
  }
  if (!tls && (!sec.ca_file.empty() || !sec.cert_file.empty())) {
    return Status::InvalidArgument(
        "etcd: TLS files given, but no endpoint is https://");
  }
  for (const std::string* f : {&sec.ca_file, &sec.cert_file, &sec.key_file}) {
    if (!f->empty() && ::access(f->c_str(), R_OK) != 0) {
      return Status::InvalidArgument("etcd: cannot read " + *f);
    }
  }
  if (sec.user.empty() != sec.password.empty()) {
    return Status::InvalidArgument(
        "etcd: a user needs a password, and a password a user "
        "(--etcd_user, --etcd_password_file)");
  }
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(impl)));
}

StatusOr<int64_t> EtcdClient::GrantLease(std::chrono::milliseconds ttl,
                                         std::chrono::seconds* granted_ttl) {
  if (ttl.count() < 1) {
    return Status::InvalidArgument("etcd: lease TTL must be >= 1 ms");
  }
  const int64_t seconds = (ttl.count() + 999) / 1000;
  ASSIGN_OR_RETURN(json answer,
                   impl_->Call("/v3/lease/grant", {{"TTL", seconds}}));
  std::string error = GetString(answer, "error");
  if (!error.empty()) return Status::Internal("etcd lease grant: " + error);
  int64_t id = 0, granted = 0;
  RETURN_IF_ERROR(GetInt(answer, "ID", &id));
  RETURN_IF_ERROR(GetInt(answer, "TTL", &granted));
  if (id == 0) return Status::Corruption("etcd lease grant: no lease id");
  if (granted_ttl != nullptr) *granted_ttl = std::chrono::seconds(granted);
  return id;
}

Status EtcdClient::KeepAlive(int64_t lease,
                             std::chrono::milliseconds* ttl_left) {
  ASSIGN_OR_RETURN(json answer, impl_->Call("/v3/lease/keepalive",
                                            {{"ID", std::to_string(lease)}}));
  // A stream of one message: {"result": {...}} or {"error": {...}}.
  if (answer.contains("error")) {
    return GatewayError(*answer.find("error"), answer, "etcd lease keepalive");
  }
  const json* result;
  RETURN_IF_ERROR(GetObject(answer, "result", &result));
  int64_t ttl = 0;
  RETURN_IF_ERROR(GetInt(*result, "TTL", &ttl));
  if (ttl <= 0) {
    return Status::NotFound("etcd lease " + std::to_string(lease) +
                            " expired or revoked");
  }
  if (ttl_left != nullptr) *ttl_left = std::chrono::seconds(ttl);
  return Status::OK();
}

Status EtcdClient::RevokeLease(int64_t lease) {
  return impl_->Call("/v3/lease/revoke", {{"ID", std::to_string(lease)}})
      .status();
}

StatusOr<int64_t> EtcdClient::Put(const std::string& key,
                                  const std::string& value, int64_t lease) {
  json req = {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  if (lease != 0) req["lease"] = std::to_string(lease);
  ASSIGN_OR_RETURN(json answer, impl_->Call("/v3/kv/put", req));
  int64_t revision = 0;
  RETURN_IF_ERROR(HeaderRevision(answer, &revision));
  return revision;
}

StatusOr<std::optional<EtcdKeyValue>> EtcdClient::Get(const std::string& key,
                                                      int64_t* revision) {
  ASSIGN_OR_RETURN(json answer,
                   impl_->Call("/v3/kv/range", {{"key", Base64Encode(key)}}));
  if (revision != nullptr) RETURN_IF_ERROR(HeaderRevision(answer, revision));
  const json* kvs;
  RETURN_IF_ERROR(GetArray(answer, "kvs", &kvs));
  if (kvs->empty()) return std::optional<EtcdKeyValue>();
  EtcdKeyValue kv;
  RETURN_IF_ERROR(ParseKeyValue((*kvs)[0], &kv));
  return std::optional<EtcdKeyValue>(std::move(kv));
}

StatusOr<std::vector<EtcdKeyValue>> EtcdClient::GetPrefix(
    const std::string& prefix, int64_t* revision) {
  return Range(PrefixStart(prefix), PrefixEnd(prefix), revision);
}

StatusOr<std::vector<EtcdKeyValue>> EtcdClient::GetRange(
    const std::string& from, const std::string& end, int64_t* revision) {
  if (from.empty() || end <= from) {
    return Status::InvalidArgument("etcd range [" + from + ", " + end +
                                   "): needs a first key below the end");
  }
  return Range(from, end, revision);
}

StatusOr<std::vector<EtcdKeyValue>> EtcdClient::Range(
    const std::string& key, const std::string& range_end, int64_t* revision) {
  const json req = {{"key", Base64Encode(key)},
                    {"range_end", Base64Encode(range_end)}};
  ASSIGN_OR_RETURN(json answer, impl_->Call("/v3/kv/range", req));
  if (revision != nullptr) RETURN_IF_ERROR(HeaderRevision(answer, revision));
  const json* kvs;
  RETURN_IF_ERROR(GetArray(answer, "kvs", &kvs));
  std::vector<EtcdKeyValue> out(kvs->size());
  for (size_t i = 0; i < kvs->size(); ++i) {
    RETURN_IF_ERROR(ParseKeyValue((*kvs)[i], &out[i]));
  }
  return out;
}

Status EtcdClient::Delete(const std::string& key) {
  return impl_->Call("/v3/kv/deleterange", {{"key", Base64Encode(key)}})
      .status();
}

StatusOr<bool> EtcdClient::CompareAndPut(const std::string& key,
                                         const std::string& value,
                                         int64_t expected_mod_revision,
                                         int64_t lease) {
  if (expected_mod_revision < 0) {
    return Status::InvalidArgument("etcd: expected_mod_revision < 0");
  }
  return Txn({EtcdCompare::ModRevision(key, EtcdCompare::Result::kEqual,
                                       expected_mod_revision)},
             {EtcdOp::Put(key, value, lease)});
}

StatusOr<bool> EtcdClient::Txn(const std::vector<EtcdCompare>& compares,
                               const std::vector<EtcdOp>& on_success,
                               const std::vector<EtcdOp>& on_failure,
                               int64_t* revision) {
  json cmp = json::array();
  for (const EtcdCompare& c : compares) {
    const CompareTargetJson& t = kTargets[size_t(c.target)];
    json j = {{"key", Base64Encode(c.key)},
              {"target", t.target},
              {"result", kResults[size_t(c.result)]}};
    j[t.field] = c.target == EtcdCompare::Target::kValue
                     ? Base64Encode(c.value)
                     : std::to_string(c.number);
    cmp.push_back(std::move(j));
  }
  json success = json::array(), failure = json::array();
  for (const EtcdOp& op : on_success) success.push_back(OpToJson(op));
  for (const EtcdOp& op : on_failure) failure.push_back(OpToJson(op));
  ASSIGN_OR_RETURN(json answer, impl_->Call("/v3/kv/txn",
                                            {{"compare", std::move(cmp)},
                                             {"success", std::move(success)},
                                             {"failure", std::move(failure)}}));
  if (revision != nullptr) RETURN_IF_ERROR(HeaderRevision(answer, revision));
  return GetBool(answer, "succeeded");
}

StatusOr<std::vector<EtcdWatchEvent>> EtcdClient::Watch(
    const std::string& prefix, int64_t start_revision,
    std::chrono::milliseconds timeout, int64_t* next_revision) {
  if (next_revision == nullptr) {
    return Status::InvalidArgument("etcd watch: next_revision is required");
  }
  if (start_revision < 0) {
    return Status::InvalidArgument("etcd watch: start_revision < 0");
  }
  if (timeout.count() < 1) {
    return Status::InvalidArgument("etcd watch: timeout must be >= 1 ms");
  }
  json create = json::object();
  SetPrefixRange(prefix, &create);
  if (start_revision > 0)
    create["start_revision"] = std::to_string(start_revision);
  const std::string body = json{{"create_request", std::move(create)}}.dump();

  const Clock::time_point deadline = Clock::now() + timeout;
  std::vector<EtcdWatchEvent> events;
  int64_t created_revision = 0;  // Header revision when the watch began.
  bool created = false;
  Status stream_status;  // An error or cancellation reported in the stream.

  Impl::LineSplitter lines;
  lines.on_message = [&](const json& msg) -> bool {
    if (msg.contains("error")) {
      stream_status = GatewayError(*msg.find("error"), msg, "etcd watch");
      return false;
    }
    const json* result;
    stream_status = GetObject(msg, "result", &result);
    if (!stream_status.ok()) return false;
    if (GetBool(*result, "created")) {
      created = true;
      stream_status = HeaderRevision(*result, &created_revision);
      if (!stream_status.ok()) return false;
    }
    if (GetBool(*result, "canceled")) {
      int64_t compact = 0;
      (void)GetInt(*result, "compact_revision", &compact);
      std::string reason = GetString(*result, "cancel_reason");
      stream_status =
          compact > 0
              ? Status::FailedPrecondition("etcd watch: revision " +
                                           std::to_string(start_revision) +
                                           " compacted (compact_revision " +
                                           std::to_string(compact) + ")")
              : Status::Unavailable("etcd watch canceled: " +
                                    (reason.empty() ? "no reason" : reason));
      return false;
    }
    const json* list;
    stream_status = GetArray(*result, "events", &list);
    if (!stream_status.ok()) return false;
    for (const json& e : *list) {
      EtcdWatchEvent ev;
      ev.type = GetString(e, "type") == "DELETE" ? EtcdWatchEvent::Type::kDelete
                                                 : EtcdWatchEvent::Type::kPut;
      const json* kv;
      stream_status = GetObject(e, "kv", &kv);
      if (stream_status.ok()) stream_status = ParseKeyValue(*kv, &ev.kv);
      if (!stream_status.ok()) return false;
      events.push_back(std::move(ev));
    }
    // The first batch of events ends the call; so does the deadline.
    return events.empty() && Clock::now() < deadline;
  };
  httplib::ContentReceiverWithProgress receiver =
      [&lines](const char* data, size_t len, uint64_t, uint64_t) {
        return lines.Feed(data, len);
      };
  // The read timeout bounds each wait for more of the stream: the whole
  // watch, since the stream opens at once with its "created" message.
  lines.max_line = impl_->max_answer_bytes;
  ASSIGN_OR_RETURN(std::string token, impl_->CurrentToken());
  Exchange ex = impl_->Post("/v3/watch", body, timeout, &receiver, token);
  const std::string where =
      "etcd watch at " + std::string(ex.endpoint ? ex.endpoint->url : "?");
  if (!lines.status.ok()) return lines.status.WithContext(where);
  if (Impl::TokenRefused(stream_status)) {
    // Expired: the next call brings a fresh one.
    (void)impl_->Authenticate();
  }
  if (!stream_status.ok()) return stream_status.WithContext(where);
  if (ex.error == httplib::Error::Connection ||
      ex.error == httplib::Error::ConnectionTimeout) {
    return Status::Unavailable("etcd watch: no endpoint reachable: " +
                               ex.refused);
  }
  const bool timed_out =
      ex.error == httplib::Error::Read && Clock::now() >= deadline;
  if (ex.error != httplib::Error::Success &&
      ex.error != httplib::Error::Canceled && !timed_out) {
    return Status::Unavailable(where + ": " + httplib::to_string(ex.error));
  }
  if (ex.error == httplib::Error::Success) {
    // The stream ended by itself: an error answered before it began (the
    // receiver reported it above unless it was not JSON), or etcd going
    // away. Not a timeout: say so, lest a caller spin on empty answers.
    return Status::Unavailable(where + ": stream ended (HTTP " +
                               std::to_string(ex.http_status) + ")");
  }
  if (!events.empty()) {
    *next_revision = events.back().kv.mod_revision + 1;
  } else if (start_revision > 0) {
    *next_revision = start_revision;
  } else if (created) {
    *next_revision = created_revision + 1;
  } else {
    return Status::Unavailable(where + ": stream ended before the watch began");
  }
  return events;
}

}  // namespace asyncps
