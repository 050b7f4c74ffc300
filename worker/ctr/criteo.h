// Criteo display-advertising data: the text format of the Kaggle Display
// Advertising Challenge (train.txt, test.txt) and of the Criteo 1TB click
// logs (day_0 ... day_23, gzip).
//
// One example per line, tab-separated:
//   <label> <I1> ... <I13> <C1> ... <C26>
// label is 0 or 1 (absent in the Kaggle test.txt: 39 columns); I1..I13 are
// integer counts (may be empty = missing, and a few are negative); C1..C26
// are categorical values hashed to 32 bits, written as 8 hex digits (may be
// empty = missing). A trailing '\r' is accepted.
//
// CriteoReader streams a file (plain or gzip, detected by zlib) and gives
// each of `num_workers` workers every num_workers-th line starting at its
// rank, so workers share one file without splitting it first. Errors name
// the file and the line.
//
// Thread safety: CriteoReader is used by one thread; the free functions are
// reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace asyncps::worker::ctr {

inline constexpr int kCriteoInts = 13;
inline constexpr int kCriteoCats = 26;

struct CriteoExample {
  float label = 0.0f;  // 0 or 1
  int32_t ints[kCriteoInts] = {};
  uint16_t int_present = 0;  // bit i: I(i+1) present
  uint32_t cats[kCriteoCats] = {};
  uint32_t cat_present = 0;  // bit i: C(i+1) present

  bool has_int(int i) const { return (int_present >> i) & 1; }
  bool has_cat(int i) const { return (cat_present >> i) & 1; }
};

// Parses one line (without the newline). InvalidArgument naming the column
// on a wrong column count, a label other than 0/1, a malformed or
// out-of-range integer, or a categorical value that is not 1-8 hex digits.
Status ParseCriteoLine(std::string_view line, bool has_label,
                       CriteoExample* out);

// Formats an example as a line of the format (no newline), as the
// Kaggle files write it: missing features are empty, hex in lower case.
std::string FormatCriteoLine(const CriteoExample& ex, bool with_label = true);

// The sparse key of categorical field `field` (0..25) of an example: the
// 32-bit value and the field (missing values get a key of their own per
// field), so equal values in different fields are different rows.
inline uint64_t CriteoKey(int field, const CriteoExample& ex) {
  const uint64_t f = static_cast<uint64_t>(field) << 33;
  return ex.has_cat(field) ? (f | ex.cats[field]) : (f | (uint64_t{1} << 32));
}

// The dense input of integer feature `i`: log(1 + max(v, 0)), 0 if missing.
float CriteoDense(const CriteoExample& ex, int i);

struct CriteoReaderOptions {
  // Lines carry a label (train files). False: the 39-column test file; every
  // label reads 0. Default: true.
  bool has_label = true;
  // This worker takes lines rank, rank + num_workers, ... (0-based).
  // Default: 0 of 1.
  int rank = 0;
  int num_workers = 1;
  // Stop after this many of this worker's examples; 0 = whole file.
  // Default: 0.
  int64_t max_examples = 0;
  // Longest line accepted, bytes (real lines are ~150-400). Default: 64 KiB.
  size_t max_line_bytes = size_t{64} << 10;
};

class CriteoReader {
 public:
  // NotFound when the file cannot be opened; InvalidArgument for bad options.
  static StatusOr<std::unique_ptr<CriteoReader>> Open(
      const std::string& path, const CriteoReaderOptions& options);
  ~CriteoReader();

  // Appends up to n of this worker's examples to *out; returns how many (0
  // at the end of the file or of max_examples). Corruption for a damaged
  // gzip stream, InvalidArgument for a bad line (with its number).
  StatusOr<size_t> Read(size_t n, std::vector<CriteoExample>* out);
  // Back to the first line (next epoch).
  Status Rewind();
  // Lines read so far (all workers' lines, 1-based number of the last).
  int64_t line() const { return line_; }
  const std::string& path() const { return path_; }

 private:
  CriteoReader(std::string path, const CriteoReaderOptions& options);
  struct File;
  std::string path_;
  CriteoReaderOptions options_;
  std::unique_ptr<File> file_;
  std::vector<char> buf_;
  int64_t line_ = 0;
  int64_t taken_ = 0;
};

// Reads this worker's share of a whole file (test sets).
StatusOr<std::vector<CriteoExample>> LoadCriteo(
    const std::string& path, const CriteoReaderOptions& options = {});

}  // namespace asyncps::worker::ctr
