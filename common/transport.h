// Message transport over ZeroMQ: a ROUTER for servers, DEALERs for clients.
//
// A message is a list of frames. Frames are sent without copying: a Frame
// holds a reference to the bytes' owner (a Buffer, a received message...) and
// ZeroMQ releases that reference through a free callback once the bytes are
// on the wire. Received frames are handed out as ByteViews that keep the
// underlying zmq message alive, so a receiver copies tensor bytes at most
// once, into their destination.
//
// Endpoints are ZeroMQ addresses: "tcp://127.0.0.1:5555", "tcp://127.0.0.1:*"
// (ephemeral port; endpoint() tells the one bound) or "inproc://name" (an
// in-process transport for tests; both sides must share one Context).
//
// cppzmq throws; this adapter catches everything and returns Status.
// Thread safety: a socket object must be used by one thread at a time.
// A Context may be shared by any number of threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/buffer.h"
#include "common/status.h"

struct pollfd;  // <poll.h>

namespace asyncps {

// Owns a ZeroMQ context (I/O threads). Sockets keep their context alive.
class Context {
 public:
  // `io_threads`: ZeroMQ I/O threads. Default 1.
  static std::shared_ptr<Context> Create(int io_threads = 1);
  virtual ~Context() = default;
};

struct TransportOptions {
  // Shared context; nullptr creates a private one for this socket.
  std::shared_ptr<Context> context;
  // Largest single frame accepted, in bytes (ZMQ_MAXMSGSIZE): ZeroMQ checks
  // each frame's size as it arrives and drops the connection of a peer
  // sending more, before buffering it. Default: 256 MiB.
  int64_t max_frame_bytes = int64_t{256} << 20;
  // Largest whole message (all frames) accepted, in bytes. ZeroMQ delivers a
  // multi-frame message only once all of it has arrived, so this (and
  // max_frames) is checked on receipt: the frames of a larger message are
  // dropped at once, and Message::error says why (the header frame is kept
  // so the reply can carry the request's id). Default: 1 GiB.
  int64_t max_message_bytes = int64_t{1} << 30;
  // Most frames in one message; more is an error as above. Default: 65536.
  size_t max_frames = 65536;
  // Send/receive high-water marks, in messages. Default: 10000.
  int hwm = 10000;
  // Kernel send buffer (SO_SNDBUF) of each TCP connection, bytes. 0 keeps
  // the OS default (autotuned).
  // TCP keeps at most this much of a connection's data unacknowledged, so
  // it bounds how much of it waits in a saturated link's queue: traffic
  // the other way (the acknowledgements of a transfer coming in, the next
  // request) then is not held behind a whole push. Too small caps the
  // connection at about bytes / round trip. 0 or CheckSendBufferBytes'
  // range. Default: 0.
  int send_buffer_bytes = 0;
  // CurveZMQ keys (Z85, 40 chars). Server: its secret key. Client: its
  // secret key plus the server's public key (its own public key is derived
  // from the secret key when left empty). Empty: no encryption.
  std::string curve_secret_key;
  std::string curve_public_key;
  std::string curve_server_key;
  // Server with CURVE only: the client public keys (Z85) allowed to connect,
  // checked by a ZAP handler thread of the socket's Context. A client whose
  // key is not listed is refused during the handshake (it never reaches
  // Receive(); it sees no reply and times out) and the refusal is reported by
  // ServerSocket::TakeSecurityEvents(). Empty: any client that knows the
  // server's public key may connect (encryption without client
  // authentication). Default: empty.
  std::vector<std::string> curve_allowed_client_keys;
  // Server with CURVE: report each message's client key
  // (Message::client_key) even without an allowed list (a ZAP handler that
  // accepts every key is installed). Default: false.
  bool curve_identify_clients = false;
};

// One outgoing frame: bytes plus whatever keeps them alive until sent.
struct Frame {
  const void* data = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> owner;  // nullptr: bytes are copied on Send.

