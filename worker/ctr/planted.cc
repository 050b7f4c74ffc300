#include "worker/ctr/planted.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>

#include "common/hash.h"

namespace asyncps::worker::ctr {
namespace {

// log1p(x)/x and expm1(x)/x, accurate near 0.
double Helper1(double x) {
  return std::abs(x) > 1e-8 ? std::log1p(x) / x
                            : 1 - x * (0.5 - x * (1.0 / 3 - 0.25 * x));
}
double Helper2(double x) {
  return std::abs(x) > 1e-8 ? std::expm1(x) / x
                            : 1 + x * 0.5 * (1 + x / 3 * (1 + 0.25 * x));
}

// N(0, 1) from a 64-bit hash (Box-Muller on two 24-bit uniforms).
float Gaussian(uint64_t bits) {
  const float u1 = UnitFloat(bits), u2 = UnitFloat(bits << 24);
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
}

}  // namespace

Status PlantedOptions::Validate() const {
  if (vocab < 1) return Status::InvalidArgument("vocab must be >= 1");
  if (!(zipf > 0) || !std::isfinite(zipf))
    return Status::InvalidArgument("zipf must be > 0");
  if (factor_dim < 0 || factor_dim > 256)
    return Status::InvalidArgument("factor_dim must be in [0, 256]");
  if (!(missing_rate >= 0 && missing_rate < 1))
    return Status::InvalidArgument("missing_rate must be in [0, 1)");
  return Status::OK();
}

ZipfSampler::ZipfSampler(uint64_t n, double s) : n_(n), s_(s) {
  h_x1_ = HIntegral(1.5) - 1.0;
  h_n_ = HIntegral(static_cast<double>(n) + 0.5);
  threshold_ = 2.0 - HIntegralInverse(HIntegral(2.5) - H(2.0));
}

double ZipfSampler::H(double x) const { return std::exp(-s_ * std::log(x)); }

double ZipfSampler::HIntegral(double x) const {
  const double lx = std::log(x);
  return Helper2((1.0 - s_) * lx) * lx;
}

double ZipfSampler::HIntegralInverse(double x) const {
  double t = x * (1.0 - s_);
  if (t < -1.0) t = -1.0;
  return std::exp(Helper1(t) * x);
}

uint64_t ZipfSampler::operator()(std::mt19937_64& rng) const {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  while (true) {
    const double u = h_n_ + unit(rng) * (h_x1_ - h_n_);
    const double x = HIntegralInverse(u);
    double kf = std::floor(x + 0.5);
    if (kf < 1) kf = 1;
    if (kf > static_cast<double>(n_)) kf = static_cast<double>(n_);
    if (kf - x <= threshold_ || u >= HIntegral(kf + 0.5) - H(kf)) {
      return static_cast<uint64_t>(kf);
    }
  }
}

PlantedModel::PlantedModel(const PlantedOptions& options)
    : options_(options), zipf_(options.vocab, options.zipf) {
  for (int i = 0; i < kCriteoInts; ++i) {
    dense_w_[i] = options.dense_scale *
                  Gaussian(SplitMix64(options.seed ^ (0xd0ull + i)));
  }
}

void PlantedModel::Row(int field, const CriteoExample& ex, float* out) const {
  const uint64_t base =
      SplitMix64(options_.seed ^ SplitMix64(CriteoKey(field, ex)));
  out[0] = options_.linear_scale * Gaussian(SplitMix64(base));
  for (int k = 0; k < options_.factor_dim; ++k) {
    out[1 + k] = options_.factor_scale * Gaussian(SplitMix64(base + 1 + k));
  }
}

double PlantedModel::Probability(const CriteoExample& ex) const {
  const int k = options_.factor_dim;
  double logit = options_.bias;
  for (int i = 0; i < kCriteoInts; ++i)
    logit += dense_w_[i] * CriteoDense(ex, i);
  std::vector<float> row(1 + k);
  std::vector<double> sum(k, 0.0), sq(k, 0.0);
  for (int f = 0; f < kCriteoCats; ++f) {
    Row(f, ex, row.data());
    logit += row[0];
    for (int j = 0; j < k; ++j) {
      sum[j] += row[1 + j];
      sq[j] += double{row[1 + j]} * row[1 + j];
    }
  }
  for (int j = 0; j < k; ++j) logit += 0.5 * (sum[j] * sum[j] - sq[j]);
  return 1.0 / (1.0 + std::exp(-logit));
}

double PlantedModel::SampleFeatures(std::mt19937_64& rng,
                                    CriteoExample* ex) const {
  *ex = CriteoExample{};
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (int i = 0; i < kCriteoInts; ++i) {
    if (unit(rng) < options_.missing_rate) continue;
    // Log-normal counts with a per-feature scale, as click-log counters.
    const double v = std::exp(0.8 + 0.15 * i + 1.1 * normal(rng)) - 1.0;
    ex->ints[i] = static_cast<int32_t>(std::min(v, 1e8));
    ex->int_present |= static_cast<uint16_t>(1u << i);
  }
  for (int f = 0; f < kCriteoCats; ++f) {
    if (unit(rng) < options_.missing_rate) continue;
    const uint64_t rank = zipf_(rng);
    ex->cats[f] = static_cast<uint32_t>(SplitMix64(
        options_.seed * 31 + (static_cast<uint64_t>(f) << 40) + rank));
    ex->cat_present |= 1u << f;
  }
  return Probability(*ex);
}

std::string PlantedStats::ToJson() const {
  nlohmann::json j;
  j["examples"] = examples;
  j["click_rate"] = click_rate;
  j["bayes_logloss"] = bayes_logloss;
  j["bayes_logloss_sample"] = bayes_logloss_sample;
  j["bayes_auc"] = bayes_auc;
  return j.dump();
}

double Auc(const std::vector<float>& scores, const std::vector<float>& labels) {
  const size_t n = scores.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  // Mann-Whitney U with mid-ranks for ties.
  double rank_sum = 0, pos = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && scores[order[j]] == scores[order[i]]) ++j;
    const double mid = 0.5 * static_cast<double>(i + 1 + j);  // 1-based
    for (size_t t = i; t < j; ++t) {
      if (labels[order[t]] > 0.5f) {
        rank_sum += mid;
        pos += 1;
      }
    }
    i = j;
  }
  const double neg = static_cast<double>(n) - pos;
  if (pos == 0 || neg == 0) return 0.5;
  return (rank_sum - pos * (pos + 1) / 2) / (pos * neg);
}

