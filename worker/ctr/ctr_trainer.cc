#include "worker/ctr/ctr_trainer.h"

#include <glog/logging.h>

#include <cstdio>
#include <cstring>

#include "worker/ctr/planted.h"

namespace asyncps::worker::ctr {
namespace {

using SteadyClock = std::chrono::steady_clock;

double Seconds(SteadyClock::time_point a, SteadyClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

constexpr char kCsvHeader[] =
    "wall_s,rank,step,examples,train_loss,test_logloss,test_auc,"
    "pull_wait_ms\n";

}  // namespace

CtrTrainer::CtrTrainer(const CtrTrainerOptions& options, Client* client)
    : options_(options),
      client_(client),
      model_(options.factor_dim),
      dense_(ClickModel::kDenseParams, 0.0f) {}

CtrTrainer::~CtrTrainer() = default;

StatusOr<std::unique_ptr<CtrTrainer>> CtrTrainer::Create(
    const CtrTrainerOptions& options, Client* client) {
  if (options.batch < 1) return Status::InvalidArgument("batch must be >= 1");
  if (options.epochs < 1 && options.max_steps < 1)
    return Status::InvalidArgument("need epochs >= 1 or max_steps >= 1");
  if (options.factor_dim < 0 ||
      options.factor_dim >= static_cast<int>(kMaxRowDim)) {
    return Status::InvalidArgument("factor_dim out of range");
  }
  std::unique_ptr<CtrTrainer> t(new CtrTrainer(options, client));
  TableSpec table = t->model_.EmbeddingTable(options.row_optimizer,
                                             options.init_scale, options.seed);
  table.admit_after_pushes = options.admit_after_pushes;
  table.expire_after_clocks = options.expire_after_clocks;
  RETURN_IF_ERROR(
      client->RegisterModel({ClickModel::DenseSpec()}, LayoutOptions(), {table})
          .WithContext("registering the click model"));
  CriteoReaderOptions ro;
  ro.rank = options.rank;
  ro.num_workers = options.num_workers;
  ASSIGN_OR_RETURN(t->reader_, CriteoReader::Open(options.train_path, ro));
  if (!options.test_path.empty()) {
    CriteoReaderOptions to;
    to.max_examples = options.test_examples;
    ASSIGN_OR_RETURN(t->test_, LoadCriteo(options.test_path, to));
  }
  return t;
}

StatusOr<bool> CtrTrainer::NextBatch(std::vector<CriteoExample>* batch) {
  batch->clear();
  while (batch->empty()) {
    ASSIGN_OR_RETURN(size_t got, reader_->Read(options_.batch, batch));
    if (got > 0) break;
    if (++epoch_ >= options_.epochs) return false;
    RETURN_IF_ERROR(reader_->Rewind());
    ASSIGN_OR_RETURN(got, reader_->Read(options_.batch, batch));
    if (got == 0) {
      return Status::FailedPrecondition(reader_->path() +
                                        " has no examples for worker " +
                                        std::to_string(options_.rank));
    }
  }
  return true;
}

Status CtrTrainer::StartPull(int64_t clock,
                             const std::vector<CriteoExample>& batch,
                             std::vector<uint64_t>* keys,
                             std::vector<float>* rows, Client::Ticket* ticket) {
  const size_t n = batch.size() * kCriteoCats;
  keys->resize(n);
  rows->resize(n * model_.row_dim());
  ClickModel::Keys(batch.data(), batch.size(), keys->data());
  RowsPull pull;
  pull.table = 0;
  pull.keys = keys->data();
  pull.n = n;
  pull.out = rows->data();
  ASSIGN_OR_RETURN(*ticket,
                   client_->StartPullRows(clock, {dense_.data()}, {pull}));
  return Status::OK();
}

StatusOr<CtrEval> CtrTrainer::Evaluate(int64_t clock) {
  CtrEval e;
  if (test_.empty()) return e;
  const size_t chunk = 4096;
  std::vector<float> dense(ClickModel::kDenseParams), logits, scores, labels;
  std::vector<uint64_t> keys;
  std::vector<float> rows;
  scores.reserve(test_.size());
  labels.reserve(test_.size());
  double loss = 0;
  for (size_t off = 0; off < test_.size(); off += chunk) {
    const size_t n = std::min(chunk, test_.size() - off);
    keys.resize(n * kCriteoCats);
    rows.resize(keys.size() * model_.row_dim());
    ClickModel::Keys(test_.data() + off, n, keys.data());
    RowsPull pull{0, keys.data(), keys.size(), rows.data()};
    ASSIGN_OR_RETURN(Client::Ticket t,
                     client_->StartPullRows(clock, {dense.data()}, {pull}));
    RETURN_IF_ERROR(client_->Wait(t, options_.timeout));
    logits.resize(n);
    model_.Forward(test_.data() + off, n, dense.data(), rows.data(),
                   logits.data());
    loss += MeanLogLoss(logits.data(), test_.data() + off, n) * n;
    for (size_t i = 0; i < n; ++i) {
      scores.push_back(logits[i]);
      labels.push_back(test_[off + i].label);
    }
  }
  e.examples = static_cast<int64_t>(test_.size());
  e.logloss = loss / static_cast<double>(test_.size());
  e.auc = Auc(scores, labels);
  return e;
}

StatusOr<CtrResult> CtrTrainer::Run() {
  CtrResult res;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> csv(nullptr, &std::fclose);
  if (!options_.metrics_csv.empty()) {
    csv.reset(std::fopen(options_.metrics_csv.c_str(), "w"));
    if (!csv)
      return Status::Unavailable("cannot write " + options_.metrics_csv);
    std::fputs(kCsvHeader, csv.get());
  }
  const auto t0 = SteadyClock::now();
  double eval_s = 0, pull_wait_s = 0, loss_sum = 0;
  int64_t loss_steps = 0;
  std::vector<CriteoExample> cur, next;
  std::vector<uint64_t> keys, next_keys;
  std::vector<float> rows, next_rows, grads;
  std::vector<float> dense_grad(ClickModel::kDenseParams);
  ASSIGN_OR_RETURN(bool any, NextBatch(&cur));
  if (!any) return Status::FailedPrecondition("no training examples");
  Client::Ticket pull = 0;
  RETURN_IF_ERROR(StartPull(0, cur, &keys, &rows, &pull));
  const Layout& layout = client_->layout();
  for (int64_t c = 0;; ++c) {
    const auto w0 = SteadyClock::now();
    RETURN_IF_ERROR(client_->Wait(pull, options_.timeout)
                        .WithContext("pull of step " + std::to_string(c)));
    pull_wait_s += Seconds(w0, SteadyClock::now());
    grads.resize(rows.size());
    const double loss =
        model_.ForwardBackward(cur.data(), cur.size(), dense_.data(),
                               rows.data(), dense_grad.data(), grads.data());
    loss_sum += loss;
    ++loss_steps;
    // The dense gradient, chunk by chunk (raw fp32).
    std::vector<ChunkPayload> chunks;
    for (uint32_t id : layout.tensor_chunks(0)) {
      const ChunkSpec& spec = layout.chunks()[id];
      BufferPtr b = Buffer::Allocate(spec.num_elems * sizeof(float));
      std::memcpy(b->data(), dense_grad.data() + spec.offset,
                  spec.num_elems * sizeof(float));
      chunks.push_back(ChunkPayload{id, 0, Frame::Ref(b)});
    }
    RowsPush push{0, keys.data(), keys.size(), grads.data()};
    ASSIGN_OR_RETURN(Client::Ticket tp,
                     client_->StartPushRows(c, std::move(chunks), {push}));
    ASSIGN_OR_RETURN(Client::Ticket tc, client_->StartClock(c + 1));
    res.examples += static_cast<int64_t>(cur.size());
    ++steps_;
    bool more = options_.max_steps == 0 || steps_ < options_.max_steps;
    if (more) {
      ASSIGN_OR_RETURN(more, NextBatch(&next));
    }
    if (more) {
      RETURN_IF_ERROR(StartPull(c + 1, next, &next_keys, &next_rows, &pull));
    }
    RETURN_IF_ERROR(client_->Wait(tp, options_.timeout)
                        .WithContext("push of step " + std::to_string(c)));
    RETURN_IF_ERROR(client_->Wait(tc, options_.timeout));
    const bool last = !more;
    const bool log =
        last || (options_.log_every > 0 && steps_ % options_.log_every == 0);
    const bool eval =
        !test_.empty() && (last || (options_.eval_every > 0 &&
                                    steps_ % options_.eval_every == 0));
    CtrEval e;
    if (eval) {
      const auto e0 = SteadyClock::now();
      ASSIGN_OR_RETURN(e, Evaluate(c + 1));
      eval_s += Seconds(e0, SteadyClock::now());
      res.test = e;
    }
    if (log || eval) {
      res.final_train_loss = loss_sum / static_cast<double>(loss_steps);
      const double wall = Seconds(t0, SteadyClock::now());
      LOG(INFO) << "rank " << options_.rank << " step " << steps_
                << " examples " << res.examples << " train_loss "
                << res.final_train_loss
                << (eval ? " test_logloss " + std::to_string(e.logloss) +
                               " test_auc " + std::to_string(e.auc)
                         : std::string());
      if (csv) {
        std::fprintf(csv.get(), "%.3f,%d,%lld,%lld,%.6f,", wall, options_.rank,
                     static_cast<long long>(steps_),
                     static_cast<long long>(res.examples),
                     res.final_train_loss);
        if (eval) {
          std::fprintf(csv.get(), "%.6f,%.6f,", e.logloss, e.auc);
        } else {
          std::fputs(",,", csv.get());
        }
        std::fprintf(csv.get(), "%.1f\n", pull_wait_s * 1000);
        std::fflush(csv.get());
      }
      loss_sum = 0;
      loss_steps = 0;
    }
    if (last) break;
    cur.swap(next);
    keys.swap(next_keys);
    rows.swap(next_rows);
  }
  res.steps = steps_;
  res.wall_s = Seconds(t0, SteadyClock::now());
  res.pull_wait_s = pull_wait_s;
  const double train_s = res.wall_s - eval_s;
  res.examples_per_s =
      train_s > 0 ? static_cast<double>(res.examples) / train_s : 0;
  if (options_.print_summary) {
    std::printf(
        "SUMMARY rank=%d test_logloss=%.6f test_auc=%.6f examples_per_s=%.1f "
        "steps=%lld wall_s=%.2f\n",
        options_.rank, res.test.logloss, res.test.auc, res.examples_per_s,
        static_cast<long long>(res.steps), res.wall_s);
    std::fflush(stdout);
  }
  return res;
}

}  // namespace asyncps::worker::ctr
