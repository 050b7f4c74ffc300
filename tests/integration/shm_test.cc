// Pulls through shared memory (common/shm_segment.h) from a real ps_server
// process: the weights a shard writes into a client's segment equal those
// it sends over the socket, a restarted shard is given the segment again,
// and hostile attach requests and pulls are refused with nothing written
// (nor any lock of the shard's dropped).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "common/shm_segment.h"
#include "common/transport.h"
#include "common/wire.h"
#include "tests/util/process.h"
#include "worker/client.h"

namespace asyncps::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using worker::ChunkPayload;
using worker::Client;
using worker::ClientOptions;

std::vector<TensorSpec> Model() {
  return {TensorSpec{"w", {300, 500}, InitKind::kUniform, 0.1f, 7},
          TensorSpec{"b", {500}, InitKind::kUniform, 0.1f, 8}};
}

LayoutOptions Chunking() {
  LayoutOptions lo;
  lo.chunk_elems = 40000;  // several chunks per tensor
  lo.min_chunk_elems = 256;
  return lo;
}

std::unique_ptr<Client> Connect(const std::string& endpoint, int rank,
                                size_t shm_bytes) {
  ClientOptions o;
  o.servers = {endpoint};
  o.rank = rank;
  o.deadline = seconds(60);
  o.attempt_timeout = milliseconds(500);
  o.shared_memory_bytes = shm_bytes;
  auto c = Client::Create(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

// Pulls every tensor of Model() into `dst` (one buffer per tensor).
Status Pull(Client* c, const std::vector<float*>& dst) {
  ASSIGN_OR_RETURN(Client::Ticket t, c->StartPull(0, dst));
  return c->Wait(t, seconds(30));
}

Status PushOnes(Client* c) {
  std::vector<ChunkPayload> p;
  for (const ChunkSpec& s : c->layout().chunks()) {
    BufferPtr b = Buffer::Allocate(s.num_elems * sizeof(float));
    for (size_t i = 0; i < s.num_elems; ++i) b->floats()[i] = 1.0f;
    p.push_back({s.id, 0, Frame::Ref(b)});
  }
  ASSIGN_OR_RETURN(Client::Ticket t, c->StartPush(0, std::move(p)));
  return c->Wait(t, seconds(30));
}

uint64_t StatsField(Client* c, const std::string& key) {
  std::vector<std::string> texts;
  Status s = c->Stats(&texts, seconds(10));
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (!s.ok() || texts.empty()) return 0;
  auto j = nlohmann::json::parse(texts[0], nullptr, false);
  if (j.is_discarded() || !j.contains(key)) return 0;
  return j[key].get<uint64_t>();
}

TEST(SharedMemoryTest, PullsEqualSocketPullsAndSurviveARestart) {
  TempDir dir;
  const std::string endpoint = "ipc://" + dir.Sub("shard0.sock");
  const std::vector<std::string> flags = {"--shard_id=0",
                                          "--num_shards=1",
                                          "--num_workers=2",
                                          "--optimizer=sgd",
                                          "--lr=0.5",
                                          "--checkpoint_every_s=0",
                                          "--db_path=" + dir.Sub("db")};
  auto server = StartServer(dir, "shard0", flags, endpoint);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto shm = Connect(endpoint, 0, 4 << 20);
  auto sock = Connect(endpoint, 1, 0);
  ASSERT_TRUE(shm && sock);
  ASSERT_TRUE(shm->Register(Model(), Chunking()).ok());
  ASSERT_TRUE(sock->Register(Model(), Chunking()).ok());
  EXPECT_EQ(shm->shared_memory_shards(), 1);
  EXPECT_EQ(sock->shared_memory_shards(), 0);
  EXPECT_EQ(sock->AllocateShared(10), nullptr);

  std::vector<float*> shared, plain;
  std::vector<std::vector<float>> plain_store;
  for (const TensorSpec& t : Model()) {
    float* p = shm->AllocateShared(t.num_elements());
    ASSERT_NE(p, nullptr);
    std::memset(p, 0, t.num_elements() * sizeof(float));
    shared.push_back(p);
    plain_store.emplace_back(t.num_elements(), 0.0f);
  }
  for (auto& v : plain_store) plain.push_back(v.data());
  auto expect_equal = [&](const char* when) {
    for (size_t t = 0; t < shared.size(); ++t) {
      ASSERT_EQ(std::memcmp(shared[t], plain[t],
                            plain_store[t].size() * sizeof(float)),
                0)
          << when << ": tensor " << t;
    }
  };

  ASSERT_TRUE(Pull(shm.get(), shared).ok());
  ASSERT_TRUE(Pull(sock.get(), plain).ok());
  expect_equal("initial weights");
  EXPECT_NE(plain_store[0][123], 0.0f);
  const uint64_t written = StatsField(sock.get(), "shm_bytes_out");
  EXPECT_EQ(written, (300 * 500 + 500) * sizeof(float));

  ASSERT_TRUE(PushOnes(shm.get()).ok());
  const float before = plain_store[0][123];
  ASSERT_TRUE(Pull(shm.get(), shared).ok());
  ASSERT_TRUE(Pull(sock.get(), plain).ok());
  expect_equal("after a push");
  EXPECT_FLOAT_EQ(plain_store[0][123], before - 0.5f);

  // A pull into ordinary memory from the shared-memory client still works
  // (over the socket).
  std::vector<std::vector<float>> mine(2);
  mine[0].resize(300 * 500);
  mine[1].resize(500);
  ASSERT_TRUE(Pull(shm.get(), {mine[0].data(), mine[1].data()}).ok());
  EXPECT_EQ(mine[0], plain_store[0]);
  EXPECT_EQ(StatsField(sock.get(), "shm_bytes_out"), 2 * written);

  // kill -9 and restart on the same socket: the new process has never seen
  // the segment; the client gives it again and the pull lands in it.
  Status cp = shm->Checkpoint(seconds(10));
  ASSERT_TRUE(cp.ok()) << cp.ToString();
  server->process->Kill();
  auto again = StartServer(dir, "shard0b", flags, endpoint);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  for (float* p : shared) std::memset(p, 0, 500 * sizeof(float));
  Status s = Pull(shm.get(), shared);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(Pull(sock.get(), plain).ok());
  expect_equal("after the restart");
  EXPECT_GT(StatsField(sock.get(), "shm_bytes_out"), 0u);
}

// Sends one request on a raw socket and returns the decoded reply.
class Raw {
 public:
  explicit Raw(const std::string& endpoint) {
    auto s = ClientSocket::Connect(endpoint, {});
    EXPECT_TRUE(s.ok());
    socket_ = std::move(s).value();
  }
  ReplyHeader Call(RequestHeader h, int rank = 0,
                   uint64_t incarnation = 0xabcdef) {
    h.rank = rank;
    h.incarnation = incarnation;
    if (h.id == 0) h.id = next_id_++;
    std::vector<Frame> f{Frame::Owned(EncodeRequest(h))};
    EXPECT_TRUE(socket_->Send(f).ok());
    ReplyHeader r;
    Message m;
    while (true) {
      auto got = socket_->Receive(&m, seconds(10));
      EXPECT_TRUE(got.ok() && *got) << "no reply";
      if (!got.ok() || !*got) return r;
      EXPECT_TRUE(DecodeReply(m.frames[0].data, m.frames[0].size, {}, &r).ok());
      if (r.id == h.id) return r;
    }
  }

 private:
  std::unique_ptr<ClientSocket> socket_;
  uint64_t next_id_ = 1000;
};

TEST(SharedMemoryTest, HostileAttachesAndPullsAreRefusedWithNothingWritten) {
  TempDir dir;
  auto server = StartServer(dir, "shard0",
                            {"--shard_id=0", "--num_shards=1",
                             "--num_workers=1", "--checkpoint_every_s=0"});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto ref = Connect(server->endpoint, 0, 0);
  ASSERT_TRUE(ref && ref->Register(Model(), Chunking()).ok());
  const Layout& layout = ref->layout();
  std::vector<std::vector<float>> want = {std::vector<float>(300 * 500),
                                          std::vector<float>(500)};
  ASSERT_TRUE(Pull(ref.get(), {want[0].data(), want[1].data()}).ok());

  auto seg = ShmSegment::Create(4 << 20, 2);
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  ShmSegment& m = **seg;
  Raw raw(server->endpoint);
  auto attach = [&](uint32_t pid, int32_t fd, uint64_t size, uint64_t token,
                    int rank = 0, uint64_t incarnation = 0xabcdef) {
    RequestHeader h;
    h.kind = RequestKind::kAttachShm;
    h.shm_pid = pid;
    h.shm_fd = fd;
    h.shm_size = size;
    h.shm_token = token;
    return raw.Call(h, rank, incarnation).status;
  };
  // Hostile or mistaken attaches: each refused with a clear error.
  EXPECT_EQ(attach(m.pid(), m.fd(), m.size(), m.token() + 1).code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE(attach(m.pid(), m.fd(), m.size() + 4096, m.token()).ok());
  EXPECT_FALSE(attach(m.pid(), m.fd(), UINT64_MAX, m.token()).ok());
  EXPECT_FALSE(attach(1, 0, m.size(), m.token()).ok());
  EXPECT_FALSE(attach(0x7fffffff, 3, m.size(), m.token()).ok());
  EXPECT_FALSE(attach(m.pid(), -5, m.size(), m.token()).ok());

  // A pull into shared memory before any attach succeeded.
  const auto& ids = layout.shard_chunks(0);
  std::vector<uint64_t> offsets;
  uint64_t at = m.data_offset();
  for (uint32_t id : ids) {
    offsets.push_back(at);
    at += layout.chunks()[id].num_elems * sizeof(float);
  }
  const uint64_t total = at - m.data_offset();
  auto pull = [&](uint64_t id, uint32_t slot, std::vector<uint64_t> offs,
                  std::string codec = "") {
    RequestHeader h;
    h.kind = RequestKind::kPull;
    h.id = id;
    h.pull_chunks.assign(ids.begin(), ids.end());
    h.pull_shm_offsets = std::move(offs);
    h.pull_shm_slot = slot;
    h.pull_codec = codec;
    return raw.Call(h);
  };
  m.Arm(0, 40);
  EXPECT_EQ(pull(40, 0, offsets).status.code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(attach(m.pid(), m.fd(), m.size(), m.token()).ok());

  auto untouched = [&] {
    const uint8_t* p = m.base() + m.data_offset();
    for (uint64_t i = 0; i < total; ++i) {
      if (p[i] != 0) return false;
    }
    return true;
  };
  // Offsets outside the data area, unaligned, in the header, wrapping;
  // wrong count; a codec; a slot out of range; an id out of range.
  auto bad = offsets;
  bad.back() = m.size() - 4;
  EXPECT_EQ(pull(41, 0, bad).status.code(), StatusCode::kInvalidArgument);
  bad = offsets;
  bad[0] += 2;
  EXPECT_EQ(pull(42, 0, bad).status.code(), StatusCode::kInvalidArgument);
  bad = offsets;
  bad[0] = 0;
  EXPECT_EQ(pull(43, 0, bad).status.code(), StatusCode::kInvalidArgument);
  bad = offsets;
  bad[0] = UINT64_MAX - 3;
  EXPECT_EQ(pull(44, 0, bad).status.code(), StatusCode::kInvalidArgument);
  bad = offsets;
  bad.pop_back();
  EXPECT_EQ(pull(45, 0, bad).status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pull(46, 0, offsets, "fp16").status.code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(pull(47, 2, offsets).status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pull(ShmSegment::kDone, 0, offsets).status.code(),
            StatusCode::kInvalidArgument);
  // Not armed (or armed for another id): nothing written.
  EXPECT_EQ(pull(48, 1, offsets).status.code(), StatusCode::kCancelled);
  EXPECT_TRUE(untouched());

  // Armed: written once; the same id again is refused and writes nothing.
  m.Disarm(0, 40, milliseconds(0));
  m.Arm(0, 50);
  ReplyHeader ok = pull(50, 0, offsets);
  ASSERT_TRUE(ok.status.ok()) << ok.status.ToString();
  EXPECT_TRUE(m.IsDone(0, 50));
  ASSERT_EQ(ok.chunks.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const ChunkSpec& c = layout.chunks()[ids[i]];
    EXPECT_EQ(ok.chunks[i].frame, 0u);
    EXPECT_EQ(
        std::memcmp(m.base() + offsets[i], want[c.tensor].data() + c.offset,
                    c.num_elems * sizeof(float)),
        0)
        << "chunk " << ids[i];
  }
  std::memset(m.base() + m.data_offset(), 0, total);
  EXPECT_EQ(pull(50, 0, offsets).status.code(), StatusCode::kCancelled);
  EXPECT_TRUE(untouched());
  // Abandoned before it was answered: never written.
  m.Disarm(0, 50, milliseconds(0));
  m.Arm(0, 51);
  m.Disarm(0, 51, milliseconds(0));
  EXPECT_EQ(pull(51, 0, offsets).status.code(), StatusCode::kCancelled);
  EXPECT_TRUE(untouched());

  // The shard is alive and counted every refusal.
  EXPECT_TRUE(Pull(ref.get(), {want[0].data(), want[1].data()}).ok());
  std::vector<std::string> texts;
  ASSERT_TRUE(ref->Stats(&texts, seconds(10)).ok());
  auto j = nlohmann::json::parse(texts[0]);
  EXPECT_GE(j["rejected"]["shared_memory"].get<int>(), 17) << texts[0];
  EXPECT_EQ(j["shm_segments"].get<int>(), 1);

  // A worker rank keeps one segment: a new process of rank 0 (another
  // incarnation) replaces it, so a restarted worker's memory is let go. An
  // observer (rank -1) has its own.
  auto seg2 = ShmSegment::Create(1 << 20, 1);
  ASSERT_TRUE(seg2.ok());
  ShmSegment& m2 = **seg2;
  ASSERT_TRUE(attach(m2.pid(), m2.fd(), m2.size(), m2.token(), 0, 0x777).ok());
  ASSERT_TRUE(attach(m2.pid(), m2.fd(), m2.size(), m2.token(), -1, 0x888).ok());
  ASSERT_TRUE(ref->Stats(&texts, seconds(10)).ok());
  EXPECT_EQ(nlohmann::json::parse(texts[0])["shm_segments"].get<int>(), 2);
  // The old process's pulls find no segment any more.
  m.Arm(0, 60);
  EXPECT_EQ(pull(60, 0, offsets).status.code(),
            StatusCode::kFailedPrecondition);
  EXPECT_TRUE(untouched());
  EXPECT_TRUE(server->process->Running());
}

// The descriptors open in process `pid` (from /proc/<pid>/fd).
std::vector<int> OpenFds(pid_t pid) {
  std::vector<int> fds;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(
           "/proc/" + std::to_string(pid) + "/fd", ec)) {
    fds.push_back(std::stoi(e.path().filename().string()));
  }
  return fds;
}

// Starts another ps_server on `db_path` and returns its exit code; an error
// if it got ready instead (it serves the same RocksDB directory).
StatusOr<int> SecondServerExitCode(const TempDir& dir, const std::string& name,
                                   const std::string& db_path) {
  const std::string ready = dir.Sub(name + ".ready");
  ASSIGN_OR_RETURN(
      std::unique_ptr<Process> p,
      Process::Start(
          {BinPath("ps_server"), "--endpoint=tcp://127.0.0.1:0",
           "--ready_file=" + ready, "--shard_id=0", "--num_shards=1",
           "--num_workers=1", "--checkpoint_every_s=0", "--db_path=" + db_path},
          dir.Sub(name + ".log")));
  for (int i = 0; i < 3000; ++i) {
    if (!ReadFile(ready).empty()) {
      return Status::FailedPrecondition("a second ps_server serves " + db_path +
                                        " while the first runs:\n" + p->Log());
    }
    StatusOr<int> code = p->Wait(milliseconds(10));
    if (code.ok()) return *code;
  }
  return Status::TimedOut("second ps_server neither ready nor exited");
}

// Issue 40: attach_shm opened /proc/<pid>/fd/<fd> for whatever the request
// named, and closing that descriptor again dropped the shard's fcntl locks
// on the file, RocksDB's LOCK among them: a second ps_server then opened the
// same RocksDB directory while the first ran. Every descriptor of the
// shard's own process, named in turn, must leave the lock held (and every
// refusal say the same).
TEST(SharedMemoryTest, AttachesNamingTheServersOwnFdsKeepItsRocksDbLock) {
  TempDir dir;
  const std::string db = dir.Sub("db");
  auto server =
      StartServer(dir, "first",
                  {"--shard_id=0", "--num_shards=1", "--num_workers=1",
                   "--checkpoint_every_s=0", "--db_path=" + db});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  // The lock works before: a second server on the directory is refused.
  StatusOr<int> before = SecondServerExitCode(dir, "second0", db);
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  EXPECT_NE(*before, 0);

  const pid_t pid = server->process->pid();
  const std::vector<int> fds = OpenFds(pid);
  ASSERT_GT(fds.size(), 3u);
  Raw raw(server->endpoint);
  std::set<std::string> said;
  for (int fd : fds) {
    for (uint64_t size : {uint64_t{0}, uint64_t{1} << 20, uint64_t{2} << 20}) {
      RequestHeader h;
      h.kind = RequestKind::kAttachShm;
      h.shm_pid = static_cast<uint32_t>(pid);
      h.shm_fd = fd;
      h.shm_size = size;
      h.shm_token = 0x1234;
      const Status st = raw.Call(h).status;
      EXPECT_FALSE(st.ok()) << "fd " << fd;
      said.insert(st.message());
    }
  }
  EXPECT_EQ(said.size(), 1u) << "refusals tell descriptors apart";

  ASSERT_TRUE(server->process->Running());
  StatusOr<int> after = SecondServerExitCode(dir, "second1", db);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_NE(*after, 0);
  // The first still serves.
  auto ref = Connect(server->endpoint, 0, 0);
  ASSERT_TRUE(ref && ref->Register(Model(), Chunking()).ok());
  std::vector<float> w(300 * 500), b(500);
  EXPECT_TRUE(Pull(ref.get(), {w.data(), b.data()}).ok());
}

}  // namespace
}  // namespace asyncps::testing
