// ps_py_crosscheck: what the C++ API does for given inputs, for the Python
// binding's bitwise cross-checks (worker/python/tests).
//
//   ps_py_crosscheck --mode=encode --codec=SPEC --seed=N --sizes=a,b,...
//       --steps=K --input=GRADS --output=PAYLOADS
//     Feeds K steps of gradients (K x sum(sizes) float32, step-major, chunk
//     after chunk) through one compression::Compressor, at step s and epoch
//     s * 0.25, and writes for every (step, chunk): u8 codec id, u32 length
//     (little endian), payload bytes.
//   ps_py_crosscheck --mode=train --servers=E --rank=R --tensors=SPECS
//       --codec=SPEC --pull_codec=SPEC --seed=N --steps=K --input=GRADS
//       --output=WEIGHTS [--prefetch_ahead]
//     Runs K steps of Pull(c) -> Push(c, grads[c]) -> Clock(c + 1) through a
//     PsParameterStore and writes every pulled model (K + 1 x total float32,
//     the last one pulled at clock K). SPECS:
//     name:dim1xdim2:init:param:seed,...
//   ps_py_crosscheck --mode=loop --servers=E --tensors=SPECS --steps=K
//       [--prefetch_ahead]
//     The step loop of ps_worker without compute (Pull -> Push of zero
//     gradients -> Clock), K steps after 10 warm-up steps; prints
//     `us_per_step=X` (experiments/bench/bench_pytorch.py compares the
//     Python layer with it).
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "compression/compressor.h"
#include "worker/client.h"
#include "worker/ps_store.h"

DEFINE_string(mode, "", "encode | train | loop");
DEFINE_string(codec, "none", "push codec spec");
DEFINE_string(pull_codec, "", "pull codec spec");
DEFINE_uint64(seed, 1,
              "codec seed (encode: the Compressor's; train: the store's)");
DEFINE_string(sizes, "", "encode: chunk sizes");
DEFINE_int32(steps, 1, "steps");
DEFINE_string(input, "", "gradients file");
DEFINE_string(output, "", "output file");
DEFINE_string(servers, "", "train: shard endpoints");
DEFINE_int32(rank, 0, "train: worker rank");
DEFINE_string(tensors, "", "train: model specs");
DEFINE_bool(prefetch_ahead, false, "train: PsStoreOptions::prefetch_ahead");

namespace {

using namespace asyncps;

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) out.push_back(item);
  return out;
}

StatusOr<std::vector<float>> ReadFloats(const std::string& path, size_t n) {
  std::ifstream f(path, std::ios::binary);
  std::vector<float> v(n);
  if (!f.read(reinterpret_cast<char*>(v.data()), n * sizeof(float)))
    return Status::InvalidArgument(path + ": fewer than " + std::to_string(n) +
                                   " floats");
  return v;
}

StatusOr<std::vector<TensorSpec>> ParseTensors(const std::string& text) {
  std::vector<TensorSpec> specs;
  for (const std::string& item : Split(text, ',')) {
    std::vector<std::string> f = Split(item, ':');
    if (f.size() != 5) return Status::InvalidArgument("bad tensor " + item);
    TensorSpec t;
    t.name = f[0];
    for (const std::string& d : Split(f[1], 'x'))
      t.shape.push_back(std::stoll(d));
    const std::vector<std::string> kinds = {"zeros",     "constant",
                                            "uniform",   "normal",
                                            "he_normal", "xavier_uniform"};
    auto it = std::find(kinds.begin(), kinds.end(), f[2]);
    if (it == kinds.end()) return Status::InvalidArgument("bad init " + f[2]);
    t.init = static_cast<InitKind>(it - kinds.begin());
    t.init_param = std::stof(f[3]);
    t.seed = std::stoull(f[4]);
    specs.push_back(t);
  }
  return specs;
}

Status Encode() {
  std::vector<size_t> sizes;
  size_t total = 0;
  for (const std::string& s : Split(FLAGS_sizes, ',')) {
    sizes.push_back(std::stoull(s));
    total += sizes.back();
  }
  ASSIGN_OR_RETURN(std::vector<float> g,
                   ReadFloats(FLAGS_input, total * FLAGS_steps));
  compression::CompressorOptions o;
  ASSIGN_OR_RETURN(o.spec, compression::CodecSpec::Parse(FLAGS_codec));
  o.seed = FLAGS_seed;
  ASSIGN_OR_RETURN(auto c, compression::Compressor::Create(o, sizes));
  std::ofstream out(FLAGS_output, std::ios::binary);
  const float* p = g.data();
  std::vector<uint8_t> payload;
  for (int step = 0; step < FLAGS_steps; ++step) {
    for (size_t chunk = 0; chunk < sizes.size(); ++chunk) {
      ASSIGN_OR_RETURN(compression::CodecId id,
                       c->Compress(chunk, p, step * 0.25, step, &payload));
      const uint8_t code = static_cast<uint8_t>(id);
      const uint32_t len = static_cast<uint32_t>(payload.size());
      out.write(reinterpret_cast<const char*>(&code), 1);
      out.write(reinterpret_cast<const char*>(&len), 4);
      out.write(reinterpret_cast<const char*>(payload.data()), payload.size());
      p += sizes[chunk];
    }
  }
  return out ? Status::OK() : Status::Internal("write failed");
}

