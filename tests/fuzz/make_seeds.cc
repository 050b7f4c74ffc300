// Writes seed corpora of valid inputs for the libFuzzer targets:
//   make_fuzz_seeds OUT_DIR  ->  OUT_DIR/wire/*  and  OUT_DIR/codecs/*
// wire: encoded requests of every kind and replies (first byte selects the
// decoder as fuzz_wire.cc expects); codecs: every codec's payload for a few
// sizes, prefixed as fuzz_codecs.cc expects.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/wire.h"
#include "compression/codec.h"

namespace {

using namespace asyncps;  // NOLINT: tool

void Write(const std::filesystem::path& p, uint8_t prefix,
           const std::vector<uint8_t>& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.put(static_cast<char>(prefix));
  f.write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

}  // namespace

int main(int argc, char** argv) {
  const char* kUsage =
      "usage: make_fuzz_seeds OUT_DIR\n"
      "writes seed corpora for the libFuzzer targets: OUT_DIR/wire/* "
      "(requests and replies) and OUT_DIR/codecs/* (codec payloads)\n";
  if (argc == 2 &&
      (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  // An argument starting with '-' is a mistyped flag, not a folder name.
  if (argc != 2 || argv[1][0] == '-' || argv[1][0] == '\0') {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::filesystem::path out = argv[1];
  std::filesystem::create_directories(out / "wire");
  std::filesystem::create_directories(out / "codecs");
  int files = 0;
  for (int k = 0; k <= 7; ++k) {
    RequestHeader h;
    h.id = 1000 + k;
    h.rank = k % 3;
    h.incarnation = 7;
    h.kind = static_cast<RequestKind>(k);
    h.clock = k;
    if (h.kind == RequestKind::kRegister) {
      TensorSpec t;
      t.name = "w";
      t.shape = {4, 8};
      t.init = InitKind::kUniform;
      t.init_param = 0.1f;
      h.tensors = {t, t};
      h.tensors[1].name = "b";
      h.layout.num_shards = 2;
    }
    if (h.kind == RequestKind::kPush) {
      for (uint32_t c = 0; c < 3; ++c) {
        ChunkRef r;
        r.chunk = c;
        r.frame = c + 1;
        r.codec = static_cast<uint8_t>(c);
        r.num_elems = 256;
        r.byte_size = 1024;
        h.chunks.push_back(r);
      }
    }
    if (h.kind == RequestKind::kPull) {
      h.pull_chunks = {0, 2};
      h.pull_codec = "fp16";
    }
    Write(out / "wire" / ("request_" + std::to_string(k)), 1, EncodeRequest(h));
    ++files;
    ReplyHeader r;
    r.id = h.id;
    r.kind = h.kind;
    r.shard_version = 42;
    r.min_clock = 3;
    if (k == 2)
      r.chunks = h.chunks.empty() ? std::vector<ChunkRef>(2) : h.chunks;
    if (k == 5) r.text = "{\"shard\":0}";
    if (k == 6) r.status = Status::ResourceExhausted("too many parked pulls");
    Write(out / "wire" / ("reply_" + std::to_string(k)), 0, EncodeReply(r));
    ++files;
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> gauss(0, 1);
  const std::vector<std::string> specs = {"none",
                                          "fp16",
                                          "bf16",
                                          "int8:bucket=64",
                                          "qsgd:levels=4,bucket=64",
                                          "terngrad:bucket=64",
                                          "sign:bucket=64",
                                          "topk:ratio=0.05",
                                          "randomk:ratio=0.05"};
  for (const std::string& spec : specs) {
    auto parsed = compression::CodecSpec::Parse(spec);
    if (!parsed.ok()) continue;
    auto codec = compression::CreateCodec(*parsed);
    if (!codec.ok()) continue;
    for (size_t n : {1, 7, 64, 300, 1000}) {
      std::vector<float> x(n);
      for (float& v : x) v = gauss(rng);
      std::vector<uint8_t> payload;
      if (!(*codec)->Encode(x.data(), n, 5, &payload).ok()) continue;
      std::vector<uint8_t> in = {static_cast<uint8_t>((n - 1) & 0xff),
                                 static_cast<uint8_t>((n - 1) >> 8)};
      in.insert(in.end(), payload.begin(), payload.end());
      Write(out / "codecs" /
                (spec.substr(0, spec.find(':')) + "_" + std::to_string(n)),
            static_cast<uint8_t>(parsed->id), in);
      ++files;
    }
  }
  std::printf("wrote %d seed files under %s\n", files, out.c_str());
  return 0;
}
