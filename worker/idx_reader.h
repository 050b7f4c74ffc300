// Reader for IDX files (the MNIST container format) and MNIST-style datasets.
//
// An IDX file is a big-endian header {0, 0, type, ndims} followed by ndims
// uint32 dimension sizes and the row-major data. Files may be gzip-compressed
// (detected by the 0x1f8b magic) or raw. Only unsigned-byte data (type 0x08)
// is supported, which is what every MNIST-format dataset uses.
//
// LoadMnist() reads `<split>-images-idx3-ubyte[.gz]` and
// `<split>-labels-idx1-ubyte[.gz]` from a directory (the original LeCun names
// `<split>-images.idx3-ubyte` are accepted too) and validates them against
// each other; every error names the offending file.
//
// Dataset is a plain value type; the functions here are thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace asyncps::worker {

// Raw contents of one IDX file.
struct IdxArray {
  std::vector<uint32_t> dims;  // e.g. {60000, 28, 28}
  std::vector<uint8_t> data;   // product(dims) bytes, row-major
};

// Reads and validates one IDX file (gzip or raw). Errors: NotFound when the
// file cannot be opened, Corruption for a bad magic, a truncated or oversized
// payload or a broken gzip stream, Unimplemented for non-ubyte element types.
StatusOr<IdxArray> ReadIdxFile(const std::string& path);

// Images as float rows plus their class labels.
struct Dataset {
  int64_t num_examples = 0;
  int rows = 0;  // image height, e.g. 28
  int cols = 0;  // image width, e.g. 28
  // num_examples x dim() floats, row-major. Pixel values are scaled to
  // [0, 1] and then standardised as (x - mean) / stddev (see MnistOptions).
  std::vector<float> images;
  std::vector<uint8_t> labels;  // num_examples values, each < kNumClasses

  static constexpr int kNumClasses = 10;
  int dim() const { return rows * cols; }
  const float* image(int64_t i) const { return images.data() + i * dim(); }
};

enum class Split { kTrain, kTest };

// Fashion-MNIST's train-set pixel statistics (after scaling to [0, 1]), for
// MnistOptions.
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStddev = 0.3530f;

struct MnistOptions {
  // Pixels are mapped to (p / 255 - mean) / stddev. Default: mean 0,
  // stddev 1 (plain [0, 1] scaling). Fashion-MNIST's train-set statistics
  // are mean 0.2860, stddev 0.3530.
  float mean = 0.0f;
  float stddev = 1.0f;
};

// Loads one split of an MNIST-format dataset from `dir`. Checks that images
// are 3-d, labels 1-d, the counts agree and every label is < kNumClasses.
StatusOr<Dataset> LoadMnist(const std::string& dir, Split split,
                            const MnistOptions& options = {});

// "train" or "test".
const char* SplitName(Split split);

}  // namespace asyncps::worker
