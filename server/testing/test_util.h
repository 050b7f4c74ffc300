// Helpers for the server's unit tests: building requests and driving a
// Shard in-process. Test-only.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "common/buffer.h"
#include "common/wire.h"
#include "server/loop/shard_factory.h"
#include "server/shard/shard.h"

namespace asyncps::server::testing {

// A 74-float model: "w" 64 floats cut into 16-float chunks, "b" 10 floats.
inline std::vector<TensorSpec> SmallModel() {
  TensorSpec w{"w", {8, 8}, InitKind::kUniform, 0.5f, 7};
  TensorSpec b{"b", {10}, InitKind::kConstant, 0.25f, 1};
  return {w, b};
}

inline LayoutOptions SmallLayout(int num_shards) {
  LayoutOptions o;
  o.chunk_elems = 16;
  o.min_chunk_elems = 16;
  o.num_shards = num_shards;
  return o;
}

// Shard 0 of 2, `workers` workers, `c`, SGD with lr 0.5.
inline ShardOptions TestOptions(Consistency c, int workers = 2) {
  ShardOptions o;
  o.shard_id = 0;
  o.num_shards = 2;
  o.num_workers = workers;
  o.consistency = c;
  o.optimizer.lr = 0.5f;
  return o;
}

inline std::vector<float> Fill(size_t n, float v) {
  return std::vector<float>(n, v);
}

// `k` as a keys frame of sparse rows (little-endian uint64).
inline ByteView Keys(const std::vector<uint64_t>& k) {
  BufferPtr b = Buffer::Allocate(k.size() * 8);
  if (!k.empty()) std::memcpy(b->data(), k.data(), k.size() * 8);
  return ByteView{b->data(), b->size(), b};
}

inline ByteView Floats(const std::vector<float>& v) {
  BufferPtr b = Buffer::Allocate(v.size() * sizeof(float));
  if (!v.empty()) std::memcpy(b->data(), v.data(), v.size() * sizeof(float));
  return ByteView{b->data(), b->size(), b};
}

class ShardHarness {
 public:
  explicit ShardHarness(ShardOptions o, Store* store = nullptr)
      : options(o), t0(std::chrono::steady_clock::now()), now(t0) {
    auto s = CreateShard(o, store, t0);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (s.ok()) shard = std::move(s).value();
  }

  // Sends a request; returns every reply produced.
  std::vector<OutgoingReply> Send(RequestHeader req,
                                  std::vector<ByteView> data = {},
                                  const std::string& peer = "p") {
    req.id = req.id ? req.id : ++next_id;
    std::vector<OutgoingReply> out;
    shard->Handle(peer, req, data, now, &out);
    return out;
  }
  // Sends and expects exactly one reply (the request's own).
  ReplyHeader Call(RequestHeader req, std::vector<ByteView> data = {}) {
    auto out = Send(std::move(req), std::move(data));
    EXPECT_EQ(out.size(), 1u);
    return out.empty() ? ReplyHeader{} : out[0].header;
  }

  static RequestHeader Register(int rank, std::vector<TensorSpec> t,
                                LayoutOptions l) {
    RequestHeader r;
    r.kind = RequestKind::kRegister;
    r.rank = rank;
    r.tensors = std::move(t);
    r.layout = l;
    return r;
  }
  static RequestHeader Pull(int rank, int64_t clock,
                            std::vector<uint32_t> chunks = {}) {
    RequestHeader r;
    r.kind = RequestKind::kPull;
    r.rank = rank;
    r.clock = clock;
    r.pull_chunks = std::move(chunks);
    return r;
  }
  static RequestHeader Clock(int rank, int64_t clock) {
    RequestHeader r;
    r.kind = RequestKind::kClock;
    r.rank = rank;
    r.clock = clock;
    r.incarnation = 42;  // the process that Push() sends for
    return r;
  }
  // A raw fp32 push of `grads[i]` to chunk `chunks[i]`, frame i+1.
  static RequestHeader Push(int rank, int64_t clock,
                            const std::vector<uint32_t>& chunks,
                            const std::vector<ByteView>& frames) {
    RequestHeader r;
    r.kind = RequestKind::kPush;
    r.rank = rank;
    r.clock = clock;
    r.incarnation = 42;
    for (size_t i = 0; i < chunks.size(); ++i) {
      ChunkRef c;
      c.chunk = chunks[i];
      c.frame = static_cast<uint32_t>(i + 1);
      c.num_elems = frames[i].size / sizeof(float);
      c.byte_size = frames[i].size;
      r.chunks.push_back(c);
    }
    return r;
  }

  // Every weight of the shard, chunk by chunk (bitwise comparisons).
  std::vector<std::vector<float>> AllWeights() const {
    std::vector<std::vector<float>> all;
    for (uint32_t id : shard->layout()->shard_chunks(options.shard_id)) {
      all.push_back(*shard->weights(id));
      all.push_back(*shard->optimizer_state(id));
    }
    return all;
  }
  uint32_t FirstChunk() const {
    return shard->layout()->shard_chunks(options.shard_id)[0];
  }
  uint64_t ChunkElems(uint32_t id) const {
    return shard->layout()->chunks()[id].num_elems;
  }

  ShardOptions options;
  std::unique_ptr<Shard> shard;
  std::chrono::steady_clock::time_point t0, now;
  uint64_t next_id = 0;
};

// A kMigrate request of a tool (rank -1) toward layout `epoch`, with a
// freeze deadline of 10 s (elastic shards' tests).
inline RequestHeader MigrateRequest(MigrateOp op, uint64_t epoch) {
  RequestHeader r;
  r.kind = RequestKind::kMigrate;
  r.rank = -1;
  r.migrate_op = op;
  r.migrate_epoch = epoch;
  r.migrate_deadline_ms = 10000;
  return r;
}

// A page of a scan of the entries of sparse table `table` (kAssign phase 6)
// by rank 0: at most `max` entries with keys >= `from`, routed by layout
// `epoch`.
inline RequestHeader ScanRequest(uint32_t table, uint64_t from, uint32_t max,
                                 uint64_t epoch = 0) {
  RequestHeader r;
  r.kind = RequestKind::kAssign;
  r.rank = 0;
  r.assign_upload = 1;
  r.assign_phase = AssignOp::kScan;
  r.assign_cursor = from;
  r.assign_scan_rows = max;
  r.layout_epoch = epoch;
  RowsRef ref;
  ref.table = table;
  r.rows = {ref};
  return r;
}

// Shard `id` of `num_shards` in the elastic shards' tests: BSP, 2 workers,
// Adam with lr 0.1.
inline ShardOptions ElasticTestOptions(int id, int num_shards) {
  ShardOptions o = TestOptions(Consistency::kBsp, 2);
  o.shard_id = id;
  o.num_shards = num_shards;
  o.optimizer.kind = OptimizerKind::kAdam;
  o.optimizer.lr = 0.1f;
  return o;
}

// The gradient a worker pushes to chunk `id` (n elements) at `clock` in the
// elastic shards' tests: distinct per rank, clock, chunk and element.
inline ByteView ChunkGrad(int rank, int64_t clock, uint32_t id, uint64_t n) {
  std::vector<float> g(n);
  for (uint64_t i = 0; i < n; ++i)
    g[i] = 0.01f * static_cast<float>((rank + 1) * (clock + 2)) + 0.001f * i +
           0.1f * id;
  return Floats(g);
}

}  // namespace asyncps::server::testing
