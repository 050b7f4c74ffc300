#include "worker/evaluator.h"

#include <glog/logging.h>

#include <cstdio>
#include <memory>
#include <thread>

#include "worker/trainer.h"

namespace asyncps::worker {

StatusOr<EvaluatorResult> RunEvaluator(Client* client, Backend* backend,
                                       const Dataset& test,
                                       const EvaluatorOptions& options) {
  if (options.final_clock < 1)
    return Status::InvalidArgument("evaluator needs final_clock >= 1");
  if (client->options().rank != -1) {
    return Status::InvalidArgument(
        "the evaluator pulls as an observer: its client needs rank -1");
  }
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> csv(nullptr, &std::fclose);
  if (!options.metrics_csv.empty()) {
    csv.reset(std::fopen(options.metrics_csv.c_str(), "w"));
    if (!csv)
      return Status::InvalidArgument("cannot write " + options.metrics_csv);
    std::fprintf(csv.get(), "%s\n", kMetricsCsvHeader);
  }
  const Layout& layout = client->layout();
  std::vector<std::vector<float>> weights;
  std::vector<float*> ptrs;
  std::vector<const float*> cptrs;
  for (const TensorSpec& t : layout.tensors())
    weights.emplace_back(t.num_elements());
  for (auto& w : weights) ptrs.push_back(w.data()), cptrs.push_back(w.data());

  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto last_progress = start;
  int64_t last_clock = -1;
  EvaluatorResult result;
  while (true) {
    ASSIGN_OR_RETURN(Client::Ticket t, client->StartPull(0, ptrs));
    TicketResult tr;
    Status pulled = client->Wait(t, client->options().deadline, &tr);
    if (pulled.code() == StatusCode::kFailedPrecondition &&
        result.evaluations == 0) {
      // The workers have not registered the model yet: wait for them.
      if (Clock::now() - last_progress > options.stall_timeout) {
        return pulled.WithContext("evaluator: no worker registered the model");
      }
      std::this_thread::sleep_for(options.interval);
      continue;
    }
    RETURN_IF_ERROR(pulled.WithContext("evaluator pull"));
    RETURN_IF_ERROR(backend->SetParameters(cptrs));
    ASSIGN_OR_RETURN(EvalResult e,
                     backend->Evaluate(test.images.data(), test.labels.data(),
                                       test.num_examples));
    const double wall =
        std::chrono::duration<double>(Clock::now() - start).count();
    ++result.evaluations;
    result.final_test_acc = e.accuracy;
    result.final_test_loss = e.loss;
    result.final_clock = tr.min_clock;
    result.wall_s = wall;
    if (csv) {
      std::fprintf(csv.get(), "%.3f,-1,%lld,,,,%.4f,,,%llu,,,\n", wall,
                   static_cast<long long>(tr.min_clock), e.accuracy,
                   static_cast<unsigned long long>(tr.bytes_received));
      std::fflush(csv.get());
    }
    std::fprintf(
        stderr, "[eval] min clock %lld/%lld  test_acc %.4f  loss %.4f\n",
        static_cast<long long>(tr.min_clock),
        static_cast<long long>(options.final_clock), e.accuracy, e.loss);
    if (tr.min_clock >= options.final_clock) break;
    if (tr.min_clock != last_clock) {
      last_clock = tr.min_clock;
      last_progress = Clock::now();
    } else if (Clock::now() - last_progress > options.stall_timeout) {
      return Status::TimedOut(
          "training made no progress for " +
          std::to_string(options.stall_timeout.count() / 1000) +
          " s (min clock " + std::to_string(tr.min_clock) + ")");
    }
    std::this_thread::sleep_for(options.interval);
  }
  std::printf(
      "SUMMARY rank=-1 role=eval final_test_acc=%.4f evaluations=%d "
      "min_clock=%lld wall_s=%.3f\n",
      result.final_test_acc, result.evaluations,
      static_cast<long long>(result.final_clock), result.wall_s);
  std::fflush(stdout);
  return result;
}

}  // namespace asyncps::worker
