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
    MutexLock l(&mu_);
    added_.push_back(std::move(s));
  }
  return Status::OK();
}

void Heartbeater::Stop() {
  {
    MutexLock l(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

void Heartbeater::Run() {
  uint64_t id = uint64_t{1} << 63;
  for (;;) {
    {
      MutexLock l(&mu_);
      if (stop_) return;
      for (auto& s : added_) sockets_.push_back(std::move(s));
      added_.clear();
    }
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
    // Until the next heartbeat is due, or Stop().
    const auto until =
        std::chrono::steady_clock::now() + options_.heartbeat_interval;
    MutexLock l(&mu_);
    while (!stop_ && cv_.WaitUntil(&mu_, until)) {
    }
  }
}

}  // namespace asyncps::worker::client
