"""One launched process, local or over SSH, and hostfile placement.

A Proc owns exactly one child it started; signal() reaches only that child (its
process group locally, its remote PID over SSH), never processes found by name.
Every Proc appends to its log file: a '# psrun' header with the command line,
then the process's stdout and stderr.
"""
import ctypes
import os
import re
import shlex
import signal
import subprocess
import time

_PR_SET_PDEATHSIG = 1


def _die_with_parent():
    """preexec_fn: the child gets SIGTERM if psrun dies (even by SIGKILL)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def describe_status(rc):
    """'exit code 3' / 'killed by signal 9 (SIGKILL)' from a Popen returncode."""
    if rc is None:
        return "running"
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = "?"
        return "killed by signal %d (%s)" % (-rc, name)
    return "exit code %d" % rc


def tail(path, lines=20, max_bytes=16384):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def write_header(log_path, name, argv, extra_lines=()):
    with open(log_path, "a") as f:
        f.write("# psrun: %s started %s\n" % (name, time.strftime("%Y-%m-%d %H:%M:%S")))
        f.write("# psrun: command: %s\n" % " ".join(shlex.quote(a) for a in argv))
        for line in extra_lines:
            f.write("# psrun: %s\n" % line)


class LocalProc:
    """A child process in its own session (process group = its PID)."""

    host = "127.0.0.1"

    def __init__(self, name, argv, log_path, env=None):
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = env
        self.popen = None

    def start(self, header_lines=()):
        write_header(self.log_path, self.name, self.argv, header_lines)
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, env=self.env, preexec_fn=_die_with_parent)
        return self

    @property
    def pid(self):
        return self.popen.pid if self.popen else None

    def poll(self):
        return self.popen.poll() if self.popen else None

    def group_alive(self):
        """True while any process of its group exists (the leader may be a zombie)."""
        if not self.popen:
            return False
        try:
            os.killpg(self.popen.pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def signal(self, sig):
        if not self.popen:
            return
        try:
            os.killpg(self.popen.pid, sig)  # pgid == pid (start_new_session)
        except (ProcessLookupError, PermissionError):
            pass

    def read_file(self, path):
        try:
            with open(path) as f:
                return f.read()
        except OSError:
            return None

    def record(self):
        return {"name": self.name, "host": self.host, "pid": self.pid, "pgid": self.pid,
                "remote_pid": None}


class SshProc(LocalProc):
    """A process started on `host` through `ssh`; stdout/stderr stream into the local log.

    The remote shell prints its PID and then exec()s the command, so the remote
    PID is the command's PID. signal() sends `kill` over SSH (killing the local ssh
    client would leave the remote process running) and then stops the client.
    """

    _PID_RE = re.compile(r"^# psrun: remote pid (\d+)$", re.M)

    def __init__(self, name, argv, log_path, host, ssh_cmd, remote_dir, env=None):
        super().__init__(name, argv, log_path, env)
        self.host = host
        self.ssh_cmd = list(ssh_cmd)
        self.remote_dir = remote_dir
        self._remote_pid = None
        self._log_offset = 0  # where this incarnation's output starts in the log

    def _ssh(self, remote_command):
        return self.ssh_cmd + [self.host, remote_command]

    def start(self, header_lines=()):
        write_header(self.log_path, self.name, self.argv,
                     ["host: %s" % self.host] + list(header_lines))
        self._log_offset = os.path.getsize(self.log_path)
        remote = "mkdir -p %s && cd %s && echo \"# psrun: remote pid $$\" && exec %s" % (
            shlex.quote(self.remote_dir), shlex.quote(self.remote_dir),
            " ".join(shlex.quote(a) for a in self.argv))
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(
                self._ssh(remote), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True, env=self.env,
                preexec_fn=_die_with_parent)
        return self

    @property
    def remote_pid(self):
        # The remote shell's first line of output, read from where this
        # incarnation's output starts: a tail of the log would lose it once
        # the process has written more than the tail holds.
        if self._remote_pid is None:
            try:
                with open(self.log_path, "rb") as f:
                    f.seek(self._log_offset)
                    head = f.read(1 << 16).decode("utf-8", "replace")
            except OSError:
                head = ""
            m = self._PID_RE.search(head)
            if m:
                self._remote_pid = int(m.group(1))
        return self._remote_pid

    def wait_remote_pid(self, timeout):
        deadline = time.time() + timeout
        while self.remote_pid is None and time.time() < deadline and self.poll() is None:
            time.sleep(0.05)
        return self.remote_pid

    def signal(self, sig):
        pid = self.remote_pid
        if pid is None and self.poll() is None:
            pid = self.wait_remote_pid(5)
        if pid is not None:
            subprocess.run(self._ssh("kill -%d %d 2>/dev/null || true" % (int(sig), pid)),
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=30, check=False)
        if sig == signal.SIGKILL:
            super().signal(sig)  # the local ssh client too

    def remote_alive(self):
        pid = self.remote_pid
        if pid is None:
            return False
        r = subprocess.run(self._ssh("kill -0 %d 2>/dev/null" % pid), stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30,
                           check=False)
        return r.returncode == 0

    def read_file(self, path):
        r = subprocess.run(self._ssh("cat %s 2>/dev/null" % shlex.quote(path)),
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=False)
        if r.returncode != 0:
            return None
        return r.stdout.decode("utf-8", "replace")

    def record(self):
        r = super().record()
        r["remote_pid"] = self.remote_pid
        return r


def parse_hostfile(text, source="<hostfile>"):
    """'host slots=N' per line (as horovodrun); returns [(host, slots)]."""
    hosts = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        slots = 1
        for p in parts[1:]:
            m = re.fullmatch(r"slots=(\d+)", p)
            if not m:
                raise ValueError("%s:%d: expected 'host slots=N', got '%s'" % (source, lineno, raw))
            slots = int(m.group(1))
        if slots < 1:
            raise ValueError("%s:%d: slots must be >= 1" % (source, lineno))
        hosts.append((parts[0], slots))
    if not hosts:
        raise ValueError("%s: no hosts" % source)
    return hosts


def place(hosts, count, start=0):
    """Hosts for processes start..start+count-1, round-robin over the slots
    (host by host, each host's slots in a row, then wrapping around)."""
    slots = [h for h, n in hosts for _ in range(n)]
    return [slots[(start + i) % len(slots)] for i in range(count)]


def place_emulated(hosts, shard_hosts, servers, replicas, workers):
    """Host indices for emulated hosts (psrun --emulate_hosts), one per
    process index (shards first, shard index g*R + r for replica r of group
    g): replica r of group g on host (g + r) % shard_hosts, so the R
    replicas of a group sit on R different hosts while R <= shard_hosts and
    the primaries (r = 0) are spread over the hosts; workers round-robin
    after them like place(): over every host when shard_hosts == hosts, else
    over hosts shard_hosts..hosts-1."""
    where = [(g + r) % shard_hosts for g in range(servers) for r in range(replicas)]
    if shard_hosts >= hosts:
        return where + [(len(where) + w) % hosts for w in range(workers)]
    return where + [shard_hosts + w % (hosts - shard_hosts) for w in range(workers)]
