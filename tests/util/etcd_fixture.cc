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

bool Healthy(int port) {
  try {
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

EtcdServer::~EtcdServer() = default;  // Process's destructor kills etcd.

Status EtcdServer::Launch() {
  const std::string host = "127.0.0.1";
  const std::string client =
      "http://" + host + ":" + std::to_string(client_port_);
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
  ASSIGN_OR_RETURN(process_, Process::Start(argv, log_path_));
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (std::chrono::steady_clock::now() < deadline) {
    if (!process_->Running()) {
      process_.reset();
      return Status::Unavailable("etcd exited during start:\n" + Log());
    }
    if (Healthy(client_port_)) return Status::OK();
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
