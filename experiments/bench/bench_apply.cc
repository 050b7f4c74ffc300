// ps_bench_apply: server-side optimizer apply throughput next to a
// single-thread memcpy of the same bytes, measured in the same run.
//
// One JSON object per line:
//   {"bench":"apply","level":"optimizer"|"shard_push","optimizer":..,
//    "elems":..,"grad_bytes":..,"gbps":..,"memcpy_gbps":..,"ratio":..}
// gbps = gradient bytes applied per second / 1e9; ratio = gbps / memcpy_gbps.
// "optimizer" times Optimizer::Apply alone; "shard_push" times a whole raw
// fp32 push through Shard::Handle (validation, NaN/Inf scan, apply,
// bookkeeping), i.e. the server's hot path without the socket.
#include <gflags/gflags.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common/buffer.h"
#include "server/optimizer.h"
#include "server/shard.h"

DEFINE_string(sizes, "262144,4194304",
              "comma-separated gradient sizes in floats");
DEFINE_double(min_seconds, 0.3, "minimum measuring time per configuration");

namespace {

using namespace asyncps;          // NOLINT: tool main
using namespace asyncps::server;  // NOLINT

using Clock = std::chrono::steady_clock;

// Runs fn repeatedly for at least min_seconds; returns seconds per call
// (best of 3 rounds).
template <typename F>
double TimePerCall(F&& fn) {
  fn();  // warm up: page faults, caches
  double best = 1e30;
  for (int round = 0; round < 3; ++round) {
    size_t iters = 0;
    const auto start = Clock::now();
    double elapsed = 0;
    do {
      fn();
      ++iters;
      elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    } while (elapsed < FLAGS_min_seconds / 3);
    best = std::min(best, elapsed / static_cast<double>(iters));
  }
  return best;
}

double MemcpyGbps(size_t bytes) {
  std::vector<uint8_t> src(bytes, 1), dst(bytes, 0);
  double t = TimePerCall([&] {
    std::memcpy(dst.data(), src.data(), bytes);
    asm volatile("" : : "r"(dst.data()) : "memory");
  });
  return static_cast<double>(bytes) / t / 1e9;
}

void Print(const char* level, const char* opt, size_t n, double gbps,
           double base) {
  std::printf(
      "{\"bench\":\"apply\",\"level\":\"%s\",\"optimizer\":\"%s\",\"elems\":%"
      "zu,"
      "\"grad_bytes\":%zu,\"gbps\":%.3f,\"memcpy_gbps\":%.3f,\"ratio\":%.3f}\n",
      level, opt, n, n * sizeof(float), gbps, base, gbps / base);
  std::fflush(stdout);
}

OptimizerOptions Opt(OptimizerKind k, bool nesterov = false) {
  OptimizerOptions o;
  o.kind = k;
  o.nesterov = nesterov;
  o.lr = 1e-6f;  // keep weights bounded over many iterations
  return o;
}

struct Case {
  const char* name;
  OptimizerOptions opt;
};

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  std::vector<size_t> sizes;
  for (const char* p = FLAGS_sizes.c_str(); *p;) {
    char* end = nullptr;
    sizes.push_back(std::strtoull(p, &end, 10));
    p = *end ? end + 1 : end;
  }
  const std::vector<Case> cases = {
      {"sgd", Opt(OptimizerKind::kSgd)},
      {"momentum", Opt(OptimizerKind::kMomentum)},
      {"nesterov", Opt(OptimizerKind::kMomentum, true)},
      {"adam", Opt(OptimizerKind::kAdam)},
      {"adagrad", Opt(OptimizerKind::kAdaGrad)}};
  for (size_t n : sizes) {
    const double base = MemcpyGbps(n * sizeof(float));
    for (const Case& c : cases) {
      auto opt = Optimizer::Create(c.opt);
      if (!opt.ok()) return 1;
      std::vector<float> w(n, 0.5f), g(n, 0.001f),
          st(n * (*opt)->state_per_elem(), 0.0f);
      uint64_t step = 0;
      double t = TimePerCall([&] {
        (*opt)->Apply(w.data(), st.data(), g.data(), n, 1.0f, ++step);
      });
      Print("optimizer", c.name, n,
            static_cast<double>(n * sizeof(float)) / t / 1e9, base);
    }
    for (const Case& c : cases) {
      // One tensor of n floats in one chunk, one shard, one worker (ASP).
      ShardOptions so;
      so.optimizer = c.opt;
      so.worker_timeout = std::chrono::milliseconds(0);
      auto shard = Shard::Create(so, nullptr, Clock::now());
      if (!shard.ok()) return 1;
      RequestHeader reg;
      reg.kind = RequestKind::kRegister;
      reg.rank = 0;
      reg.tensors = {TensorSpec{
          "x", {static_cast<int64_t>(n)}, InitKind::kConstant, 0.5f, 0}};
      reg.layout.chunk_elems = n;
      reg.layout.min_chunk_elems = n;
      std::vector<OutgoingReply> out;
      (*shard)->Handle("b", reg, {}, Clock::now(), &out);
      if (out.empty() || !out[0].header.status.ok()) return 1;
      BufferPtr grad = Buffer::Allocate(n * sizeof(float));
      for (size_t i = 0; i < n; ++i) grad->floats()[i] = 0.001f;
      std::vector<ByteView> data = {ByteView{grad->data(), grad->size(), grad}};
      RequestHeader push;
      push.kind = RequestKind::kPush;
      push.rank = 0;
      push.chunks.resize(1);
      push.chunks[0].frame = 1;
      push.chunks[0].num_elems = n;
      push.chunks[0].byte_size = n * sizeof(float);
      const auto now = Clock::now();
      double t = TimePerCall([&] {
        out.clear();
        ++push.id;
        (*shard)->Handle("b", push, data, now, &out);
      });
      if (out.empty() || !out[0].header.status.ok()) {
        std::fprintf(
            stderr, "push failed: %s\n",
            out.empty() ? "no reply" : out[0].header.status.ToString().c_str());
        return 1;
      }
      Print("shard_push", c.name, n,
            static_cast<double>(n * sizeof(float)) / t / 1e9, base);
    }
  }
  return 0;
}
