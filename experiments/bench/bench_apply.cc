// ps_bench_apply: server-side optimizer apply throughput next to a
// single-thread memcpy of the same bytes, measured in the same run.
//
// One JSON object per line:
//   {"bench":"apply","level":"optimizer"|"shard_push","optimizer":..,
//    "elems":..,"grad_bytes":..,"apply_threads":..,"gbps":..,
//    "memcpy_gbps":..,"ratio":..,"gbps_spread":{..},"ratio_spread":{..}}
// gbps = gradient bytes applied per second / 1e9 (median of --repeats, each
// repeat timed right after its memcpy baseline); ratio = the median of the
// per-repeat gbps / memcpy_gbps. "optimizer" times Optimizer::Apply alone;
// "optimizer" rows also time the update's loads and stores without its
// arithmetic (w -= g, s += g per state slot) right before it:
// streams_ratio = that loop / memcpy (the update's ceiling on one thread),
// ratio_vs_streams = the update / that loop (1.0: memory-bound; below it,
// its arithmetic costs: sqrt and divide per weight in Adam and AdaGrad).
// "shard_push" times a whole raw fp32 push through Shard::Handle
// (validation, NaN/Inf scan, apply, bookkeeping), i.e. the server's hot path
// without the socket, on --apply_threads threads (1 unless given).
// "shard_push_threads" pushes --threads_mb MiB (the default layout: 4 MiB
// chunks) with --threads_optimizer through shards with 1 and with N apply
// threads, N in --apply_threads_list: baseline = 1 thread, ratio = speedup.
//
// Quiet run: ps_bench_apply --repeats=9 --min_seconds=0.5
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/buffer.h"
#include "experiments/bench/bench_util.h"
#include "server/optimizer/optimizer.h"
#include "server/shard/shard.h"

DEFINE_string(sizes, "262144,4194304",
              "comma-separated gradient sizes in floats");
DEFINE_double(min_seconds, 0.1, "measuring time per configuration and repeat");
DEFINE_int32(repeats, 5, "repeats of every measurement (median reported)");
DEFINE_int32(apply_threads, 1, "apply threads of the shard_push rows");
DEFINE_int32(threads_mb, 64, "push size of the shard_push_threads rows, MiB");
DEFINE_string(threads_optimizer, "adam", "optimizer of those rows");
DEFINE_string(apply_threads_list, "2",
              "thread counts compared with 1 in those rows ('' skips them)");

namespace {

using namespace asyncps;          // NOLINT: tool main
using namespace asyncps::server;  // NOLINT
using asyncps::bench::Json;

using Clock = std::chrono::steady_clock;

// Runs fn repeatedly for at least min_seconds; returns seconds per call.
template <typename F>
double TimePerCall(F&& fn) {
  size_t iters = 0;
  const auto start = Clock::now();
  double elapsed = 0;
  do {
    fn();
    ++iters;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < FLAGS_min_seconds);
  return elapsed / static_cast<double>(iters);
}

struct Memcpy {
  explicit Memcpy(size_t bytes) : src(bytes, 1), dst(bytes, 0) {
    Once();  // page faults
  }
  void Once() {
    std::memcpy(dst.data(), src.data(), src.size());
    asm volatile("" : : "r"(dst.data()) : "memory");
  }
  double Gbps() {
    return static_cast<double>(src.size()) / TimePerCall([&] { Once(); }) / 1e9;
  }
  std::vector<uint8_t> src, dst;
};

// The loads and stores of an update with 0, 1 or 2 state floats per weight
// (w -= g; s += g per slot) and none of its arithmetic: its memory traffic
// alone, the ceiling of that update on one thread. Cloned for AVX2 as the
// optimizer loops are (server/optimizer/optimizer.cc).
#if defined(__x86_64__) && defined(__GNUC__)
#define BENCH_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define BENCH_CLONES
#endif
BENCH_CLONES void Streams0(float* __restrict__ w, const float* __restrict__ g,
                           size_t n) {
  for (size_t i = 0; i < n; ++i) w[i] -= g[i];
}
BENCH_CLONES void Streams1(float* __restrict__ w, float* __restrict__ a,
                           const float* __restrict__ g, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    w[i] -= g[i];
    a[i] += g[i];
  }
}
BENCH_CLONES void Streams2(float* __restrict__ w, float* __restrict__ a,
                           float* __restrict__ b, const float* __restrict__ g,
                           size_t n) {
  for (size_t i = 0; i < n; ++i) {
    w[i] -= g[i];
    a[i] += g[i];
    b[i] += g[i];
  }
}

