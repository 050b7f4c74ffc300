#include "worker/idx_reader.h"

#include <sys/mman.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

namespace asyncps::worker {
namespace {

constexpr uint8_t kTypeUbyte = 0x08;
constexpr size_t kMaxDims = 8;
// The largest size a gzip trailer may announce that is taken as a hint (a
// damaged trailer costs at most this much memory; larger files grow).
constexpr uint32_t kMaxSizeHint = 512u << 20;

// Sizes `v` to n elements, asking the kernel for transparent huge pages
// first (best effort, when the machine's policy is "madvise"). A dataset
// is tens to hundreds of MB, written once: in 4 KiB pages its page faults
// cost more than the reading and decoding (a ps_worker spent ~0.5 s of a
// 1.5 s start in them).
template <typename T>
void ResizeForBulkWrite(std::vector<T>* v, size_t n) {
  v->reserve(n);
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const auto begin = reinterpret_cast<uintptr_t>(v->data());
  const uintptr_t first = (begin + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t last = (begin + n * sizeof(T)) & ~(kHuge - 1);
  if (last > first) {
    madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
  }
  v->resize(n);
}

// The uncompressed size a gzip file's trailer announces (ISIZE: the size
// modulo 2^32 of its last member), 0 when it cannot be read. Only a hint.
uint32_t GzipSizeHint(FILE* f) {
  unsigned char t[4];
  if (std::fseek(f, -4, SEEK_END) != 0 || std::fread(t, 1, 4, f) != 4) return 0;
  const uint32_t size = uint32_t{t[0]} | (uint32_t{t[1]} << 8) |
                        (uint32_t{t[2]} << 16) | (uint32_t{t[3]} << 24);
  return size <= kMaxSizeHint ? size : 0;
}

// Reads the whole file, inflating it when it starts with the gzip magic.
StatusOr<std::vector<uint8_t>> ReadAllBytes(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"),
                                          &std::fclose);
  if (!f) {
    return Status::NotFound(path + ": cannot open: " + std::strerror(errno));
  }
  unsigned char magic[2] = {0, 0};
  size_t got = std::fread(magic, 1, 2, f.get());
  const bool gzip = got == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
  std::vector<uint8_t> out;
  if (!gzip) {
    std::fseek(f.get(), 0, SEEK_END);
    long size = std::ftell(f.get());
    if (size < 0)
      return Status::Corruption(path + ": cannot determine file size");
    std::fseek(f.get(), 0, SEEK_SET);
    ResizeForBulkWrite(&out, static_cast<size_t>(size));
    if (size > 0 &&
        std::fread(out.data(), 1, out.size(), f.get()) != out.size()) {
      return Status::Corruption(path + ": short read");
    }
    return out;
  }
  // Sized once from the trailer's hint (one byte more, so that the read
  // that finds the end needs no growth), then in 1 MiB steps past it.
  const size_t hint = GzipSizeHint(f.get());
  f.reset();
  std::unique_ptr<gzFile_s, int (*)(gzFile)> gz(gzopen(path.c_str(), "rb"),
                                                &gzclose);
  if (!gz) return Status::NotFound(path + ": gzopen failed");
  gzbuffer(gz.get(), 1 << 17);
  constexpr size_t kChunk = 1 << 20;
  ResizeForBulkWrite(&out, hint + 1);
  size_t used = 0;
  for (;;) {
    if (used == out.size()) out.resize(used + kChunk);
    const size_t want = std::min(out.size() - used, size_t{1} << 30);
    int n = gzread(gz.get(), out.data() + used, static_cast<unsigned>(want));
    if (n < 0) {
      int errnum = 0;
      const char* msg = gzerror(gz.get(), &errnum);
      return Status::Corruption(
          path + ": gzip stream is damaged: " + (msg ? msg : "?"));
    }
    used += static_cast<size_t>(n);
    if (n == 0) break;
  }
  // A truncated gzip stream ends without error from gzread but leaves
  // Z_BUF_ERROR ("unexpected end of file") behind.
  int errnum = 0;
  const char* msg = gzerror(gz.get(), &errnum);
  if (errnum != Z_OK) {
    return Status::Corruption(
        path + ": gzip stream is truncated or damaged: " + (msg ? msg : "?"));
  }
  out.resize(used);
  return out;
}

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) |
         (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

bool FileExists(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f) std::fclose(f);
  return f != nullptr;
}

// First existing candidate among the usual MNIST file names.
StatusOr<std::string> FindFile(const std::string& dir,
                               const std::string& prefix,
                               const std::string& kind,
                               const std::string& idx) {
  const std::string base = dir + "/" + prefix + "-" + kind;
  const std::string candidates[] = {
      base + "-" + idx + "-ubyte.gz", base + "-" + idx + "-ubyte",
      base + "." + idx + "-ubyte.gz", base + "." + idx + "-ubyte"};
  for (const auto& c : candidates) {
    if (FileExists(c)) return c;
  }
  return Status::NotFound(candidates[0] +
                          ": not found (also tried without .gz and the '." +
                          idx + "-ubyte' spelling)");
}

}  // namespace

