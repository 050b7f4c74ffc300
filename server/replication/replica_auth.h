// Replica authentication: who may send a replica group's replica traffic
// (kReplicate: updates, round and liveness records, pings; kSnapshot: the
// pieces of a checkpoint copied to a spare).
//
// Only the process that the receiver's layout names as its group's primary
// may (docs in RELIABILITY.md, "Threat model"). The receiver tells who sent a
// message by a key, never by what the message says of itself or by its
// address:
//  - With CurveZMQ (ps_server --curve_secret_key) every process has a
//    replica key pair of its own, made at start and never written down; its
//    public key is in its etcd member record, and the primary's connections
//    to its backups use it as their client key. A receiver compares the
//    key the handshake authenticated (Message::client_key) with the key of
//    the process its layout names.
//  - Without CurveZMQ the group has a secret (32 random bytes: in etcd at
//    <prefix>/secrets/g<group>, created with the group, or from ps_server
//    --replica_secret_file; never handed to workers). Each message carries a
//    tag as its last frame: ChaCha20-Poly1305 used as a MAC (the frames are
//    its additional data, nothing is encrypted) over a domain string, the
//    coverage (below), the frame count, every frame's length and the bytes
//    of the header, and with Coverage::kAll the bytes of every frame. Its
//    key is HMAC-SHA256(secret, domain, group, session), where
//    the session is 16 random bytes per sending process, named in the
//    header; its nonce is the request id. A sender's ids only grow (they
//    come from one counter), so a nonce never repeats under a key, and a
//    receiver refuses an id that is not above the last one it took from the
//    session: a recorded message cannot be replayed. The sender's name and
//    incarnation in the header are covered by the tag; a holder of the
//    secret is a member of the group and trusted to say who it is.
//
// Poly1305 was chosen over HMAC-SHA256 for the per-message tag because it
// runs at ~8.6 GB/s here against ~1.6 GB/s (one core, 1 MiB messages,
// `openssl speed`). In the server it runs at ~11 GB/s (the bytes arrive
// cold; every piece starts at a 16-byte boundary, without which OpenSSL
// runs at half speed), on the primary and again on the backup, in series
// with the update: tagging every byte costs 0.65-0.86x push throughput
// (experiments/results/RELIABILITY.md "What
// authentication costs"). Updates are therefore tagged over their header
// by default (ps_server --replica_tag=header): what stops a peer that is
// not on the path (a worker) from forging or replaying replica traffic is
// the header's tag; the payload's bytes matter only against a host on the
// path, which without CurveZMQ can alter a worker's own push just as well.
// --replica_tag=all covers them too; snapshots are always covered in full.
//
// Thread safety: a ReplicaMac is used by one thread (the event loop's).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace asyncps::server::replication {

inline constexpr size_t kReplicaSecretBytes = 32;
inline constexpr size_t kReplicaSessionBytes = 16;
inline constexpr size_t kReplicaTagBytes = 16;

// 32 random bytes from the OS's generator (OpenSSL RAND_bytes).
StatusOr<std::string> NewReplicaSecret();
// `n` random bytes (sessions, incarnations).
StatusOr<std::string> RandomBytes(size_t n);

// Lowercase hex of `bytes`, and back (InvalidArgument for anything but
// 2 * kReplicaSecretBytes hex digits).
std::string SecretToHex(const std::string& bytes);
StatusOr<std::string> SecretFromHex(const std::string& hex);

// Reads a group secret from `path`: the first line that is not empty or a
// '#' comment holds 64 hex digits. NotFound when the file is missing;
// InvalidArgument when it holds no secret or is readable by others than its
// owner (mode & 077).
StatusOr<std::string> LoadReplicaSecret(const std::string& path);

// One frame to tag: its bytes.
using TagPiece = std::pair<const void*, size_t>;

// What a tag covers. kAll: every byte of every frame. kHeader: the first
// frame's bytes (the replica header: sender, session, id, epoch, group) and
// every frame's length, not the bytes of the frames after it (a push's
// gradient, a round's sums). kHeader proves who sent a message and which of
// its updates it is, which is what stops a peer that is not on the network
// path from forging or replaying replica traffic; the payload then rides
// the path as a worker's push does without CurveZMQ. kAll costs a pass of
// Poly1305 over every byte on each side (~6 GB/s per core measured in the
// server, RELIABILITY.md "What authentication costs"). The coverage is
// itself covered by the tag.
enum class Coverage { kHeader, kAll };

class ReplicaMac {
 public:
  // `secret`: kReplicaSecretBytes bytes; `group` is bound into every key.
  // A fresh random session for this process's own messages.
  static StatusOr<std::unique_ptr<ReplicaMac>> Create(const std::string& secret,
                                                      int group);
  ~ReplicaMac();
  ReplicaMac(const ReplicaMac&) = delete;
  ReplicaMac& operator=(const ReplicaMac&) = delete;

  // This process's session (kReplicaSessionBytes bytes): goes into the
  // header of every message it signs.
  const std::string& session() const { return session_; }

  // The tag of `frames` (header first) sent with request id `id` under this
  // process's session. `id` must grow from one call to the next.
  std::array<uint8_t, kReplicaTagBytes> Sign(
      uint64_t id, const std::vector<TagPiece>& frames, Coverage coverage);

  // OK when `tag` is the tag of `frames` under `session` with id `id`, and
  // `id` is above every id this object took from `session` before (then it
  // is remembered). PermissionDenied otherwise, with one message for every
  // cause. Sessions are remembered up to kMaxSessions, the least recently
  // used forgotten first (a forgotten session's old ids would be taken
  // again: only a process that has the secret could have sent them). A
  // session is remembered only once a message of it verified.
  Status Verify(const std::string& session, uint64_t id,
                const std::vector<TagPiece>& frames, Coverage coverage,
                const uint8_t* tag, size_t tag_size);

  static constexpr size_t kMaxSessions = 8;

 private:
  struct Key;
  ReplicaMac() = default;
  // A peer session's cached key (marked most recently used), or nullptr.
  Key* Find(const std::string& session);
  // The key of `session` from the secret; nullptr when OpenSSL fails.
  std::unique_ptr<Key> Derive(const std::string& session) const;

  std::string secret_;
  int group_ = 0;
  std::string session_;
  std::unique_ptr<Key> own_;
  std::vector<std::unique_ptr<Key>> peers_;  // most recently used last
};

}  // namespace asyncps::server::replication
