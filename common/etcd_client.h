// EtcdClient: a small etcd v3 client, spoken through etcd's JSON/HTTP
// gateway (the grpc-gateway every etcd >= 3.3 serves on its client URLs under
// /v3/...). Used for shard membership (keys attached to leases), the
// replicated layout key with its epoch (compare-and-swap on mod_revision) and
// for watching the layout. etcd is the authority: nothing here caches or
// decides anything on its own.
//
// Every call is one HTTP request (POST, JSON body; keys and values are
// base64 in the JSON, int64 fields come back as strings) on a connection of
// its own, with Options::request_timeout for connect, send and receive.
// Endpoints are tried in order; the next one is tried only when a connection
// cannot be made, and the client starts from the last one that answered.
// A request that reached etcd but whose answer was lost (read timeout) is
// reported as Unavailable and not retried here: a Put may then have been
// applied, a CompareAndPut retried by the caller then answers false.
//
// Errors: Unavailable (retry) when no endpoint can be reached or an answer
// times out, naming the endpoint; etcd's own errors keep etcd's message with
// its gRPC code mapped (InvalidArgument, NotFound, FailedPrecondition,
// Unavailable, TimedOut, ResourceExhausted, ...); an answer that is not the
// expected JSON is Corruption. No exception leaves this module.
//
// Leases, measured on etcd 3.4.23 (Debian), one member on loopback, on a
// loaded 2-core machine, with EtcdClientTest.LeaseExpiryDeletesKey
// (build/bin/etcd_client_test --gtest_filter='*LeaseExpiry*') and by hand
// over the gateway:
//  - TTLs are whole seconds. etcd raises a TTL below its minimum, silently,
//    to ceil(1.5 * election timeout): with the default --election-timeout
//    of 1000 ms a 1 s lease is granted as 2 s; with --election-timeout at
//    most 666 ms the minimum is 1 s. GrantLease reports the TTL granted.
//  - A lease is revoked (its keys deleted) between TTL and TTL + 0.5 s after
//    its grant or last keep-alive: etcd's lessor looks for expired leases
//    every 500 ms. With --heartbeat-interval=50 --election-timeout=250:
//      1 s lease, key gone after the last keep-alive: 1.13 to 1.49 s,
//        median 1.20 s (test, 2 x 5 runs) and 1.29 s (by hand, 10 runs);
//      1 s lease, no keep-alive, gone after the put: 1.12 to 1.51 s,
//        median 1.50 s (10 runs); the same with 10/50 ms flags.
//    With the defaults (100/1000 ms) a 1 s lease is granted 2 s and gone
//    2.37 to 2.51 s after the put (median 2.50 s, 5 runs).
//    So a holder sends keep-alives well within TTL (e.g. every TTL/3), and
//    a watcher sees a dead holder's key vanish at most TTL + 0.5 s (plus a
//    raft round) after its last keep-alive.
//  - Local runs and tests start etcd with --heartbeat-interval=50
//    --election-timeout=250 (tests/util/etcd_fixture.h,
//    launch/pslaunch/etcd.py): 1 s leases, healthy ~0.35 s after start.
//    Those values suit a single member on one host only; a real cluster
//    across hosts needs election timeouts above its round-trip times.
//
// Thread safety: all methods may be called concurrently from any threads
// (each call uses its own connection). A call blocks its caller for at most
// about request_timeout (Watch: its timeout, plus request_timeout to
// connect).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/etcd_security.h"
#include "common/status.h"

namespace asyncps {

struct EtcdOptions {
  // Client URLs "http://host:port" or "https://host:port" (no path; https
  // needs security.ca_file), tried in order, the next one on connection
  // failure. Required, non-empty.
  std::vector<std::string> endpoints;
  // Limit for connecting, sending and receiving one request, >= 1 ms.
  // Default: 2000 ms.
  std::chrono::milliseconds request_timeout{2000};
  // TLS and credentials; endpoints are then https://host:port. Default:
  // none (plain http, no authentication).
  EtcdSecurity security;
  // Largest answer read, bytes (and longest line of a watch stream): a
  // larger one is ResourceExhausted, never buffered whole. Default: 16 MiB.
  size_t max_answer_bytes = size_t{16} << 20;
  // Keeps the connections of unary calls open for the next call (up to 4
  // idle per endpoint); false opens one per call. A watch always has its
  // own. Default: true.
  bool keep_alive = true;
};

struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;  // Revision of the put that created the key.
  int64_t mod_revision = 0;     // Revision of its last put (or its delete).
  int64_t version = 0;          // Puts since creation (1 after the first).
  int64_t lease = 0;            // Lease attached, 0 for none.
};

struct EtcdWatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  // For kDelete only key and mod_revision (the delete's revision) are set.
  EtcdKeyValue kv;
};

