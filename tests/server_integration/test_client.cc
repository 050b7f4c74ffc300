#include "tests/server_integration/test_client.h"

#include <cstring>

namespace asyncps::testing {

constexpr std::chrono::milliseconds kDeadline(15000);

StatusOr<std::unique_ptr<TestClient>> TestClient::Connect(
    const std::vector<std::string>& endpoints, int rank, uint64_t incarnation) {
  std::unique_ptr<TestClient> c(new TestClient());
  c->ctx_ = Context::Create(1);
  c->rank_ = rank;
  c->incarnation_ = incarnation;
  TransportOptions to;
  to.context = c->ctx_;
  for (const std::string& ep : endpoints) {
    ASSIGN_OR_RETURN(std::unique_ptr<ClientSocket> s,
                     ClientSocket::Connect(ep, to));
    c->socks_.push_back(std::move(s));
  }
  return c;
}

Status TestClient::Call(size_t s, RequestHeader& req, std::vector<Frame>& data,
                        ReplyHeader* reply, Message* msg) {
  req.id = next_id_++;
  req.rank = rank_;
  req.incarnation = incarnation_;
  std::vector<Frame> frames;
  frames.push_back(Frame::Owned(EncodeRequest(req)));
  for (Frame& f : data) frames.push_back(std::move(f));
  RETURN_IF_ERROR(socks_[s]->Send(frames));
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0)
      return Status::TimedOut("no reply to request " + std::to_string(req.id));
    msg->Clear();
    ASSIGN_OR_RETURN(bool got, socks_[s]->Receive(msg, left));
    if (!got) continue;
    RETURN_IF_ERROR(msg->error);
    if (msg->frames.empty()) return Status::Corruption("empty reply");
    RETURN_IF_ERROR(DecodeReply(msg->frames[0].data, msg->frames[0].size,
                                DecodeLimits(), reply));
    if (reply->id != req.id) continue;  // a late reply to an earlier request
    return reply->status;
  }
}

Status TestClient::Register(const std::vector<TensorSpec>& tensors,
                            const LayoutOptions& layout,
                            const Layout** out_layout) {
  ASSIGN_OR_RETURN(Layout l, Layout::Create(tensors, layout));
  layout_ = std::make_unique<Layout>(std::move(l));
  for (size_t s = 0; s < socks_.size(); ++s) {
    RequestHeader req;
    req.kind = RequestKind::kRegister;
    req.tensors = tensors;
    req.layout = layout;
    std::vector<Frame> none;
    ReplyHeader reply;
    Message msg;
    RETURN_IF_ERROR(Call(s, req, none, &reply, &msg));
  }
  if (out_layout) *out_layout = layout_.get();
  return Status::OK();
}

Status TestClient::Pull(int64_t clock, std::vector<std::vector<float>>* weights,
                        std::vector<ReplyHeader>* replies) {
  const Layout& l = *layout_;
  weights->resize(l.tensors().size());
  for (size_t t = 0; t < l.tensors().size(); ++t) {
    (*weights)[t].assign(l.tensors()[t].num_elements(), 0.0f);
  }
  if (replies) replies->clear();
  for (size_t s = 0; s < socks_.size(); ++s) {
    RequestHeader req;
    req.kind = RequestKind::kPull;
    req.clock = clock;
    std::vector<Frame> none;
    ReplyHeader reply;
    Message msg;
    RETURN_IF_ERROR(Call(s, req, none, &reply, &msg));
    if (reply.chunks.size() != l.shard_chunks(static_cast<int>(s)).size()) {
      return Status::Internal("pull reply has the wrong number of chunks");
    }
    for (const ChunkRef& ref : reply.chunks) {
      const ChunkSpec& c = l.chunks()[ref.chunk];
      if (ref.codec != 0 || ref.frame >= msg.frames.size() ||
          msg.frames[ref.frame].size != c.num_elems * 4) {
        return Status::Internal("bad chunk in pull reply");
      }
      std::memcpy((*weights)[c.tensor].data() + c.offset,
                  msg.frames[ref.frame].data, c.num_elems * 4);
    }
    if (replies) replies->push_back(reply);
  }
  return Status::OK();
}

Status TestClient::Push(int64_t clock,
                        const std::vector<std::vector<float>>& grads) {
  const Layout& l = *layout_;
  for (size_t s = 0; s < socks_.size(); ++s) {
    RequestHeader req;
    req.kind = RequestKind::kPush;
    req.clock = clock;
    std::vector<Frame> data;
    for (uint32_t id : l.shard_chunks(static_cast<int>(s))) {
      const ChunkSpec& c = l.chunks()[id];
      ChunkRef ref;
      ref.chunk = id;
      ref.frame = static_cast<uint32_t>(data.size() + 1);
      ref.num_elems = c.num_elems;
      ref.byte_size = c.num_elems * 4;
      req.chunks.push_back(ref);
      data.push_back(
          Frame::Copy(grads[c.tensor].data() + c.offset, c.num_elems * 4));
    }
    ReplyHeader reply;
    Message msg;
    RETURN_IF_ERROR(Call(s, req, data, &reply, &msg));
  }
  return Status::OK();
}

Status TestClient::Clock(int64_t clock) {
  for (size_t s = 0; s < socks_.size(); ++s) {
    RequestHeader req;
    req.kind = RequestKind::kClock;
    req.clock = clock;
    std::vector<Frame> none;
    ReplyHeader reply;
    Message msg;
    RETURN_IF_ERROR(Call(s, req, none, &reply, &msg));
  }
  return Status::OK();
}

Status TestClient::Simple(size_t s, RequestKind kind, ReplyHeader* reply) {
  RequestHeader req;
  req.kind = kind;
  std::vector<Frame> none;
  Message msg;
  return Call(s, req, none, reply, &msg);
}

}  // namespace asyncps::testing