void Streams(float* w, float* state, const float* g, size_t n, size_t slots) {
  if (slots == 0) Streams0(w, g, n);
  if (slots == 1) Streams1(w, state, g, n);
  if (slots == 2) Streams2(w, state, state + n, g, n);
  asm volatile("" : : "r"(w), "r"(state) : "memory");
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

// One shard holding a model of `n` floats cut into chunks of `chunk_elems`,
// and a raw fp32 push of all of it.
class ShardPush {
 public:
  static std::unique_ptr<ShardPush> Create(const OptimizerOptions& opt,
                                           size_t n, size_t chunk_elems,
                                           int threads) {
    auto p = std::make_unique<ShardPush>();
    ShardOptions so;
    so.optimizer = opt;
    so.worker_timeout = std::chrono::milliseconds(0);
    so.apply_threads = threads;
    so.memory_budget_bytes = uint64_t{64} << 30;
    auto shard = Shard::Create(so, nullptr, Clock::now());
    if (!shard.ok()) {
      std::fprintf(stderr, "shard: %s\n", shard.status().ToString().c_str());
      return nullptr;
    }
    p->shard_ = std::move(shard).value();
    RequestHeader reg;
    reg.kind = RequestKind::kRegister;
    reg.rank = 0;
    reg.tensors = {TensorSpec{
        "x", {static_cast<int64_t>(n)}, InitKind::kConstant, 0.5f, 0}};
    reg.layout.chunk_elems = chunk_elems;
    reg.layout.min_chunk_elems = std::min<size_t>(chunk_elems, 1024);
    std::vector<OutgoingReply> out;
    p->shard_->Handle("b", reg, {}, Clock::now(), &out);
    if (out.empty() || !out[0].header.status.ok()) {
      std::fprintf(
          stderr, "register: %s\n",
          out.empty() ? "no reply" : out[0].header.status.ToString().c_str());
      return nullptr;
    }
    const Layout& layout = *p->shard_->layout();
    p->push_.kind = RequestKind::kPush;
    p->push_.rank = 0;
    for (const ChunkSpec& c : layout.chunks()) {
      BufferPtr grad = Buffer::Allocate(c.num_elems * sizeof(float));
      for (size_t i = 0; i < c.num_elems; ++i) grad->floats()[i] = 0.001f;
      p->data_.push_back(ByteView{grad->data(), grad->size(), grad});
      ChunkRef ref;
      ref.chunk = c.id;
      ref.frame = static_cast<uint32_t>(p->data_.size());
      ref.num_elems = c.num_elems;
      ref.byte_size = c.num_elems * sizeof(float);
      p->push_.chunks.push_back(ref);
    }
    return p;
  }
  // One push; false (with a message) if the shard refused it.
  bool Once() {
    out_.clear();
    ++push_.id;
    push_.done_below = push_.id;
    shard_->Handle("b", push_, data_, now_, &out_);
    if (out_.empty() || !out_[0].header.status.ok()) {
      std::fprintf(
          stderr, "push failed: %s\n",
          out_.empty() ? "no reply" : out_[0].header.status.ToString().c_str());
      return false;
    }
    return true;
  }

 private:
  std::unique_ptr<Shard> shard_;
  RequestHeader push_;
  std::vector<ByteView> data_;
  std::vector<OutgoingReply> out_;
  const Clock::time_point now_ = Clock::now();
};

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> v;
  size_t b = 0;
  while (b < s.size()) {
    size_t e = s.find(',', b);
    if (e == std::string::npos) e = s.size();
    if (e > b) v.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return v;
}

Json Row(const char* level, const std::string& opt, size_t n, int threads,
         const std::vector<double>& gbps, const std::vector<double>& base,
         const char* baseline) {
  const auto g = bench::SpreadOf(gbps);
  const auto b = bench::SpreadOf(base);
  const auto r = bench::SpreadOf(bench::Ratios(gbps, base));
  Json j;
  j["bench"] = "apply";
  j["level"] = level;
  j["optimizer"] = opt;
  j["elems"] = n;
  j["grad_bytes"] = n * sizeof(float);
  j["apply_threads"] = threads;
  j["gbps"] = bench::Round(g.median, 3);
  j["baseline"] = baseline;
  j["baseline_gbps"] = bench::Round(b.median, 3);
  j["ratio"] = bench::Round(r.median, 3);
  j["gbps_spread"] = bench::ToJson(g);
  j["ratio_spread"] = bench::ToJson(r);
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;
  google::InitGoogleLogging(argv[0]);
  const int reps = std::max(1, FLAGS_repeats);
  const std::vector<Case> cases = {
      {"sgd", Opt(OptimizerKind::kSgd)},
      {"momentum", Opt(OptimizerKind::kMomentum)},
      {"nesterov", Opt(OptimizerKind::kMomentum, true)},
      {"adam", Opt(OptimizerKind::kAdam)},
      {"adagrad", Opt(OptimizerKind::kAdaGrad)}};
  for (const std::string& size : Split(FLAGS_sizes)) {
    const size_t n = std::stoull(size);
    const size_t bytes = n * sizeof(float);
    Memcpy mc(bytes);
    for (const Case& c : cases) {
      auto opt = Optimizer::Create(c.opt);
      if (!opt.ok()) return 1;
      std::vector<float> w(n, 0.5f), g(n, 0.001f),
          st(n * (*opt)->state_per_elem(), 0.0f);
      uint64_t step = 0;
      auto apply = [&] {
        (*opt)->Apply(w.data(), st.data(), g.data(), n, 1.0f, ++step);
      };
      apply();
      // Its loads and stores alone, on copies of the same sizes.
      const size_t slots = (*opt)->state_per_elem();
      std::vector<float> sw(n, 0.5f), sst(n * slots, 0.0f);
      auto streams = [&] {
        Streams(sw.data(), sst.data(), g.data(), n, slots);
      };
      streams();
      std::vector<double> gbps, base, traffic;
      for (int r = 0; r < reps; ++r) {
        base.push_back(mc.Gbps());
        traffic.push_back(static_cast<double>(bytes) / TimePerCall(streams) /
                          1e9);
        gbps.push_back(static_cast<double>(bytes) / TimePerCall(apply) / 1e9);
      }
      Json j = Row("optimizer", c.name, n, 1, gbps, base, "memcpy");
      const auto t = bench::SpreadOf(traffic);
      j["streams_gbps"] = bench::Round(t.median, 3);
      j["streams_ratio"] =
          bench::Round(bench::SpreadOf(bench::Ratios(traffic, base)).median, 3);
      const auto vs = bench::SpreadOf(bench::Ratios(gbps, traffic));
      j["ratio_vs_streams"] = bench::Round(vs.median, 3);
      j["ratio_vs_streams_spread"] = bench::ToJson(vs);
      bench::Emit(j);
    }
    for (const Case& c : cases) {
      // One tensor of n floats in one chunk, one shard, one worker (ASP).
      auto push = ShardPush::Create(c.opt, n, n, FLAGS_apply_threads);
      if (!push || !push->Once()) return 1;
      std::vector<double> gbps, base;
      bool ok = true;
      for (int r = 0; r < reps; ++r) {
        base.push_back(mc.Gbps());
        gbps.push_back(static_cast<double>(bytes) /
                       TimePerCall([&] { ok = push->Once() && ok; }) / 1e9);
      }
      if (!ok) return 1;
      bench::Emit(Row("shard_push", c.name, n, FLAGS_apply_threads, gbps, base,
                      "memcpy"));
    }
  }
  // A large push on 1 and on N apply threads.
  const std::vector<std::string> lists = Split(FLAGS_apply_threads_list);
  if (!lists.empty()) {
    StatusOr<OptimizerKind> kind = ParseOptimizerKind(FLAGS_threads_optimizer);
    if (!kind.ok()) {
      std::fprintf(stderr, "%s\n", kind.status().ToString().c_str());
      return 2;
    }
    const size_t n = (static_cast<size_t>(FLAGS_threads_mb) << 20) / 4;
    const size_t bytes = n * sizeof(float);
    auto one = ShardPush::Create(Opt(*kind), n, size_t{1} << 20, 1);
    if (!one || !one->Once()) return 1;
    for (const std::string& t : lists) {
      const int threads = std::stoi(t);
      auto many = ShardPush::Create(Opt(*kind), n, size_t{1} << 20, threads);
      if (!many || !many->Once()) return 1;
      std::vector<double> gbps, base;
      bool ok = true;
      for (int r = 0; r < reps; ++r) {
        base.push_back(static_cast<double>(bytes) /
                       TimePerCall([&] { ok = one->Once() && ok; }) / 1e9);
        gbps.push_back(static_cast<double>(bytes) /
                       TimePerCall([&] { ok = many->Once() && ok; }) / 1e9);
      }
      if (!ok) return 1;
      bench::Emit(Row("shard_push_threads", FLAGS_threads_optimizer, n, threads,
                      gbps, base, "shard_push_1_thread"));
    }
  }
  return 0;
}