  static Frame Copy(const void* data, size_t size);  // copies now
  static Frame Owned(std::vector<uint8_t>&& bytes);  // no copy
  static Frame Ref(const BufferPtr& b);              // no copy
  static Frame Ref(const void* data, size_t size,
                   std::shared_ptr<const void> owner);
};

// A received message. frames[0] is the header.
struct Message {
  std::vector<ByteView> frames;
  int64_t total_bytes = 0;
  // Set when the message broke a limit (too big, too many frames): its
  // frames but the header were dropped and the receiver should answer with
  // this error.
  Status error;
  // Server side: the sender's IP address as ZeroMQ reports it
  // ("Peer-Address"; empty for inproc and ipc), and with CURVE the client's
  // public key (Z85) when the server identifies clients.
  std::string peer_address;
  std::string client_key;
  void Clear() {
    frames.clear();
    total_bytes = 0;
    error = Status::OK();
    peer_address.clear();
    client_key.clear();
  }
};

class ClientSocket;

// ROUTER socket of a server. Replies are routed by the peer identity the
// request arrived with.
class ServerSocket {
 public:
  static StatusOr<std::unique_ptr<ServerSocket>> Bind(
      const std::string& endpoint, const TransportOptions& options);
  virtual ~ServerSocket() = default;

  // The bound address, with the real port for "tcp://host:*".
  virtual const std::string& endpoint() const = 0;

  // Waits up to `timeout` for a message. Returns false on timeout. `peer`
  // receives the sender's routing identity (opaque).
  virtual StatusOr<bool> Receive(std::string* peer, Message* msg,
                                 std::chrono::milliseconds timeout) = 0;

  // Sends frames to `peer`. Never blocks for long: a peer that is gone or
  // whose queue is full loses the message (Unavailable is returned).
  virtual Status Send(const std::string& peer, std::vector<Frame>& frames) = 0;

  // Security events since the last call (with CURVE: clients refused by the
  // allowed-key list, failed handshakes such as a wrong server key or a
  // client without encryption), one line each, oldest first. At most 1000
  // are kept between calls; older ones are counted in a summary line.
  // Receive() may return false before its timeout when only such events
  // arrived.
  virtual std::vector<std::string> TakeSecurityEvents() = 0;

  // Client sockets whose incoming messages also end a Receive() wait (it
  // then returns false): a server that is itself a client of other servers
  // (a replica group's primary waiting for its backups) waits on all of
  // them in one poll. Not owned; each must outlive the next Receive() or
  // the next call. Default: none.
  virtual void SetWakeSockets(std::vector<ClientSocket*> sockets) = 0;

 protected:
  static void* PollHandleOf(ClientSocket* s);
};

// DEALER socket of a client, connected to one server. Reconnects on its own
// when the server restarts; messages queue (up to the high-water mark) while
// it is away.
class ClientSocket {
 public:
  static StatusOr<std::unique_ptr<ClientSocket>> Connect(
      const std::string& endpoint, const TransportOptions& options);
  virtual ~ClientSocket() = default;

  virtual const std::string& endpoint() const = 0;

  // Queues a message. Returns ResourceExhausted if the queue is full.
  virtual Status Send(std::vector<Frame>& frames) = 0;

  // Waits up to `timeout` for one message; false on timeout.
  virtual StatusOr<bool> Receive(Message* msg,
                                 std::chrono::milliseconds timeout) = 0;

  // Changes the largest message Receive() accepts (e.g. once the client
  // knows how large a reply can legitimately be).
  virtual void SetMaxMessageBytes(int64_t bytes) = 0;

  // Connections made to the server since the last call (the first one, and
  // one more after every reconnect, e.g. when a shard restarted): requests
  // that were in flight on a lost connection are worth resending now.
  virtual int TakeConnects() = 0;

  // Waits up to `timeout` until any of `sockets` has a message or a new
  // connection; returns the index of one such socket, or -1 on timeout.
  // It may also return for a socket with neither (the caller receives
  // nothing and waits again). Cheapest (one poll() system call) when every
  // socket's last operation was a Receive() that found nothing and
  // TakeConnects() was called after the last PollAny().
  static StatusOr<int> PollAny(const std::vector<ClientSocket*>& sockets,
                               std::chrono::milliseconds timeout);

