#include "worker/ctr/criteo.h"

#include <zlib.h>

#include <charconv>
#include <cmath>
#include <cstring>

namespace asyncps::worker::ctr {
namespace {

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Status BadColumn(int col, std::string_view text, const char* what) {
  return Status::InvalidArgument("column " + std::to_string(col + 1) + " ('" +
                                 std::string(text.substr(0, 32)) +
                                 "'): " + what);
}

}  // namespace

Status ParseCriteoLine(std::string_view line, bool has_label,
                       CriteoExample* out) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  *out = CriteoExample{};
  const int want = (has_label ? 1 : 0) + kCriteoInts + kCriteoCats;
  int col = 0;
  size_t pos = 0;
  while (true) {
    const size_t tab = line.find('\t', pos);
    const std::string_view f =
        line.substr(pos, tab == std::string_view::npos ? std::string_view::npos
                                                       : tab - pos);
    if (col >= want) {
      return Status::InvalidArgument("more than " + std::to_string(want) +
                                     " tab-separated columns");
    }
    const int c = has_label ? col - 1 : col;
    if (has_label && col == 0) {
      if (f == "0") {
        out->label = 0.0f;
      } else if (f == "1") {
        out->label = 1.0f;
      } else {
        return BadColumn(col, f, "label must be 0 or 1");
      }
    } else if (c < kCriteoInts) {
      if (!f.empty()) {
        int64_t v = 0;
        auto r = std::from_chars(f.data(), f.data() + f.size(), v);
        if (r.ec != std::errc() || r.ptr != f.data() + f.size() ||
            v < INT32_MIN || v > INT32_MAX) {
          return BadColumn(col, f, "not a 32-bit integer");
        }
        out->ints[c] = static_cast<int32_t>(v);
        out->int_present |= static_cast<uint16_t>(1u << c);
      }
    } else {
      const int k = c - kCriteoInts;
      if (!f.empty()) {
        if (f.size() > 8) return BadColumn(col, f, "more than 8 hex digits");
        uint32_t v = 0;
        for (char ch : f) {
          const int d = HexDigit(ch);
          if (d < 0) return BadColumn(col, f, "not a hex value");
          v = (v << 4) | static_cast<uint32_t>(d);
        }
        out->cats[k] = v;
        out->cat_present |= 1u << k;
      }
    }
    ++col;
    if (tab == std::string_view::npos) break;
    pos = tab + 1;
  }
  if (col != want) {
    return Status::InvalidArgument(
        std::to_string(col) + " tab-separated columns, expected " +
        std::to_string(want) +
        (has_label ? " (label, 13 integers, 26 "
                     "categorical)"
                   : " (13 integers, 26 categorical)"));
  }
  return Status::OK();
}

std::string FormatCriteoLine(const CriteoExample& ex, bool with_label) {
  std::string s;
  s.reserve(256);
  if (with_label) s += ex.label > 0.5f ? '1' : '0';
  for (int i = 0; i < kCriteoInts; ++i) {
    if (with_label || i > 0) s += '\t';
    if (ex.has_int(i)) s += std::to_string(ex.ints[i]);
  }
  static const char kHex[] = "0123456789abcdef";
  for (int i = 0; i < kCriteoCats; ++i) {
    s += '\t';
    if (!ex.has_cat(i)) continue;
    for (int shift = 28; shift >= 0; shift -= 4) {
      s += kHex[(ex.cats[i] >> shift) & 0xf];
    }
  }
  return s;
}

float CriteoDense(const CriteoExample& ex, int i) {
  if (!ex.has_int(i) || ex.ints[i] <= 0) return 0.0f;
  return std::log1p(static_cast<float>(ex.ints[i]));
}

struct CriteoReader::File {
  gzFile gz = nullptr;
  ~File() {
    if (gz != nullptr) gzclose(gz);
  }
};

CriteoReader::CriteoReader(std::string path, const CriteoReaderOptions& o)
    : path_(std::move(path)), options_(o) {}

CriteoReader::~CriteoReader() = default;

StatusOr<std::unique_ptr<CriteoReader>> CriteoReader::Open(
    const std::string& path, const CriteoReaderOptions& options) {
  if (options.num_workers < 1 || options.rank < 0 ||
      options.rank >= options.num_workers) {
    return Status::InvalidArgument(
        "criteo reader: rank " + std::to_string(options.rank) + " not in [0, " +
        std::to_string(options.num_workers) + ")");
  }
  if (options.max_line_bytes < 128)
    return Status::InvalidArgument("max_line_bytes must be >= 128");
  std::unique_ptr<CriteoReader> r(new CriteoReader(path, options));
  RETURN_IF_ERROR(r->Rewind());
  return r;
}

Status CriteoReader::Rewind() {
  file_ = std::make_unique<File>();
  // gzopen reads plain files as they are and gzip files inflated.
  file_->gz = gzopen(path_.c_str(), "rb");
  if (file_->gz == nullptr) return Status::NotFound(path_ + ": cannot open");
  gzbuffer(file_->gz, 1 << 18);
  buf_.resize(options_.max_line_bytes + 2);
  line_ = 0;
  taken_ = 0;
  return Status::OK();
}

StatusOr<size_t> CriteoReader::Read(size_t n, std::vector<CriteoExample>* out) {
  size_t got = 0;
  while (got < n) {
    if (options_.max_examples > 0 && taken_ >= options_.max_examples) break;
    char* s = gzgets(file_->gz, buf_.data(), static_cast<int>(buf_.size()));
    if (s == nullptr) {
      int err = 0;
      const char* msg = gzerror(file_->gz, &err);
      if (err != Z_OK && err != Z_STREAM_END) {
        return Status::Corruption(path_ + ": read error after line " +
                                  std::to_string(line_) + ": " +
                                  (msg ? msg : "?"));
      }
      break;  // end of file
    }
    size_t len = std::strlen(s);
    const bool complete = len > 0 && s[len - 1] == '\n';
    if (!complete && !gzeof(file_->gz)) {
      return Status::InvalidArgument(
          path_ + ":" + std::to_string(line_ + 1) + ": line longer than " +
          std::to_string(options_.max_line_bytes) + " bytes");
    }
    if (complete) --len;
    ++line_;
    if (len == 0 && gzeof(file_->gz)) break;  // final newline
    if ((line_ - 1) % options_.num_workers != options_.rank) continue;
    CriteoExample ex;
    Status st =
        ParseCriteoLine(std::string_view(s, len), options_.has_label, &ex);
    if (!st.ok()) {
      return Status::InvalidArgument(path_ + ":" + std::to_string(line_) +
                                     ": " + st.message());
    }
    out->push_back(ex);
    ++got;
    ++taken_;
  }
  return got;
}

StatusOr<std::vector<CriteoExample>> LoadCriteo(
    const std::string& path, const CriteoReaderOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<CriteoReader> r,
                   CriteoReader::Open(path, options));
  std::vector<CriteoExample> all;
  while (true) {
    ASSIGN_OR_RETURN(size_t n, r->Read(1 << 16, &all));
    if (n == 0) break;
  }
  return all;
}

}  // namespace asyncps::worker::ctr
