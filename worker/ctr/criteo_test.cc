#include "worker/ctr/criteo.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <zlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "worker/ctr/planted.h"

namespace asyncps::worker::ctr {
namespace {

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("asyncps_ctr_" + std::to_string(getpid()) + "_" + name))
      .string();
}

// A line as the Kaggle train.txt has them: missing ints and cats, a
// negative int.
constexpr char kLine[] =
    "1\t1\t-"
    "1\t\t0\t1382\t4\t15\t2\t181\t1\t2\t\t2\t68fd1e64\t80e26c9b\tfb936136"
    "\t7b4723c4\t25c83c98\t7e0ccccf\tde7995b8\t1f89b562\ta73ee510\ta8cd5504"
    "\tb2cb9c98\t37c9c164\t2824a5f6\t1adce6ef\t8ba8b39a\t891b62e7\te5ba7672"
    "\tf54016b9\t21ddcdc9\tb1252a9d\t07b5194c\t\t3a171ecb\tc5c50484\te8b83407"
    "\t9727dd16";

TEST(CriteoTest, ParsesARealLine) {
  CriteoExample ex;
  ASSERT_TRUE(ParseCriteoLine(kLine, true, &ex).ok());
  EXPECT_EQ(ex.label, 1.0f);
  EXPECT_TRUE(ex.has_int(0));
  EXPECT_EQ(ex.ints[0], 1);
  EXPECT_EQ(ex.ints[1], -1);
  EXPECT_FALSE(ex.has_int(2));
  EXPECT_EQ(ex.ints[4], 1382);
  EXPECT_FALSE(ex.has_int(11));
  EXPECT_EQ(ex.cats[0], 0x68fd1e64u);
  EXPECT_EQ(ex.cats[25], 0x9727dd16u);
  EXPECT_FALSE(ex.has_cat(21));
  EXPECT_TRUE(ex.has_cat(22));
  // Round trip through the writer.
  EXPECT_EQ(FormatCriteoLine(ex), kLine);
  // Dense inputs: log1p of positive counts, 0 for missing or negative.
  EXPECT_FLOAT_EQ(CriteoDense(ex, 4), std::log1p(1382.0f));
  EXPECT_EQ(CriteoDense(ex, 1), 0.0f);
  EXPECT_EQ(CriteoDense(ex, 2), 0.0f);
  // Keys: per field; a missing value has a key of its own per field.
  EXPECT_NE(CriteoKey(21, ex), CriteoKey(20, ex));
  CriteoExample other = ex;
  other.cats[21] = 0;
  EXPECT_EQ(CriteoKey(21, ex), CriteoKey(21, other));
  other.cat_present |= 1u << 21;
  EXPECT_NE(CriteoKey(21, ex), CriteoKey(21, other));
  // The test file's format has no label; '\r' endings are accepted.
  std::string unlabeled = std::string(kLine).substr(2) + "\r";
  ASSERT_TRUE(ParseCriteoLine(unlabeled, false, &ex).ok());
  EXPECT_EQ(ex.cats[0], 0x68fd1e64u);
}

TEST(CriteoTest, BadLinesNameTheColumn) {
  CriteoExample ex;
  std::string line = kLine;
  auto with = [&](size_t col, const std::string& v) {
    std::vector<std::string> f;
    size_t pos = 0;
    while (true) {
      size_t t = line.find('\t', pos);
      f.push_back(line.substr(pos, t == std::string::npos ? t : t - pos));
      if (t == std::string::npos) break;
      pos = t + 1;
    }
    f[col] = v;
    std::string s;
    for (size_t i = 0; i < f.size(); ++i) s += (i ? "\t" : "") + f[i];
    return s;
  };
  Status s = ParseCriteoLine(with(0, "2"), true, &ex);
  EXPECT_NE(s.message().find("column 1"), std::string::npos) << s.ToString();
  s = ParseCriteoLine(with(3, "12x"), true, &ex);
  EXPECT_NE(s.message().find("column 4"), std::string::npos) << s.ToString();
  s = ParseCriteoLine(with(3, "99999999999"), true, &ex);
  EXPECT_NE(s.message().find("32-bit"), std::string::npos) << s.ToString();
  s = ParseCriteoLine(with(20, "zz"), true, &ex);
  EXPECT_NE(s.message().find("column 21"), std::string::npos) << s.ToString();
  s = ParseCriteoLine(with(20, "123456789"), true, &ex);
  EXPECT_NE(s.message().find("8 hex"), std::string::npos) << s.ToString();
  s = ParseCriteoLine("1\t2\t3", true, &ex);
  EXPECT_NE(s.message().find("3 tab-separated columns, expected 40"),
            std::string::npos)
      << s.ToString();
  s = ParseCriteoLine(line + "\textra", true, &ex);
  EXPECT_NE(s.message().find("more than 40"), std::string::npos);
  // A 40-column line read as the 39-column test format.
  EXPECT_FALSE(ParseCriteoLine(line, false, &ex).ok());
}