// One comparison of a transaction: `target` of `key` <result> the operand.
// A key that does not exist has version, create_revision, mod_revision and
// lease 0 (and compares false on kValue).
struct EtcdCompare {
  // Both enums index tables in etcd_client.cc: append only.
  enum class Target { kVersion, kCreateRevision, kModRevision, kValue, kLease };
  enum class Result { kEqual, kGreater, kLess, kNotEqual };
  std::string key;
  Target target = Target::kModRevision;
  Result result = Result::kEqual;
  int64_t number = 0;  // Operand for every target but kValue.
  std::string value;   // Operand for kValue.

  static EtcdCompare ModRevision(std::string key, Result r, int64_t n);
  static EtcdCompare CreateRevision(std::string key, Result r, int64_t n);
  static EtcdCompare Version(std::string key, Result r, int64_t n);
  static EtcdCompare Lease(std::string key, Result r, int64_t lease);
  static EtcdCompare Value(std::string key, Result r, std::string value);
};

// One write of a transaction.
struct EtcdOp {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  std::string key;
  std::string value;  // kPut only.
  int64_t lease = 0;  // kPut only; 0 for none.

  static EtcdOp Put(std::string key, std::string value, int64_t lease = 0);
  static EtcdOp Delete(std::string key);
};

class EtcdClient {
 public:
  // Checks the options (each endpoint "http://host:port" with a port in
  // 1..65535): InvalidArgument otherwise. Does not contact etcd.
  static StatusOr<std::unique_ptr<EtcdClient>> Create(
      const EtcdOptions& options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // Grants a lease of `ttl` rounded up to whole seconds (at least 1 s) and
  // returns its id. `granted_ttl`, if set, receives the TTL etcd granted,
  // which is larger when `ttl` is below etcd's minimum (see above).
  StatusOr<int64_t> GrantLease(std::chrono::milliseconds ttl,
                               std::chrono::seconds* granted_ttl = nullptr);
  // Sends one keep-alive, restarting the lease's TTL. `ttl_left`, if set,
  // receives the TTL now left. NotFound once the lease expired or was
  // revoked (its keys are gone then).
  Status KeepAlive(int64_t lease,
                   std::chrono::milliseconds* ttl_left = nullptr);
  // Revokes the lease, deleting its keys. NotFound for an unknown lease.
  Status RevokeLease(int64_t lease);

  // Puts key=value, attached to `lease` when non-zero (NotFound when that
  // lease does not exist). Returns the revision of the write.
  StatusOr<int64_t> Put(const std::string& key, const std::string& value,
                        int64_t lease = 0);
  // The key, or nullopt when it does not exist. `revision`, if set,
  // receives the store's revision the answer was read at.
  StatusOr<std::optional<EtcdKeyValue>> Get(const std::string& key,
                                            int64_t* revision = nullptr);
  // Every key starting with `prefix` (all keys for ""), in key order.
  StatusOr<std::vector<EtcdKeyValue>> GetPrefix(const std::string& prefix,
                                                int64_t* revision = nullptr);
  // Every key k with from <= k < end (bytewise), in key order: several
  // keys read at one revision in one request.
  StatusOr<std::vector<EtcdKeyValue>> GetRange(const std::string& from,
                                               const std::string& end,
                                               int64_t* revision = nullptr);
  // Deletes the key; OK when it did not exist.
  Status Delete(const std::string& key);

  // Atomically puts key=value iff the key's mod_revision equals
  // `expected_mod_revision` (0: iff the key does not exist). True when
  // written, false when the comparison failed (nothing written).
  StatusOr<bool> CompareAndPut(const std::string& key, const std::string& value,
                               int64_t expected_mod_revision,
                               int64_t lease = 0);
  // Runs `on_success` iff every comparison holds, else `on_failure`, as one
  // atomic transaction. Returns whether the comparisons held. `revision`, if
  // set, receives the store's revision after the transaction. etcd refuses
  // (InvalidArgument) two writes of the same key in one branch.
  StatusOr<bool> Txn(const std::vector<EtcdCompare>& compares,
                     const std::vector<EtcdOp>& on_success,
                     const std::vector<EtcdOp>& on_failure = {},
                     int64_t* revision = nullptr);

  // Waits up to `timeout` for changes of keys under `prefix` with revision
  // >= `start_revision` (0: changes after now) and returns the first batch
  // of events seen, in revision order, or none on timeout. `next_revision`
  // (required) receives the revision to pass as start_revision next time:
  // one past the last event returned; without events, start_revision (or
  // one past the current revision when start_revision was 0), so nothing is
  // ever skipped. FailedPrecondition when start_revision was compacted away
  // (re-read with GetPrefix and watch from its revision + 1).
  StatusOr<std::vector<EtcdWatchEvent>> Watch(const std::string& prefix,
                                              int64_t start_revision,
                                              std::chrono::milliseconds timeout,
                                              int64_t* next_revision);

 private:
  struct Impl;
  explicit EtcdClient(std::unique_ptr<Impl> impl);
  // Keys in [key, range_end) (the gateway's range request).
  StatusOr<std::vector<EtcdKeyValue>> Range(const std::string& key,
                                            const std::string& range_end,
                                            int64_t* revision);
  std::unique_ptr<Impl> impl_;
};

}  // namespace asyncps
