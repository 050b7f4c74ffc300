// ps_bench_codecs: single-thread encode/decode throughput of every codec,
// next to a memcpy of the same float bytes and an std::nth_element top-k,
// measured in the same run.
//
// Prints one JSON object per line:
//   {"bench":"codec","codec":"int8:bucket=512","n":1048576,"op":"encode",
//    "gelems_per_s":..,"baseline":"memcpy","baseline_gelems_per_s":..,
//    "ratio":..,"gelems_per_s_spread":{..},"ratio_spread":{..},...}
// Each repeat times the operation right after its baseline (a burst of load
// hits both); gelems_per_s is the median over repeats, ratio the median of
// the per-repeat ratios, with their spread (min, max, quartiles).
// Top-k encoders are compared with nth_element, everything else with memcpy.
// Flags: --quick (smaller n, fewer repetitions), --reps=N,
// --only=SUBSTRING (codecs whose spec contains it).
// Quiet run: ps_bench_codecs --reps=15
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "compression/codec.h"
#include "experiments/bench/bench_util.h"

namespace {

using asyncps::compression::Codec;
using asyncps::compression::CodecId;
using asyncps::compression::CodecSpec;
namespace bench = asyncps::bench;

// Seconds of one call of f: the best of `inner` calls (one call of a small
// n is too short for the clock on its own).
double Once(const std::function<void()>& f, int inner) {
  double best = 1e30;
  for (int i = 0; i < inner; ++i) {
    const auto a = std::chrono::steady_clock::now();
    f();
    const auto b = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(b - a).count());
  }
  return best;
}

double G(size_t n, double s) { return static_cast<double>(n) / s / 1e9; }

// Times `op` and `base` alternately, `reps` times; emits one row.
void Measure(const std::string& codec, size_t n, const char* op,
             const char* baseline, int reps, int inner, size_t wire_bytes,
             const std::function<void()>& f,
             const std::function<void()>& base) {
  f();
  base();  // warm-up: page faults, caches
  std::vector<double> ours, theirs;
  for (int r = 0; r < reps; ++r) {
    theirs.push_back(G(n, Once(base, inner)));
    ours.push_back(G(n, Once(f, inner)));
  }
  const auto o = bench::SpreadOf(ours);
  const auto b = bench::SpreadOf(theirs);
  const auto q = bench::SpreadOf(bench::Ratios(ours, theirs));
  bench::Json j;
  j["bench"] = "codec";
  j["codec"] = codec;
  j["n"] = n;
  j["op"] = op;
  j["gelems_per_s"] = bench::Round(o.median, 4);
  j["baseline"] = baseline;
  j["baseline_gelems_per_s"] = bench::Round(b.median, 4);
  j["ratio"] = bench::Round(q.median, 3);
  j["wire_bytes"] = wire_bytes;
  j["bits_per_elem"] =
      bench::Round(8.0 * wire_bytes / static_cast<double>(n), 3);
  j["gelems_per_s_spread"] = bench::ToJson(o, 4);
  j["ratio_spread"] = bench::ToJson(q);
  bench::Emit(j);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int reps = 0;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a.rfind("--reps=", 0) == 0) {
      reps = std::atoi(a.c_str() + 7);
    } else if (a.rfind("--only=", 0) == 0) {
      only = a.substr(7);
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--reps=N] [--only=S]\n",
                   argv[0]);
      return 2;
    }
  }
  const std::vector<size_t> sizes =
      quick ? std::vector<size_t>{1u << 18, 1u << 20}
            : std::vector<size_t>{1u << 20, 1u << 24};
  const char* specs[] = {"none",
                         "fp16",
                         "bf16",
                         "int8",
                         "qsgd:levels=4",
                         "qsgd:levels=16",
                         "terngrad",
                         "sign",
                         "randomk:ratio=0.01",
                         "topk:ratio=0.01",
                         "topk:ratio=0.001",
                         "topk:ratio=0.01,mode=sampled",
                         "topk:ratio=0.001,mode=sampled"};
  for (size_t n : sizes) {
    const int r = reps > 0 ? reps : (quick ? 3 : (n > (1u << 22) ? 5 : 9));
    const int inner = n > (1u << 22) ? 1 : 3;
    std::vector<float> x(n), dst(n), copy(n);
    std::mt19937_64 rng(42);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& v : x) v = normal(rng);
    const auto memcpy_op = [&] { std::memcpy(copy.data(), x.data(), 4 * n); };
    std::function<void()> nth[2];
    for (int t = 0; t < 2; ++t) {
      const size_t k = static_cast<size_t>(std::round((t ? 0.001 : 0.01) * n));
      nth[t] = [&, k] {
        for (size_t i = 0; i < n; ++i) copy[i] = std::fabs(x[i]);
        std::nth_element(copy.begin(), copy.begin() + (k - 1), copy.end(),
                         std::greater<float>());
      };
    }
    if (only.empty()) {
      Measure("memcpy", n, "copy", "memcpy", r, inner, 4 * n, memcpy_op,
              memcpy_op);
      Measure("nth_element:ratio=0.01", n, "encode", "memcpy", r, inner, 0,
              nth[0], memcpy_op);
      Measure("nth_element:ratio=0.001", n, "encode", "memcpy", r, inner, 0,
              nth[1], memcpy_op);
    }
    for (const char* text : specs) {
      auto spec = CodecSpec::Parse(text);
      if (!spec.ok()) {
        std::fprintf(stderr, "%s\n", spec.status().ToString().c_str());
        return 1;
      }
      const std::string name = spec->ToString();
      if (!only.empty() && name.find(only) == std::string::npos) continue;
      auto codec = asyncps::compression::CreateCodec(*spec);
      if (!codec.ok()) return 1;
      const Codec& c = **codec;
      std::vector<uint8_t> out;
      asyncps::Status st;
      const auto enc = [&] { st = c.Encode(x.data(), n, 7, &out); };
      const auto dec = [&] {
        st = c.Decode(out.data(), out.size(), n, dst.data());
      };
      enc();
      if (!st.ok()) {
        std::fprintf(stderr, "%s: %s\n", text, st.ToString().c_str());
        return 1;
      }
      if (spec->id == CodecId::kTopK) {
        Measure(name, n, "encode", "nth_element", r, inner, out.size(), enc,
                nth[spec->ratio == 0.01 ? 0 : 1]);
      } else {
        Measure(name, n, "encode", "memcpy", r, inner, out.size(), enc,
                memcpy_op);
      }
      enc();
      Measure(name, n, "decode", "memcpy", r, inner, out.size(), dec,
              memcpy_op);
      if (!st.ok()) {
        std::fprintf(stderr, "%s: %s\n", text, st.ToString().c_str());
        return 1;
      }
    }
  }
  return 0;
}
