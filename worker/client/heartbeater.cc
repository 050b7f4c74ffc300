// Heartbeater (worker/client/heartbeater.h): the heartbeat thread.
#include "worker/client/heartbeater.h"

#include "common/wire.h"

namespace asyncps::worker::client {

using std::chrono::milliseconds;

Status Heartbeater::Start() {
  // Every replica of a group: a backup that takes over knows this worker
  // is alive.
  for (const auto& group : options_.servers) {
    for (const auto& e : ParseReplicaGroup(group)) {
      ASSIGN_OR_RETURN(auto s, ClientSocket::Connect(e, options_.transport));
      sockets_.push_back(std::move(s));
    }
  }
  thread_ = std::thread([this] { Run(); });
  return Status::OK();
}

Status Heartbeater::Add(const std::string& group) {
  for (const auto& e : ParseReplicaGroup(group)) {
    ASSIGN_OR_RETURN(auto s, ClientSocket::Connect(e, options_.transport));
    std::lock_guard<std::mutex> l(mu_);
    added_.push_back(std::move(s));
  }
  return Status::OK();
}

void Heartbeater::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Heartbeater::Run() {
  uint64_t id = uint64_t{1} << 63;
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    for (auto& s : added_) sockets_.push_back(std::move(s));
    added_.clear();
    l.unlock();
    RequestHeader h;
    h.kind = RequestKind::kHeartbeat;
    h.rank = options_.rank;
    h.incarnation = incarnation_;
    h.id = id++;
    auto bytes = EncodeRequest(h);
    Message drain;
    for (auto& s : sockets_) {
      std::vector<Frame> f{Frame::Copy(bytes.data(), bytes.size())};
      (void)s->Send(f);  // best effort: a full queue means the shard is away
      (void)s->TakeConnects();  // not needed here: keep the queue empty
      while (true) {            // discard replies
        auto got = s->Receive(&drain, milliseconds(0));
        if (!got.ok() || !*got) break;
      }
    }
    l.lock();
    cv_.wait_for(l, options_.heartbeat_interval, [this] { return stop_; });
  }
}

}  // namespace asyncps::worker::client
