#include "worker/idx_reader.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace asyncps::worker {
namespace {

namespace fs = std::filesystem;
const char kFashionDir[] = "/usr/share/datasets/fashion-mnist";

bool HaveFashion() {
  return fs::exists(std::string(kFashionDir) + "/t10k-labels-idx1-ubyte.gz");
}

std::vector<uint8_t> Header(uint8_t ndims, std::vector<uint32_t> dims) {
  std::vector<uint8_t> h = {0, 0, 0x08, ndims};
  for (uint32_t d : dims) {
    h.push_back(d >> 24), h.push_back(d >> 16), h.push_back(d >> 8),
        h.push_back(d);
  }
  return h;
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/idx_reader_test.XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }
  void WriteRaw(const std::string& name,
                const std::vector<uint8_t>& bytes) const {
    std::ofstream f(path_ + "/" + name, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  void WriteGz(const std::string& name,
               const std::vector<uint8_t>& bytes) const {
    gzFile gz = gzopen((path_ + "/" + name).c_str(), "wb");
    gzwrite(gz, bytes.data(), bytes.size());
    gzclose(gz);
  }

 private:
  std::string path_;
};

// A tiny valid dataset: n images of 2x3 and n labels.
void WriteTiny(const TempDir& d, int n, bool gz, int label_count = -1,
               uint8_t bad_label = 0) {
  auto img = Header(3, {uint32_t(n), 2, 3});
  for (int i = 0; i < n * 6; ++i) img.push_back(static_cast<uint8_t>(i * 10));
  auto lab = Header(1, {uint32_t(label_count < 0 ? n : label_count)});
  for (int i = 0; i < (label_count < 0 ? n : label_count); ++i)
    lab.push_back(i % 10);
  if (bad_label) lab.back() = bad_label;
  if (gz) {
    d.WriteGz("train-images-idx3-ubyte.gz", img);
    d.WriteGz("train-labels-idx1-ubyte.gz", lab);
  } else {
    d.WriteRaw("train-images-idx3-ubyte", img);
    d.WriteRaw("train-labels-idx1-ubyte", lab);
  }
}

TEST(IdxReaderTest, LoadsFashionMnist) {
  if (!HaveFashion()) GTEST_SKIP() << "Fashion-MNIST not installed";
  auto train = LoadMnist(kFashionDir, Split::kTrain);
  ASSERT_TRUE(train.ok()) << train.status().ToString();
  EXPECT_EQ(train->num_examples, 60000);
  EXPECT_EQ(train->rows, 28);
  EXPECT_EQ(train->cols, 28);
  EXPECT_EQ(train->images.size(), 60000u * 784);
  auto test = LoadMnist(kFashionDir, Split::kTest);
  ASSERT_TRUE(test.ok()) << test.status().ToString();
  EXPECT_EQ(test->num_examples, 10000);
  // Balanced classes, pixels in [0, 1] with a plausible mean.
  std::vector<int> counts(10);
  for (uint8_t l : test->labels) counts[l]++;
  for (int c : counts) EXPECT_EQ(c, 1000);
  double sum = 0;
  for (float v : train->images) {
    ASSERT_GE(v, 0.0f);
    ASSERT_LE(v, 1.0f);
    sum += v;
  }
  EXPECT_NEAR(sum / train->images.size(), 0.286, 0.01);
}

TEST(IdxReaderTest, NormalisationApplied) {
  TempDir d;
  WriteTiny(d, 2, false);
  MnistOptions o;
  o.mean = 0.5f;
  o.stddev = 0.25f;
  auto ds = LoadMnist(d.path(), Split::kTrain, o);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_FLOAT_EQ(ds->images[0], (0.0f - 0.5f) / 0.25f);
  EXPECT_FLOAT_EQ(ds->images[1], (10.0f / 255.0f - 0.5f) / 0.25f);
}

TEST(IdxReaderTest, RawAndGzipAgree) {
  TempDir a, b;
  WriteTiny(a, 5, false);
  WriteTiny(b, 5, true);
  auto ra = LoadMnist(a.path(), Split::kTrain);
  auto rb = LoadMnist(b.path(), Split::kTrain);
  ASSERT_TRUE(ra.ok()) << ra.status().ToString();
  ASSERT_TRUE(rb.ok()) << rb.status().ToString();
  EXPECT_EQ(ra->images, rb->images);
  EXPECT_EQ(ra->labels, rb->labels);
  EXPECT_EQ(ra->rows, 2);
  EXPECT_EQ(ra->cols, 3);
}

TEST(IdxReaderTest, MissingFileNamesIt) {
  TempDir d;
  auto r = LoadMnist(d.path(), Split::kTest);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("t10k-images-idx3-ubyte"),
            std::string::npos);
}

TEST(IdxReaderTest, TruncatedRawFile) {
  TempDir d;
  WriteTiny(d, 4, false);
  fs::resize_file(d.path() + "/train-images-idx3-ubyte", 16 + 10);
  auto r = LoadMnist(d.path(), Split::kTrain);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  EXPECT_NE(r.status().message().find("train-images-idx3-ubyte"),
            std::string::npos);
  EXPECT_NE(r.status().message().find("truncated"), std::string::npos);
}

TEST(IdxReaderTest, TruncatedGzipOfRealFile) {
  if (!HaveFashion()) GTEST_SKIP() << "Fashion-MNIST not installed";
  TempDir d;
  for (const char* name :
       {"t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
    fs::copy_file(std::string(kFashionDir) + "/" + name, d.path() + "/" + name);
  }
  const std::string img = d.path() + "/t10k-images-idx3-ubyte.gz";
  fs::resize_file(img, fs::file_size(img) / 2);
  auto r = LoadMnist(d.path(), Split::kTest);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption)
      << r.status().ToString();
  EXPECT_NE(r.status().message().find("t10k-images-idx3-ubyte.gz"),
            std::string::npos);
}

TEST(IdxReaderTest, WrongMagic) {
  TempDir d;
  WriteTiny(d, 3, false);
  auto bytes = Header(1, {3});
  bytes[0] = 0x12;
  bytes.insert(bytes.end(), {1, 2, 3});
  d.WriteRaw("train-labels-idx1-ubyte", bytes);
  auto r = LoadMnist(d.path(), Split::kTrain);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  EXPECT_NE(r.status().message().find("train-labels-idx1-ubyte"),
            std::string::npos);
  EXPECT_NE(r.status().message().find("magic"), std::string::npos);
}

TEST(IdxReaderTest, CountMismatch) {
  TempDir d;
  WriteTiny(d, 4, true, /*label_count=*/3);
  auto r = LoadMnist(d.path(), Split::kTrain);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  EXPECT_NE(r.status().message().find("3 labels"), std::string::npos)
      << r.status().ToString();
}

TEST(IdxReaderTest, LabelOutOfRange) {
  TempDir d;
  WriteTiny(d, 4, false, -1, /*bad_label=*/10);
  auto r = LoadMnist(d.path(), Split::kTrain);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("label 10"), std::string::npos)
      << r.status().ToString();
}

