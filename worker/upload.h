// UploadValues: a worker's own values become the model held by the shards
// (fine-tuning from pretrained weights, restoring a saved state), through
// the kAssign requests of common/protocol.capnp.
//
// Race rule, so that exactly one worker's values win when several call this
// at once: shard 0 is the lock. Every caller first sends shard 0 a begin;
// the shard grants one claim at a time and answers the others Unavailable,
// which their clients retry: they wait there. The claimant then claims
// shards 1..S-1, sends each shard its chunks in requests of at most
// max_request_bytes, commits shards 1..S-1 and shard 0 last. Only then does
// shard 0 answer a waiting caller's begin, with "final" (created = false):
// every caller that returns reads one worker's complete upload. If the
// claimant dies, its claim lapses (the shard's worker timeout) and a
// waiting caller takes it and uploads its own values from the start.
// A shard whose values are already final (an upload committed, or updates
// applied) keeps them unless `overwrite`: so a worker restarted mid-training
// with init="model" pulls the trained weights instead of resetting them.
//
// Thread safety: as the Client (one thread at a time).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/client.h"

namespace asyncps::worker {

struct UploadOptions {
  // Claim shards whose values are final too (a restore: load_state_dict).
  // Default: false.
  bool overwrite = false;
  // Largest upload request, in bytes of values (a chunk is never split, so
  // one larger chunk goes alone). Default: 16 MiB.
  uint64_t max_request_bytes = uint64_t{16} << 20;
  // Longest wait for one request, including a wait for another uploader.
  // Default: 600 s.
  std::chrono::milliseconds timeout{600000};
};

// Rows of one sparse table to upload: `n` keys (each once) and their values
// (n x dim floats); each row is set with zero optimizer state, or with
// `state` and `steps` when given (a restore: kAssign phase 5, checked by
// the shards, which refuse state of another row optimizer than the table's
// before any row of the request is written).
struct RowsValues {
  uint32_t table = 0;  // index in the registered table list
  const uint64_t* keys = nullptr;
  size_t n = 0;
  const float* values = nullptr;
  // Null, or n x dim x k floats of optimizer state (k: the table's row
  // optimizer's floats per weight; per row [slot 0 | slot 1 ...], Adam:
  // [m | v]) and n step counts (at most 2^53), saved from the row
  // optimizer `optimizer` ("sgd", "adagrad", "adam").
  const float* state = nullptr;
  const uint64_t* steps = nullptr;
  std::string optimizer;
  // Null, or (with state and steps) n kinds (kSavedRow, kSavedCounter:
  // common/sparse_table.h) and n clocks of the last push: a restore of
  // saved entries (kAssign phase 7): key i becomes a row or an admission
  // counter of steps[i] pushes (its values and state unused), last pushed
  // at clocks[i].
  const uint32_t* kinds = nullptr;
  const int64_t* clocks = nullptr;
  // Drop every entry of the table on each claimed shard (kAssign phase 8)
  // before its rows are sent, so the table then holds exactly these rows
  // (a restore of a table saved whole). Default: false (other keys keep
  // their rows).
  bool clear = false;
};

// Optimizer state uploaded with the values (ps.load_optimizer_state_dict):
// every chunk's k floats of state per weight and its optimizer steps, sent
// to each shard before its values (kAssign phase 4) and made final by the
// same commit (the shard keeps it instead of resetting it).
struct StateValues {
  // The optimizer it was saved from (a ps_server --optimizer name: "sgd",
  // "momentum", "adam", "adagrad"); a shard running another refuses it.
  std::string optimizer;
  // slots[j][t]: slot j (Adam: m, v; momentum: the buffer; AdaGrad: the
  // sum) of tensor t (layout order), num_elements floats. k = slots.size()
  // must be the shards' optimizer's floats per weight.
  std::vector<std::vector<const float*>> slots;
  // Optimizer steps by chunk id (one per chunk of the layout, at most 2^53).
  std::vector<uint64_t> chunk_steps;
};

// Most keys of one table in one upload request (a shard refuses more than
// its --max_sparse_keys, 262144 by default).
inline constexpr size_t kUploadMaxKeys = 65536;

// Uploads `tensors` (one buffer per registered tensor, in layout order, each
// num_elements floats), `rows` (at most one entry per table) and, unless
// null, `state` (else the shards' optimizer state restarts from zero)
// unless another caller's upload wins or the values are final; *uploaded
// says whether this call's values were written. REQUIRES:
// client->Register() (RegisterModel with the tables of `rows`) succeeded.
Status UploadValues(Client* client, const std::vector<const float*>& tensors,
                    const UploadOptions& options, bool* uploaded,
                    const std::vector<RowsValues>& rows = {},
                    const StateValues* state = nullptr);

// The saved entries of one sparse table (ScanTable): keys in increasing
// order and their saved records (SavedRecordBytes each).
struct SavedRows {
  std::vector<uint64_t> keys;
  std::vector<uint8_t> records;
};

// Reads every entry (row or admission counter, not expired) of registered
// table `table` from every shard, in pages of at most `page_rows` entries
// (Client::ScanRows), into *out (keys in increasing order). Each shard's
// entries are a point-in-time scan: the table as it stood when the shard
// answered its first page (the shards' first pages are read one after
// the other), whatever is pushed while the pages are read. Each key once,
// also while elastic shards move key ranges: a pass whose pages met a newer
// layout epoch, or a shard that dropped its scan, starts over (at most
// kScanPasses passes, then Unavailable: retry).
inline constexpr int kScanPasses = 4;
Status ScanTable(Client* client, uint32_t table, size_t page_rows,
                 SavedRows* out, std::chrono::milliseconds timeout);

}  // namespace asyncps::worker
