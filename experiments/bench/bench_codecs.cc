// ps_bench_codecs: single-thread encode/decode throughput of every codec,
// next to a memcpy of the same float bytes and an std::nth_element top-k.
//
// Prints one JSON object per line:
//   {"bench":"codec","codec":"int8:bucket=512","n":1048576,"op":"encode",
//    "gelems_per_s":..,"baseline":"memcpy","baseline_gelems_per_s":..,
//    "ratio":..,...}
// gelems_per_s is the median over repetitions (best_gelems_per_s the best).
// Top-k encoders are compared with nth_element, everything else with memcpy.
// Flags: --quick (smaller n, fewer repetitions), --reps=N.
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

namespace {

using asyncps::compression::Codec;
using asyncps::compression::CodecId;
using asyncps::compression::CodecSpec;

struct Timing {
  double median_s = 0;
  double best_s = 0;
};

Timing Time(int reps, const std::function<void()>& f) {
  f();  // warm-up: page faults, caches
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto a = std::chrono::steady_clock::now();
    f();
    const auto b = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double>(b - a).count());
  }
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t.front()};
}

double G(size_t n, double s) { return static_cast<double>(n) / s / 1e9; }

void Emit(const std::string& codec, size_t n, const char* op, const Timing& t,
          const char* baseline, const Timing& b, size_t wire_bytes) {
  std::printf(
      "{\"bench\":\"codec\",\"codec\":\"%s\",\"n\":%zu,\"op\":\"%s\","
      "\"gelems_per_s\":%.4f,\"best_gelems_per_s\":%.4f,\"baseline\":\"%s\","
      "\"baseline_gelems_per_s\":%.4f,\"ratio\":%.3f,\"wire_bytes\":%zu,"
      "\"bits_per_elem\":%.3f}\n",
      codec.c_str(), n, op, G(n, t.median_s), G(n, t.best_s), baseline,
      G(n, b.median_s), b.median_s / t.median_s, wire_bytes,
      8.0 * wire_bytes / static_cast<double>(n));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int reps = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a.rfind("--reps=", 0) == 0) {
      reps = std::atoi(a.c_str() + 7);
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--reps=N]\n", argv[0]);
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
    const int r = reps > 0 ? reps : (quick ? 3 : (n > (1u << 22) ? 5 : 11));
    std::vector<float> x(n), dst(n), copy(n);
    std::mt19937_64 rng(42);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& v : x) v = normal(rng);

    const Timing memcpy_t =
        Time(r, [&] { std::memcpy(copy.data(), x.data(), 4 * n); });
    Emit("memcpy", n, "copy", memcpy_t, "memcpy", memcpy_t, 4 * n);
    std::vector<Timing> nth_t;
    for (double ratio : {0.01, 0.001}) {
      const size_t k = static_cast<size_t>(std::round(ratio * n));
      nth_t.push_back(Time(r, [&] {
        for (size_t i = 0; i < n; ++i) copy[i] = std::fabs(x[i]);
        std::nth_element(copy.begin(), copy.begin() + (k - 1), copy.end(),
                         std::greater<float>());
      }));
      Emit(ratio == 0.01 ? "nth_element:ratio=0.01" : "nth_element:ratio=0.001",
           n, "encode", nth_t.back(), "memcpy", memcpy_t, 0);
    }

    for (const char* text : specs) {
      auto spec = CodecSpec::Parse(text);
      if (!spec.ok()) {
        std::fprintf(stderr, "%s\n", spec.status().ToString().c_str());
        return 1;
      }
      auto codec = asyncps::compression::CreateCodec(*spec);
      if (!codec.ok()) return 1;
      const Codec& c = **codec;
      std::vector<uint8_t> out;
      asyncps::Status st;
      const Timing enc = Time(r, [&] { st = c.Encode(x.data(), n, 7, &out); });
      if (!st.ok()) {
        std::fprintf(stderr, "%s: %s\n", text, st.ToString().c_str());
        return 1;
      }
      const Timing dec = Time(
          r, [&] { st = c.Decode(out.data(), out.size(), n, dst.data()); });
      if (!st.ok()) {
        std::fprintf(stderr, "%s: %s\n", text, st.ToString().c_str());
        return 1;
      }
      const std::string name = spec->ToString();
      if (spec->id == CodecId::kTopK) {
        Emit(name, n, "encode", enc, "nth_element",
             nth_t[spec->ratio == 0.01 ? 0 : 1], out.size());
      } else {
        Emit(name, n, "encode", enc, "memcpy", memcpy_t, out.size());
      }
      Emit(name, n, "decode", dec, "memcpy", memcpy_t, out.size());
    }
  }
  return 0;
}