TEST(CriteoTest, ReaderSplitsFilesBetweenWorkersPlainAndGzip) {
  PlantedOptions po;
  po.vocab = 1000;
  PlantedModel model(po);
  for (const std::string name : {"data.txt", "data.txt.gz"}) {
    const std::string path = TempPath(name);
    ASSERT_TRUE(WritePlantedFile(path, 1001, model, 7).ok());
    auto all = LoadCriteo(path);
    ASSERT_TRUE(all.ok()) << all.status().ToString();
    ASSERT_EQ(all->size(), 1001u);
    // Three workers see every line exactly once, by stride.
    size_t total = 0;
    for (int r = 0; r < 3; ++r) {
      CriteoReaderOptions o;
      o.rank = r;
      o.num_workers = 3;
      auto part = LoadCriteo(path, o);
      ASSERT_TRUE(part.ok());
      total += part->size();
      for (size_t i = 0; i < part->size(); ++i) {
        ASSERT_EQ(FormatCriteoLine((*part)[i]),
                  FormatCriteoLine((*all)[i * 3 + r]));
      }
    }
    EXPECT_EQ(total, 1001u);
    // Batches, max_examples and rewinding.
    CriteoReaderOptions o;
    o.max_examples = 250;
    auto reader = CriteoReader::Open(path, o);
    ASSERT_TRUE(reader.ok());
    std::vector<CriteoExample> got;
    EXPECT_EQ(*(*reader)->Read(100, &got), 100u);
    EXPECT_EQ(*(*reader)->Read(1000, &got), 150u);
    EXPECT_EQ(*(*reader)->Read(1000, &got), 0u);
    ASSERT_TRUE((*reader)->Rewind().ok());
    got.clear();
    EXPECT_EQ(*(*reader)->Read(10, &got), 10u);
    EXPECT_EQ(FormatCriteoLine(got[3]), FormatCriteoLine((*all)[3]));
    std::filesystem::remove(path);
  }
}

TEST(CriteoTest, ReaderErrorsNameFileAndLine) {
  const std::string path = TempPath("bad.txt");
  {
    std::ofstream f(path);
    f << kLine << "\n"
      << kLine << "\n"
      << "1\tgarbage\n";
  }
  auto r = LoadCriteo(path);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(path + ":3:"), std::string::npos)
      << r.status().ToString();
  {
    std::ofstream f(path);
    f << kLine << "\n" << std::string(100000, '1') << "\n";
  }
  r = LoadCriteo(path);
  EXPECT_NE(r.status().message().find(":2: line longer than"),
            std::string::npos)
      << r.status().ToString();
  std::filesystem::remove(path);
  EXPECT_EQ(LoadCriteo(path).status().code(), StatusCode::kNotFound);
  CriteoReaderOptions o;
  o.rank = 3;
  o.num_workers = 2;
  EXPECT_EQ(CriteoReader::Open(path, o).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(PlantedTest, ZipfFrequenciesFollowThePowerLaw) {
  ZipfSampler z(1000000, 1.1);
  std::mt19937_64 rng(1);
  std::map<uint64_t, int> count;
  const int n = 400000;
  for (int i = 0; i < n; ++i) {
    uint64_t r = z(rng);
    ASSERT_GE(r, 1u);
    ASSERT_LE(r, 1000000u);
    if (r <= 4) ++count[r];
  }
  double h = 0;  // generalised harmonic number H(1e6, 1.1)
  for (int k = 1; k <= 1000000; ++k) h += std::pow(k, -1.1);
  for (uint64_t r = 1; r <= 4; ++r) {
    const double want = n * std::pow(r, -1.1) / h;
    EXPECT_NEAR(count[r], want, 5 * std::sqrt(want)) << "rank " << r;
  }
}

TEST(PlantedTest, GeneratedDataHasKnownOptimum) {
  PlantedOptions po;
  po.vocab = 100000;
  PlantedModel model(po);
  const std::string path = TempPath("planted.txt");
  auto st = WritePlantedFile(path, 20000, model, 3);
  ASSERT_TRUE(st.ok());
  EXPECT_GT(st->click_rate, 0.15);
  EXPECT_LT(st->click_rate, 0.45);
  // The planted p(x) separates clicks: better than the constant predictor.
  const double c = st->click_rate;
  const double constant = -(c * std::log(c) + (1 - c) * std::log(1 - c));
  EXPECT_LT(st->bayes_logloss, constant - 0.03);
  EXPECT_NEAR(st->bayes_logloss_sample, st->bayes_logloss, 0.02);
  EXPECT_GT(st->bayes_auc, 0.7);
  // p(x) is a function of the features alone: re-reading gives the same.
  auto ex = LoadCriteo(path);
  ASSERT_TRUE(ex.ok());
  std::mt19937_64 rng(3);
  CriteoExample first;
  const double p = model.SampleFeatures(rng, &first);
  EXPECT_EQ(FormatCriteoLine(first, false), FormatCriteoLine((*ex)[0], false));
  EXPECT_DOUBLE_EQ(model.Probability((*ex)[0]), p);
  std::filesystem::remove(path);
}

TEST(PlantedTest, AucCountsTiesHalf) {
  EXPECT_DOUBLE_EQ(Auc({0.1f, 0.2f, 0.3f, 0.4f}, {0, 0, 1, 1}), 1.0);
  EXPECT_DOUBLE_EQ(Auc({0.4f, 0.3f, 0.2f, 0.1f}, {0, 0, 1, 1}), 0.0);
  EXPECT_DOUBLE_EQ(Auc({0.5f, 0.5f, 0.5f, 0.5f}, {0, 1, 0, 1}), 0.5);
  EXPECT_DOUBLE_EQ(Auc({0.1f, 0.5f, 0.5f, 0.9f}, {0, 0, 1, 1}), 0.875);
}

}  // namespace
}  // namespace asyncps::worker::ctr
