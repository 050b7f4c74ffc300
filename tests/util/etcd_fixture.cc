#include "tests/util/etcd_fixture.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <thread>

namespace asyncps::testing {
namespace {

// A loopback port free now (the kernel's pick for port 0). Another process
// may take it before etcd binds it: Start retries with new ports then.
int FreeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  int port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// Runs `python3 -m pslaunch.etcd_tls ARGS` (launch/pslaunch/etcd_tls.py).
Status EtcdTls(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> argv = {"/usr/bin/python3", "-m",
                                   "pslaunch.etcd_tls"};
  argv.insert(argv.end(), args.begin(), args.end());
  // The module runs from launch/ (its package's parent).
  std::vector<std::string> in_launch = {
      "/usr/bin/env", "-C", std::string(ASYNCPS_SOURCE_DIR) + "/launch"};
  in_launch.insert(in_launch.end(), argv.begin(), argv.end());
  ASSIGN_OR_RETURN(std::unique_ptr<Process> p, Process::Start(in_launch, log));
  ASSIGN_OR_RETURN(int code, p->Wait(std::chrono::seconds(60)));
  if (code != 0)
    return Status::Unavailable("pslaunch.etcd_tls failed:\n" + p->Log());
  return Status::OK();
}

bool Healthy(int port, const std::string& tls_dir) {
  try {
    if (!tls_dir.empty()) {
      httplib::SSLClient cli("127.0.0.1", port, tls_dir + "/root.pem",
                             tls_dir + "/root.key");
      cli.set_ca_cert_path((tls_dir + "/ca.pem").c_str());
      cli.enable_server_certificate_verification(true);
      cli.set_connection_timeout(std::chrono::milliseconds(200));
      cli.set_read_timeout(std::chrono::milliseconds(500));
      auto res = cli.Get("/health");
      return res && res->status == 200 &&
             res->body.find("\"health\":\"true\"") != std::string::npos;
    }
    httplib::Client cli("127.0.0.1", port);
    cli.set_connection_timeout(std::chrono::milliseconds(200));
    cli.set_read_timeout(std::chrono::milliseconds(500));
    auto res = cli.Get("/health");
    return res && res->status == 200 &&
           res->body.find("\"health\":\"true\"") != std::string::npos;
  } catch (...) {
    return false;
  }
}

}  // namespace

std::string EtcdServer::Binary() {
  const char* env = std::getenv("ASYNCPS_TEST_ETCD");
  return env != nullptr && *env ? env : kBinary;
}

bool EtcdServer::Available() { return access(Binary().c_str(), X_OK) == 0; }

StatusOr<std::unique_ptr<EtcdServer>> EtcdServer::Start(
    const std::string& data_dir, const std::string& log_dir) {
  if (!Available()) {
    return Status::Unavailable(Binary() +
                               " not installed (Debian: etcd-server)");
  }
  std::unique_ptr<EtcdServer> server(new EtcdServer());
  server->data_dir_ = data_dir;
  server->log_dir_ = log_dir;
  std::error_code ec;
  std::filesystem::create_directories(log_dir, ec);
  Status st;
  for (int attempt = 0; attempt < 3; ++attempt) {
    server->client_port_ = FreeLoopbackPort();
    server->peer_port_ = FreeLoopbackPort();
    if (server->client_port_ == 0 || server->peer_port_ == 0 ||
        server->client_port_ == server->peer_port_) {
      st = Status::Unavailable("no free loopback port");
      continue;
    }
    st = server->Launch();
    if (st.ok()) return server;
    // Lost a race for a port: another pair. Anything else is final.
    if (server->Log().find("address already in use") == std::string::npos) {
      break;
    }
  }
  return st;
}

StatusOr<std::unique_ptr<EtcdServer>> EtcdServer::StartSecure(
    const std::string& data_dir, const std::string& log_dir,
    const std::string& tls_dir, const std::string& prefix) {
  for (const char* tool : {"/usr/bin/openssl", "/usr/bin/etcdctl"}) {
    if (access(tool, X_OK) != 0) {
      return Status::Unavailable(
          std::string(tool) + " not installed (Debian: openssl, etcd-client)");
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(log_dir, ec);
  RETURN_IF_ERROR(EtcdTls({"certs", tls_dir}, log_dir + "/etcd_tls_certs.log"));
  // Start() with the certificates: Launch() reads tls_dir_.
  if (!Available()) {
    return Status::Unavailable(Binary() +
                               " not installed (Debian: etcd-server)");
  }
  std::unique_ptr<EtcdServer> server(new EtcdServer());
  server->data_dir_ = data_dir;
  server->log_dir_ = log_dir;
  server->tls_dir_ = tls_dir;
  server->client_port_ = FreeLoopbackPort();
  server->peer_port_ = FreeLoopbackPort();
  RETURN_IF_ERROR(server->Launch());
  RETURN_IF_ERROR(EtcdTls({"auth", tls_dir, server->endpoint(), prefix},
                          log_dir + "/etcd_tls_auth.log"));
  return server;
}

EtcdSecurity EtcdServer::Security(const std::string& user,
                                  bool with_password) const {
  EtcdSecurity s;
  s.ca_file = tls_dir_ + "/ca.pem";
  s.cert_file = tls_dir_ + "/" + user + ".pem";
  s.key_file = tls_dir_ + "/" + user + ".key";
  s.user = user;
  if (with_password) {
    std::string password = ReadFile(tls_dir_ + "/" + user + ".password");
    while (!password.empty() &&
           (password.back() == '\n' || password.back() == '\r'))
      password.pop_back();
    s.password = password;
  } else {
    s.user.clear();
  }
  return s;
}

EtcdServer::~EtcdServer() = default;  // Process's destructor kills etcd.

Status EtcdServer::Launch() {
  const std::string host = "127.0.0.1";
  const std::string client = (tls_dir_.empty() ? "http://" : "https://") +
                             host + ":" + std::to_string(client_port_);
  const std::string peer = "http://" + host + ":" + std::to_string(peer_port_);
  endpoint_ = client;
  log_path_ = log_dir_ + "/etcd" +
              (starts_ == 0 ? std::string() : "." + std::to_string(starts_)) +
              ".log";
  ++starts_;
  std::vector<std::string> argv = {
      Binary(),
      "--name=test",
      "--data-dir=" + data_dir_,
      "--listen-client-urls=" + client,
      "--advertise-client-urls=" + client,
      "--listen-peer-urls=" + peer,
      "--initial-advertise-peer-urls=" + peer,
      "--initial-cluster=test=" + peer,
      "--heartbeat-interval=" + std::to_string(kHeartbeatMs),
      "--election-timeout=" + std::to_string(kElectionMs),
  };
  if (!tls_dir_.empty()) {
    // Tokens live 2 s (default 300 s), so tests see clients sign in again.
    argv.insert(
        argv.end(),
        {"--auth-token-ttl=2", "--cert-file=" + tls_dir_ + "/server.pem",
         "--key-file=" + tls_dir_ + "/server.key",
         "--trusted-ca-file=" + tls_dir_ + "/ca.pem", "--client-cert-auth"});
  }
  ASSIGN_OR_RETURN(process_, Process::Start(argv, log_path_));
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (std::chrono::steady_clock::now() < deadline) {
    if (!process_->Running()) {
      process_.reset();
      return Status::Unavailable("etcd exited during start:\n" + Log());
    }
    if (Healthy(client_port_, tls_dir_)) return Status::OK();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  process_.reset();  // SIGKILL
  return Status::TimedOut("etcd not healthy after 15 s:\n" + Log());
}

std::string EtcdServer::Log() const { return ReadFile(log_path_); }

StatusOr<std::unique_ptr<EtcdClient>> EtcdServer::NewClient() const {
  EtcdOptions o;
  o.endpoints = {endpoint_};
  return EtcdClient::Create(o);
}

void EtcdServer::Stop() {
  if (!process_) return;
  if (process_->Running()) {
    ::kill(process_->pid(), SIGTERM);
    if (!process_->Wait(std::chrono::seconds(10)).ok()) process_->Kill(SIGKILL);
  }
  process_.reset();
}

Status EtcdServer::Restart() {
  Stop();
  return Launch();
}

}  // namespace asyncps::testing
