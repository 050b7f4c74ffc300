"""Fleet: S ps_server shards and W ps_worker ranks, from start to teardown.

Lifecycle (Fleet.run):
  1. start every shard with an ephemeral port (--endpoint=tcp://HOST:*; with
     --transport ipc a Unix socket, ipc://RUN_DIR/sock/server-<i>) and a
     --ready_file; wait for each ready file, then for each shard to answer
     `ps_ctl stats` (deadline: --start_timeout; a shard that exits or times out
     is named with the tail of its log); with --metrics each process also gets a
     metrics port and with --prometheus a local Prometheus starts (monitoring.py);
     replica groups and --elastic first get etcd (--etcd, or psrun's own; with
     --etcd_tls over TLS with authentication: see etcd_credentials below);
  2. start the workers with --servers (shard 0 first), --rank, --num_workers,
     --metrics_csv; with --worker_cmd, the command with the environment
     contract of workercmd.py instead;
  3. watch: a worker that fails, or a shard that stops without restarts left,
     fails the run; a crashed shard with restarts left is started again from
     its RocksDB store at the endpoint it had bound, and the workers retry;
  4. when every worker has exited 0: `ps_ctl stats` (stats.json), `ps_ctl
     shutdown`, summary.json;
  5. always: teardown -- SIGTERM to every process still running, SIGKILL after
     --grace seconds, then reap. Only processes this Fleet started are signalled.
SIGINT/SIGTERM to psrun jump to step 5 (exit status 128 + signal).
"""
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time

from . import config as config_mod
from . import elastic as elastic_mod
from . import etcd as etcd_mod
from . import etcd_tls
from . import monitoring as monitoring_mod
from . import procs as procs_mod
from . import summary as summary_mod
from . import workercmd
from .member import LaunchError, Member

# Longest path of a Unix domain socket (sun_path holds 108 bytes with the NUL).
_MAX_UNIX_PATH = 107


class Interrupted(Exception):
    def __init__(self, signum):
        super().__init__("interrupted by signal %d" % signum)
        self.signum = signum