const char* SplitName(Split split) {
  return split == Split::kTrain ? "train" : "test";
}

StatusOr<IdxArray> ReadIdxFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadAllBytes(path));
  if (bytes.size() < 4) {
    return Status::Corruption(path + ": too short for an IDX header (" +
                              std::to_string(bytes.size()) + " bytes)");
  }
  if (bytes[0] != 0 || bytes[1] != 0) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "0x%02x%02x%02x%02x", bytes[0], bytes[1],
                  bytes[2], bytes[3]);
    return Status::Corruption(path + ": bad IDX magic " + buf +
                              " (expected 0x0000TTNN)");
  }
  const uint8_t type = bytes[2];
  const size_t ndims = bytes[3];
  if (type != kTypeUbyte) {
    return Status::Unimplemented(path + ": IDX element type " +
                                 std::to_string(type) +
                                 " not supported (only unsigned byte, 0x08)");
  }
  if (ndims == 0 || ndims > kMaxDims) {
    return Status::Corruption(path + ": bad IDX dimension count " +
                              std::to_string(ndims));
  }
  const size_t header = 4 + 4 * ndims;
  if (bytes.size() < header) {
    return Status::Corruption(path + ": truncated IDX header");
  }
  IdxArray out;
  uint64_t total = 1;
  for (size_t i = 0; i < ndims; ++i) {
    uint32_t d = BigEndian32(bytes.data() + 4 + 4 * i);
    out.dims.push_back(d);
    total *= d;
    if (total > (uint64_t{1} << 40))
      return Status::Corruption(path + ": absurd IDX dimensions");
  }
  const uint64_t payload = bytes.size() - header;
  if (payload < total) {
    return Status::Corruption(
        path + ": truncated: header promises " + std::to_string(total) +
        " data bytes, file holds " + std::to_string(payload));
  }
  if (payload > total) {
    return Status::Corruption(path + ": " + std::to_string(payload - total) +
                              " unexpected trailing bytes after the IDX data");
  }
  // The data stays in the buffer it was read into, moved down over the
  // header (no second allocation of a file's size).
  bytes.erase(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(header));
  out.data = std::move(bytes);
  return out;
}

StatusOr<Dataset> LoadMnist(const std::string& dir, Split split,
                            const MnistOptions& options) {
  if (!(options.stddev > 0.0f)) {
    return Status::InvalidArgument("MnistOptions.stddev must be > 0");
  }
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  ASSIGN_OR_RETURN(std::string image_path,
                   FindFile(dir, prefix, "images", "idx3"));
  ASSIGN_OR_RETURN(std::string label_path,
                   FindFile(dir, prefix, "labels", "idx1"));
  ASSIGN_OR_RETURN(IdxArray images, ReadIdxFile(image_path));
  ASSIGN_OR_RETURN(IdxArray labels, ReadIdxFile(label_path));
  if (images.dims.size() != 3) {
    return Status::Corruption(image_path +
                              ": images must have 3 dimensions, got " +
                              std::to_string(images.dims.size()));
  }
  if (images.dims[1] == 0 || images.dims[2] == 0 || images.dims[1] > 4096 ||
      images.dims[2] > 4096) {
    return Status::Corruption(image_path + ": bad image size " +
                              std::to_string(images.dims[1]) + "x" +
                              std::to_string(images.dims[2]));
  }
  if (labels.dims.size() != 1) {
    return Status::Corruption(label_path +
                              ": labels must have 1 dimension, got " +
                              std::to_string(labels.dims.size()));
  }
  if (images.dims[0] != labels.dims[0]) {
    return Status::Corruption(label_path + ": holds " +
                              std::to_string(labels.dims[0]) + " labels but " +
                              image_path + " holds " +
                              std::to_string(images.dims[0]) + " images");
  }
  if (images.dims[0] == 0)
    return Status::Corruption(image_path + ": no examples");
  Dataset ds;
  ds.num_examples = images.dims[0];
  ds.rows = static_cast<int>(images.dims[1]);
  ds.cols = static_cast<int>(images.dims[2]);
  for (int64_t i = 0; i < ds.num_examples; ++i) {
    if (labels.data[i] >= Dataset::kNumClasses) {
      return Status::Corruption(label_path + ": label " +
                                std::to_string(labels.data[i]) + " at index " +
                                std::to_string(i) + " is not in [0, " +
                                std::to_string(Dataset::kNumClasses) + ")");
    }
  }
  ds.labels = std::move(labels.data);
  // Lookup table: one float per byte value.
  float table[256];
  for (int v = 0; v < 256; ++v) {
    table[v] = (static_cast<float>(v) / 255.0f - options.mean) / options.stddev;
  }
  ResizeForBulkWrite(&ds.images, images.data.size());
  const uint8_t* src = images.data.data();
  float* dst = ds.images.data();
  for (size_t i = 0; i < images.data.size(); ++i) dst[i] = table[src[i]];
  return ds;
}

}  // namespace asyncps::worker