StatusOr<PlantedStats> WritePlantedFile(const std::string& path, int64_t n,
                                        const PlantedModel& model,
                                        uint64_t sample_seed) {
  RETURN_IF_ERROR(model.options().Validate());
  const bool gz =
      path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
  std::unique_ptr<gzFile_s, int (*)(gzFile)> zf(nullptr, &gzclose);
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(nullptr, &std::fclose);
  if (gz) {
    zf.reset(gzopen(path.c_str(), "wb6"));
  } else {
    f.reset(std::fopen(path.c_str(), "w"));
  }
  if (!zf && !f) return Status::Unavailable("cannot write " + path);
  std::mt19937_64 rng(sample_seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  PlantedStats st;
  std::vector<float> scores, labels;
  scores.reserve(n);
  labels.reserve(n);
  CriteoExample ex;
  for (int64_t i = 0; i < n; ++i) {
    const double p = model.SampleFeatures(rng, &ex);
    ex.label = unit(rng) < p ? 1.0f : 0.0f;
    std::string line = FormatCriteoLine(ex);
    line += '\n';
    const bool ok =
        gz ? gzwrite(zf.get(), line.data(),
                     static_cast<unsigned>(line.size())) ==
                 static_cast<int>(line.size())
           : std::fwrite(line.data(), 1, line.size(), f.get()) == line.size();
    if (!ok) return Status::Unavailable("writing " + path + " failed");
    const double pc = std::clamp(p, 1e-12, 1 - 1e-12);
    st.bayes_logloss += -(pc * std::log(pc) + (1 - pc) * std::log(1 - pc));
    st.bayes_logloss_sample +=
        ex.label > 0.5f ? -std::log(pc) : -std::log(1 - pc);
    st.click_rate += ex.label;
    scores.push_back(static_cast<float>(p));
    labels.push_back(ex.label);
  }
  if (gz) {
    if (gzclose(zf.release()) != Z_OK)
      return Status::Unavailable("closing " + path + " failed");
  } else if (std::fclose(f.release()) != 0) {
    return Status::Unavailable("closing " + path + " failed");
  }
  st.examples = n;
  if (n > 0) {
    st.bayes_logloss /= static_cast<double>(n);
    st.bayes_logloss_sample /= static_cast<double>(n);
    st.click_rate /= static_cast<double>(n);
  }
  st.bayes_auc = Auc(scores, labels);
  return st;
}

}  // namespace asyncps::worker::ctr