Status Train() {
  ASSIGN_OR_RETURN(std::vector<TensorSpec> specs, ParseTensors(FLAGS_tensors));
  size_t total = 0;
  for (const auto& t : specs) total += t.num_elements();
  ASSIGN_OR_RETURN(std::vector<float> g,
                   ReadFloats(FLAGS_input, total * FLAGS_steps));
  worker::ClientOptions co;
  co.servers = Split(FLAGS_servers, ',');
  co.rank = FLAGS_rank;
  co.deadline = std::chrono::seconds(30);
  ASSIGN_OR_RETURN(auto client, worker::Client::Create(co));
  worker::PsStoreOptions so;
  so.push_codec = FLAGS_codec;
  so.pull_codec = FLAGS_pull_codec;
  so.seed = FLAGS_seed;
  so.prefetch_ahead = FLAGS_prefetch_ahead;
  so.timeout = std::chrono::seconds(30);
  ASSIGN_OR_RETURN(auto store,
                   worker::PsParameterStore::Create(client.get(), specs, so));
  std::vector<std::vector<float>> w;
  std::vector<float*> wp;
  std::vector<const float*> gp(specs.size());
  for (const auto& t : specs) w.emplace_back(t.num_elements());
  for (auto& v : w) wp.push_back(v.data());
  std::ofstream out(FLAGS_output, std::ios::binary);
  auto dump = [&] {
    for (const auto& v : w)
      out.write(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  };
  const float* p = g.data();
  for (int c = 0; c < FLAGS_steps; ++c) {
    RETURN_IF_ERROR(store->Pull(c, wp));
    dump();
    for (size_t t = 0; t < specs.size(); ++t) {
      gp[t] = p;
      p += specs[t].num_elements();
    }
    RETURN_IF_ERROR(store->Push(c, gp));
    RETURN_IF_ERROR(store->Clock(c + 1));
  }
  RETURN_IF_ERROR(store->Pull(FLAGS_steps, wp));
  dump();
  RETURN_IF_ERROR(store->Flush());
  return out ? Status::OK() : Status::Internal("write failed");
}

Status Loop() {
  ASSIGN_OR_RETURN(std::vector<TensorSpec> specs, ParseTensors(FLAGS_tensors));
  worker::ClientOptions co;
  co.servers = Split(FLAGS_servers, ',');
  co.rank = FLAGS_rank;
  ASSIGN_OR_RETURN(auto client, worker::Client::Create(co));
  worker::PsStoreOptions so;
  so.push_codec = FLAGS_codec;
  so.prefetch_ahead = FLAGS_prefetch_ahead;
  ASSIGN_OR_RETURN(auto store,
                   worker::PsParameterStore::Create(client.get(), specs, so));
  std::vector<std::vector<float>> w, g;
  std::vector<float*> wp;
  std::vector<const float*> gp;
  for (const auto& t : specs) {
    w.emplace_back(t.num_elements());
    g.emplace_back(t.num_elements(), 0.0f);
  }
  for (auto& v : w) wp.push_back(v.data());
  for (auto& v : g) gp.push_back(v.data());
  const int warmup = 10;
  auto start = std::chrono::steady_clock::now();
  for (int c = 0; c < warmup + FLAGS_steps; ++c) {
    if (c == warmup) start = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(store->Pull(c, wp));
    RETURN_IF_ERROR(store->Push(c, gp));
    RETURN_IF_ERROR(store->Clock(c + 1));
  }
  const double us = std::chrono::duration<double, std::micro>(
                        std::chrono::steady_clock::now() - start)
                        .count();
  RETURN_IF_ERROR(store->Flush());
  std::printf("us_per_step=%.2f\n", us / FLAGS_steps);
  return Status::OK();
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  Status s = FLAGS_mode == "encode"  ? Encode()
             : FLAGS_mode == "train" ? Train()
             : FLAGS_mode == "loop"  ? Loop()
                                     : Status::InvalidArgument("--mode");
  if (!s.ok()) {
    std::fprintf(stderr, "ps_py_crosscheck: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