class Fleet:
    def __init__(self, opts, run_dir, spawn, bind_host="127.0.0.1", log=print):
        """`spawn(name, argv, log_path, index)` returns a started-later Proc;
        `index` is the global process index (servers first) for placement.
        `bind_host`: the shards' address, or a function of the shard Member."""
        self.o = opts
        self.run_dir = run_dir
        self.spawn = spawn
        self.bind_host = bind_host
        self.log = log
        self.replicas = getattr(opts, "replicas", 1) or 1
        # psrun --elastic (elastic.py): shards join and leave while training.
        self.elastic = None
        if getattr(opts, "elastic_plan", None):
            self.elastic = elastic_mod.Elastic(self, opts.elastic_plan)
        if self.replicas > 1 or (getattr(opts, "etcd", None) and not self.elastic):
            self.shards = [Member("server", g * self.replicas + r, g, r)
                           for g in range(opts.servers) for r in range(self.replicas)]
        else:
            self.shards = [Member("server", i) for i in range(opts.servers)]
        self.etcd = None  # a local etcd psrun started (etcd.py)
        self.etcd_endpoints = getattr(opts, "etcd", None)
        # psrun --etcd_tls: its etcd's certificates and password files.
        self.etcd_tls_dir = (self.path("etcd", "tls") if getattr(opts, "etcd_tls_on", False)
                             else None)
        self.workers = [Member("worker", i) for i in range(opts.workers)]
        self.failures = []
        self.pids_pending = False
        self.stop_signal = None
        self.start_time = time.time()
        self.worker_start = None
        self.ctl = os.path.join(opts.bin_dir, "ps_ctl")
        # Set by the caller when psrun's side is not the machine's own network
        # (--emulate_hosts): the argv before ps_ctl (`ip netns exec HUB`), and
        # start_local_etcd's keyword arguments (host, netns).
        self.ctl_prefix = []
        self.etcd_options = {}
        self.monitor = None
        if getattr(opts, "metrics", False):
            self.monitor = monitoring_mod.Monitor(
                run_dir, prometheus=getattr(opts, "prometheus", False),
                scrape_interval_s=getattr(opts, "scrape_interval", 1.0), log=log)
        self.last_targets_update = 0.0
        self.short_sock_dir = None  # --transport ipc with a long run folder
        for d in ("ready", "db", "flags"):
            os.makedirs(os.path.join(run_dir, d), exist_ok=True)

    # ---- helpers -----------------------------------------------------------
    def path(self, *parts):
        return os.path.join(self.run_dir, *parts)

    def log_path(self, m):
        return self.path("%s.log" % m.name)

    def check_signal(self):
        if self.stop_signal is not None:
            raise Interrupted(self.stop_signal)

    def sleep(self, seconds):
        end = time.time() + seconds
        while time.time() < end:
            self.check_signal()
            time.sleep(min(0.05, max(0.0, end - time.time())))
        self.check_signal()

    def all_members(self):
        return self.workers + self.shards

    def write_pids(self):
        recs = []
        pending = False
        for m in self.shards + self.workers:
            if m.proc:
                r = m.proc.record()
                r.update({"role": m.role, "rank": m.rank, "restarts": m.restarts,
                          "endpoint": m.endpoint})
                recs.append(r)
                # Over SSH the remote PIDs appear in the logs a moment after
                # the start. Judged by the record written: a PID that showed
                # up after record() read the log is written the next time.
                pending = pending or (isinstance(m.proc, procs_mod.SshProc) and
                                      r["remote_pid"] is None and m.proc.poll() is None)
        summary_mod.write_json(self.path("pids.json"), {"psrun_pid": os.getpid(), "procs": recs})
        self.pids_pending = pending

    def advertise_host(self, m):
        """Where workers reach shard `m` when it bound a wildcard address."""
        return m.proc.host

    def replicated(self):
        return self.shards and self.shards[0].replica is not None

    def endpoints(self):
        """The workers' --servers: one item per shard; a replica group is
        its members' endpoints joined by '|' (replica 0, the first primary,
        first)."""
        if not self.replicated():
            # Shards removed by --elastic (done) are not asked any more.
            return ",".join(m.endpoint for m in self.shards if not m.done)
        groups = {}
        for m in self.shards:
            groups.setdefault(m.group, []).append(m.endpoint or "")
        return ",".join("|".join(groups[g]) for g in sorted(groups))

    def every_endpoint(self, alive_only=False):
        """Every shard process, one item each (admin requests: stats, shutdown)."""
        return ",".join(m.endpoint for m in self.shards
                        if m.endpoint and (not alive_only or m.proc.poll() is None))

    # ---- etcd credentials ----------------------------------------------------
    # With psrun's etcd under --etcd_tls (etcd_tls.py), each process gets what
    # it needs and no more: every ps_server and psrun's own ps_ctl the
    # asyncps-server user's files (read/write under the fleet's prefix); a
    # worker the asyncps-worker user's (read <prefix>/elastic and members/), and only when
    # it is given etcd at all (--elastic). With an --etcd of the user's,
    # psrun adds nothing: the shards and workers read the --etcd_* flags the
    # user gave (--server_flags, [server], [worker]) and psrun's ps_ctl takes
    # those of the server flags.
    def etcd_credentials(self, user):
        """etcd_tls.Security of `user` for psrun's TLS etcd, or None."""
        if not self.etcd_tls_dir or not (self.replicated() or self.elastic):
            return None
        return etcd_tls.Security(self.etcd_tls_dir, user)

    def ctl_flags(self):
        """psrun's own ps_ctl calls: with CurveZMQ shards the CurveZMQ client
        keys of the worker flags (psrun reaches the shards as their workers
        do), the asyncps-server etcd credentials (or the --etcd_* server
        flags), then --ctl_flags."""
        o = self.o
        server_lines = workercmd.read_flag_lines(self.path("flags", "server.flags"))
        flags = []
        if config_mod.uses_curve(o.server_flags, server_lines):
            flags = workercmd.pick(workercmd.read_flag_lines(self.path("flags", "worker.flags")) +
                                   list(getattr(o, "worker_extra", [])), workercmd.CURVE_FLAGS)
        server = self.etcd_credentials(etcd_tls.SERVER_USER)
        if server:
            flags += server.etcd_flags()
        else:
            flags += workercmd.pick(server_lines + shlex.split(o.server_flags or ""),
                                    {f for f, _, _ in etcd_tls.FLAGS})
        return flags + shlex.split(getattr(o, "ctl_flags", "") or "")

    def ps_ctl(self, command, endpoints=None, timeout_ms=2000):
        argv = self.ctl_prefix + [self.ctl, "--servers=" + (endpoints or self.endpoints()),
                "--timeout_ms=%d" % timeout_ms] + self.ctl_flags() + [command]
        try:
            r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                               timeout=timeout_ms / 1000.0 * 2 + 10, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            return 1, "", str(e)
        return r.returncode, r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8",
                                                                                   "replace")

    def own_proc(self, m):
        """True when m.proc runs `m` alone (not an srun step of several shards)."""
        return m.proc is not None and not any(
            x is not m and x.proc is m.proc for x in self.all_members())

    def fail_member(self, m, what):
        return LaunchError(m, what)

    # ---- shards --------------------------------------------------------------
    def shard_argv(self, m, endpoint):
        o = self.o
        argv = [os.path.join(o.bin_dir, "ps_server"),
                "--flagfile=" + self.path("flags", "server.flags"),
                "--shard_id=%d" % m.rank,
                "--num_shards=%d" % (getattr(m, "num_shards", None) or o.servers),
                "--num_workers=%d" % o.workers, "--endpoint=" + endpoint,
                "--ready_file=" + self.path("ready", "%s.endpoint" % m.name),
                "--db_path=" + self.path("db", m.name)]
        if self.replicated():
            argv[2] = "--shard_id=%d" % m.group
            argv += ["--replicas=%d" % self.replicas, "--replica=%d" % m.replica,
                     "--etcd=" + self.etcd_endpoints,
                     "--etcd_prefix=/asyncps/" + self.etcd_prefix(),
                     "--lease_ms=%d" % getattr(o, "lease_ms", 1000)]
        if self.elastic:
            # A shard frozen by a change whose ps_ctl went away asks etcd
            # whether it committed (ps_server --elastic_etcd).
            argv += ["--elastic_etcd=" + self.etcd_endpoints,
                     "--etcd_prefix=/asyncps/" + self.etcd_prefix()]
        server = self.etcd_credentials(etcd_tls.SERVER_USER)
        if server:
            argv += server.etcd_flags()
        if self.monitor:
            argv += self.monitor.flags(m.name, "server")
        return argv + shlex.split(o.server_flags or "")

    def etcd_prefix(self):
        """One key prefix per run: runs sharing an etcd never mix layouts."""
        return "".join(c if c.isalnum() or c in "-_." else "_"
                       for c in os.path.basename(self.run_dir.rstrip("/")))

    def start_etcd(self):
        if not (self.replicated() or self.elastic) or self.etcd_endpoints:
            return
        tls = ({"tls_prefix": "/asyncps/" + self.etcd_prefix()} if self.etcd_tls_dir
               else {})
        try:
            self.etcd = etcd_mod.start_local_etcd(self.run_dir, **self.etcd_options, **tls)
        except (RuntimeError, OSError) as e:
            raise LaunchError(None, "%s needs etcd: %s (install Debian's etcd-server, or "
                                    "give --etcd ENDPOINTS)" % (
                                        "--elastic" if self.elastic else "--replicas", e))
        self.etcd_endpoints = self.etcd.endpoints
        self.log("psrun: local etcd at %s (pid %d)%s" % (
            self.etcd_endpoints, self.etcd.pid, ", TLS and authentication (%s)" %
            self.etcd_tls_dir if self.etcd_tls_dir else ""))

    def fresh_endpoint(self, m):
        """Where shard `m` binds at its first start: an ephemeral TCP port, or
        with --transport ipc a Unix socket of its own (a restart reuses it)."""
        if getattr(self.o, "transport", "tcp") != "ipc":
            host = self.bind_host(m) if callable(self.bind_host) else self.bind_host
            return "tcp://%s:*" % host
        return "ipc://" + self.ipc_path(m)

    def ipc_path(self, m):
        """RUN_DIR/sock/<name>, or when that is longer than a Unix socket
        address allows (107 bytes), a folder of psrun's own under $TMPDIR."""
        path = self.path("sock", m.name)
        if len(path.encode()) > _MAX_UNIX_PATH:
            if self.short_sock_dir is None:
                self.short_sock_dir = tempfile.mkdtemp(prefix="psrun-sock-")
                self.log("psrun: %s is too long for a Unix socket address: sockets in %s" %
                         (self.path("sock"), self.short_sock_dir))
            path = os.path.join(self.short_sock_dir, m.name)
        if len(path.encode()) > _MAX_UNIX_PATH:
            raise LaunchError(m, "no Unix socket path of at most %d bytes for --transport ipc "
                                 "(%s); set TMPDIR to a short folder" % (_MAX_UNIX_PATH, path))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return path

    def remove_sockets(self):
        """--transport ipc: the socket files of stopped shards (a shard that
        ends by a signal leaves its file), and psrun's short folder."""
        for m in self.shards:
            if m.endpoint and m.endpoint.startswith("ipc://"):
                try:
                    os.unlink(m.endpoint[len("ipc://"):])
                except OSError:
                    pass
        if self.short_sock_dir is not None:
            shutil.rmtree(self.short_sock_dir, ignore_errors=True)

    def start_shard(self, m, endpoint=None):
        ready = self.path("ready", "%s.endpoint" % m.name)
        try:
            os.unlink(ready)
        except FileNotFoundError:
            pass
        restart = endpoint is not None
        endpoint = endpoint or self.fresh_endpoint(m)
        argv = self.shard_argv(m, endpoint)
        header = ["restart %d of %d, endpoint %s" % (m.restarts, self.o.max_restarts, endpoint)
                  ] if restart else []
        header.append("flagfile %s:" % self.path("flags", "server.flags"))
        header += ["  " + l for l in _read_lines(self.path("flags", "server.flags"))]
        index = m.rank if m.index is None else m.index
        m.proc = self.spawn(m.name, argv, self.log_path(m), index).start(header)
        self.write_pids()

    def wait_ready_file(self, m, deadline):
        ready = self.path("ready", "%s.endpoint" % m.name)
        while True:
            rc = m.proc.poll()
            if rc is not None:
                raise LaunchError(m, "exited before it was ready (%s)" % procs_mod.describe_status(rc))
            text = m.proc.read_file(ready)
            if text and text.strip():
                ep = text.strip()
                host = self.advertise_host(m)
                for wildcard in ("0.0.0.0", "*", "[::]"):
                    ep = ep.replace("tcp://%s:" % wildcard, "tcp://%s:" % host)
                return ep
            if time.time() > deadline:
                raise LaunchError(m, "did not become ready within %gs (no ready file %s)" %
                                  (self.o.start_timeout, ready))
            self.sleep(0.1 if type(m.proc) is procs_mod.LocalProc else 0.5)

    def wait_stats(self, m, deadline):
        last = ""
        while True:
            rc = m.proc.poll()
            if rc is not None:
                raise LaunchError(m, "exited before it was ready (%s)" % procs_mod.describe_status(rc))
            code, out, err = self.ps_ctl("stats", m.endpoint, timeout_ms=1000)
            if code == 0:
                return
            last = (err or out).strip().splitlines()[-1:] or [""]
            if time.time() > deadline:
                raise LaunchError(m, "did not answer ps_ctl stats at %s within %gs (%s)" %
                                  (m.endpoint, self.o.start_timeout, last[0]))
            self.sleep(0.2)

    def start_shards(self):
        self.start_etcd()
        for m in self.shards:
            self.start_shard(m)
        deadline = time.time() + self.o.start_timeout
        for m in self.shards:
            m.endpoint = self.wait_ready_file(m, deadline)
        for m in self.shards:
            self.wait_stats(m, deadline)
        self.write_pids()
        self.log("psrun: %d shard(s) ready: %s" % (len(self.shards), self.endpoints()))

    def restart_shard(self, m, rc):
        why = procs_mod.describe_status(rc)
        m.history.append(why)
        m.restarts += 1
        self.log("psrun: %s %s; restarting from its store at %s (restart %d of %d)" %
                 (m.name, why, m.endpoint, m.restarts, self.o.max_restarts))
        self.start_shard(m, endpoint=m.endpoint)
        deadline = time.time() + self.o.start_timeout
        ep = self.wait_ready_file(m, deadline)
        if ep != m.endpoint:
            raise LaunchError(m, "restarted at %s instead of %s" % (ep, m.endpoint))
        self.wait_stats(m, deadline)
        self.write_pids()
        self.log("psrun: %s is back at %s" % (m.name, m.endpoint))

    # ---- workers -------------------------------------------------------------
    def worker_argv(self, m):
        o = self.o
        if o.worker_cmd:
            return self.worker_cmd_argv(m)
        credentials = self.worker_credentials()
        return [os.path.join(o.bin_dir, "ps_worker"),
                "--flagfile=" + self.path("flags", "worker.flags"),
                "--servers=" + self.endpoints(), "--rank=%d" % m.rank,
                "--num_workers=%d" % o.workers,
                "--metrics_csv=" + self.path("metrics-%d.csv" % m.rank)] + (
                    ["--shared_memory_mb=%d" % o.shared_memory_mb]
                    if getattr(o, "transport", "tcp") == "ipc" and o.shared_memory_mb else []) + (
                    self.monitor.flags(m.name, "worker") if self.monitor else []) + [
                        "--%s=%s" % (k, v) for k, v in self.worker_etcd()] + (
                    credentials.etcd_flags() if credentials else []) + list(o.worker_extra)

    def worker_etcd(self):
        """Elastic runs: where a worker (started again after the shards it
        was given left) reads the fleet's layout: [(flag, value)]."""
        if not self.elastic:
            return []
        return [("etcd", self.etcd_endpoints), ("etcd_prefix", "/asyncps/" + self.etcd_prefix())]

    def worker_credentials(self):
        """The asyncps-worker user's etcd_tls.Security for a worker that is
        given etcd (worker_etcd), with psrun's TLS etcd; else None."""
        return self.etcd_credentials(etcd_tls.WORKER_USER) if self.elastic else None

    def worker_cmd_argv(self, m):
        """--worker_cmd: `env <contract> CMD [worker flags] [extra]`."""
        o = self.o
        flags, flag_env = workercmd.split_env_flags(
            workercmd.read_flag_lines(self.path("flags", "worker.flags")))
        remote = o.backend == "ssh" and getattr(o, "remote_bin_dir", None)
        bin_dir = remote or o.bin_dir
        env = workercmd.contract(self.endpoints(), m.rank, o.workers, o.servers, self.run_dir,
                                 bin_dir, flag_env,
                                 None if remote else os.environ.get("PYTHONPATH"))
        if self.monitor:
            env.update(self.monitor.env(m.name))
        env.update(("ASYNCPS_" + k.upper(), v) for k, v in self.worker_etcd())
        credentials = self.worker_credentials()
        if credentials:
            env.update(credentials.worker_env())
        return workercmd.env_argv(env, workercmd.argv(o.worker_cmd, flags, o.worker_extra))

    def start_workers(self):
        self.worker_start = time.time()
        header = ["flagfile %s:" % self.path("flags", "worker.flags")]
        header += ["  " + l for l in _read_lines(self.path("flags", "worker.flags"))]
        for m in self.workers:
            m.proc = self.spawn(m.name, self.worker_argv(m), self.log_path(m),
                                len(self.shards) + m.rank).start(header)
        self.write_pids()
        self.log("psrun: %d worker(s) started" % len(self.workers))

    # ---- monitoring ----------------------------------------------------------
    def update_targets(self, force=False):
        """Scrape targets from the metrics port files (at most every second)."""
        if not self.monitor or (not force and time.time() - self.last_targets_update < 1.0):
            return
        self.last_targets_update = time.time()
        members = [(m.name, m.role, m.rank, m.proc.host, m.proc.read_file)
                   for m in self.shards + self.workers if m.proc]
        self.monitor.update_targets(members)

    # ---- watching ------------------------------------------------------------
    def watch(self, progress=None):
        while True:
            self.check_signal()
            self.update_targets()
            if self.pids_pending:
                self.write_pids()
            if self.elastic:
                self.elastic.tick()
            for m in self.shards:
                rc = m.proc.poll()
                if rc is None:
                    continue
                if m.done and not self.replicated():
                    continue  # removed by --elastic
                if self.replicated():
                    self.replica_stopped(m, rc)
                    continue
                crashed = rc != 0
                if crashed and m.restarts < self.o.max_restarts:
                    self.restart_shard(m, rc)
                else:
                    raise LaunchError(m, "stopped while workers were running (%s)%s" % (
                        procs_mod.describe_status(rc),
                        "" if not crashed else ", no restarts left (--max_restarts=%d)"
                        % self.o.max_restarts))
            for m in self.workers:
                if m.done:
                    continue
                rc = m.proc.poll()
                if rc == 0:
                    m.done = True
                    self.log("psrun: %s finished" % m.name) if not progress else None
                elif rc is not None:
                    raise LaunchError(m, "failed (%s)" % procs_mod.describe_status(rc))
            if all(m.done for m in self.workers):
                return
            if progress:
                progress.update()
            self.sleep(0.2)

    def replica_stopped(self, m, rc):
        """A replica that stopped is restarted at its endpoint while it has
        restarts left (--max_restarts): it comes back as a spare, and its
        group's primary copies its state over and makes it a backup again.
        Otherwise the group goes on without it; the run fails only when a
        whole group is gone."""
        if m.done:
            return
        why = procs_mod.describe_status(rc)
        alive = [x for x in self.shards if x.group == m.group and x is not m
                 and x.proc.poll() is None]
        if m.restarts < self.o.max_restarts:
            m.history.append(why)
            m.restarts += 1
            self.log("psrun: %s %s; restarting it at %s as a spare of group %d (restart %d of %d)"
                     % (m.name, why, m.endpoint, m.group, m.restarts, self.o.max_restarts))
            self.start_shard(m, endpoint=m.endpoint)
            deadline = time.time() + self.o.start_timeout
            ep = self.wait_ready_file(m, deadline)
            if ep != m.endpoint:
                raise LaunchError(m, "restarted at %s instead of %s" % (ep, m.endpoint))
            self.write_pids()
            return
        m.done = True
        m.history.append(why)
        self.log("psrun: %s %s; group %d goes on with %s" % (
            m.name, why, m.group, ", ".join(x.name for x in alive) or "nothing"))
        self.write_pids()
        if not alive:
            raise LaunchError(m, "every replica of group %d stopped (last: %s)" % (m.group, why))

    # ---- end -----------------------------------------------------------------
    def shutdown_shards(self):
        if self.replicated():
            # Stats from every live replica (the primaries' are the groups'),
            # shutdown to each of them.
            eps = self.every_endpoint(alive_only=True)
            code, out, _ = self.ps_ctl("stats", eps)
            if code == 0:
                try:
                    summary_mod.write_json(self.path("stats.json"), json.loads(out))
                except ValueError:
                    pass
            self.ps_ctl("shutdown", eps)
            deadline = time.time() + self.o.grace
            while time.time() < deadline and any(m.proc.poll() is None for m in self.shards):
                time.sleep(0.05)
            return
        code, out, _ = self.ps_ctl("stats")
        if code == 0:
            try:
                summary_mod.write_json(self.path("stats.json"), json.loads(out))
            except ValueError:
                pass
        self.ps_ctl("shutdown")
        deadline = time.time() + self.o.grace
        while time.time() < deadline and any(m.proc.poll() is None for m in self.shards):
            time.sleep(0.05)

    def teardown(self):
        """SIGTERM everything still running, SIGKILL after the grace period, reap."""
        running = [m for m in self.all_members() if m.proc and (
            m.proc.poll() is None or m.proc.group_alive())]
        if running:
            self.log("psrun: stopping %s" % ", ".join(m.name for m in running))
        for m in running:
            m.proc.signal(signal.SIGTERM)
        if self.pids_pending:
            self.write_pids()  # remote PIDs that signal() waited for
        deadline = time.time() + self.o.grace
        while time.time() < deadline and any(
                m.proc.poll() is None or m.proc.group_alive() for m in running):
            time.sleep(0.05)
        for m in running:
            if m.proc.poll() is None or m.proc.group_alive():
                self.log("psrun: %s still running after %gs grace: SIGKILL" % (m.name, self.o.grace))
                m.proc.signal(signal.SIGKILL)
        for m in running:
            try:
                m.proc.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.log("psrun: %s (pid %d) did not die" % (m.name, m.proc.pid))
        for m in running:
            if isinstance(m.proc, procs_mod.SshProc) and m.proc.remote_alive():
                m.proc.signal(signal.SIGKILL)

    def failure_record(self, m, reason):
        if m is None:
            return {"name": "psrun", "reason": reason}
        return {"name": m.name, "reason": reason, "log": self.log_path(m),
                "log_tail": procs_mod.tail(self.log_path(m), self.o.log_tail_lines),
                "exit": m.proc.poll() if m.proc else None}

    def run(self, progress_cb=None):
        """Runs the whole lifecycle; returns the exit status and writes summary.json."""
        exit_code = 0
        old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

        def on_signal(signum, frame):
            if self.stop_signal is None:
                self.stop_signal = signum

        for s in old:
            signal.signal(s, on_signal)
        progress = None
        try:
            self.start_shards()
            if self.monitor:
                self.update_targets(force=True)
                try:
                    self.monitor.start_prometheus(wait_for=[m.name for m in self.shards])
                except RuntimeError as e:
                    raise LaunchError(None, str(e))
            self.start_workers()
            if progress_cb:
                progress = progress_cb([self.log_path(m) for m in self.workers])
            self.watch(progress)
            if self.elastic:
                self.elastic.finish()
            if progress:
                progress.update(force=True)
                progress.finish()
            if self.monitor:
                self.update_targets(force=True)  # workers that finished quickly
                self.monitor.wait_final_scrape()
            self.shutdown_shards()
        except LaunchError as e:
            if progress:
                progress.finish()
            self.failures.append(self.failure_record(e.member, e.reason))
            exit_code = 1
        except Interrupted as e:
            if progress:
                progress.finish()
            self.log("psrun: %s: tearing the fleet down" % signal.Signals(e.signum).name)
            self.failures.append({"name": "psrun", "reason": "interrupted by %s" %
                                  signal.Signals(e.signum).name})
            exit_code = 128 + e.signum
        finally:
            # A second Ctrl-C during teardown must not leave orphans: ignore it.
            for s in old:
                signal.signal(s, lambda *a: None)
            self.teardown()
            if self.monitor:
                self.monitor.stop()
            if self.etcd is not None:
                self.etcd.stop()
            self.remove_sockets()
            for s, h in old.items():
                signal.signal(s, h)
        if exit_code == 1:
            # Others that died in the same instant are worth naming too.
            for m in self.all_members():
                if m.proc and m.proc.poll() not in (None, 0, -signal.SIGTERM, -signal.SIGKILL) \
                        and not any(f["name"] == m.name for f in self.failures):
                    self.failures.append(self.failure_record(
                        m, "also failed (%s)" % procs_mod.describe_status(m.proc.poll())))
        return exit_code, self.build_summary(exit_code)

    def build_summary(self, exit_code):
        workers = {}
        for m in self.workers:
            s = summary_mod.parse_summary_line(summary_mod._read(self.log_path(m)))
            if s:
                workers[m.rank] = s
        wall = time.time() - (self.worker_start or self.start_time)
        summary = {
            "ok": exit_code == 0,
            "exit_code": exit_code,
            "run_dir": self.run_dir,
            "servers": self.o.servers,
            "workers": self.o.workers,
            "endpoints": [m.endpoint for m in self.shards],
            "restarts": {m.name: m.restarts for m in self.shards if m.restarts},
            "replicas": self.replicas,
            "replicas_stopped": {m.name: m.history[-1] for m in self.shards
                                 if self.replicated() and m.done and m.history},
            "failures": self.failures,
            "per_worker": {str(k): v for k, v in sorted(workers.items())},
            "totals": summary_mod.aggregate(workers, wall) if workers else None,
        }
        if self.monitor:
            summary["monitoring"] = self.monitor.summary()
        if self.elastic:
            summary["elastic"] = self.elastic.records
        summary_mod.write_json(self.path("summary.json"), summary)
        return summary


def _read_lines(path):
    try:
        with open(path) as f:
            return [l.rstrip("\n") for l in f]
    except OSError:
        return []
