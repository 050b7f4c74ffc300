// A planted click model that writes data in the Criteo format
// (worker/ctr/criteo.h) whose Bayes-optimal log loss and AUC are known.
//
// Features: each categorical field f draws a rank from a Zipf(s)
// distribution over `vocab` values (rejection-inversion sampling: O(1)
// memory, so vocabularies of 10^8 cost nothing) and writes the rank's
// 32-bit hash; a field is missing with probability missing_rate. Integer
// features are log-normal counts (missing with the same rate).
//
// Label: y ~ Bernoulli(sigmoid(logit)) with the factorization machine
//   logit = bias + sum_i d_i x_i + sum_f w_f + sum_{f<g} <v_f, v_g>
// where x_i = CriteoDense(ex, i), and w_f (scalar) and v_f (factor_dim
// floats) are drawn from N(0, linear_scale^2) and N(0, factor_scale^2) by a
// hash of (seed, field, value): a pure function, nothing stored. The
// model that knows these weights is Bayes-optimal: its expected log loss is
// the mean binary entropy of p(x), and its AUC is that of p(x).
//
// Thread safety: const methods are reentrant.
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "common/status.h"
#include "worker/ctr/criteo.h"

namespace asyncps::worker::ctr {

struct PlantedOptions {
  // Seed of the planted weights (the sample seed is separate). Default: 1.
  uint64_t seed = 1;
  // Distinct values of each categorical field. Default: 10^6.
  uint64_t vocab = 1000000;
  // Zipf exponent s > 0 of the values' frequencies. Default: 1.1.
  double zipf = 1.1;
  // Factor dimension of the planted FM, >= 0. Default: 4.
  int factor_dim = 4;
  // Standard deviations of the planted weights. Defaults: 0.2 (linear),
  // 0.12 (factors), 0.1 (dense).
  float linear_scale = 0.2f;
  float factor_scale = 0.12f;
  float dense_scale = 0.1f;
  // Intercept: sets the click rate (about 0.25 at -1.25). Default: -1.25.
  float bias = -1.25f;
  // Probability that a feature is missing. Default: 0.05.
  double missing_rate = 0.05;

  Status Validate() const;
};

// Zipf(s) over {1..n} by rejection-inversion (Hörmann and Derflinger 1996).
class ZipfSampler {
 public:
  ZipfSampler(uint64_t n, double s);
  uint64_t operator()(std::mt19937_64& rng) const;

 private:
  double H(double x) const;
  double HIntegral(double x) const;
  double HIntegralInverse(double x) const;
  uint64_t n_;
  double s_, h_x1_, h_n_, threshold_;
};

class PlantedModel {
 public:
  explicit PlantedModel(const PlantedOptions& options);

  // Draws the features of one example and returns p(click | features); the
  // label is left 0.
  double SampleFeatures(std::mt19937_64& rng, CriteoExample* ex) const;
  // p(click | features) of any example.
  double Probability(const CriteoExample& ex) const;
  const PlantedOptions& options() const { return options_; }

 private:
  // The planted row of (field, value): w then factor_dim factors.
  void Row(int field, const CriteoExample& ex, float* out) const;
  PlantedOptions options_;
  ZipfSampler zipf_;
  float dense_w_[kCriteoInts];
};

// What a generated file's labels allow at best.
struct PlantedStats {
  int64_t examples = 0;
  double click_rate = 0;
  // Mean binary entropy of p(x): the Bayes-optimal expected log loss.
  double bayes_logloss = 0;
  // Log loss of p(x) on the drawn labels (its realisation on this file).
  double bayes_logloss_sample = 0;
  // AUC of p(x) on the drawn labels.
  double bayes_auc = 0;
  std::string ToJson() const;
};

// Writes `n` examples (plain text, or gzip when path ends in .gz) drawn
// with sample seed `sample_seed`, and reports the Bayes-optimal figures.
StatusOr<PlantedStats> WritePlantedFile(const std::string& path, int64_t n,
                                        const PlantedModel& model,
                                        uint64_t sample_seed);

// Area under the ROC curve of scores against 0/1 labels (ties count half).
double Auc(const std::vector<float>& scores, const std::vector<float>& labels);

}  // namespace asyncps::worker::ctr
