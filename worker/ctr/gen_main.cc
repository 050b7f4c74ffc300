// ps_criteo_gen: writes train and test files in the Criteo display-
// advertising format from a planted click model (worker/ctr/planted.h), and
// a JSON file with the Bayes-optimal log loss and AUC of each.
//
//   ps_criteo_gen --train=/tmp/ctr/train.txt --test=/tmp/ctr/test.txt
//       --train_examples=2000000 --test_examples=200000 --vocab=10000000
//       --stats_json=/tmp/ctr/planted.json
#include <gflags/gflags.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/tool_main.h"
#include "worker/ctr/planted.h"

DEFINE_string(train, "", "training file to write (.gz: gzip)");
DEFINE_string(test, "", "test file to write (.gz: gzip)");
DEFINE_int64(train_examples, 1000000, "examples in the training file");
DEFINE_int64(test_examples, 100000, "examples in the test file");
DEFINE_uint64(seed, 1, "seed of the planted weights");
DEFINE_uint64(vocab, 1000000, "distinct values per categorical field");
DEFINE_double(zipf, 1.1, "Zipf exponent of the values' frequencies");
DEFINE_int32(factor_dim, 4, "factor dimension of the planted FM");
DEFINE_double(missing_rate, 0.05, "probability that a feature is missing");
DEFINE_string(stats_json, "", "where to write the Bayes-optimal figures");

int main(int argc, char** argv) {
  asyncps::InitTool("ps_criteo_gen: Criteo-format data from a planted model",
                    &argc, &argv);
  using namespace asyncps::worker::ctr;  // NOLINT: tool main
  PlantedOptions o;
  o.seed = FLAGS_seed;
  o.vocab = FLAGS_vocab;
  o.zipf = FLAGS_zipf;
  o.factor_dim = FLAGS_factor_dim;
  o.missing_rate = FLAGS_missing_rate;
  if (auto s = o.Validate(); !s.ok()) {
    std::fprintf(stderr, "ps_criteo_gen: %s\n", s.message().c_str());
    return 2;
  }
  if (FLAGS_train.empty() && FLAGS_test.empty()) {
    std::fprintf(stderr, "ps_criteo_gen: give --train and/or --test\n");
    return 2;
  }
  PlantedModel model(o);
  nlohmann::json out;
  out["options"] = {{"seed", o.seed},
                    {"vocab", o.vocab},
                    {"zipf", o.zipf},
                    {"factor_dim", o.factor_dim},
                    {"missing_rate", o.missing_rate}};
  struct Part {
    const char* name;
    const std::string& path;
    int64_t n;
    uint64_t sample_seed;
  };
  for (const Part& p : {Part{"train", FLAGS_train, FLAGS_train_examples, 1001},
                        Part{"test", FLAGS_test, FLAGS_test_examples, 2002}}) {
    if (p.path.empty()) continue;
    auto st = WritePlantedFile(p.path, p.n, model, p.sample_seed + o.seed);
    if (!st.ok()) {
      std::fprintf(stderr, "ps_criteo_gen: %s\n",
                   st.status().ToString().c_str());
      return 1;
    }
    out[p.name] = nlohmann::json::parse(st->ToJson());
    std::printf("%s: %s\n", p.name, st->ToJson().c_str());
  }
  if (!FLAGS_stats_json.empty()) {
    std::ofstream f(FLAGS_stats_json);
    f << out.dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "ps_criteo_gen: cannot write %s\n",
                   FLAGS_stats_json.c_str());
      return 1;
    }
  }
  return 0;
}
