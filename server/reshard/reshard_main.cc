// ps_reshard: restores a checkpoint of S shards onto S' shards, offline
// (server/reshard/reshard.h says what is copied and how the state is merged).
//
//   ps_reshard --from=run/shard0.db,run/shard1.db,run/shard2.db
//              --to=new/shard0.db,new/shard1.db [--dry_run]
//
// --from: the RocksDB stores of every shard, in shard order (stop the
// fleet first: each is opened as ps_server opens it, rolled back to its
// last checkpoint). --to: new directories, missing or empty. Then start S'
// servers with --num_shards=S' and --db_path=new/shard<j>.db (shard j).
//
// Prints one JSON line: {"ok":..,"from_shards":..,"to_shards":..,
// "chunks":..,"chunk_records":..,"rows":..,"expired_rows":..,
// "chunks_per_shard":[..],"rows_per_shard":[..],"bytes_per_shard":[..]}
// or {"ok":false,"code":..,"message":..}. Exit status 0 on success, 1 on a
// refusal or failure, 2 on bad usage.
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/tool_main.h"
#include "server/reshard/reshard.h"
#include "server/store/store.h"

DEFINE_string(from, "",
              "comma-separated RocksDB store directories of the S source "
              "shards, in shard order");
DEFINE_string(to, "",
              "comma-separated new store directories of the S' destination "
              "shards, in shard order (missing or empty)");
DEFINE_bool(dry_run, false,
            "check the sources and destinations and print the plan; write "
            "nothing");
DEFINE_int64(batch_bytes, 16 << 20,
             "bytes of sparse rows per write batch of a destination");

namespace {

namespace fs = std::filesystem;
using asyncps::Status;
using asyncps::server::OpenRocksDbStore;
using asyncps::server::RocksDbStoreOptions;
using asyncps::server::Store;

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

int Fail(const Status& s) {
  nlohmann::json j;
  j["ok"] = false;
  j["code"] = asyncps::StatusCodeName(s.code());
  j["message"] = s.message();
  std::cout << j.dump() << std::endl;
  LOG(ERROR) << s.ToString();
  return 1;
}

// A destination may be created, or be an empty directory.
Status CheckDestination(const std::string& dir) {
  std::error_code ec;
  for (const std::string& p : {dir, dir + ".cut", dir + ".cut.tmp"}) {
    if (!fs::exists(p, ec)) continue;
    if (p != dir || !fs::is_directory(p, ec) || !fs::is_empty(p, ec)) {
      return Status::FailedPrecondition(
          "destination " + p +
          " exists and is not an empty directory: give "
          "new directories");
    }
  }
  return Status::OK();
}

}  // namespace

int main(int argc, char** argv) {
  asyncps::InitTool(
      "ps_reshard --from=DB0,...,DB{S-1} --to=NEW0,...,NEW{S'-1} [--dry_run]",
      &argc, &argv);
  const std::vector<std::string> from = SplitList(FLAGS_from);
  const std::vector<std::string> to = SplitList(FLAGS_to);
  if (from.empty() || to.empty() || argc > 1 || FLAGS_batch_bytes < 1) {
    std::cerr << gflags::ProgramUsage() << "\n"
              << "--from and --to are required (comma-separated lists), "
                 "--batch_bytes must be >= 1\n";
    return 2;
  }
  for (size_t i = 0; i < to.size(); ++i) {
    for (size_t k = 0; k < from.size(); ++k) {
      std::error_code ec;
      if (fs::weakly_canonical(to[i], ec) == fs::weakly_canonical(from[k], ec))
        return Fail(Status::InvalidArgument("destination " + to[i] +
                                            " is also a source"));
    }
    for (size_t k = 0; k < i; ++k) {
      if (to[k] == to[i])
        return Fail(
            Status::InvalidArgument("destination " + to[i] + " given twice"));
    }
  }
  std::vector<std::unique_ptr<Store>> stores;
  std::vector<Store*> src, dst;
  for (size_t i = 0; i < from.size(); ++i) {
    std::error_code ec;
    if (!fs::exists(fs::path(from[i]) / "CURRENT", ec)) {
      return Fail(Status::NotFound("source " + std::to_string(i) + ": no " +
                                   "RocksDB store at " + from[i]));
    }
    RocksDbStoreOptions o;
    o.path = from[i];
    auto s = OpenRocksDbStore(o);
    if (!s.ok()) {
      return Fail(s.status().WithContext(
          "opening source " + std::to_string(i) + " (" + from[i] +
          "; is its server still running? stop the fleet first)"));
    }
    src.push_back(s.value().get());
    stores.push_back(std::move(s).value());
  }
  for (const std::string& dir : to) {
    Status c = CheckDestination(dir);
    if (!c.ok()) return Fail(c);
  }
  asyncps::server::ReshardOptions options;
  options.batch_bytes = static_cast<size_t>(FLAGS_batch_bytes);
  asyncps::server::ReshardReport r;
  // A dry run first, against empty in-memory destinations: every refusal
  // comes before a destination directory is created.
  {
    std::vector<std::unique_ptr<asyncps::server::MemStore>> mem(to.size());
    for (auto& m : mem) {
      m = std::make_unique<asyncps::server::MemStore>();
      dst.push_back(m.get());
    }
    options.dry_run = true;
    Status s = asyncps::server::Reshard(src, dst, options, &r);
    if (!s.ok()) return Fail(s);
    dst.clear();
  }
  if (!FLAGS_dry_run) {
    for (const std::string& dir : to) {
      // Parents as psrun lays them out (<run_dir>/db/server-<j>).
      std::error_code ec;
      const fs::path parent = fs::path(dir).parent_path();
      if (!parent.empty()) fs::create_directories(parent, ec);
      if (ec) {
        return Fail(Status::Unavailable("creating " + parent.string() + ": " +
                                        ec.message()));
      }
      RocksDbStoreOptions o;
      o.path = dir;
      auto s = OpenRocksDbStore(o);
      if (!s.ok()) return Fail(s.status().WithContext("creating " + dir));
      dst.push_back(s.value().get());
      stores.push_back(std::move(s).value());
    }
    options.dry_run = false;
    Status s = asyncps::server::Reshard(src, dst, options, &r);
    if (!s.ok()) {
      // A failure while writing (the checks passed): a destination may hold
      // partial writes (rolled back to empty when opened) or nothing.
      LOG(ERROR) << "the destinations are not usable; delete them before "
                    "trying again";
      return Fail(s);
    }
  }
  nlohmann::json j;
  j["ok"] = true;
  j["dry_run"] = FLAGS_dry_run;
  j["from_shards"] = r.from_shards;
  j["to_shards"] = r.to_shards;
  j["chunks"] = r.chunks;
  j["chunk_records"] = r.chunk_records;
  j["rows"] = r.rows;
  j["expired_rows"] = r.expired_rows;
  j["unknown_keys"] = r.unknown_keys;
  j["recut"] = r.recut;
  j["recut_chunks"] = r.recut_chunks;
  j["step_mismatches"] = r.step_mismatches;
  j["chunks_per_shard"] = r.chunks_per_shard;
  j["rows_per_shard"] = r.rows_per_shard;
  j["bytes_per_shard"] = r.bytes_per_shard;
  std::cout << j.dump() << std::endl;
  return 0;
}
