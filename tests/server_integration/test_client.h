// A minimal synchronous parameter-server client for the server's
// multi-process tests: one DEALER per shard, one request in flight, every
// wait bounded. Built on common/transport.h + common/wire.h only (the real
// worker Client lives in worker/ and is not used here on purpose: these
// tests pin the server's wire behaviour).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/layout.h"
#include "common/status.h"
#include "common/transport.h"
#include "common/wire.h"

namespace asyncps::testing {

class TestClient {
 public:
  // `rank` -1 for admin requests only.
  static StatusOr<std::unique_ptr<TestClient>> Connect(
      const std::vector<std::string>& endpoints, int rank,
      uint64_t incarnation);

  // Registers on every shard.
  Status Register(const std::vector<TensorSpec>& tensors,
                  const LayoutOptions& layout, const Layout** out_layout);
  // Pulls every chunk of every shard at `clock`; weights[tensor] filled.
  // `replies` (optional) receives each shard's reply header.
  Status Pull(int64_t clock, std::vector<std::vector<float>>* weights,
              std::vector<ReplyHeader>* replies = nullptr);
  // Pushes full-tensor raw fp32 gradients (grads[tensor]), split by shard.
  Status Push(int64_t clock, const std::vector<std::vector<float>>& grads);
  Status Clock(int64_t clock);
  // One admin/heartbeat request to shard `s`.
  Status Simple(size_t s, RequestKind kind, ReplyHeader* reply);

  const Layout& layout() const { return *layout_; }

 private:
  Status Call(size_t s, RequestHeader& req, std::vector<Frame>& data,
              ReplyHeader* reply, Message* msg);

  std::shared_ptr<Context> ctx_;
  std::vector<std::unique_ptr<ClientSocket>> socks_;
  int rank_ = -1;
  uint64_t incarnation_ = 0;
  uint64_t next_id_ = 1;
  std::unique_ptr<Layout> layout_;
};

}  // namespace asyncps::testing