 protected:
  friend class ServerSocket;
  virtual void* raw_handle() = 0;      // for PollAny
  virtual void* monitor_handle() = 0;  // for PollAny
  // PollAny's one-call path: fills fds[0] (messages) and fds[1] (connection
  // events) and returns true when both signal whatever arrives from now on;
  // false: PollAny asks ZeroMQ instead.
  virtual bool FillPollFds(pollfd* fds) = 0;
  // After PollAny's one call: `idle` = it saw no signal on the connection
  // events, so the next TakeConnects() has nothing to read.
  virtual void SetMonitorIdle(bool idle) = 0;
  // After PollAny asked ZeroMQ (which takes the signals): no one-call path
  // until the socket and its events are read dry again.
  virtual void ForgetDrained() = 0;
};

// Allocator settings for a process that moves large messages through this
// transport. ZeroMQ allocates every received message of more than a few KiB
// with malloc and the receiver frees it once done; with glibc's defaults a
// 1 MiB-class message is mmap'd or grows a heap's top, and is given back to
// the kernel right after (munmap, or a heap trim), so the next one
// page-faults zeroed pages in again: measured at 10-15% of the receiving
// threads' CPU with 8 such messages in flight. ps_server, ps_worker and the
// Python module call TuneAllocatorForMessages() once at start.
struct AllocatorTuning {
  // Allocations up to this size come from malloc's heaps (glibc caps it at
  // 32 MiB on 64-bit). Default: 32 MiB.
  int64_t mmap_threshold_bytes = int64_t{32} << 20;
  // Free memory at the top of a heap kept mapped, bytes. Default: 256 MiB.
  int64_t trim_threshold_bytes = int64_t{256} << 20;
};

// Applies `tuning` to this process's allocator (process-wide; glibc
// mallopt). InvalidArgument for a threshold out of range (the mmap threshold
// above glibc's 32 MiB ceiling); Unimplemented where the C library has no
// such knobs or the allocator in use ignores them (sanitizers); the
// transport works the same without them, only slower.
Status TuneAllocatorForMessages(const AllocatorTuning& tuning = {});

// TransportOptions::send_buffer_bytes: 0 (the OS default) or 4 KiB to
// 64 MiB; InvalidArgument naming `what` (a flag or argument) otherwise.
inline constexpr int64_t kMinSendBufferBytes = int64_t{4} << 10;
inline constexpr int64_t kMaxSendBufferBytes = int64_t{64} << 20;
Status CheckSendBufferBytes(int64_t bytes, const std::string& what);
// The same range in KiB (the flags' and the Python API's unit).
Status CheckSendBufferKb(int64_t kb, const std::string& what);

// Generates a CurveZMQ key pair (Z85 text, 40 characters each).
Status GenerateCurveKeyPair(std::string* public_key, std::string* secret_key);

// The public key (Z85) of a CurveZMQ secret key (Z85). InvalidArgument if
// `secret_key` is not 40 characters of valid Z85.
StatusOr<std::string> DeriveCurvePublicKey(const std::string& secret_key);

// Reads one Z85 key: `file_or_key` is either the 40-character key itself or
// the path of a file whose first line that is not empty or a '#' comment is
// the key. InvalidArgument if it is neither; NotFound if the file is missing.
StatusOr<std::string> LoadCurveKey(const std::string& file_or_key);

// A client's CurveZMQ keys from its --curve_server_key, --curve_secret_key
// and --curve_public_key flags (each a file or a Z85 key, see
// LoadCurveKey) into *options: nothing when server_key is empty (no
// encryption); secret_key empty: an ephemeral key pair; public_key empty:
// derived from the secret key. The first key that does not load is the
// error.
Status LoadCurveClientKeys(const std::string& server_key,
                           const std::string& secret_key,
                           const std::string& public_key,
                           TransportOptions* options);

// Reads a list of Z85 public keys from a file, one per line ('#' comments
// and blank lines ignored; a line may hold "KEY name" and only KEY counts).
StatusOr<std::vector<std::string>> LoadCurveKeyList(const std::string& path);

}  // namespace asyncps