TEST(IdxReaderTest, WrongDimensions) {
  TempDir d;
  WriteTiny(d, 2, false);
  auto img = Header(2, {2, 6});
  img.resize(img.size() + 12);
  d.WriteRaw("train-images-idx3-ubyte", img);
  auto r = LoadMnist(d.path(), Split::kTrain);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("3 dimensions"), std::string::npos);
}

TEST(IdxReaderTest, TrailingBytes) {
  TempDir d;
  auto lab = Header(1, {2});
  lab.insert(lab.end(), {1, 2, 3});
  d.WriteRaw("x", lab);
  auto r = ReadIdxFile(d.path() + "/x");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
}

// The reader sizes its buffer from the gzip trailer (ISIZE), which holds the
// size of the last member only: a file of two members (valid gzip, as
// `cat a.gz b.gz` makes) announces less than it holds, and every byte past
// the hint must still be read, through several 1 MiB growth steps.
TEST(IdxReaderTest, GzipOfTwoMembersReadsPastItsSizeHint) {
  TempDir d;
  const uint32_t n = 3u << 20;
  auto bytes = Header(1, {n});
  for (uint32_t i = 0; i < n; ++i) bytes.push_back(static_cast<uint8_t>(i * 7));
  const size_t cut = bytes.size() - 100;  // the second member: 100 bytes
  const std::string path = d.path() + "/x.gz";
  for (int member = 0; member < 2; ++member) {
    gzFile gz = gzopen(path.c_str(), member == 0 ? "wb" : "ab");
    ASSERT_NE(gz, nullptr);
    const uint8_t* p = bytes.data() + (member == 0 ? 0 : cut);
    const size_t len = member == 0 ? cut : bytes.size() - cut;
    ASSERT_EQ(gzwrite(gz, p, static_cast<unsigned>(len)),
              static_cast<int>(len));
    ASSERT_EQ(gzclose(gz), Z_OK);
  }
  auto r = ReadIdxFile(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->dims, std::vector<uint32_t>{n});
  EXPECT_TRUE(std::equal(r->data.begin(), r->data.end(), bytes.begin() + 8,
                         bytes.end()));
  EXPECT_EQ(r->data.size(), size_t{n});
}

}  // namespace
}  // namespace asyncps::worker
