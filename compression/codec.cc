// CodecSpec parsing, the codec registry and the payload checks shared by all
// codecs.
#include "compression/codec.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>

#include "compression/internal/codecs.h"

namespace asyncps::compression {

namespace {

constexpr const char* kNames[kNumCodecs] = {"none", "fp16", "bf16",
                                            "int8", "qsgd", "terngrad",
                                            "sign", "topk", "randomk"};

constexpr const char* kValidSpecs =
    "valid specs: none | fp16 | bf16 | int8[:bucket=B] | "
    "qsgd[:levels=S,bucket=B] | terngrad[:bucket=B] | sign[:bucket=B] | "
    "topk[:ratio=R,mode=exact|sampled] | randomk[:ratio=R]; extra keys: "
    "ef=0|1 (lossy codecs), momentum=M and warmup_epochs=E (topk/randomk, "
    "momentum needs ef=1), min_elems=N; e.g. "
    "\"topk:ratio=0.001,ef=1,momentum=0.9,warmup_epochs=4\"";

Status SpecError(std::string_view spec, std::string_view what) {
  std::string m = "bad codec spec '";
  m += spec;
  m += "': ";
  m += what;
  m += "; ";
  m += kValidSpecs;
  return Status::InvalidArgument(m);
}

bool IsSparseId(CodecId id) {
  return id == CodecId::kTopK || id == CodecId::kRandomK;
}
bool HasBucket(CodecId id) {
  return id == CodecId::kInt8 || id == CodecId::kQsgd ||
         id == CodecId::kTernGrad || id == CodecId::kSign;
}

bool ParseDouble(std::string_view s, double* v) {
  // std::from_chars for double is in libstdc++ 11+.
  if (s.empty()) return false;
  const char* end = s.data() + s.size();
  auto r = std::from_chars(s.data(), end, *v);
  return r.ec == std::errc() && r.ptr == end && std::isfinite(*v);
}

bool ParseU64(std::string_view s, uint64_t* v) {
  if (s.empty()) return false;
  const char* end = s.data() + s.size();
  auto r = std::from_chars(s.data(), end, *v);
  return r.ec == std::errc() && r.ptr == end;
}

std::string FormatDouble(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

// A codec whose every call fails: CodecForId's answer to unknown ids.
class InvalidCodec final : public Codec {
 public:
  CodecId id() const override { return static_cast<CodecId>(255); }
  size_t MaxEncodedBytes(size_t) const override { return 0; }
  Status Encode(const float*, size_t, uint64_t,
                std::vector<uint8_t>*) const override {
    return Err();
  }
  Status Validate(const uint8_t*, size_t, size_t) const override {
    return Err();
  }
  Status DecodeAdd(const uint8_t*, size_t, size_t, float,
                   float*) const override {
    return Err();
  }
  Status Decode(const uint8_t*, size_t, size_t, float*) const override {
    return Err();
  }

 private:
  static Status Err() { return Status::InvalidArgument("unknown codec id"); }
};

struct Registry {
  std::unique_ptr<Codec> codecs[kNumCodecs];
  InvalidCodec invalid;
  Registry() {
    const CodecSpec d;
    codecs[0] = internal::NewNoneCodec();
    codecs[1] = internal::NewFp16Codec();
    codecs[2] = internal::NewBf16Codec();
    codecs[3] = internal::NewInt8Codec(d.bucket);
    codecs[4] = internal::NewQsgdCodec(d.levels, d.bucket);
    codecs[5] = internal::NewTernGradCodec(d.bucket);
    codecs[6] = internal::NewSignCodec(d.bucket);
    codecs[7] = internal::NewTopKCodec(d.ratio, false);
    codecs[8] = internal::NewRandomKCodec(d.ratio);
  }
};

}  // namespace

const char* CodecName(CodecId id) {
  const auto i = static_cast<size_t>(id);
  return i < kNumCodecs ? kNames[i] : "invalid";
}

size_t CodecSpec::DefaultMinElems(CodecId id) {
  return (id == CodecId::kNone || id == CodecId::kFp16 || id == CodecId::kBf16)
             ? 0
             : 1024;
}

Status CodecSpec::Validate() const {
  if (static_cast<size_t>(id) >= kNumCodecs) {
    return Status::InvalidArgument("unknown codec id");
  }
  if (IsSparseId(id) && !(ratio > 0.0 && ratio <= 1.0)) {
    return Status::InvalidArgument("ratio must be in (0, 1]");
  }
  if (id == CodecId::kQsgd && (levels < 1 || levels > 127)) {
    return Status::InvalidArgument("levels must be in [1, 127]");
  }
  if (HasBucket(id) && (bucket < 8 || bucket % 8 != 0 ||
                        static_cast<uint32_t>(bucket) > internal::kMaxBucket)) {
    return Status::InvalidArgument(
        "bucket must be a multiple of 8 in [8, 2^24]");
  }
  if (error_feedback && id == CodecId::kNone) {
    return Status::InvalidArgument("ef needs a lossy codec");
  }
  if (!(momentum >= 0.0f && momentum < 1.0f)) {
    return Status::InvalidArgument("momentum must be in [0, 1)");
  }
  if (momentum > 0.0f && (!IsSparseId(id) || !error_feedback)) {
    return Status::InvalidArgument("momentum needs topk/randomk with ef=1");
  }
  if (!(warmup_epochs >= 0.0) || !std::isfinite(warmup_epochs)) {
    return Status::InvalidArgument("warmup_epochs must be >= 0");
  }
  if (warmup_epochs > 0.0 && !IsSparseId(id)) {
    return Status::InvalidArgument("warmup_epochs needs topk/randomk");
  }
  return Status::OK();
}

StatusOr<CodecSpec> CodecSpec::Parse(std::string_view spec) {
  CodecSpec s;
  const size_t colon = spec.find(':');
  const std::string_view name = spec.substr(0, colon);
  bool found = false;
  for (int i = 0; i < kNumCodecs; ++i) {
    if (name == kNames[i]) {
      s.id = static_cast<CodecId>(i);
      found = true;
    }
  }
  if (!found) {
    return SpecError(spec, "unknown codec '" + std::string(name) + "'");
  }
  s.min_elems = DefaultMinElems(s.id);
  if (colon != std::string_view::npos) {
    std::string_view rest = spec.substr(colon + 1);
    if (rest.empty()) return SpecError(spec, "empty key list after ':'");
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      const std::string_view kv = rest.substr(0, comma);
      rest = comma == std::string_view::npos ? std::string_view()
                                             : rest.substr(comma + 1);
      if (comma != std::string_view::npos && rest.empty()) {
        return SpecError(spec, "trailing ','");
      }
      const size_t eq = kv.find('=');
      if (eq == std::string_view::npos) {
        return SpecError(spec,
                         "expected key=value, got '" + std::string(kv) + "'");
      }
      const std::string_view key = kv.substr(0, eq);
      const std::string_view val = kv.substr(eq + 1);
      const std::string bad = "bad value for " + std::string(key);
      double d = 0;
      uint64_t u = 0;
      if (key == "ratio" && IsSparseId(s.id)) {
        if (!ParseDouble(val, &d)) return SpecError(spec, bad);
        s.ratio = d;
      } else if (key == "levels" && s.id == CodecId::kQsgd) {
        if (!ParseU64(val, &u) || u > 1000000) return SpecError(spec, bad);
        s.levels = static_cast<int>(u);
      } else if (key == "bucket" && HasBucket(s.id)) {
        if (!ParseU64(val, &u) || u > (1u << 30)) return SpecError(spec, bad);
        s.bucket = static_cast<int>(u);
      } else if (key == "mode" && s.id == CodecId::kTopK) {
        if (val == "exact") {
          s.sampled = false;
        } else if (val == "sampled") {
          s.sampled = true;
        } else {
          return SpecError(spec, "mode must be exact or sampled");
        }
      } else if (key == "ef") {
        if (val != "0" && val != "1")
          return SpecError(spec, "ef must be 0 or 1");
        s.error_feedback = val == "1";
      } else if (key == "momentum") {
        if (!ParseDouble(val, &d)) return SpecError(spec, bad);
        s.momentum = static_cast<float>(d);
      } else if (key == "warmup_epochs") {
        if (!ParseDouble(val, &d)) return SpecError(spec, bad);
        s.warmup_epochs = d;
      } else if (key == "min_elems") {
        if (!ParseU64(val, &u)) return SpecError(spec, bad);
        s.min_elems = u;
      } else {
        return SpecError(spec, "unknown key '" + std::string(key) + "' for " +
                                   std::string(name));
      }
    }
  }
  Status st = s.Validate();
  if (!st.ok()) return SpecError(spec, st.message());
  return s;
}

std::string CodecSpec::ToString() const {
  std::string s = CodecName(id);
  std::string keys;
  auto add = [&keys](const std::string& kv) {
    keys += keys.empty() ? "" : ",";
    keys += kv;
  };
  if (IsSparseId(id)) add("ratio=" + FormatDouble(ratio));
  if (id == CodecId::kQsgd) add("levels=" + std::to_string(levels));
  if (HasBucket(id)) add("bucket=" + std::to_string(bucket));
  if (id == CodecId::kTopK && sampled) add("mode=sampled");
  if (error_feedback) add("ef=1");
  if (momentum > 0.0f) add("momentum=" + FormatDouble(momentum));
  if (warmup_epochs > 0.0) add("warmup_epochs=" + FormatDouble(warmup_epochs));
  if (min_elems != DefaultMinElems(id)) {
    add("min_elems=" + std::to_string(min_elems));
  }
  if (!keys.empty()) s += ":" + keys;
  return s;
}

bool CodecSpec::operator==(const CodecSpec& o) const {
  return id == o.id && ratio == o.ratio && levels == o.levels &&
         bucket == o.bucket && sampled == o.sampled &&
         error_feedback == o.error_feedback && momentum == o.momentum &&
         warmup_epochs == o.warmup_epochs && min_elems == o.min_elems;
}

StatusOr<std::unique_ptr<Codec>> CreateCodec(const CodecSpec& spec) {
  RETURN_IF_ERROR(spec.Validate());
  switch (spec.id) {
    case CodecId::kNone:
      return internal::NewNoneCodec();
    case CodecId::kFp16:
      return internal::NewFp16Codec();
    case CodecId::kBf16:
      return internal::NewBf16Codec();
    case CodecId::kInt8:
      return internal::NewInt8Codec(spec.bucket);
    case CodecId::kQsgd:
      return internal::NewQsgdCodec(spec.levels, spec.bucket);
    case CodecId::kTernGrad:
      return internal::NewTernGradCodec(spec.bucket);
    case CodecId::kSign:
      return internal::NewSignCodec(spec.bucket);
    case CodecId::kTopK:
      return internal::NewTopKCodec(spec.ratio, spec.sampled);
    case CodecId::kRandomK:
      return internal::NewRandomKCodec(spec.ratio);
  }
  return Status::InvalidArgument("unknown codec id");
}

const Codec& CodecForId(CodecId id) {
  static const Registry* const registry = new Registry();  // never freed
  const auto i = static_cast<size_t>(id);
  if (i >= kNumCodecs) return registry->invalid;
  return *registry->codecs[i];
}

StatusOr<CodecId> PeekCodecId(const uint8_t* p, size_t bytes) {
  if (p == nullptr || bytes < kPayloadHeaderBytes) {
    return Status::Corruption("payload shorter than its header");
  }
  if (p[0] != internal::kMagic) return Status::Corruption("bad payload magic");
  if (p[1] >= kNumCodecs)
    return Status::Corruption("unknown codec id in payload");
  return static_cast<CodecId>(p[1]);
}

Status DecodeAddAny(const uint8_t* p, size_t bytes, size_t n, float alpha,
                    float* dst) {
  ASSIGN_OR_RETURN(CodecId id, PeekCodecId(p, bytes));
  return CodecForId(id).DecodeAdd(p, bytes, n, alpha, dst);
}

uint32_t SparseView::index(size_t i) const {
  if (indices_ == nullptr) return internal::RandomKIndex(key_, i, n_, k_);
  uint32_t v;
  std::memcpy(&v, indices_ + 4 * i, 4);
  return v;
}

float SparseView::value(size_t i) const {
  float v;
  std::memcpy(&v, values_ + 4 * i, 4);
  return v;
}

StatusOr<SparseView> ParseSparse(const uint8_t* p, size_t bytes, size_t n) {
  internal::SparseLayout l;
  RETURN_IF_ERROR(internal::CheckSparse(p, bytes, n, &l));
  SparseView v;
  v.k_ = l.k;
  v.n_ = n;
  v.indices_ = l.indices;
  v.values_ = l.values;
  v.key_ = l.key;
  return v;
}

namespace internal {

Status CheckHeader(const uint8_t* p, size_t bytes, size_t n, CodecId id,
                   Header* h) {
  if (n > std::numeric_limits<uint32_t>::max()) {
    return Status::InvalidArgument("element count exceeds 2^32-1");
  }
  if (p == nullptr || bytes < kPayloadHeaderBytes) {
    return Status::Corruption("payload shorter than its header");
  }
  if (p[0] != kMagic) return Status::Corruption("bad payload magic");
  if (p[2] != kVersion) return Status::Corruption("unknown payload version");
  *h = ReadHeader(p);
  if (h->codec != static_cast<uint8_t>(id)) {
    return Status::InvalidArgument(std::string("payload is for codec ") +
                                   CodecName(static_cast<CodecId>(h->codec)) +
                                   ", not " + CodecName(id));
  }
  if (h->n != n) {
    return Status::InvalidArgument("payload element count " +
                                   std::to_string(h->n) + " != expected " +
                                   std::to_string(n));
  }
  return Status::OK();
}

Status CheckBucket(uint32_t bucket) {
  if (bucket < 8 || bucket % 8 != 0 || bucket > kMaxBucket) {
    return Status::Corruption("bad bucket size in payload");
  }
  return Status::OK();
}

bool ScalesOk(const uint8_t* p, size_t count) {
  bool ok = true;
  for (size_t i = 0; i < count; ++i) {
    float s;
    std::memcpy(&s, p + 4 * i, 4);
    ok &= (s >= 0.0f) & (s <= std::numeric_limits<float>::max());
  }
  return ok;
}

Status CheckSparse(const uint8_t* p, size_t bytes, size_t n, SparseLayout* l) {
  ASSIGN_OR_RETURN(CodecId id, PeekCodecId(p, bytes));
  if (id != CodecId::kTopK && id != CodecId::kRandomK) {
    return Status::InvalidArgument(std::string("not a sparse codec: ") +
                                   CodecName(id));
  }
  Header h;
  RETURN_IF_ERROR(CheckHeader(p, bytes, n, id, &h));
  const uint64_t k = h.p1;
  if (k > n) return Status::Corruption("sparse payload: k > n");
  const uint64_t per = id == CodecId::kTopK ? 8 : 4;
  if (bytes != kPayloadHeaderBytes + per * k) {
    return Status::Corruption("sparse payload: size does not match k");
  }
  l->id = id;
  l->k = k;
  const uint8_t* body = p + kPayloadHeaderBytes;
  if (id == CodecId::kTopK) {
    l->indices = body;
    l->values = body + 4 * k;
    // Strictly increasing and < n: no duplicates, no out-of-range writes.
    int64_t prev = -1;
    bool ok = true;
    for (uint64_t i = 0; i < k; ++i) {
      uint32_t idx;
      std::memcpy(&idx, body + 4 * i, 4);
      ok &= static_cast<int64_t>(idx) > prev;
      prev = idx;
    }
    if (!ok || (k > 0 && static_cast<uint64_t>(prev) >= n)) {
      return Status::Corruption("top-k indices not increasing or out of range");
    }
  } else {
    l->indices = nullptr;
    l->values = body;
    l->key = SeedKey(h.seed);
  }
  bool finite = true;
  for (uint64_t i = 0; i < k; ++i) {
    float v;
    std::memcpy(&v, l->values + 4 * i, 4);
    finite &= std::fabs(v) <= std::numeric_limits<float>::max();
  }
  if (!finite) return Status::Corruption("non-finite value in sparse payload");
  return Status::OK();
}

StatusOr<uint8_t*> BeginPayload(CodecId id, const float* x, size_t n,
                                uint32_t p1, uint32_t p2, uint64_t seed,
                                uint64_t body_bytes,
                                std::vector<uint8_t>* out) {
  if (out == nullptr) return Status::InvalidArgument("null output");
  if (x == nullptr && n > 0) return Status::InvalidArgument("null input");
  if (n > std::numeric_limits<uint32_t>::max()) {
    return Status::InvalidArgument("element count exceeds 2^32-1");
  }
  out->resize(kPayloadHeaderBytes + body_bytes);
  Header h;
  h.codec = static_cast<uint8_t>(id);
  h.n = static_cast<uint32_t>(n);
  h.p1 = p1;
  h.p2 = p2;
  h.seed = seed;
  WriteHeader(h, out->data());
  return out->data() + kPayloadHeaderBytes;
}

Status CodecBase::DecodeAdd(const uint8_t* p, size_t bytes, size_t n,
                            float alpha, float* dst) const {
  RETURN_IF_ERROR(Validate(p, bytes, n));
  if (dst == nullptr && n > 0) return Status::InvalidArgument("null dst");
  DecodeUnchecked(p, n, alpha, true, dst);
  return Status::OK();
}

Status CodecBase::Decode(const uint8_t* p, size_t bytes, size_t n,
                         float* dst) const {
  RETURN_IF_ERROR(Validate(p, bytes, n));
  if (dst == nullptr && n > 0) return Status::InvalidArgument("null dst");
  DecodeUnchecked(p, n, 1.0f, false, dst);
  return Status::OK();
}

size_t KForRatio(double ratio, size_t n) {
  if (n == 0) return 0;
  double k = std::round(ratio * static_cast<double>(n));
  if (k < 1) k = 1;
  if (k > static_cast<double>(n)) k = static_cast<double>(n);
  return static_cast<size_t>(k);
}

}  // namespace internal
}  // namespace asyncps::compression
