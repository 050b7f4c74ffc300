// ps_hostile_fuzz: sends structure-aware hostile requests (see
// tests/fuzz/hostile_requests.h) to one ps_server shard and prints a JSON
// report: sent, answered, unanswered within the deadline, reply codes,
// message shapes. Exit 0 when every request was answered in time.
//
//   ps_hostile_fuzz --server=tcp://127.0.0.1:5555 --messages=1000000
//       --layers=784,256,128,10 --num_workers=2 --curve_server_key=server.pub
//       [--tables=emb:8]
//
// The model flags must describe what the workers register (the generator
// takes valid chunk ids and sizes from its layout). Used by
// experiments/chaos/hostile_soak.py.
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "tests/fuzz/hostile_requests.h"
#include "worker/model.h"

DEFINE_string(server, "", "endpoint of the shard to fuzz");
DEFINE_int32(shard_id, 0, "index of that shard");
DEFINE_int32(num_shards, 1, "shards of the deployment");
DEFINE_int64(messages, 100000, "hostile requests to send");
DEFINE_uint64(seed, 1, "generator seed");
DEFINE_int32(window, 64, "requests in flight");
DEFINE_int64(deadline_ms, 10000, "a request not answered this long is a hang");
DEFINE_string(layers, "784,256,128,10", "the workers' MLP layers");
DEFINE_uint64(model_seed, 1, "the workers' --seed");
DEFINE_int64(chunk_elems, 1 << 20, "the workers' --chunk_elems");
DEFINE_int32(num_workers, 1, "the shard's --num_workers");
DEFINE_string(tables, "",
              "the workers' sparse tables as name:dim,... (row refs are "
              "fuzzed too; keys are routed by name)");
DEFINE_bool(admin, true,
            "also send checkpoint and shutdown (only against a shard that "
            "must refuse them: CURVE with admin keys the fuzzer lacks)");
DEFINE_string(curve_server_key, "", "the shard's CURVE public key (file/Z85)");
DEFINE_string(curve_secret_key, "", "the fuzzer's CURVE secret key");
DEFINE_string(report, "", "also write the JSON report here");

int main(int argc, char** argv) {
  using namespace asyncps;  // NOLINT: tool main
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  auto fail = [](const std::string& m) {
    std::fprintf(stderr, "ps_hostile_fuzz: %s\n", m.c_str());
    return 2;
  };
  if (FLAGS_server.empty()) return fail("--server is required");
  StatusOr<std::vector<int>> layers = worker::ParseLayers(FLAGS_layers);
  if (!layers.ok()) return fail(layers.status().ToString());
  const std::vector<TensorSpec> tensors =
      worker::MlpTensorSpecs(*layers, FLAGS_model_seed);
  LayoutOptions lo;
  lo.num_shards = FLAGS_num_shards;
  lo.chunk_elems = static_cast<size_t>(FLAGS_chunk_elems);
  StatusOr<Layout> layout = Layout::Create(tensors, lo);
  if (!layout.ok()) return fail(layout.status().ToString());
  fuzz::DriverOptions o;
  o.endpoint = FLAGS_server;
  o.window = FLAGS_window;
  o.deadline = std::chrono::milliseconds(FLAGS_deadline_ms);
  if (!FLAGS_curve_server_key.empty()) {
    StatusOr<std::string> k = LoadCurveKey(FLAGS_curve_server_key);
    if (!k.ok()) return fail(k.status().ToString());
    o.transport.curve_server_key = *k;
    if (!FLAGS_curve_secret_key.empty()) {
      StatusOr<std::string> s = LoadCurveKey(FLAGS_curve_secret_key);
      if (!s.ok()) return fail(s.status().ToString());
      o.transport.curve_secret_key = *s;
    }
  }
  StatusOr<std::unique_ptr<fuzz::HostileDriver>> driver =
      fuzz::HostileDriver::Create(o);
  if (!driver.ok()) return fail(driver.status().ToString());
  std::vector<TableSpec> tables;
  std::stringstream list(FLAGS_tables);
  for (std::string item; std::getline(list, item, ',');) {
    const size_t colon = item.find(':');
    TableSpec t;
    t.name = item.substr(0, colon);
    if (colon != std::string::npos)
      t.dim = static_cast<uint32_t>(
          std::strtoul(item.c_str() + colon + 1, nullptr, 10));
    if (Status v = t.Validate(); !v.ok())
      return fail("--tables: " + v.ToString());
    tables.push_back(t);
  }
  fuzz::HostileGenerator gen(*layout, tensors, FLAGS_shard_id,
                             FLAGS_num_workers, FLAGS_admin, FLAGS_seed,
                             tables);
  const auto start = std::chrono::steady_clock::now();
  Status s = (*driver)->Run(gen, FLAGS_messages, [&] {
    const auto& r = (*driver)->report();
    if (r.sent % 100000 == 0 && r.sent > 0) {
      std::fprintf(stderr, "ps_hostile_fuzz: %lld sent, %lld answered\n",
                   static_cast<long long>(r.sent),
                   static_cast<long long>(r.answered));
    }
    return true;
  });
  if (!s.ok()) return fail(s.ToString());
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  const fuzz::DriverReport& r = (*driver)->report();
  std::string json = r.ToJson();
  json.insert(json.size() - 1, ",\"seconds\":" + std::to_string(secs));
  std::printf("%s\n", json.c_str());
  if (!FLAGS_report.empty()) std::ofstream(FLAGS_report) << json << "\n";
  return r.unanswered == 0 && r.answered == r.sent ? 0 : 1;
}
