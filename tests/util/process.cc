#include "tests/util/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

namespace asyncps::testing {

TempDir::TempDir() {
  std::string tmpl =
      (std::filesystem::temp_directory_path() / "asyncps_test.XXXXXX").string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  char* p = mkdtemp(buf.data());
  path_ = p ? std::filesystem::path(p) : std::filesystem::temp_directory_path();
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

StatusOr<std::unique_ptr<Process>> Process::Start(
    const std::vector<std::string>& argv, const std::string& log_path) {
  if (argv.empty()) return Status::InvalidArgument("empty argv");
  std::unique_ptr<Process> p(new Process());
  p->log_path_ = log_path;
  pid_t pid = fork();
  if (pid < 0) return Status::Internal("fork failed");
  if (pid == 0) {
    int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  p->pid_ = pid;
  return p;
}

Process::~Process() { Kill(SIGKILL); }

void Process::Kill(int sig) {
  if (pid_ <= 0) return;
  ::kill(pid_, sig);
  int st = 0;
  if (waitpid(pid_, &st, 0) == pid_) status_ = st;
  pid_ = -1;
}

StatusOr<int> Process::Wait(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (pid_ > 0) {
    int st = 0;
    pid_t r = waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      status_ = st;
      pid_ = -1;
      break;
    }
    if (std::chrono::steady_clock::now() >= deadline)
      return Status::TimedOut("process still running");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (WIFEXITED(status_)) return WEXITSTATUS(status_);
  if (WIFSIGNALED(status_)) return 128 + WTERMSIG(status_);
  return -1;
}

bool Process::Running() {
  if (pid_ <= 0) return false;
  int st = 0;
  if (waitpid(pid_, &st, WNOHANG) == pid_) {
    status_ = st;
    pid_ = -1;
    return false;
  }
  return true;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string Process::Log() const { return ReadFile(log_path_); }

std::string BinPath(const std::string& name) {
  const char* dir = std::getenv("ASYNCPS_TEST_BIN_DIR");
  return std::string(dir != nullptr && *dir ? dir : ASYNCPS_BIN_DIR) + "/" +
         name;
}

uint64_t ProcStatusKib(pid_t pid, const std::string& field) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind(field + ":", 0) == 0)
      return std::strtoull(line.c_str() + field.size() + 1, nullptr, 10);
  }
  return 0;
}

StatusOr<ServerHandle> StartServer(const TempDir& dir, const std::string& name,
                                   const std::vector<std::string>& extra,
                                   const std::string& endpoint) {
  std::string ready = dir.Sub(name + ".ready");
  std::filesystem::remove(ready);
  std::vector<std::string> argv;
  if (const char* prefix = std::getenv("ASYNCPS_TEST_SERVER_PREFIX")) {
    std::istringstream words(prefix);
    for (std::string w; words >> w;) argv.push_back(w);
  }
  for (const std::string& a :
       {BinPath("ps_server"), "--endpoint=" + endpoint, "--ready_file=" + ready,
        "--db_path=" + dir.Sub(name + ".db")}) {
    argv.push_back(a);
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  ServerHandle h;
  ASSIGN_OR_RETURN(h.process, Process::Start(argv, dir.Sub(name + ".log")));
  for (int i = 0; i < 1500; ++i) {
    std::string e = ReadFile(ready);
    while (!e.empty() && (e.back() == '\n' || e.back() == ' ')) e.pop_back();
    if (!e.empty()) {
      h.endpoint = e;
      return h;
    }
    if (!h.process->Running()) {
      return Status::Unavailable("ps_server " + name +
                                 " exited during start:\n" + h.process->Log());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return Status::TimedOut("ps_server " + name + " not ready after 15 s:\n" +
                          h.process->Log());
}

}  // namespace asyncps::testing
